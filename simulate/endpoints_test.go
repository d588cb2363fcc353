package simulate

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// Health and root endpoints, HEAD included, per flavour (docs/simulator.md
// cites each server's source).
func TestHealthAndRootEndpoints(t *testing.T) {
	cases := []struct {
		flavour      Flavour
		method, path string
		status       int
		body, allow  string
	}{
		{VLLM, "GET", "/health", 200, "", ""},
		{VLLM, "HEAD", "/health", 405, "", "GET"}, // FastAPI's @get does not take HEAD
		{VLLM, "POST", "/health", 405, `{"detail":"Method Not Allowed"}`, "GET"},
		{VLLM, "GET", "/health_generate", 404, `{"detail":"Not Found"}`, ""},
		{SGLang, "GET", "/health", 200, "", ""},
		{SGLang, "GET", "/health_generate", 200, "", ""},
		{SGLang, "HEAD", "/health", 405, "", "GET"},
		{LlamaCpp, "GET", "/health", 200, `{"status":"ok"}`, ""},
		{LlamaCpp, "GET", "/v1/health", 200, `{"status":"ok"}`, ""},
		{LlamaCpp, "HEAD", "/health", 200, "", ""}, // cpp-httplib serves HEAD with the GET handler
		{LlamaCpp, "POST", "/health", 404, `{"error":{"message":"File Not Found","type":"not_found_error","code":404}}`, ""},
		{Ollama, "GET", "/", 200, "Ollama is running", ""},
		{Ollama, "HEAD", "/", 200, "", ""},
		{Ollama, "HEAD", "/api/version", 200, "", ""},
		{Ollama, "POST", "/", 405, "405 method not allowed", "HEAD, GET"},
		{Ollama, "GET", "/health", 404, "404 page not found", ""},
	}
	for _, c := range cases {
		_, ts := newTS(t, Config{Flavour: c.flavour})
		req, _ := http.NewRequest(c.method, ts.URL+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || string(b) != c.body || resp.Header.Get("Allow") != c.allow {
			t.Errorf("%s %s %s: %d %q Allow %q; want %d %q Allow %q", c.flavour, c.method, c.path,
				resp.StatusCode, b, resp.Header.Get("Allow"), c.status, c.body, c.allow)
		}
	}
}

// streamUsages posts a streamed chat and returns the usage of each data
// chunk (nil where it has none) and whether the last chunk has no choices.
func streamUsages(t *testing.T, f Flavour, streamOptions string) (usages []map[string]int, choices []int) {
	t.Helper()
	_, ts := newTS(t, Config{Flavour: f, NoReasoning: true})
	body := `{"model":"m","stream":true,"max_tokens":3,"stream_options":` + streamOptions + `,"messages":[{"role":"user","content":"hi"}]}`
	resp, err := post(t, context.Background(), ts.URL, body, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := readAllBody(t, resp)
	for _, line := range strings.Split(b, "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []json.RawMessage `json:"choices"`
			Usage   map[string]any    `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			t.Fatalf("%s: %v: %s", f, err, data)
		}
		var u map[string]int
		if chunk.Usage != nil {
			u = map[string]int{}
			for _, k := range []string{"prompt_tokens", "completion_tokens", "total_tokens"} {
				v, _ := chunk.Usage[k].(float64)
				u[k] = int(v)
			}
		}
		usages = append(usages, u)
		choices = append(choices, len(chunk.Choices))
	}
	return usages, choices
}

// stream_options.continuous_usage_stats: vLLM (with include_usage) puts the
// running usage on every chunk, role chunk included, and still sends the
// final usage chunk; SGLang (without include_usage too) on the chunks with
// content; the other flavours ignore it.
func TestContinuousUsageStats(t *testing.T) {
	usages, choices := streamUsages(t, VLLM, `{"include_usage":true,"continuous_usage_stats":true}`)
	// role, 3 tokens (the last with the finish), the usage chunk
	want := []int{0, 1, 2, 3, 3}
	if len(usages) != len(want) || choices[len(choices)-1] != 0 {
		t.Fatalf("vllm: %d chunks %v (choices %v), want %d", len(usages), usages, choices, len(want))
	}
	for i, u := range usages {
		if u == nil || u["completion_tokens"] != want[i] || u["total_tokens"] != u["prompt_tokens"]+want[i] {
			t.Errorf("vllm chunk %d usage %v, want completion %d", i, u, want[i])
		}
	}
	// Without include_usage vLLM sends no usage at all.
	if usages, _ := streamUsages(t, VLLM, `{"continuous_usage_stats":true}`); usages[0] != nil || usages[len(usages)-1] != nil {
		t.Errorf("vllm without include_usage: %v", usages)
	}

	usages, _ = streamUsages(t, SGLang, `{"continuous_usage_stats":true}`)
	// role (usage null), 3 content chunks, the finish chunk (usage null); no usage chunk
	if len(usages) != 5 || usages[0] != nil || usages[4] != nil {
		t.Fatalf("sglang: %v", usages)
	}
	for i := 1; i <= 3; i++ {
		if u := usages[i]; u == nil || u["completion_tokens"] != i {
			t.Errorf("sglang chunk %d usage %v, want completion %d", i, u, i)
		}
	}

	for _, f := range []Flavour{LlamaCpp, Ollama, OpenAI} {
		usages, _ := streamUsages(t, f, `{"include_usage":true,"continuous_usage_stats":true}`)
		for i, u := range usages[:len(usages)-1] {
			if u != nil {
				t.Errorf("%s chunk %d has usage %v: continuous_usage_stats is not this server's", f, i, u)
			}
		}
	}
}

// llama-server refuses tools without --jinja while parsing the request, and
// answers that exception 500 server_error, as it does a missing mmproj.
func TestLlamaCppCapabilityRefusals(t *testing.T) {
	_, ts := newTS(t, Config{Flavour: LlamaCpp, NoTools: true, NoImages: true})
	for _, c := range []struct{ body, msg string }{
		{`{"model":"m","messages":[{"role":"user","content":"weather?"}],"tools":` + weatherTools + `}`, "tools param requires --jinja flag"},
		{`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`, "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj"},
	} {
		resp, err := post(t, context.Background(), ts.URL, c.body, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := readAllBody(t, resp)
		want := `{"error":{"code":500,"message":"` + c.msg + `","type":"server_error"}}`
		if resp.StatusCode != 500 || b != want {
			t.Errorf("%d %s, want 500 %s", resp.StatusCode, b, want)
		}
	}
}
