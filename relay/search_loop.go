package relay

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/openai"
)

// What a search request charges: everything that ran (each backend call
// that answered, each search that returned) when the answer or part of it
// reached the client, or when the client left on its own; nothing when the
// request failed before anything reached the client (docs/api.md, "Web
// search").

// nonStream runs the loop for a non-streamed request: the five-minute limit
// (timeouts.non_stream) covers every call and search.
func (sr *searchRequest) nonStream(w http.ResponseWriter, req *http.Request) error {
	x := sr.x
	ctx, cancel := context.WithTimeout(req.Context(), x.r.opts.NonStreamTimeout)
	defer cancel()
	var last *turn
	var reasoning strings.Builder
	for {
		offered := sr.attempts < sr.max
		x.body = sr.body()
		t, err := sr.callOnce(ctx, req, offered)
		if err != nil {
			return sr.failNonStream(ctx, req, err)
		}
		sr.turns++
		sr.addUsage(t.usage)
		sr.content.WriteString(sr.separator(t.content))
		sr.content.WriteString(t.content)
		reasoning.WriteString(t.reasoning)
		last = t
		if len(t.searchCalls) == 0 {
			break
		}
		if err := sr.runSearches(ctx, t); err != nil {
			return sr.failNonStream(ctx, req, err)
		}
		if len(t.clientCalls) > 0 {
			break
		}
	}

	u, cost, err := sr.settle()
	if err != nil {
		return err
	}
	x.call.Outcome = "served"
	msg := last.message
	if msg == nil {
		msg = map[string]json.RawMessage{"role": json.RawMessage(`"assistant"`)}
	}
	content := sr.content.String()
	if content == "" && len(last.clientCalls) > 0 {
		msg["content"] = json.RawMessage("null")
	} else {
		msg["content"], _ = json.Marshal(content)
	}
	if reasoning.Len() > 0 {
		msg["reasoning"], _ = json.Marshal(reasoning.String())
	}
	delete(msg, "tool_calls")
	if len(last.clientCalls) > 0 {
		raws := make([]json.RawMessage, len(last.clientCalls))
		for i, c := range last.clientCalls {
			raws[i] = c.raw
		}
		msg["tool_calls"], _ = json.Marshal(raws)
	}
	if anns := sr.annotations(content); anns != nil {
		msg["annotations"] = anns
	} else {
		delete(msg, "annotations")
	}
	choice := last.choice
	if choice == nil {
		choice = map[string]json.RawMessage{"index": json.RawMessage("0"), "logprobs": json.RawMessage("null")}
	}
	choice["message"], _ = json.Marshal(msg)
	choice["finish_reason"], _ = json.Marshal(sr.finishReason(last))
	resp := last.resp
	resp["choices"], _ = json.Marshal([]map[string]json.RawMessage{choice})
	resp["usage"] = sr.appendUsage(nil, u, cost)
	out, err := json.Marshal(resp)
	if err != nil {
		return err
	}
	h := w.Header()
	h["Content-Type"] = jsonContentType
	h.Set("Content-Length", strconv.Itoa(len(out)))
	x.setServedHeaders(h)
	h.Set("X-Tollgate-Cost", cost.String())
	h.Set("X-Tollgate-Searches", strconv.FormatInt(sr.searches, 10))
	if u.Estimated {
		h.Set("X-Tollgate-Usage-Estimated", "true")
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
	return nil
}

// finishReason is the answer's: tool_calls when the client's functions were
// called, stop when the model's last word was a call of the search function
// it was no longer offered (dropped), else the model's own.
func (sr *searchRequest) finishReason(last *turn) string {
	switch {
	case len(last.clientCalls) > 0:
		return "tool_calls"
	case last.finish == "tool_calls" || last.finish == "":
		return "stop"
	}
	return last.finish
}

// failNonStream ends a non-streamed request that failed. A client that went
// away is charged for what ran; otherwise nothing reached the client and
// nothing is charged (the hold is released by serveSearch).
func (sr *searchRequest) failNonStream(ctx context.Context, req *http.Request, err error) error {
	x := sr.x
	if req.Context().Err() != nil {
		if _, _, serr := sr.settle(); serr != nil {
			x.r.log.Error("settle search request", "request_id", x.call.RequestID, "err", serr)
		}
		x.call.Outcome = "disconnected"
		return &tollgate.Error{Code: tollgate.CodeUpstreamError, Message: "client closed the request", Err: err}
	}
	x.call.Outcome = "failed"
	var te *tollgate.Error
	if errors.As(err, &te) {
		return te
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return &tollgate.Error{Code: tollgate.CodeTimeout, Err: err,
			Message: "the model and its web searches produced no answer within " + x.r.opts.NonStreamTimeout.String() + "; the request was cancelled and not charged"}
	}
	return x.transportError(ctx, req, err)
}

// callOnce makes one non-streamed backend call.
func (sr *searchRequest) callOnce(ctx context.Context, req *http.Request, offered bool) (t *turn, err error) {
	x := sr.x
	ctx = x.startBackendSpan(ctx)
	defer func() { x.endTurnSpan(t, err) }()
	resp, err := x.send(ctx)
	if err != nil {
		return nil, x.transportError(ctx, req, err)
	}
	nr, err := x.readAnswer(resp)
	if err != nil {
		return nil, x.transportError(ctx, req, err)
	}
	x.upstreamOK()
	t = &turn{usage: nr.FinalUsage(sr.promptEstimate()).Normalize()}
	var choices []map[string]json.RawMessage
	if json.Unmarshal(nr.AppendJSON(nil, t.usage, nil), &t.resp) != nil ||
		json.Unmarshal(t.resp["choices"], &choices) != nil || len(choices) == 0 {
		return nil, &tollgate.Error{Code: tollgate.CodeUpstreamError, Message: "The model server sent an answer tollgate could not read."}
	}
	t.choice = choices[0]
	_ = json.Unmarshal(t.choice["finish_reason"], &t.finish)
	_ = json.Unmarshal(t.choice["message"], &t.message)
	_ = json.Unmarshal(t.message["content"], &t.content)
	_ = json.Unmarshal(t.message["reasoning"], &t.reasoning)
	var raws []json.RawMessage
	_ = json.Unmarshal(t.message["tool_calls"], &raws)
	calls := make([]toolCall, 0, len(raws))
	for i, r := range raws {
		var c toolCall
		if json.Unmarshal(r, &c) != nil {
			continue
		}
		c.Index, c.raw = i, r
		calls = append(calls, c)
	}
	sr.split(t, calls, offered)
	return t, nil
}

// streamChunk is what the loop reads of a normalised stream chunk.
type streamChunk struct {
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Content   *string    `json:"content"`
			Reasoning *string    `json:"reasoning"`
			Refusal   *string    `json:"refusal"`
			ToolCalls []toolCall `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
}

// searchStream writes a search request's stream: the chunks are tollgate's
// own (one id, one created), fed by each call's normalised chunks.
type searchStream struct {
	sr        *searchRequest
	s         *streamer
	head      []byte // {"id":...,"object":"chat.completion.chunk","created":...,"model":...,
	roleSent  bool
	forwarded bool // some of the answer reached the client
	buf       []byte
	prog      progress // records the charge so far once some of the answer reached the client
}

// chunk sends one chunk with the delta and finish reason ("": null).
func (ss *searchStream) chunk(delta []byte, finish string) bool {
	ss.buf = ss.appendChunk(ss.buf[:0], delta, finish)
	return ss.s.send(ss.buf)
}

// delta forwards one piece of the answer (member content, reasoning or refusal).
func (ss *searchStream) delta(member, text string) bool {
	d := make([]byte, 0, len(text)+48)
	d = append(d, '{')
	if !ss.roleSent {
		ss.roleSent = true
		d = append(d, `"role":"assistant",`...)
	}
	d = strconv.AppendQuote(d, member)
	d = append(d, ':')
	q, _ := json.Marshal(text)
	d = append(d, q...)
	d = append(d, '}')
	first := !ss.forwarded
	ss.forwarded = true
	ok := ss.chunk(d, "")
	if first && ok {
		// The first token leaves at once, not with what arrived with it:
		// time to first token is what a streaming client waits on.
		ss.s.flush()
		ss.sr.x.call.FirstToken = ss.sr.x.r.now()
		ss.sr.x.firstTokenEvent()
	}
	return ok
}

func (sr *searchRequest) stream(w http.ResponseWriter, req *http.Request) error {
	x := sr.x
	ctx, cancel := context.WithCancelCause(req.Context())
	defer cancel(nil)
	now := x.r.now()
	s := x.startStreamer(w, cancel)
	defer s.stopWatchdog()

	ss := &searchStream{sr: sr, s: s, prog: x.progress()}
	ss.head = append(ss.head, `{"id":`...)
	ss.head = strconv.AppendQuote(ss.head, x.completionID())
	ss.head = append(ss.head, `,"object":"chat.completion.chunk","created":`...)
	ss.head = strconv.AppendInt(ss.head, now.Unix(), 10)
	ss.head = append(ss.head, `,"model":`...)
	ss.head = strconv.AppendQuote(ss.head, x.model.ID)
	ss.head = append(ss.head, ',')

	var last *turn
	var failure error
	for {
		offered := sr.attempts < sr.max
		x.body = sr.body()
		t, err := ss.call(ctx, req, offered)
		sr.turns++
		if t != nil {
			sr.addUsage(t.usage)
		}
		if err != nil {
			failure = err
			break
		}
		last = t
		if len(t.searchCalls) == 0 {
			break
		}
		s.flush() // what the model wrote before searching is not held back
		s.lastUpstream.Store(x.r.now().UnixNano())
		err = sr.runSearches(ctx, t)
		// Searching is not the backend being idle: its clock starts again.
		s.lastUpstream.Store(x.r.now().UnixNano())
		if err != nil {
			failure = err
			break
		}
		ss.noteSearches()
		if len(t.clientCalls) > 0 {
			break
		}
	}
	s.stopWatchdog()

	clientGone := req.Context().Err() != nil || s.writeErr != nil
	if failure != nil && !clientGone {
		if ce := x.capError(context.Cause(ctx)); ce != nil {
			failure = ce
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	var u openai.Usage
	var cost tollgate.Amount
	if failure == nil || clientGone || ss.forwarded {
		var err error
		if u, cost, err = sr.settle(); err != nil {
			return err
		}
	} else if !s.committed {
		// Nothing reached the client: a plain HTTP error, nothing charged.
		x.call.Outcome = "failed"
		return failure
	}
	if !x.streamOutcome(clientGone, failure) {
		return nil
	}
	out := make([]byte, 0, 1024) // the closing chunks
	data := func(chunk []byte) { out = openai.AppendData(out, chunk) }
	if failure == nil {
		if anns := sr.annotations(sr.content.String()); anns != nil {
			data(ss.render(append(append([]byte(`{"annotations":`), anns...), '}'), ""))
		}
		if len(last.clientCalls) > 0 {
			data(ss.render(clientCallsDelta(last.clientCalls, !ss.roleSent), ""))
			ss.roleSent = true
		}
		if !ss.roleSent {
			data(ss.render([]byte(`{"role":"assistant","content":""}`), ""))
		}
		data(ss.render([]byte(`{}`), sr.finishReason(last)))
	}
	usage := append(append([]byte(nil), ss.head...), `"choices":[],"usage":`...)
	usage = sr.appendUsage(usage, u, cost)
	s.end(out, append(usage, '}'), failure, u, &cost)
	return nil
}

// render is chunk without sending: the stream's closing chunks go out in one write.
func (ss *searchStream) render(delta []byte, finish string) []byte {
	return ss.appendChunk(nil, delta, finish)
}

// appendChunk appends {head "choices":[{"index":0,"delta":…,"finish_reason":…,"logprobs":null}]}.
func (ss *searchStream) appendChunk(b, delta []byte, finish string) []byte {
	b = append(b, ss.head...)
	b = append(b, `"choices":[{"index":0,"delta":`...)
	b = append(b, delta...)
	b = append(b, `,"finish_reason":`...)
	if finish == "" {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendQuote(b, finish)
	}
	return append(b, `,"logprobs":null}]}`...)
}

// clientCallsDelta is one delta with the client's tool calls, whole and
// numbered from 0 (the search calls beside them are not the client's).
func clientCallsDelta(calls []toolCall, withRole bool) []byte {
	type fn struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	}
	type tc struct {
		Index    int    `json:"index"`
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function fn     `json:"function"`
	}
	out := make([]tc, len(calls))
	for i, c := range calls {
		typ := c.Type
		if typ == "" {
			typ = "function"
		}
		out[i] = tc{Index: i, ID: c.ID, Type: typ, Function: fn{Name: c.Function.Name, Arguments: c.Function.Arguments}}
	}
	b, _ := json.Marshal(out)
	d := []byte(`{`)
	if withRole {
		d = append(d, `"role":"assistant","content":null,`...)
	}
	d = append(d, `"tool_calls":`...)
	d = append(d, b...)
	return append(d, '}')
}

// call makes one streamed backend call: the answer's text and reasoning go
// to the client as they come; tool calls are gathered until the call ends.
// On a failure the returned turn still carries the usage of what was
// delivered.
func (ss *searchStream) call(ctx context.Context, req *http.Request, offered bool) (t *turn, err error) {
	sr, s := ss.sr, ss.s
	x := sr.x
	ctx = x.startBackendSpan(ctx)
	defer func() { x.endTurnSpan(t, err) }()
	resp, err := x.send(ctx)
	if err != nil {
		cause := context.Cause(ctx)
		if errors.Is(cause, errStreamIdle) || errors.Is(cause, errStreamTotal) {
			x.upstreamFailed()
			return nil, cause
		}
		return nil, x.transportError(ctx, req, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, x.classifyStatus(resp)
	}
	if err := x.notEventStream(resp); err != nil {
		return nil, err
	}
	er := openai.NewEventReader(resp.Body)
	er.OnWait = s.flush
	var norm openai.StreamNormalizer
	norm.Reset(x.completionID(), x.model.ID, x.node.Flavour)
	t = &turn{}
	calls := map[int]*toolCall{}
	started := false
	rd := s.readEvents(er, &norm, func(out []byte, now int64) bool {
		if out == nil {
			ss.noteProgress(&norm, now) // a usage chunk: the call's usage as its end counts it
			return true
		}
		var ch streamChunk
		if json.Unmarshal(out, &ch) != nil {
			return true
		}
		gone := false
		for _, c := range ch.Choices {
			if c.Index != 0 {
				continue
			}
			d := c.Delta
			if d.Reasoning != nil && *d.Reasoning != "" {
				t.reasoning += *d.Reasoning
				gone = gone || !ss.delta("reasoning", *d.Reasoning)
			}
			if d.Content != nil && *d.Content != "" {
				text := *d.Content
				if !started {
					started = true
					text = sr.separator(text) + text
				}
				t.content += *d.Content
				sr.content.WriteString(text)
				gone = gone || !ss.delta("content", text)
			}
			if d.Refusal != nil && *d.Refusal != "" {
				gone = gone || !ss.delta("refusal", *d.Refusal)
			}
			for _, tc := range d.ToolCalls {
				acc := calls[tc.Index]
				if acc == nil {
					acc = &toolCall{Index: tc.Index}
					calls[tc.Index] = acc
				}
				if tc.ID != "" {
					acc.ID = tc.ID
				}
				if tc.Type != "" {
					acc.Type = tc.Type
				}
				if tc.Function.Name != "" {
					acc.Function.Name = tc.Function.Name
				}
				acc.Function.Arguments += tc.Function.Arguments
			}
			if c.FinishReason != nil {
				t.finish = *c.FinishReason
			}
		}
		if gone {
			return false // the client is gone
		}
		ss.noteProgress(&norm, now)
		return true
	})
	failure := rd.failure
	clientGone := req.Context().Err() != nil || s.writeErr != nil
	served := failure == nil && rd.finished(&norm)
	if !served && failure == nil && !clientGone {
		if cause := context.Cause(ctx); cause != nil {
			failure = cause
		} else {
			failure = &tollgate.Error{Code: tollgate.CodeUpstreamError, Err: rd.readErr,
				Message: "the backend closed the stream before it finished"}
		}
	}
	x.streamHealth(served, failure, clientGone)
	t.usage = sr.callUsage(&norm, served)
	if !served {
		if failure == nil {
			failure = context.Canceled // the client left
		}
		return t, failure
	}
	idx := make([]int, 0, len(calls))
	for i := range calls {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	list := make([]toolCall, 0, len(idx))
	for _, i := range idx {
		list = append(list, *calls[i])
	}
	sr.split(t, list, offered)
	return t, nil
}

// callUsage is what a streamed call counts for (so far): the backend's
// usage if it sent one; else, once the call delivered something or was
// served, the prompt estimate and the completion tokens counted from what
// it delivered; else nothing.
func (sr *searchRequest) callUsage(norm *openai.StreamNormalizer, served bool) openai.Usage {
	return streamUsage(norm, served, sr.promptEstimate()).Normalize()
}

// noteProgress records the request's charge so far in the charge journal
// when a record is due (progress.due) and some of the answer reached the
// client, so that a crash of this process does not leave it unpaid
// (docs/billing.md, "Streams cut by a crash"): what the settle would charge
// if the request ended now, that is the earlier calls' usage, this call's
// so far (norm) and every search that ran.
func (ss *searchStream) noteProgress(norm *openai.StreamNormalizer, now int64) {
	if !ss.forwarded || !ss.prog.due(now) {
		return
	}
	sr := ss.sr
	u := sumUsage(sr.usage, sr.callUsage(norm, false)).Normalize()
	sr.x.recordProgress(ss.prog.pr, u, sr.searches)
}

// noteSearches records the charge so far right after a round of searches
// that ran once some of the answer had reached the client: their fees are
// owed from then on, and the next chunk, which would record them otherwise,
// may be a long prefill away.
func (ss *searchStream) noteSearches() {
	if !ss.forwarded || ss.prog.pr == nil {
		return
	}
	ss.prog.next = 0 // due now; the next record is a full interval later
	if ss.prog.due(ss.sr.x.r.now().UnixNano()) {
		ss.sr.x.recordProgress(ss.prog.pr, ss.sr.usage.Normalize(), ss.sr.searches)
	}
}

// endTurnSpan closes one call's backend span with what the call returned.
func (x *exchange) endTurnSpan(t *turn, err error) {
	if t == nil {
		x.endBackendSpan(openai.Usage{}, "", err)
		return
	}
	x.endBackendSpan(t.usage, t.finish, err)
}
