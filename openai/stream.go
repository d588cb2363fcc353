package openai

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tollgate/tollgate"
)

// ErrDone is returned by StreamNormalizer.Event when the upstream sent
// "data: [DONE]": the stream ended normally.
var ErrDone = errors.New("openai: upstream stream done")

// StreamNormalizer turns the chunks of one upstream stream into the chunks
// tollgate sends its client (docs/streams.md):
//
//   - id is ID, model is Model, object is "chat.completion.chunk", created is
//     the upstream's first created value (constant across the stream);
//   - system_fingerprint, timings (llama.cpp), provider (OpenRouter),
//     kv_transfer_params / prompt_token_ids / prompt_logprobs (vLLM) and, in
//     choices, stop_reason (vLLM), matched_stop (SGLang) and
//     native_finish_reason (OpenRouter) are removed;
//   - usage is removed from every chunk and remembered (Usage); a chunk that
//     then has no choices is dropped; the relay sends one UsageChunk at the end;
//   - reasoning_content becomes reasoning (one of them is kept when both come);
//   - the first delta of each choice carries role "assistant";
//   - tool-call pieces get the index they lack (their position) and, on a
//     piece with an id, type "function" when absent;
//   - an "error" key, an "object":"error" body or finish_reason "error" is a
//     failure: Chunk returns a *tollgate.Error and forwards nothing;
//   - every other field passes through byte for byte.
//
// The zero value with ID, Model and Flavour set is ready to use. Not safe for
// concurrent use. Slices returned by Chunk and Event are valid until the next call.
type StreamNormalizer struct {
	ID, Model string
	Flavour   Flavour

	inited      bool
	idJSON      []byte
	modelJSON   []byte
	out         []byte
	choices     []byte
	rest        []byte
	members     []member
	created     int64
	haveCreated bool
	usage       Usage
	haveUsage   bool
	delivered   int64
	// deliveredFirst is the part of delivered that went to choice 0:
	// llama.cpp's usage counts the first choice only (ChoicesUsage).
	deliveredFirst int64
	// tokens is the stream's own count of completion tokens (StreamTokens).
	tokens     int64
	sawFinish  bool
	done       bool
	forwarded  int
	roleSent   uint64 // bit i: choice i already had its role (i < 64)
	tmpl       chunkTemplate
	noTemplate bool         // tests: always take the full path
	templated  int          // chunks normalised by the template
	clock      func() int64 // tests: the time when no chunk says
}

// chunkTemplate is the last forwarded chunk whose only generated text was one
// string value (a token of content or reasoning, a piece of a tool call's
// arguments), with where that string sits
// in the chunk and in its normalised form. A server sends every token of a
// stream in the same bytes but that string, so the next chunk that matches
// the template byte for byte outside the string is normalised by copying the
// template's output around the new string (fromTemplate): a few comparisons
// instead of a walk of the whole chunk, on the relay's hottest loop.
type chunkTemplate struct {
	ok               bool
	first            bool // its string is choice 0's
	buf              []byte
	in, out          []byte // in buf
	inStart, inEnd   int    // in[inStart:inEnd] is the string value, quotes included
	outStart, outEnd int    // out[outStart:outEnd] is the same string
}

type member struct{ key, raw, val []byte }

// chunkState collects what one chunk would change; it is committed only when
// the chunk is forwarded.
type chunkState struct {
	delivered      int64
	deliveredFirst int64 // of delivered, to choice 0
	tokens         int64 // PieceTokens of each piece, plus one per end of turn
	finish         bool
	finishErr      bool
	roleSent       uint64

	// What the chunk generated: the number of values counted as delivered,
	// and where the last string among them went in the choices written
	// (for the chunk template).
	deliveries int
	text       []byte // the string value, a slice of the chunk
	textOut    int    // its offset in the choices written
	textChoice int    // the index of the choice it belongs to
	cur        int    // the index of the choice being normalised
	roleAdded  bool   // a choice got its first role from the normaliser
}

// functionTexts notes the name and arguments of a function object (a tool
// call's, or a legacy function_call), copied as it is at offset at of the
// choices.
func (st *chunkState) functionTexts(fn []byte, at int) {
	it := newTrustedObjIter(fn)
	for {
		k, _, v, ok := it.next()
		if !ok {
			return
		}
		switch string(k) {
		case "name", "arguments":
			st.generated(v, at+cap(fn)-cap(v))
		}
	}
}

// generated counts a text value (content, reasoning, refusal, a function's
// name or arguments) as delivered and notes that it is about to be written at
// offset at of the choices. A null one generated nothing.
func (st *chunkState) generated(val []byte, at int) {
	l := stringLen(val)
	st.delivered += l
	st.tokens += PieceTokens(l)
	switch {
	case len(val) > 0 && val[0] == '"':
		st.deliveries++
		st.text, st.textOut, st.textChoice = val, at, st.cur
	case !isNull(val):
		st.deliveries += 2 // not a string: no template
	}
}

// Reset readies n for another stream with these settings, keeping the
// buffers it grew (the relay pools normalisers).
func (n *StreamNormalizer) Reset(id, model string, fl Flavour) {
	clear(n.members[:cap(n.members)]) // no references into the last stream's chunks
	*n = StreamNormalizer{ID: id, Model: model, Flavour: fl,
		idJSON: n.idJSON[:0], modelJSON: n.modelJSON[:0], out: n.out[:0], choices: n.choices[:0],
		rest: n.rest[:0], members: n.members[:0], tmpl: chunkTemplate{buf: n.tmpl.buf[:0]}}
}

func (n *StreamNormalizer) init() {
	if n.inited {
		return
	}
	n.inited = true
	n.modelJSON = appendJSONString(n.modelJSON[:0], n.Model)
	n.idJSON = appendJSONString(n.idJSON[:0], n.ID)
}

// Chunk takes one upstream data payload (not "[DONE]") and returns the
// normalised chunk JSON to forward, or nil when there is nothing to forward.
// A failure reported by the upstream inside the stream returns a
// *tollgate.Error (code context_length_exceeded when that is what it says,
// else upstream_error). Malformed JSON returns a *tollgate.Error with code
// upstream_error.
func (n *StreamNormalizer) Chunk(data []byte) ([]byte, error) {
	n.init()
	if n.tmpl.ok {
		if out, ok := n.fromTemplate(data); ok {
			return out, nil
		}
	}
	it := newObjIter(data)
	if it.err != nil {
		return nil, malformed(data)
	}
	st := chunkState{roleSent: n.roleSent}
	var errVal []byte
	objectError := false
	nChoices := 0
	n.choices = n.choices[:0]
	n.rest = n.rest[:0]
	for {
		key, raw, val, ok := it.next()
		if !ok {
			break
		}
		switch string(key) {
		case "id", "model":
		case "object":
			if jsonStringIs(val, "error") {
				objectError = true
			}
		case "created":
			if !n.haveCreated {
				if v, ok := jsonInt(val); ok && v > 0 {
					n.created, n.haveCreated = v, true
				}
			}
		case "choices":
			var err error
			st = chunkState{roleSent: n.roleSent} // a repeated key: the last one wins
			n.choices, nChoices, err = n.normChoices(n.choices[:0], val, &st)
			if err != nil {
				return nil, malformed(data)
			}
		case "usage":
			if u, ok := parseUsage(val); ok {
				n.usage, n.haveUsage = u, true
			}
		case "error":
			if !isNull(val) {
				errVal = val
			}
		case "system_fingerprint", "timings", "provider", "kv_transfer_params", "prompt_token_ids", "prompt_logprobs":
		default:
			n.rest = append(n.rest, ',')
			n.rest = append(n.rest, raw...)
			n.rest = append(n.rest, ':')
			n.rest = append(n.rest, val...)
		}
	}
	if !it.restOK() {
		return nil, malformed(data)
	}
	if errVal != nil {
		return nil, streamFailure(errVal)
	}
	if objectError {
		return nil, streamFailure(data)
	}
	if st.finishErr {
		return nil, &tollgate.Error{Code: tollgate.CodeUpstreamError,
			Message: "The model server failed while generating the answer."}
	}
	if nChoices == 0 {
		return nil, nil
	}
	n.delivered += st.delivered
	n.deliveredFirst += st.deliveredFirst
	n.tokens += st.tokens
	n.roleSent = st.roleSent
	if st.finish {
		n.sawFinish = true
	}
	n.forwarded++
	out := n.appendHeader(n.out[:0])
	out = append(out, `,"choices":`...)
	choicesAt := len(out)
	out = append(out, n.choices...)
	out = append(out, n.rest...)
	out = append(out, '}')
	n.out = out
	if st.deliveries == 1 && st.text != nil && !st.roleAdded && !n.noTemplate {
		n.keepTemplate(data, out, st.text, choicesAt+st.textOut)
		n.tmpl.first = st.textChoice == 0
	}
	return out, nil
}

// keepTemplate makes data (normalised to out) the chunk template, its one
// generated string being text (a slice of data) at out[outStart:]. A chunk
// that changed what the normaliser remembers in a way its output depends on
// (a choice's first role) is never a template: the next chunk of the same
// shape is normalised differently.
func (n *StreamNormalizer) keepTemplate(data, out, text []byte, outStart int) {
	inStart := cap(data) - cap(text)
	if inStart < 0 || inStart+len(text) > len(data) || len(text) < 2 || &data[inStart] != &text[0] ||
		text[0] != '"' || text[len(text)-1] != '"' {
		return
	}
	t := &n.tmpl
	t.buf = append(append(t.buf[:0], data...), out...) // one buffer: one allocation a stream
	t.in, t.out = t.buf[:len(data):len(data)], t.buf[len(data):]
	t.inStart, t.inEnd = inStart, inStart+len(text)
	t.outStart, t.outEnd = outStart, outStart+len(text)
	t.ok = string(t.out[t.outStart:t.outEnd]) == string(text)
}

// fromTemplate normalises data by the chunk template when data is the
// template's bytes with another valid JSON string in place of the
// template's string: the full path would then write the template's output
// with that string in its place, and count it as delivered.
func (n *StreamNormalizer) fromTemplate(data []byte) ([]byte, bool) {
	t := &n.tmpl
	prefix, suffix := t.in[:t.inStart+1], t.in[t.inEnd-1:] // each with its quote
	if len(data) < len(prefix)+len(suffix) || !bytes.HasPrefix(data, prefix) || !bytes.HasSuffix(data, suffix) {
		return nil, false
	}
	text := data[t.inStart : len(data)-len(suffix)+1]
	if end, err := skipString(text, 0); err != nil || end != len(text) {
		return nil, false // the string ends early, or is not valid
	}
	l := stringLen(text)
	n.delivered += l
	n.tokens += PieceTokens(l)
	if t.first {
		n.deliveredFirst += l
	}
	n.forwarded++
	n.templated++
	out := append(n.out[:0], t.out[:t.outStart]...)
	out = append(out, text...)
	out = append(out, t.out[t.outEnd:]...)
	n.out = out
	return out, true
}

func (n *StreamNormalizer) appendHeader(dst []byte) []byte {
	dst = append(dst, `{"id":`...)
	dst = append(dst, n.idJSON...)
	dst = append(dst, `,"object":"chat.completion.chunk","created":`...)
	dst = strconv.AppendInt(dst, n.Created(), 10)
	dst = append(dst, `,"model":`...)
	return append(dst, n.modelJSON...)
}

// Event handles one whole event from an EventReader: a comment gives
// (nil, nil); "[DONE]" gives (nil, ErrDone); an "error" event (event: error,
// or llama.cpp's "error:" line) gives a *tollgate.Error; events with another
// name are ignored; data goes to Chunk.
func (n *StreamNormalizer) Event(ev Event) ([]byte, error) {
	if ev.Comment {
		return nil, nil
	}
	switch ev.Name {
	case "error":
		return nil, streamFailure(ev.Data)
	case "", "message":
	default:
		return nil, nil
	}
	d := trimWS(ev.Data)
	if len(d) == 0 {
		return nil, nil
	}
	if string(d) == "[DONE]" {
		n.done = true
		return nil, ErrDone
	}
	return n.Chunk(d)
}

// Usage returns the last usage the server reported in the stream (for
// llama.cpp with several choices, corrected: ChoicesUsage).
func (n *StreamNormalizer) Usage() (Usage, bool) {
	if n.haveUsage && n.Flavour == LlamaCpp {
		return ChoicesUsage(n.usage, n.delivered, n.deliveredFirst), true
	}
	return n.usage, n.haveUsage
}

// DeliveredBytes is the decoded size of the text forwarded so far: content,
// reasoning, refusal, tool-call names and arguments, over all choices.
func (n *StreamNormalizer) DeliveredBytes() int64 { return n.delivered }

// Forwarded is the number of chunks returned for forwarding so far.
func (n *StreamNormalizer) Forwarded() int { return n.forwarded }

// StreamTokens is the stream's own count of the completion tokens forwarded
// so far: PieceTokens of every piece of text (content, reasoning, refusal,
// a tool call's name or arguments), plus one for each choice that ended its
// turn (finish_reason stop, tool_calls or function_call). Servers stream
// about one token per delta, so this counts tokens, where bytes / 4 counts
// a short piece such as "<tool_call>" (11 bytes, one token) as three.
func (n *StreamNormalizer) StreamTokens() int64 { return n.tokens }

// FinalUsage returns the usage to bill: the server's when it reported one,
// else an estimate (Estimated set) from promptTokens (the relay's count of
// the prompt) and StreamTokens().
func (n *StreamNormalizer) FinalUsage(promptTokens int64) Usage {
	if u, ok := n.Usage(); ok {
		return u
	}
	return Usage{PromptTokens: promptTokens, CompletionTokens: n.tokens, Estimated: true}.Normalize()
}

// Created is the upstream's created of its first chunk, or the time of the
// first call when the upstream gave none. It is the same for the whole stream.
func (n *StreamNormalizer) Created() int64 {
	if !n.haveCreated {
		n.haveCreated = true
		if n.clock != nil {
			n.created = n.clock()
		} else {
			n.created = time.Now().Unix()
		}
	}
	return n.created
}

// SawFinish reports whether a forwarded chunk carried a finish_reason.
func (n *StreamNormalizer) SawFinish() bool { return n.sawFinish }

// Done reports whether the upstream sent [DONE].
func (n *StreamNormalizer) Done() bool { return n.done }

// UsageChunk returns the final chunk (without "data: "):
// {"id","object":"chat.completion.chunk","created","model","choices":[],"usage":{...}}.
// The returned slice is newly allocated.
func (n *StreamNormalizer) UsageChunk(u Usage, cost *tollgate.Amount) []byte {
	n.init()
	out := n.appendHeader(make([]byte, 0, 256))
	out = append(out, `,"choices":[],"usage":`...)
	out = u.AppendJSON(out, cost)
	return append(out, '}')
}

// ErrorEvent returns the failure event's JSON (without "data: "):
// {"error":{"message":...,"type":...,"param":null|"...","code":...}}.
func ErrorEvent(e *tollgate.Error) []byte {
	out := make([]byte, 0, 160)
	out = append(out, `{"error":{"message":`...)
	out = appendJSONString(out, e.Message)
	out = append(out, `,"type":`...)
	out = appendJSONString(out, ErrorType(e.Code))
	out = append(out, `,"param":`...)
	if e.Param != "" {
		out = appendJSONString(out, e.Param)
	} else {
		out = append(out, "null"...)
	}
	out = append(out, `,"code":`...)
	out = appendJSONString(out, string(e.Code))
	return append(out, '}', '}')
}

// ErrorType is the protocol's error.type for a code: invalid_request_error for
// the 400s, authentication_error, permission_error, not_found_error,
// rate_limit_error, and server_error for upstream/internal failures.
func ErrorType(c tollgate.Code) string {
	switch c {
	case tollgate.CodeMissingAPIKey, tollgate.CodeInvalidAPIKey, tollgate.CodeAPIKeyRevoked,
		tollgate.CodeAPIKeyExpired, tollgate.CodeUnauthorized:
		return "authentication_error"
	case tollgate.CodeModelNotAllowed, tollgate.CodeKeyLimitReached, tollgate.CodeAccountDisabled:
		return "permission_error"
	case tollgate.CodeModelNotFound, tollgate.CodeNotFound:
		return "not_found_error"
	case tollgate.CodeRateLimitExceeded:
		return "rate_limit_error"
	case tollgate.CodeInsufficientBalance:
		return "insufficient_quota"
	case tollgate.CodeUpstreamError, tollgate.CodeBackendUnavailable, tollgate.CodeSearchUnavailable,
		tollgate.CodeTimeout, tollgate.CodeInternal, tollgate.CodeStoreUnavailable:
		return "server_error"
	}
	return "invalid_request_error"
}

func malformed(data []byte) *tollgate.Error {
	return &tollgate.Error{Code: tollgate.CodeUpstreamError,
		Message: "The model server sent a malformed stream.",
		Err:     errors.New("upstream chunk is not a JSON object: " + clip(string(data), 200))}
}

// normChoices rewrites a choices array; it returns the number of choices.
func (n *StreamNormalizer) normChoices(dst, val []byte, st *chunkState) ([]byte, int, error) {
	if isNull(val) {
		return append(dst, "[]"...), 0, nil
	}
	ai := newTrustedArrIter(val)
	if ai.err != nil {
		return dst, 0, errSyntax
	}
	dst = append(dst, '[')
	count := 0
	for {
		elem, ok := ai.next()
		if !ok {
			break
		}
		if count > 0 {
			dst = append(dst, ',')
		}
		var err error
		if dst, err = n.normChoice(dst, elem, count, st); err != nil {
			return dst, 0, err
		}
		count++
	}
	if ai.err != nil {
		return dst, 0, ai.err
	}
	return append(dst, ']'), count, nil
}

func (n *StreamNormalizer) collect(obj []byte) (start, end int, err error) {
	start = len(n.members)
	it := newTrustedObjIter(obj)
	for {
		k, raw, v, ok := it.next()
		if !ok {
			break
		}
		n.members = append(n.members, member{k, raw, v})
	}
	return start, len(n.members), it.err
}

func (n *StreamNormalizer) normChoice(dst, obj []byte, pos int, st *chunkState) ([]byte, error) {
	obj = trimWS(obj)
	if len(obj) == 0 || obj[0] != '{' {
		return dst, errSyntax
	}
	s, e, err := n.collect(obj)
	defer func() { n.members = n.members[:s] }()
	if err != nil {
		return dst, err
	}
	idx := pos
	hasIndex := false
	for _, m := range n.members[s:e] {
		if string(m.key) == "index" {
			if v, ok := jsonInt(m.val); ok {
				idx, hasIndex = int(v), true
			}
		}
	}
	dst = append(dst, '{')
	first := true
	if !hasIndex {
		dst = append(dst, `"index":`...)
		dst = strconv.AppendInt(dst, int64(pos), 10)
		first = false
	}
	for i := s; i < e; i++ {
		m := n.members[i]
		switch string(m.key) {
		case "stop_reason", "matched_stop", "native_finish_reason":
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, m.raw...)
		dst = append(dst, ':')
		switch string(m.key) {
		case "delta", "message": // a stream's delta, a non-streamed response's message
			before := st.delivered
			st.cur = idx
			if dst, err = n.normDelta(dst, m.val, idx, st, string(m.key) == "delta"); err != nil {
				return dst, err
			}
			if idx == 0 {
				st.deliveredFirst += st.delivered - before
			}
		case "finish_reason":
			if fr := trimWS(m.val); len(fr) > 2 && fr[0] == '"' {
				switch {
				case jsonStringIs(fr, "error"):
					st.finishErr = true
				case jsonStringIs(fr, "stop"), jsonStringIs(fr, "tool_calls"), jsonStringIs(fr, "function_call"):
					st.tokens++ // the end-of-turn token: generated, counted by servers, never shown
					st.finish = true
				default:
					st.finish = true
				}
			}
			dst = append(dst, m.val...)
		default:
			dst = append(dst, m.val...)
		}
	}
	return append(dst, '}'), nil
}

// normDelta rewrites a stream delta (inStream) or a response message.
func (n *StreamNormalizer) normDelta(dst, obj []byte, idx int, st *chunkState, inStream bool) ([]byte, error) {
	obj = trimWS(obj)
	if len(obj) == 0 || obj[0] != '{' {
		return append(dst, obj...), nil // null or odd: pass through
	}
	s, e, err := n.collect(obj)
	defer func() { n.members = n.members[:s] }()
	if err != nil {
		return dst, err
	}
	var hasRole, hasR, hasRC, rNull, rcNull, calls bool
	for _, m := range n.members[s:e] {
		switch string(m.key) {
		case "role":
			// SGLang dumps an unset role as null: treat it as absent.
			hasRole = !isNull(m.val)
		case "tool_calls":
			calls = !isNull(m.val) && string(trimWS(m.val)) != "[]"
		case "reasoning":
			hasR, rNull = true, isNull(m.val)
		case "reasoning_content":
			hasRC, rcNull = true, isNull(m.val)
		}
	}
	useRC := hasRC && (!hasR || (rNull && !rcNull))
	dst = append(dst, '{')
	first := true
	var bit uint64
	if idx >= 0 && idx < 64 {
		bit = 1 << uint(idx)
	}
	if hasRole {
		st.roleSent |= bit
	} else if !inStream {
		dst = append(dst, `"role":"assistant"`...)
		first = false
	} else if bit != 0 && st.roleSent&bit == 0 {
		dst = append(dst, `"role":"assistant"`...)
		st.roleSent |= bit
		st.roleAdded = true
		first = false
	}
	for i := s; i < e; i++ {
		m := n.members[i]
		key := string(m.key)
		switch key {
		case "role":
			if !hasRole {
				continue // null; "assistant" was added above when due
			}
		case "reasoning":
			if useRC {
				continue
			}
		case "reasoning_content":
			if !useRC {
				continue
			}
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		switch key {
		case "reasoning_content":
			dst = append(dst, `"reasoning":`...)
			st.generated(m.val, len(dst))
			dst = append(dst, m.val...)
		case "content", "reasoning", "refusal":
			dst = append(dst, m.raw...)
			dst = append(dst, ':')
			if key == "content" && !inStream && calls && string(trimWS(m.val)) == `""` {
				// A message that only calls tools has content null in the
				// reference API (PROTOCOL.md); llama.cpp and Ollama send "".
				dst = append(dst, "null"...)
				continue
			}
			st.generated(m.val, len(dst))
			dst = append(dst, m.val...)
		case "tool_calls":
			dst = append(dst, m.raw...)
			dst = append(dst, ':')
			if dst, err = n.normToolCalls(dst, m.val, st, inStream); err != nil {
				return dst, err
			}
		case "function_call":
			dst = append(dst, m.raw...)
			dst = append(dst, ':')
			dst = append(dst, m.val...)
			st.functionTexts(m.val, len(dst)-len(m.val))
		default:
			dst = append(dst, m.raw...)
			dst = append(dst, ':')
			dst = append(dst, m.val...)
		}
	}
	return append(dst, '}'), nil
}

// normToolCalls rewrites a tool_calls array: in stream deltas (addIndex) each
// entry gets the index it lacks; an entry with an id gets type "function"
// when it has none. Names and arguments are counted as delivered.
func (n *StreamNormalizer) normToolCalls(dst, val []byte, st *chunkState, addIndex bool) ([]byte, error) {
	ai := newTrustedArrIter(val)
	if ai.err != nil {
		return append(dst, val...), nil // null or odd: pass through
	}
	dst = append(dst, '[')
	pos := 0
	for {
		elem, ok := ai.next()
		if !ok {
			break
		}
		if pos > 0 {
			dst = append(dst, ',')
		}
		var err error
		if dst, err = n.normToolCall(dst, elem, pos, st, addIndex); err != nil {
			return dst, err
		}
		pos++
	}
	if ai.err != nil {
		return dst, ai.err
	}
	return append(dst, ']'), nil
}

func (n *StreamNormalizer) normToolCall(dst, obj []byte, pos int, st *chunkState, addIndex bool) ([]byte, error) {
	obj = trimWS(obj)
	if len(obj) == 0 || obj[0] != '{' {
		return append(dst, obj...), nil
	}
	s, e, err := n.collect(obj)
	defer func() { n.members = n.members[:s] }()
	if err != nil {
		return dst, err
	}
	var hasIndex, hasID, hasType bool
	for _, m := range n.members[s:e] {
		switch string(m.key) {
		case "index":
			hasIndex = true
		case "id":
			hasID = !isNull(m.val)
		case "type":
			hasType = !isNull(m.val)
		}
	}
	dst = append(dst, '{')
	first := true
	if addIndex && !hasIndex {
		dst = append(dst, `"index":`...)
		dst = strconv.AppendInt(dst, int64(pos), 10)
		first = false
	}
	for i := s; i < e; i++ {
		m := n.members[i]
		if string(m.key) == "type" && !hasType {
			continue // "type": null, replaced below
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, m.raw...)
		dst = append(dst, ':')
		dst = append(dst, m.val...)
		if string(m.key) == "function" {
			st.functionTexts(m.val, len(dst)-len(m.val))
		}
	}
	if hasID && !hasType {
		if !first {
			dst = append(dst, ',')
		}
		dst = append(dst, `"type":"function"`...)
	}
	return append(dst, '}'), nil
}

// streamFailure turns an upstream error payload (an "error" value, a whole
// error object, or llama.cpp's error event data) into the client-facing error.
// The upstream's own words go to Err (logged), never to Message.
func streamFailure(payload []byte) *tollgate.Error {
	info := describeUpstream(payload)
	if info.contextLength() {
		e := contextLengthError(info)
		e.Err = info.cause("", 0)
		return e
	}
	return &tollgate.Error{Code: tollgate.CodeUpstreamError,
		Message: "The model server failed while generating the answer.",
		Err:     info.cause("", 0)}
}

// AppendJSONString appends s as a JSON string (as encoding/json would, with
// <, > and & left as they are, and invalid UTF-8 replaced).
func AppendJSONString(dst []byte, s string) []byte { return appendJSONString(dst, s) }

func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
