package server

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// The Mux answers what no pattern serves in the error envelope: 405 with
// Allow for a served path asked with another method, 404 naming what the
// listener serves otherwise, and 404 (no redirect) for a path the ServeMux
// would clean. A subtree's handler gets every request under it.
func TestMux(t *testing.T) {
	s := &Server{Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	m := s.NewMux()
	reply := func(body string) func(http.ResponseWriter, *http.Request) error {
		return func(w http.ResponseWriter, _ *http.Request) error {
			_, err := io.WriteString(w, body)
			return err
		}
	}
	m.HandleFunc("POST /v1/chat/completions", reply("chat"))
	m.HandleFunc("GET /v1/models", reply("models"))
	m.Handle("/console/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "console "+r.Method) }))
	for _, c := range []struct {
		method, path string
		status       int
		code, allow  string
		body         string // the body, or a part of the error's message
	}{
		{"POST", "/v1/chat/completions", 200, "", "", "chat"},
		{"GET", "/v1/models", 200, "", "", "models"},
		{"HEAD", "/v1/models", 200, "", "", "models"}, // net/http drops the body of a HEAD
		{"GET", "/v1/chat/completions", 405, "method_not_allowed", "POST", "GET is not allowed on /v1/chat/completions; use POST"},
		{"DELETE", "/v1/models", 405, "method_not_allowed", "GET, HEAD", "use GET, HEAD"},
		{"POST", "/v1/embeddings", 404, "not_found", "", "it serves POST /v1/chat/completions, GET, HEAD /v1/models, /console/"},
		{"POST", "/v1/chat/completions/", 404, "not_found", "", "is not served"},
		{"POST", "/v1/chat%2Fcompletions", 404, "not_found", "", "is not served"},
		{"GET", "/v1/chat%2Fcompletions", 404, "not_found", "", "is not served"},
		{"POST", "/v1//chat/completions", 404, "not_found", "", "/v1/chat/completions is a different path"},
		{"GET", "/v2/../v1/models", 404, "not_found", "", "/v1/models is a different path"},
		{"PUT", "/console/keys", 200, "", "", "console PUT"},
	} {
		w := httptest.NewRecorder()
		m.ServeHTTP(w, httptest.NewRequest(c.method, c.path, nil))
		if w.Code != c.status || w.Header().Get("Allow") != c.allow {
			t.Errorf("%s %s: %d Allow %q, want %d Allow %q: %s", c.method, c.path, w.Code, w.Header().Get("Allow"), c.status, c.allow, w.Body)
			continue
		}
		if c.code == "" {
			if w.Body.String() != c.body {
				t.Errorf("%s %s: body %q, want %q", c.method, c.path, w.Body, c.body)
			}
			continue
		}
		var env struct {
			Error struct{ Code, Message string }
		}
		if err := json.Unmarshal(w.Body.Bytes(), &env); err != nil || env.Error.Code != c.code || !strings.Contains(env.Error.Message, c.body) {
			t.Errorf("%s %s: %s, want code %s and a message with %q", c.method, c.path, w.Body, c.code, c.body)
		}
	}
}

// The pages of a subtree (its method patterns, and the subtrees under it)
// are served by their patterns, another method on them goes to the
// subtree's handler, and neither 404's message nor OPTIONS *'s Allow names
// them; a method-less path under a subtree is named.
func TestMuxSubtreePages(t *testing.T) {
	s := &Server{Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	m := s.NewMux()
	reply := func(body string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body+" "+r.Method) })
	}
	m.Handle("GET /v1/models", reply("models"))
	m.Handle("/console/", reply("console miss"))
	m.Handle("POST /console/keys", reply("keys"))
	m.Handle("GET /console/static/", reply("static"))
	m.Handle("/debug/pprof/", reply("pprof"))
	m.Handle("/debug/pprof/profile", reply("profile"))
	if want := []string{"GET /v1/models", "/console/", "POST /console/keys", "GET /console/static/", "/debug/pprof/", "/debug/pprof/profile"}; !slices.Equal(m.Patterns(), want) {
		t.Errorf("Patterns: %q, want %q", m.Patterns(), want)
	}
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/console/keys", "keys POST"},
		{"GET", "/console/keys", "console miss GET"},
		{"GET", "/console/static/console.css", "static GET"},
		{"POST", "/console/static/console.css", "console miss POST"},
		{"GET", "/debug/pprof/profile", "profile GET"},
	} {
		w := httptest.NewRecorder()
		m.ServeHTTP(w, httptest.NewRequest(c.method, c.path, nil))
		if w.Code != 200 || w.Body.String() != c.body {
			t.Errorf("%s %s: %d %q, want %q", c.method, c.path, w.Code, w.Body, c.body)
		}
	}
	w := httptest.NewRecorder()
	m.ServeHTTP(w, httptest.NewRequest("GET", "/v1/embeddings", nil))
	if want := "(it serves GET, HEAD /v1/models, /debug/pprof/profile, /console/, /debug/pprof/)"; w.Code != 404 || !strings.Contains(w.Body.String(), want) {
		t.Errorf("GET /v1/embeddings: %d %s, want 404 with %q", w.Code, w.Body, want)
	}
	r := httptest.NewRequest("OPTIONS", "/", nil)
	r.RequestURI = "*"
	w = httptest.NewRecorder()
	m.ServeHTTP(w, r)
	if got := w.Header().Get("Allow"); w.Code != 200 || got != "GET, HEAD, OPTIONS" {
		t.Errorf("OPTIONS *: %d Allow %q, want GET, HEAD, OPTIONS", w.Code, got)
	}
}
