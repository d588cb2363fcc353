package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/tollgate/tollgate"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

const (
	testID     = "chatcmpl-tg-0123456789abcdef"
	testModel  = "tg-chat"
	testPrompt = 10 // the relay's prompt estimate when the upstream reports no usage
)

// capture is one recorded upstream answer (testdata/captures/*/*.http).
type capture struct {
	status      int
	contentType string
	body        []byte
}

func readCapture(t testing.TB, path string) capture {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	head, body, ok := bytes.Cut(raw, []byte("\r\n\r\n"))
	if !ok {
		t.Fatalf("%s: no header/body separator", path)
	}
	lines := strings.Split(string(head), "\r\n")
	f := strings.Fields(lines[0])
	st, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatalf("%s: status line %q", path, lines[0])
	}
	c := capture{status: st, body: body}
	for _, l := range lines[1:] {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(k, "content-type") {
			c.contentType = strings.TrimSpace(v)
		}
	}
	return c
}

// relayResult is what a relay built on this package sends for one upstream stream.
type relayResult struct {
	out     []byte // the exact bytes the client receives
	failure *tollgate.Error
	n       *StreamNormalizer
}

// relayStream does what the relay does with an upstream stream: forward every
// normalised chunk, then one usage chunk, then [DONE] or the error event.
func relayStream(fl Flavour, body io.Reader) relayResult {
	n := &StreamNormalizer{ID: testID, Model: testModel, Flavour: fl}
	r := NewEventReader(body)
	var res relayResult
	res.n = n
	for {
		ev, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			res.failure = &tollgate.Error{Code: tollgate.CodeUpstreamError, Message: "read: " + err.Error()}
			break
		}
		chunk, err := n.Event(ev)
		if errors.Is(err, ErrDone) {
			break
		}
		if err != nil {
			if !errors.As(err, &res.failure) {
				panic(err)
			}
			break
		}
		if chunk != nil {
			res.out = AppendData(res.out, chunk)
		}
	}
	if res.failure == nil && !n.Done() && !n.SawFinish() {
		res.failure = &tollgate.Error{Code: tollgate.CodeUpstreamError, Message: "The model server ended the stream early."}
	}
	res.out = AppendData(res.out, n.UsageChunk(n.FinalUsage(testPrompt), nil))
	if res.failure != nil {
		res.out = AppendData(res.out, ErrorEvent(res.failure))
	} else {
		res.out = append(res.out, DoneEvent...)
	}
	return res
}

type streamCase struct {
	name string // golden name
	fl   Flavour
	body []byte
}

func streamCases(t testing.TB) []streamCase {
	t.Helper()
	var cases []streamCase
	for _, fl := range []Flavour{LlamaCpp, Ollama} {
		files, _ := filepath.Glob(filepath.Join("testdata/captures", string(fl), "*.http"))
		for _, f := range files {
			c := readCapture(t, f)
			if c.status != 200 || !strings.HasPrefix(c.contentType, "text/event-stream") {
				continue
			}
			cases = append(cases, streamCase{name: string(fl) + "/" + strings.TrimSuffix(filepath.Base(f), ".http"), fl: fl, body: c.body})
		}
	}
	files, _ := filepath.Glob("testdata/synthetic/*.sse")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		base := strings.TrimSuffix(filepath.Base(f), ".sse")
		prefix, _, _ := strings.Cut(base, "_")
		fl := Flavour(prefix)
		if !fl.Valid() {
			t.Fatalf("%s: file name must start with a flavour", f)
		}
		cases = append(cases, streamCase{name: "synthetic/" + base, fl: fl, body: b})
	}
	if len(cases) < 20 {
		t.Fatalf("only %d stream fixtures found", len(cases))
	}
	return cases
}

func TestStreamGolden(t *testing.T) {
	for _, c := range streamCases(t) {
		t.Run(c.name, func(t *testing.T) {
			res := relayStream(c.fl, bytes.NewReader(c.body))
			golden := filepath.Join("testdata/golden", c.name+".sse")
			if *update {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, res.out, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -run TestStreamGolden -update)", err)
			}
			if !bytes.Equal(res.out, want) {
				t.Errorf("output differs from %s\n got: %s\nwant: %s", golden, res.out, want)
			}
			// The same bytes must come out whatever the read sizes.
			res1 := relayStream(c.fl, iotest.OneByteReader(bytes.NewReader(c.body)))
			if !bytes.Equal(res1.out, res.out) {
				t.Errorf("one-byte reads give a different stream:\n%s", res1.out)
			}
		})
	}
}

// sentEvent is one event of tollgate's output, parsed.
type sentEvent struct {
	raw  string
	obj  map[string]json.RawMessage
	done bool
}

func parseSent(t *testing.T, out []byte) []sentEvent {
	t.Helper()
	var evs []sentEvent
	for _, block := range strings.SplitAfter(string(out), "\n\n") {
		if block == "" {
			continue
		}
		if !strings.HasPrefix(block, "data: ") || !strings.HasSuffix(block, "\n\n") || strings.Count(block, "\n") != 2 {
			t.Fatalf("not a single-line data event: %q", block)
		}
		data := strings.TrimSuffix(strings.TrimPrefix(block, "data: "), "\n\n")
		if data == "[DONE]" {
			evs = append(evs, sentEvent{raw: data, done: true})
			continue
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal([]byte(data), &obj); err != nil {
			t.Fatalf("invalid JSON sent: %v: %s", err, data)
		}
		evs = append(evs, sentEvent{raw: data, obj: obj})
	}
	return evs
}

// TestStreamInvariants checks, for every fixture, what PROTOCOL.md says
// clients are strict about, independently of the golden files.
func TestStreamInvariants(t *testing.T) {
	for _, c := range streamCases(t) {
		t.Run(c.name, func(t *testing.T) {
			res := relayStream(c.fl, bytes.NewReader(c.body))
			evs := parseSent(t, res.out)
			usageSeen := 0
			var created json.RawMessage
			for i, ev := range evs {
				if ev.done {
					if i != len(evs)-1 || res.failure != nil {
						t.Errorf("[DONE] at %d of %d (failure %v)", i, len(evs), res.failure)
					}
					continue
				}
				if _, isErr := ev.obj["error"]; isErr {
					if i != len(evs)-1 || res.failure == nil {
						t.Errorf("error event not last or without failure: %s", ev.raw)
					}
					var e struct {
						Error map[string]json.RawMessage `json:"error"`
					}
					_ = json.Unmarshal([]byte(ev.raw), &e)
					for _, k := range []string{"message", "type", "param", "code"} {
						if _, ok := e.Error[k]; !ok {
							t.Errorf("error event lacks %q: %s", k, ev.raw)
						}
					}
					if len(ev.obj) != 1 {
						t.Errorf("error event has other keys: %s", ev.raw)
					}
					continue
				}
				if string(ev.obj["id"]) != `"`+testID+`"` || string(ev.obj["model"]) != `"`+testModel+`"` ||
					string(ev.obj["object"]) != `"chat.completion.chunk"` {
					t.Errorf("id/model/object not tollgate's: %s", ev.raw)
				}
				if created == nil {
					created = ev.obj["created"]
				} else if !bytes.Equal(created, ev.obj["created"]) {
					t.Errorf("created changed from %s: %s", created, ev.raw)
				}
				for _, k := range []string{"system_fingerprint", "timings", "provider"} {
					if _, ok := ev.obj[k]; ok {
						t.Errorf("backend field %q forwarded: %s", k, ev.raw)
					}
				}
				if strings.Contains(ev.raw, `"reasoning_content"`) || strings.Contains(ev.raw, `"stop_reason"`) ||
					strings.Contains(ev.raw, `"native_finish_reason"`) || strings.Contains(ev.raw, `"matched_stop"`) {
					t.Errorf("untranslated backend field: %s", ev.raw)
				}
				if u, ok := ev.obj["usage"]; ok {
					usageSeen++
					if string(ev.obj["choices"]) != "[]" {
						t.Errorf("usage chunk with choices: %s", ev.raw)
					}
					wantAt := len(evs) - 2
					if i != wantAt {
						t.Errorf("usage chunk at %d, want %d (just before [DONE]/error)", i, wantAt)
					}
					var uu map[string]json.RawMessage
					_ = json.Unmarshal(u, &uu)
					for _, k := range []string{"prompt_tokens", "completion_tokens", "total_tokens"} {
						if _, ok := uu[k]; !ok {
							t.Errorf("usage lacks %s: %s", k, u)
						}
					}
					if _, ok := uu["cost"]; ok {
						t.Errorf("upstream cost leaked into usage: %s", u)
					}
					continue
				}
				var choices []map[string]json.RawMessage
				if err := json.Unmarshal(ev.obj["choices"], &choices); err != nil || len(choices) == 0 {
					t.Errorf("forwarded chunk without choices: %s", ev.raw)
				}
				for _, ch := range choices {
					if _, ok := ch["index"]; !ok {
						t.Errorf("choice without index: %s", ev.raw)
					}
					var d struct {
						ToolCalls []map[string]json.RawMessage `json:"tool_calls"`
					}
					_ = json.Unmarshal(ch["delta"], &d)
					for _, tc := range d.ToolCalls {
						if _, ok := tc["index"]; !ok {
							t.Errorf("tool call without index: %s", ev.raw)
						}
						if _, ok := tc["id"]; ok && string(tc["type"]) != `"function"` {
							t.Errorf("first tool-call piece without type function: %s", ev.raw)
						}
					}
				}
			}
			if usageSeen != 1 {
				t.Errorf("usage appeared %d times, want exactly 1", usageSeen)
			}
			last := evs[len(evs)-1]
			if res.failure == nil && !last.done {
				t.Errorf("successful stream does not end with [DONE]")
			}
			if res.failure != nil && last.done {
				t.Errorf("failed stream ends with [DONE]")
			}
		})
	}
}

// accumulate rebuilds what a client's accumulator sees: text, reasoning and
// tool calls per choice, from tollgate's output.
type accumulated struct {
	content, reasoning string
	toolNames          map[int]string
	toolArgs           map[int]string
	toolIDs            map[int]string
	finish             string
	usage              map[string]any
}

func accumulate(t *testing.T, out []byte) map[int]*accumulated {
	t.Helper()
	acc := map[int]*accumulated{}
	get := func(i int) *accumulated {
		if acc[i] == nil {
			acc[i] = &accumulated{toolNames: map[int]string{}, toolArgs: map[int]string{}, toolIDs: map[int]string{}}
		}
		return acc[i]
	}
	for _, ev := range parseSent(t, out) {
		if ev.done {
			continue
		}
		var c struct {
			Choices []struct {
				Index int `json:"index"`
				Delta struct {
					Content   *string `json:"content"`
					Reasoning *string `json:"reasoning"`
					ToolCalls []struct {
						Index    int    `json:"index"`
						ID       string `json:"id"`
						Function struct {
							Name      string `json:"name"`
							Arguments string `json:"arguments"`
						} `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage map[string]any `json:"usage"`
		}
		if err := json.Unmarshal([]byte(ev.raw), &c); err != nil {
			t.Fatal(err)
		}
		if c.Usage != nil {
			get(-1).usage = c.Usage
		}
		for _, ch := range c.Choices {
			a := get(ch.Index)
			if ch.Delta.Content != nil {
				a.content += *ch.Delta.Content
			}
			if ch.Delta.Reasoning != nil {
				a.reasoning += *ch.Delta.Reasoning
			}
			for _, tc := range ch.Delta.ToolCalls {
				if tc.ID != "" {
					a.toolIDs[tc.Index] = tc.ID
				}
				a.toolNames[tc.Index] += tc.Function.Name
				a.toolArgs[tc.Index] += tc.Function.Arguments
			}
			if ch.FinishReason != nil {
				a.finish = *ch.FinishReason
			}
		}
	}
	return acc
}

func runFile(t *testing.T, fl Flavour, path string) relayResult {
	t.Helper()
	var body []byte
	if strings.HasSuffix(path, ".http") {
		body = readCapture(t, path).body
	} else {
		var err error
		if body, err = os.ReadFile(path); err != nil {
			t.Fatal(err)
		}
	}
	return relayStream(fl, bytes.NewReader(body))
}

func num(v any) int64 {
	f, _ := v.(float64)
	return int64(f)
}

func TestStreamLlamaCppUsageAndCache(t *testing.T) {
	res := runFile(t, LlamaCpp, "testdata/captures/llamacpp/06_chat_stream_usage.http")
	u, ok := res.n.Usage()
	if !ok || u.PromptTokens != 23 || u.CompletionTokens != 4 || u.TotalTokens != 27 || u.CachedTokens == nil || *u.CachedTokens != 22 || u.ReasoningTokens != nil || u.Estimated {
		t.Fatalf("usage = %+v, ok %v", u, ok)
	}
	acc := accumulate(t, res.out)
	if acc[0].content != "Hello world!" || acc[0].finish != "stop" {
		t.Fatalf("content %q finish %q", acc[0].content, acc[0].finish)
	}
	if res.n.Forwarded() != 5 {
		t.Fatalf("forwarded %d chunks, want 5 (the usage-only chunk is dropped)", res.n.Forwarded())
	}
	if res.n.Created() != 1795405797 {
		t.Fatalf("created %d", res.n.Created())
	}
}

// llama.cpp's usage counts the first choice only (real-servers
// llamacpp/chat/25_n2): with several choices the others are counted at the
// first one's tokens per byte, and the usage is marked estimated. The same
// stream from a server that counts every choice (vLLM) is left as it is.
// Consecutive chunks of one choice go through the chunk template, which
// must keep the count per choice too.
func TestStreamLlamaCppSeveralChoices(t *testing.T) {
	var b strings.Builder
	chunk := func(i int, text string) {
		fmt.Fprintf(&b, `data: {"choices":[{"finish_reason":null,"index":%d,"delta":{"content":%q}}],"created":1795405805,"id":"chatcmpl-x","model":"m","object":"chat.completion.chunk"}`+"\n\n", i, text)
	}
	for _, tok := range []string{"Hello", " big", " world"} { // 15 bytes, choice 0
		chunk(0, tok)
	}
	for _, tok := range []string{"Good", " day", " to", " all", " of", " you"} { // 22 bytes, choice 1
		chunk(1, tok)
	}
	for i := range 2 {
		fmt.Fprintf(&b, `data: {"choices":[{"finish_reason":"stop","index":%d,"delta":{}}],"created":1795405805,"id":"chatcmpl-x","model":"m","object":"chat.completion.chunk"}`+"\n\n", i)
	}
	b.WriteString(`data: {"choices":[],"created":1795405805,"id":"chatcmpl-x","model":"m","object":"chat.completion.chunk","usage":{"completion_tokens":3,"prompt_tokens":10,"total_tokens":13}}` + "\n\ndata: [DONE]\n\n")
	res := relayStream(LlamaCpp, strings.NewReader(b.String()))
	if res.n.DeliveredBytes() != 37 {
		t.Fatalf("delivered %d bytes, want 37", res.n.DeliveredBytes())
	}
	if res.n.templated == 0 {
		t.Fatal("no chunk went through the template: the test does not cover it")
	}
	// 3 tokens for 15 bytes: 22 more bytes are ceil(3 × 22 / 15) = 5 tokens.
	u, ok := res.n.Usage()
	if !ok || u.CompletionTokens != 8 || u.TotalTokens != 18 || !u.Estimated {
		t.Fatalf("usage = %+v, ok %v; want 8 completion tokens, estimated", u, ok)
	}
	if acc := accumulate(t, res.out); num(acc[-1].usage["completion_tokens"]) != 8 {
		t.Fatalf("usage chunk %v", acc[-1].usage)
	}
	if u, _ := relayStream(VLLM, strings.NewReader(b.String())).n.Usage(); u.CompletionTokens != 3 || u.Estimated {
		t.Fatalf("vLLM usage = %+v, want the reported 3", u)
	}
}

func TestStreamNoUsageIsEstimated(t *testing.T) {
	for _, p := range []string{"testdata/captures/ollama/05_chat_stream.http", "testdata/captures/llamacpp/05_chat_stream.http"} {
		res := runFile(t, Flavour(filepath.Base(filepath.Dir(p))), p)
		if _, ok := res.n.Usage(); ok {
			t.Fatalf("%s: usage reported?", p)
		}
		if res.n.DeliveredBytes() != int64(len("Hello world!")) {
			t.Fatalf("%s: delivered %d bytes", p, res.n.DeliveredBytes())
		}
		// "Hello", " world", "!" and the end of turn: 4, what both servers
		// reported for the same answer with usage (captures 06).
		u := res.n.FinalUsage(testPrompt)
		if !u.Estimated || u.CompletionTokens != 4 || u.PromptTokens != testPrompt || u.TotalTokens != testPrompt+4 {
			t.Fatalf("%s: estimated usage %+v", p, u)
		}
		acc := accumulate(t, res.out)
		if num(acc[-1].usage["completion_tokens"]) != 4 {
			t.Fatalf("%s: usage chunk %v", p, acc[-1].usage)
		}
	}
}

func TestStreamToolCallsReassemble(t *testing.T) {
	for _, tc := range []struct {
		fl        Flavour
		path      string
		args      string
		reasoning string
	}{
		{LlamaCpp, "testdata/captures/llamacpp/19_tools_auto_stream.http", "", ""},
		{LlamaCpp, "testdata/captures/llamacpp/52_think_tools_stream.http", `{ "city": "Oslo", "unit":"f"}`, " Hmm"},
		{Ollama, "testdata/captures/ollama/19_tools_auto_stream.http", `{"city":"Paris","unit":"c"}`, ""},
		{Ollama, "testdata/captures/ollama/52_think_tools_stream.http", `{"city":"Paris","unit":"f"}`, " Hmm"},
	} {
		res := runFile(t, tc.fl, tc.path)
		acc := accumulate(t, res.out)[0]
		if acc.toolNames[0] != "get_weather" || acc.toolIDs[0] == "" || acc.finish != "tool_calls" {
			t.Errorf("%s: tool call %+v", tc.path, acc)
		}
		if tc.args != "" && acc.toolArgs[0] != tc.args {
			t.Errorf("%s: arguments %q, want %q", tc.path, acc.toolArgs[0], tc.args)
		}
		if !json.Valid([]byte(acc.toolArgs[0])) {
			t.Errorf("%s: arguments not JSON: %q", tc.path, acc.toolArgs[0])
		}
		if acc.reasoning != tc.reasoning {
			t.Errorf("%s: reasoning %q, want %q", tc.path, acc.reasoning, tc.reasoning)
		}
		if res.failure != nil {
			t.Errorf("%s: failure %v", tc.path, res.failure)
		}
	}
}

func TestStreamVLLMLastDeltaWithUsage(t *testing.T) {
	res := runFile(t, VLLM, "testdata/synthetic/vllm_reasoning.sse")
	acc := accumulate(t, res.out)
	if acc[0].content != "Hi!" || acc[0].reasoning != "Let me think." || acc[0].finish != "stop" {
		t.Fatalf("accumulated %+v", acc[0])
	}
	u, ok := res.n.Usage()
	if !ok || u.PromptTokens != 12 || u.CompletionTokens != 8 || u.TotalTokens != 20 {
		t.Fatalf("usage %+v %v", u, ok)
	}
	// The logprob is copied byte for byte, not through a float64.
	if !bytes.Contains(res.out, []byte(`"logprob":-0.00012302027607802302`)) {
		t.Fatalf("logprob changed:\n%s", res.out)
	}
}

func TestStreamReasoningContentBoth(t *testing.T) {
	res := runFile(t, VLLM, "testdata/synthetic/vllm_reasoning_content.sse")
	acc := accumulate(t, res.out)
	if acc[0].reasoning != "Two plus two is four." || acc[0].content != "4" {
		t.Fatalf("accumulated %+v", acc[0])
	}
	if bytes.Contains(res.out, []byte("reasoning_content")) || bytes.Contains(res.out, []byte("kv_transfer_params")) {
		t.Fatalf("backend fields left:\n%s", res.out)
	}
}

func TestStreamSGLangReasoningTokens(t *testing.T) {
	res := runFile(t, SGLang, "testdata/synthetic/sglang_reasoning_tokens.sse")
	u, ok := res.n.Usage()
	if !ok || u.ReasoningTokens == nil || *u.ReasoningTokens != 9 || u.CachedTokens != nil || u.TotalTokens != 25 {
		t.Fatalf("usage %+v", u)
	}
	if !bytes.Contains(res.out, []byte(`"completion_tokens_details":{"reasoning_tokens":9}`)) {
		t.Fatalf("reasoning tokens not in the usage chunk:\n%s", res.out)
	}
	acc := accumulate(t, res.out)
	if acc[0].reasoning != "Hmm, a greeting." || acc[0].content != "Hello!" {
		t.Fatalf("accumulated %+v", acc[0])
	}
}

func TestStreamOpenRouter(t *testing.T) {
	res := runFile(t, OpenRouter, "testdata/synthetic/openrouter_usage_cost.sse")
	if res.failure != nil {
		t.Fatal(res.failure)
	}
	u, _ := res.n.Usage()
	if u.PromptTokens != 11 || u.CompletionTokens != 20 || *u.ReasoningTokens != 12 || *u.CachedTokens != 0 {
		t.Fatalf("usage %+v", u)
	}
	if bytes.Contains(res.out, []byte("OPENROUTER")) || bytes.Contains(res.out, []byte("0.0000412")) || bytes.Contains(res.out, []byte("Fireworks")) {
		t.Fatalf("comment, upstream cost or provider forwarded:\n%s", res.out)
	}
	if !bytes.Contains(res.out, []byte(`"reasoning_details":[{"type":"reasoning.text"`)) {
		t.Fatalf("reasoning_details dropped:\n%s", res.out)
	}

	res = runFile(t, OpenRouter, "testdata/synthetic/openrouter_midstream_error.sse")
	if res.failure == nil || res.failure.Code != tollgate.CodeUpstreamError {
		t.Fatalf("failure = %v", res.failure)
	}
	if strings.Contains(res.failure.Message, "together") || strings.Contains(string(res.out), "api.together.xyz") {
		t.Fatalf("upstream host leaked: %s", res.out)
	}
	if res.n.DeliveredBytes() != 3 || accumulate(t, res.out)[0].content != "Hel" {
		t.Fatalf("delivered %d", res.n.DeliveredBytes())
	}
	if !bytes.HasSuffix(res.out, []byte(`"code":"upstream_error"}}`+"\n\n")) {
		t.Fatalf("does not end with the error event:\n%s", res.out)
	}
}

func TestStreamLlamaCppErrorEvent(t *testing.T) {
	res := runFile(t, LlamaCpp, "testdata/synthetic/llamacpp_error_event.sse")
	if res.failure == nil || res.failure.Code != tollgate.CodeUpstreamError || strings.Contains(res.failure.Message, "KV") {
		t.Fatalf("failure = %#v", res.failure)
	}
	if res.failure.Err == nil || !strings.Contains(res.failure.Err.Error(), "KV size") {
		t.Fatalf("upstream cause not kept for the log: %v", res.failure.Err)
	}
	res = runFile(t, LlamaCpp, "testdata/synthetic/llamacpp_error_event_context.sse")
	if res.failure == nil || res.failure.Code != tollgate.CodeContextLengthExceeded ||
		!strings.Contains(res.failure.Message, "1200") || !strings.Contains(res.failure.Message, "1024") {
		t.Fatalf("failure = %#v", res.failure)
	}
	res = runFile(t, VLLM, "testdata/synthetic/vllm_error_object.sse")
	if res.failure == nil || res.failure.Code != tollgate.CodeUpstreamError || strings.Contains(string(res.out), "10.0.0.7") {
		t.Fatalf("failure = %#v\n%s", res.failure, res.out)
	}
	res = runFile(t, VLLM, "testdata/synthetic/vllm_truncated.sse")
	if res.failure == nil || res.failure.Code != tollgate.CodeUpstreamError {
		t.Fatalf("truncated stream: failure = %#v", res.failure)
	}
}

func TestStreamToolCallFixes(t *testing.T) {
	res := runFile(t, VLLM, "testdata/synthetic/vllm_tool_calls_noindex.sse")
	if !bytes.Contains(res.out, []byte(`"tool_calls":[{"index":0,"id":"call_a1","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"},"type":"function"},{"index":1,"id":"call_b2","type":"function"`)) {
		t.Fatalf("index/type not added:\n%s", res.out)
	}
	acc := accumulate(t, res.out)[0]
	if acc.toolNames[1] != "get_time" || acc.toolArgs[0] != `{"city": "Paris"}` {
		t.Fatalf("accumulated %+v", acc)
	}
}

func TestStreamTwoChoices(t *testing.T) {
	res := runFile(t, OpenAI, "testdata/synthetic/openai_two_choices_tools.sse")
	acc := accumulate(t, res.out)
	if acc[0].toolArgs[0] != `{"city":"Paris"}` || acc[0].toolNames[1] != "get_time" || acc[0].finish != "tool_calls" {
		t.Fatalf("choice 0 %+v", acc[0])
	}
	if acc[1].content != "Café 😀" || acc[1].finish != "stop" {
		t.Fatalf("choice 1 %+v", acc[1])
	}
	// choice 1's first delta gets its role; choice 0's second delta does not.
	if !bytes.Contains(res.out, []byte(`{"index":1,"delta":{"role":"assistant","content":"Caf\u00e9 \ud83d\ude00"}`)) {
		t.Fatalf("role not added to choice 1's first delta:\n%s", res.out)
	}
	if bytes.Count(res.out, []byte(`"role":"assistant"`)) != 2 {
		t.Fatalf("role sent %d times", bytes.Count(res.out, []byte(`"role":"assistant"`)))
	}
	if !bytes.Contains(res.out, []byte(`"service_tier":"default","obfuscation":"k3"}`)) {
		t.Fatalf("unknown fields not passed through:\n%s", res.out)
	}
	// Café 😀 is 10 bytes; names 11+8; arguments 16+2.
	if got, want := res.n.DeliveredBytes(), int64(10+11+8+16+2); got != want {
		t.Fatalf("delivered %d, want %d", got, want)
	}
	u, _ := res.n.Usage()
	if *u.CachedTokens != 64 || *u.ReasoningTokens != 0 {
		t.Fatalf("usage %+v", u)
	}
}

func TestChunkErrorKeyNull(t *testing.T) {
	n := &StreamNormalizer{ID: testID, Model: testModel}
	out, err := n.Chunk([]byte(`{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}],"error":null,"usage":null}`))
	if err != nil || out == nil {
		t.Fatalf("out %s err %v", out, err)
	}
	if bytes.Contains(out, []byte("error")) || bytes.Contains(out, []byte("usage")) {
		t.Fatalf("error/usage key forwarded: %s", out)
	}
}

func TestChunkMalformed(t *testing.T) {
	for _, in := range []string{``, `{`, `[1]`, `"x"`, `{"choices":[}`, `{"choices":[{"delta":{"content":"a}}]}`, `{"a":1}x`, `{"choices":[1]}`, `{"a":1,}`} {
		n := &StreamNormalizer{ID: testID, Model: testModel}
		out, err := n.Chunk([]byte(in))
		var te *tollgate.Error
		if out != nil || !errors.As(err, &te) || te.Code != tollgate.CodeUpstreamError {
			t.Errorf("Chunk(%q) = %s, %v", in, out, err)
		}
	}
}

func TestChunkDropsEmpty(t *testing.T) {
	n := &StreamNormalizer{ID: testID, Model: testModel}
	for _, in := range []string{`{"id":"x","choices":[]}`, `{"id":"x"}`, `{"choices":null,"usage":{"prompt_tokens":1,"completion_tokens":2}}`} {
		out, err := n.Chunk([]byte(in))
		if out != nil || err != nil {
			t.Errorf("Chunk(%s) = %s, %v", in, out, err)
		}
	}
	if u, ok := n.Usage(); !ok || u.TotalTokens != 3 {
		t.Fatalf("usage %+v", u)
	}
}

func TestUsageChunkAndErrorEvent(t *testing.T) {
	n := &StreamNormalizer{ID: testID, Model: testModel}
	n.Chunk([]byte(`{"created":1700000000,"choices":[{"index":0,"delta":{"content":"a"}}]}`))
	cached, reasoning := int64(5), int64(7)
	cost := tollgate.MustParseAmount("0.000123000001")
	got := string(n.UsageChunk(Usage{PromptTokens: 10, CompletionTokens: 20, TotalTokens: 30, CachedTokens: &cached, ReasoningTokens: &reasoning}, &cost))
	want := `{"id":"` + testID + `","object":"chat.completion.chunk","created":1700000000,"model":"tg-chat","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30,"prompt_tokens_details":{"cached_tokens":5},"completion_tokens_details":{"reasoning_tokens":7},"cost":"0.000123000001"}}`
	if got != want {
		t.Fatalf("UsageChunk\n got %s\nwant %s", got, want)
	}
	ev := string(ErrorEvent(&tollgate.Error{Code: tollgate.CodeContextLengthExceeded, Message: `too "long"`, Param: "messages"}))
	if ev != `{"error":{"message":"too \"long\"","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}` {
		t.Fatalf("ErrorEvent %s", ev)
	}
	ev = string(ErrorEvent(&tollgate.Error{Code: tollgate.CodeUpstreamError, Message: "x\n"}))
	if ev != `{"error":{"message":"x\n","type":"server_error","param":null,"code":"upstream_error"}}` {
		t.Fatalf("ErrorEvent %s", ev)
	}
}

func TestEventNames(t *testing.T) {
	n := &StreamNormalizer{ID: testID, Model: testModel}
	if out, err := n.Event(Event{Comment: true, Data: []byte("keep-alive")}); out != nil || err != nil {
		t.Fatal("comment forwarded")
	}
	if out, err := n.Event(Event{Name: "ping", Data: []byte(`{"choices":[{"index":0,"delta":{}}]}`)}); out != nil || err != nil {
		t.Fatal("unknown event forwarded")
	}
	if _, err := n.Event(Event{Name: "error", Data: []byte(`{"message":"boom"}`)}); tollgate.ErrorCode(err) != tollgate.CodeUpstreamError {
		t.Fatalf("event: error gave %v", err)
	}
	if _, err := n.Event(Event{Name: "error"}); tollgate.ErrorCode(err) != tollgate.CodeUpstreamError {
		t.Fatalf("empty event: error gave %v", err)
	}
	if _, err := n.Event(Event{Data: []byte(" [DONE]")}); !errors.Is(err, ErrDone) || !n.Done() {
		t.Fatalf("[DONE] gave %v", err)
	}
	if out, err := n.Event(Event{Name: "message", Data: []byte(`{"choices":[{"index":0,"delta":{"content":"x"}}]}`)}); out == nil || err != nil {
		t.Fatalf("message event: %s %v", out, err)
	}
}

func TestCreatedFallsBackToNow(t *testing.T) {
	n := &StreamNormalizer{ID: testID, Model: testModel}
	out, _ := n.Chunk([]byte(`{"choices":[{"index":0,"delta":{"content":"x"}}]}`))
	if n.Created() < 1700000000 {
		t.Fatalf("created %d", n.Created())
	}
	if !bytes.Contains(out, []byte(`"created":`+strconv.FormatInt(n.Created(), 10))) {
		t.Fatalf("%s", out)
	}
	// later chunks with their own created keep the first value
	out, _ = n.Chunk([]byte(`{"created":5,"choices":[{"index":0,"delta":{"content":"y"}}]}`))
	if bytes.Contains(out, []byte(`"created":5`)) {
		t.Fatalf("created changed: %s", out)
	}
}

// streamSeeds returns every data payload of the stream fixtures.
func streamSeeds(t testing.TB) [][]byte {
	var seeds [][]byte
	for _, c := range streamCases(t) {
		r := NewEventReader(bytes.NewReader(c.body))
		for {
			ev, err := r.Next()
			if err != nil {
				break
			}
			seeds = append(seeds, append([]byte(nil), ev.Data...))
		}
	}
	return seeds
}

func FuzzStreamChunk(f *testing.F) {
	for _, s := range streamSeeds(f) {
		f.Add(s)
	}
	f.Add([]byte(`{"choices":[{"delta":{"reasoning":null,"reasoning_content":"x","tool_calls":[{"id":"a"}]}}],"choices":[]}`))
	f.Add([]byte(`{"\u0065rror":{"message":"x"},"choices":[{"index":0,"delta":{}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		n := &StreamNormalizer{ID: testID, Model: testModel, Flavour: VLLM}
		for round := 0; round < 2; round++ { // twice: the second call runs with state
			out, err := n.Chunk(data)
			if err != nil {
				var te *tollgate.Error
				if !errors.As(err, &te) || out != nil || te.Message == "" {
					t.Fatalf("error %v (%T) with out %q", err, err, out)
				}
				continue
			}
			if out == nil {
				continue
			}
			if !json.Valid(out) {
				t.Fatalf("invalid JSON out of %q:\n%s", data, out)
			}
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(out, &obj); err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{"error", "usage", "system_fingerprint"} {
				if _, ok := obj[k]; ok {
					t.Fatalf("%q key forwarded: %s", k, out)
				}
			}
			if string(obj["id"]) != `"`+testID+`"` {
				t.Fatalf("id: %s", out)
			}
		}
		u := n.FinalUsage(1)
		if uc := n.UsageChunk(u, nil); !json.Valid(uc) {
			t.Fatalf("invalid usage chunk %s", uc)
		}
		if u.TotalTokens != u.PromptTokens+u.CompletionTokens || u.PromptTokens < 0 || u.CompletionTokens < 0 {
			t.Fatalf("usage %+v", u)
		}
	})
}

// BenchmarkChunk normalises one typical content delta (vLLM shape), as the
// relay does once per token: by the full walk of the chunk, and by the chunk
// template (the path every token after the first two takes).
func BenchmarkChunk(b *testing.B) {
	for _, bc := range []struct {
		name string
		data string
	}{
		{"vllm_content", `{"id":"chatcmpl-9f1c2a","object":"chat.completion.chunk","created":1795400000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"content":" world"},"logprobs":null,"finish_reason":null}]}`},
		{"llamacpp_reasoning", `{"choices":[{"finish_reason":null,"index":0,"delta":{"reasoning_content":" Hmm"}}],"created":1795405806,"id":"chatcmpl-cQ30H6ob4AGVoVoe5SGD31uKEpvStFnf","model":"/models/tiny-thinking.gguf","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}`},
		{"llamacpp_toolcall_piece", `{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"city"}}]}}],"created":1795405798,"id":"chatcmpl-mYB1DisTTidGshYY5SzYyCjCDya3Xyts","model":"/models/tiny-chat.gguf","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}`},
		{"openai_usage_null", `{"id":"chatcmpl-Bx1","object":"chat.completion.chunk","created":1795400400,"model":"gpt-4.1-2025-04-14","service_tier":"default","system_fingerprint":"fp_51e1070cf2","choices":[{"index":0,"delta":{"content":" question"},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"k3"}`},
	} {
		for _, path := range []string{"full", "template"} {
			b.Run(bc.name+"/"+path, func(b *testing.B) {
				data := []byte(bc.data)
				n := &StreamNormalizer{ID: testID, Model: testModel, Flavour: VLLM, noTemplate: path == "full"}
				for range 2 { // the second makes the template
					if _, err := n.Chunk(data); err != nil {
						b.Fatal(err)
					}
				}
				b.SetBytes(int64(len(data)))
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if out, err := n.Chunk(data); err != nil || out == nil {
						b.Fatal(err)
					}
				}
				if path == "template" && n.templated < b.N {
					b.Fatalf("%d of %d chunks took the template", n.templated, b.N)
				}
			})
		}
	}
}

// BenchmarkStream runs a whole captured stream (llama.cpp, 22 tool-call
// pieces) through EventReader and StreamNormalizer, as the relay does.
func BenchmarkStream(b *testing.B) {
	body := readCapture(b, "testdata/captures/llamacpp/52_think_tools_stream.http").body
	r := NewEventReader(bytes.NewReader(body))
	var buf []byte
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	var n StreamNormalizer
	for i := 0; i < b.N; i++ {
		r.Reset(bytes.NewReader(body))
		n.Reset(testID, testModel, LlamaCpp) // as the relay does: pooled
		for {
			ev, err := r.Next()
			if err != nil {
				break
			}
			out, err := n.Event(ev)
			if err != nil {
				break
			}
			if out != nil {
				buf = AppendData(buf[:0], out)
			}
		}
		buf = AppendData(buf[:0], n.UsageChunk(n.FinalUsage(10), nil))
	}
}

// TestStreamSGLangNullFields: SGLang dumps every delta field, null when unset
// (role, content, reasoning_content, tool_calls; tool-call pieces after the
// first with a null id and name), and matched_stop on every choice.
func TestStreamSGLangNullFields(t *testing.T) {
	res := runFile(t, SGLang, "testdata/synthetic/sglang_null_fields_tools.sse")
	if res.failure != nil {
		t.Fatal(res.failure)
	}
	acc := accumulate(t, res.out)[0]
	if acc.reasoning != "Weather, so a tool." || acc.toolNames[0] != "get_weather" ||
		acc.toolArgs[0] != `{"city": "Paris"}` || acc.toolIDs[0] != "call_0a1b2c" || acc.finish != "tool_calls" {
		t.Fatalf("accumulated %+v", acc)
	}
	if bytes.Contains(res.out, []byte("matched_stop")) || bytes.Contains(res.out, []byte("reasoning_content")) {
		t.Fatalf("matched_stop or reasoning_content forwarded:\n%s", res.out)
	}
	if n := bytes.Count(res.out, []byte(`"role":"assistant"`)); n != 1 {
		t.Fatalf("role sent %d times:\n%s", n, res.out)
	}
	u, _ := res.n.Usage()
	if u.ReasoningTokens == nil || *u.ReasoningTokens != 6 || u.TotalTokens != 110 {
		t.Fatalf("usage %+v", u)
	}
}

// TestStreamRoleNull: a first delta whose role is null (SGLang's dump of an
// unset field) still gets role "assistant", once, and no "role":null.
func TestStreamRoleNull(t *testing.T) {
	n := &StreamNormalizer{ID: testID, Model: testModel}
	out, err := n.Chunk([]byte(`{"choices":[{"index":0,"delta":{"role":null,"content":"Hi","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}`))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Count(out, []byte(`"role"`)) != 1 || !bytes.Contains(out, []byte(`"delta":{"role":"assistant","content":"Hi"`)) {
		t.Fatalf("first delta: %s", out)
	}
	out, err = n.Chunk([]byte(`{"choices":[{"index":0,"delta":{"role":null,"content":" there"},"finish_reason":null}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(out, []byte(`"role":"assistant"`)) {
		t.Fatalf("role repeated: %s", out)
	}
}

// TestStreamErrorSpaced: vLLM and SGLang write their mid-stream error event
// with json.dumps (", " and ": " separators), then [DONE].
func TestStreamErrorSpaced(t *testing.T) {
	res := runFile(t, VLLM, "testdata/synthetic/vllm_error_spaced.sse")
	if res.failure == nil || res.failure.Code != tollgate.CodeUpstreamError {
		t.Fatalf("vllm: failure = %#v\n%s", res.failure, res.out)
	}
	if accumulate(t, res.out)[0].content != "Hel" || bytes.Contains(res.out, []byte("[DONE]")) {
		t.Fatalf("vllm: %s", res.out)
	}
	res = runFile(t, SGLang, "testdata/synthetic/sglang_error_spaced.sse")
	if res.failure == nil || res.failure.Code != tollgate.CodeContextLengthExceeded || !strings.Contains(res.failure.Message, "8192") {
		t.Fatalf("sglang: failure = %#v\n%s", res.failure, res.out)
	}
}

// The stream's own count is one token per streamed piece (a piece of up to
// 16 bytes), not bytes / 4: llama.cpp streaming "<tool_call>\n" 32 times as
// content (capture 22's text; the server counted 64 tokens) counts 64, where
// bytes / 4 gives 96. Template and full path count alike.
func TestStreamTokensCountPieces(t *testing.T) {
	chunk := func(content string, finish string) string {
		return `{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"finish_reason":` + finish +
			`,"index":0,"delta":{"content":` + strconv.Quote(content) + `}}]}`
	}
	for _, tmpl := range []bool{true, false} {
		var n StreamNormalizer
		n.Reset("id", "m", LlamaCpp)
		n.noTemplate = !tmpl
		for i := 0; i < 32; i++ {
			for _, p := range []string{"<tool_call>", "\n"} {
				if _, err := n.Chunk([]byte(chunk(p, "null"))); err != nil {
					t.Fatal(err)
				}
			}
		}
		if _, err := n.Chunk([]byte(chunk("", `"length"`))); err != nil {
			t.Fatal(err)
		}
		if got := n.StreamTokens(); got != 64 {
			t.Fatalf("template %v: %d tokens, want 64 (bytes/4 would say %d)", tmpl, got, EstimateTokensN(n.DeliveredBytes()))
		}
		if tmpl && n.templated == 0 {
			t.Fatal("the template path never ran")
		}
		// A long piece is several tokens sent together; stop adds the end of turn.
		if _, err := n.Chunk([]byte(chunk(strings.Repeat("a", 40), `"stop"`))); err != nil {
			t.Fatal(err)
		}
		if got := n.StreamTokens(); got != 64+10+1 {
			t.Fatalf("after a 40-byte piece and stop: %d, want 75", got)
		}
	}
}
