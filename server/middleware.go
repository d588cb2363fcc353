package server

import (
	"crypto/rand"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/metrics"
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
	// not yet cleared; bodyRead: the handler read the body to its end.
	bodyDeadline, bodyRead bool
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
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
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
// answer with a Content-Length. Only when the request's body was read to
// its end: otherwise net/http may yet decide to close the connection, and
// says so in the header (Connection: close), which must not have left.
func (w *statusWriter) sent(r *http.Request) bool {
	if r.ContentLength != 0 && !w.ri.bodyRead {
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
			if chat {
				s.Metrics.InflightRequests.Dec()
				s.observe(sw, ri, start)
			}
			if s.Log.Enabled(r.Context(), slog.LevelInfo) {
				// The line is made once the client has the response:
				// net/http would send it when the handler returns, after
				// this, so it is flushed here first when it is whole.
				d := time.Since(start)
				if sw.sent(r) {
					sw.Flush()
				}
				s.logRequest(r, sw, ri, start, d)
			}
		}()
		next.ServeHTTP(sw, r)
	})
}

// logRequest writes the request's line: what an operator needs to follow
// a request and its money, never a key, a prompt or an answer
// (docs/operations.md, "Request log").
func (s *Server) logRequest(r *http.Request, sw *statusWriter, ri *requestInfo, start time.Time, d time.Duration) {
	attrs := make([]slog.Attr, 0, 24)
	attrs = append(attrs,
		slog.String("request_id", ri.id),
		slog.String("method", r.Method),
		slog.String("path", r.URL.Path),
		slog.Int("status", sw.status),
		slog.Int64("bytes", sw.bytes),
		slog.Float64("duration_ms", float64(d.Microseconds())/1e3),
		slog.String("client", clientHost(r.RemoteAddr)),
	)
	if ri.code != "" {
		attrs = append(attrs, slog.String("error_code", string(ri.code)))
	}
	if sw.Header().Get("Idempotent-Replayed") == "true" {
		attrs = append(attrs, slog.Bool("idempotent_replay", true))
	}
	if c := ri.call; c != nil {
		attrs = append(attrs, slog.String("account", c.Account.ID), slog.String("key_prefix", c.Key.Prefix))
		if c.Model != "" {
			attrs = append(attrs, slog.String("model", c.Model), slog.Bool("stream", c.Stream))
		}
		if c.Backend != "" {
			u := c.Usage
			attrs = append(attrs,
				slog.String("backend", string(c.Backend)), slog.String("node", c.Node),
				slog.Int64("prompt_tokens", u.PromptTokens), slog.Int64("completion_tokens", u.CompletionTokens))
			if u.CachedTokens != nil {
				attrs = append(attrs, slog.Int64("cached_tokens", *u.CachedTokens))
			}
			if u.ReasoningTokens != nil {
				attrs = append(attrs, slog.Int64("reasoning_tokens", *u.ReasoningTokens))
			}
			attrs = append(attrs, slog.String("cost", c.Cost.String()), slog.Bool("estimated", u.Estimated))
			if c.Searches > 0 {
				attrs = append(attrs, slog.Int64("searches", c.Searches))
			}
		}
		if !c.FirstToken.IsZero() {
			attrs = append(attrs, slog.Float64("ttft_ms", float64(c.FirstToken.Sub(start).Microseconds())/1e3))
		}
		if c.ErrorCode != "" && ri.code == "" {
			attrs = append(attrs, slog.String("error_code", string(c.ErrorCode)))
		}
		if c.Outcome != "" {
			attrs = append(attrs, slog.String("outcome", c.Outcome))
		}
	}
	s.Log.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
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
