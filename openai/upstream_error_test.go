package openai

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tollgate/tollgate"
)

type upstreamErrCase struct {
	name     string
	fl       Flavour
	status   int
	body     string
	code     tollgate.Code
	contains []string // in the client-facing message
	never    []string // must not appear in the message
}

func checkUpstreamErr(t *testing.T, tc upstreamErrCase) {
	t.Helper()
	e := ClassifyUpstreamError(tc.fl, tc.status, []byte(tc.body))
	if e == nil {
		t.Fatalf("%s: nil error", tc.name)
	}
	if e.Code != tc.code {
		t.Errorf("%s: code %s, want %s (message %q)", tc.name, e.Code, tc.code, e.Message)
	}
	if e.Message == "" || e.Err == nil {
		t.Errorf("%s: message %q, cause %v", tc.name, e.Message, e.Err)
	}
	for _, s := range tc.contains {
		if !strings.Contains(e.Message, s) {
			t.Errorf("%s: message %q lacks %q", tc.name, e.Message, s)
		}
	}
	for _, s := range append(tc.never, "http://", "https://", "/models/", "sk-", "Traceback") {
		if strings.Contains(e.Message, s) {
			t.Errorf("%s: message %q leaks %q", tc.name, e.Message, s)
		}
	}
	if tc.code == tollgate.CodeContextLengthExceeded && e.Param != "messages" {
		t.Errorf("%s: param %q", tc.name, e.Param)
	}
}

func TestClassifyUpstreamErrorCaptures(t *testing.T) {
	for _, tc := range []struct {
		path     string
		code     tollgate.Code
		contains []string
		never    []string
	}{
		{"llamacpp/11_context_exceeded", tollgate.CodeContextLengthExceeded, []string{"9010", "1024"}, nil},
		{"llamacpp/12_context_exceeded_stream", tollgate.CodeContextLengthExceeded, []string{"9010", "1024"}, nil},
		{"ollama/11_context_exceeded", tollgate.CodeContextLengthExceeded, []string{"9010", "4096"}, []string{"{"}},
		{"ollama/12_context_exceeded_stream", tollgate.CodeContextLengthExceeded, []string{"9010", "4096"}, nil},
		{"llamacpp/13_malformed_json", tollgate.CodeUpstreamError, []string{"500"}, []string{"json.exception"}},
		{"llamacpp/34_empty_body", tollgate.CodeUpstreamError, []string{"500"}, []string{"parse error"}},
		{"llamacpp/14_missing_messages", tollgate.CodeInvalidRequest, []string{"'messages' is required"}, nil},
		{"ollama/13_malformed_json", tollgate.CodeInvalidRequest, []string{"unexpected EOF"}, nil},
		{"ollama/14_missing_messages", tollgate.CodeInvalidRequest, []string{"too short"}, nil},
		{"ollama/15_empty_messages", tollgate.CodeInvalidRequest, []string{"too short"}, nil},
		{"ollama/34_empty_body", tollgate.CodeInvalidRequest, []string{"EOF"}, nil},
		{"ollama/17_unknown_model", tollgate.CodeUpstreamError, []string{"404"}, []string{"no-such-model"}},
		{"llamacpp/26_wrong_method", tollgate.CodeUpstreamError, []string{"404"}, []string{"File Not Found"}},
		{"llamacpp/27_not_found", tollgate.CodeUpstreamError, []string{"404"}, nil},
		{"ollama/26_wrong_method", tollgate.CodeUpstreamError, []string{"405"}, nil},
		{"ollama/27_not_found", tollgate.CodeUpstreamError, []string{"404"}, []string{"page not found"}},
	} {
		c := readCapture(t, "testdata/captures/"+tc.path+".http")
		if c.status < 400 {
			t.Fatalf("%s: status %d", tc.path, c.status)
		}
		fl := Flavour(strings.Split(tc.path, "/")[0])
		checkUpstreamErr(t, upstreamErrCase{name: tc.path, fl: fl, status: c.status, body: string(c.body),
			code: tc.code, contains: tc.contains, never: tc.never})
	}
}

func TestClassifyUpstreamErrorFlavours(t *testing.T) {
	for _, tc := range []upstreamErrCase{
		{name: "vllm max_tokens too large", fl: VLLM, status: 400,
			body: `{"error":{"message":"'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum context length is 4096 tokens and your request has 2778 input tokens (8000 > 4096 - 2778). None","type":"BadRequestError","param":null,"code":400}}`,
			code: tollgate.CodeContextLengthExceeded, contains: []string{"2778", "4096"}},
		{name: "vllm old requested", fl: VLLM, status: 400,
			body: `{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 10000 tokens (9000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}`,
			code: tollgate.CodeContextLengthExceeded, contains: []string{"9000", "4096"}},
		{name: "vllm decoder prompt", fl: VLLM, status: 400,
			body: `{"error":{"message":"The decoder prompt (length 9010) is longer than the maximum model length of 4096. Make sure that ` + "`max_model_len`" + ` is no smaller than the number of text tokens.","type":"BadRequestError","param":null,"code":400}}`,
			code: tollgate.CodeContextLengthExceeded, contains: []string{"9010", "4096"}},
		{name: "sglang input longer", fl: SGLang, status: 400,
			body: `{"object":"error","message":"The input (5000 tokens) is longer than the model's context length (4096 tokens).","type":"BadRequestError","param":null,"code":400}`,
			code: tollgate.CodeContextLengthExceeded, contains: []string{"5000", "4096"}},
		{name: "sglang requested token count", fl: SGLang, status: 400,
			body: `{"object":"error","message":"Requested token count exceeds the model's maximum context length of 8192 tokens. You requested a total of 9000 tokens.","type":"BadRequestError","param":null,"code":400}`,
			code: tollgate.CodeContextLengthExceeded, contains: []string{"8192"}},
		{name: "openai code", fl: OpenAI, status: 400,
			body: `{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`,
			code: tollgate.CodeContextLengthExceeded, contains: []string{"130000", "128000"}},
		{name: "openrouter endpoint context", fl: OpenRouter, status: 400,
			body: `{"error":{"code":400,"message":"This endpoint's maximum context length is 163840 tokens. However, you requested about 200000 tokens (190000 of text input, 10000 in the output). Please reduce the length of either one, or use the \"middle-out\" transform to compress your prompt automatically.","metadata":{"provider_name":null}}}`,
			code: tollgate.CodeContextLengthExceeded, contains: []string{"190000", "163840"}},
		{name: "openrouter code only", fl: OpenRouter, status: 400,
			body: `{"error":{"code":"context_length_exceeded","message":"too long"}}`,
			code: tollgate.CodeContextLengthExceeded, contains: []string{"context window"}},
		{name: "vllm bad temperature", fl: VLLM, status: 400,
			body: `{"error":{"message":"temperature must be non-negative, got -1.0.","type":"BadRequestError","param":null,"code":400}}`,
			code: tollgate.CodeInvalidRequest, contains: []string{"temperature must be non-negative, got -1.0."}},
		{name: "invalid request with url", fl: VLLM, status: 400,
			body: `{"error":{"message":"Invalid image URL http://10.1.2.3:9000/img.png: could not fetch from files.lan:8080 or /srv/data/img.png (key sk-abc123)","type":"invalid_request_error","param":null,"code":400}}`,
			code: tollgate.CodeInvalidRequest, contains: []string{"Invalid image URL", "[redacted]"}, never: []string{"10.1.2.3", "files.lan", "/srv", "abc123"}},
		{name: "openai bad key", fl: OpenAI, status: 401,
			body: `{"error":{"message":"Incorrect API key provided: sk-proj-****abcd. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`,
			code: tollgate.CodeUpstreamError, contains: []string{"401"}, never: []string{"abcd", "platform.openai"}},
		{name: "model not found is a config fault", fl: VLLM, status: 404,
			body: `{"error":{"message":"The model ` + "`qwen-internal`" + ` does not exist.","type":"NotFoundError","param":"model","code":404}}`,
			code: tollgate.CodeUpstreamError, never: []string{"qwen-internal"}},
		{name: "400 about the model", fl: OpenRouter, status: 400,
			body: `{"error":{"code":400,"message":"acme/secret-model is not a valid model ID","type":"invalid_request_error"}}`,
			code: tollgate.CodeUpstreamError, never: []string{"secret-model"}},
		{name: "openrouter 429", fl: OpenRouter, status: 429,
			body: `{"error":{"code":429,"message":"Rate limit exceeded: free-models-per-min.","metadata":{"headers":{"X-RateLimit-Limit":"20"}}}}`,
			code: tollgate.CodeUpstreamError, contains: []string{"429"}, never: []string{"free-models"}},
		{name: "openrouter 402", fl: OpenRouter, status: 402,
			body: `{"error":{"code":402,"message":"Insufficient credits. Add more using https://openrouter.ai/credits"}}`,
			code: tollgate.CodeUpstreamError, never: []string{"credits"}},
		{name: "proxy html 502", fl: VLLM, status: 502,
			body: "<html><head><title>502 Bad Gateway</title></head><body>nginx/1.25 at gpu-node-7.lan</body></html>",
			code: tollgate.CodeUpstreamError, contains: []string{"502"}, never: []string{"nginx", "gpu-node"}},
		{name: "python traceback 500", fl: SGLang, status: 500,
			body: "Traceback (most recent call last):\n  File \"/opt/sglang/srt/server.py\", line 1\nRuntimeError: boom",
			code: tollgate.CodeUpstreamError, never: []string{"boom", "RuntimeError"}},
		// api_server.py's RequestValidationError handler (vLLM nested, SGLang
		// flat): type is the HTTP phrase "Bad Request".
		{name: "vllm validation error", fl: VLLM, status: 400,
			body: `{"error":{"message":"[{'type': 'int_parsing', 'loc': ('body', 'n'), 'msg': 'Input should be a valid integer, unable to parse string as an integer'}]","type":"Bad Request","param":null,"code":400}}`,
			code: tollgate.CodeInvalidRequest, contains: []string{"Input should be a valid integer"}},
		{name: "sglang validation error", fl: SGLang, status: 400,
			body: `{"object":"error","message":"[{'type': 'float_parsing', 'loc': ('body', 'temperature'), 'msg': 'Input should be a valid number'}]","type":"Bad Request","param":null,"code":400}`,
			code: tollgate.CodeInvalidRequest, contains: []string{"Input should be a valid number"}},
		{name: "sglang empty messages", fl: SGLang, status: 400,
			body: `{"object":"error","message":"Messages cannot be empty.","type":"BadRequestError","param":null,"code":400}`,
			code: tollgate.CodeInvalidRequest, contains: []string{"Messages cannot be empty."}},
		{name: "fastapi 422 list", fl: VLLM, status: 422,
			body: `{"detail":[{"type":"missing","loc":["body","messages"],"msg":"Field required","input":{}}]}`,
			code: tollgate.CodeUpstreamError},
		{name: "empty 503", fl: Ollama, status: 503, body: ``, code: tollgate.CodeUpstreamError, contains: []string{"503"}},
		{name: "3xx", fl: OpenAI, status: 302, body: `moved`, code: tollgate.CodeUpstreamError},
		{name: "500 that is context", fl: LlamaCpp, status: 500,
			body: `{"error":{"code":500,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error"}}`,
			code: tollgate.CodeContextLengthExceeded},
	} {
		checkUpstreamErr(t, tc)
	}
}

func TestSanitizeMessage(t *testing.T) {
	for in, want := range map[string]string{
		"temperature must be >= 0":                       "temperature must be >= 0",
		"bad url https://x.y/z and host a.b.com:443":     "bad url [redacted] and host [redacted]",
		"first line\n\n  second   line at 10.0.0.5:8000": "first line\nsecond line at [redacted]",
		"token 0123456789abcdef0123456789abcdef here":    "token [redacted] here",
		"mail ops@example.com now":                       "mail [redacted] now",
		"at 192.168.1.10 and ./cache/x.bin":              "at [redacted] and [redacted]",
		"":                                               "",
		strings.Repeat("é", 1500):                        strings.Repeat("é", 1000) + "...",
		strings.Repeat("ab ", 1000):                      strings.TrimSpace(strings.Repeat("ab ", 667)) + "...",
		"path C:\\models\\x.gguf":                        "path [redacted]",
		"value 3.5 is too large for top_p (max: 1.0).":   "value 3.5 is too large for top_p (max: 1.0).",
	} {
		if got := sanitizeMessage(in); got != want {
			t.Errorf("sanitizeMessage(%q) = %q, want %q", in, got, want)
		}
	}
}

// A json_schema the server cannot compile: the reason is after the first
// line, and reaches the client whole, without the upstream's addresses.
func TestUpstreamSchemaErrorKeepsEveryLine(t *testing.T) {
	for _, tc := range []upstreamErrCase{
		{name: "llama.cpp schema conversion", fl: LlamaCpp, status: 400,
			body:     `{"error":{"code":400,"message":"JSON schema conversion failed:\nUnrecognized schema: {\"type\":\"integr\"}\nUnsupported ref: https://10.0.2.22:8080/defs.json#/x","type":"invalid_request_error"}}`,
			code:     tollgate.CodeInvalidRequest,
			contains: []string{"JSON schema conversion failed:\nUnrecognized schema: {\"type\":\"integr\"}\nUnsupported ref: [redacted]"},
			never:    []string{"10.0.2.22"}},
		{name: "vLLM grammar compile", fl: VLLM, status: 400,
			body:     `{"error":{"message":"Failed to compile the json_schema:\n  Invalid schema at properties.age:\n    'minimum' must be a number, got \"ten\"\n  (grammar worker gpu-7.internal:8001, 172.16.4.9)","type":"BadRequestError","param":null,"code":400}}`,
			code:     tollgate.CodeInvalidRequest,
			contains: []string{"Failed to compile the json_schema:\nInvalid schema at properties.age:\n'minimum' must be a number, got \"ten\""},
			never:    []string{"gpu-7", "172.16"}},
	} {
		checkUpstreamErr(t, tc)
	}
	long := `{"error":{"code":400,"message":"` + strings.Repeat(`schema line\n`, 1000) + `","type":"invalid_request_error"}}`
	e := ClassifyUpstreamError(LlamaCpp, 400, []byte(long))
	if len(e.Message) > maxReason+100 || !strings.HasSuffix(e.Message, "...") {
		t.Fatalf("a 12,000-byte reason gave a %d-byte message", len(e.Message))
	}
}

func TestLogReason(t *testing.T) {
	cases := []struct{ body, want string }{
		{`{"error":{"message":"model 'x' not found, try pulling it first","type":"api_error"}}`, `model 'x' not found, try pulling it first`},
		{"Bad Gateway\nupstream 10.1.2.3:8000 refused", "Bad Gateway upstream [redacted] refused"},
		{`{"detail":"Not Found"}`, "Not Found"},
		{``, ``},
	}
	for _, c := range cases {
		if got := LogReason([]byte(c.body)); got != c.want {
			t.Errorf("LogReason(%q) = %q, want %q", c.body, got, c.want)
		}
	}
	if got := LogReason([]byte(strings.Repeat("é", 400))); len(got) > 303 || !strings.HasSuffix(got, "...") || !utf8.ValidString(got) {
		t.Errorf("a long message: %d bytes, valid %t", len(got), utf8.ValidString(got))
	}
}
