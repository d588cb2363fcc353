package relay

import (
	"errors"
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

	for _, c := range []struct{ extra, param string }{
		{weatherTools + `,"tool_choice":"required"`, "tool_choice"},
		{weatherTools + `,"tool_choice":{"type":"function","function":{"name":"get_weather"}}`, "tool_choice"},
		{`"n":3`, "n"},
	} {
		_, te := serve(t, r, `{"model":"oll","messages":[{"role":"user","content":"hi"}],`+c.extra+`}`)
		if te == nil || te.Code != tollgate.CodeParameterNotSupported || te.Param != c.param {
			t.Fatalf("%s on an Ollama-only model: %+v, want parameter_not_supported on %s", c.extra, te, c.param)
		}
		if !strings.Contains(te.Message, "ollama") {
			t.Errorf("message does not say which server ignores it: %s", te.Message)
		}
	}
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
