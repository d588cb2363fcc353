package openai

import (
	"encoding/json"
	"errors"
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
	// ToolChoice is the kind of tool_choice (or function_call) asked for.
	ToolChoice ToolChoice
	// WebSearch holds the client's web_search_options object, nil when absent.
	WebSearch json.RawMessage
	// PromptBytes is the size of the messages and tool definitions without
	// their image and document parts: the text a tokenizer turns into prompt
	// tokens (images and documents are counted by allowances instead).
	PromptBytes int64
	// Images and Files count image and document parts.
	Images, Files int64

	hasTools bool      // tools or functions, not empty
	params   [8]string // the field that asked for each capability, by bit index
	fields   []field   // top-level members in the client's order
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
//
// The body is scanned once with validation; nested values are then walked
// with trusted (non-validating) scans, and nothing is decoded that tollgate
// does not act on.
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
			s, ok := jsonString(v)
			if !ok {
				return nil, invalidType("model", "a string")
			}
			r.Model = s
			haveModel = s != ""
		case "messages":
			if err := r.parseMessages(v); err != nil {
				return nil, err
			}
			haveMessages = true
		case "stream":
			switch string(v) {
			case "true":
				r.Stream = true
			case "false", "null":
			default:
				return nil, invalidType("stream", "a boolean")
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
				r.hasTools = true
				r.need(tollgate.CapTools, f.key)
				r.PromptBytes += int64(len(v))
			}
		case "tool_choice", "function_call":
			if null {
				continue
			}
			r.ToolChoice = toolChoiceOf(v)
			if r.ToolChoice == ToolChoiceNone {
				continue
			}
			r.need(tollgate.CapTools, f.key)
		case "reasoning_effort":
			if null {
				continue
			}
			s, ok := jsonString(v)
			if !ok {
				return nil, invalidType("reasoning_effort", "a string")
			}
			if s != "none" {
				r.need(tollgate.CapReasoning, "reasoning_effort")
			}
		case "reasoning":
			if null {
				continue
			}
			if v[0] != '{' {
				return nil, invalidType("reasoning", "an object such as {\"effort\": \"medium\"}")
			}
			off := false
			it := newTrustedObjIter(v)
			for k, _, val, ok := it.next(); ok; k, _, val, ok = it.next() {
				switch string(k) {
				case "enabled":
					off = off || string(val) == "false"
				case "effort":
					off = off || string(val) == `"none"`
				}
			}
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

func (r *ChatRequest) parseMessages(v []byte) error {
	if v[0] != '[' {
		return invalidType("messages", "an array of messages")
	}
	msgs := newTrustedArrIter(v)
	i := 0
	for raw, ok := msgs.next(); ok; raw, ok = msgs.next() {
		param := "messages[" + strconv.Itoa(i) + "]"
		i++
		if raw[0] != '{' {
			return invalidType(param, "an object with role and content")
		}
		var role string
		var content []byte
		it := newTrustedObjIter(raw)
		for k, _, val, ok := it.next(); ok; k, _, val, ok = it.next() {
			switch string(k) {
			case "role":
				role, _ = jsonString(val)
			case "content":
				content = val
			}
		}
		if !validRoles[role] {
			return tollgate.ParamErrorf(tollgate.CodeInvalidRequest, param+".role",
				"%s.role must be one of system, developer, user, assistant, tool, function", param)
		}
		r.PromptBytes += int64(len(raw))
		if len(content) == 0 || content[0] == 'n' || content[0] == '"' {
			continue
		}
		if content[0] != '[' {
			return invalidType(param+".content", "a string or an array of content parts")
		}
		parts := newTrustedArrIter(content)
		j := 0
		for pr, ok := parts.next(); ok; pr, ok = parts.next() {
			pparam := param + ".content[" + strconv.Itoa(j) + "]"
			j++
			var typ string
			if pr[0] == '{' {
				pit := newTrustedObjIter(pr)
				for k, _, val, ok := pit.next(); ok; k, _, val, ok = pit.next() {
					if string(k) == "type" {
						typ, _ = jsonString(val)
					}
				}
			}
			switch typ {
			case "":
				return invalidType(pparam, "an object with a string type")
			case "image_url", "input_image", "image":
				r.Images++
				r.PromptBytes -= int64(len(pr))
				r.need(tollgate.CapImageInput, pparam)
			case "file", "input_file":
				r.Files++
				r.PromptBytes -= int64(len(pr))
				r.need(tollgate.CapPDFInput, pparam)
			}
		}
	}
	if i == 0 {
		return tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "messages", "messages must contain at least one message")
	}
	return nil
}

func isEmptyArray(v []byte) bool {
	return len(trimWS(v[1:len(v)-1])) == 0
}

// splitObject splits a JSON object into its top-level members without
// copying or decoding their values, validating the whole body on the way.
// It rejects anything that is not one valid JSON object with invalid_json.
func splitObject(b []byte) ([]field, error) {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		if json.Valid(b) {
			return nil, tollgate.Errorf(tollgate.CodeInvalidJSON, "request body must be a JSON object")
		}
		return nil, tollgate.Errorf(tollgate.CodeInvalidJSON, "request body is not valid JSON")
	}
	fields := make([]field, 0, 12)
	it := newObjIter(b)
	for key, rawKey, val, ok := it.next(); ok; key, rawKey, val, ok = it.next() {
		k := string(key)
		// A repeated key: the last one wins, as in encoding/json and most servers.
		dup := false
		for n := range fields {
			if fields[n].key == k {
				fields[n].val = val
				dup = true
				break
			}
		}
		if !dup {
			fields = append(fields, field{key: k, rawKey: rawKey, val: val})
		}
	}
	if !it.restOK() {
		if errors.Is(it.err, errTooDeep) {
			return nil, tollgate.Errorf(tollgate.CodeInvalidJSON,
				"request body nests arrays and objects more than %d levels deep, the limit", MaxDepth)
		}
		return nil, tollgate.Errorf(tollgate.CodeInvalidJSON, "request body is not valid JSON")
	}
	return fields, nil
}

// UpstreamOptions say how to rewrite a request for one backend.
type UpstreamOptions struct {
	Model   string  // the backend's own model name
	Flavour Flavour // the backend's server kind
	// MaxTokens, when > 0 and the client gave no cap, is sent as the output
	// cap (the cap the request's balance hold was computed for).
	MaxTokens int64
	// OneChoice leaves n out: tollgate makes one call per choice itself
	// (relay/emulate.go), or serves one choice (web search).
	OneChoice bool
	// NonStream asks for one JSON answer whatever the client asked
	// (stream and stream_options left out).
	NonStream bool
	// ToolCall, when set, is the JSON schema of the tool call the answer
	// must be (ToolCallSchema): the client's tools and tool_choice are left
	// out, the tools are described in a system message, and the answer is
	// constrained to the schema by response_format (json_schema), which
	// Ollama and llama.cpp enforce with a grammar.
	ToolCall []byte
}

// AppendUpstreamBody appends the body to send upstream: the client's fields
// in their order and bytes, with `model` replaced, usage asked for on
// streams, web_search_options removed (tollgate serves web search itself),
// the output cap named as the flavour understands it, and, for a server that
// ignores tool_choice "none" (ControlTable), no tools offered at all.
func (r *ChatRequest) AppendUpstreamBody(dst []byte, o UpstreamOptions) []byte {
	dropTools := r.ToolChoice == ToolChoiceNone && !o.Flavour.Honours(ControlToolChoiceNone) || o.ToolCall != nil
	stream := r.Stream && !o.NonStream
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
		case "n":
			if o.OneChoice {
				continue
			}
		case "stream":
			if o.NonStream {
				continue
			}
		case "response_format":
			if o.ToolCall != nil {
				continue // the tool call's schema replaces it
			}
		case "messages":
			if o.ToolCall != nil {
				sep()
				dst = append(dst, f.rawKey...)
				dst = append(dst, ':')
				dst = appendToolSystemMessage(dst, f.val, o.ToolCall)
				continue
			}
		case "tools", "functions", "tool_choice", "function_call", "parallel_tool_calls":
			if dropTools {
				continue // the server would call the tools anyway
			}
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
			if !stream {
				continue // servers such as vLLM reject stream_options without stream
			}
			sawStreamOptions = true
			sep()
			dst = appendKey(dst, "stream_options")
			dst = appendStreamOptions(dst, f.val)
			continue
		}
		sep()
		dst = append(dst, f.rawKey...)
		dst = append(dst, ':')
		dst = append(dst, f.val...)
	}
	if stream && !sawStreamOptions {
		sep()
		dst = append(dst, `"stream_options":{"include_usage":true}`...)
	}
	if o.ToolCall != nil {
		sep()
		dst = append(dst, `"response_format":{"type":"json_schema","json_schema":{"name":"tool_call","strict":true,"schema":`...)
		dst = append(dst, o.ToolCall...)
		dst = append(dst, "}}"...)
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
