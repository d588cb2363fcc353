package relay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/search"
)

// A scripted model server for the search loop's unit tests: asked with the
// search function offered and no tool result yet, it calls web_search (and
// the client's function "lookup" when the question says so); given results,
// it answers citing the first result by a markdown link and the second by
// number. Answers in the OpenAI shape, streamed or not, with usage.
type scriptedModel struct {
	mu     sync.Mutex
	bodies []map[string]any
	usages [][2]int     // prompt and completion tokens of each answer (recorded with the bodies)
	busy   atomic.Int64 // nanoseconds spent answering (the model's own time)
	record bool         // keep the request bodies (tests; not benchmarks)
}

func (sm *scriptedModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	defer func() { sm.busy.Add(int64(time.Since(start))) }()
	raw, _ := io.ReadAll(r.Body)
	var req map[string]any
	_ = json.Unmarshal(raw, &req)
	if sm.record {
		sm.mu.Lock()
		sm.bodies = append(sm.bodies, req)
		sm.mu.Unlock()
	}
	msgs, _ := req["messages"].([]any)
	last, _ := msgs[len(msgs)-1].(map[string]any)
	offered := false
	tools, _ := req["tools"].([]any)
	for _, t := range tools {
		fn, _ := t.(map[string]any)["function"].(map[string]any)
		if fn["name"] == search.ToolName {
			offered = true
		}
	}
	var content string
	var calls []map[string]any
	firstUser := ""
	for _, m := range msgs {
		mm := m.(map[string]any)
		if mm["role"] == "user" {
			firstUser, _ = mm["content"].(string)
			break
		}
	}
	if offered && last["role"] != "tool" {
		content = ""
		if strings.Contains(firstUser, "preface") {
			content = "Let me look that up."
		}
		calls = append(calls, map[string]any{"id": "c1", "type": "function",
			"function": map[string]any{"name": search.ToolName, "arguments": `{"query":"tollgate news"}`}})
		if strings.Contains(firstUser, "twice") {
			calls = append(calls, map[string]any{"id": "c2", "type": "function",
				"function": map[string]any{"name": search.ToolName, "arguments": `{"query":"more news"}`}})
		}
		if strings.Contains(firstUser, "lookup") {
			calls = append(calls, map[string]any{"id": "c3", "type": "function",
				"function": map[string]any{"name": "lookup", "arguments": `{"x":1}`}})
		}
	} else {
		var urls []string
		for _, m := range msgs {
			mm := m.(map[string]any)
			if mm["role"] != "tool" {
				continue
			}
			for _, line := range strings.Split(mm["content"].(string), "\n") {
				if u, ok := strings.CutPrefix(line, "URL: "); ok {
					urls = append(urls, u)
				}
			}
		}
		content = "Café ☕ 🌍 answer"
		if len(urls) > 0 {
			content += " see [the news](" + urls[0] + ")"
		}
		if len(urls) > 1 {
			content += " and [2]."
		}
	}
	finish := "stop"
	if len(calls) > 0 {
		finish = "tool_calls"
	}
	prompt := len(raw) / 4
	completion := len(content)/4 + 3*len(calls) + 1
	if strings.Contains(firstUser, "nousage") {
		prompt, completion = 0, 0 // a server that reports no tokens
	}
	if sm.record {
		sm.mu.Lock()
		sm.usages = append(sm.usages, [2]int{prompt, completion})
		sm.mu.Unlock()
	}
	if req["stream"] == true {
		w.Header().Set("Content-Type", "text/event-stream")
		bw := bufio.NewWriter(w)
		send := func(v any) {
			b, _ := json.Marshal(v)
			fmt.Fprintf(bw, "data: %s\n\n", b)
		}
		chunk := func(delta map[string]any, fin any) map[string]any {
			return map[string]any{"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "up",
				"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": fin}}}
		}
		send(chunk(map[string]any{"role": "assistant", "content": ""}, nil))
		for _, piece := range splitEvery(content, 5) {
			send(chunk(map[string]any{"content": piece}, nil))
		}
		for i, c := range calls {
			fn := c["function"].(map[string]any)
			send(chunk(map[string]any{"tool_calls": []any{map[string]any{"index": i, "id": c["id"], "type": "function",
				"function": map[string]any{"name": fn["name"], "arguments": ""}}}}, nil))
			send(chunk(map[string]any{"tool_calls": []any{map[string]any{"index": i,
				"function": map[string]any{"arguments": fn["arguments"]}}}}, nil))
		}
		send(chunk(map[string]any{}, finish))
		send(map[string]any{"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "up", "choices": []any{},
			"usage": map[string]any{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}})
		fmt.Fprint(bw, "data: [DONE]\n\n")
		bw.Flush()
		return
	}
	msg := map[string]any{"role": "assistant", "content": content}
	if len(calls) > 0 {
		msg["tool_calls"] = calls
		if content == "" {
			msg["content"] = nil
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"id": "x", "object": "chat.completion", "created": 1, "model": "up",
		"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish}},
		"usage":   map[string]any{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}})
}

func splitEvery(s string, n int) []string {
	var out []string
	r := []rune(s)
	for len(r) > 0 {
		k := min(n, len(r))
		out = append(out, string(r[:k]))
		r = r[k:]
	}
	return out
}

// fakeSearcher answers every query with three results, or fails.
type fakeSearcher struct {
	calls    atomic.Int64
	fail     bool
	onSearch func() // runs at each search (a test's clock moves on)
}

func (f *fakeSearcher) SupportsLocation() bool { return false }

func (f *fakeSearcher) Search(ctx context.Context, q search.Query) ([]search.Result, error) {
	n := f.calls.Add(1)
	if f.onSearch != nil {
		f.onSearch()
	}
	if f.fail {
		return nil, &tollgate.Error{Code: tollgate.CodeSearchUnavailable, Message: "the web search provider failed"}
	}
	var out []search.Result
	for i := 1; i <= 3; i++ {
		out = append(out, search.Result{URL: fmt.Sprintf("https://r%d-%d.example/", n, i), Title: fmt.Sprintf("Result %d", i), Content: "text"})
	}
	return out, nil
}

// fakeBiller records the charge, and the charges so far a stream records
// (a biller with a charge journal: progressRecorder).
type fakeBiller struct {
	traffic  countTraffic
	mu       sync.Mutex
	held     tollgate.Amount
	charges  []tollgate.Charge
	progress []tollgate.Charge
	release  int
}

type countTraffic struct{ n atomic.Int64 }

func (c *countTraffic) Add(tollgate.BackendClass) { c.n.Add(1) }

func (b *fakeBiller) Hold(ctx context.Context, req tollgate.HoldRequest) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held = req.Amount
	return "h1", nil
}

func (b *fakeBiller) Settle(ctx context.Context, holdID string, c tollgate.Charge) (tollgate.Amount, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.charges = append(b.charges, c)
	return c.Cost, nil
}

func (b *fakeBiller) Progress(holdID string, c tollgate.Charge) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.progress = append(b.progress, c)
	return true
}

func (b *fakeBiller) Release(ctx context.Context, holdID string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.release++
	return nil
}

func searchRelay(t *testing.T, s Searcher) (*Relay, *scriptedModel, *fakeBiller) {
	t.Helper()
	sm := &scriptedModel{record: true}
	ts := httptest.NewServer(sm)
	t.Cleanup(ts.Close)
	// A search provider is configured (price 0.01 USD, at most 3 searches a
	// request); the model runs at 1 and 2 USD per million tokens.
	m := netModel("m", "up", 100000, 1000, tollgate.NewCapabilities(tollgate.CapTools), NodeSpec{Name: "n", URL: ts.URL + "/v1"})
	m.SearchPrice = tollgate.MustParseAmount("0.01")
	m.Backends[0].Prices = tollgate.Prices{Input: tollgate.MustParseRate("1"), Output: tollgate.MustParseRate("2")}
	fb := &fakeBiller{}
	r := New(NewCatalog(CatalogSpec{Models: []ModelSpec{m}, WebSearch: true}, nil), Options{MaxSearches: 3}, Deps{Biller: fb, Search: s, Traffic: &fb.traffic})
	return r, sm, fb
}

func serveSearchRequest(t *testing.T, r *Relay, body string) (*httptest.ResponseRecorder, error) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
	w := httptest.NewRecorder()
	call := &Call{RequestID: "req_1", Body: []byte(body)}
	err := r.ServeChat(w, req, call)
	return w, err
}

func TestSearchLoopNonStreamed(t *testing.T) {
	fs := &fakeSearcher{}
	r, sm, fb := searchRelay(t, fs)
	w, err := serveSearchRequest(t, r, `{"model":"m","messages":[{"role":"user","content":"news twice"}],"web_search_options":{}}`)
	if err != nil {
		t.Fatal(err)
	}
	var resp struct {
		Choices []struct {
			Message struct {
				Content     string `json:"content"`
				Annotations []struct {
					Type        string `json:"type"`
					URLCitation struct {
						URL        string `json:"url"`
						StartIndex int    `json:"start_index"`
						EndIndex   int    `json:"end_index"`
					} `json:"url_citation"`
				} `json:"annotations"`
				ToolCalls []any `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int64  `json:"prompt_tokens"`
			CompletionTokens int64  `json:"completion_tokens"`
			Cost             string `json:"cost"`
			ServerToolUse    struct {
				WebSearchRequests int64 `json:"web_search_requests"`
			} `json:"server_tool_use"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &resp); err != nil {
		t.Fatalf("%v: %s", err, w.Body.String())
	}
	if fs.calls.Load() != 2 || len(sm.bodies) != 2 {
		t.Fatalf("searches %d, model calls %d; want 2 and 2", fs.calls.Load(), len(sm.bodies))
	}
	msg := resp.Choices[0].Message
	if resp.Choices[0].FinishReason != "stop" || len(msg.ToolCalls) != 0 {
		t.Fatalf("finish %q, tool calls %v", resp.Choices[0].FinishReason, msg.ToolCalls)
	}
	if len(msg.Annotations) != 2 {
		t.Fatalf("annotations %+v in %q", msg.Annotations, msg.Content)
	}
	runes := []rune(msg.Content)
	for _, a := range msg.Annotations {
		cited := string(runes[a.URLCitation.StartIndex:a.URLCitation.EndIndex])
		if !strings.Contains(cited, a.URLCitation.URL) && cited != "[2]" {
			t.Fatalf("annotation %+v slices %q", a, cited)
		}
	}
	// The second call saw the search function's results, numbered across searches.
	second := sm.bodies[1]
	msgs := second["messages"].([]any)
	if len(msgs) != 4 { // user, assistant with two calls, two tool results
		t.Fatalf("second call's messages: %d", len(msgs))
	}
	if got := msgs[3].(map[string]any)["content"].(string); !strings.Contains(got, "[4] Result 1") {
		t.Fatalf("second search's results are not numbered after the first's: %q", got)
	}
	// Usage is the sum of both calls; the cost adds two searches at 0.01.
	if len(fb.charges) != 1 {
		t.Fatalf("charges: %d", len(fb.charges))
	}
	c := fb.charges[0]
	if c.PromptTokens != resp.Usage.PromptTokens || c.CompletionTokens != resp.Usage.CompletionTokens {
		t.Fatalf("charge %+v vs usage %+v", c, resp.Usage)
	}
	prices := tollgate.Prices{Input: tollgate.Rate(1_000_000), Output: tollgate.Rate(2_000_000)}
	tokens, _ := prices.Cost(c.PromptTokens, c.CompletionTokens)
	if want := tokens + 2*tollgate.Amount(10_000_000_000); c.Cost != want || resp.Usage.Cost != want.String() {
		t.Fatalf("cost %s (shown %s), want %s", c.Cost, resp.Usage.Cost, want)
	}
	if c.Searches != 2 || c.SearchPrice != tollgate.Amount(10_000_000_000) {
		t.Fatalf("charge records %d searches at %s, want 2 at 0.01", c.Searches, c.SearchPrice)
	}
	if c.Cost > fb.held {
		t.Fatalf("charge %s above the hold %s", c.Cost, fb.held)
	}
	if n := fb.traffic.n.Load(); n != 1 {
		t.Fatalf("the request counted %d times in the traffic share", n)
	}
	if resp.Usage.ServerToolUse.WebSearchRequests != 2 {
		t.Fatalf("web_search_requests %d", resp.Usage.ServerToolUse.WebSearchRequests)
	}
}

func TestSearchLoopStreamedWithClientTool(t *testing.T) {
	fs := &fakeSearcher{}
	r, sm, fb := searchRelay(t, fs)
	w, err := serveSearchRequest(t, r, `{"model":"m","stream":true,"messages":[{"role":"user","content":"lookup"}],
		"tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object"}}}],"web_search_options":{}}`)
	if err != nil {
		t.Fatal(err)
	}
	if fs.calls.Load() != 1 || len(sm.bodies) != 1 {
		t.Fatalf("searches %d, model calls %d; want 1 and 1", fs.calls.Load(), len(sm.bodies))
	}
	body := w.Body.String()
	if !strings.Contains(body, `"name":"lookup"`) || !strings.Contains(body, `"finish_reason":"tool_calls"`) {
		t.Fatalf("the client's call or finish is missing: %s", body)
	}
	if strings.Contains(body, `"name":"web_search"`) {
		t.Fatalf("the search call reached the client: %s", body)
	}
	if !strings.HasSuffix(body, "data: [DONE]\n\n") || len(fb.charges) != 1 {
		t.Fatalf("stream end or charge missing (%d charges): %s", len(fb.charges), body)
	}
}

func TestSearchLoopProviderFailureChargesNothing(t *testing.T) {
	fs := &fakeSearcher{fail: true}
	r, _, fb := searchRelay(t, fs)
	_, err := serveSearchRequest(t, r, `{"model":"m","messages":[{"role":"user","content":"q"}],"web_search_options":{}}`)
	if tollgate.ErrorCode(err) != tollgate.CodeSearchUnavailable {
		t.Fatalf("error %v, want search_unavailable", err)
	}
	if len(fb.charges) != 0 || fb.release != 1 {
		t.Fatalf("charges %d, releases %d; want 0 and 1", len(fb.charges), fb.release)
	}
}

func TestSearchOffRefused(t *testing.T) {
	r, _, _ := searchRelay(t, nil)
	r.search = nil
	_, err := serveSearchRequest(t, r, `{"model":"m","messages":[{"role":"user","content":"q"}],"web_search_options":{}}`)
	var te *tollgate.Error
	if !errors.As(err, &te) || te.Code != tollgate.CodeCapabilityNotSupported || te.Param != "web_search_options" {
		t.Fatalf("error %v, want capability_not_supported on web_search_options", err)
	}
}

// A backend that reports no tokens still leaves the searches that ran to
// pay for: the request is charged their fee, not released.
func TestSearchFeesChargedWithoutTokens(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			r, _, fb := searchRelay(t, &fakeSearcher{})
			body := fmt.Sprintf(`{"model":"m","stream":%t,"messages":[{"role":"user","content":"nousage news"}],"web_search_options":{}}`, stream)
			if _, err := serveSearchRequest(t, r, body); err != nil {
				t.Fatal(err)
			}
			fb.mu.Lock()
			defer fb.mu.Unlock()
			if len(fb.charges) != 1 || fb.release != 0 {
				t.Fatalf("charges %d, releases %d; want the search charged", len(fb.charges), fb.release)
			}
			c := fb.charges[0]
			if c.Searches != 1 || c.PromptTokens != 0 || c.CompletionTokens != 0 || c.Cost != wantCost(t, c) || c.Cost <= 0 {
				t.Fatalf("charge %+v, want one search's fee and no tokens", c)
			}
		})
	}
}

// The search function's description tells the model the user's location
// when the provider cannot take it, and only then.
func TestSearchToolCarriesTheLocation(t *testing.T) {
	sr := &searchRequest{opts: search.Options{Location: &search.Location{Country: "DE", Region: "BE", City: "Berlin", Timezone: "Europe/Berlin"}}}
	if got := string(sr.searchTool(false)); !strings.Contains(got, "The user's approximate location: Berlin, BE, DE (time zone Europe/Berlin);") {
		t.Errorf("tool for a provider that cannot locate: %s", got)
	}
	if got := sr.searchTool(true); !bytes.Equal(got, search.ToolJSON()) {
		t.Errorf("tool for a provider that locates: %s, want the plain tool", got)
	}
	sr.opts.Location = &search.Location{}
	if got := sr.searchTool(false); !bytes.Equal(got, search.ToolJSON()) {
		t.Errorf("tool for an empty location: %s, want the plain tool", got)
	}
}
