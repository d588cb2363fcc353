-- wrk script: non-streamed chat completions against a simulated server.
-- wrk -t1 -c64 -d10s -s simulate/testdata/bench/chat.lua http://127.0.0.1:9001
wrk.method = "POST"
wrk.path = "/v1/chat/completions"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"sim-model","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello."}],"max_tokens":64}'
