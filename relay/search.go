package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/openai"
	"github.com/tollgate/tollgate/search"
)

// Web search is served by tollgate, not by the model (docs/api.md, "Web search"): the
// model is offered a search function, tollgate runs the searches it asks
// for, feeds the results back and calls the same backend again until the
// model answers without searching. docs/api.md "Web search" is the client's
// view; docs/decisions.md lists the choices made here.

// Searcher runs web searches for the relay (*search.Service).
type Searcher interface {
	Search(ctx context.Context, q search.Query) ([]search.Result, error)
	SupportsLocation() bool
}

// Bounds on what one search loop sends back to the model. They make the
// hold's worst case computable before the first call (searchHold).
const (
	searchQueryMax   = 512  // bytes of a query sent to the provider and echoed to the model
	searchContentMax = 8192 // bytes of an intermediate turn's text echoed back to the model
	searchTitleMax   = 200  // code points of a result's title
	searchURLMax     = 2048 // bytes; results with a longer URL are dropped
	// searchCallEcho bounds one echoed search call in an assistant message:
	// id, name, the JSON-escaped query (6 bytes per byte at worst) and framing.
	searchCallEcho = 6*searchQueryMax + 160
	// searchMsgOverhead bounds a tool message's framing and a message's
	// template tokens.
	searchMsgOverhead = 160
)

// DefaultMaxSearches is search.max_searches when the config does not say.
const DefaultMaxSearches = 5

// searchResultBound is an upper bound of one formatted search result
// message's bytes for a context size.
func searchResultBound(size search.ContextSize) int64 {
	n, chars := search.Figures(size)
	perResult := int64(16 + 4*searchTitleMax + searchURLMax + 4*chars)
	return int64(160+searchQueryMax) + int64(n)*perResult
}

// searchRequest is one client request served with web search.
type searchRequest struct {
	x    *exchange
	opts search.Options
	max  int // searches allowed (search.max_searches)

	base        []byte // the upstream body of the first turn
	clientMsgs  []byte // the client's messages array
	clientTools []json.RawMessage
	toolChoice  []byte // the client's tool_choice, nil when absent
	toolJSON    []byte // the search function offered to the model

	// What the loop did so far.
	extra    []byte          // messages appended after the client's, comma-separated objects
	sources  []search.Source // numbered results, in order
	attempts int             // search calls answered (each counts against max)
	searches int64           // searches that ran (results from the provider or its cache)
	turns    int             // backend calls made
	usage    openai.Usage    // summed over the turns that answered
	content  strings.Builder // the answer's text as the client sees it
	callSeq  int
}

// turn is one backend call's answer, reduced to what the loop needs.
type turn struct {
	content     string
	reasoning   string
	searchCalls []toolCall
	clientCalls []toolCall
	finish      string
	usage       openai.Usage
	delivered   int64 // bytes of text forwarded to the client in this turn (streams)
	// Non-streamed: the normalised response and its choice's message, kept
	// for the final answer's other members.
	resp    map[string]json.RawMessage
	choice  map[string]json.RawMessage
	message map[string]json.RawMessage
}

type toolCall struct {
	Index    int    `json:"index"`
	ID       string `json:"id,omitempty"`
	Type     string `json:"type,omitempty"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
	raw json.RawMessage // non-streamed: the call as the backend sent it
}

// serveSearch runs a request with web_search_options on backend b (node
// acquired by the caller's route; it is released here).
func (r *Relay) serveSearch(w http.ResponseWriter, req *http.Request, call *Call, cr *openai.ChatRequest, m *Model, b *Backend, node *Node) error {
	x := &exchange{r: r, call: call, cr: cr, model: m, backend: b, node: node,
		promptEstimate: promptEstimate(cr, m), spanCtx: req.Context()}
	defer func() { x.node.Release() }()

	opts, err := search.ParseOptions(cr.WebSearch)
	if err != nil {
		return err
	}
	if f := cr.Field("functions"); f != nil && string(f) != "null" {
		return tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "functions",
			"the legacy functions field cannot be combined with web_search_options; send your functions as tools")
	}
	sr := &searchRequest{x: x, opts: opts, max: r.opts.MaxSearches}
	if err := sr.readClientTools(cr); err != nil {
		return err
	}
	sr.toolJSON = sr.searchTool(r.search.SupportsLocation())

	outCap := cr.MaxTokens
	if outCap == 0 {
		outCap = m.MaxOutputTokens
	}
	sr.base = cr.AppendUpstreamBody(nil, openai.UpstreamOptions{Model: b.UpstreamModel, Flavour: node.Flavour, MaxTokens: outCap, OneChoice: true})
	sr.clientMsgs = cr.Field("messages")

	if r.biller != nil {
		amount, tokens, err := sr.holdBound(outCap)
		if err != nil {
			return tollgate.ParamErrorf(tollgate.CodeInvalidRequest, maxTokensParam(cr), "the request's cost bound is out of range")
		}
		_, hs := r.span(req.Context(), "hold", trace.SpanKindInternal)
		x.holdID, err = r.biller.Hold(req.Context(), tollgate.HoldRequest{
			RequestID: call.RequestID, AccountID: call.Account.ID, KeyID: call.Key.ID, Model: m.ID,
			Class: b.Class, Amount: amount, TokenBound: tokens, Time: r.now(),
		})
		endSpan(hs, err)
		if err != nil {
			return err
		}
		defer x.releaseUnsettled()
	}
	if cr.Stream {
		return sr.stream(w, req)
	}
	return sr.nonStream(w, req)
}

// readClientTools keeps the client's tools and tool_choice, and refuses a
// client function that takes the search function's name.
func (sr *searchRequest) readClientTools(cr *openai.ChatRequest) error {
	if v := cr.Field("tool_choice"); v != nil && string(v) != "null" {
		sr.toolChoice = v
	}
	v := cr.Field("tools")
	if v == nil || string(v) == "null" {
		return nil
	}
	if err := json.Unmarshal(v, &sr.clientTools); err != nil {
		return tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "tools", "tools must be an array of tool objects")
	}
	for i, t := range sr.clientTools {
		var d struct {
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if json.Unmarshal(t, &d) == nil && d.Function.Name == search.ToolName {
			return tollgate.ParamErrorf(tollgate.CodeInvalidRequest, fmt.Sprintf("tools[%d].function.name", i),
				"the function name %q is tollgate's own web search function when web_search_options is set; rename your function", search.ToolName)
		}
	}
	if string(sr.toolChoice) == `"none"` {
		// The client wants none of its functions called: only the search
		// function is offered.
		sr.clientTools = nil
	}
	return nil
}

// searchTool is the search function as offered to this request's model. When
// the provider cannot take the user's location, the model is told it, so
// that it can put it in its queries.
func (sr *searchRequest) searchTool(providerLocates bool) []byte {
	loc := sr.opts.Location
	if loc == nil || providerLocates {
		return search.ToolJSON()
	}
	where := loc.String()
	if where == "" {
		return search.ToolJSON()
	}
	var tool struct {
		Type     string                     `json:"type"`
		Function map[string]json.RawMessage `json:"function"`
	}
	if json.Unmarshal(search.ToolJSON(), &tool) != nil {
		return search.ToolJSON()
	}
	var desc string
	_ = json.Unmarshal(tool.Function["description"], &desc)
	desc += " The user's approximate location: " + where + "; include it in a query when the answer depends on where the user is."
	tool.Function["description"], _ = json.Marshal(desc)
	out, err := json.Marshal(tool)
	if err != nil {
		return search.ToolJSON()
	}
	return out
}

// holdBound is the whole loop's worst case: the first call's prompt bound,
// then max_searches more calls whose prompts are bounded by what the loop
// can add (echoed calls and text, result messages, all capped above) and by
// the context length, each with the output cap; plus max_searches searches.
func (sr *searchRequest) holdBound(outCap int64) (tollgate.Amount, int64, error) {
	x, m := sr.x, sr.x.model
	first := min(promptBound(x.cr, m)+int64(len(sr.toolJSON))+searchMsgOverhead, m.ContextLength)
	maxS := int64(sr.max)
	added := maxS*(searchCallEcho+searchResultBound(sr.opts.Size)+searchMsgOverhead) +
		(maxS+1)*(searchContentMax+searchCallEcho+int64(len(search.LimitReachedMessage))+3*searchMsgOverhead)
	later := min(first+added, m.ContextLength)
	prompt := first + maxS*later
	output := (maxS + 1) * outCap
	amount, err := x.backend.Prices.Cost(prompt, output)
	if err != nil {
		return 0, 0, err
	}
	fees, err := tollgate.SearchFee(maxS, m.SearchPrice)
	if err != nil {
		return 0, 0, err
	}
	amount, err = amount.Add(fees)
	return amount, prompt + output, err
}

// body builds the next call's upstream body.
func (sr *searchRequest) body() []byte {
	msgs := sr.clientMsgs
	if len(sr.extra) > 0 {
		end := strings.LastIndexByte(string(msgs), ']')
		m := make([]byte, 0, len(msgs)+len(sr.extra)+2)
		m = append(m, msgs[:end]...)
		m = append(m, ',')
		m = append(m, sr.extra...)
		msgs = append(m, ']')
	}
	offerSearch := sr.attempts < sr.max
	var tools []byte
	if offerSearch || len(sr.clientTools) > 0 {
		tools = append(tools, '[')
		n := 0
		if offerSearch {
			tools = append(tools, sr.toolJSON...)
			n++
		}
		for _, t := range sr.clientTools {
			if n > 0 {
				tools = append(tools, ',')
			}
			tools = append(tools, t...)
			n++
		}
		tools = append(tools, ']')
	}
	var choice []byte
	switch {
	case tools == nil:
	case sr.turns == 0 && sr.toolChoice != nil && string(sr.toolChoice) != `"none"`:
		choice = sr.toolChoice // the client's choice rules the first call
	case string(sr.toolChoice) == `"none"`:
		choice = []byte(`"auto"`)
	case sr.toolChoice != nil:
		// "required" or a named function was honoured by the first call:
		// later calls may answer.
		choice = []byte(`"auto"`)
	}
	set := []openai.Member{{Key: "messages", Value: msgs}, {Key: "tools", Value: tools}, {Key: "tool_choice", Value: choice}}
	if tools == nil {
		set = append(set, openai.Member{Key: "parallel_tool_calls"})
	}
	out, _ := openai.ReplaceMembers(make([]byte, 0, len(sr.base)+len(sr.extra)+len(tools)+64), sr.base, set)
	return out
}

// promptEstimate counts the next call's prompt locally (for a backend that
// reports no usage): the client's prompt plus what the loop added.
func (sr *searchRequest) promptEstimate() int64 {
	return min(sr.x.promptEstimate+openai.EstimateTokensN(int64(len(sr.extra)+len(sr.toolJSON))), sr.x.model.ContextLength)
}

// addUsage sums one call's usage into the request's.
func (sr *searchRequest) addUsage(u openai.Usage) { sr.usage = sumUsage(sr.usage, u) }

// sumUsage is the usage of two backend calls together (cached and
// reasoning tokens counted when either reported them).
func sumUsage(a, b openai.Usage) openai.Usage {
	a.PromptTokens += b.PromptTokens
	a.CompletionTokens += b.CompletionTokens
	a.Estimated = a.Estimated || b.Estimated
	if b.CachedTokens != nil {
		v := *b.CachedTokens
		if a.CachedTokens != nil {
			v += *a.CachedTokens
		}
		a.CachedTokens = &v
	}
	if b.ReasoningTokens != nil {
		v := *b.ReasoningTokens
		if a.ReasoningTokens != nil {
			v += *a.ReasoningTokens
		}
		a.ReasoningTokens = &v
	}
	return a
}

// split sorts a call's tool calls into search calls and the client's. A call
// of the search function when it was not offered is dropped.
func (sr *searchRequest) split(t *turn, calls []toolCall, offered bool) {
	for _, c := range calls {
		switch {
		case c.Function.Name == search.ToolName && offered:
			t.searchCalls = append(t.searchCalls, c)
		case c.Function.Name == search.ToolName:
		default:
			t.clientCalls = append(t.clientCalls, c)
		}
	}
}

// runSearches answers a turn's search calls: the ones within the limit run
// in parallel; one past it is answered that no more searches are allowed
// (the others are dropped from the echo, so the model sees one refusal).
// It appends the assistant message with the calls and one tool message per
// call to the conversation. onStart and onDone run around the searches
// (a stream's idle clock). The first provider failure cancels the others
// and is returned.
func (sr *searchRequest) runSearches(ctx context.Context, t *turn) error {
	remaining := sr.max - sr.attempts
	calls := t.searchCalls
	if len(calls) > remaining+1 {
		calls = calls[:remaining+1]
	}
	type outcome struct {
		query   string
		results []search.Result
		note    string // the tool message when no search ran
		err     error
	}
	outs := make([]outcome, len(calls))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for i, c := range calls {
		if i >= remaining {
			outs[i].note = search.LimitReachedMessage
			continue
		}
		q, err := search.ParseToolArguments(c.Function.Arguments)
		if err != nil {
			outs[i].note = "The search was not run: " + err.Error() + `. Call web_search with {"query": "..."}.`
			continue
		}
		q = truncateUTF8(q, searchQueryMax)
		outs[i].query = q
		wg.Add(1)
		go func(o *outcome) {
			defer wg.Done()
			sctx, span := sr.x.r.span(ctx, "web_search", trace.SpanKindClient,
				attribute.String("tollgate.search.context_size", string(sr.opts.Size)))
			res, err := sr.x.r.search.Search(sctx, search.Query{Text: o.query, Size: sr.opts.Size, Location: sr.opts.Location})
			if span != nil {
				span.SetAttributes(attribute.Int("tollgate.search.results", len(res)))
			}
			endSpan(span, err)
			if err != nil {
				o.err = err
				cancel()
				return
			}
			o.results = res
		}(&outs[i])
	}
	wg.Wait()
	sr.attempts += min(len(calls), remaining)
	var failed error
	for _, o := range outs {
		switch {
		case o.err == nil && o.query != "":
			sr.searches++
		case o.err != nil && failed == nil:
			failed = o.err
		}
	}
	if failed != nil {
		return failed
	}

	// The assistant message as the model made it (its text capped), then
	// one answer per call, results numbered across the whole request.
	msg := struct {
		Role      string       `json:"role"`
		Content   *string      `json:"content"`
		ToolCalls []echoedCall `json:"tool_calls"`
	}{Role: "assistant"}
	if t.content != "" {
		c := truncateUTF8(t.content, searchContentMax)
		msg.Content = &c
	}
	ids := make([]string, len(calls))
	for i, c := range calls {
		sr.callSeq++
		ids[i] = fmt.Sprintf("call_tgws_%d", sr.callSeq)
		args := c.Function.Arguments
		if outs[i].query != "" {
			a, _ := json.Marshal(map[string]string{"query": outs[i].query})
			args = string(a)
		} else {
			args = truncateUTF8(args, searchQueryMax)
		}
		msg.ToolCalls = append(msg.ToolCalls, echoedCall{ID: ids[i], Type: "function",
			Function: echoedFunction{Name: search.ToolName, Arguments: args}})
	}
	sr.appendMessage(msg)
	for i, o := range outs {
		text := o.note
		if text == "" {
			results, first := sr.number(o.results)
			text = search.FormatResults(o.query, results, first)
		}
		if i == len(outs)-1 && sr.attempts >= sr.max && text != search.LimitReachedMessage {
			// The last search allowed: the model is told, and the next call
			// no longer offers the function.
			text += "\n\n" + search.LimitReachedMessage
		}
		sr.appendMessage(struct {
			Role       string `json:"role"`
			ToolCallID string `json:"tool_call_id"`
			Content    string `json:"content"`
		}{"tool", ids[i], text})
	}
	return nil
}

type echoedCall struct {
	ID       string         `json:"id"`
	Type     string         `json:"type"`
	Function echoedFunction `json:"function"`
}

type echoedFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

func (sr *searchRequest) appendMessage(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	if len(sr.extra) > 0 {
		sr.extra = append(sr.extra, ',')
	}
	sr.extra = append(sr.extra, b...)
}

// number cleans a search's results (titles capped, over-long URLs dropped:
// the hold's bound counts on both) and numbers them after the request's
// earlier results: the sources that citations may point at. It returns the
// cleaned results and the first's number.
func (sr *searchRequest) number(results []search.Result) ([]search.Result, int) {
	first := len(sr.sources) + 1
	out := make([]search.Result, 0, len(results))
	for _, res := range results {
		if res.URL == "" || len(res.URL) > searchURLMax {
			continue
		}
		res.Title = truncateRunes(res.Title, searchTitleMax)
		out = append(out, res)
	}
	sr.sources = append(sr.sources, search.Sources(out, first)...)
	return out, first
}

// settle charges what ran (the summed usage and the searches), or releases
// the hold when nothing did. It returns the usage and the amount charged.
func (sr *searchRequest) settle() (openai.Usage, tollgate.Amount, error) {
	u := sr.usage.Normalize()
	cost, err := sr.x.cost(u, sr.searches)
	if err != nil {
		return u, 0, fmt.Errorf("price request: %w", err)
	}
	sr.x.call.Searches = sr.searches // the charge's, the log's and the metrics'

	cost, err = sr.x.settle(u, cost)
	if err != nil {
		return u, 0, err
	}
	sr.x.call.Usage, sr.x.call.Cost = u, cost
	if u.PromptTokens > 0 || u.CompletionTokens > 0 {
		sr.x.noteServed()
	}
	return u, cost, nil
}

// annotations finds the citations in the answer.
func (sr *searchRequest) annotations(content string) []byte {
	anns := search.Annotate(content, sr.sources)
	if len(anns) == 0 {
		return nil
	}
	type citation struct {
		URL        string `json:"url"`
		Title      string `json:"title"`
		StartIndex int    `json:"start_index"`
		EndIndex   int    `json:"end_index"`
	}
	type annotation struct {
		Type        string   `json:"type"`
		URLCitation citation `json:"url_citation"`
	}
	out := make([]annotation, len(anns))
	for i, a := range anns {
		out[i] = annotation{Type: "url_citation", URLCitation: citation{URL: a.URL, Title: a.Title, StartIndex: a.Start, EndIndex: a.End}}
	}
	b, _ := json.Marshal(out)
	return b
}

// appendUsage renders usage with the cost and, when searches ran, their
// count as server_tool_use.web_search_requests (the name Anthropic's API
// and OpenRouter use for it).
func (sr *searchRequest) appendUsage(dst []byte, u openai.Usage, cost tollgate.Amount) []byte {
	start := len(dst)
	dst = u.AppendJSON(dst, &cost)
	if sr.searches == 0 || len(dst) == start {
		return dst
	}
	dst = dst[:len(dst)-1] // the closing brace
	dst = append(dst, `,"server_tool_use":{"web_search_requests":`...)
	dst = fmt.Appendf(dst, "%d", sr.searches)
	return append(dst, "}}"...)
}

// separator is put between the text of two calls' answers.
func (sr *searchRequest) separator(next string) string {
	prev := sr.content.String()
	if prev == "" || next == "" || strings.HasSuffix(prev, "\n\n") {
		return ""
	}
	if strings.HasSuffix(prev, "\n") {
		return "\n"
	}
	return "\n\n"
}

func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func truncateRunes(s string, n int) string {
	i := 0
	for pos := range s {
		if i == n {
			return s[:pos]
		}
		i++
	}
	return s
}
