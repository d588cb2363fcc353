package server

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
)

// The route table sends its exact paths straight to their handlers; a route
// mounted later on one of those paths (here with a method) must still win
// where the ServeMux would pick it.
func TestRouteTableLaterRouteOnATablePath(t *testing.T) {
	s := &Server{Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	table := []route{{"/healthz", "GET, HEAD", func(_ *Server, w http.ResponseWriter, _ *http.Request) error {
		_, err := io.WriteString(w, "table")
		return err
	}}}
	rt := s.mux(table)
	get := func(path string) string {
		w := httptest.NewRecorder()
		rt.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		return w.Body.String()
	}
	if got := get("/healthz"); got != "table" {
		t.Fatalf("before mounting: %q", got)
	}
	rt.Handle("GET /healthz", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "mounted") }))
	if got := get("/healthz"); got != "mounted" {
		t.Errorf("GET /healthz after mounting GET /healthz: %q, want the mounted route (the ServeMux's choice)", got)
	}
}
