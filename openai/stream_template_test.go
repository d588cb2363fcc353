package openai

import (
	"bytes"
	"fmt"
	"reflect"
	"testing"

	"github.com/tollgate/tollgate/internal/jsonscan"
)

// lockstep feeds the same chunks to a normaliser with the chunk template and
// to one without, and fails on the first difference in what they return or
// remember. It returns the normaliser with the template.
func lockstep(t *testing.T, fl Flavour, chunks [][]byte) *StreamNormalizer {
	t.Helper()
	clock := func() int64 { return 1795400000 }
	fast := &StreamNormalizer{ID: testID, Model: testModel, Flavour: fl, clock: clock}
	full := &StreamNormalizer{ID: testID, Model: testModel, Flavour: fl, noTemplate: true, clock: clock}
	for i, c := range chunks {
		a, errA := fast.Chunk(c)
		b, errB := full.Chunk(c)
		if !bytes.Equal(a, b) || fmt.Sprint(errA) != fmt.Sprint(errB) {
			t.Fatalf("chunk %d %q:\ntemplate %q (%v)\nfull     %q (%v)", i, c, a, errA, b, errB)
		}
		if errA != nil {
			return fast
		}
		ua, oka := fast.Usage()
		ub, okb := full.Usage()
		if fast.DeliveredBytes() != full.DeliveredBytes() || fast.Forwarded() != full.Forwarded() ||
			fast.SawFinish() != full.SawFinish() || !reflect.DeepEqual(ua, ub) || oka != okb || fast.roleSent != full.roleSent ||
			fast.deliveredFirst != full.deliveredFirst {
			t.Fatalf("chunk %d %q: state differs: delivered %d/%d forwarded %d/%d finish %v/%v usage %v/%v",
				i, c, fast.DeliveredBytes(), full.DeliveredBytes(), fast.Forwarded(), full.Forwarded(),
				fast.SawFinish(), full.SawFinish(), usageString(ua), usageString(ub))
		}
	}
	return fast
}

// TestStreamTemplateMatchesFullPath: every stream fixture (real llama.cpp and
// Ollama captures, the synthetic quirks of vLLM, SGLang, OpenRouter, OpenAI)
// normalises to the same bytes and the same state with the chunk template as
// without it, and the template does serve the token chunks.
func TestStreamTemplateMatchesFullPath(t *testing.T) {
	total, templated := 0, 0
	for _, c := range streamCases(t) {
		t.Run(c.name, func(t *testing.T) {
			var chunks [][]byte
			r := NewEventReader(bytes.NewReader(c.body))
			for {
				ev, err := r.Next()
				if err != nil {
					break
				}
				if ev.Comment || (ev.Name != "" && ev.Name != "message") {
					continue
				}
				d := jsonscan.TrimWS(ev.Data)
				if len(d) == 0 || string(d) == "[DONE]" {
					continue
				}
				chunks = append(chunks, append([]byte(nil), d...))
			}
			n := lockstep(t, c.fl, chunks)
			total += len(chunks)
			templated += n.templated
		})
	}
	// The fixtures are short answers (2 to 7 chunks of text, the first of
	// each shape always takes the full path); TestStreamTemplateLongAnswers
	// covers long ones.
	t.Logf("%d of %d fixture chunks normalised by the template", templated, total)
	if templated < 10 {
		t.Fatalf("only %d of %d chunks took the template", templated, total)
	}
}

// TestStreamTemplateLongAnswers: in a long answer, in each server's shape
// (from the captures and the servers' docs), every token after the first two
// takes the template, and the output is the full path's.
func TestStreamTemplateLongAnswers(t *testing.T) {
	for _, tc := range []struct {
		fl         Flavour
		role, text string // %s: the token, a JSON string
	}{
		{VLLM, `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1795400000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
			`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1795400000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"content":%s},"logprobs":null,"finish_reason":null}]}`},
		{LlamaCpp, `{"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"created":1795405808,"id":"chatcmpl-3C","model":"/models/tiny-thinking.gguf","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}`,
			`{"choices":[{"finish_reason":null,"index":0,"delta":{"reasoning_content":%s}}],"created":1795405808,"id":"chatcmpl-3C","model":"/models/tiny-thinking.gguf","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}`},
		{Ollama, `{"id":"chatcmpl-493","object":"chat.completion.chunk","created":1795405808,"model":"tiny-chat","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":"Hello"},"finish_reason":null}]}`,
			`{"id":"chatcmpl-493","object":"chat.completion.chunk","created":1795405808,"model":"tiny-chat","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"content":%s},"finish_reason":null}]}`},
		{LlamaCpp, `{"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}}],"created":1795405798,"id":"chatcmpl-mY","model":"/models/tiny-chat.gguf","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}`,
			`{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":%s}}]}}],"created":1795405798,"id":"chatcmpl-mY","model":"/models/tiny-chat.gguf","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}`},
		{VLLM, `{"id":"chatcmpl-2","object":"chat.completion.chunk","created":1795400000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"id":"chatcmpl-tool-1","type":"function","function":{"name":"get_weather","arguments":""}}]},"logprobs":null,"finish_reason":null}]}`,
			`{"id":"chatcmpl-2","object":"chat.completion.chunk","created":1795400000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"tool_calls":[{"function":{"arguments":%s}}]},"logprobs":null,"finish_reason":null}]}`},
		{SGLang, `{"id":"6f1e","object":"chat.completion.chunk","created":1795400100,"model":"deepseek-r1","choices":[{"index":0,"delta":{"role":"assistant","content":null,"reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}`,
			`{"id":"6f1e","object":"chat.completion.chunk","created":1795400100,"model":"deepseek-r1","choices":[{"index":0,"delta":{"role":null,"content":%s,"reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}`},
	} {
		t.Run(string(tc.fl), func(t *testing.T) {
			chunks := [][]byte{[]byte(tc.role)}
			for i := range 64 {
				tok := fmt.Sprintf(`" tok%d"`, i)
				if i%9 == 4 {
					tok = `"\u00e9\n\"q\" \\"`
				}
				chunks = append(chunks, fmt.Appendf(nil, tc.text, tok))
			}
			n := lockstep(t, tc.fl, chunks)
			if n.templated != 63 {
				t.Fatalf("%d of 64 tokens took the template, want 63", n.templated)
			}
		})
	}
}

func TestStreamTemplateEdges(t *testing.T) {
	const head = `{"id":"x","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":`
	const tail = `},"finish_reason":null}]}`
	tok := func(s string) []byte { return []byte(head + s + tail) }
	for _, tc := range []struct {
		name   string
		chunks [][]byte
		fast   int // chunks expected to take the template
	}{
		{"plain tokens", [][]byte{tok(`"0"`), tok(`"a"`), tok(`"bc"`), tok(`""`), tok(`"\u00e9\n\"q\""`)}, 3},
		{"first role is not a template", [][]byte{[]byte(`{"choices":[{"index":0,"delta":{"content":"a"}}]}`),
			[]byte(`{"choices":[{"index":0,"delta":{"content":"b"}}]}`), []byte(`{"choices":[{"index":0,"delta":{"content":"c"}}]}`)}, 1},
		{"string that ends early", [][]byte{tok(`"0"`), tok(`"a"`), tok(`"a","role":"x"`), tok(`"b"`), tok(`"c"`)}, 1},
		{"escaped backslash at the end", [][]byte{tok(`"0"`), tok(`"a"`), tok(`"a\\"`)}, 1},
		{"escaped quote at the end", [][]byte{tok(`"0"`), tok(`"a"`), tok(`"a\"`)}, 0},
		{"invalid escape", [][]byte{tok(`"0"`), tok(`"a"`), tok(`"\x"`)}, 0},
		{"short unicode escape", [][]byte{tok(`"0"`), tok(`"a"`), tok(`"\u12"`)}, 0},
		{"control character", [][]byte{tok(`"0"`), tok(`"a"`), tok("\"a\nb\"")}, 0},
		{"null then string", [][]byte{tok(`"0"`), tok(`"a"`), tok(`null`), tok(`"b"`)}, 1},
		{"not a string", [][]byte{tok(`"0"`), tok(`"a"`), tok(`1`), tok(`"b"`)}, 1},
		{"usage on the token", [][]byte{
			[]byte(`{"choices":[{"index":0,"delta":{"role":"assistant","content":"a"}}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`),
			[]byte(`{"choices":[{"index":0,"delta":{"role":"assistant","content":"b"}}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`),
			[]byte(`{"choices":[{"index":0,"delta":{"role":"assistant","content":"c"}}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`)}, 1},
		{"reasoning_content renamed", [][]byte{
			[]byte(`{"choices":[{"index":0,"delta":{"role":"assistant","reasoning_content":"a"}}]}`),
			[]byte(`{"choices":[{"index":0,"delta":{"role":"assistant","reasoning_content":"b\"c"}}]}`)}, 1},
		{"tool call: name and arguments", [][]byte{
			[]byte(`{"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"function":{"name":"f","arguments":"a"}}]}}]}`),
			[]byte(`{"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"function":{"name":"f","arguments":"b"}}]}}]}`)}, 0},
		{"tool call: arguments, then an id", [][]byte{
			[]byte(`{"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"function":{"arguments":"a"}}]}}]}`),
			[]byte(`{"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"function":{"arguments":"b\"}"}}]}}]}`),
			[]byte(`{"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"function":{"arguments":"c"},"id":"x"}]}}]}`),
			[]byte(`{"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"function":{"arguments":"d"},"id":"x"}]}}]}`)}, 2},
		{"tool call: arguments not a string", [][]byte{
			[]byte(`{"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"function":{"arguments":{"k":1}}}]}}]}`),
			[]byte(`{"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"function":{"arguments":{"k":2}}}]}}]}`)}, 0},
		{"legacy function_call pieces", [][]byte{
			[]byte(`{"choices":[{"index":0,"delta":{"role":"assistant","function_call":{"name":"f","arguments":""}}}]}`),
			[]byte(`{"choices":[{"index":0,"delta":{"role":"assistant","function_call":{"arguments":"{\"a"}}}]}`),
			[]byte(`{"choices":[{"index":0,"delta":{"role":"assistant","function_call":{"arguments":"\":1}"}}}]}`)}, 1},
		{"two strings", [][]byte{
			[]byte(`{"choices":[{"index":0,"delta":{"role":"assistant","content":"a","reasoning":"b"}}]}`),
			[]byte(`{"choices":[{"index":0,"delta":{"role":"assistant","content":"a","reasoning":"c"}}]}`)}, 0},
		{"error after tokens", [][]byte{tok(`"0"`), tok(`"a"`), tok(`"b"`),
			[]byte(`{"id":"x","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"c"},"finish_reason":"error"}]}`)}, 1},
		{"finish on the template", [][]byte{
			[]byte(`{"choices":[{"index":0,"delta":{"role":"assistant","content":"a"},"finish_reason":"stop"}]}`),
			[]byte(`{"choices":[{"index":0,"delta":{"role":"assistant","content":"b"},"finish_reason":"stop"}]}`)}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := lockstep(t, VLLM, tc.chunks)
			if n.templated != tc.fast {
				t.Fatalf("%d chunks took the template, want %d", n.templated, tc.fast)
			}
		})
	}
}

// FuzzStreamTemplate: two chunks in a row normalise alike with and without
// the template, the second often a copy of the first with its text changed.
func FuzzStreamTemplate(f *testing.F) {
	seeds := streamSeeds(f)
	for i := 0; i+1 < len(seeds); i++ {
		f.Add(seeds[i], seeds[i+1])
	}
	f.Add([]byte(`{"choices":[{"index":0,"delta":{"content":"a"}}]}`), []byte(`{"choices":[{"index":0,"delta":{"content":"a\\"}}]}`))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		if len(a) == 0 || len(b) == 0 {
			return
		}
		// The same chunk with b spliced into it where its first string
		// value begins: the template's own shape with other text.
		spliced := a
		if i := bytes.Index(a, []byte(`"content":"`)); i >= 0 {
			spliced = append(append(append([]byte(nil), a[:i+11]...), b...), a[i+11:]...)
		}
		for _, fl := range []Flavour{VLLM, LlamaCpp} {
			lockstep(t, fl, [][]byte{a, b, a, spliced, a})
		}
	})
}

func usageString(u Usage) string {
	s := fmt.Sprintf("%d/%d/%d estimated %v", u.PromptTokens, u.CompletionTokens, u.TotalTokens, u.Estimated)
	if u.CachedTokens != nil {
		s += fmt.Sprintf(" cached %d", *u.CachedTokens)
	}
	if u.ReasoningTokens != nil {
		s += fmt.Sprintf(" reasoning %d", *u.ReasoningTokens)
	}
	return s
}

// TestStreamNormalizerReset: a normaliser reset after other streams (as the
// relay's pool does) writes each stream exactly as a new one does.
func TestStreamNormalizerReset(t *testing.T) {
	clock := func() int64 { return 1795400000 }
	run := func(n *StreamNormalizer, body []byte) []byte {
		r := NewEventReader(bytes.NewReader(body))
		var out []byte
		for {
			ev, err := r.Next()
			if err != nil {
				break
			}
			chunk, err := n.Event(ev)
			if err != nil {
				break
			}
			if chunk != nil {
				out = AppendData(out, chunk)
			}
		}
		return AppendData(out, n.UsageChunk(n.FinalUsage(testPrompt), nil))
	}
	cases := streamCases(t)
	var reused StreamNormalizer
	for round := range 2 { // the second round starts each case after another
		for i := range cases {
			c := cases[(i+round)%len(cases)]
			fresh := &StreamNormalizer{ID: testID, Model: testModel, Flavour: c.fl, clock: clock}
			want := run(fresh, c.body)
			reused.Reset(testID, testModel, c.fl)
			reused.clock = clock
			if got := run(&reused, c.body); !bytes.Equal(got, want) {
				t.Fatalf("%s after a reset:\n%s\nwant\n%s", c.name, got, want)
			}
			if fresh.DeliveredBytes() != reused.DeliveredBytes() || fresh.Forwarded() != reused.Forwarded() {
				t.Fatalf("%s after a reset: state differs", c.name)
			}
		}
	}
}
