package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/sqlite"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
)

const hiMessages = `"messages":[{"role":"user","content":"hi"}]`

// errorBody decodes an error envelope and checks it has exactly the four keys.
func errorBody(t *testing.T, b []byte) (code, param, typ, msg string) {
	t.Helper()
	var env struct {
		Error map[string]json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(b, &env); err != nil || env.Error == nil {
		t.Fatalf("not an error envelope: %s", b)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := env.Error[k]; !ok {
			t.Errorf("error envelope lacks %q: %s", k, b)
		}
	}
	if len(env.Error) != 4 {
		t.Errorf("error envelope has extra keys: %s", b)
	}
	_ = json.Unmarshal(env.Error["code"], &code)
	_ = json.Unmarshal(env.Error["param"], &param)
	_ = json.Unmarshal(env.Error["type"], &typ)
	_ = json.Unmarshal(env.Error["message"], &msg)
	if strings.Contains(msg, "127.0.0.1") || strings.Contains(msg, "sk-") {
		t.Errorf("error message leaks an address or a key: %q", msg)
	}
	return
}

func expectError(t *testing.T, status int, b []byte, wantStatus int, wantCode, wantParam string) {
	t.Helper()
	code, param, _, _ := errorBody(t, b)
	if status != wantStatus || code != wantCode || param != wantParam {
		t.Errorf("got %d %s (param %q), want %d %s (param %q): %s", status, code, param, wantStatus, wantCode, wantParam, b)
	}
}

func TestUnservedEndpoints404(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, p := range []struct{ method, path string }{
		{"POST", "/v1/embeddings"}, {"POST", "/v1/completions"}, {"POST", "/v1/responses"},
		{"POST", "/v1/images/generations"}, {"POST", "/v1/audio/speech"}, {"POST", "/v1/audio/transcriptions"},
		{"GET", "/v1/files"}, {"POST", "/v1/assistants"}, {"POST", "/v1/batches"}, {"POST", "/v1/moderations"},
		{"GET", "/v1/models/tg-chat"}, {"GET", "/v1/fine_tuning/jobs"}, {"POST", "/v1/chat/completions/x"},
		{"GET", "/"}, {"GET", "/v2/models"},
		// Escaped or trailing-slash spellings of a served path are not it.
		{"POST", "/v1/chat%2Fcompletions"}, {"POST", "/v1/chat/completions/"}, {"GET", "/v1/models/"},
		// So are spellings a path cleaner would fix (no redirect: a client
		// follows a 301 by turning its POST into a GET).
		{"POST", "/v1//chat/completions"}, {"POST", "/v1/./chat/completions"}, {"GET", "//v1/models"},
		{"POST", "/v2/../v1/chat/completions"}, {"GET", "/v1//embeddings"},
	} {
		req, _ := http.NewRequest(p.method, "http://"+h.main.Addr("api")+p.path, strings.NewReader(`{"model":"tg-chat"}`))
		req.Header.Set("Authorization", "Bearer "+h.key)
		req.Header.Set("Content-Type", "application/json")
		status, hdr, b := h.do(req)
		expectError(t, status, b, 404, "not_found", "")
		if hdr.Get("X-Request-Id") == "" {
			t.Errorf("%s %s: no X-Request-Id", p.method, p.path)
		}
	}
}

func TestMethodNotAllowed(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, c := range []struct{ method, path, allow string }{
		{"GET", "/v1/chat/completions", "POST"},
		{"PUT", "/v1/chat/completions", "POST"},
		{"POST", "/v1/models", "GET, HEAD"},
		{"DELETE", "/pricing", "GET, HEAD"},
	} {
		req, _ := http.NewRequest(c.method, "http://"+h.main.Addr("api")+c.path, nil)
		status, hdr, b := h.do(req)
		expectError(t, status, b, 405, "method_not_allowed", "")
		if hdr.Get("Allow") != c.allow {
			t.Errorf("%s %s: Allow = %q, want %q", c.method, c.path, hdr.Get("Allow"), c.allow)
		}
	}
}

// bodyOfSize builds a valid request of exactly n bytes (padding in an
// unknown field, which passes through to the backend).
func bodyOfSize(n int) []byte {
	head := `{"model":"flav-vllm",` + hiMessages + `,"x_pad":"`
	tail := `"}`
	return []byte(head + strings.Repeat("a", n-len(head)-len(tail)) + tail)
}

// hiddenLength hides the body's length so the client sends it chunked.
type hiddenLength struct{ r io.Reader }

func (h hiddenLength) Read(p []byte) (int, error) { return h.r.Read(p) }

func TestBodyLimit(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	url := "http://" + h.main.Addr("api") + "/v1/chat/completions"
	send := func(body io.Reader) (int, []byte) {
		req, _ := http.NewRequest("POST", url, body)
		req.Header.Set("Authorization", "Bearer "+h.key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("post: %v", err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	exact := bodyOfSize(8 << 20)
	if len(exact) != 8388608 {
		t.Fatalf("built %d bytes", len(exact))
	}
	if status, b := send(bytes.NewReader(exact)); status != 200 {
		t.Errorf("exactly 8 MiB: status %d: %.300s", status, b)
	}
	if status, b := send(hiddenLength{bytes.NewReader(exact)}); status != 200 {
		t.Errorf("exactly 8 MiB chunked: status %d: %.300s", status, b)
	}
	over := bodyOfSize(8<<20 + 1)
	status, b := send(bytes.NewReader(over))
	expectError(t, status, b, 413, "request_too_large", "")
	nine := bodyOfSize(9 << 20)
	status, b = send(hiddenLength{bytes.NewReader(nine)})
	expectError(t, status, b, 413, "request_too_large", "")
	if n := len(h.sim("vllm").Requests()); n != 2 {
		t.Errorf("backend saw %d requests, want the 2 accepted ones", n)
	}
}

// The HTTP server's own answers to requests it cannot read carry an
// X-Request-Id and the error envelope, as every other response does.
func TestServerOwnErrorsCarryRequestID(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, c := range []struct {
		name, raw  string
		wantStatus int
		wantCode   string
	}{
		{"malformed request line", "GARBAGE\r\n\r\n", 400, "invalid_request"},
		{"headers too large", "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 2<<20) + "\r\n\r\n", 431, "request_too_large"},
	} {
		conn, err := net.Dial("tcp", h.main.Addr("api"))
		if err != nil {
			t.Fatal(err)
		}
		go func() { _, _ = io.WriteString(conn, c.raw) }()
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			conn.Close()
			t.Fatalf("%s: %v", c.name, err)
		}
		b, _ := io.ReadAll(resp.Body)
		conn.Close()
		expectError(t, resp.StatusCode, b, c.wantStatus, c.wantCode, "")
		if !strings.HasPrefix(resp.Header.Get("X-Request-Id"), "req_") {
			t.Errorf("%s: X-Request-Id %q", c.name, resp.Header.Get("X-Request-Id"))
		}
	}
}

func TestRequestErrors(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	cases := []struct {
		name, body  string
		hdr         map[string]string
		status      int
		code, param string
	}{
		{"not json", `{"model":`, nil, 400, "invalid_json", ""},
		{"array", `[]`, nil, 400, "invalid_json", ""},
		{"no model", `{` + hiMessages + `}`, nil, 400, "invalid_request", "model"},
		{"no messages", `{"model":"tg-chat"}`, nil, 400, "invalid_request", "messages"},
		{"bad role", `{"model":"tg-chat","messages":[{"role":"robot","content":"x"}]}`, nil, 400, "invalid_request", "messages[0].role"},
		{"max_tokens over model max", `{"model":"tg-mini",` + hiMessages + `,"max_tokens":999999}`, nil, 400, "invalid_request", "max_tokens"},
		{"unknown model", `{"model":"gpt-4o",` + hiMessages + `}`, nil, 404, "model_not_found", "model"},
		{"text/plain", `{"model":"tg-chat",` + hiMessages + `}`, map[string]string{"Content-Type": "text/plain"}, 415, "unsupported_media_type", ""},
		{"no content type", `{"model":"tg-chat",` + hiMessages + `}`, map[string]string{"Content-Type": ""}, 415, "unsupported_media_type", ""},
		{"json prefix", `{"model":"tg-chat",` + hiMessages + `}`, map[string]string{"Content-Type": "application/jsonl"}, 415, "unsupported_media_type", ""},
		{"malformed parameters", `{"model":"tg-chat",` + hiMessages + `}`, map[string]string{"Content-Type": "application/json; =x"}, 415, "unsupported_media_type", ""},
		{"tools on cheap", `{"model":"tg-mini",` + hiMessages + `,"tools":[{"type":"function","function":{"name":"f"}}]}`, nil, 400, "capability_not_supported", "tools"},
		{"tool_choice on cheap", `{"model":"tg-mini",` + hiMessages + `,"tool_choice":"required"}`, nil, 400, "capability_not_supported", "tool_choice"},
		{"functions on cheap", `{"model":"tg-mini",` + hiMessages + `,"functions":[{"name":"f"}]}`, nil, 400, "capability_not_supported", "functions"},
		{"reasoning on cheap", `{"model":"tg-mini",` + hiMessages + `,"reasoning_effort":"high"}`, nil, 400, "capability_not_supported", "reasoning_effort"},
		{"reasoning object on cheap", `{"model":"tg-mini",` + hiMessages + `,"reasoning":{"effort":"high"}}`, nil, 400, "capability_not_supported", "reasoning"},
		{"image on chat", `{"model":"tg-chat","messages":[{"role":"user","content":[{"type":"text","text":"what is it"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]}]}`, nil, 400, "capability_not_supported", "messages[0].content[1]"},
		{"pdf on chat", `{"model":"tg-chat","messages":[{"role":"user","content":[{"type":"file","file":{"filename":"a.pdf","file_data":"data:application/pdf;base64,JVBERi0="}}]}]}`, nil, 400, "capability_not_supported", "messages[0].content[0]"},
		{"input_file on mini", `{"model":"tg-mini","messages":[{"role":"user","content":[{"type":"input_file","file_data":"data:application/pdf;base64,JVBERi0="}]}]}`, nil, 400, "capability_not_supported", "messages[0].content[0]"},
		{"web search on a model without tools", `{"model":"tg-mini",` + hiMessages + `,"web_search_options":{}}`, nil, 400, "capability_not_supported", "web_search_options"},
		{"pdf + reasoning on coder", `{"model":"tg-coder","reasoning_effort":"high","messages":[{"role":"user","content":[{"type":"file","file":{"file_data":"data:application/pdf;base64,JVBERi0="}}]}]}`, nil, 400, "capability_combination_unsupported", ""},
	}
	// Any spelling of application/json with parameters is JSON.
	for _, ct := range []string{"application/json; charset=utf-8", "Application/JSON"} {
		if status, _, b := h.post("/v1/chat/completions", `{"model":"tg-chat",`+hiMessages+`}`, map[string]string{"Content-Type": ct}); status != 200 {
			t.Errorf("Content-Type %q: %d %s", ct, status, b)
		}
	}
	before := 0
	for _, s := range h.sims {
		before += int(s.Stats().Requests)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, _, b := h.post("/v1/chat/completions", c.body, c.hdr)
			expectError(t, status, b, c.status, c.code, c.param)
		})
	}
	after := 0
	for _, s := range h.sims {
		after += int(s.Stats().Requests)
	}
	if after != before {
		t.Errorf("rejected requests reached a backend: %d calls", after-before)
	}
}

// Images go to the coder's network; images with reasoning go to its
// fallback (the only backend with both); PDFs to the network.
func TestCapabilityRouting(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	img := `{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}`
	pdf := `{"type":"file","file":{"file_data":"data:application/pdf;base64,JVBERi0="}}`
	for _, c := range []struct{ name, body, backend string }{
		{"image", `{"model":"tg-coder","messages":[{"role":"user","content":[` + img + `]}]}`, "network"},
		{"pdf", `{"model":"tg-coder","messages":[{"role":"user","content":[` + pdf + `]}]}`, "network"},
		{"image+reasoning", `{"model":"tg-coder","reasoning_effort":"low","messages":[{"role":"user","content":[` + img + `]}]}`, "fallback"},
	} {
		status, hdr, b := h.post("/v1/chat/completions", c.body, nil)
		if status != 200 || hdr.Get("X-Tollgate-Backend") != c.backend {
			t.Errorf("%s: %d via %q, want 200 via %s: %.300s", c.name, status, hdr.Get("X-Tollgate-Backend"), c.backend, b)
		}
	}
}

func TestAuthErrors(t *testing.T) {
	h := newHarness(t, harnessOptions{extraYAML: "auth:\n  poll: 20ms\n"})
	body := `{"model":"tg-chat",` + hiMessages + `}`
	for _, c := range []struct{ name, auth, code string }{
		{"missing", "", "missing_api_key"},
		{"basic", "Basic dXNlcjpwYXNz", "missing_api_key"},
		{"wrong shape", "Bearer hello", "invalid_api_key"},
		{"unknown", "Bearer sk-tg-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "invalid_api_key"},
	} {
		status, _, b := h.post("/v1/chat/completions", body, map[string]string{"Authorization": c.auth})
		expectError(t, status, b, 401, c.code, "")
	}
	ctx := context.Background()
	st := h.main.Store
	// Expired key.
	acct, _, _ := h.newKey(tollgate.Dollars(1), nil)
	secret := tollgate.NewKeySecret()
	k := tollgate.Key{ID: tollgate.NewID("key_"), AccountID: acct.ID, Prefix: tollgate.DisplayPrefix(secret), Created: time.Now().UTC(), Expires: time.Now().Add(-time.Minute).UTC()}
	if err := st.CreateKey(ctx, k, tollgate.HashKey(secret)); err != nil {
		t.Fatal(err)
	}
	status, _, b := h.post("/v1/chat/completions", body, map[string]string{"Authorization": "Bearer " + secret})
	expectError(t, status, b, 401, "api_key_expired", "")
	// Model allow-list.
	_, _, mini := h.newKey(tollgate.Dollars(1), []string{"tg-mini"})
	status, _, b = h.post("/v1/chat/completions", body, map[string]string{"Authorization": "Bearer " + mini})
	expectError(t, status, b, 403, "model_not_allowed", "model")
	status, _, _ = h.post("/v1/chat/completions", `{"model":"tg-mini",`+hiMessages+`}`, map[string]string{"Authorization": "Bearer " + mini})
	if status != 200 {
		t.Errorf("allowed model: status %d", status)
	}
	// Revocation and a disabled account take effect within the poll interval.
	acct2, key2, secret2 := h.newKey(tollgate.Dollars(1), nil)
	if status, _, _ := h.post("/v1/chat/completions", body, map[string]string{"Authorization": "Bearer " + secret2}); status != 200 {
		t.Fatalf("fresh key: %d", status)
	}
	if err := st.RevokeKey(ctx, key2.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() bool {
		status, _, b := h.post("/v1/chat/completions", body, map[string]string{"Authorization": "Bearer " + secret2})
		return status == 401 && bytes.Contains(b, []byte(`"code":"api_key_revoked"`))
	})
	_ = acct2
	acct3, _, secret3 := h.newKey(tollgate.Dollars(1), nil)
	if err := st.SetAccountDisabled(ctx, acct3.ID, true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() bool {
		status, _, b := h.post("/v1/chat/completions", body, map[string]string{"Authorization": "Bearer " + secret3})
		return status == 403 && bytes.Contains(b, []byte(`"code":"account_disabled"`))
	})
}

// waitFor polls cond until it holds or the deadline passes (no timing assertion:
// the deadline is far above the documented bound).
func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestUpstreamFailures(t *testing.T) {
	h := newHarness(t, harnessOptions{timeouts: "timeouts:\n  non_stream: 400ms\n"})
	// 5xx from the backend: 502, without the backend's words or address.
	status, _, b := h.post("/v1/chat/completions", `{"model":"flav-vllm","messages":[{"role":"user","content":"x [sim fault=500]"}]}`, nil)
	expectError(t, status, b, 502, "upstream_error", "")
	// Garbage from the backend: 502.
	status, _, b = h.post("/v1/chat/completions", `{"model":"flav-sglang","messages":[{"role":"user","content":"x [sim fault=malformed]"}]}`, nil)
	expectError(t, status, b, 502, "upstream_error", "")
	// Context length, streamed or not, each flavour's own error: 400 context_length_exceeded.
	for _, f := range flavourSims {
		for _, stream := range []string{"false", "true"} {
			status, _, b := h.post("/v1/chat/completions", `{"model":"flav-`+string(f)+`","stream":`+stream+`,"messages":[{"role":"user","content":"x [sim fault=context_length]"}]}`, nil)
			expectError(t, status, b, 400, "context_length_exceeded", "messages")
		}
	}
	// No answer within the non-streamed timeout: 504, and the backend call is cancelled.
	sim := h.sim("llamacpp")
	status, _, b = h.post("/v1/chat/completions", `{"model":"flav-llamacpp","messages":[{"role":"user","content":"x [sim fault=hang]"}]}`, nil)
	expectError(t, status, b, 504, "timeout", "")
	if err := sim.WaitStats(5*time.Second, func(s simStats) bool { return s.Cancelled >= 1 && s.InFlight == 0 }); err != nil {
		t.Errorf("hung backend call not cancelled: %v", err)
	}
}

func TestBackendUnavailable(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	sim := h.sim("ollama")
	if err := sim.RefuseConnections(true); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ { // first: refused on connect; second: the node is known down
		status, hdr, b := h.post("/v1/chat/completions", `{"model":"flav-ollama",`+hiMessages+`}`, nil)
		expectError(t, status, b, 503, "backend_unavailable", "")
		if hdr.Get("Retry-After") == "" {
			t.Error("503 without Retry-After")
		}
	}
	// The demo's tg-chat has two network nodes: one refusing is not a failure.
	if err := h.sims["sglang"].RefuseConnections(true); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		status, hdr, b := h.post("/v1/chat/completions", `{"model":"tg-chat",`+hiMessages+`}`, nil)
		if status != 200 || hdr.Get("X-Tollgate-Node") != "gpu-d" {
			t.Fatalf("with gpu-c refusing: %d via %q: %s", status, hdr.Get("X-Tollgate-Node"), b)
		}
	}
	// Both network nodes down: the fallback serves.
	if err := h.sims["llamacpp"].RefuseConnections(true); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		status, hdr, _ := h.post("/v1/chat/completions", `{"model":"tg-chat",`+hiMessages+`}`, nil)
		if i == 2 && (status != 200 || hdr.Get("X-Tollgate-Backend") != "fallback") {
			t.Fatalf("network down: %d via %q", status, hdr.Get("X-Tollgate-Backend"))
		}
	}
}

// Keep-alive comments flow while the backend is silent; a backend silent
// past the idle cap ends the stream with an error event.
func TestStreamKeepAliveAndIdle(t *testing.T) {
	h := newHarness(t, harnessOptions{timeouts: "timeouts:\n  keep_alive: 30ms\n  stream_idle: 400ms\n"})
	status, _, b := h.post("/v1/chat/completions", `{"model":"flav-vllm","stream":true,"messages":[{"role":"user","content":"x [sim ttft=200ms tokens=3]"}]}`, nil)
	if status != 200 || !bytes.Contains(b, []byte(": keep-alive\n\n")) || !bytes.HasSuffix(b, []byte("data: [DONE]\n\n")) {
		t.Errorf("slow first token: %d %s", status, b)
	}
	status, _, b = h.post("/v1/chat/completions", `{"model":"flav-vllm","stream":true,"messages":[{"role":"user","content":"x [sim fault=stall after=2]"}]}`, nil)
	if status != 200 || bytes.Contains(b, []byte("[DONE]")) {
		t.Fatalf("stalled stream: %d %s", status, b)
	}
	events := bytes.Split(bytes.TrimSpace(b), []byte("\n\n"))
	last := events[len(events)-1]
	usage := events[len(events)-2]
	if code, _, _, _ := errorBody(t, bytes.TrimPrefix(last, []byte("data: "))); code != "timeout" {
		t.Errorf("last event = %s", last)
	}
	if !bytes.Contains(usage, []byte(`"choices":[],"usage":{`)) {
		t.Errorf("no usage chunk before the error event: %s", usage)
	}
}

// Keep-alive comments reach the client in every silence of the backend, also
// one that starts after a token, and do not flood it. The bound on each gap
// (no gap longer than keep_alive) is relay's TestStreamKeepAliveGaps, on a
// made-up clock; here only what a loaded machine cannot break is asserted:
// the order of events (a silence of a second holds keep-alives due every 180
// ms: only a stall of most of a second could leave one out) and an upper
// bound on their number (each goes out at least 180 ms after the previous
// write, so no more than the stream's duration allows).
func TestStreamKeepAlivesBetweenTokens(t *testing.T) {
	const keepAlive = 200 * time.Millisecond
	h := newHarness(t, harnessOptions{timeouts: "timeouts:\n  keep_alive: 200ms\n  stream_idle: 10s\n"})
	start := time.Now()
	resp := h.openChat(`{"model":"flav-vllm","stream":true,"messages":[{"role":"user","content":"x [sim ttft=105ms tokens=3 gap=1s]"}]}`)
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line := sc.Text(); line != "" {
			lines = append(lines, line)
		}
	}
	elapsed := time.Since(start)
	if resp.StatusCode != 200 || len(lines) == 0 || lines[len(lines)-1] != "data: [DONE]" {
		t.Fatalf("status %d, events %q", resp.StatusCode, lines)
	}
	// The events between the first content token and the last.
	var tokens []int
	for i, l := range lines {
		if strings.Contains(l, `"delta":{"content":"`) && !strings.Contains(l, `"content":""`) {
			tokens = append(tokens, i)
		}
	}
	if len(tokens) != 3 {
		t.Fatalf("%d content tokens, want 3: %q", len(tokens), lines)
	}
	keepAlives := 0
	for _, l := range lines {
		if l == ": keep-alive" {
			keepAlives++
		}
	}
	for k := 1; k < len(tokens); k++ {
		if !slices.Contains(lines[tokens[k-1]:tokens[k]], ": keep-alive") {
			t.Errorf("no keep-alive in the 1 s silence between tokens %d and %d: %q", k, k+1, lines)
		}
	}
	if most := int(elapsed / (keepAlive - keepAlive/10)); keepAlives > most {
		t.Errorf("%d keep-alives in %v: more than one every %v since the last write", keepAlives, elapsed, keepAlive-keepAlive/10)
	}
}

// Shutting down: /readyz turns 503 "shutting down" at once, the api
// listener stops accepting while its running stream finishes, and the admin
// listener answers until the drain is over, then stops too.
func TestShutdownDrainsBehindReadiness(t *testing.T) {
	h := newHarness(t, harnessOptions{listen: "  admin: 127.0.0.1:0\n"})
	admin, api := h.main.Addr("admin"), h.main.Addr("api")
	readyz := func() (int, string) {
		resp, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if st, body := readyz(); st != 200 {
		t.Fatalf("readyz before the shutdown: %d %s", st, body)
	}
	streamDone := make(chan []byte, 1)
	go func() {
		_, _, b := h.post("/v1/chat/completions", `{"model":"flav-vllm","stream":true,"messages":[{"role":"user","content":"x [sim ttft=1500ms tokens=2]"}]}`, nil)
		streamDone <- b
	}()
	time.Sleep(200 * time.Millisecond) // the stream is running
	closed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		closed <- h.main.Close(ctx)
	}()
	time.Sleep(200 * time.Millisecond)
	if st, body := readyz(); st != 503 || !strings.Contains(body, `"reason":"shutting down"`) {
		t.Errorf("readyz while draining: %d %s, want 503 shutting down", st, body)
	}
	if c, err := net.Dial("tcp", api); err == nil {
		c.Close()
		t.Error("the api listener still accepts connections while it drains")
	}
	if b := <-streamDone; !bytes.HasSuffix(b, []byte("data: [DONE]\n\n")) {
		t.Errorf("the running stream did not finish: %s", b)
	}
	if err := <-closed; err != nil {
		t.Errorf("close: %v", err)
	}
	if c, err := net.Dial("tcp", admin); err == nil {
		c.Close()
		t.Error("the admin listener still accepts connections after the shutdown")
	}
}

// A stream still running at the shutdown deadline is cut, and what it
// generated is charged: its request ends and settles before the biller and
// the store close.
func TestShutdownChargesAStreamCutAtTheDeadline(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	resp := h.openChat(`{"model":"flav-vllm","stream":true,"messages":[{"role":"user","content":"x [sim tokens=100 gap=50ms]"}]}`)
	id := resp.Header.Get("X-Request-Id")
	go func() { _, _ = io.Copy(io.Discard, resp.Body) }()
	time.Sleep(300 * time.Millisecond) // a few tokens out, most of the answer still to come
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := h.main.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("close with a stream running past the deadline: %v", err)
	}
	db, err := sqlite.Open(h.main.Config.Store.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	e, err := db.LedgerEntry(context.Background(), id)
	if err != nil || e.Charge == nil || e.Charge.CompletionTokens == 0 || e.Amount >= 0 {
		t.Fatalf("the cut stream's charge: %+v, %v", e, err)
	}
	if r, err := billing.Audit(context.Background(), db, time.Now(), time.Minute); err != nil || !r.OK {
		t.Errorf("audit after the shutdown: %v %v", r.Problems, err)
	}
}

func TestModelsAndPricing(t *testing.T) {
	h := newHarness(t, harnessOptions{extraYAML: "traffic:\n  flush: 1h\n  share_cache: 1ns\n"})
	status, _, b := h.get("/v1/models")
	if status != 200 {
		t.Fatalf("models: %d", status)
	}
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID            string   `json:"id"`
			Object        string   `json:"object"`
			Created       int64    `json:"created"`
			OwnedBy       string   `json:"owned_by"`
			Capabilities  []string `json:"capabilities"`
			ContextLength int64    `json:"context_length"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &list); err != nil || list.Object != "list" {
		t.Fatalf("models body: %v %s", err, b)
	}
	caps := map[string]string{}
	for _, m := range list.Data {
		if m.Object != "model" || m.Created <= 0 || m.OwnedBy == "" || m.ContextLength <= 0 {
			t.Errorf("model entry %+v", m)
		}
		caps[m.ID] = strings.Join(m.Capabilities, ",")
	}
	if caps["tg-coder"] != "tools,reasoning,image_input,pdf_input,web_search" || caps["tg-chat"] != "tools,reasoning,web_search" || caps["tg-mini"] != "" {
		t.Errorf("capabilities = %v", caps)
	}

	get := func(hdr map[string]string) (int, http.Header, []byte) {
		req, _ := http.NewRequest("GET", "http://"+h.main.Addr("api")+"/pricing", nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		return h.do(req)
	}
	status, hdr, b := get(nil)
	if status != 200 || hdr.Get("Cache-Control") != "public, max-age=60" || hdr.Get("ETag") == "" {
		t.Fatalf("pricing: %d %v", status, hdr)
	}
	type rates struct{ Input, Output string }
	var p struct {
		Object, Currency, Unit string
		Data                   []struct {
			ID                         string
			Network, Fallback, Average rates
		}
		Uptime json.Number `json:"network_uptime_7d"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&p); err != nil {
		t.Fatal(err)
	}
	if p.Object != "pricing" || p.Currency != "USD" || p.Unit != "per_1m_tokens" || p.Uptime != "1" {
		t.Errorf("pricing head: %s", b)
	}
	if !bytes.Contains(b, []byte(`{"id":"tg-chat","network":{"input":"0.12","output":"0.4"},"fallback":{"input":"2.2","output":"8.8"},"average":{"input":"0.12","output":"0.4"},"web_search":"0.004"}`)) {
		t.Errorf("tg-chat pricing with no traffic: %s", b)
	}
	if status, _, _ := get(map[string]string{"If-None-Match": hdr.Get("ETag")}); status != 304 {
		t.Errorf("If-None-Match: %d, want 304", status)
	}
	// Serve 3 requests on the network and 1 on the fallback, flush, and the blend moves.
	for i := 0; i < 3; i++ {
		if status, _, _ := h.post("/v1/chat/completions", `{"model":"tg-chat",`+hiMessages+`}`, nil); status != 200 {
			t.Fatal(status)
		}
	}
	if status, hdr, _ := h.post("/v1/chat/completions", `{"model":"flav-openai",`+hiMessages+`}`, nil); status != 200 || hdr.Get("X-Tollgate-Backend") != "fallback" {
		t.Fatal(status)
	}
	if err := h.main.Traffic.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	status, hdr2, b := get(map[string]string{"If-None-Match": hdr.Get("ETag")})
	if status != 200 || hdr2.Get("ETag") == hdr.Get("ETag") {
		t.Fatalf("pricing after traffic: %d", status)
	}
	// share 3/4: input 0.12*0.75 + 2.2*0.25 = 0.64; output 0.4*0.75 + 8.8*0.25 = 2.5
	if !bytes.Contains(b, []byte(`"network_uptime_7d":0.75`)) || !bytes.Contains(b, []byte(`{"id":"tg-chat","network":{"input":"0.12","output":"0.4"},"fallback":{"input":"2.2","output":"8.8"},"average":{"input":"0.64","output":"2.5"},"web_search":"0.004"}`)) {
		t.Errorf("pricing after 3 network + 1 fallback: %s", b)
	}
}

// A node that takes streamed requests and never answers them (not even
// their headers) is ejected like one that times out non-streamed requests:
// after health.failure_threshold (3) such streams on it, outlier detection
// takes it out while its /health still answers 200. Of a backend's two nodes
// at most one (max_ejected_percent 50) is ejected, and a backend's last node
// up by its probes never is.
func TestStreamHeaderTimeoutsTakeTheNodeOut(t *testing.T) {
	// Two nodes on one simulator: a different key makes a different node.
	t.Setenv("TG_TEST_NODE_A_KEY", "a")
	t.Setenv("TG_TEST_NODE_B_KEY", "b")
	h := newHarness(t, harnessOptions{timeouts: "timeouts:\n  keep_alive: 50ms\n  stream_idle: 200ms\n",
		models: `
  - id: two-nodes
    kind: chat
    context_length: 32768
    max_output_tokens: 4096
    backends:
      - class: network
        upstream_model: up-vllm
        rates: {input: "1", output: "2"}
        nodes:
          - {name: node-a, url: "{{flav-vllm}}/v1", key_env: TG_TEST_NODE_A_KEY, flavour: vllm}
          - {name: node-b, url: "{{flav-vllm}}/v1", key_env: TG_TEST_NODE_B_KEY, flavour: vllm}
`})
	hung := `{"model":"two-nodes","stream":true,"messages":[{"role":"user","content":"x [sim fault=hang]"}]}`
	// A hung stream ends by the idle cap. Its first keep-alive is due at
	// 45 ms and commits a 200, so the timeout comes as an error event; a
	// loaded machine may run that watchdog only after the 200 ms cap, and
	// the stream then ends uncommitted, as a 504 of the same error. Either
	// is the node's timeout, which is what outlier detection counts.
	timedOut := func(status int, b []byte) bool {
		return (status == 200 || status == 504) && bytes.Contains(b, []byte(`"code":"timeout"`))
	}
	for i := range 6 { // three on each node: the picker alternates
		status, _, b := h.post("/v1/chat/completions", hung, nil)
		if !timedOut(status, b) {
			t.Fatalf("hung stream %d: %d %s", i, status, b)
		}
	}
	m, _ := h.main.Relay.Catalog().Lookup("two-nodes")
	nodes := m.Backends[0].Nodes
	ejected := map[string]bool{}
	for _, n := range nodes {
		ejected[n.Name] = n.Ejected(time.Now())
	}
	if len(ejected) != 2 || ejected["node-a"] == ejected["node-b"] {
		t.Fatalf("after three hung streams on each of two nodes: ejected %v, want exactly one", ejected)
	}
	for range 3 {
		status, hdr, b := h.post("/v1/chat/completions", `{"model":"two-nodes",`+hiMessages+`}`, nil)
		if status != 200 || ejected[hdr.Get("X-Tollgate-Node")] {
			t.Fatalf("next request: %d on %q %s, want 200 from the node not ejected", status, hdr.Get("X-Tollgate-Node"), b)
		}
	}

	// A single-node backend keeps its node: the failures reach the clients,
	// and a good answer is served as soon as the node gives one.
	hungOne := strings.ReplaceAll(hung, "two-nodes", "flav-vllm")
	for i := range 3 {
		if status, _, b := h.post("/v1/chat/completions", hungOne, nil); !timedOut(status, b) {
			t.Fatalf("hung stream %d on a single node: %d %s", i, status, b)
		}
	}
	if status, _, b := h.post("/v1/chat/completions", `{"model":"flav-vllm",`+hiMessages+`}`, nil); status != 200 {
		t.Fatalf("the last node of a backend was taken out: %d %s", status, b)
	}
}

// A node that refused connections is out; when it answers its health
// endpoint again, an active probe brings it back.
func TestNodeComesBackAfterProbe(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, f := range []string{"vllm", "llamacpp", "ollama", "sglang"} {
		sim := h.sim(f)
		if err := sim.RefuseConnections(true); err != nil {
			t.Fatal(err)
		}
		body := `{"model":"flav-` + f + `",` + hiMessages + `}`
		status, _, b := h.post("/v1/chat/completions", body, nil)
		expectError(t, status, b, 503, "backend_unavailable", "")
		if err := sim.RefuseConnections(false); err != nil {
			t.Fatal(err)
		}
		// Still down: nothing probed it yet, and its backoff holds it out.
		if status, _, _ := h.post("/v1/chat/completions", body, nil); status != 503 {
			t.Errorf("%s: down node served before any probe: %d", f, status)
		}
		waitFor(t, 10*time.Second, func() bool {
			h.main.Relay.ProbeAll(context.Background(), time.Second)
			status, _, _ := h.post("/v1/chat/completions", body, nil)
			return status == 200
		})
	}
}

// A stream that runs past timeouts.stream_total is ended with a usage chunk
// and a timeout error event, even while tokens keep coming.
func TestStreamTotalCap(t *testing.T) {
	h := newHarness(t, harnessOptions{timeouts: "timeouts:\n  keep_alive: 30ms\n  stream_idle: 300ms\n  stream_total: 400ms\n"})
	start := time.Now()
	status, _, b := h.post("/v1/chat/completions", `{"model":"flav-vllm","stream":true,"messages":[{"role":"user","content":"x [sim tokens=100 gap=40ms]"}]}`, nil)
	took := time.Since(start)
	if status != 200 || bytes.Contains(b, []byte("[DONE]")) {
		t.Fatalf("stream past its total cap: %d %s", status, b)
	}
	events := bytes.Split(bytes.TrimSpace(b), []byte("\n\n"))
	last := events[len(events)-1]
	code, _, _, msg := errorBody(t, bytes.TrimPrefix(last, []byte("data: ")))
	if code != "timeout" || !strings.Contains(msg, "maximum duration") {
		t.Errorf("last event = %s, want the total cap's timeout", last)
	}
	if !bytes.Contains(events[len(events)-2], []byte(`"choices":[],"usage":{`)) {
		t.Errorf("no usage chunk before the error event: %s", events[len(events)-2])
	}
	// 100 tokens 40 ms apart take 4 s: the cap (the watchdog fires when it is due) ended it long before.
	if took > 2*time.Second {
		t.Errorf("the stream ran %s; its total cap is 400ms", took)
	}
}

// A backend that stays silent past the idle cap before it even sends its
// headers ends the stream the same way as one silent after them: timeout.
func TestStreamIdleBeforeHeadersIsTimeout(t *testing.T) {
	h := newHarness(t, harnessOptions{timeouts: "timeouts:\n  keep_alive: 30ms\n  stream_idle: 300ms\n"})
	status, _, b := h.post("/v1/chat/completions", `{"model":"flav-vllm","stream":true,"messages":[{"role":"user","content":"x [sim fault=hang]"}]}`, nil)
	if status != 200 || bytes.Contains(b, []byte("[DONE]")) {
		t.Fatalf("hung backend: %d %s", status, b)
	}
	events := bytes.Split(bytes.TrimSpace(b), []byte("\n\n"))
	last := events[len(events)-1]
	if code, _, _, _ := errorBody(t, bytes.TrimPrefix(last, []byte("data: "))); code != "timeout" {
		t.Errorf("last event = %s, want code timeout", last)
	}
}
