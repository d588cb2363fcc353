// Package server is tollgate's HTTP face: the route table (Mux), the middleware,
// the one error mapper, and the handlers of the API, public and admin listeners.
package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/idempotency"
	"github.com/tollgate/tollgate/metrics"
	"github.com/tollgate/tollgate/relay"
)

// MaxBodyBytes is the request body limit: 8 MiB (docs/api.md, "Limits").
const MaxBodyBytes = 8 << 20

// Authenticator checks an Authorization header (auth.Authenticator).
type Authenticator interface {
	Authenticate(ctx context.Context, header string, now time.Time) (tollgate.Key, tollgate.Account, error)
}

// UptimeReader returns served requests over the last 7 days (traffic.Share).
type UptimeReader interface {
	Uptime(ctx context.Context) (network, total int64, err error)
}

// ReadyChecker reports whether the service can serve (the store answers).
type ReadyChecker func(ctx context.Context) error

// Server holds what the handlers need. Build it with New.
type Server struct {
	Relay  *relay.Relay
	Auth   Authenticator
	Uptime UptimeReader
	Ready  ReadyChecker
	Log    *slog.Logger
	Now    func() time.Time
	// Idempotency runs requests with an Idempotency-Key; nil: the header is ignored.
	Idempotency *idempotency.Keeper
	// Metrics records every chat request; nil: no metrics.
	Metrics *metrics.Metrics
	// Version and Commit are reported by /healthz.
	Version, Commit string
	// Tracer makes a span per chat request (and the auth span); nil: no tracing.
	Tracer trace.Tracer
	// RequestLog, when set, takes each request's log line as JSON written
	// directly (the config's log.format json at level info or below);
	// nil: the line goes through Log.
	RequestLog io.Writer

	draining atomic.Bool
	// drainCtx ends lingering reads when the shutdown begins (linger.go).
	drainOnce sync.Once
	drainCtx  context.Context
	drainStop context.CancelFunc
	// BodyTimeout bounds the time to receive a request body, from the
	// end of its headers (timeouts.request_body); 0: no bound.
	BodyTimeout time.Duration

	pricing pricingCache
	ids     *requestIDs
	bodies  sync.Pool // *bytes.Buffer for request bodies
}

// New returns a server; log may be nil.
func New(rl *relay.Relay, auth Authenticator, uptime UptimeReader, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{Relay: rl, Auth: auth, Uptime: uptime, Log: log, Now: time.Now, ids: newRequestIDs(),
		bodies: sync.Pool{New: func() any { return new(bytes.Buffer) }}}
}

// Handler serves m with the middleware every listener shares: the request
// id, the body's deadline, metrics, tracing, the access log, and recovery.
// The listeners' routes are declared in cmd/tollgate/routes.go.
func (s *Server) Handler(m *Mux) http.Handler { return s.middleware(m) }

// Healthz is GET /healthz: the service runs.
func (s *Server) Healthz(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/json")
	b, _ := json.Marshal(struct {
		Status  string `json:"status"`
		Version string `json:"version,omitempty"`
		Commit  string `json:"commit,omitempty"`
	}{"ok", s.Version, s.Commit})
	_, _ = w.Write(append(b, '\n'))
	return nil
}

// SetDraining makes /readyz answer 503 from now on: shutdown has begun, the
// load balancer should send no more requests.
// Connections still discarding the body of a refused request (linger.go)
// close now: a shutdown does not wait for them.
func (s *Server) SetDraining() {
	s.draining.Store(true)
	s.drainContext()
	s.drainStop()
}

// Readyz is GET /readyz: 200 when the instance can serve, else 503 with the reason: the
// shutdown has begun, the store does not answer, or a model has no node in
// rotation.
func (s *Server) Readyz(w http.ResponseWriter, r *http.Request) error {
	reason := ""
	switch {
	case s.draining.Load():
		reason = "shutting down"
	case s.Ready != nil:
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := s.Ready(ctx); err != nil {
			s.Log.Warn("not ready: the store does not answer", "err", err)
			reason = "the store does not answer"
		}
	}
	if reason == "" && s.Relay != nil {
		if models := s.Relay.Unservable(); len(models) > 0 {
			reason = "no node in rotation for model " + strings.Join(models, ", ")
		}
	}
	if reason == "" {
		return s.Healthz(w, r)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusServiceUnavailable)
	b, _ := json.Marshal(struct {
		Status string `json:"status"`
		Reason string `json:"reason"`
	}{"unavailable", reason})
	_, _ = w.Write(append(b, '\n'))
	return nil
}
