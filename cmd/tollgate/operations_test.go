package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
)

// adminGet fetches a path of the admin listener with an optional token.
func (h *harness) adminGet(t *testing.T, path, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+h.main.Addr("admin")+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// After mixed traffic (non-streamed, streamed, a failure mid-stream, an
// unknown model, a bad key, a refused hold), /metrics on the admin listener
// shows each series moving with its labels, passes promtool, and holds no
// account or key; /metrics is not served on the api listener.
func TestMetricsAfterMixedTraffic(t *testing.T) {
	t.Setenv("TG_TEST_ADMIN_TOKEN", "s3cret")
	h := newHarness(t, harnessOptions{listen: "  admin: 127.0.0.1:0\n", extraYAML: "admin_token_env: TG_TEST_ADMIN_TOKEN\n"})
	post := func(body string, hdr map[string]string) int {
		st, _, _ := h.post("/v1/chat/completions", body, hdr)
		return st
	}
	for range 3 {
		if st := post(`{"model":"flav-vllm","messages":[{"role":"user","content":"hi"}]}`, nil); st != 200 {
			t.Fatalf("non-streamed: %d", st)
		}
	}
	if st := post(`{"model":"flav-vllm","stream":true,"messages":[{"role":"user","content":"hi [sim ttft=20ms]"}]}`, nil); st != 200 {
		t.Fatalf("streamed: %d", st)
	}
	if st := post(`{"model":"flav-vllm","stream":true,"messages":[{"role":"user","content":"hi [sim fault=cut after=3]"}]}`, nil); st != 200 {
		t.Fatalf("cut stream: %d", st)
	}
	if st := post(`{"model":"no-such-model","messages":[{"role":"user","content":"hi"}]}`, nil); st != 404 {
		t.Fatalf("unknown model: %d", st)
	}
	if st := post(`{"model":"flav-vllm","messages":[{"role":"user","content":"hi"}]}`, map[string]string{"Authorization": "Bearer sk-tg-wrong"}); st != 401 {
		t.Fatalf("bad key: %d", st)
	}
	_, _, poor := h.newKey(1, nil)
	if st, _, _ := h.postKey(poor, `{"model":"flav-vllm","messages":[{"role":"user","content":"hi"}]}`, nil); st != 402 {
		t.Fatalf("poor account: %d", st)
	}

	st, scrape := h.adminGet(t, "/metrics", "")
	if st != 200 {
		t.Fatalf("/metrics: %d %s", st, scrape)
	}
	for _, want := range []string{
		`tollgate_requests_total{class="network",code="",model="flav-vllm",status="200"} 4`,
		`tollgate_requests_total{class="network",code="upstream_error",model="flav-vllm",status="200"} 1`,
		`tollgate_requests_total{class="",code="model_not_found",model="",status="404"} 1`,
		`tollgate_requests_total{class="",code="invalid_api_key",model="",status="401"} 1`,
		`tollgate_requests_total{class="",code="insufficient_balance",model="flav-vllm",status="402"} 1`,
		`tollgate_auth_failures_total{reason="invalid_api_key"} 1`,
		`tollgate_request_duration_seconds_count{class="network",model="flav-vllm",stream="false"} 3`,
		`tollgate_request_duration_seconds_count{class="network",model="flav-vllm",stream="true"} 2`,
		`tollgate_time_to_first_token_seconds_count{class="network",model="flav-vllm"} 2`,
		`tollgate_requests_in_flight{kind="request"} 0`,
		`tollgate_requests_in_flight{kind="stream"} 0`,
		`tollgate_node_up{class="network",node="node-vllm"} 1`,
		`tollgate_billing_holds_refused_total 1`,
		`tollgate_build_info{`,
	} {
		if !strings.Contains(scrape, want) {
			t.Errorf("the scrape lacks %s", want)
		}
	}
	for _, moving := range []string{`tollgate_tokens_total{class="network",kind="prompt",model="flav-vllm"}`,
		`tollgate_tokens_total{class="network",kind="completion",model="flav-vllm"}`,
		`tollgate_cost_usd_total{class="network",model="flav-vllm"}`, `tollgate_billing_settled_total`} {
		i := strings.Index(scrape, moving+" ")
		if i < 0 || strings.HasPrefix(scrape[i+len(moving)+1:], "0\n") {
			t.Errorf("%s did not move", moving)
		}
	}
	if strings.Contains(scrape, h.acct.ID) || strings.Contains(scrape, h.keyRec.ID) || strings.Contains(scrape, `="req_`) {
		t.Error("an account, a key or a request id reached the scrape")
	}
	promtoolCheck(t, scrape)
	// Not on the api listener.
	if st, _, _ := h.get("/metrics"); st != 404 {
		t.Errorf("/metrics on the api listener: %d, want 404", st)
	}
	// pprof needs the admin token.
	if st, _ := h.adminGet(t, "/debug/pprof/", ""); st != 401 {
		t.Errorf("pprof without the token: %d", st)
	}
	if st, body := h.adminGet(t, "/debug/pprof/", "s3cret"); st != 200 || !strings.Contains(body, "goroutine") {
		t.Errorf("pprof with the token: %d", st)
	}
	// /healthz reports what `tollgate version` prints (docs/operations.md).
	b := buildInfo()
	want := fmt.Sprintf(`{"status":"ok","version":%q,"commit":%q}`, b.Version, b.Commit)
	if st, body := h.adminGet(t, "/healthz", ""); st != 200 || strings.TrimSpace(body) != want {
		t.Errorf("healthz: %d %s, want %s", st, body, want)
	}
}

// /readyz names a model whose every node is out of rotation.
func TestReadyzNamesAModelWithoutNodes(t *testing.T) {
	h := newHarness(t, harnessOptions{listen: "  admin: 127.0.0.1:0\n"})
	if st, body := h.adminGet(t, "/readyz", ""); st != 200 {
		t.Fatalf("readyz: %d %s", st, body)
	}
	if err := h.sim("vllm").RefuseConnections(true); err != nil {
		t.Fatal(err)
	}
	// A refused connection takes the node out at once.
	h.post("/v1/chat/completions", `{"model":"flav-vllm","messages":[{"role":"user","content":"hi"}]}`, nil)
	st, body := h.adminGet(t, "/readyz", "")
	if st != 503 || !strings.Contains(body, "flav-vllm") {
		t.Fatalf("readyz with flav-vllm's only node down: %d %s", st, body)
	}
}

// syncBuffer is a bytes.Buffer safe for the logger's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// One JSON line per request with the documented fields, for a streamed and
// a non-streamed request, and never the key or the prompt.
func TestRequestLogLines(t *testing.T) {
	var buf syncBuffer
	h := newHarness(t, harnessOptions{log: slog.New(slog.NewJSONHandler(&buf, nil))})
	const prompt = "a very secret prompt 7f3a"
	for _, stream := range []string{"false", "true"} {
		if st, _, _ := h.post("/v1/chat/completions", `{"model":"flav-vllm","stream":`+stream+`,"messages":[{"role":"user","content":"`+prompt+`"}]}`, nil); st != 200 {
			t.Fatalf("stream=%s: %d", stream, st)
		}
	}
	h.post("/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, nil)
	deadline := time.Now().Add(5 * time.Second)
	var lines []map[string]any
	for time.Now().Before(deadline) {
		lines = lines[:0]
		for _, l := range strings.Split(buf.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "request" {
				lines = append(lines, m)
			}
		}
		if len(lines) >= 3 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(lines) != 3 {
		t.Fatalf("%d request lines:\n%s", len(lines), buf.String())
	}
	for i, l := range lines[:2] {
		for _, k := range []string{"time", "request_id", "account", "key_prefix", "model", "backend", "node", "status",
			"prompt_tokens", "completion_tokens", "cost", "duration_ms", "client"} {
			if _, ok := l[k]; !ok {
				t.Errorf("line %d lacks %s: %v", i, k, l)
			}
		}
		if _, ok := l["cost"].(string); !ok {
			t.Errorf("cost is not a decimal string: %v", l["cost"])
		}
	}
	if _, ok := lines[1]["ttft_ms"]; !ok {
		t.Errorf("the stream's line has no ttft_ms: %v", lines[1])
	}
	if lines[2]["error_code"] != "model_not_found" {
		t.Errorf("the failed request's line: %v", lines[2])
	}
	all := buf.String()
	if strings.Contains(all, h.key) || strings.Contains(all, prompt) {
		t.Error("a key or the prompt reached the log")
	}
}

// A reload (SIGHUP) while 20 streams run: every stream finishes, new
// requests see the new catalogue, an invalid file is refused and the old
// catalogue kept, and the metrics go on counting.
func TestReloadDuringStreams(t *testing.T) {
	h := newHarness(t, harnessOptions{listen: "  admin: 127.0.0.1:0\n"})
	const n = 20
	var wg sync.WaitGroup
	ends := make(chan []byte, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, b := h.post("/v1/chat/completions", `{"model":"flav-vllm","stream":true,"messages":[{"role":"user","content":"x [sim tokens=40 gap=20ms]"}]}`, nil)
			ends <- b
		}()
	}
	if err := h.sim("vllm").WaitStats(5*time.Second, func(s simStats) bool { return s.OpenStreams >= n }); err != nil {
		t.Fatalf("the streams did not start: %v", err)
	}
	orig, err := os.ReadFile(h.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	added := strings.Replace(string(orig), "models:\n", `models:
  - id: reloaded-model
    kind: chat
    context_length: 32768
    max_output_tokens: 4096
    backends:
      - class: network
        upstream_model: up-vllm
        rates: {input: "1", output: "2"}
        nodes:
          - {name: node-vllm, url: "`+h.sim("vllm").URL()+`/v1", flavour: vllm}
`, 1)
	if err := os.WriteFile(h.cfgPath, []byte(added), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := h.main.Reload(h.cfgPath); err != nil {
		t.Fatalf("reload: %v", err)
	}
	if st, _, body := h.post("/v1/chat/completions", `{"model":"reloaded-model","messages":[{"role":"user","content":"hi"}]}`, nil); st != 200 {
		t.Fatalf("the new model after the reload: %d %s", st, body)
	}
	// An invalid file: refused, the catalogue kept.
	if err := os.WriteFile(h.cfgPath, []byte("models: [this is: not valid"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := h.main.Reload(h.cfgPath); err == nil {
		t.Fatal("an invalid config was accepted")
	}
	_, _, models := h.get("/v1/models")
	if !strings.Contains(string(models), `"reloaded-model"`) {
		t.Fatalf("the catalogue was not kept after a refused reload: %s", models)
	}
	wg.Wait()
	close(ends)
	for b := range ends {
		if !bytes.HasSuffix(b, []byte("data: [DONE]\n\n")) {
			t.Fatalf("a stream did not finish across the reload: %.300s", b)
		}
	}
	_, scrape := h.adminGet(t, "/metrics", "")
	for _, want := range []string{
		`tollgate_requests_total{class="network",code="",model="flav-vllm",status="200"} 20`,
		`tollgate_requests_total{class="network",code="",model="reloaded-model",status="200"} 1`,
	} {
		if !strings.Contains(scrape, want) {
			t.Errorf("metrics after the reload lack %s", want)
		}
	}
}

// serve writes JSON request lines straight to the log's buffer, and only
// then: a text log, or a level above info, goes through slog (or nowhere).
func TestConfigLoggerRequestLines(t *testing.T) {
	for _, tc := range []struct {
		format, level string
		direct        bool
	}{{"json", "info", true}, {"json", "debug", true}, {"text", "info", false}, {"json", "warn", false}} {
		cfg := &config.Config{Log: config.Log{Format: tc.format, Level: tc.level, Output: "stderr"}}
		var errOut bytes.Buffer
		log, lines, done, err := configLogger(cfg, &errOut, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if (lines != nil) != tc.direct || log == nil {
			t.Errorf("%s at %s: direct request lines %v, want %v", tc.format, tc.level, lines != nil, tc.direct)
		}
		if lines != nil {
			_, _ = lines.Write([]byte("{\"msg\":\"request\"}\n"))
		}
		done()
		if tc.direct && !strings.Contains(errOut.String(), `"msg":"request"`) {
			t.Errorf("%s: a request line written to the buffer was not written out at close", tc.format)
		}
	}
}

// promtoolCheck runs Prometheus's own check of a scrape when
// TOLLGATE_TEST_PROMTOOL is set (.ci/run sets it and installs promtool;
// then a missing one fails).
func promtoolCheck(t *testing.T, scrape string) {
	t.Helper()
	if os.Getenv("TOLLGATE_TEST_PROMTOOL") == "" {
		return
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("TOLLGATE_TEST_PROMTOOL is set but promtool is not installed: %v", err)
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(scrape)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out.String())
	}
}
