package simulate

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"
)

const waitLimit = 5 * time.Second

func post(t *testing.T, ctx context.Context, url, body string, header map[string]string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	return http.DefaultClient.Do(req)
}

func chatBody(stream bool, extra string) string {
	s := `{"model":"m","messages":[{"role":"user","content":"Say hello.` + extra + `"}]`
	if stream {
		s += `,"stream":true,"stream_options":{"include_usage":true}`
	}
	return s + "}"
}

func newTS(t *testing.T, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	if cfg.Flavour == "" {
		cfg.Flavour = VLLM
	}
	if cfg.Models == nil {
		cfg.Models = []string{"m"}
	}
	s := New(cfg)
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, ts
}

func readAllBody(t *testing.T, resp *http.Response) (string, error) {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestFaultRefusePerRequest(t *testing.T) {
	s, ts := newTS(t, Config{})
	_, err := post(t, context.Background(), ts.URL, chatBody(false, ""), map[string]string{"X-Sim-Fault": "refuse"})
	if err == nil {
		t.Fatal("want a connection error, got an answer")
	}
	if st := s.Stats(); st.Requests != 1 {
		t.Errorf("stats %+v, want 1 request", st)
	}
}

func TestRefuseConnections(t *testing.T) {
	run, err := Start(Config{Flavour: Ollama, Models: []string{"m"}})
	if err != nil {
		t.Fatal(err)
	}
	defer run.Close()
	if resp, err := post(t, context.Background(), run.URL(), chatBody(false, ""), nil); err != nil {
		t.Fatal(err)
	} else {
		readAllBody(t, resp)
	}
	if err := run.RefuseConnections(true); err != nil {
		t.Fatal(err)
	}
	// The pooled connection was closed by the server: a reuse would give EOF.
	http.DefaultClient.CloseIdleConnections()
	_, err = post(t, context.Background(), run.URL(), chatBody(false, ""), nil)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("while refusing: err %v, want ECONNREFUSED", err)
	}
	if err := run.RefuseConnections(false); err != nil {
		t.Fatal(err)
	}
	resp, err := post(t, context.Background(), run.URL(), chatBody(false, ""), nil)
	if err != nil {
		t.Fatalf("after reopening: %v", err)
	}
	readAllBody(t, resp)
	if resp.StatusCode != 200 {
		t.Errorf("after reopening: status %d", resp.StatusCode)
	}
	if got := run.Stats().Requests; got != 2 {
		t.Errorf("requests %d, want 2 (the refused one never arrived)", got)
	}
}

func TestFaultStatus(t *testing.T) {
	for _, c := range []struct {
		fault  string
		status int
	}{{"500", 500}, {"503", 503}, {"context_length", 400}} {
		for _, f := range Flavours() {
			_, ts := newTS(t, Config{Flavour: f})
			resp, err := post(t, context.Background(), ts.URL, chatBody(true, " [sim fault="+c.fault+"]"), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := readAllBody(t, resp)
			if resp.StatusCode != c.status {
				t.Errorf("%s fault=%s: status %d, want %d", f, c.fault, resp.StatusCode, c.status)
			}
			if !json.Valid([]byte(body)) || !strings.Contains(body, "error") {
				t.Errorf("%s fault=%s: body %q is not a JSON error", f, c.fault, body)
			}
			if c.status == 503 && resp.Header.Get("Retry-After") == "" {
				t.Errorf("%s: 503 without Retry-After", f)
			}
		}
	}
}

func TestFaultHangCountsCancel(t *testing.T) {
	s, ts := newTS(t, Config{Behaviour: Behaviour{Fault: FaultHang}})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := post(t, ctx, ts.URL, chatBody(false, ""), nil)
		errc <- err
	}()
	if err := s.WaitStats(waitLimit, func(st Stats) bool { return st.InFlight == 1 }); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("hung request returned an answer")
	}
	if err := s.WaitIdle(waitLimit); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Cancelled != 1 || st.Completed != 0 {
		t.Errorf("stats %+v, want 1 cancelled", st)
	}
}

// readEvents reads SSE data lines until n content deltas were seen.
func readUntilContent(t *testing.T, r *bufio.Reader, n int) string {
	t.Helper()
	var seen strings.Builder
	count := 0
	for count < n {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("after %q: %v", seen.String(), err)
		}
		seen.WriteString(line)
		if strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`) {
			count++
		}
	}
	return seen.String()
}

func TestFaultStallAndClientCancel(t *testing.T) {
	s, ts := newTS(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := post(t, ctx, ts.URL, chatBody(true, ""), map[string]string{"X-Sim": "fault=stall after=3"})
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(resp.Body)
	seen := readUntilContent(t, r, 3)
	if err := s.WaitStats(waitLimit, func(st Stats) bool { return st.OpenStreams == 1 }); err != nil {
		t.Fatal(err)
	}
	cancel()
	rest, _ := io.ReadAll(r)
	resp.Body.Close()
	all := seen + string(rest)
	if strings.Contains(all, "[DONE]") || strings.Contains(all, `"finish_reason":"stop"`) {
		t.Errorf("stalled stream finished:\n%s", all)
	}
	if err := s.WaitIdle(waitLimit); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Cancelled != 1 || st.OpenStreams != 0 {
		t.Errorf("stats %+v, want 1 cancelled stream and none open", st)
	}
}

func TestFaultCut(t *testing.T) {
	for _, f := range Flavours() {
		s, ts := newTS(t, Config{Flavour: f})
		resp, err := post(t, context.Background(), ts.URL, chatBody(true, " [sim fault=cut after=2]"), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, err := readAllBody(t, resp)
		if err == nil {
			t.Errorf("%s: cut stream read without error:\n%s", f, body)
		}
		if strings.Contains(body, "[DONE]") || !strings.Contains(body, "data: ") {
			t.Errorf("%s: want some chunks and no [DONE], got:\n%s", f, body)
		}
		if err := s.WaitIdle(waitLimit); err != nil {
			t.Fatal(err)
		}
	}
}

func TestFaultMalformed(t *testing.T) {
	_, ts := newTS(t, Config{Flavour: OpenAI})
	resp, err := post(t, context.Background(), ts.URL, chatBody(false, ""), map[string]string{"X-Sim-Fault": "malformed"})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := readAllBody(t, resp)
	if resp.StatusCode != 200 || json.Valid([]byte(body)) {
		t.Errorf("non-streamed: status %d, valid JSON %v: %q", resp.StatusCode, json.Valid([]byte(body)), body)
	}
	resp, err = post(t, context.Background(), ts.URL, chatBody(true, ""), map[string]string{"X-Sim-Fault": "malformed"})
	if err != nil {
		t.Fatal(err)
	}
	body, _ = readAllBody(t, resp)
	bad := 0
	for _, line := range strings.Split(body, "\n") {
		if d, ok := strings.CutPrefix(line, "data: "); ok && d != "[DONE]" && !json.Valid([]byte(d)) {
			bad++
		}
	}
	if bad != 1 {
		t.Errorf("streamed: %d malformed events, want 1:\n%s", bad, body)
	}
}

func TestFaultNoUsage(t *testing.T) {
	for _, f := range Flavours() {
		_, ts := newTS(t, Config{Flavour: f, Behaviour: Behaviour{Fault: FaultNoUsage}})
		for _, stream := range []bool{false, true} {
			resp, err := post(t, context.Background(), ts.URL, chatBody(stream, ""), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := readAllBody(t, resp)
			if strings.Contains(body, `"prompt_tokens"`) {
				t.Errorf("%s stream=%v: usage present:\n%s", f, stream, body)
			}
			if !strings.Contains(body, `"finish_reason":"stop"`) {
				t.Errorf("%s stream=%v: answer incomplete:\n%s", f, stream, body)
			}
		}
	}
}

func TestFaultStreamError(t *testing.T) {
	wantDone := map[Flavour]bool{VLLM: true, SGLang: true}
	for _, f := range Flavours() {
		_, ts := newTS(t, Config{Flavour: f})
		resp, err := post(t, context.Background(), ts.URL, chatBody(true, ""), map[string]string{"X-Sim": "fault=stream_error after=1"})
		if err != nil {
			t.Fatal(err)
		}
		body, err := readAllBody(t, resp)
		if err != nil {
			t.Fatal(err)
		}
		// vLLM and SGLang write the event with json.dumps: `"error": {`.
		if resp.StatusCode != 200 || !(strings.Contains(body, `"error":{`) || strings.Contains(body, `"error": {`)) {
			t.Errorf("%s: status %d, body without error event:\n%s", f, resp.StatusCode, body)
		}
		if got := strings.Contains(body, "[DONE]"); got != wantDone[f] {
			t.Errorf("%s: [DONE] present %v, want %v", f, got, wantDone[f])
		}
		if f == OpenRouter && (!strings.Contains(body, `"finish_reason":"error"`) || !strings.Contains(body, `"cost":`)) {
			t.Errorf("openrouter: error chunk lacks finish_reason error or usage.cost:\n%s", body)
		}
	}
}

// TestUsageAndSwitches: counts add up, usage appears only where each server
// sends it, and the switches change the answer.
func TestUsageAndSwitches(t *testing.T) {
	for _, f := range Flavours() {
		_, ts := newTS(t, Config{Flavour: f})
		resp, err := post(t, context.Background(), ts.URL, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := readAllBody(t, resp)
		if got, want := strings.Contains(body, `"prompt_tokens"`), f == OpenRouter; got != want {
			t.Errorf("%s: usage without include_usage: %v, want %v", f, got, want)
		}

		resp, err = post(t, context.Background(), ts.URL, chatBody(false, " [sim tokens=5 reasoning=3 cached=4]"), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ = readAllBody(t, resp)
		var out struct {
			Usage struct {
				Prompt     int `json:"prompt_tokens"`
				Completion int `json:"completion_tokens"`
				Total      int `json:"total_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(body), &out); err != nil {
			t.Fatalf("%s: %v: %s", f, err, body)
		}
		if out.Usage.Completion != 8 || out.Usage.Total != out.Usage.Prompt+out.Usage.Completion {
			t.Errorf("%s: usage %+v, want completion 8 (5 content + 3 reasoning) and total = prompt + completion", f, out.Usage)
		}
	}
}

func TestCapabilitiesOff(t *testing.T) {
	img := `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what is this"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`
	tools := `{"model":"m","messages":[{"role":"user","content":"weather?"}],"tools":` + weatherTools + `}`
	for _, f := range Flavours() {
		_, ts := newTS(t, Config{Flavour: f, NoImages: true, NoTools: true})
		for _, body := range []string{img, tools} {
			resp, err := post(t, context.Background(), ts.URL, body, nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := readAllBody(t, resp)
			if resp.StatusCode < 400 {
				t.Errorf("%s: capability off but status %d: %s", f, resp.StatusCode, b)
			}
		}
		_, ts2 := newTS(t, Config{Flavour: f})
		resp, err := post(t, context.Background(), ts2.URL, img, nil)
		if err != nil {
			t.Fatal(err)
		}
		readAllBody(t, resp)
		if resp.StatusCode != 200 {
			t.Errorf("%s: image with capability on: status %d", f, resp.StatusCode)
		}
	}
}

func TestRecording(t *testing.T) {
	s, ts := newTS(t, Config{})
	body := chatBody(false, "")
	resp, err := post(t, context.Background(), ts.URL, body, map[string]string{"Authorization": "Bearer upstream-key"})
	if err != nil {
		t.Fatal(err)
	}
	readAllBody(t, resp)
	rec, ok := s.LastRequest()
	if !ok || rec.Method != "POST" || rec.Path != "/v1/chat/completions" || string(rec.Body) != body || rec.Header.Get("Authorization") != "Bearer upstream-key" {
		t.Errorf("recorded %+v", rec)
	}
	http.Get(ts.URL + "/v1/models")
	if n := len(s.Requests()); n != 1 {
		t.Errorf("%d chat requests recorded, want 1", n)
	}
	if n := len(s.AllRequests()); n != 2 {
		t.Errorf("%d requests recorded in all, want 2", n)
	}
	s.Reset()
	if n := len(s.Requests()); n != 0 || s.Stats().Requests != 0 {
		t.Errorf("after Reset: %d recorded, stats %+v", n, s.Stats())
	}
}

// llama.cpp asked not to extract the reasoning (reasoning_format "none", or
// enable_thinking false in chat_template_kwargs) leaves it in content inside
// <think> tags (real-servers llamacpp/thinking/55 and 58).
func TestLlamaCppReasoningLeftInContent(t *testing.T) {
	_, ts := newTS(t, Config{Flavour: LlamaCpp, Behaviour: Behaviour{AlwaysReason: true, ReasoningTokens: 2, OutputTokens: 3}})
	for _, extra := range []string{`"reasoning_format":"none"`, `"chat_template_kwargs":{"enable_thinking":false}`} {
		resp, err := post(t, context.Background(), ts.URL, `{"model":"m","messages":[{"role":"user","content":"hi"}],`+extra+`}`, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := readAllBody(t, resp)
		var out struct {
			Choices []struct {
				Message map[string]any `json:"message"`
			} `json:"choices"`
			Usage struct {
				Completion int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(body), &out); err != nil || len(out.Choices) != 1 {
			t.Fatalf("%s: %v: %s", extra, err, body)
		}
		msg := out.Choices[0].Message
		content, _ := msg["content"].(string)
		if _, ok := msg["reasoning_content"]; ok || !strings.HasPrefix(content, "<think>") || !strings.Contains(content, "</think>") ||
			strings.HasSuffix(content, "</think>") || out.Usage.Completion != 5 {
			t.Errorf("%s: message %v, completion %d; want <think>reasoning</think>text in content, 5 tokens", extra, msg, out.Usage.Completion)
		}
	}
}

// echo=1 answers with the user's text, marker taken out, byte for byte
// (HTML and quotes included), streamed or not, one token per 1 to 3 bytes;
// max_tokens cuts it like any answer.
func TestEcho(t *testing.T) {
	payload := `<img src=x onerror="alert(1)"> **bold** <script>alert('é')</script>`
	msg, _ := json.Marshal(payload + " [sim echo=1]")
	for _, f := range Flavours() {
		_, ts := newTS(t, Config{Flavour: f})
		resp, err := post(t, context.Background(), ts.URL, `{"model":"m","messages":[{"role":"user","content":`+string(msg)+`}]}`, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := readAllBody(t, resp)
		var out struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
				Finish string `json:"finish_reason"`
			} `json:"choices"`
			Usage struct {
				Completion int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(body), &out); err != nil || len(out.Choices) == 0 {
			t.Fatalf("%s: %v: %s", f, err, body)
		}
		if got := out.Choices[0].Message.Content; got != payload {
			t.Errorf("%s: echo = %q, want %q", f, got, payload)
		}
		if n := out.Usage.Completion; n != len(fragments(payload)) {
			t.Errorf("%s: %d completion tokens, want %d (one per fragment)", f, n, len(fragments(payload)))
		}
		resp, err = post(t, context.Background(), ts.URL, `{"model":"m","max_tokens":3,"messages":[{"role":"user","content":`+string(msg)+`}]}`, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ = readAllBody(t, resp)
		out.Choices = nil
		if err := json.Unmarshal([]byte(body), &out); err != nil || len(out.Choices) == 0 {
			t.Fatalf("%s: %v: %s", f, err, body)
		}
		if got := out.Choices[0].Message.Content; got != strings.Join(fragments(payload)[:3], "") || out.Choices[0].Finish != "length" {
			t.Errorf("%s: echo cut at 3 tokens = %q (%s)", f, got, out.Choices[0].Finish)
		}
	}
}
