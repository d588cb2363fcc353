package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf16"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/simulate"
)

// Web search end to end: tollgate serving the demo catalogue, the demo's
// simulated SearXNG and model servers whose models search and cite, driven
// by the official Go client over real HTTP (and the Node client below).

func searchParams(model, question, size string) openai.ChatCompletionNewParams {
	p := openai.ChatCompletionNewParams{
		Model:            model,
		Messages:         []openai.ChatCompletionMessageParamUnion{openai.UserMessage(question)},
		WebSearchOptions: openai.ChatCompletionNewParamsWebSearchOptions{SearchContextSize: size},
	}
	if size == "" {
		// An empty web_search_options object: the client omits a zero one.
		p.SetExtraFields(map[string]any{"web_search_options": map[string]any{}})
	}
	return p
}

// citedText slices content by an annotation's code-point indices, as a
// Python client does (content[start:end]).
func citedText(t *testing.T, content string, start, end int64) string {
	t.Helper()
	r := []rune(content)
	if start < 0 || end <= start || end > int64(len(r)) {
		t.Fatalf("annotation %d..%d outside the content's %d code points", start, end, len(r))
	}
	return string(r[start:end])
}

// checkCitation asserts that the cited text holds the URL (a markdown link
// or a bare URL) or is a [n] reference, and that the URL came from the search.
func checkCitation(t *testing.T, h *harness, cited, url string) {
	t.Helper()
	if !strings.Contains(cited, url) && !(strings.HasPrefix(cited, "[") && strings.HasSuffix(cited, "]") && len(cited) <= 4) {
		t.Fatalf("cited text %q holds neither %s nor [n]", cited, url)
	}
	if url == simulate.ForeignURL {
		t.Fatalf("a URL that no search returned was annotated: %s", url)
	}
}

// The ledger's charge for a request, by id.
func searchCharge(t *testing.T, h *harness, requestID string) tollgate.LedgerEntry {
	t.Helper()
	e := ledgerEntry(t, h.books(), requestID)
	if e.Charge == nil {
		t.Fatalf("ledger entry %s has no charge", requestID)
	}
	return e
}

func TestWebSearchNonStreamed(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	var hdr *http.Response
	r, err := h.client.Chat.Completions.New(context.Background(),
		searchParams("tg-chat", "What is new in Lisbon? [sim cite=all cite_foreign=1]", "medium"), option.WithResponseInto(&hdr))
	if err != nil {
		t.Fatal(err)
	}
	msg := r.Choices[0].Message
	if r.Choices[0].FinishReason != "stop" || len(msg.ToolCalls) != 0 {
		t.Fatalf("finish %q with %d tool calls: the search call leaked", r.Choices[0].FinishReason, len(msg.ToolCalls))
	}
	if len(msg.Annotations) < 3 {
		t.Fatalf("want a citation in each of the three forms, got %d: %q", len(msg.Annotations), msg.Content)
	}
	forms := map[string]bool{}
	for _, a := range msg.Annotations {
		c := a.URLCitation
		cited := citedText(t, msg.Content, c.StartIndex, c.EndIndex)
		checkCitation(t, h, cited, c.URL)
		switch {
		case strings.HasPrefix(cited, "[") && strings.Contains(cited, "]("):
			forms["markdown"] = true
		case strings.HasPrefix(cited, "http"):
			forms["url"] = true
		default:
			forms["number"] = true
		}
		if c.Title == "" {
			t.Fatalf("annotation without a title: %+v", c)
		}
	}
	if len(forms) != 3 {
		t.Fatalf("citation forms found: %v in %q", forms, msg.Content)
	}
	if !strings.Contains(msg.Content, simulate.ForeignURL) {
		t.Fatalf("the model's foreign URL is missing from the content: %q", msg.Content)
	}
	// The content holds multi-byte text before the citations: code points,
	// UTF-16 units and bytes all differ.
	if len(msg.Content) == len([]rune(msg.Content)) || len(utf16.Encode([]rune(msg.Content))) == len([]rune(msg.Content)) {
		t.Fatalf("the answer has no text beyond the BMP and ASCII to test indices on: %q", msg.Content)
	}

	// Usage is the sum of both backend calls, and the ledger agrees to the last digit.
	id := strings.TrimPrefix(r.ID, "chatcmpl-")
	e := searchCharge(t, h, id)
	c := e.Charge
	if c.PromptTokens != r.Usage.PromptTokens || c.CompletionTokens != r.Usage.CompletionTokens {
		t.Fatalf("ledger tokens %d/%d, usage %d/%d", c.PromptTokens, c.CompletionTokens, r.Usage.PromptTokens, r.Usage.CompletionTokens)
	}
	if c.Searches != 1 || c.SearchPrice.String() != "0.004" {
		t.Fatalf("ledger searches %d at %s, want 1 at 0.004", c.Searches, c.SearchPrice)
	}
	tokens, _ := c.Prices.Cost(c.PromptTokens, c.CompletionTokens)
	want := tokens + c.SearchPrice
	shown := r.Usage.JSON.ExtraFields["cost"].Raw()
	if c.Cost != want || -e.Amount != want || shown != `"`+want.String()+`"` || hdr.Header.Get("X-Tollgate-Cost") != want.String() {
		t.Fatalf("cost: ledger %s (amount %s), shown %s, header %s, want %s", c.Cost, -e.Amount, shown, hdr.Header.Get("X-Tollgate-Cost"), want)
	}
	// Two backend calls: the model's search call, then its answer.
	if got := h.sims["sglang"].Stats().Completed + h.sims["llamacpp"].Stats().Completed; got != 2 {
		t.Fatalf("backend calls: %d, want 2", got)
	}
	if st := h.search.Stats(); st.Requests != 1 {
		t.Fatalf("provider requests: %d, want 1", st.Requests)
	}
	mustAudit(t, h.books())
}

func TestWebSearchStreamed(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	stream := h.client.Chat.Completions.NewStreaming(context.Background(),
		searchParams("tg-coder", "Tell me about Porto [sim cite=all searches=2]", "high"))
	acc := openai.ChatCompletionAccumulator{}
	var content strings.Builder
	var anns []openai.ChatCompletionMessageAnnotation
	annotationsBeforeFinish := false
	shown := ""
	for stream.Next() {
		ch := stream.Current()
		acc.AddChunk(ch)
		if c, ok := ch.Usage.JSON.ExtraFields["cost"]; ok {
			shown = c.Raw()
		}
		for _, c := range ch.Choices {
			content.WriteString(c.Delta.Content)
			if raw, ok := c.Delta.JSON.ExtraFields["annotations"]; ok && raw.Raw() != "" {
				var a []openai.ChatCompletionMessageAnnotation
				if err := json.Unmarshal([]byte(raw.Raw()), &a); err != nil {
					t.Fatal(err)
				}
				anns = append(anns, a...)
				annotationsBeforeFinish = c.FinishReason == ""
			}
			if len(c.Delta.ToolCalls) > 0 {
				t.Fatalf("a tool call reached the client: %+v", c.Delta.ToolCalls)
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(anns) < 4 || !annotationsBeforeFinish {
		t.Fatalf("annotations %d (before the finish chunk: %v) in %q", len(anns), annotationsBeforeFinish, content.String())
	}
	for _, a := range anns {
		checkCitation(t, h, citedText(t, content.String(), a.URLCitation.StartIndex, a.URLCitation.EndIndex), a.URLCitation.URL)
	}
	if acc.Choices[0].FinishReason != "stop" {
		t.Fatalf("finish %q", acc.Choices[0].FinishReason)
	}
	// Two searches in one turn, both charged; the usage chunk equals the ledger.
	id := strings.TrimPrefix(acc.ID, "chatcmpl-")
	e := searchCharge(t, h, id)
	if e.Charge.Searches != 2 || e.Charge.PromptTokens != acc.Usage.PromptTokens || e.Charge.CompletionTokens != acc.Usage.CompletionTokens {
		t.Fatalf("ledger %+v vs usage %+v", e.Charge, acc.Usage)
	}
	if shown != `"`+e.Charge.Cost.String()+`"` {
		t.Fatalf("shown cost %s, ledger %s", shown, e.Charge.Cost)
	}
	// The high context size sent ten results per search to the model.
	results := h.lastToolResults(t, "vllm-a", "vllm-b")
	if n := strings.Count(results, "\nURL: "); n != 20 {
		t.Fatalf("results sent to the model for two high searches: %d, want 20", n)
	}
}

// lastToolResults returns the tool messages of the last request of the
// named simulators that had the most of them (the loop's last call).
func (h *harness) lastToolResults(t *testing.T, sims ...string) string {
	t.Helper()
	best := ""
	for _, name := range sims {
		r, ok := h.sim(name).LastRequest()
		if !ok {
			continue
		}
		var body struct {
			Messages []struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(r.Body, &body); err != nil {
			t.Fatalf("last request: %v", err)
		}
		var out strings.Builder
		for _, m := range body.Messages {
			if m.Role == "tool" {
				out.WriteString(m.Content)
				out.WriteString("\n")
			}
		}
		if out.Len() > len(best) {
			best = out.String()
		}
	}
	return best
}

func TestWebSearchContextSizes(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, tc := range []struct {
		size    string
		results int
		chars   int
	}{{"low", 3, 300}, {"medium", 5, 800}, {"", 5, 800}, {"high", 10, 2000}} {
		_, err := h.client.Chat.Completions.New(context.Background(), searchParams("flav-vllm", "sizes "+tc.size, tc.size))
		if err != nil {
			t.Fatalf("%s: %v", tc.size, err)
		}
		text := h.lastToolResults(t, "vllm")
		if n := strings.Count(text, "\nURL: "); n != tc.results {
			t.Fatalf("%q: %d results sent to the model, want %d:\n%s", tc.size, n, tc.results, text)
		}
		for _, line := range strings.Split(text, "\n") {
			if n := len([]rune(line)); n > tc.chars+20 && !strings.HasPrefix(line, "URL: ") {
				t.Fatalf("%q: a result line of %d characters, want at most about %d", tc.size, n, tc.chars)
			}
		}
	}
	// A size that does not exist is the client's error.
	_, err := h.client.Chat.Completions.New(context.Background(), searchParams("tg-chat", "q", "huge"))
	requireAPIError(t, err, 400, "invalid_request", "web_search_options.search_context_size")
}

func requireAPIError(t *testing.T, err error, status int, code, param string) *openai.Error {
	t.Helper()
	var ae *openai.Error
	if !errors.As(err, &ae) {
		t.Fatalf("want an API error %d %s, got %v", status, code, err)
	}
	if ae.StatusCode != status || ae.Code != code || (param != "" && ae.Param != param) {
		t.Fatalf("got %d code=%q param=%q (%s), want %d %s %s", ae.StatusCode, ae.Code, ae.Param, ae.Message, status, code, param)
	}
	return ae
}

func TestWebSearchWithClientTools(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	p := searchParams("tg-chat", "Weather in Faro? [sim tools=1]", "low")
	p.Tools = []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{
		Name: "get_weather", Parameters: openai.FunctionParameters{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}},
	})}
	r, err := h.client.Chat.Completions.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	c := r.Choices[0]
	if c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) != 1 || c.Message.ToolCalls[0].Function.Name != "get_weather" {
		t.Fatalf("want the client's own call back: finish %q, calls %+v", c.FinishReason, c.Message.ToolCalls)
	}
	// The search in the same turn ran first and is charged.
	if st := h.search.Stats(); st.Requests != 1 {
		t.Fatalf("provider requests %d, want 1", st.Requests)
	}
	if e := searchCharge(t, h, strings.TrimPrefix(r.ID, "chatcmpl-")); e.Charge.Searches != 1 {
		t.Fatalf("searches charged: %d", e.Charge.Searches)
	}
	// A client function named like tollgate's is refused.
	p.Tools = []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{Name: "web_search"})}
	_, err = h.client.Chat.Completions.New(context.Background(), p)
	requireAPIError(t, err, 400, "invalid_request", "tools[0].function.name")
}

func TestWebSearchRefusedWithoutTools(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	_, err := h.client.Chat.Completions.New(context.Background(), searchParams("tg-mini", "q", ""))
	requireAPIError(t, err, 400, "capability_not_supported", "web_search_options")
	if st := h.search.Stats(); st.Requests != 0 {
		t.Fatalf("a refused request searched")
	}
	// /v1/models lists web_search where it is served, with its price.
	_, _, body := h.get("/v1/models")
	var models struct {
		Data []struct {
			ID           string   `json:"id"`
			Capabilities []string `json:"capabilities"`
			Pricing      struct {
				WebSearch string `json:"web_search"`
			} `json:"pricing"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &models); err != nil {
		t.Fatal(err)
	}
	for _, m := range models.Data {
		has := strings.Contains(strings.Join(m.Capabilities, ","), "web_search")
		switch m.ID {
		case "tg-mini":
			if has || m.Pricing.WebSearch != "" {
				t.Fatalf("tg-mini lists web search: %+v", m)
			}
		case "tg-chat", "tg-coder":
			if !has || m.Pricing.WebSearch != "0.004" {
				t.Fatalf("%s: web search not listed with its price: %+v", m.ID, m)
			}
		}
	}
}

func TestWebSearchProviderFailures(t *testing.T) {
	h := newHarness(t, harnessOptions{search: "search:\n  provider: searxng\n  url: \"{{searxng}}\"\n  timeout: 500ms\n  price: \"0.004\"\n"})
	for _, fault := range []string{"500", "garbage", "hang"} {
		bal := h.balance(t)
		status, hdr, body := h.post("/v1/chat/completions",
			`{"model":"tg-chat","web_search_options":{},"messages":[{"role":"user","content":"news [sim search_fault=`+fault+`]"}]}`, nil)
		if status != 502 || !strings.Contains(string(body), `"code":"search_unavailable"`) {
			t.Fatalf("%s: %d %s", fault, status, body)
		}
		if strings.Contains(string(body), h.search.URL()) || strings.Contains(string(body), "127.0.0.1") {
			t.Fatalf("%s: the provider's address leaked: %s", fault, body)
		}
		if got := h.balance(t); got != bal {
			t.Fatalf("%s: balance moved %s -> %s: a failed search request was charged", fault, bal, got)
		}
		_ = hdr
	}
	// Streamed: nothing reached the client, so a plain 502 as well.
	status, _, body := h.post("/v1/chat/completions",
		`{"model":"tg-chat","stream":true,"web_search_options":{},"messages":[{"role":"user","content":"news [sim search_fault=500]"}]}`, nil)
	if status != 502 || !strings.Contains(string(body), "search_unavailable") {
		t.Fatalf("streamed: %d %s", status, body)
	}
	if err := h.search.WaitIdle(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	mustAudit(t, h.books())
}

// balance is the harness account's balance.
func (h *harness) balance(t *testing.T) tollgate.Amount {
	t.Helper()
	a, err := h.main.Store.Account(context.Background(), h.acct.ID)
	if err != nil {
		t.Fatal(err)
	}
	return a.Balance
}

func TestWebSearchMaxSearches(t *testing.T) {
	h := newHarness(t, harnessOptions{search: "search:\n  provider: searxng\n  url: \"{{searxng}}\"\n  max_searches: 2\n  price: \"0.004\"\n"})
	r, err := h.client.Chat.Completions.New(context.Background(), searchParams("flav-sglang", "keep going [sim search_turns=5]", "low"))
	if err != nil {
		t.Fatal(err)
	}
	if st := h.search.Stats(); st.Requests != 2 {
		t.Fatalf("searches run: %d, want max_searches = 2", st.Requests)
	}
	if r.Choices[0].FinishReason != "stop" || r.Choices[0].Message.Content == "" {
		t.Fatalf("no answer after the limit: %+v", r.Choices[0])
	}
	e := searchCharge(t, h, strings.TrimPrefix(r.ID, "chatcmpl-"))
	if e.Charge.Searches != 2 {
		t.Fatalf("searches charged %d", e.Charge.Searches)
	}
	// The model was told, and the last call no longer offered the function.
	last, _ := h.sim("sglang").LastRequest()
	if strings.Contains(string(last.Body), `"name":"web_search","description"`) {
		t.Fatalf("the call after the limit still offered web_search")
	}
	if !strings.Contains(string(last.Body), "No more searches are allowed") {
		t.Fatalf("the model was not told the limit was reached")
	}
}

func TestWebSearchNonStreamLimitCoversTheLoop(t *testing.T) {
	h := newHarness(t, harnessOptions{timeouts: "timeouts:\n  non_stream: 1500ms\n"})
	bal := h.balance(t)
	start := time.Now()
	// Each backend call waits 400 ms and each search is slow: no single step
	// reaches the limit, the loop does.
	status, _, body := h.post("/v1/chat/completions",
		`{"model":"flav-vllm","web_search_options":{},"messages":[{"role":"user","content":"slow [sim ttft=400ms search_turns=4 search_fault=slow]"}]}`, nil)
	if status != 504 || !strings.Contains(string(body), `"code":"timeout"`) {
		t.Fatalf("%d %s", status, body)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("the limit did not end the loop: %s", el)
	}
	if got := h.balance(t); got != bal {
		t.Fatalf("a timed-out request was charged: %s -> %s", bal, got)
	}
	if err := h.search.WaitIdle(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := h.sim("vllm").WaitIdle(5 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// A client that leaves while tollgate searches cancels the provider call;
// only what ran (the first backend call) is charged.
func TestWebSearchClientDisconnect(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, stream := range []bool{false, true} {
		h.search.Reset()
		ctx, cancel := context.WithCancel(context.Background())
		body := `{"model":"flav-vllm","stream":` + map[bool]string{false: "false", true: "true"}[stream] +
			`,"web_search_options":{},"messages":[{"role":"user","content":"leave [sim search_fault=hang]"}]}`
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.main.APIURL()+"/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+h.key)
		req.Header.Set("Content-Type", "application/json")
		done := make(chan string, 1)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				done <- resp.Header.Get("X-Request-Id")
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
				}
				resp.Body.Close()
				return
			}
			done <- ""
		}()
		if err := h.search.WaitStats(5*time.Second, func(s simulate.SearchStats) bool { return s.InFlight == 1 }); err != nil {
			t.Fatal(err)
		}
		cancel()
		if err := h.search.WaitStats(5*time.Second, func(s simulate.SearchStats) bool { return s.Cancelled == 1 }); err != nil {
			t.Fatalf("stream=%v: the provider call was not cancelled: %v", stream, err)
		}
		<-done
		if err := h.sim("vllm").WaitIdle(5 * time.Second); err != nil {
			t.Fatal(err)
		}
		// The charge: the first call's usage, no search.
		var got *tollgate.LedgerEntry
		deadline := time.Now().Add(5 * time.Second)
		for got == nil && time.Now().Before(deadline) {
			_ = h.books().Ledger(context.Background(), tollgate.UsageFilter{AccountID: h.acct.ID}, func(e tollgate.LedgerEntry) error {
				if e.Kind == tollgate.LedgerCharge && e.Charge != nil && e.Charge.Model == "flav-vllm" && e.Time.After(time.Now().Add(-10*time.Second)) {
					ee := e
					got = &ee
				}
				return nil
			})
			time.Sleep(20 * time.Millisecond)
		}
		if got == nil {
			t.Fatalf("stream=%v: nothing charged for the call that ran", stream)
		}
		if got.Charge.Searches != 0 || got.Charge.CompletionTokens == 0 {
			t.Fatalf("stream=%v: charge %+v: want the first call's tokens and no search", stream, got.Charge)
		}
		// Only one charge per request: clear for the next round.
		h.acct, h.keyRec, h.key = h.newKey(tollgate.Dollars(100), nil)
	}
	mustAudit(t, h.books())
}

func TestWebSearchStreamKeepAlive(t *testing.T) {
	h := newHarness(t, harnessOptions{timeouts: "timeouts:\n  keep_alive: 200ms\n",
		searchSim: simulate.SearchConfig{SlowDelay: time.Second}})
	resp := h.openChat(`{"model":"tg-chat","stream":true,"web_search_options":{},"messages":[{"role":"user","content":"wait [sim search_fault=slow]"}]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var keepAlives, contentBeforeDone int
	sc := bufio.NewScanner(resp.Body)
	sawDone := false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == ": keep-alive":
			keepAlives++
		case line == "data: [DONE]":
			sawDone = true
		case strings.Contains(line, `"content"`):
			contentBeforeDone++
		}
	}
	if keepAlives < 2 || !sawDone || contentBeforeDone == 0 {
		t.Fatalf("keep-alives %d, done %v, content chunks %d", keepAlives, sawDone, contentBeforeDone)
	}
}

// The same through the official Node client (npm's openai, tests/node):
// annotations sliced by code points in JavaScript, streamed and not. Runs
// when TOLLGATE_TEST_NODE is set (CI sets it and installs the client).
func TestWebSearchNodeClient(t *testing.T) {
	if os.Getenv("TOLLGATE_TEST_NODE") == "" {
		t.Skip("TOLLGATE_TEST_NODE not set (CI sets it; needs node and `npm ci --prefix tests/node`)")
	}
	dir, _ := filepath.Abs("../../tests/node")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai")); err != nil {
		t.Fatalf("the Node client is not installed: run npm ci --prefix tests/node (%v)", err)
	}
	h := newHarness(t, harnessOptions{})
	cmd := exec.Command("node", "websearch.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "OPENAI_BASE_URL="+h.main.APIURL(), "OPENAI_API_KEY="+h.key, "MODEL=tg-chat")
	out := runClient(t, cmd)
	var res struct {
		NonStream, Stream struct {
			Content   string `json:"content"`
			Citations []struct {
				URL, Cited string
			} `json:"citations"`
			Usage struct {
				Cost string `json:"cost"`
			} `json:"usage"`
		}
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, r := range []struct {
		name string
		n    int
	}{{"non-streamed", len(res.NonStream.Citations)}, {"streamed", len(res.Stream.Citations)}} {
		if r.n < 3 {
			t.Fatalf("%s: %d citations seen by the Node client", r.name, r.n)
		}
	}
	if res.Stream.Usage.Cost == "" || res.NonStream.Usage.Cost == "" {
		t.Fatalf("usage.cost missing: %s", out)
	}
	mustAudit(t, h.books())
}
