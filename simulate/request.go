package simulate

import (
	"encoding/json"
)

// chatRequest holds what the simulator needs from a chat-completion body.
type chatRequest struct {
	model       string
	hasModel    bool
	hasMessages bool
	nMessages   int
	badRole     bool

	stream       bool
	includeUsage bool
	// continuousUsage is stream_options.continuous_usage_stats (vLLM,
	// SGLang): usage on every chunk, counting what was generated so far.
	continuousUsage bool
	maxTokens       int // -1: not given
	maxCompletion   int // -1: not given
	n               int
	stop            []string

	toolsRaw []byte
	// jsonSchema is response_format's json_schema.schema: the answer is an
	// instance of it (every flavour constrains output to it with a
	// grammar; real-servers */chat/24_json_schema).
	jsonSchema     []byte
	toolChoice     string // "", "auto", "none", "required", "function"
	toolChoiceName string

	reasoningAsked   bool
	reasoningOff     bool // reasoning explicitly disabled (effort none, enabled false)
	reasoningExclude bool // OpenRouter: count but do not return the text
	// reasoningInline: llama.cpp's reasoning_format "none" or
	// chat_template_kwargs.enable_thinking false. The server then leaves the
	// model's <think>…</think> in content (real-servers llamacpp/thinking/55
	// and 58: "<think> Hmm</think>Hello world!", no reasoning_content).
	reasoningInline bool

	promptTokens int
	images       int
	files        int
	lastUser     []byte // raw JSON text of the last user message's text parts
	messagesRaw  []byte // the messages array as sent (the GPU's prefix cache hashes it)

	// Web search state of the conversation (see websearch.go).
	lastTool    bool     // the last message is a tool result
	searchDone  int      // assistant turns with web_search calls since the last user message
	searchSeen  bool     // a search tool result since the last user message
	noMore      bool     // a tool result since the last user message says no more searches
	searchTexts [][]byte // raw text of every tool result of the conversation holding search results
	searchFrom  int      // searchTexts[searchFrom:] came after the last user message
}

// flagMember skips the value at vs and sets *flag when it is an object whose
// member key is, as written, want (stream_options.include_usage: true).
func flagMember(body []byte, vs int, key, want string, flag *bool) (int, error) {
	if body[vs] != '{' {
		return skipValue(body, vs)
	}
	return eachMember(body, vs, func(k []byte, v int) (int, error) {
		next, err := skipValue(body, v)
		if err == nil && string(k) == key && string(body[v:next]) == want {
			*flag = true
		}
		return next, err
	})
}

type fieldError struct {
	param string
	msg   string
}

func (e *fieldError) Error() string { return e.msg }

// parseChat reads body. A syntax error means the body is not JSON; a
// *fieldError means a field has the wrong type.
func parseChat(body []byte) (*chatRequest, error) {
	r := &chatRequest{maxTokens: -1, maxCompletion: -1, n: 1}
	i := skipWS(body, 0)
	if i >= len(body) {
		return nil, errEnd
	}
	end, err := eachMember(body, i, func(key []byte, vs int) (int, error) {
		switch string(key) {
		case "model":
			if body[vs] != '"' {
				return vs, &fieldError{"model", "model must be a string"}
			}
			raw, next, err := scanString(body, vs)
			if err != nil {
				return next, err
			}
			r.model = unquote(raw)
			r.hasModel = true
			return next, nil
		case "messages":
			if body[vs] == 'n' {
				return skipValue(body, vs)
			}
			if body[vs] != '[' {
				return vs, &fieldError{"messages", "messages must be an array"}
			}
			r.hasMessages = true
			next, err := r.parseMessages(body, vs)
			if err == nil {
				r.messagesRaw = body[vs:next]
			}
			return next, err
		case "stream":
			next, err := skipValue(body, vs)
			r.stream = err == nil && string(body[vs:next]) == "true"
			return next, err
		case "stream_options":
			if body[vs] != '{' {
				return skipValue(body, vs)
			}
			return eachMember(body, vs, func(k []byte, v int) (int, error) {
				next, err := skipValue(body, v)
				if err == nil && string(body[v:next]) == "true" {
					switch string(k) {
					case "include_usage":
						r.includeUsage = true
					case "continuous_usage_stats":
						r.continuousUsage = true
					}
				}
				return next, err
			})
		case "max_tokens", "max_completion_tokens", "n":
			v, next, ok, err := parseInt(body, vs)
			if err != nil {
				return next, err
			}
			if !ok {
				if body[vs] == 'n' { // null
					return next, nil
				}
				return next, &fieldError{string(key), string(key) + " must be an integer"}
			}
			switch string(key) {
			case "max_tokens":
				r.maxTokens = v
			case "max_completion_tokens":
				r.maxCompletion = v
			default:
				r.n = v
			}
			return next, nil
		case "stop":
			return r.parseStop(body, vs)
		case "tools":
			next, err := skipValue(body, vs)
			if err == nil && body[vs] == '[' && next-vs > 2 {
				r.toolsRaw = body[vs:next]
				r.promptTokens += ceilDiv(next-vs, 4)
			}
			return next, err
		case "tool_choice":
			return r.parseToolChoice(body, vs)
		case "response_format":
			return r.parseResponseFormat(body, vs)
		case "reasoning_format":
			next, err := skipValue(body, vs)
			if err == nil && string(body[vs:next]) == `"none"` {
				r.reasoningInline = true
			}
			return next, err
		case "chat_template_kwargs":
			return flagMember(body, vs, "enable_thinking", "false", &r.reasoningInline)
		case "reasoning_effort":
			next, err := skipValue(body, vs)
			if err == nil && body[vs] == '"' {
				switch string(body[vs+1 : next-1]) {
				case "none":
					r.reasoningOff = true
				default:
					r.reasoningAsked = true
				}
			}
			return next, err
		case "reasoning":
			if body[vs] != '{' {
				return skipValue(body, vs)
			}
			r.reasoningAsked = true
			return eachMember(body, vs, func(k []byte, v int) (int, error) {
				next, err := skipValue(body, v)
				if err != nil {
					return next, err
				}
				val := string(body[v:next])
				switch string(k) {
				case "enabled":
					if val == "false" {
						r.reasoningAsked, r.reasoningOff = false, true
					}
				case "effort":
					if val == `"none"` {
						r.reasoningAsked, r.reasoningOff = false, true
					}
				case "exclude":
					r.reasoningExclude = val == "true"
				}
				return next, nil
			})
		}
		return skipValue(body, vs)
	})
	if err != nil {
		return nil, err
	}
	if j := skipWS(body, end); j != len(body) {
		return nil, synErr(j, "invalid character after top-level value")
	}
	return r, nil
}

func (r *chatRequest) parseStop(body []byte, vs int) (int, error) {
	switch body[vs] {
	case '"':
		raw, next, err := scanString(body, vs)
		if err == nil && len(raw) > 0 {
			r.stop = append(r.stop, unquote(raw))
		}
		return next, err
	case '[':
		return eachElement(body, vs, func(v int) (int, error) {
			if body[v] != '"' {
				return skipValue(body, v)
			}
			raw, next, err := scanString(body, v)
			if err == nil && len(raw) > 0 {
				r.stop = append(r.stop, unquote(raw))
			}
			return next, err
		})
	}
	return skipValue(body, vs)
}

// parseResponseFormat keeps the schema of {"type":"json_schema",
// "json_schema":{"schema":{...}}}.
func (r *chatRequest) parseResponseFormat(body []byte, vs int) (int, error) {
	if body[vs] != '{' {
		return skipValue(body, vs)
	}
	return eachMember(body, vs, func(k []byte, v int) (int, error) {
		if string(k) != "json_schema" || body[v] != '{' {
			return skipValue(body, v)
		}
		return eachMember(body, v, func(k2 []byte, v2 int) (int, error) {
			next, err := skipValue(body, v2)
			if err == nil && string(k2) == "schema" && body[v2] == '{' {
				r.jsonSchema = body[v2:next]
			}
			return next, err
		})
	})
}

func (r *chatRequest) parseToolChoice(body []byte, vs int) (int, error) {
	if body[vs] == '"' {
		raw, next, err := scanString(body, vs)
		r.toolChoice = string(raw)
		return next, err
	}
	if body[vs] != '{' {
		return skipValue(body, vs)
	}
	r.toolChoice = "function"
	return eachMember(body, vs, func(k []byte, v int) (int, error) {
		if string(k) != "function" || body[v] != '{' {
			return skipValue(body, v)
		}
		return eachMember(body, v, func(k2 []byte, v2 int) (int, error) {
			if string(k2) == "name" && body[v2] == '"' {
				raw, next, err := scanString(body, v2)
				r.toolChoiceName = unquote(raw)
				return next, err
			}
			return skipValue(body, v2)
		})
	})
}

// Tokenizer rule (see docs/simulator.md): every message costs 4 tokens plus its
// text at one token per 4 bytes (rounded up, measured on the JSON-encoded
// text), an image part 85 tokens plus one per KiB of its URL or base64 data,
// a file part 256 tokens plus one per KiB of its data; tools cost their JSON
// size / 4; every prompt adds 3 tokens for the reply's priming.
const (
	tokensPerMessage = 4
	tokensPriming    = 3
	tokensPerImage   = 85
	tokensPerFile    = 256
)

func ceilDiv(a, b int) int { return (a + b - 1) / b }

func (r *chatRequest) parseMessages(body []byte, vs int) (int, error) {
	r.promptTokens += tokensPriming
	return eachElement(body, vs, func(ms int) (int, error) {
		if body[ms] != '{' {
			return ms, &fieldError{"messages", "each message must be an object"}
		}
		r.nMessages++
		r.promptTokens += tokensPerMessage
		var role []byte
		var text []byte      // raw text of this message (first text part, or content string)
		var toolCalls []byte // raw tool_calls of an assistant message
		next, err := eachMember(body, ms, func(k []byte, v int) (int, error) {
			switch string(k) {
			case "role":
				raw, next, err := scanString(body, v)
				role = raw
				return next, err
			case "content":
				switch body[v] {
				case '"':
					raw, next, err := scanString(body, v)
					text = raw
					r.promptTokens += ceilDiv(len(raw), 4)
					return next, err
				case '[':
					return eachElement(body, v, func(ps int) (int, error) {
						return r.parsePart(body, ps, &text)
					})
				}
				return skipValue(body, v)
			case "tool_calls", "name", "tool_call_id", "reasoning_content", "reasoning":
				next, err := skipValue(body, v)
				r.promptTokens += ceilDiv(next-v, 4)
				if string(k) == "tool_calls" {
					toolCalls = body[v:next]
				}
				return next, err
			}
			return skipValue(body, v)
		})
		if err != nil {
			return next, err
		}
		r.lastTool = false
		switch string(role) {
		case "user":
			r.lastUser = text
			r.searchDone, r.searchSeen, r.noMore = 0, false, false
			r.searchFrom = len(r.searchTexts)
		case "assistant":
			if toolCalls != nil && indexBytes(toolCalls, `"`+webSearchName+`"`) >= 0 {
				r.searchDone++
			}
		case "tool":
			r.lastTool = true
			r.noteToolResult(text)
		case "system", "developer", "function":
		default:
			r.badRole = true
		}
		return next, nil
	})
}

func (r *chatRequest) parsePart(body []byte, ps int, text *[]byte) (int, error) {
	if body[ps] != '{' {
		return skipValue(body, ps)
	}
	var typ []byte
	size := 0
	var partText []byte
	next, err := eachMember(body, ps, func(k []byte, v int) (int, error) {
		switch string(k) {
		case "type":
			raw, next, err := scanString(body, v)
			typ = raw
			return next, err
		case "text":
			raw, next, err := scanString(body, v)
			partText = raw
			return next, err
		case "image_url", "file", "input_file", "input_audio":
			next, err := skipValue(body, v)
			size = next - v
			return next, err
		}
		return skipValue(body, v)
	})
	if err != nil {
		return next, err
	}
	switch string(typ) {
	case "text", "input_text":
		r.promptTokens += ceilDiv(len(partText), 4)
		if *text == nil {
			*text = partText
		} else {
			joined := make([]byte, 0, len(*text)+1+len(partText))
			joined = append(append(append(joined, *text...), ' '), partText...)
			*text = joined
		}
	case "image_url", "input_image":
		r.images++
		r.promptTokens += tokensPerImage + ceilDiv(size, 1024)
	case "file", "input_file":
		r.files++
		r.promptTokens += tokensPerFile + ceilDiv(size, 1024)
	default:
		r.promptTokens += ceilDiv(size, 4)
	}
	return next, nil
}

// toolDef is one offered function.
type toolDef struct {
	Type     string `json:"type"`
	Function struct {
		Name       string          `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
	} `json:"function"`
}

func (r *chatRequest) tools() []toolDef {
	if r.toolsRaw == nil {
		return nil
	}
	var ts []toolDef
	if err := json.Unmarshal(r.toolsRaw, &ts); err != nil {
		return nil
	}
	out := ts[:0]
	for _, t := range ts {
		if t.Function.Name != "" {
			out = append(out, t)
		}
	}
	return out
}
