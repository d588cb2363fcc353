package httpd_test

// Regression tests for bugs found in review, each failing before its fix.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/httpd"
)

// A handler that leaves the body to a goroutine and returns: the goroutine's
// late read gets an error, never the next request's bytes (run with -race).
func TestBodyReadAfterHandlerReturned(t *testing.T) {
	skipInRef(t, "httpd's body lock")
	late := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/leak" {
			go func() {
				time.Sleep(50 * time.Millisecond)
				_, err := io.ReadAll(r.Body)
				late <- err
			}()
			return
		}
		b, _ := io.ReadAll(r.Body)
		w.Write(b)
	})
	ts := startServer(t, h)
	rc := dialRaw(t, ts.addr)
	rc.send("POST /leak HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello")
	rc.mustResponse("POST")
	if err := recv(t, late, "the late read"); !errors.Is(err, http.ErrBodyReadAfterClose) {
		t.Errorf("late read: %v, want ErrBodyReadAfterClose", err)
	}
	rc.send("POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 6\r\n\r\nsecond")
	if _, body := rc.mustResponse("POST"); string(body) != "second" {
		t.Errorf("next request's body = %q, want %q", body, "second")
	}
}

// Headers changed after WriteHeader do not go out: never Content-Length and
// chunked together.
func TestHeaderChangesAfterWriteHeaderIgnored(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		w.Header().Set("Content-Length", "40000")
		w.Header().Set("X-Late", "1")
		w.Write(bytes.Repeat([]byte("a"), 40000))
	})
	ts := startServer(t, h)
	rc := dialRaw(t, ts.addr)
	rc.send("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	resp, body := rc.mustResponse("GET")
	if len(body) != 40000 {
		t.Errorf("body %d bytes, want 40000", len(body))
	}
	if resp.Header.Get("X-Late") != "" {
		t.Error("a header set after WriteHeader went out")
	}
	if len(resp.TransferEncoding) > 0 && resp.ContentLength >= 0 {
		t.Errorf("both Transfer-Encoding %v and Content-Length %d", resp.TransferEncoding, resp.ContentLength)
	}
}

// The handler's write deadline still holds for the end of the response: a
// client that never reads cannot hold the connection (and Shutdown) forever.
func TestWriteDeadlineCoversTheEndOfTheResponse(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
		w.Header().Set("Content-Length", "3000")
		w.Write(make([]byte, 3000)) // held in the buffer: the final flush writes it
	})
	var hs *httpd.Server
	ts := startServer(t, h, func(s *httpd.Server) { hs = s })
	// Fill the connection so that the final flush blocks: many pipelined
	// requests, no reads.
	c, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4096)
	}
	go func() {
		req := strings.Repeat("GET / HTTP/1.1\r\nHost: h\r\n\r\n", 8000) // 24 MB of answers
		_, _ = io.WriteString(c, req)
	}()
	time.Sleep(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v (a response write to a client that does not read ignored its deadline)", err)
	}
}

// Trailer field names that are not tokens never reach the wire (no response
// splitting through a trailer name).
func TestTrailerNamesAreChecked(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Ok, Bad Name")
		w.WriteHeader(200)
		w.Write([]byte("body"))
		w.Header().Set("X-Ok", "1")
		w.Header()[http.TrailerPrefix+"A: b\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil"] = []string{"x"}
	})
	ts := startServer(t, h)
	rc := dialRaw(t, ts.addr)
	rc.send("GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
	resp, body := rc.mustResponse("GET")
	if string(body) != "body" || resp.Trailer.Get("X-Ok") != "1" {
		t.Errorf("body %q, trailer %v", body, resp.Trailer)
	}
	if rest, _ := rc.drain(closeWithin); len(rest) > 0 {
		t.Errorf("bytes after the response: %q", rest)
	}
}

// Trailers by http.TrailerPrefix make a small body chunked so they are sent.
func TestPrefixedTrailerOnASmallBody(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("small"))
		w.Header().Set(http.TrailerPrefix+"X-T", "v")
	})
	ts := startServer(t, h)
	resp, err := newClient(t).Get("http://" + ts.addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "small" || resp.Trailer.Get("X-T") != "v" {
		t.Errorf("body %q, trailer %v", b, resp.Trailer)
	}
}

// A chunked body whose trailer section is not made of header lines is an
// error: what follows is never taken for the next request.
func TestMalformedChunkedTrailer(t *testing.T) {
	calls := make(chan string, 4)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		calls <- r.URL.Path
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
		}
	})
	ts := startServer(t, h)
	rc := dialRaw(t, ts.addr)
	rc.send("POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\nGET /smuggled HTTP/1.1\r\nX\x00Y\r\n\r\nGET /b HTTP/1.1\r\nHost: h\r\n\r\n")
	resp, _ := rc.mustResponse("POST")
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("status %d, want 400 (the handler's body read failed)", resp.StatusCode)
	}
	rc.drain(closeWithin)
	close(calls)
	for p := range calls {
		if p != "/a" {
			t.Errorf("the handler was called for %s", p)
		}
	}
}

// Two Host headers are refused in HTTP/1.0 too; a body with Content-Encoding
// is not sniffed.
func TestHostTwiceAndContentEncoding(t *testing.T) {
	skipInRef(t, "ErrorBody")
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		w.Write([]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0})
	})
	ts := startServer(t, h)
	rc := dialRaw(t, ts.addr)
	rc.send("GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n")
	if resp, _ := rc.mustResponse("GET"); resp.StatusCode != 400 {
		t.Errorf("two Host headers: %d, want 400", resp.StatusCode)
	}
	rc = dialRaw(t, ts.addr)
	rc.send("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	if resp, _ := rc.mustResponse("GET"); resp.Header.Get("Content-Type") != "" {
		t.Errorf("Content-Type %q sniffed despite Content-Encoding", resp.Header.Get("Content-Type"))
	}
}

// A panicking ErrorBody does not take the process down; the client still
// gets an answer.
func TestErrorBodyPanic(t *testing.T) {
	skipInRef(t, "ErrorBody")
	ts := startServer(t, http.NotFoundHandler(), quietLog, func(s *httpd.Server) {
		s.ErrorBody = func(int, string) (string, []byte) { panic("bug") }
	})
	rc := dialRaw(t, ts.addr)
	rc.send("GARBAGE\r\n\r\n")
	if resp, _ := rc.mustResponse("GET"); resp.StatusCode != 400 {
		t.Errorf("status %d, want 400", resp.StatusCode)
	}
}

// Requests pipelined before the client shut its side of the connection are
// all answered, even when the watcher saw the shutdown during a slow one.
func TestPipelinedThenHalfClosed(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(5 * time.Millisecond) // longer than WatchDelay
		w.Write([]byte(r.URL.Path))
	})
	ts := startServer(t, h)
	rc := dialRaw(t, ts.addr)
	var reqs strings.Builder
	for i := range 10 {
		fmt.Fprintf(&reqs, "GET /%d HTTP/1.1\r\nHost: h\r\n\r\n", i)
	}
	rc.send(reqs.String())
	if err := rc.c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		_, body, err := rc.response("GET")
		if err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
		if want := fmt.Sprintf("/%d", i); string(body) != want {
			t.Fatalf("response %d: body %q, want %q", i, body, want)
		}
	}
}

// A client that stalls in the middle of its body gets its request failed
// after BodyIdleTimeout instead of holding the connection forever.
func TestBodyIdleTimeout(t *testing.T) {
	skipInRef(t, "BodyIdleTimeout")
	readErr := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		readErr <- err
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
		}
	})
	ts := startServer(t, h, func(s *httpd.Server) { s.BodyIdleTimeout = 200 * time.Millisecond })
	rc := dialRaw(t, ts.addr)
	rc.send("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\nabc")
	start := time.Now()
	if err := recv(t, readErr, "the handler's body read"); err == nil {
		t.Fatal("the body read succeeded with 7 bytes missing")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the stalled body failed after %v, want about 200ms", d)
	}
	if resp, _ := rc.mustResponse("POST"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("status %d, want the handler's 400", resp.StatusCode)
	}
	rc.expectClosed()
}

// A chunked body that stalls with part of a chunk-size line buffered still
// hits BodyIdleTimeout.
func TestBodyIdleTimeoutChunked(t *testing.T) {
	skipInRef(t, "BodyIdleTimeout")
	readErr := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		readErr <- err
	})
	ts := startServer(t, h, func(s *httpd.Server) { s.BodyIdleTimeout = 200 * time.Millisecond })
	rc := dialRaw(t, ts.addr)
	rc.send("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n1")
	if err := recv(t, readErr, "the handler's body read"); err == nil {
		t.Fatal("the stalled chunked body was read without error")
	}
}

// The handler's own read deadline wins over BodyIdleTimeout.
func TestHandlerReadDeadlineWins(t *testing.T) {
	skipInRef(t, "BodyIdleTimeout")
	took := make(chan time.Duration, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		_ = http.NewResponseController(w).SetReadDeadline(start.Add(200 * time.Millisecond))
		_, _ = io.ReadAll(r.Body)
		took <- time.Since(start)
	})
	ts := startServer(t, h, func(s *httpd.Server) { s.BodyIdleTimeout = 5 * time.Second })
	rc := dialRaw(t, ts.addr)
	rc.send("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\nabc")
	if d := recv(t, took, "the handler's body read"); d > 2*time.Second {
		t.Errorf("the read ended after %v, want about 200ms (the handler's deadline)", d)
	}
}

// A read deadline the handler set does not make the disconnect watcher
// report a client that is still there.
func TestWatcherIgnoresHandlerDeadline(t *testing.T) {
	cancelled := make(chan bool, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		_, _ = io.ReadAll(r.Body)
		select {
		case <-r.Context().Done():
			cancelled <- true
		case <-time.After(300 * time.Millisecond):
			cancelled <- false
		}
	})
	ts := startServer(t, h)
	rc := dialRaw(t, ts.addr)
	rc.send("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc")
	if recv(t, cancelled, "the handler") {
		t.Error("the request was cancelled while its client was connected")
	}
	rc.mustResponse("POST")
}

// A body read blocked on a goroutine the handler left behind does not hold
// up the response.
func TestLeftBehindReadDoesNotHoldTheResponse(t *testing.T) {
	skipInRef(t, "httpd's body lock")
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		go io.ReadAll(r.Body) // the body never comes
		time.Sleep(20 * time.Millisecond)
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	ts := startServer(t, h)
	rc := dialRaw(t, ts.addr)
	rc.send("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n")
	start := time.Now()
	resp, _ := rc.mustResponse("POST")
	if resp.StatusCode != http.StatusServiceUnavailable || time.Since(start) > 2*time.Second {
		t.Errorf("status %d after %v, want 503 at once", resp.StatusCode, time.Since(start))
	}
}

// Framing fields declared as trailers are ignored: the response keeps its
// framing.
func TestFramingIsNeverATrailer(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "Content-Length, Transfer-Encoding")
		w.Header().Set("Content-Length", "5")
		w.Write([]byte("hello"))
	})
	ts := startServer(t, h)
	rc := dialRaw(t, ts.addr)
	rc.send("GET /1 HTTP/1.1\r\nHost: h\r\n\r\nGET /2 HTTP/1.1\r\nHost: h\r\n\r\n")
	for i := range 2 {
		if _, body := rc.mustResponse("GET"); string(body) != "hello" {
			t.Errorf("response %d: body %q", i, body)
		}
	}
}
