package server

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// BenchmarkRouteDispatch is what finding a request's handler costs on the
// api listener's routes (without the middleware or the handler's work):
// the hot path (POST /v1/chat/completions), a GET, and a 404; each through
// the Mux, and through its ServeMux alone (no exact-path lookup first).
//
//	go test -run '^$' -bench RouteDispatch -benchmem ./server/
func BenchmarkRouteDispatch(b *testing.B) {
	s := New(nil, nil, nil, nil)
	noop := func(http.ResponseWriter, *http.Request) error { return nil }
	m := s.NewMux()
	m.HandleFunc("POST /v1/chat/completions", noop)
	m.HandleFunc("GET /v1/models", noop)
	m.HandleFunc("GET /pricing", noop)
	m.Handle("/console/", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	m.Handle("GET /favicon.ico", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	w := httptest.NewRecorder()
	for _, c := range []struct{ name, method, path string }{
		{"chat", "POST", "/v1/chat/completions"},
		{"models", "GET", "/v1/models"},
		{"404", "GET", "/v1/embeddings"},
	} {
		r := httptest.NewRequest(c.method, c.path, nil)
		for _, via := range []struct {
			name string
			h    http.Handler
		}{{"mux", m}, {"servemux", m.mux}} {
			b.Run(c.name+"/"+via.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					via.h.ServeHTTP(w, r)
				}
			})
		}
	}
}
