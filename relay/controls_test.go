package relay

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/openai"
	"github.com/tollgate/tollgate/simulate"
)

const weatherTools = `"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`

// controlsRelay serves model "mixed" (one backend: an Ollama node and a vLLM
// node) and model "oll" (Ollama only), all simulated.
func controlsRelay(t *testing.T) (r *Relay, oll, vllm *simulate.Server) {
	t.Helper()
	oll = simulate.New(simulate.Config{Flavour: simulate.Ollama, Models: []string{"up"}})
	vllm = simulate.New(simulate.Config{Flavour: simulate.VLLM, Models: []string{"up"}})
	os, vs := httptest.NewServer(oll), httptest.NewServer(vllm)
	t.Cleanup(os.Close)
	t.Cleanup(vs.Close)
	tools := tollgate.NewCapabilities(tollgate.CapTools)
	o := NodeSpec{Name: "o", URL: os.URL + "/v1", Flavour: openai.Ollama}
	v := NodeSpec{Name: "v", URL: vs.URL + "/v1", Flavour: openai.VLLM}
	cat := catalog(netModel("mixed", "up", 4000, 100, tools, o, v), netModel("oll", "up", 4000, 100, tools, o))
	return New(NewCatalog(cat, nil), Options{}, Deps{}), oll, vllm
}

// serve runs one request; it returns the body or the error.
func serve(t *testing.T, r *Relay, body string) (string, *tollgate.Error) {
	t.Helper()
	w := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	if err := r.ServeChat(w, req, &Call{RequestID: "r", Body: []byte(body)}); err != nil {
		var te *tollgate.Error
		if !errors.As(err, &te) {
			t.Fatalf("error %v is not a tollgate.Error", err)
		}
		return "", te
	}
	return w.Body.String(), nil
}

// tool_choice "required" and n > 1 go only to the node whose server enforces
// them; on a model with no such node they are refused with a clear code.
func TestControlsRouteToANodeThatHonoursThem(t *testing.T) {
	r, oll, vllm := controlsRelay(t)
	for _, extra := range []string{
		weatherTools + `,"tool_choice":"required"`,
		weatherTools + `,"tool_choice":{"type":"function","function":{"name":"get_weather"}}`,
		`"n":2`,
	} {
		before := oll.Stats().Requests
		for i := 0; i < 6; i++ {
			out, te := serve(t, r, `{"model":"mixed","messages":[{"role":"user","content":"Weather in Paris?"}],`+extra+`}`)
			if te != nil {
				t.Fatalf("%s: %v", extra, te)
			}
			if extra == `"n":2` && !strings.Contains(out, `"index":1`) {
				t.Fatalf("n: 2 answered with one choice: %s", out)
			}
		}
		if got := oll.Stats().Requests - before; got != 0 {
			t.Errorf("%s: the Ollama node (which ignores it) got %d requests", extra, got)
		}
	}
	if vllm.Stats().Requests != 18 {
		t.Fatalf("vLLM node got %d requests, want 18", vllm.Stats().Requests)
	}
	// Without such a control both nodes serve.
	for i := 0; i < 4; i++ {
		if _, te := serve(t, r, `{"model":"mixed","messages":[{"role":"user","content":"hi"}],`+weatherTools+`}`); te != nil {
			t.Fatal(te)
		}
	}
	if oll.Stats().Requests == 0 {
		t.Fatal("tool_choice auto never reached the Ollama node")
	}

}

// On a model whose only server ignores them (Ollama), n and the tool
// choices are served by tollgate: n calls merged into n choices, and the
// answer constrained to a tool call by structured output; never refused.
func TestControlsEmulatedWhereNoServerHonoursThem(t *testing.T) {
	r, oll, _ := controlsRelay(t)
	for _, stream := range []bool{false, true} {
		before := oll.Stats().Requests
		w := serveRecorded(t, r, fmt.Sprintf(`{"model":"oll","stream":%v,"messages":[{"role":"user","content":"hi"}],"n":3}`, stream))
		if w.Header().Get("X-Tollgate-Emulated") != "n" {
			t.Errorf("X-Tollgate-Emulated = %q", w.Header().Get("X-Tollgate-Emulated"))
		}
		if got := oll.Stats().Requests - before; got != 3 {
			t.Errorf("stream %v: %d upstream calls for n: 3", stream, got)
		}
		last, _ := oll.LastRequest()
		// n calls of one choice each; a stream for n choices is n streams.
		if strings.Contains(string(last.Body), `"n"`) || strings.Contains(string(last.Body), `"stream":true`) != stream {
			t.Errorf("stream %v: upstream body %s", stream, last.Body)
		}
		for i := 0; i < 3; i++ {
			if !strings.Contains(w.Body.String(), fmt.Sprintf(`"index":%d`, i)) {
				t.Errorf("stream %v: no choice %d: %s", stream, i, w.Body)
			}
		}
		if strings.Contains(w.Body.String(), `"index":3`) {
			t.Errorf("stream %v: more than 3 choices: %s", stream, w.Body)
		}
	}
	for _, extra := range []string{
		weatherTools + `,"tool_choice":"required"`,
		weatherTools + `,"tool_choice":{"type":"function","function":{"name":"get_weather"}}`,
	} {
		w := serveRecorded(t, r, `{"model":"oll","messages":[{"role":"user","content":"hi"}],`+extra+`}`)
		if w.Header().Get("X-Tollgate-Emulated") != "tool_choice" {
			t.Errorf("X-Tollgate-Emulated = %q", w.Header().Get("X-Tollgate-Emulated"))
		}
		var resp struct {
			Choices []struct {
				FinishReason string `json:"finish_reason"`
				Message      struct {
					ToolCalls []struct {
						ID, Type string
						Function struct{ Name, Arguments string }
					} `json:"tool_calls"`
				}
			}
		}
		if err := json.Unmarshal(w.Body.Bytes(), &resp); err != nil || len(resp.Choices) != 1 {
			t.Fatalf("%s: %v %s", extra, err, w.Body)
		}
		c := resp.Choices[0]
		if c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) != 1 || c.Message.ToolCalls[0].Function.Name != "get_weather" ||
			!json.Valid([]byte(c.Message.ToolCalls[0].Function.Arguments)) || c.Message.ToolCalls[0].Type != "function" {
			t.Fatalf("%s: not a tool call: %s", extra, w.Body)
		}
		last, _ := oll.LastRequest()
		if !strings.Contains(string(last.Body), `"response_format":{"type":"json_schema"`) || strings.Contains(string(last.Body), `"tools"`) {
			t.Errorf("upstream body does not constrain the answer: %s", last.Body)
		}
	}
}

// serveRecorded runs one request that must succeed and returns its recorder.
func serveRecorded(t *testing.T, r *Relay, body string) *httptest.ResponseRecorder {
	t.Helper()
	w := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	if err := r.ServeChat(w, req, &Call{RequestID: "r", Body: []byte(body)}); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	return w
}

// tool_choice "none" on a server that ignores it: the tools are not offered
// upstream, so no tool call comes back (the simulated Ollama, like the real
// one, calls a tool when offered one whatever tool_choice says).
func TestToolChoiceNoneOnAServerThatIgnoresIt(t *testing.T) {
	r, oll, _ := controlsRelay(t)
	out, te := serve(t, r, `{"model":"oll","messages":[{"role":"user","content":"Weather in Paris?"}],`+weatherTools+`,"tool_choice":"none","parallel_tool_calls":false}`)
	if te != nil {
		t.Fatal(te)
	}
	if strings.Contains(out, `"tool_calls":[`) || strings.Contains(out, `"finish_reason":"tool_calls"`) {
		t.Fatalf("tool_choice none answered with a tool call: %s", out)
	}
	last, _ := oll.LastRequest()
	for _, k := range []string{`"tools"`, `"tool_choice"`, `"parallel_tool_calls"`} {
		if strings.Contains(string(last.Body), k) {
			t.Errorf("upstream body still has %s: %s", k, last.Body)
		}
	}
	// The same request with tool_choice auto does call the tool (the fault
	// the rule is there for).
	out, te = serve(t, r, `{"model":"oll","messages":[{"role":"user","content":"Weather in Paris?"}],`+weatherTools+`}`)
	if te != nil || !strings.Contains(out, `"finish_reason":"tool_calls"`) {
		t.Fatalf("auto on the simulated Ollama: %v %s (want a tool call)", te, out)
	}
}

// The hold of an emulated request covers what its calls charge: each of the
// n calls reads the prompt, and an enforced tool choice adds its schema.
func TestEmulatedHoldCoversTheCharge(t *testing.T) {
	r0, _, _ := controlsRelay(t)
	fb := &fakeBiller{}
	r := New(r0.Catalog(), Options{}, Deps{Biller: fb})
	long := strings.Repeat("words ", 400)
	for _, extra := range []string{`"n":8,"max_tokens":1`, weatherTools + `,"tool_choice":"required"`, weatherTools + `,"tool_choice":"required","n":4`} {
		fb.charges = nil
		serveRecorded(t, r, `{"model":"oll","messages":[{"role":"user","content":"`+long+`"}],`+extra+`}`)
		if len(fb.charges) != 1 {
			t.Fatalf("%s: %d charges", extra, len(fb.charges))
		}
		if c := fb.charges[0]; c.Cost > fb.held || c.Cost <= 0 {
			t.Errorf("%s: charged %s (%d prompt tokens) against a hold of %s", extra, c.Cost, c.PromptTokens, fb.held)
		}
	}
}

// A stream for n choices whose backend fails mid-stream ends with the
// error event, and what was delivered is charged; one that fails before
// anything was sent is a plain HTTP error, with nothing charged.
func TestStreamForNChoicesFails(t *testing.T) {
	r0, _, _ := controlsRelay(t)
	fb := &fakeBiller{}
	r := New(r0.Catalog(), Options{}, Deps{Biller: fb})
	w := serveRecorded(t, r, `{"model":"oll","stream":true,"n":2,"messages":[{"role":"user","content":"hi [sim fault=cut after=3]"}]}`)
	body := w.Body.String()
	if !strings.Contains(body, `"index":1`) || !strings.Contains(body, `"error"`) || strings.Contains(body, "[DONE]") {
		t.Fatalf("a cut stream: %s", body)
	}
	if len(fb.charges) != 1 || fb.charges[0].CompletionTokens == 0 {
		t.Fatalf("charges %+v, want one for what was delivered", fb.charges)
	}
	fb.charges = nil
	_, te := serve(t, New(r0.Catalog(), Options{}, Deps{Biller: fb}), `{"model":"oll","stream":true,"n":2,"messages":[{"role":"user","content":"hi [sim fault=context_length]"}]}`)
	if te == nil || te.Code != tollgate.CodeContextLengthExceeded {
		t.Fatalf("an upstream refusal: %+v", te)
	}
	if len(fb.charges) != 0 {
		t.Fatalf("charged %+v for a refused request", fb.charges)
	}
	// Not streamed, and with a tool choice enforced: the same error.
	for _, extra := range []string{`"n":2`, weatherTools + `,"tool_choice":"required","stream":true`} {
		_, te = serve(t, New(r0.Catalog(), Options{}, Deps{Biller: fb}), `{"model":"oll",`+extra+`,"messages":[{"role":"user","content":"hi [sim fault=context_length]"}]}`)
		if te == nil || te.Code != tollgate.CodeContextLengthExceeded || len(fb.charges) != 0 {
			t.Fatalf("%s: an upstream refusal: %+v, charges %+v", extra, te, fb.charges)
		}
	}
}

// A stream for n choices records its charge so far in the journal, summed
// over its streams, as any stream does.
func TestStreamForNChoicesRecordsProgress(t *testing.T) {
	r0, _, _ := controlsRelay(t)
	fb := &fakeBiller{}
	r := New(r0.Catalog(), Options{}, Deps{Biller: fb})
	serveRecorded(t, r, `{"model":"oll","stream":true,"n":2,"messages":[{"role":"user","content":"hi"}]}`)
	if len(fb.progress) == 0 || len(fb.charges) != 1 {
		t.Fatalf("progress %d, charges %d", len(fb.progress), len(fb.charges))
	}
	if p := fb.progress[0]; p.CompletionTokens <= 0 || p.CompletionTokens > fb.charges[0].CompletionTokens {
		t.Errorf("progress %+v against the charge %+v", p, fb.charges[0])
	}
}
