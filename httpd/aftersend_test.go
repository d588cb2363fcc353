package httpd_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/httpd"
)

// TestAfterSend checks that work registered with AfterSend runs after the
// response is on the wire: the client reads a whole answer, a streamed
// (chunked) answer with its trailer, and a panicking handler's 500 while
// that work is still blocked; the framing is what it would have been
// (Connection: close when a large request body went unread); and the work
// runs once per response.
func TestAfterSend(t *testing.T) {
	if refMode {
		t.Skip("AfterSend is this server's own; net/http has none")
	}
	release := make(chan struct{})
	var ran atomic.Int32
	after := func() {
		select {
		case <-release:
		case <-time.After(ioTimeout):
		}
		ran.Add(1)
	}
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !httpd.AfterSend(w, after) {
			t.Error("AfterSend refused this server's writer")
		}
		switch r.URL.Path {
		case "/whole":
			w.Header().Set("Content-Length", "5")
			io.WriteString(w, "whole")
		case "/stream":
			w.Header().Set("Trailer", "X-Cost")
			io.WriteString(w, "part one;")
			w.(http.Flusher).Flush()
			io.WriteString(w, "part two")
			w.Header().Set("X-Cost", "1.5")
		case "/unread":
			io.WriteString(w, "did not read your body")
		case "/panic":
			panic("handler failed")
		}
	}), quietLog)

	rc := dialRaw(t, ts.addr)
	rc.send("GET /whole HTTP/1.1\r\nHost: h\r\n\r\n")
	_, body := rc.mustResponse("GET")
	eq(t, "whole body", string(body), "whole")

	rc2 := dialRaw(t, ts.addr)
	rc2.send("GET /stream HTTP/1.1\r\nHost: h\r\n\r\n")
	resp, body := rc2.mustResponse("GET")
	eq(t, "streamed body", string(body), "part one;part two")
	eq(t, "trailer", resp.Trailer.Get("X-Cost"), "1.5")

	rc3 := dialRaw(t, ts.addr)
	big := strings.Repeat("x", 1<<20)
	rc3.send("POST /unread HTTP/1.1\r\nHost: h\r\nContent-Length: 1048576\r\n\r\n" + big)
	resp, body = rc3.mustResponse("POST")
	eq(t, "unread body's answer", string(body), "did not read your body")
	if !resp.Close {
		t.Error("an answer that left 1 MiB of request body unread lacks Connection: close")
	}

	rc4 := dialRaw(t, ts.addr)
	rc4.send("GET /panic HTTP/1.1\r\nHost: h\r\n\r\n")
	resp, _ = rc4.mustResponse("GET")
	eq(t, "status after a panic", resp.StatusCode, http.StatusInternalServerError)

	if n := ran.Load(); n != 0 {
		t.Errorf("AfterSend work ran %d times before it was released", n)
	}
	close(release)
	deadline := time.Now().Add(ioTimeout)
	for ran.Load() < 4 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	eq(t, "AfterSend work runs", int(ran.Load()), 4)

	if httpd.AfterSend(httptest.NewRecorder(), after) {
		t.Error("AfterSend accepted a writer that is not this server's")
	}
}
