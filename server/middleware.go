package server

import (
	"crypto/rand"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/metrics"
	"github.com/tollgate/tollgate/openai"
	"github.com/tollgate/tollgate/relay"
)

// requestIDs makes ids unique across instances (a random per-process prefix)
// and cheap (a counter, no syscall per request).
type requestIDs struct {
	prefix string
	n      atomic.Uint64
}

func newRequestIDs() *requestIDs {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return &requestIDs{prefix: fmt.Sprintf("%x", b)}
}

// NewRequestID returns a request id as the middleware gives every response
// (for answers made outside it: the HTTP server's own errors,
// EnvelopeListener).
func (s *Server) NewRequestID() string { return s.ids.next() }

func (g *requestIDs) next() string {
	var buf [40]byte
	out := append(buf[:0], "req_"...)
	out = append(out, g.prefix...)
	out = strconv.AppendUint(out, g.n.Add(1), 36)
	return string(out)
}

// requestInfo collects what the access log line says about a request.
type requestInfo struct {
	id   string
	call *relay.Call
	code tollgate.Code // the error answered (WriteError), if any
	// bodyDeadline: the body's read deadline is set (bodyDeadlineFor) and
	// not yet cleared.
	bodyDeadline bool
}

// infoFrom returns the request's info from the writer the middleware handed
// to the handler (nil for any other writer). Not a context value: that cost
// a copy of the request and a context on every request.
func infoFrom(w http.ResponseWriter) *requestInfo {
	if sw, ok := w.(*statusWriter); ok {
		return &sw.ri
	}
	return nil
}

// statusWriter remembers the status for the access log. It unwraps for
// http.ResponseController (flush, write deadlines, trailers).
type statusWriter struct {
	http.ResponseWriter
	status  int
	bytes   int64
	flushed bool
	ri      requestInfo // in the same allocation
	body    bodyWatch   // the request body, when watched (linger.go)
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.closeIfEarly()
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.closeIfEarly()
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

func (w *statusWriter) Flush() {
	w.flushed = true
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// sent reports whether the response is complete on the connection once the
// handler's writes are flushed: a stream (flushed, its end written) or an
// answer with a Content-Length. Not an early answer (linger.go): that one
// is flushed before the rest of the body is discarded.
func (w *statusWriter) sent() bool {
	if w.early() {
		return false
	}
	return w.flushed || w.Header().Get("Content-Length") != ""
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// middleware gives every request an id (X-Request-Id), recovers panics into
// internal_error, and writes one structured log line per request. The line
// never holds keys or prompt text.
func (s *Server) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		sw.watchBody(r)
		ri := &sw.ri
		ri.id = s.ids.next()
		w.Header().Set("X-Request-Id", ri.id)
		if r.ContentLength != 0 && s.BodyTimeout > 0 {
			// The whole body must arrive within BodyTimeout; readBody
			// clears the deadline once it has the body (a deadline left
			// set would cancel a long stream's context when it fires).
			_ = http.NewResponseController(w).SetReadDeadline(start.Add(s.BodyTimeout))
			ri.bodyDeadline = true
		}
		chat := s.Metrics != nil && r.URL.Path == "/v1/chat/completions"
		if chat {
			s.Metrics.InflightRequests.Inc()
		}
		var span trace.Span
		if s.Tracer != nil && r.URL.Path == "/v1/chat/completions" {
			r, span = s.startSpan(r)
			defer s.endSpan(span, sw, ri)
		}
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				s.Log.Error("panic", "request_id", ri.id, "panic", fmt.Sprint(p))
				if sw.status == 0 {
					WriteError(sw, s.Log, tollgate.Errorf(tollgate.CodeInternal, "internal error; quote request id %s when reporting it", ri.id))
				}
			}
			if ri.bodyDeadline {
				_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
			}
			if sw.status != 0 && sw.early() {
				sw.Flush() // the answer leaves now; linger discards the rest of the body after
			}
			if chat {
				s.Metrics.InflightRequests.Dec()
				s.observe(sw, ri, start)
			}
			if s.RequestLog != nil || s.Log.Enabled(r.Context(), slog.LevelInfo) {
				// The line is made once the client has the response:
				// net/http would send it when the handler returns, after
				// this, so it is flushed here first when it is whole. A
				// stream whose line is written straight into the log's
				// buffer (RequestLog: a few microseconds, no system call)
				// is not: its flush would split the stream's last write
				// (the usage chunk and [DONE]) from net/http's (the end of
				// the chunked body and the trailer), a second system call
				// that cost more than the line.
				d := time.Since(start)
				if sw.sent() && (s.RequestLog == nil || !sw.flushed) {
					sw.Flush()
				}
				s.logRequest(r, sw, ri, start, d)
			}
			if sw.status != 0 && sw.early() {
				s.linger(w, sw, r, start)
			}
		}()
		next.ServeHTTP(sw, r)
	})
}

// logRequest writes the request's line: what an operator needs to follow
// a request and its money, never a key, a prompt or an answer
// (docs/operations.md, "Request log"). With RequestLog set (JSON logs) the
// line is written straight to it, as slog's JSON handler would write it,
// without slog's per-attribute work; otherwise through the logger.
func (s *Server) logRequest(r *http.Request, sw *statusWriter, ri *requestInfo, start time.Time, d time.Duration) {
	if s.RequestLog != nil {
		l := jsonLines.Get().(*jsonLine)
		l.begin(time.Now())
		s.requestFields(r, sw, ri, start, d, l)
		l.end()
		_, _ = s.RequestLog.Write(l.b)
		if cap(l.b) <= 8<<10 {
			jsonLines.Put(l)
		}
		return
	}
	a := &slogAttrs{a: make([]slog.Attr, 0, 24)}
	s.requestFields(r, sw, ri, start, d, a)
	s.Log.LogAttrs(r.Context(), slog.LevelInfo, "request", a.a...)
}

// fieldSink takes a request line's fields.
type fieldSink interface {
	str(k, v string)
	int(k string, v int64)
	float(k string, v float64)
	bool(k string, v bool)
}

// requestFields lists a request line's fields, in order, into f.
func (s *Server) requestFields(r *http.Request, sw *statusWriter, ri *requestInfo, start time.Time, d time.Duration, f fieldSink) {
	f.str("request_id", ri.id)
	f.str("method", r.Method)
	f.str("path", r.URL.Path)
	f.int("status", int64(sw.status))
	f.int("bytes", sw.bytes)
	f.float("duration_ms", float64(d.Microseconds())/1e3)
	f.str("client", clientHost(r.RemoteAddr))
	if ri.code != "" {
		f.str("error_code", string(ri.code))
	}
	if sw.Header().Get("Idempotent-Replayed") == "true" {
		f.bool("idempotent_replay", true)
	}
	c := ri.call
	if c == nil {
		return
	}
	f.str("account", c.Account.ID)
	f.str("key_prefix", c.Key.Prefix)
	if c.Model != "" {
		f.str("model", c.Model)
		f.bool("stream", c.Stream)
	}
	if c.Backend != "" {
		u := c.Usage
		f.str("backend", string(c.Backend))
		f.str("node", c.Node)
		f.int("prompt_tokens", u.PromptTokens)
		f.int("completion_tokens", u.CompletionTokens)
		if u.CachedTokens != nil {
			f.int("cached_tokens", *u.CachedTokens)
		}
		if u.ReasoningTokens != nil {
			f.int("reasoning_tokens", *u.ReasoningTokens)
		}
		f.str("cost", c.Cost.String())
		f.bool("estimated", u.Estimated)
		if c.Searches > 0 {
			f.int("searches", c.Searches)
		}
	}
	if !c.FirstToken.IsZero() {
		f.float("ttft_ms", float64(c.FirstToken.Sub(start).Microseconds())/1e3)
	}
	if c.ErrorCode != "" && ri.code == "" {
		f.str("error_code", string(c.ErrorCode))
	}
	if c.Outcome != "" {
		f.str("outcome", c.Outcome)
	}
}

// slogAttrs collects the fields as slog attributes.
type slogAttrs struct{ a []slog.Attr }

func (s *slogAttrs) str(k, v string)           { s.a = append(s.a, slog.String(k, v)) }
func (s *slogAttrs) int(k string, v int64)     { s.a = append(s.a, slog.Int64(k, v)) }
func (s *slogAttrs) float(k string, v float64) { s.a = append(s.a, slog.Float64(k, v)) }
func (s *slogAttrs) bool(k string, v bool)     { s.a = append(s.a, slog.Bool(k, v)) }

// jsonLine writes the fields as one JSON object, in the form slog's JSON
// handler gives a record at level info with message "request".
type jsonLine struct{ b []byte }

var jsonLines = sync.Pool{New: func() any { return &jsonLine{b: make([]byte, 0, 512)} }}

func (l *jsonLine) begin(t time.Time) {
	l.b = append(l.b[:0], `{"time":"`...)
	l.b = t.AppendFormat(l.b, "2006-01-02T15:04:05.000Z07:00") // slog's form: milliseconds
	l.b = append(l.b, `","level":"INFO","msg":"request"`...)
}

func (l *jsonLine) end() { l.b = append(l.b, "}\n"...) }

func (l *jsonLine) key(k string) {
	l.b = append(l.b, ',', '"')
	l.b = append(l.b, k...)
	l.b = append(l.b, '"', ':')
}

func (l *jsonLine) str(k, v string) {
	l.key(k)
	l.b = openai.AppendJSONString(l.b, v)
}

func (l *jsonLine) int(k string, v int64) {
	l.key(k)
	l.b = strconv.AppendInt(l.b, v, 10)
}

func (l *jsonLine) float(k string, v float64) {
	l.key(k)
	l.b = strconv.AppendFloat(l.b, v, 'g', -1, 64)
}

func (l *jsonLine) bool(k string, v bool) {
	l.key(k)
	l.b = strconv.AppendBool(l.b, v)
}

// clientHost is the client's address without its port.
func clientHost(remote string) string {
	if host, _, err := net.SplitHostPort(remote); err == nil {
		return host
	}
	return remote
}

// observe records a finished chat request in the metrics.
func (s *Server) observe(sw *statusWriter, ri *requestInfo, start time.Time) {
	m := metrics.Request{Status: sw.status, Code: string(ri.code), Duration: time.Since(start)}
	if m.Status == 0 {
		m.Status = http.StatusOK // a client gone before anything was written
	}
	switch ri.code {
	case tollgate.CodeMissingAPIKey, tollgate.CodeInvalidAPIKey, tollgate.CodeAPIKeyRevoked,
		tollgate.CodeAPIKeyExpired, tollgate.CodeAccountDisabled:
		s.Metrics.AuthFailure(string(ri.code))
	case tollgate.CodeIdempotencyKeyInFlight:
		s.Metrics.Idempotency("in_flight")
	case tollgate.CodeIdempotencyKeyReused:
		s.Metrics.Idempotency("reused")
	}
	if sw.Header().Get("Idempotent-Replayed") == "true" {
		s.Metrics.Idempotency("replayed")
	}
	if c := ri.call; c != nil {
		m.Model, m.Class, m.Stream = c.Model, string(c.Backend), c.Stream
		if m.Code == "" {
			m.Code = string(c.ErrorCode)
		}
		if !c.FirstToken.IsZero() {
			m.TTFT = c.FirstToken.Sub(start)
		}
		u := c.Usage
		m.PromptTokens, m.CompletionTokens = u.PromptTokens, u.CompletionTokens
		if u.CachedTokens != nil {
			m.CachedTokens = *u.CachedTokens
		}
		if u.ReasoningTokens != nil {
			m.ReasoningTokens = *u.ReasoningTokens
		}
		m.CostUSD = float64(c.Cost) / 1e12 // picodollars; approximate by design
		m.Searches = c.Searches
	}
	s.Metrics.ObserveRequest(&m)
}
