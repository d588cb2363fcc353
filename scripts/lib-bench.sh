# Sourced by the wrk benchmarks (bench-wrk.sh, bench-billing-wrk.sh): one
# funded `tollgate serve` in front of the simulator.
#
# start_tollgate BIN DIR PORT STORE_YAML EXTRA_YAML SIM_URL
#   writes DIR/tollgate.yaml (model "bench" on the simulator's "bench-up"),
#   migrates, creates an account with 1,000,000 USD and a key, starts
#   serve in the background and waits until it answers. Sets TOLLGATE_KEY
#   (the key's secret) and TOLLGATE_PID.
start_tollgate() {
  local bin=$1 dir=$2 port=$3 store=$4 extra=$5 sim=$6 acct
  cat >"$dir/tollgate.yaml" <<YAML
listen:
  api: 127.0.0.1:$port
store:
$store
health:
  interval: "off"
$extra
models:
  - id: bench
    kind: chat
    context_length: 1048576
    max_output_tokens: 4096
    backends:
      - class: network
        upstream_model: bench-up
        capabilities: [tools, reasoning]
        rates: {input: "0.1", output: "0.4"}
        nodes:
          - {name: sim, url: "$sim/v1", flavour: vllm}
YAML
  "$bin" migrate --config "$dir/tollgate.yaml" >/dev/null
  acct=$("$bin" accounts create --config "$dir/tollgate.yaml" --name bench --json | sed -n 's/.*"id": *"\([^"]*\)".*/\1/p' | head -1)
  "$bin" accounts credit "$acct" 1000000 --config "$dir/tollgate.yaml" >/dev/null
  TOLLGATE_KEY=$("$bin" keys create --config "$dir/tollgate.yaml" --account "$acct" --name bench)
  "$bin" serve --config "$dir/tollgate.yaml" --log-level error >"$dir/serve.log" 2>&1 &
  TOLLGATE_PID=$!
  for _ in $(seq 1 100); do
    curl -s -o /dev/null "http://127.0.0.1:$port/v1/models" && return 0
    sleep 0.1
  done
  echo "tollgate serve on port $port did not answer; see $dir/serve.log" >&2
  return 1
}
