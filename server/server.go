// Package server is tollgate's HTTP face: the route table, the middleware,
// the one error mapper, and the handlers of the API, public and admin listeners.
package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"path"
	"slices"
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

// MaxBodyBytes is SPEC.md's request body limit: 8 MiB.
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
	// APIExtra are handlers mounted on the API listener beside the protocol
	// endpoints, by path prefix (the console's /console/).
	APIExtra map[string]http.Handler
	// Webhooks are POST endpoints (a payment provider's webhooks, by
	// path) served on every listener that serves /pricing: the public
	// listener, and the API listener. Set them before the handlers are built.
	Webhooks map[string]func(http.ResponseWriter, *http.Request) error

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

// route is one row of the route table.
type route struct {
	path    string
	methods string // for Allow
	handler func(*Server, http.ResponseWriter, *http.Request) error
}

// apiRoutes is every path the API listener serves. Everything else is 404
// not_found, the other protocol endpoints (embeddings, completions,
// responses, ...) included: SPEC.md forbids a fallback to another endpoint.
var apiRoutes = []route{
	{"/v1/chat/completions", "POST", (*Server).chat},
	{"/v1/models", "GET, HEAD", (*Server).models},
	{"/pricing", "GET, HEAD", (*Server).pricingHandler},
}

var publicRoutes = []route{
	{"/pricing", "GET, HEAD", (*Server).pricingHandler},
}

var adminRoutes = []route{
	{"/healthz", "GET, HEAD", (*Server).healthz},
	{"/readyz", "GET, HEAD", (*Server).readyz},
}

// APIHandler serves the protocol endpoints and /pricing.
func (s *Server) APIHandler() http.Handler {
	t := s.mux(s.withWebhooks(apiRoutes))
	for p, h := range s.APIExtra {
		t.Handle(p, h)
	}
	return s.middleware(t)
}

// PublicHandler serves /pricing and the webhooks (the public listener).
func (s *Server) PublicHandler() http.Handler { return s.handler(s.withWebhooks(publicRoutes)) }

// withWebhooks returns routes and the webhooks' routes.
func (s *Server) withWebhooks(routes []route) []route {
	out := slices.Clone(routes)
	for path, h := range s.Webhooks {
		out = append(out, route{path, "POST", func(_ *Server, w http.ResponseWriter, r *http.Request) error { return h(w, r) }})
	}
	return out
}

// AdminHandler serves health and readiness; extra routes (metrics, admin API)
// are mounted by the caller with Mount.
func (s *Server) AdminHandler(extra map[string]http.Handler) http.Handler {
	mux := s.mux(adminRoutes)
	for p, h := range extra {
		mux.Handle(p, h)
	}
	return s.middleware(mux)
}

func (s *Server) handler(routes []route) http.Handler { return s.middleware(s.mux(routes)) }

func (s *Server) mux(routes []route) *routeTable {
	mux := http.NewServeMux()
	t := &routeTable{exact: map[string]http.HandlerFunc{}, mux: mux}
	var paths []string
	for _, rt := range routes {
		paths = append(paths, rt.methods+" "+rt.path)
	}
	served := strings.Join(paths, ", ")
	t.methods = routeMethods(routes)
	for _, rt := range routes {
		h := func(w http.ResponseWriter, r *http.Request) {
			if !allowed(rt.methods, r.Method) {
				w.Header().Set("Allow", rt.methods)
				WriteError(w, s.Log, tollgate.Errorf(tollgate.CodeMethodNotAllowed,
					"%s is not allowed on %s; use %s", r.Method, rt.path, rt.methods))
				return
			}
			if err := rt.handler(s, w, r); err != nil {
				WriteError(w, s.Log, err)
			}
		}
		t.exact[rt.path] = h
		mux.HandleFunc(rt.path, h)
	}
	t.notFound = func(w http.ResponseWriter, r *http.Request, hint string) {
		target := r.URL.Path
		if target == "" {
			target = r.RequestURI // CONNECT's host:port
		}
		WriteError(w, s.Log, tollgate.Errorf(tollgate.CodeNotFound,
			"%s %s is not served on this listener (it serves %s)%s", r.Method, target, served, hint))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { t.notFound(w, r, "") })
	return t
}

// routeTable sends a request for one of the table's paths, spelled exactly,
// straight to its handler, and everything else through the ServeMux (path
// cleaning and its redirects, 404, the routes mounted later). The ServeMux's
// pattern matching cost a few µs a request on the hot path; for an exact,
// unescaped path it would pick the same handler.
//
// A path the ServeMux would clean (`//`, `/./`, `/../`) is not served: the
// ServeMux answered it with a 301 to the cleaned path, which has no error
// envelope and which clients follow by turning a POST into a GET. It is 404
// not_found, naming the path it would have meant (CONTRACT.md: any path that
// is not served).
type routeTable struct {
	methods  string // every method of the table's routes, for OPTIONS *
	exact    map[string]http.HandlerFunc
	mux      *http.ServeMux
	notFound func(w http.ResponseWriter, r *http.Request, hint string)
}

func (t *routeTable) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodConnect:
		// A proxy's tunnel (its target is a host, not a path): never
		// served. The ServeMux would answer with its plain-text 404.
		t.notFound(w, r, " (tollgate is not a proxy)")
		return
	case r.RequestURI == "*":
		// OPTIONS * (RFC 9110 §9.3.7) asks about the server as a whole:
		// answered here, after the middleware, so it has its request id
		// and access-log line (net/http's own answer has neither: the
		// listeners set DisableGeneralOptionsHandler).
		if r.Method != http.MethodOptions {
			t.notFound(w, r, "")
			return
		}
		w.Header().Set("Allow", t.methods)
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusOK)
		return
	}
	if r.URL.RawPath == "" {
		if h, ok := t.exact[r.URL.Path]; ok {
			h(w, r)
			return
		}
	}
	if clean := cleanPath(r.URL.Path); clean != r.URL.Path {
		t.notFound(w, r, " (a path is matched as spelled; "+clean+" is a different path)")
		return
	}
	t.mux.ServeHTTP(w, r)
}

// routeMethods lists the methods of routes, once each, in order of first
// appearance, with OPTIONS (answered for *).
func routeMethods(routes []route) string {
	var ms []string
	for _, rt := range append(routes, route{methods: http.MethodOptions}) {
		for _, m := range strings.Split(rt.methods, ",") {
			if m = strings.TrimSpace(m); m != "" && !slices.Contains(ms, m) {
				ms = append(ms, m)
			}
		}
	}
	return strings.Join(ms, ", ")
}

// cleanPath is the path the ServeMux would redirect p to: path.Clean, with a
// trailing slash kept.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		np += "/"
	}
	return np
}

// Handle mounts h on pattern (after the table's own routes). A pattern on
// one of the table's paths (with a method or a host, say) takes that path
// out of the fast path, so that the ServeMux decides between them.
func (t *routeTable) Handle(pattern string, h http.Handler) {
	for path := range t.exact {
		if strings.HasSuffix(pattern, path) {
			delete(t.exact, path)
		}
	}
	t.mux.Handle(pattern, h)
}

func allowed(methods, m string) bool {
	switch methods {
	case "POST":
		return m == http.MethodPost
	case "GET, HEAD":
		return m == http.MethodGet || m == http.MethodHead
	}
	return false
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) error {
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

// readyz is 200 when the instance can serve, else 503 with the reason: the
// shutdown has begun, the store does not answer, or a model has no node in
// rotation.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) error {
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
		return s.healthz(w, r)
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
