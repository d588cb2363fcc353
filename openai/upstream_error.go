package openai

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/jsonscan"
)

// ClassifyUpstreamError turns an upstream non-2xx answer into the error
// tollgate shows its client. The message is always tollgate's own; the
// upstream's words go to Err (logged, never shown), except for a request the
// upstream rejected as invalid, whose reason is shown after sanitising
// (URLs, paths, host names, addresses and key-like strings removed; every
// line kept; at most maxReason bytes).
//
//   - The prompt is too long for the context (vLLM "maximum context length" /
//     "longer than the maximum model length", SGLang "longer than the model's
//     context length", llama.cpp exceed_context_size_error, Ollama's llama.cpp
//     error embedded as a string, OpenAI/OpenRouter code
//     context_length_exceeded): context_length_exceeded, param "messages",
//     with the token counts when the upstream gave them.
//   - 400 or 422 that is plainly about the request's content (type
//     invalid_request_error / BadRequestError, no mention of the model or of
//     the server): invalid_request.
//   - Everything else (401/403/404 — a configuration fault, not the client's —
//     408, 409, 413, 429, 5xx, garbage): upstream_error.
func ClassifyUpstreamError(fl Flavour, status int, body []byte) *tollgate.Error {
	info := describeUpstream(body)
	if info.contextLength() {
		e := contextLengthError(info)
		e.Err = info.cause(fl, status)
		return e
	}
	e := &tollgate.Error{Code: tollgate.CodeUpstreamError, Err: info.cause(fl, status)}
	switch {
	case status == 429:
		e.Message = "The model server is overloaded (HTTP 429). Try again later."
	case status >= 500:
		e.Message = fmt.Sprintf("The model server failed (HTTP %d).", status)
	case status == 400 || status == 422:
		if msg, ok := info.clientFault(); ok {
			e.Code = tollgate.CodeInvalidRequest
			e.Message = "The model server rejected the request: " + msg
			return e
		}
		e.Message = fmt.Sprintf("The model server refused the request (HTTP %d).", status)
	case status >= 400:
		e.Message = fmt.Sprintf("The model server refused the request (HTTP %d).", status)
	default:
		e.Message = fmt.Sprintf("The model server gave an unexpected answer (HTTP %d).", status)
	}
	return e
}

// upstreamInfo is what can be read from an upstream error body, whatever its shape:
// {"error":{"message","type","code",...}} (OpenAI, OpenRouter, newer vLLM,
// llama.cpp with n_prompt_tokens/n_ctx), {"object":"error","message",...}
// (older vLLM, SGLang), {"error":"text"}, {"detail":...} (FastAPI), plain text,
// and Ollama's error whose message is itself a llama.cpp error JSON.
type upstreamInfo struct {
	message string
	typ     string
	code    string
	nPrompt int64
	nCtx    int64
}

func describeUpstream(body []byte) upstreamInfo {
	return describeDepth(body, 0)
}

func describeDepth(body []byte, depth int) upstreamInfo {
	var info upstreamInfo
	b := jsonscan.TrimWS(body)
	if len(b) == 0 {
		return info
	}
	if b[0] != '{' {
		if s, ok := jsonscan.String(b); ok {
			info.message = s
		} else {
			info.message = string(b)
		}
		return info
	}
	it := jsonscan.NewObjIter(b)
	for {
		k, _, v, ok := it.Next()
		if !ok {
			break
		}
		switch string(k) {
		case "error":
			vv := jsonscan.TrimWS(v)
			if len(vv) > 0 && vv[0] == '{' {
				inner := describeDepth(vv, depth+1)
				info.merge(inner)
			} else if s, ok := jsonscan.String(vv); ok && info.message == "" {
				info.message = s
			}
		case "message", "detail":
			if s, ok := jsonscan.String(v); ok {
				if info.message == "" {
					info.message = s
				}
			} else if info.message == "" && !jsonscan.IsNull(v) {
				info.message = string(jsonscan.TrimWS(v)) // FastAPI's list of validation errors
			}
		case "type":
			if s, ok := jsonscan.String(v); ok && info.typ == "" {
				info.typ = s
			}
		case "code":
			if info.code == "" && !jsonscan.IsNull(v) {
				if s, ok := jsonscan.String(v); ok {
					info.code = s
				} else {
					info.code = string(jsonscan.TrimWS(v))
				}
			}
		case "n_prompt_tokens":
			info.nPrompt, _ = jsonInt(v)
		case "n_ctx":
			info.nCtx, _ = jsonInt(v)
		}
	}
	if it.Err() != nil && info.message == "" {
		info.message = string(b)
	}
	// Ollama: {"error":{"message":"{\"error\":{...llama.cpp error...}}",...}}
	if depth < 3 {
		if m := strings.TrimSpace(info.message); strings.HasPrefix(m, "{") {
			inner := describeDepth([]byte(m), depth+1)
			if inner.message != "" || inner.typ != "" || inner.code != "" {
				outerType := info.typ
				info = inner.mergedOver(info)
				if info.typ == "" {
					info.typ = outerType
				}
			}
		}
	}
	return info
}

// merge fills empty fields of info from o.
func (info *upstreamInfo) merge(o upstreamInfo) {
	if info.message == "" {
		info.message = o.message
	}
	if info.typ == "" {
		info.typ = o.typ
	}
	if info.code == "" {
		info.code = o.code
	}
	if info.nPrompt == 0 {
		info.nPrompt = o.nPrompt
	}
	if info.nCtx == 0 {
		info.nCtx = o.nCtx
	}
}

// mergedOver returns inner with its empty fields taken from outer.
func (inner upstreamInfo) mergedOver(outer upstreamInfo) upstreamInfo {
	inner.merge(outer)
	return inner
}

var contextPhrases = []string{
	"maximum context length",
	"context length exceeded",
	"context_length_exceeded",
	"exceeds the available context size",
	"longer than the maximum model length",
	"longer than the model's context length",
	"exceeds the model's context length",
	"exceed_context_size",
	"context window exceeded",
	"prompt is too long",
	"input is too long",
}

func (info upstreamInfo) contextLength() bool {
	switch info.code {
	case "context_length_exceeded", "context_window_exceeded":
		return true
	}
	switch info.typ {
	case "exceed_context_size_error", "context_length_exceeded":
		return true
	}
	m := strings.ToLower(info.message)
	for _, p := range contextPhrases {
		if strings.Contains(m, p) {
			return true
		}
	}
	// SGLang: "Input length (N tokens) exceeds the maximum allowed length (M tokens)."
	return strings.Contains(m, "exceeds the maximum allowed length") && strings.Contains(m, "token")
}

// counts returns the prompt size and the context limit the upstream stated (0 when unknown).
func (info upstreamInfo) counts() (prompt, limit int64) {
	prompt, limit = info.nPrompt, info.nCtx
	m := strings.ToLower(info.message)
	if limit == 0 {
		limit = numberAfter(m,
			"maximum context length is ", // vLLM, OpenAI
			"maximum model length of ",   // vLLM (decoder prompt)
			"context length (",           // SGLang, Together
			"available context size (",   // llama.cpp
			"maximum context length of ", // SGLang
			"maximum allowed length (",   // SGLang
		)
	}
	if prompt == 0 {
		prompt = numberAfter(m,
			"your request has ", // vLLM: "... your request has 2778 input tokens"
			"prompt (length ",   // vLLM: "The decoder prompt (length 9010)"
			"the input (",       // SGLang: "The input (N tokens) ..."
			"input length (",    // SGLang
			"request (",         // llama.cpp: "request (9010 tokens) exceeds ..."
			"resulted in ",      // OpenAI: "However, your messages resulted in N tokens"
		)
	}
	if prompt == 0 {
		// vLLM: "(9000 in the messages, 1000 in the completion)";
		// OpenRouter: "(190000 of text input, 10000 in the output)"
		prompt = numberBefore(m, " in the messages", " of text input")
	}
	return prompt, limit
}

// numberBefore returns the integer right before the first of the markers found in s.
func numberBefore(s string, markers ...string) int64 {
	for _, mk := range markers {
		i := strings.Index(s, mk)
		if i <= 0 {
			continue
		}
		j := i
		for j > 0 && s[j-1] >= '0' && s[j-1] <= '9' {
			j--
		}
		if j < i {
			if v, err := strconv.ParseInt(s[j:i], 10, 64); err == nil {
				return v
			}
		}
	}
	return 0
}

// numberAfter returns the integer right after the first of the markers found in s.
func numberAfter(s string, markers ...string) int64 {
	for _, mk := range markers {
		i := strings.Index(s, mk)
		if i < 0 {
			continue
		}
		j := i + len(mk)
		k := j
		for k < len(s) && s[k] >= '0' && s[k] <= '9' {
			k++
		}
		if k > j {
			if v, err := strconv.ParseInt(s[j:k], 10, 64); err == nil {
				return v
			}
		}
	}
	return 0
}

func contextLengthError(info upstreamInfo) *tollgate.Error {
	prompt, limit := info.counts()
	var msg string
	switch {
	case prompt > 0 && limit > 0:
		msg = fmt.Sprintf("The request (%d tokens) is longer than the model's context window (%d tokens). Shorten the messages or lower max_tokens.", prompt, limit)
	case limit > 0:
		msg = fmt.Sprintf("The request is longer than the model's context window (%d tokens). Shorten the messages or lower max_tokens.", limit)
	default:
		msg = "The request is longer than the model's context window. Shorten the messages or lower max_tokens."
	}
	return &tollgate.Error{Code: tollgate.CodeContextLengthExceeded, Param: "messages", Message: msg}
}

// clientFault returns the sanitised upstream reason when the rejection is
// plainly about the request's content.
func (info upstreamInfo) clientFault() (string, bool) {
	switch strings.ToLower(info.typ) {
	case "invalid_request_error", "badrequesterror", "bad_request", "invalid_request", "validation_error",
		"bad request": // vLLM's and SGLang's request-validation handler (the HTTP phrase)
	default:
		return "", false
	}
	// The words are looked for after redaction: a host name such as
	// gpu-7.internal is not the server talking about itself.
	s := sanitizeMessage(info.message)
	m := strings.ToLower(s)
	for _, w := range []string{"model", "server", "internal", "api key", "apikey", "token limit", "credit", "quota", "auth"} {
		if strings.Contains(m, w) {
			return "", false
		}
	}
	if s == "" {
		return "", false
	}
	return s, true
}

// maxLogReason bounds the upstream's message in tollgate's log line.
const maxLogReason = 300

// LogReason is what an upstream error body says, for the operator's log
// line: its message whatever the body's shape (or the body itself when it
// is text), redacted as a client's reason is (sanitizeMessage), on one line
// and at most maxLogReason bytes. A wrong upstream_model shows here as the
// server's "model ... does not exist".
func LogReason(body []byte) string {
	msg := describeUpstream(body).message
	if msg == "" {
		msg = string(body)
	}
	s := strings.ReplaceAll(sanitizeMessage(msg), "\n", " ")
	if len(s) > maxLogReason {
		cut := maxLogReason
		for cut > 0 && s[cut]&0xC0 == 0x80 {
			cut--
		}
		s = s[:cut] + "..."
	}
	return s
}

// maxReason bounds the upstream reason shown to a client: room for a
// multi-line schema or grammar error, not for a whole traceback.
const maxReason = 2000

// sanitizeMessage keeps an upstream message whole, line by line (a schema
// compiler puts the reason after the first line), drops words that could
// reveal the upstream (URLs, paths, host:port, IP addresses, e-mail
// addresses, key-like strings), collapses runs of spaces and blank lines,
// and clips it to maxReason bytes.
func sanitizeMessage(msg string) string {
	var b strings.Builder
	for line := range strings.Lines(msg) {
		words := strings.Fields(line)
		if len(words) == 0 {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		for i, w := range words {
			if i > 0 {
				b.WriteByte(' ')
			}
			if revealing(w) {
				w = "[redacted]"
			}
			b.WriteString(w)
		}
		if b.Len() > maxReason {
			break
		}
	}
	s := strings.ToValidUTF8(b.String(), "")
	if len(s) > maxReason {
		cut := maxReason
		for cut > 0 && s[cut]&0xC0 == 0x80 {
			cut--
		}
		s = s[:cut] + "..."
	}
	return strings.TrimSpace(s)
}

func revealing(w string) bool {
	lw := strings.ToLower(strings.Trim(w, `"'()[]{}<>,;.`))
	if lw == "" {
		return false
	}
	if strings.Contains(lw, "://") || strings.HasPrefix(lw, "/") || strings.Contains(lw, "@") ||
		strings.HasPrefix(lw, "sk-") || strings.HasPrefix(lw, "bearer") || strings.Contains(lw, "\\") {
		return true
	}
	if strings.Contains(lw, "/") && strings.Contains(lw, ".") {
		return true // relative path or host/path
	}
	// host:port, IPv4
	dots, digits, alnum := 0, 0, 0
	for i := 0; i < len(lw); i++ {
		c := lw[i]
		switch {
		case c == '.':
			dots++
		case c >= '0' && c <= '9':
			digits++
			alnum++
		case c >= 'a' && c <= 'z':
			alnum++
		}
	}
	if strings.Contains(lw, ":") && (dots > 0 || digits > 0) {
		if i := strings.LastIndexByte(lw, ':'); i < len(lw)-1 && lw[i+1] >= '0' && lw[i+1] <= '9' {
			return true
		}
	}
	if dots == 3 && digits >= 4 && digits+dots == len(lw) {
		return true
	}
	if dots >= 1 && looksLikeHost(lw) {
		return true
	}
	// long opaque strings: keys, hashes, ids
	return alnum >= 24 && alnum == len(lw) && digits > 0
}

func looksLikeHost(w string) bool {
	for _, tld := range []string{".com", ".net", ".org", ".io", ".ai", ".internal", ".local", ".lan", ".cloud", ".dev"} {
		if strings.HasSuffix(w, tld) || strings.Contains(w, tld+":") {
			return true
		}
	}
	return false
}

// cause is the upstream's own account, for logs (tollgate.Error.Err).
func (info upstreamInfo) cause(fl Flavour, status int) error {
	var b strings.Builder
	b.WriteString("upstream")
	if fl != "" {
		b.WriteString(" ")
		b.WriteString(string(fl))
	}
	if status != 0 {
		fmt.Fprintf(&b, " HTTP %d", status)
	}
	if info.typ != "" {
		b.WriteString(" type=")
		b.WriteString(clip(info.typ, 60))
	}
	if info.code != "" {
		b.WriteString(" code=")
		b.WriteString(clip(info.code, 60))
	}
	if info.message != "" {
		b.WriteString(": ")
		b.WriteString(clip(info.message, 500))
	}
	return fmt.Errorf("%s", b.String())
}
