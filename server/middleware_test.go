package server

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A handler that panics gets internal_error in the envelope with its request
// id (the middleware, on net/http's server over loopback), and the server
// goes on serving.
func TestPanicBecomesInternalError(t *testing.T) {
	var logBuf bytes.Buffer
	s := New(nil, nil, nil, slog.New(slog.NewJSONHandler(&logBuf, nil)))
	srv := httptest.NewServer(s.middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/boom" {
			panic("boom")
		}
		io.WriteString(w, "fine")
	})))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/boom")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	id := resp.Header.Get("X-Request-Id")
	var env struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if resp.StatusCode != 500 || json.Unmarshal(b, &env) != nil || env.Error.Code != "internal_error" ||
		!strings.HasPrefix(id, "req_") || !strings.Contains(env.Error.Message, id) {
		t.Fatalf("panic: %d %s (request id %q)", resp.StatusCode, b, id)
	}
	resp, err = http.Get(srv.URL + "/ok")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "fine" {
		t.Fatalf("after a panic: %q", b)
	}
	if !strings.Contains(logBuf.String(), `"msg":"panic"`) {
		t.Errorf("the panic was not logged: %s", logBuf.String())
	}
}

// EnvelopeListener rewrites net/http's own plain-text error and nothing
// else: a handler's answer that looks like one passes untouched.
func TestEnvelopeListenerRewritesOnlyTheServersErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Connection", "close")
		w.WriteHeader(400)
		io.WriteString(w, "400 Bad Request")
	})}
	go srv.Serve(EnvelopeListener(ln, func() string { n++; return "req_x" }))
	defer srv.Close()
	resp, err := http.Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "400 Bad Request" || resp.Header.Get("X-Request-Id") != "" {
		t.Errorf("a handler's 400 was rewritten: %q %v", b, resp.Header)
	}
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET / HTTP/1.1\r\n\r\n") // no Host: net/http's own 400
	got, _ := io.ReadAll(c)
	if !bytes.HasPrefix(got, []byte("HTTP/1.1 400 Bad Request\r\n")) || !bytes.Contains(got, []byte("\r\nX-Request-Id: req_x\r\n")) ||
		!bytes.Contains(got, []byte(`"code":"invalid_request"`)) || !bytes.Contains(got, []byte("missing required Host header")) {
		t.Errorf("net/http's own 400: %q", got)
	}
}
