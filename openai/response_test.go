package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate/tollgate"
)

var testCost = tollgate.MustParseAmount("0.000042")

func finishResponse(t *testing.T, fl Flavour, body []byte) ([]byte, *Response) {
	t.Helper()
	r, err := NormalizeResponse(body, testID, testModel, fl)
	if err != nil {
		t.Fatalf("NormalizeResponse: %v", err)
	}
	return r.AppendJSON(nil, r.FinalUsage(testPrompt), &testCost), r
}

func TestResponseGolden(t *testing.T) {
	n := 0
	for _, fl := range []Flavour{LlamaCpp, Ollama} {
		files, _ := filepath.Glob(filepath.Join("testdata/captures", string(fl), "*.http"))
		for _, f := range files {
			c := readCapture(t, f)
			if c.status != 200 || !strings.HasPrefix(c.contentType, "application/json") && c.contentType != "" {
				continue
			}
			if bytes.HasPrefix(c.body, []byte("data:")) {
				continue
			}
			n++
			name := string(fl) + "/" + strings.TrimSuffix(filepath.Base(f), ".http")
			t.Run(name, func(t *testing.T) {
				out, _ := finishResponse(t, fl, c.body)
				golden := filepath.Join("testdata/golden", name+".json")
				if *update {
					if err := os.WriteFile(golden, append(out, '\n'), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				want, err := os.ReadFile(golden)
				if err != nil {
					t.Fatalf("%v (run with -update)", err)
				}
				if !bytes.Equal(append(out, '\n'), want) {
					t.Errorf("differs from %s\n got: %s\nwant: %s", golden, out, want)
				}
				checkResponseShape(t, out)
			})
		}
	}
	if n < 20 {
		t.Fatalf("only %d non-streamed captures", n)
	}
}

func checkResponseShape(t *testing.T, out []byte) {
	t.Helper()
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(out, &obj); err != nil {
		t.Fatalf("invalid JSON: %v: %s", err, out)
	}
	if string(obj["id"]) != `"`+testID+`"` || string(obj["model"]) != `"`+testModel+`"` || string(obj["object"]) != `"chat.completion"` {
		t.Errorf("id/model/object: %s", out)
	}
	for _, k := range []string{"created", "choices", "usage"} {
		if _, ok := obj[k]; !ok {
			t.Errorf("no %s: %s", k, out)
		}
	}
	for _, k := range []string{"system_fingerprint", "timings", "error", "provider"} {
		if _, ok := obj[k]; ok {
			t.Errorf("%s kept: %s", k, out)
		}
	}
	if bytes.Contains(out, []byte("reasoning_content")) {
		t.Errorf("reasoning_content kept: %s", out)
	}
	var u struct {
		Usage struct {
			Cost string `json:"cost"`
		} `json:"usage"`
	}
	_ = json.Unmarshal(out, &u)
	if u.Usage.Cost != "0.000042" {
		t.Errorf("cost: %s", out)
	}
}

func TestResponseLlamaCpp(t *testing.T) {
	out, r := finishResponse(t, LlamaCpp, readCapture(t, "testdata/captures/llamacpp/53_think_tools.http").body)
	u, ok := r.Usage()
	if !ok || u.PromptTokens != 208 || u.CompletionTokens != 57 || *u.CachedTokens != 207 {
		t.Fatalf("usage %+v", u)
	}
	var resp struct {
		Choices []struct {
			Message struct {
				Role      string  `json:"role"`
				Content   *string `json:"content"`
				Reasoning string  `json:"reasoning"`
				ToolCalls []struct {
					ID       string `json:"id"`
					Type     string `json:"type"`
					Function struct{ Name, Arguments string }
				} `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Created int64 `json:"created"`
	}
	if err := json.Unmarshal(out, &resp); err != nil {
		t.Fatal(err)
	}
	m := resp.Choices[0].Message
	if m.Role != "assistant" || m.Reasoning != " Hmm" || len(m.ToolCalls) != 1 || m.ToolCalls[0].Type != "function" ||
		m.ToolCalls[0].Function.Arguments != `{ "city": "Oslo", "unit":"f"}` || resp.Choices[0].FinishReason != "tool_calls" || resp.Created != 1795405808 {
		t.Fatalf("%s", out)
	}
	if bytes.Contains(out, []byte(`"index":0,"id"`)) {
		t.Fatalf("index added to a message's tool call: %s", out)
	}
	// reasoning " Hmm" (4) + name get_weather (11) + arguments (29)
	if r.DeliveredBytes() != 4+11+29 {
		t.Fatalf("delivered %d", r.DeliveredBytes())
	}
}

func TestResponseNumbersByteForByte(t *testing.T) {
	for _, p := range []string{"testdata/captures/llamacpp/32_logprobs.http", "testdata/captures/ollama/32_logprobs.http"} {
		c := readCapture(t, p)
		out, _ := finishResponse(t, Flavour(filepath.Base(filepath.Dir(p))), c.body)
		for _, lit := range []string{"-22.623794555664063", "-22.623794555664062", "-84.83924102783203", `"logprob":0.0`, `"logprob":0,`} {
			if bytes.Contains(c.body, []byte(lit)) != bytes.Contains(out, []byte(lit)) {
				t.Errorf("%s: literal %s not kept byte for byte", p, lit)
			}
		}
	}
}

func TestResponseOllamaNoCachedTokens(t *testing.T) {
	out, r := finishResponse(t, Ollama, readCapture(t, "testdata/captures/ollama/50_think_chat.http").body)
	u, _ := r.Usage()
	if u.CachedTokens != nil || u.ReasoningTokens != nil || u.TotalTokens != 30 {
		t.Fatalf("usage %+v", u)
	}
	if bytes.Contains(out, []byte("prompt_tokens_details")) || !bytes.Contains(out, []byte(`"reasoning":" Hmm"`)) {
		t.Fatalf("%s", out)
	}
}

func TestResponseNoUsageEstimated(t *testing.T) {
	body := []byte(`{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"12345678"},"finish_reason":"stop"}]}`)
	r, err := NormalizeResponse(body, testID, testModel, VLLM)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Usage(); ok {
		t.Fatal("usage?")
	}
	u := r.FinalUsage(7)
	if !u.Estimated || u.CompletionTokens != 2 || u.TotalTokens != 9 {
		t.Fatalf("%+v", u)
	}
}

func TestResponseVLLMAndSGLangShapes(t *testing.T) {
	body := []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1795400000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"message":{"role":"assistant","reasoning_content":"think","content":"hi","tool_calls":[]},"logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":{"prompt_tokens":5,"total_tokens":9,"completion_tokens":4,"prompt_tokens_details":null},"prompt_logprobs":null,"kv_transfer_params":null,"service_tier":null}`)
	out, r := finishResponse(t, VLLM, body)
	want := `{"id":"` + testID + `","object":"chat.completion","created":1795400000,"model":"tg-chat","choices":[{"index":0,"message":{"role":"assistant","reasoning":"think","content":"hi","tool_calls":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":4,"total_tokens":9,"cost":"0.000042"},"service_tier":null}`
	if string(out) != want {
		t.Fatalf("\n got %s\nwant %s", out, want)
	}
	if r.DeliveredBytes() != 7 {
		t.Fatalf("delivered %d", r.DeliveredBytes())
	}
	body = []byte(`{"id":"a","object":"chat.completion","created":1795400100,"model":"deepseek-r1","choices":[{"index":0,"message":{"role":"assistant","content":"ok","reasoning_content":"r","tool_calls":null},"logprobs":null,"finish_reason":"stop","matched_stop":1}],"usage":{"prompt_tokens":3,"total_tokens":99,"completion_tokens":5,"reasoning_tokens":2}}`)
	out, _ = finishResponse(t, SGLang, body)
	if !bytes.Contains(out, []byte(`"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8,"completion_tokens_details":{"reasoning_tokens":2},"cost":"0.000042"}`)) ||
		bytes.Contains(out, []byte("matched_stop")) {
		t.Fatalf("%s", out)
	}
}

func TestResponseFailures(t *testing.T) {
	for _, tc := range []struct {
		body string
		code tollgate.Code
	}{
		{``, tollgate.CodeUpstreamError},
		{`<html>502 Bad Gateway</html>`, tollgate.CodeUpstreamError},
		{`{"id":"x","choices":[]}`, tollgate.CodeUpstreamError},
		{`{"id":"x"}`, tollgate.CodeUpstreamError},
		{`{"id":"x","choices":[{"index":0,"message":{"content":"a"}}]`, tollgate.CodeUpstreamError},
		{`{"choices":[{"index":0,"message":{"content":"a"}}]} trailing`, tollgate.CodeUpstreamError},
		{`data: {"choices":[]}`, tollgate.CodeUpstreamError},
		{`{"error":{"code":502,"message":"Provider returned error","metadata":{"provider_name":"X"}}}`, tollgate.CodeUpstreamError},
		{`{"object":"error","message":"The input (5000 tokens) is longer than the model's context length (4096 tokens).","type":"BadRequestError","param":null,"code":400}`, tollgate.CodeContextLengthExceeded},
		{`{"id":"x","choices":[{"index":0,"message":{"content":""},"finish_reason":"error"}]}`, tollgate.CodeUpstreamError},
	} {
		r, err := NormalizeResponse([]byte(tc.body), testID, testModel, OpenRouter)
		var te *tollgate.Error
		if r != nil || !errors.As(err, &te) || te.Code != tc.code {
			t.Errorf("NormalizeResponse(%s) = %v, %v; want code %s", tc.body, r, err, tc.code)
		}
	}
}

func FuzzNormalizeResponse(f *testing.F) {
	caps, _ := filepath.Glob("testdata/captures/*/*.http")
	for _, p := range caps {
		f.Add(readCapture(f, p).body)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := NormalizeResponse(body, testID, testModel, OpenRouter)
		if err != nil {
			var te *tollgate.Error
			if !errors.As(err, &te) || r != nil {
				t.Fatalf("%v %v", r, err)
			}
			return
		}
		out := r.AppendJSON(nil, r.FinalUsage(3), &testCost)
		if !json.Valid(out) {
			t.Fatalf("invalid JSON out of %q:\n%s", body, out)
		}
		var obj map[string]json.RawMessage
		_ = json.Unmarshal(out, &obj)
		if _, ok := obj["error"]; ok {
			t.Fatalf("error key in a response: %s", out)
		}
	})
}

func FuzzClassifyUpstreamError(f *testing.F) {
	caps, _ := filepath.Glob("testdata/captures/*/*.http")
	for _, p := range caps {
		c := readCapture(f, p)
		f.Add(c.status, c.body)
	}
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		e := ClassifyUpstreamError(Ollama, status, body)
		if e == nil || e.Message == "" {
			t.Fatal("empty error")
		}
		switch e.Code {
		case tollgate.CodeUpstreamError, tollgate.CodeInvalidRequest, tollgate.CodeContextLengthExceeded:
		default:
			t.Fatalf("code %s", e.Code)
		}
		if !json.Valid(ErrorEvent(e)) {
			t.Fatalf("invalid error event %s", ErrorEvent(e))
		}
	})
}

func BenchmarkNormalizeResponse(b *testing.B) {
	for _, p := range []string{"llamacpp/04_chat", "llamacpp/53_think_tools", "ollama/32_logprobs"} {
		b.Run(p, func(b *testing.B) {
			body := readCapture(b, "testdata/captures/"+p+".http").body
			cost := tollgate.MustParseAmount("0.000042")
			var out []byte
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				r, err := NormalizeResponse(body, testID, testModel, LlamaCpp)
				if err != nil {
					b.Fatal(err)
				}
				out = r.AppendJSON(out[:0], r.FinalUsage(10), &cost)
			}
		})
	}
}

// llama.cpp's usage for two choices counts the first only (the capture: two
// "Hello world!" answers, 4 completion tokens): the second is counted at the
// first one's tokens per byte, and the usage is marked estimated.
func TestResponseLlamaCppSeveralChoices(t *testing.T) {
	body := readCapture(t, "testdata/captures/llamacpp/25_n2.http").body
	_, r := finishResponse(t, LlamaCpp, body)
	if u, ok := r.Usage(); !ok || u.CompletionTokens != 8 || u.TotalTokens != 31 || !u.Estimated {
		t.Fatalf("llama.cpp usage = %+v, ok %v; want 8 completion tokens, estimated", u, ok)
	}
	_, r = finishResponse(t, VLLM, body)
	if u, _ := r.Usage(); u.CompletionTokens != 4 || u.Estimated {
		t.Fatalf("vLLM usage of the same body = %+v; want the reported 4", u)
	}
}

// A message that only calls tools has content null, as from the reference API
// (llama.cpp and Ollama send ""); an empty text answer keeps its "".
func TestResponseToolOnlyContentIsNull(t *testing.T) {
	calls := `{"choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]}}],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}`
	empty := `{"choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":""}}],"usage":{"prompt_tokens":5,"completion_tokens":0,"total_tokens":5}}`
	for _, c := range []struct{ body, want string }{
		{calls, `"message":{"role":"assistant","content":null,"tool_calls":`},
		{empty, `"message":{"role":"assistant","content":""}`},
	} {
		out, _ := finishResponse(t, Ollama, []byte(c.body))
		if !strings.Contains(string(out), c.want) {
			t.Errorf("got %s\nwant it to contain %s", out, c.want)
		}
	}
}
