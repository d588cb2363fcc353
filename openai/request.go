package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/tollgate/tollgate"
)

// ChatRequest is a parsed POST /v1/chat/completions body. Only the fields
// that change how tollgate handles the request are decoded; every other
// field is kept as the client's own bytes and passed upstream unchanged.
type ChatRequest struct {
	Model  string
	Stream bool
	// MaxTokens is the client's output cap (max_completion_tokens, else
	// max_tokens); 0 when the client gave none.
	MaxTokens int64
	// N is the number of choices asked for (1 when absent).
	N int64
	// Needs is what the request asks of the model.
	Needs tollgate.Capabilities
	// WebSearch holds the client's web_search_options object, nil when absent.
	WebSearch json.RawMessage
	// PromptBytes is the size of every message's content and tool definitions,
	// the raw material of the prompt-token bound.
	PromptBytes int64
	// Images and Files count image and document parts.
	Images, Files int64

	params [8]string // the field that asked for each capability, by bit index
	fields []field   // top-level members in the client's order
}

type field struct {
	key    string
	rawKey []byte // the key as the client wrote it, quotes included
	val    []byte // a slice of the client's body: no copy
}

// Param returns the request field that asked for capability c ("" if none).
func (r *ChatRequest) Param(c tollgate.Capability) string {
	i := capIndex(tollgate.NewCapabilities(c))
	if i < 0 {
		return ""
	}
	return r.params[i]
}

// Field returns the raw bytes of a top-level field, or nil.
func (r *ChatRequest) Field(key string) []byte {
	for _, f := range r.fields {
		if f.key == key {
			return f.val
		}
	}
	return nil
}

func capIndex(s tollgate.Capabilities) int {
	for i := 0; i < 8; i++ {
		if s == 1<<i {
			return i
		}
	}
	return -1
}

func (r *ChatRequest) need(c tollgate.Capability, param string) {
	bit := tollgate.NewCapabilities(c)
	if r.Needs&bit == 0 {
		r.params[capIndex(bit)] = param
	}
	r.Needs |= bit
}

// MaxN is the largest `n` accepted (the reference API's own limit).
const MaxN = 128

var validRoles = map[string]bool{
	"system": true, "developer": true, "user": true, "assistant": true, "tool": true, "function": true,
}

// ParseChatRequest validates body and detects the capabilities it needs.
// Errors are *tollgate.Error: invalid_json when the body is not a JSON
// object, invalid_request (with Param) when a field has the wrong shape.
func ParseChatRequest(body []byte) (*ChatRequest, error) {
	fields, err := splitObject(body)
	if err != nil {
		return nil, err
	}
	r := &ChatRequest{fields: fields, N: 1}
	var haveModel, haveMessages bool
	for _, f := range fields {
		v := f.val
		null := string(v) == "null"
		switch f.key {
		case "model":
			if err := json.Unmarshal(v, &r.Model); err != nil || null {
				return nil, invalidType("model", "a string")
			}
			haveModel = r.Model != ""
		case "messages":
			if err := r.parseMessages(v); err != nil {
				return nil, err
			}
			haveMessages = true
		case "stream":
			if !null {
				if err := json.Unmarshal(v, &r.Stream); err != nil {
					return nil, invalidType("stream", "a boolean")
				}
			}
		case "stream_options":
			if !null && v[0] != '{' {
				return nil, invalidType("stream_options", "an object")
			}
		case "max_tokens", "max_completion_tokens":
			if null {
				continue
			}
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				return nil, invalidType(f.key, "an integer")
			}
			if n < 1 {
				return nil, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, f.key, "%s must be at least 1, got %d", f.key, n)
			}
			// max_completion_tokens wins over the deprecated max_tokens, as in the reference API.
			if f.key == "max_completion_tokens" || r.MaxTokens == 0 || r.Field("max_completion_tokens") == nil {
				r.MaxTokens = n
			}
		case "n":
			if null {
				continue
			}
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				return nil, invalidType("n", "an integer")
			}
			if n < 1 || n > MaxN {
				return nil, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "n", "n must be between 1 and %d, got %d", MaxN, n)
			}
			r.N = n
		case "tools", "functions":
			if null {
				continue
			}
			if v[0] != '[' {
				return nil, invalidType(f.key, "an array")
			}
			if !isEmptyArray(v) {
				r.need(tollgate.CapTools, f.key)
				r.PromptBytes += int64(len(v))
			}
		case "tool_choice", "function_call":
			if null || string(v) == `"none"` {
				continue
			}
			r.need(tollgate.CapTools, f.key)
		case "reasoning_effort":
			if null {
				continue
			}
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				return nil, invalidType("reasoning_effort", "a string")
			}
			if s != "none" {
				r.need(tollgate.CapReasoning, "reasoning_effort")
			}
		case "reasoning":
			if null {
				continue
			}
			var o struct {
				Effort  *string `json:"effort"`
				Enabled *bool   `json:"enabled"`
			}
			if v[0] != '{' || json.Unmarshal(v, &o) != nil {
				return nil, invalidType("reasoning", "an object such as {\"effort\": \"medium\"}")
			}
			off := (o.Enabled != nil && !*o.Enabled) || (o.Effort != nil && *o.Effort == "none")
			if !off {
				r.need(tollgate.CapReasoning, "reasoning")
			}
		case "web_search_options":
			if null {
				continue
			}
			if v[0] != '{' {
				return nil, invalidType("web_search_options", "an object")
			}
			r.WebSearch = v
			r.need(tollgate.CapWebSearch, "web_search_options")
		}
	}
	if !haveModel {
		return nil, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "model", "model is required: pick an id from GET /v1/models")
	}
	if !haveMessages {
		return nil, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "messages", "messages is required")
	}
	return r, nil
}

func invalidType(param, want string) error {
	return tollgate.ParamErrorf(tollgate.CodeInvalidRequest, param, "%s must be %s", param, want)
}

type wireMessage struct {
	Role    json.RawMessage `json:"role"`
	Content json.RawMessage `json:"content"`
}

type wirePart struct {
	Type string `json:"type"`
}

func (r *ChatRequest) parseMessages(v []byte) error {
	if v[0] != '[' {
		return invalidType("messages", "an array of messages")
	}
	var msgs []json.RawMessage
	if err := json.Unmarshal(v, &msgs); err != nil {
		return invalidType("messages", "an array of messages")
	}
	if len(msgs) == 0 {
		return tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "messages", "messages must contain at least one message")
	}
	for i, raw := range msgs {
		param := "messages[" + strconv.Itoa(i) + "]"
		if raw[0] != '{' {
			return invalidType(param, "an object with role and content")
		}
		var m wireMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			return invalidType(param, "an object with role and content")
		}
		var role string
		if json.Unmarshal(m.Role, &role) != nil || !validRoles[role] {
			return tollgate.ParamErrorf(tollgate.CodeInvalidRequest, param+".role",
				"%s.role must be one of system, developer, user, assistant, tool, function", param)
		}
		r.PromptBytes += int64(len(raw))
		if len(m.Content) == 0 || string(m.Content) == "null" || m.Content[0] == '"' {
			continue
		}
		if m.Content[0] != '[' {
			return invalidType(param+".content", "a string or an array of content parts")
		}
		var parts []json.RawMessage
		if err := json.Unmarshal(m.Content, &parts); err != nil {
			return invalidType(param+".content", "a string or an array of content parts")
		}
		for j, pr := range parts {
			pparam := param + ".content[" + strconv.Itoa(j) + "]"
			var p wirePart
			if pr[0] != '{' || json.Unmarshal(pr, &p) != nil || p.Type == "" {
				return invalidType(pparam, "an object with a string type")
			}
			switch p.Type {
			case "image_url", "input_image", "image":
				r.Images++
				r.need(tollgate.CapImageInput, pparam)
			case "file", "input_file":
				r.Files++
				r.need(tollgate.CapPDFInput, pparam)
			}
		}
	}
	return nil
}

func isEmptyArray(v []byte) bool {
	return len(bytes.TrimSpace(v[1:len(v)-1])) == 0
}

// splitObject splits a JSON object into its top-level members without
// copying or decoding their values. It rejects anything that is not one
// valid JSON object with invalid_json.
func splitObject(b []byte) ([]field, error) {
	if !json.Valid(b) {
		return nil, tollgate.Errorf(tollgate.CodeInvalidJSON, "request body is not valid JSON")
	}
	i := reqSkipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, tollgate.Errorf(tollgate.CodeInvalidJSON, "request body must be a JSON object")
	}
	fields := make([]field, 0, 12)
	i = reqSkipWS(b, i+1)
	if b[i] == '}' {
		return fields, nil
	}
	for {
		// Valid JSON: a key string, ':', a value, then ',' or '}'.
		end := reqSkipString(b, i)
		rawKey := b[i:end]
		key := string(rawKey[1 : len(rawKey)-1])
		if bytes.IndexByte(rawKey, '\\') >= 0 {
			if err := json.Unmarshal(rawKey, &key); err != nil {
				return nil, tollgate.Errorf(tollgate.CodeInvalidJSON, "request body is not valid JSON")
			}
		}
		i = reqSkipWS(b, end)
		i = reqSkipWS(b, i+1) // ':'
		vend := reqSkipValue(b, i)
		// A repeated key: the last one wins, as in encoding/json and most servers.
		dup := false
		for k := range fields {
			if fields[k].key == key {
				fields[k].val = b[i:vend]
				dup = true
				break
			}
		}
		if !dup {
			fields = append(fields, field{key: key, rawKey: rawKey, val: b[i:vend]})
		}
		i = reqSkipWS(b, vend)
		if b[i] == '}' {
			return fields, nil
		}
		i = reqSkipWS(b, i+1) // ','
	}
}

func reqSkipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// reqSkipString returns the index just past the string starting at b[i] == '"'.
func reqSkipString(b []byte, i int) int {
	i++
	for {
		j := bytes.IndexAny(b[i:], `"\`)
		i += j
		if b[i] == '\\' {
			i += 2
			continue
		}
		return i + 1
	}
}

// reqSkipValue returns the index just past the (valid) JSON value at b[i].
func reqSkipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return reqSkipString(b, i)
	case '{', '[':
		depth := 0
		for {
			switch b[i] {
			case '"':
				i = reqSkipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
	default: // number, true, false, null
		for i < len(b) && !(b[i] == ',' || b[i] == '}' || b[i] == ']' || b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
			i++
		}
		return i
	}
}

// UpstreamOptions say how to rewrite a request for one backend.
type UpstreamOptions struct {
	Model   string  // the backend's own model name
	Flavour Flavour // the backend's server kind
	// MaxTokens, when > 0 and the client gave no cap, is sent as the output
	// cap (the cap the request's balance hold was computed for).
	MaxTokens int64
}

// AppendUpstreamBody appends the body to send upstream: the client's fields
// in their order and bytes, with `model` replaced, usage asked for on
// streams, web_search_options removed (tollgate serves web search itself),
// and the output cap named as the flavour understands it.
func (r *ChatRequest) AppendUpstreamBody(dst []byte, o UpstreamOptions) []byte {
	capKey := "max_tokens"
	if o.Flavour == OpenAI {
		// OpenAI's reasoning models reject max_tokens; max_completion_tokens works on all.
		capKey = "max_completion_tokens"
	}
	dst = append(dst, '{')
	first := true
	sep := func() {
		if !first {
			dst = append(dst, ',')
		}
		first = false
	}
	sawStreamOptions, sawCap := false, false
	for _, f := range r.fields {
		switch f.key {
		case "model":
			continue // written last, below
		case "web_search_options":
			continue
		case "max_tokens", "max_completion_tokens":
			if string(f.val) == "null" {
				continue
			}
			if sawCap {
				continue // one cap only: the effective one
			}
			sawCap = true
			sep()
			dst = appendKey(dst, capKey)
			dst = strconv.AppendInt(dst, r.MaxTokens, 10)
			continue
		case "stream_options":
			if r.Stream {
				sawStreamOptions = true
				sep()
				dst = appendKey(dst, "stream_options")
				dst = appendStreamOptions(dst, f.val)
				continue
			}
		}
		sep()
		dst = append(dst, f.rawKey...)
		dst = append(dst, ':')
		dst = append(dst, f.val...)
	}
	if r.Stream && !sawStreamOptions {
		sep()
		dst = append(dst, `"stream_options":{"include_usage":true}`...)
	}
	if !sawCap && o.MaxTokens > 0 {
		sep()
		dst = appendKey(dst, capKey)
		dst = strconv.AppendInt(dst, o.MaxTokens, 10)
	}
	sep()
	dst = appendKey(dst, "model")
	dst = strconv.AppendQuote(dst, o.Model)
	return append(dst, '}')
}

func appendKey(dst []byte, k string) []byte {
	dst = strconv.AppendQuote(dst, k)
	return append(dst, ':')
}

// appendStreamOptions forces include_usage to true and keeps every other option.
func appendStreamOptions(dst, v []byte) []byte {
	fields, err := splitObject(v)
	if err != nil || v[0] != '{' {
		return append(dst, `{"include_usage":true}`...)
	}
	dst = append(dst, `{"include_usage":true`...)
	for _, f := range fields {
		if f.key == "include_usage" {
			continue
		}
		dst = append(dst, ',')
		dst = append(dst, f.rawKey...)
		dst = append(dst, ':')
		dst = append(dst, f.val...)
	}
	return append(dst, '}')
}

// String is for debugging: never log it in production (it holds prompt text).
func (r *ChatRequest) String() string {
	return fmt.Sprintf("ChatRequest{model=%q stream=%v max=%d n=%d needs=%v}", r.Model, r.Stream, r.MaxTokens, r.N, r.Needs.List())
}
