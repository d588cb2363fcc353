package server

import (
	"net/http"
	"path"
	"slices"
	"strings"

	"github.com/tollgate/tollgate"
)

// Mux is one listener's routes: an http.ServeMux on method patterns
// ("POST /v1/chat/completions"), whose misses answer in the error envelope
// instead of the ServeMux's plain text:
//
//   - a path some pattern serves, asked with another method: 405
//     method_not_allowed, with Allow;
//   - any other path: 404 not_found, naming the paths the listener serves;
//   - a path the ServeMux would clean (`//`, `/./`, `/../`): 404 not_found,
//     naming the path it would have meant. The ServeMux answered it with a
//     301 to the cleaned path, which has no error envelope and which clients
//     follow by turning a POST into a GET; a path is matched as spelled
//     (docs/api.md: any path that is not served is 404).
//
// A subtree pattern ("/console/") gets every request under it that no
// longer pattern serves, a served path asked with another method included:
// its handler answers the subtree's misses in its own way (the console's
// HTML page, the admin API's 404 after its token check). The method
// patterns under a subtree ("GET /console/keys") are its pages, and so are
// the subtrees under it ("GET /console/static/"): 404's message names the
// subtree for them, and OPTIONS *'s Allow leaves their
// methods out. Build a Mux with Server.NewMux, declare its routes with
// Handle, then serve Server.Handler(mux).
//
// A request whose method and unescaped path a pattern names exactly
// ("POST /v1/chat/completions") goes straight to that pattern's handler,
// the one the ServeMux would pick (no other pattern is as specific), without
// the ServeMux's match, which costs the hot path far more than a map lookup
// (server/route_bench_test.go). Such a request's r.Pattern is not set.
type Mux struct {
	s       *Server
	mux     *http.ServeMux
	exact   map[string][]exactRoute // path → its method patterns
	allow   map[string]string       // path → the methods its patterns name, for Allow
	paths   []string                // the exact paths, in the order declared
	trees   []string                // the subtree patterns' paths ("/console/")
	decl    []string                // the patterns, in the order declared
	miss404 string                  // what the listener serves, for 404's message
}

type exactRoute struct {
	method string
	h      http.Handler
}

// NewMux returns an empty route table.
func (s *Server) NewMux() *Mux {
	m := &Mux{s: s, mux: http.NewServeMux(), exact: map[string][]exactRoute{}, allow: map[string]string{}}
	m.mux.HandleFunc("/", m.miss)
	return m
}

// Handle serves pattern, a ServeMux pattern: "METHOD /path" (GET serves
// HEAD too), "/path" for any method, or "/prefix/" for a subtree. A path
// with wildcards ("{id}") is matched by the ServeMux alone, and another
// method on it is 404, not 405: the listeners' own paths are literal.
func (m *Mux) Handle(pattern string, h http.Handler) {
	m.mux.Handle(pattern, h)
	m.decl = append(m.decl, pattern)
	method, p, ok := strings.Cut(pattern, " ")
	if !ok {
		method, p = "", pattern
	}
	defer func() { m.miss404 = m.served() }()
	if strings.HasSuffix(p, "/") {
		m.trees = append(m.trees, p)
		return
	}
	if method != "" && !strings.Contains(p, "{") {
		m.exact[p] = append(m.exact[p], exactRoute{method, h})
	}
	if !slices.Contains(m.paths, p) {
		m.paths = append(m.paths, p)
	}
	switch method {
	case "":
	case http.MethodGet:
		m.allow[p] = join(m.allow[p], "GET, HEAD")
	default:
		m.allow[p] = join(m.allow[p], method)
	}
}

// Patterns are the patterns declared, in order.
func (m *Mux) Patterns() []string { return slices.Clone(m.decl) }

// HandleFunc serves pattern with a handler that returns its error, which
// goes to the client in the error envelope.
func (m *Mux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request) error) {
	m.Handle(pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			WriteError(w, m.s.Log, err)
		}
	}))
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + ", " + b
}

func (m *Mux) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodConnect:
		// A proxy's tunnel (its target is a host, not a path): never
		// served. The ServeMux would answer with its plain-text 404.
		m.notFound(w, r, " (tollgate is not a proxy)")
		return
	case r.RequestURI == "*":
		// OPTIONS * (RFC 9110 §9.3.7) asks about the server as a whole:
		// answered here, after the middleware, so it has its request id
		// and access-log line (net/http's own answer has neither: the
		// listeners set DisableGeneralOptionsHandler).
		if r.Method != http.MethodOptions {
			m.notFound(w, r, "")
			return
		}
		w.Header().Set("Allow", m.methods())
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusOK)
		return
	}
	if r.URL.RawPath == "" {
		if routes, ok := m.exact[r.URL.Path]; ok {
			if h := pick(routes, r.Method); h != nil {
				h.ServeHTTP(w, r)
				return
			}
		}
	}
	if clean := cleanPath(r.URL.Path); clean != r.URL.Path {
		m.notFound(w, r, " (a path is matched as spelled; "+clean+" is a different path)")
		return
	}
	m.mux.ServeHTTP(w, r)
}

// pick is the handler of the route for method; GET's serves HEAD when no
// route names HEAD, as in the ServeMux.
func pick(routes []exactRoute, method string) http.Handler {
	var get http.Handler
	for _, rt := range routes {
		switch {
		case rt.method == method:
			return rt.h
		case rt.method == http.MethodGet:
			get = rt.h
		}
	}
	if method == http.MethodHead {
		return get
	}
	return nil
}

// miss is the "/" pattern: no other pattern matches the path and method
// (the ServeMux prefers any pattern that names the method or a longer path).
func (m *Mux) miss(w http.ResponseWriter, r *http.Request) {
	if methods := m.allow[r.URL.Path]; methods != "" && r.URL.RawPath == "" {
		w.Header().Set("Allow", methods)
		WriteError(w, m.s.Log, tollgate.Errorf(tollgate.CodeMethodNotAllowed,
			"%s is not allowed on %s; use %s", r.Method, r.URL.Path, methods))
		return
	}
	m.notFound(w, r, "")
}

func (m *Mux) notFound(w http.ResponseWriter, r *http.Request, hint string) {
	target := r.URL.Path
	if target == "" {
		target = r.RequestURI // CONNECT's host:port
	}
	WriteError(w, m.s.Log, tollgate.Errorf(tollgate.CodeNotFound,
		"%s %s is not served on this listener (it serves %s)%s", r.Method, target, m.miss404, hint))
}

// methods lists the methods the patterns name, once each, in the order
// declared, with OPTIONS (answered for *).
func (m *Mux) methods() string {
	var ms []string
	for _, p := range append(m.ownPaths(), "*") {
		methods := m.allow[p]
		if p == "*" {
			methods = http.MethodOptions
		}
		for _, method := range strings.Split(methods, ", ") {
			if method != "" && !slices.Contains(ms, method) {
				ms = append(ms, method)
			}
		}
	}
	return strings.Join(ms, ", ")
}

// served names the paths the listener serves with their methods, and its
// subtrees.
func (m *Mux) served() string {
	var names []string
	for _, p := range m.ownPaths() {
		if methods := m.allow[p]; methods != "" {
			p = methods + " " + p
		}
		names = append(names, p)
	}
	for _, t := range m.trees {
		if !m.inTree(t) {
			names = append(names, t)
		}
	}
	return strings.Join(names, ", ")
}

// ownPaths are the exact paths but a subtree's pages (its method patterns).
func (m *Mux) ownPaths() []string {
	return slices.DeleteFunc(slices.Clone(m.paths), func(p string) bool { return m.allow[p] != "" && m.inTree(p) })
}

// inTree reports whether p is under a subtree other than itself.
func (m *Mux) inTree(p string) bool {
	return slices.ContainsFunc(m.trees, func(t string) bool { return t != p && strings.HasPrefix(p, t) })
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
