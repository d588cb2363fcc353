package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/tollgate/tollgate"
)

func mustParse(t *testing.T, body string) *ChatRequest {
	t.Helper()
	r, err := ParseChatRequest([]byte(body))
	if err != nil {
		t.Fatalf("ParseChatRequest(%s): %v", body, err)
	}
	return r
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		body, code, param string
	}{
		{``, "invalid_json", ""},
		{`{`, "invalid_json", ""},
		{`[]`, "invalid_json", ""},
		{`"x"`, "invalid_json", ""},
		{`{"messages":[{"role":"user","content":"hi"}]}`, "invalid_request", "model"},
		{`{"model":"","messages":[{"role":"user","content":"hi"}]}`, "invalid_request", "model"},
		{`{"model":5,"messages":[]}`, "invalid_request", "model"},
		{`{"model":"m"}`, "invalid_request", "messages"},
		{`{"model":"m","messages":[]}`, "invalid_request", "messages"},
		{`{"model":"m","messages":{}}`, "invalid_request", "messages"},
		{`{"model":"m","messages":[1]}`, "invalid_request", "messages[0]"},
		{`{"model":"m","messages":[{"role":"wizard","content":"x"}]}`, "invalid_request", "messages[0].role"},
		{`{"model":"m","messages":[{"content":"x"}]}`, "invalid_request", "messages[0].role"},
		{`{"model":"m","messages":[{"role":"user","content":5}]}`, "invalid_request", "messages[0].content"},
		{`{"model":"m","messages":[{"role":"user","content":[{"text":"x"}]}]}`, "invalid_request", "messages[0].content[0]"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"}`, "invalid_request", "stream"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":0}`, "invalid_request", "max_tokens"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1.5}`, "invalid_request", "max_tokens"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":-3}`, "invalid_request", "max_completion_tokens"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"n":0}`, "invalid_request", "n"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"n":129}`, "invalid_request", "n"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":{}}`, "invalid_request", "tools"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"reasoning":"high"}`, "invalid_request", "reasoning"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"web_search_options":true}`, "invalid_request", "web_search_options"},
	}
	for _, c := range cases {
		_, err := ParseChatRequest([]byte(c.body))
		if err == nil {
			t.Errorf("%s: accepted, want %s", c.body, c.code)
			continue
		}
		e, ok := err.(*tollgate.Error)
		if !ok || string(e.Code) != c.code || e.Param != c.param {
			t.Errorf("%s: got %v (param %q), want %s param %q", c.body, err, e.Param, c.code, c.param)
		}
	}
}

func TestCapabilityDetection(t *testing.T) {
	const msg = `"messages":[{"role":"user","content":"x"}]`
	cases := []struct {
		body  string
		needs []tollgate.Capability
		param map[tollgate.Capability]string
	}{
		{`{"model":"m",` + msg + `}`, nil, nil},
		{`{"model":"m",` + msg + `,"tools":[{"type":"function","function":{"name":"f"}}]}`, []tollgate.Capability{tollgate.CapTools}, map[tollgate.Capability]string{tollgate.CapTools: "tools"}},
		{`{"model":"m",` + msg + `,"tools":[]}`, nil, nil},
		{`{"model":"m",` + msg + `,"tool_choice":"none"}`, nil, nil},
		{`{"model":"m",` + msg + `,"tool_choice":"auto"}`, []tollgate.Capability{tollgate.CapTools}, map[tollgate.Capability]string{tollgate.CapTools: "tool_choice"}},
		{`{"model":"m",` + msg + `,"functions":[{"name":"f"}]}`, []tollgate.Capability{tollgate.CapTools}, nil},
		{`{"model":"m",` + msg + `,"function_call":"auto"}`, []tollgate.Capability{tollgate.CapTools}, map[tollgate.Capability]string{tollgate.CapTools: "function_call"}},
		{`{"model":"m",` + msg + `,"reasoning_effort":"high"}`, []tollgate.Capability{tollgate.CapReasoning}, map[tollgate.Capability]string{tollgate.CapReasoning: "reasoning_effort"}},
		{`{"model":"m",` + msg + `,"reasoning_effort":"none"}`, nil, nil},
		{`{"model":"m",` + msg + `,"reasoning":{"effort":"low"}}`, []tollgate.Capability{tollgate.CapReasoning}, nil},
		{`{"model":"m",` + msg + `,"reasoning":{"enabled":false}}`, nil, nil},
		{`{"model":"m",` + msg + `,"reasoning":null,"tools":null,"tool_choice":null}`, nil, nil},
		{`{"model":"m",` + msg + `,"web_search_options":{}}`, []tollgate.Capability{tollgate.CapWebSearch}, nil},
		{`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`,
			[]tollgate.Capability{tollgate.CapImageInput}, map[tollgate.Capability]string{tollgate.CapImageInput: "messages[0].content[1]"}},
		{`{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"file","file":{"file_data":"data:application/pdf;base64,AAAA"}}]}]}`,
			[]tollgate.Capability{tollgate.CapPDFInput}, map[tollgate.Capability]string{tollgate.CapPDFInput: "messages[1].content[0]"}},
		{`{"model":"m","messages":[{"role":"user","content":[{"type":"input_file","file_id":"x"},{"type":"image_url","image_url":{"url":"https://x/y.png"}}]}]}`,
			[]tollgate.Capability{tollgate.CapImageInput, tollgate.CapPDFInput}, nil},
	}
	for _, c := range cases {
		r := mustParse(t, c.body)
		if want := tollgate.NewCapabilities(c.needs...); r.Needs != want {
			t.Errorf("%s: needs %v, want %v", c.body, r.Needs.List(), c.needs)
		}
		for cp, p := range c.param {
			if got := r.Param(cp); got != p {
				t.Errorf("%s: param for %s = %q, want %q", c.body, cp, got, p)
			}
		}
	}
}

func TestMaxTokens(t *testing.T) {
	const msg = `"messages":[{"role":"user","content":"x"}]`
	for body, want := range map[string]int64{
		`{"model":"m",` + msg + `}`:                                             0,
		`{"model":"m",` + msg + `,"max_tokens":7}`:                              7,
		`{"model":"m",` + msg + `,"max_completion_tokens":9}`:                   9,
		`{"model":"m",` + msg + `,"max_tokens":7,"max_completion_tokens":9}`:    9,
		`{"model":"m",` + msg + `,"max_completion_tokens":9,"max_tokens":7}`:    9,
		`{"model":"m",` + msg + `,"max_completion_tokens":null,"max_tokens":7}`: 7,
	} {
		if got := mustParse(t, body).MaxTokens; got != want {
			t.Errorf("%s: MaxTokens = %d, want %d", body, got, want)
		}
	}
}

func TestUpstreamBodyKeepsUnknownFieldsByteForByte(t *testing.T) {
	body := `{"model":"tg-chat","messages":[{"role":"user","content":"hé \u00e9"}],"temperature":0.70000000000000001,` +
		`"logit_bias":{"50256":-100},"x_vendor":{"a":[1,2.50,1e400]},"seed":12345678901234567890,"web_search_options":{},"stream":false}`
	r := mustParse(t, body)
	out := r.AppendUpstreamBody(nil, UpstreamOptions{Model: "qwen/qwen3", Flavour: VLLM, MaxTokens: 512})
	if !json.Valid(out) {
		t.Fatalf("invalid JSON: %s", out)
	}
	for _, keep := range []string{`"temperature":0.70000000000000001`, `"x_vendor":{"a":[1,2.50,1e400]}`, `"seed":12345678901234567890`,
		`"content":"hé \u00e9"`, `"logit_bias":{"50256":-100}`, `"model":"qwen/qwen3"`, `"max_tokens":512`} {
		if !bytes.Contains(out, []byte(keep)) {
			t.Errorf("upstream body lost %s: %s", keep, out)
		}
	}
	if bytes.Contains(out, []byte("web_search_options")) || bytes.Contains(out, []byte("tg-chat")) {
		t.Errorf("upstream body leaks client-only fields: %s", out)
	}
}

func TestUpstreamBodyStreamUsageAndCaps(t *testing.T) {
	r := mustParse(t, `{"model":"a","stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true},"messages":[{"role":"user","content":"x"}],"max_tokens":50}`)
	out := string(r.AppendUpstreamBody(nil, UpstreamOptions{Model: "b", Flavour: OpenAI, MaxTokens: 999}))
	for _, want := range []string{`"stream_options":{"include_usage":true,"continuous_usage_stats":true}`, `"max_completion_tokens":50`, `"model":"b"`} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %s in %s", want, out)
		}
	}
	if strings.Contains(out, `"max_tokens"`) || strings.Contains(out, "999") {
		t.Errorf("cap sent twice or the held cap overrode the client's: %s", out)
	}
	r = mustParse(t, `{"model":"a","stream":true,"messages":[{"role":"user","content":"x"}]}`)
	out = string(r.AppendUpstreamBody(nil, UpstreamOptions{Model: "b", Flavour: Ollama, MaxTokens: 64}))
	if !strings.Contains(out, `"stream_options":{"include_usage":true}`) || !strings.Contains(out, `"max_tokens":64`) {
		t.Errorf("stream options or held cap missing: %s", out)
	}
	r = mustParse(t, `{"model":"a","messages":[{"role":"user","content":"x"}],"max_completion_tokens":5,"max_tokens":9}`)
	out = string(r.AppendUpstreamBody(nil, UpstreamOptions{Model: "b", Flavour: Ollama}))
	if strings.Count(out, "max_") != 1 || !strings.Contains(out, `"max_tokens":5`) {
		t.Errorf("Ollama ignores max_completion_tokens: want one max_tokens of 5, got %s", out)
	}
}

func TestSplitObjectEdgeCases(t *testing.T) {
	r := mustParse(t, " {\"model\" : \"m\" ,\n\"messages\":[{\"role\":\"user\",\"content\":\"a\\\"}]\"}], \"k\\u0065y\": [\"]}\"] } ")
	if string(r.Field("key")) != `["]}"]` {
		t.Fatalf("escaped key or bracket inside a string mis-split: %q", r.Field("key"))
	}
	r = mustParse(t, `{"model":"first","model":"second","messages":[{"role":"user","content":"x"}]}`)
	if r.Model != "second" {
		t.Fatalf("duplicate key: model = %q, want the last", r.Model)
	}
}

func FuzzParseChatRequest(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AA"}}]}],"tools":[{"type":"function","function":{"name":"f"}}]}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[]}],"reasoning":{"effort":"high"},"max_tokens":5}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseChatRequest(body)
		if err != nil {
			if _, ok := err.(*tollgate.Error); !ok {
				t.Fatalf("error is not a *tollgate.Error: %T %v", err, err)
			}
			return
		}
		if r.Model == "" || r.N < 1 || r.MaxTokens < 0 {
			t.Fatalf("accepted a request without a model or with bad counts: %v", r)
		}
		for _, c := range r.Needs.List() {
			if r.Param(c) == "" {
				t.Fatalf("capability %s detected without the field that asked for it", c)
			}
		}
		for _, fl := range Flavours {
			out := r.AppendUpstreamBody(nil, UpstreamOptions{Model: "up", Flavour: fl, MaxTokens: 100})
			if !json.Valid(out) {
				t.Fatalf("upstream body is not valid JSON: %s", out)
			}
			var top map[string]json.RawMessage
			if err := json.Unmarshal(out, &top); err != nil {
				t.Fatalf("upstream body is not an object: %v", err)
			}
			if string(top["model"]) != `"up"` {
				t.Fatalf("upstream model = %s", top["model"])
			}
			if _, ok := top["web_search_options"]; ok {
				t.Fatal("web_search_options sent upstream")
			}
			// Re-parsing what we send must detect the same needs (minus web search).
			r2, err := ParseChatRequest(out)
			if err != nil {
				t.Fatalf("upstream body does not parse: %v\n%s", err, out)
			}
			want := r.Needs &^ tollgate.NewCapabilities(tollgate.CapWebSearch)
			if r.ToolChoice == ToolChoiceNone && !fl.Honours(ControlToolChoiceNone) {
				// tool_choice "none" to a server that ignores it: no tools sent.
				want &^= tollgate.NewCapabilities(tollgate.CapTools)
				if _, ok := top["tools"]; ok {
					t.Fatalf("tools sent to %s with tool_choice none: %s", fl, out)
				}
			}
			if r2.Needs != want {
				t.Fatalf("needs changed in the rewrite: %v -> %v", r.Needs.List(), r2.Needs.List())
			}
		}
	})
}

func BenchmarkParseAndRewrite(b *testing.B) {
	body := []byte(`{"model":"tg-chat","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello in one short sentence, please."}],"temperature":0.7,"stream":true,"max_tokens":64}`)
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		r, err := ParseChatRequest(body)
		if err != nil {
			b.Fatal(err)
		}
		buf = r.AppendUpstreamBody(buf[:0], UpstreamOptions{Model: "up", Flavour: VLLM, MaxTokens: 64})
	}
}

func TestPromptBytesExcludeInlineMedia(t *testing.T) {
	img := `{"type":"image_url","image_url":{"url":"data:image/png;base64,` + strings.Repeat("A", 10000) + `"}}`
	withImg := mustParse(t, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what is it"},`+img+`]}]}`)
	without := mustParse(t, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what is it"}]}]}`)
	if withImg.PromptBytes > without.PromptBytes+2 || withImg.Images != 1 {
		t.Fatalf("image bytes counted as text: %d vs %d", withImg.PromptBytes, without.PromptBytes)
	}
}

func TestStreamOptionsDroppedWithoutStream(t *testing.T) {
	r := mustParse(t, `{"model":"a","stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}]}`)
	if out := string(r.AppendUpstreamBody(nil, UpstreamOptions{Model: "b", Flavour: VLLM})); strings.Contains(out, "stream_options") {
		t.Fatalf("stream_options sent on a non-streamed request: %s", out)
	}
}

// JSON nested deeper than MaxDepth gets its own message naming the limit;
// MaxDepth levels are accepted.
func TestRequestNestingLimit(t *testing.T) {
	body := func(levels int) []byte {
		// The top-level object is level 1; "x" holds levels-1 nested arrays.
		inner := strings.Repeat("[", levels-1) + strings.Repeat("]", levels-1)
		return []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"x":` + inner + `}`)
	}
	if _, err := ParseChatRequest(body(MaxDepth)); err != nil {
		t.Fatalf("%d levels: %v", MaxDepth, err)
	}
	_, err := ParseChatRequest(body(MaxDepth + 1))
	var te *tollgate.Error
	if !errors.As(err, &te) || te.Code != tollgate.CodeInvalidJSON || !strings.Contains(te.Message, "512 levels deep") {
		t.Fatalf("%d levels: %v, want invalid_json naming the limit", MaxDepth+1, err)
	}
	_, err = ParseChatRequest([]byte(`{"model":"m",`))
	if !errors.As(err, &te) || strings.Contains(te.Message, "deep") {
		t.Fatalf("truncated body: %v, want the plain syntax message", err)
	}
}
