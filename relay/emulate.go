package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"sync"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/openai"
	"github.com/tollgate/tollgate/upstream"
)

// Controls no node of the model honours (honouring) are served by tollgate
// itself, never refused (docs/api.md, "Controls served by tollgate"):
//
//   - n > 1: n calls of the chosen node at once, each without n, merged into
//     one answer whose choices are indexed 0..n-1, usage summed, one charge
//     (the hold covers n answers and n prompts);
//   - tool_choice "required" or a named function: the answer is constrained
//     to a call of an allowed function by the server's structured output
//     (openai.ChatRequest.ToolCallSchema) and handed over as a tool call.
//
// A stream for n choices alone is n live streams (emulate_stream.go). Here
// the backend calls are not streamed: a streamed request gets the answer
// once it is whole (a tool call is one only then), as a stream of the
// reference's shape, with keep-alives while it waits. The response says
// what was served this way in X-Tollgate-Emulated; a control that could not
// be enforced at all is named in X-Tollgate-Not-Enforced.

const (
	emulatedHeader    = "X-Tollgate-Emulated"
	notEnforcedHeader = "X-Tollgate-Not-Enforced"
)

const toolControls = openai.ControlToolChoiceRequired | openai.ControlToolChoiceNamed

// controlParams names controls by their request fields, for the headers.
func controlParams(c openai.Control) string {
	switch {
	case c&openai.ControlN != 0 && c&toolControls != 0:
		return "n, tool_choice"
	case c&openai.ControlN != 0:
		return "n"
	case c&toolControls != 0:
		return "tool_choice"
	}
	return ""
}

// emulated serves the request with the controls in ctl served by tollgate;
// x.body is the upstream body of one call (one choice, not streamed, the
// tool call's schema when a tool choice is enforced).
func (x *exchange) emulated(w http.ResponseWriter, req *http.Request, ctl openai.Control) (err error) {
	calls := 1
	if ctl&openai.ControlN != 0 {
		calls = int(x.cr.N)
	}
	w.Header().Set(emulatedHeader, controlParams(ctl))
	var s *streamer
	var ctx context.Context
	if x.cr.Stream {
		sctx, cancel := context.WithCancelCause(req.Context())
		defer cancel(nil)
		s = x.startStreamer(w, cancel)
		defer s.stopWatchdog()
		ctx = sctx
	} else {
		tctx, cancel := context.WithTimeout(req.Context(), x.r.opts.NonStreamTimeout)
		defer cancel()
		ctx = tctx
	}
	if x.r.tracer != nil {
		ctx = x.startBackendSpan(ctx)
	}
	answers, u, err := x.callN(ctx, calls)
	if x.r.tracer != nil {
		x.endBackendSpan(u, "", err)
	}
	var m *mergedAnswer
	if err == nil {
		m, err = merge(answers, u, ctl&toolControls != 0, "call_"+x.call.RequestID+"_")
	}
	if s != nil {
		s.stopWatchdog()
		if cause := x.capError(context.Cause(ctx)); err != nil && cause != nil {
			err = cause
		}
	}
	if err != nil {
		err = x.transportError(ctx, req, err)
		if s == nil {
			w.Header().Del(emulatedHeader) // an error, not an answer served so
			return err
		}
		return x.failEmulatedStream(s, req, err)
	}
	cost, err := x.served(u)
	if err != nil {
		return err
	}
	if s == nil {
		return x.writeMerged(w, m, u, cost)
	}
	x.streamMerged(s, m, u, cost)
	return nil
}

// mergedAnswer is the merged answer: the first call's members, and every
// call's choices, reindexed.
type mergedAnswer struct {
	doc     map[string]json.RawMessage
	choices []map[string]json.RawMessage
}

// callN makes n calls of x.body on x.node at once. It returns the answers
// and their usage, summed; or the first error (nothing is charged then:
// nothing reached the client).
func (x *exchange) callN(ctx context.Context, n int) ([]*openai.Response, openai.Usage, error) {
	h1 := x.r.h1For(x.node)
	if h1 == nil {
		return nil, openai.Usage{}, fmt.Errorf("node %s: URL %q is not http or https", x.node.Name, x.node.BaseURL)
	}
	head := upstream.Head{RequestID: x.call.RequestID, Traceparent: x.traceparent}
	if x.node.Key != "" {
		head.Authorization = x.node.authorization()[0]
	}
	answers := make([]*openai.Response, n)
	errs := make([]error, n)
	start := x.r.now()
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i], errs[i] = x.callOnce(ctx, h1, head)
		}()
	}
	wg.Wait()
	x.call.UpstreamTime = x.r.now().Sub(start)
	var u openai.Usage
	for i, err := range errs {
		if err != nil {
			return nil, openai.Usage{}, err
		}
		u = sumUsage(u, answers[i].FinalUsage(x.promptEstimate))
	}
	return answers, u.Normalize(), nil
}

// callOnce is one non-streamed call.
func (x *exchange) callOnce(ctx context.Context, h1 *upstream.Pool, head upstream.Head) (*openai.Response, error) {
	resp, err := h1.Post(ctx, head, x.body)
	if err != nil {
		if ctx.Err() == nil {
			x.upstreamFailed()
		}
		return nil, err
	}
	return x.readAnswer(resp)
}

// merge builds the merged answer.
// Tool calls made of constrained answers get ids callID + the choice's index.
func merge(answers []*openai.Response, u openai.Usage, toolCall bool, callID string) (*mergedAnswer, error) {
	m := &mergedAnswer{}
	for i, a := range answers {
		var doc map[string]json.RawMessage
		if err := json.Unmarshal(a.AppendJSON(nil, u, nil), &doc); err != nil {
			return nil, err
		}
		if i == 0 {
			m.doc = doc
		}
		var cs []map[string]json.RawMessage
		if err := json.Unmarshal(doc["choices"], &cs); err != nil {
			return nil, err
		}
		for _, c := range cs {
			c["index"] = json.RawMessage(strconv.Itoa(len(m.choices)))
			if toolCall {
				asToolCall(c, callID+strconv.Itoa(len(m.choices)))
			}
			m.choices = append(m.choices, c)
		}
	}
	return m, nil
}

// asToolCall turns a choice whose content is a call constrained by the
// tool call's schema into a message with that tool call, in the reference
// shape. A choice that already has tool calls, or whose content is not a
// call (cut short by the output cap), is left as it is.
func asToolCall(c map[string]json.RawMessage, id string) {
	var msg map[string]json.RawMessage
	if json.Unmarshal(c["message"], &msg) != nil || len(msg["tool_calls"]) > 4 {
		return
	}
	var content string
	if json.Unmarshal(msg["content"], &content) != nil {
		return
	}
	name, args, ok := openai.ToolCallFromContent(content)
	if !ok {
		return
	}
	call := map[string]any{"id": id, "type": "function", "function": map[string]string{"name": name, "arguments": args}}
	msg["content"] = json.RawMessage("null")
	msg["tool_calls"], _ = json.Marshal([]any{call})
	c["message"], _ = json.Marshal(msg)
	c["finish_reason"] = json.RawMessage(`"tool_calls"`)
}

// writeMerged writes the non-streamed answer.
func (x *exchange) writeMerged(w http.ResponseWriter, m *mergedAnswer, u openai.Usage, cost tollgate.Amount) error {
	m.doc["choices"], _ = json.Marshal(m.choices)
	m.doc["usage"] = u.AppendJSON(nil, &cost)
	x.writeAnswer(w, appendOrdered(nil, m.doc), u, cost)
	return nil
}

// appendOrdered appends doc as a JSON object with the reference's members
// first, in its order, then the others by name.
func appendOrdered(dst []byte, doc map[string]json.RawMessage) []byte {
	first := []string{"id", "object", "created", "model", "choices", "usage"}
	keys := make([]string, 0, len(doc))
	for k := range doc {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		pi, pj := slices.Index(first, keys[i]), slices.Index(first, keys[j])
		if pi < 0 {
			pi = len(first)
		}
		if pj < 0 {
			pj = len(first)
		}
		return pi < pj || pi == pj && keys[i] < keys[j]
	})
	dst = append(dst, '{')
	for i, k := range keys {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = openai.AppendJSONString(dst, k)
		dst = append(dst, ':')
		dst = append(dst, doc[k]...)
	}
	return append(dst, '}')
}

// streamMerged writes the merged answer as a stream: for each choice in
// turn, its role, reasoning, content and tool calls, and its finish; then
// one usage chunk with the summed usage and the cost, and [DONE].
func (x *exchange) streamMerged(s *streamer, m *mergedAnswer, u openai.Usage, cost tollgate.Amount) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.writeErr != nil {
		x.call.Outcome = "disconnected"
		return
	}
	if !s.committed {
		s.commit()
	}
	head := func(b []byte) []byte {
		b = append(b, `{"id":`...)
		b = append(b, m.doc["id"]...)
		b = append(b, `,"object":"chat.completion.chunk","created":`...)
		b = append(b, m.doc["created"]...)
		b = append(b, `,"model":`...)
		b = append(b, m.doc["model"]...)
		return b
	}
	chunk := func(i int, delta any, finish json.RawMessage) {
		d, _ := json.Marshal(delta)
		b := head(nil)
		b = append(b, `,"choices":[{"index":`...)
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, `,"delta":`...)
		b = append(b, d...)
		b = append(b, `,"logprobs":null,"finish_reason":`...)
		b = append(b, finish...)
		b = append(b, "}]}"...)
		s.buf = openai.AppendData(s.buf, b)
	}
	s.buf = s.buf[:0]
	null := json.RawMessage("null")
	for i, c := range m.choices {
		var msg map[string]json.RawMessage
		_ = json.Unmarshal(c["message"], &msg)
		var calls []map[string]json.RawMessage
		_ = json.Unmarshal(msg["tool_calls"], &calls)
		first := struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}{"assistant", json.RawMessage(`""`)}
		if len(calls) > 0 {
			first.Content = null
		}
		chunk(i, first, null)
		if r := msg["reasoning"]; len(r) > 0 && string(r) != "null" {
			chunk(i, map[string]json.RawMessage{"reasoning": r}, null)
		}
		if ct := msg["content"]; len(ct) > 2 && ct[0] == '"' {
			chunk(i, map[string]json.RawMessage{"content": ct}, null)
		}
		for k, call := range calls {
			call["index"] = json.RawMessage(strconv.Itoa(k))
			chunk(i, map[string]any{"tool_calls": []any{call}}, null)
		}
		finish := c["finish_reason"]
		if len(finish) == 0 {
			finish = null
		}
		chunk(i, struct{}{}, finish)
	}
	b := head(nil)
	b = append(b, `,"choices":[],"usage":`...)
	b = u.AppendJSON(b, &cost)
	s.buf = openai.AppendData(s.buf, append(b, '}'))
	s.buf = x.appendStreamEnd(s.buf, nil)
	s.w.Header().Set("X-Tollgate-Cost", cost.String())
	if u.Estimated {
		s.w.Header().Set("X-Tollgate-Usage-Estimated", "true")
	}
	_, _ = s.w.Write(s.buf)
}

// failEmulatedStream ends a streamed request whose calls failed: a plain
// HTTP error when nothing was sent yet, else the error event (keep-alives
// may have committed the stream). Nothing is charged: no answer reached the
// client.
func (x *exchange) failEmulatedStream(s *streamer, req *http.Request, err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	clientGone := req.Context().Err() != nil || s.writeErr != nil
	switch {
	case clientGone:
		x.call.Outcome = "disconnected"
		return nil
	case !s.committed:
		x.call.Outcome = "failed"
		s.w.Header().Del(emulatedHeader) // an error, not an answer served so
		return err
	}
	x.call.Outcome = "failed_mid_stream"
	s.buf = x.appendStreamEnd(s.buf[:0], err)
	_, _ = s.w.Write(s.buf)
	return nil
}
