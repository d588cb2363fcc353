package simulate

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/tollgate/tollgate/internal/jsonscan"
)

// errKind is a failure the simulator reports, rendered per flavour.
type errKind uint8

const (
	errMalformed     errKind = iota // body is not JSON
	errInvalid                      // wrong field type, missing field
	errNoMessages                   // messages missing
	errEmptyMessages                // messages: []
	errUnknownModel
	errContext
	errOverload
	errInternal
	errCapability // tools / images / files / reasoning on a model without them
)

// apiError is what a handler decided to answer with.
type apiError struct {
	kind    errKind
	message string // detail used where the flavour's text has a slot for it
	param   string
	prompt  int    // context errors: prompt tokens
	capName string // capability errors: "tools", "image", "file", "reasoning"
}

// errorStatus is the HTTP status each flavour answers kind with.
func (s *Server) errorStatus(e *apiError) int {
	switch e.kind {
	case errMalformed:
		if s.flavour == LlamaCpp {
			return http.StatusInternalServerError
		}
		return http.StatusBadRequest
	case errUnknownModel:
		if s.flavour == OpenRouter {
			return http.StatusBadRequest
		}
		return http.StatusNotFound
	case errOverload:
		return http.StatusServiceUnavailable
	case errInternal:
		return http.StatusInternalServerError
	case errCapability:
		switch s.flavour {
		case OpenRouter:
			return http.StatusNotFound
		case LlamaCpp:
			// llama-server throws both refusals as runtime errors while
			// parsing the request; its handler wrapper answers any
			// exception 500 server_error.
			if e.capName == "image" || e.capName == "tools" {
				return http.StatusInternalServerError
			}
		case Ollama:
			if e.capName == "image" {
				return http.StatusInternalServerError
			}
		}
		return http.StatusBadRequest
	}
	return http.StatusBadRequest
}

// writeError answers e in the flavour's error shape.
func (s *Server) writeError(w http.ResponseWriter, e *apiError) {
	status := s.errorStatus(e)
	msg := s.errorMessage(e)
	h := w.Header()
	var b []byte
	switch s.flavour {
	case LlamaCpp:
		typ := "invalid_request_error"
		switch status {
		case 500:
			typ = "server_error"
		case 503:
			typ = "unavailable_error"
		case 404:
			typ = "not_found_error"
		}
		if e.kind == errContext {
			typ = "exceed_context_size_error"
		}
		b = append(b, `{"error":{"code":`...)
		b = appendInt(b, status)
		b = append(b, `,"message":`...)
		b = appendJSONString(b, msg)
		b = append(b, `,"type":`...)
		b = appendJSONString(b, typ)
		if e.kind == errContext {
			b = append(b, `,"n_prompt_tokens":`...)
			b = appendInt(b, e.prompt)
			b = append(b, `,"n_ctx":`...)
			b = appendInt(b, s.cfg.ContextLength)
		}
		b = append(b, "}}"...)
		h.Set("Content-Type", "application/json; charset=utf-8")
		h.Set("Server", "llama.cpp")
	case Ollama:
		typ := "invalid_request_error"
		switch status {
		case 404:
			typ = "not_found_error"
		case 500, 503:
			typ = "api_error"
		}
		b = s.appendOpenAIError(b, msg, typ, "", "")
		if e.kind == errMalformed || e.kind == errNoMessages || e.kind == errEmptyMessages || e.kind == errInvalid {
			h.Set("Content-Type", "application/json; charset=utf-8")
		} else {
			h.Set("Content-Type", "application/json")
		}
	case VLLM:
		typ, param := vllmErrType(status), e.param
		switch e.kind {
		case errMalformed, errNoMessages, errInvalid:
			// api_server.py's RequestValidationError handler: the HTTP
			// phrase as type, no param.
			typ, param = "Bad Request", ""
		case errContext:
			param = "input_tokens" // VLLMValidationError(parameter="input_tokens")
		}
		b = append(b, `{"error":{"message":`...)
		b = appendJSONString(b, msg)
		b = append(b, `,"type":`...)
		b = appendJSONString(b, typ)
		b = append(b, `,"param":`...)
		b = appendStringOrNull(b, param, param == "")
		b = append(b, `,"code":`...)
		b = appendInt(b, status)
		b = append(b, "}}"...)
		h.Set("Content-Type", "application/json")
	case SGLang:
		// SGLang's create_error_response is never given a param; its
		// validation handler uses the HTTP phrase as type.
		typ := vllmErrType(status)
		switch e.kind {
		case errMalformed, errNoMessages, errInvalid:
			typ = "Bad Request"
		}
		b = append(b, `{"object":"error","message":`...)
		b = appendJSONString(b, msg)
		b = append(b, `,"type":`...)
		b = appendJSONString(b, typ)
		b = append(b, `,"param":null,"code":`...)
		b = appendInt(b, status)
		b = append(b, '}')
		h.Set("Content-Type", "application/json")
	case OpenAI:
		typ, code := "invalid_request_error", ""
		switch e.kind {
		case errUnknownModel:
			code = "model_not_found"
		case errContext:
			code = "context_length_exceeded"
		case errEmptyMessages:
			code = "empty_array"
		case errCapability:
			code = "unsupported_parameter"
		case errOverload, errInternal:
			typ = "server_error"
		}
		b = s.appendOpenAIError(b, msg, typ, e.param, code)
		h.Set("Content-Type", "application/json")
	default: // OpenRouter
		b = append(b, `{"error":{"message":`...)
		b = appendJSONString(b, msg)
		b = append(b, `,"code":`...)
		b = appendInt(b, status)
		b = append(b, "}}"...)
		h.Set("Content-Type", "application/json")
	}
	if status == http.StatusServiceUnavailable {
		h.Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	w.Write(b)
}

func (s *Server) appendOpenAIError(b []byte, msg, typ, param, code string) []byte {
	b = append(b, `{"error":{"message":`...)
	b = appendJSONString(b, msg)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, typ)
	b = append(b, `,"param":`...)
	b = appendStringOrNull(b, param, param == "")
	b = append(b, `,"code":`...)
	b = appendStringOrNull(b, code, code == "")
	return append(b, "}}"...)
}

func vllmErrType(status int) string {
	switch status {
	case 404:
		return "NotFoundError"
	case 500:
		return "InternalServerError"
	case 503:
		return "ServiceUnavailableError"
	}
	return "BadRequestError"
}

// errorMessage is each server's wording (see docs/simulator.md for sources).
func (s *Server) errorMessage(e *apiError) string {
	f := s.flavour
	ctx := s.cfg.ContextLength
	switch e.kind {
	case errMalformed:
		switch f {
		case LlamaCpp:
			if e.message == "" {
				return "[json.exception.parse_error.101] parse error at line 1, column 1: attempting to parse an empty input; check that your input string or stream contains the expected JSON"
			}
			return "[json.exception.parse_error.101] parse error: syntax error while parsing value - " + e.message
		case Ollama:
			if e.message == "" {
				return "EOF"
			}
			return e.message
		case VLLM, SGLang:
			return "[{'type': 'json_invalid', 'loc': ('body', 0), 'msg': 'JSON decode error', 'input': {}, 'ctx': {'error': '" + e.message + "'}}]"
		case OpenAI:
			return "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON. If you have trouble figuring out how to fix this, please contact us through our help center at help.openai.com.)"
		}
		return "Invalid JSON body"
	case errNoMessages, errEmptyMessages:
		if f == SGLang && e.kind == errEmptyMessages {
			return "Messages cannot be empty." // serving_chat.py _validate_request
		}
		switch f {
		case LlamaCpp:
			return "'messages' is required"
		case Ollama, OpenAI:
			return "[] is too short - 'messages'"
		case VLLM, SGLang:
			return "[{'type': 'missing', 'loc': ('body', 'messages'), 'msg': 'Field required'}]"
		}
		return "Input required: specify \"prompt\" or \"messages\""
	case errUnknownModel:
		switch f {
		case Ollama:
			return fmt.Sprintf("model '%s' not found", e.message)
		case VLLM, SGLang:
			return fmt.Sprintf("The model `%s` does not exist.", e.message)
		case OpenAI:
			return fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", e.message)
		}
		return e.message + " is not a valid model ID"
	case errContext:
		switch f {
		case LlamaCpp:
			return fmt.Sprintf("request (%d tokens) exceeds the available context size (%d tokens), try increasing it", e.prompt, ctx)
		case Ollama:
			inner := fmt.Sprintf(`{"error":{"code":400,"message":"request (%d tokens) exceeds the available context size (%d tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":%d,"n_ctx":%d}}`, e.prompt, ctx, e.prompt, ctx)
			return inner
		case VLLM:
			return fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", ctx, e.prompt)
		case SGLang:
			return fmt.Sprintf("The input (%d tokens) is longer than the model's context length (%d tokens).", e.prompt, ctx)
		case OpenAI:
			return fmt.Sprintf("This model's maximum context length is %d tokens. However, your messages resulted in %d tokens. Please reduce the length of the messages.", ctx, e.prompt)
		}
		return fmt.Sprintf("This endpoint's maximum context length is %d tokens. However, you requested about %d tokens. Please reduce the length of either one, or use the \"middle-out\" transform to compress your prompt automatically.", ctx, e.prompt)
	case errOverload:
		switch f {
		case LlamaCpp:
			return "Loading model"
		case Ollama:
			return "server busy, please try again.  maximum pending requests exceeded"
		case OpenAI:
			return "The engine is currently overloaded, please try again later"
		case OpenRouter:
			return "No instances available: the provider is overloaded"
		}
		return "Service Unavailable"
	case errInternal:
		switch f {
		case OpenAI:
			return "The server had an error while processing your request. Sorry about that!"
		case OpenRouter:
			return "Internal Server Error"
		case Ollama:
			return "llama runner process has terminated: exit status 2"
		}
		return "Internal server error"
	case errCapability:
		return s.capabilityMessage(e)
	}
	if e.message != "" {
		return e.message
	}
	return "Bad request"
}

func (s *Server) capabilityMessage(e *apiError) string {
	model := e.message
	switch s.flavour {
	case VLLM:
		switch e.capName {
		case "tools":
			return `"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set`
		case "image":
			// The multimodal registry's ValueError, answered 400.
			return model + " is not a multimodal model"
		}
		return "Unknown part type: file"
	case SGLang:
		switch e.capName {
		case "tools":
			return "Tool calls are not supported: the server was started without --tool-call-parser"
		case "image":
			return "The model does not support image input"
		}
		return "Unsupported content part type: file"
	case LlamaCpp:
		switch e.capName {
		case "tools":
			return "tools param requires --jinja flag"
		case "image":
			return "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj"
		}
		return "unsupported content[].type"
	case Ollama:
		switch e.capName {
		case "tools":
			return fmt.Sprintf("registry.ollama.ai/library/%s does not support tools", model)
		case "image":
			return "this model is missing data required for image input"
		}
		return "invalid content part type: file"
	case OpenAI:
		switch e.capName {
		case "reasoning":
			return "Unsupported parameter: 'reasoning_effort' is not supported with this model."
		case "tools":
			return "tools is not supported with this model."
		case "image":
			return "Invalid content type. image_url is only supported by certain models."
		}
		return "Invalid content type. file is only supported by certain models."
	}
	switch e.capName {
	case "tools":
		return "No endpoints found that support tool use. To learn more about provider routing, visit: https://openrouter.ai/docs/provider-routing"
	case "image":
		return "No endpoints found that support image input"
	}
	return "No endpoints found that support file input"
}

// malformedDetail renders a scanner error the way the flavour's JSON library
// words it (approximately).
func malformedDetail(f Flavour, body []byte, err error) string {
	if len(strings.TrimSpace(string(body))) == 0 {
		return ""
	}
	var se *jsonscan.SyntaxError
	switch f {
	case Ollama:
		if errors.Is(err, jsonscan.ErrEnd) {
			return "unexpected EOF"
		}
		if errors.As(err, &se) {
			return se.Msg
		}
	case LlamaCpp:
		if errors.Is(err, jsonscan.ErrEnd) {
			return "unexpected end of input"
		}
	}
	if errors.As(err, &se) {
		return se.Error()
	}
	return err.Error()
}

// appendStreamError writes the flavour's mid-stream error event (and what
// follows it); it reports whether [DONE] was written.
func (s *Server) appendStreamError(b []byte, p *plan) []byte {
	switch s.flavour {
	case LlamaCpp:
		return append(b, "data: {\"error\":{\"code\":500,\"message\":\"simulated failure during generation\",\"type\":\"server_error\"}}\n\n"...)
	case VLLM:
		// create_streaming_error_response: json.dumps, so ", " and ": "
		// separators; a GenerationError is InternalServerError 500.
		b = append(b, "data: {\"error\": {\"message\": \"Internal server error\", \"type\": \"InternalServerError\", \"param\": null, \"code\": 500}}\n\n"...)
		return append(b, "data: [DONE]\n\n"...)
	case SGLang:
		// Only a ValueError is caught mid-stream, reported with the
		// defaults of create_streaming_error_response (BadRequestError,
		// 400) through json.dumps.
		b = append(b, "data: {\"error\": {\"object\": \"error\", \"message\": \"simulated failure during generation\", \"type\": \"BadRequestError\", \"param\": null, \"code\": 400}}\n\n"...)
		return append(b, "data: [DONE]\n\n"...)
	case Ollama:
		return append(b, "data: {\"error\":{\"message\":\"llama runner process has terminated: exit status 2\",\"type\":\"api_error\",\"param\":null,\"code\":null}}\n\n"...)
	case OpenAI:
		return append(b, "data: {\"error\":{\"message\":\"The server had an error while processing your request. Sorry about that!\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n"...)
	}
	// OpenRouter: one chunk with the error, finish_reason "error" and the
	// usage (with cost) of what was generated, then the stream ends.
	b = append(b, "data: {\"id\":"...)
	b = appendJSONString(b, p.id)
	b = append(b, `,"provider":"Simulated","model":`...)
	b = appendJSONString(b, p.model)
	b = append(b, `,"object":"chat.completion.chunk","created":`...)
	b = appendInt(b, int(p.created))
	b = append(b, `,"error":{"code":"server_error","message":"Provider disconnected unexpectedly"},"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":"error","native_finish_reason":"error","logprobs":null}],"usage":`...)
	b = s.appendUsage(b, p)
	return append(b, "}\n\n"...)
}
