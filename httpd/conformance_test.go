package httpd_test

// Black-box conformance tests for httpd.Server: HTTP/1.1 message framing and
// connection management (RFC 9112), semantics (RFC 9110) and parity with
// net/http's server, all over real TCP on 127.0.0.1.
//
// HTTPD_CONFORMANCE_REF=net/http runs the same tests against net/http's own
// server, to check the tests themselves; tests of httpd-only features (or of
// places where this package is meant to be stricter than net/http) are
// skipped then.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/httpd"
)

var refMode = os.Getenv("HTTPD_CONFORMANCE_REF") == "net/http"

const (
	ioTimeout   = 5 * time.Second // deadline of every raw client connection
	closeWithin = 2 * time.Second // generous bound for "the server closes the connection"
)

func skipInRef(t *testing.T, why string) {
	t.Helper()
	if refMode {
		t.Skip("not checked against net/http: " + why)
	}
}

// ---------------------------------------------------------------- helpers

type server interface {
	Serve(net.Listener) error
	Shutdown(context.Context) error
	Close() error
}

type testServer struct {
	srv  server
	addr string
	done chan struct{}
	err  error // Serve's result, once done is closed
}

func quietLog(s *httpd.Server) { s.Log = slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startServer serves h on a fresh 127.0.0.1 listener until the test ends,
// then closes the server and checks that Serve returned ErrServerClosed.
func startServer(t *testing.T, h http.Handler, opts ...func(*httpd.Server)) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &httpd.Server{Handler: h}
	for _, o := range opts {
		o(hs)
	}
	ts := &testServer{srv: hs, addr: ln.Addr().String(), done: make(chan struct{})}
	if refMode {
		ts.srv = &http.Server{Handler: h, ReadHeaderTimeout: hs.ReadHeaderTimeout, IdleTimeout: hs.IdleTimeout,
			MaxHeaderBytes: hs.MaxHeaderBytes, ErrorLog: log.New(io.Discard, "", 0)}
	}
	go func() {
		ts.err = ts.srv.Serve(ln)
		close(ts.done)
	}()
	t.Cleanup(func() {
		ts.srv.Close()
		if err := ts.wait(ioTimeout); !errors.Is(err, httpd.ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	})
	// Fail fast (rather than by timeouts) when Serve cannot serve at all.
	select {
	case <-ts.done:
		t.Fatalf("Serve returned at once: %v", ts.err)
	case <-time.After(5 * time.Millisecond):
	}
	return ts
}

func (ts *testServer) wait(d time.Duration) error {
	select {
	case <-ts.done:
		return ts.err
	case <-time.After(d):
		return fmt.Errorf("Serve did not return within %v", d)
	}
}

type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, ioTimeout)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c.SetDeadline(time.Now().Add(ioTimeout))
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (rc *rawConn) send(s string) {
	rc.t.Helper()
	if _, err := io.WriteString(rc.c, s); err != nil {
		rc.t.Fatalf("write: %v", err)
	}
}

// response reads one response to a request of the given method, body included.
func (rc *rawConn) response(method string) (*http.Response, []byte, error) {
	resp, err := http.ReadResponse(rc.br, &http.Request{Method: method})
	if err != nil {
		return nil, nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, body, err
}

func (rc *rawConn) mustResponse(method string) (*http.Response, []byte) {
	rc.t.Helper()
	resp, body, err := rc.response(method)
	if err != nil {
		rc.t.Fatalf("reading the response to %s: %v", method, err)
	}
	return resp, body
}

// drain reads until the server closes the connection (closed) or within passes.
func (rc *rawConn) drain(within time.Duration) (data []byte, closed bool) {
	rc.c.SetReadDeadline(time.Now().Add(within))
	buf := make([]byte, 32<<10)
	for {
		n, err := rc.br.Read(buf)
		data = append(data, buf[:n]...)
		if err != nil {
			return data, !isTimeout(err)
		}
	}
}

// expectClosed checks that the server closes the connection, sending nothing more.
func (rc *rawConn) expectClosed() {
	rc.t.Helper()
	data, closed := rc.drain(closeWithin)
	if !closed {
		rc.t.Errorf("server did not close the connection within %v", closeWithin)
	}
	if len(data) > 0 {
		rc.t.Errorf("unexpected bytes from the server before it closed: %q", clip(data))
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func isClosedErr(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func clip(b []byte) []byte {
	if len(b) > 300 {
		return append(b[:300:300], "..."...)
	}
	return b
}

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(ioTimeout):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func eq(t *testing.T, name string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s = %#v, want %#v", name, got, want)
	}
}

// reqInfo is what a handler saw of a request.
type reqInfo struct {
	Method, Path, RawPath, RawQuery, RequestURI, Host, RemoteAddr, Proto string
	ProtoMajor, ProtoMinor                                               int
	Header, Trailer                                                      http.Header
	ContentLength                                                        int64
	TransferEncoding                                                     []string
	Body                                                                 string
	BodyErr                                                              error
}

func captureHandler(ch chan<- reqInfo) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in := reqInfo{Method: r.Method, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery,
			RequestURI: r.RequestURI, Host: r.Host, RemoteAddr: r.RemoteAddr, Proto: r.Proto,
			ProtoMajor: r.ProtoMajor, ProtoMinor: r.ProtoMinor, Header: r.Header.Clone(),
			ContentLength: r.ContentLength, TransferEncoding: r.TransferEncoding}
		b, err := io.ReadAll(r.Body)
		in.Body, in.BodyErr = string(b), err
		in.Trailer = r.Trailer.Clone()
		select {
		case ch <- in:
		default:
		}
		io.WriteString(w, "ok")
	})
}

// echoPath answers "METHOD PATH:BODY".
var echoPath = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	fmt.Fprintf(w, "%s %s:%s", r.Method, r.URL.Path, b)
})

func newClient(t *testing.T) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 32, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: ioTimeout}
}

// ---------------------------------------------------------------- 1. request fields

func TestRequestFieldsGET(t *testing.T) {
	infos := make(chan reqInfo, 1)
	ts := startServer(t, captureHandler(infos))
	rc := dialRaw(t, ts.addr)
	rc.send("GET /a/b?x=1&y=2 HTTP/1.1\r\nHost: example.com:8080\r\ncontent-type: text/foo\r\n" +
		"x-multi: 1\r\nX-MULTI: 2\r\n\r\n")
	resp, body := rc.mustResponse("GET")
	if resp.StatusCode != 200 || string(body) != "ok" {
		t.Fatalf("response %q %q, want 200 \"ok\"", resp.Status, body)
	}
	in := recv(t, infos, "the handler")
	eq(t, "Method", in.Method, "GET")
	eq(t, "URL.Path", in.Path, "/a/b")
	eq(t, "URL.RawQuery", in.RawQuery, "x=1&y=2")
	eq(t, "RequestURI", in.RequestURI, "/a/b?x=1&y=2")
	eq(t, "Host", in.Host, "example.com:8080")
	if v, ok := in.Header["Host"]; ok {
		t.Errorf("Host left in r.Header: %q (net/http removes it)", v)
	}
	eq(t, `Header["Content-Type"]`, in.Header["Content-Type"], []string{"text/foo"})
	eq(t, `Header["X-Multi"]`, in.Header["X-Multi"], []string{"1", "2"})
	for k := range in.Header {
		if k != http.CanonicalHeaderKey(k) {
			t.Errorf("header key %q is not canonical", k)
		}
	}
	eq(t, "ContentLength", in.ContentLength, int64(0))
	eq(t, "body", in.Body, "")
	eq(t, "body error", in.BodyErr, error(nil))
	eq(t, "RemoteAddr", in.RemoteAddr, rc.c.LocalAddr().String())
	eq(t, "Proto", in.Proto, "HTTP/1.1")
	eq(t, "ProtoMajor", in.ProtoMajor, 1)
	eq(t, "ProtoMinor", in.ProtoMinor, 1)
}

func TestRequestFieldsPOSTContentLength(t *testing.T) {
	infos := make(chan reqInfo, 1)
	ts := startServer(t, captureHandler(infos))
	rc := dialRaw(t, ts.addr)
	rc.send("POST /submit?k=v HTTP/1.1\r\nHost: h.test\r\ncontent-type: application/x-www-form-urlencoded\r\n" +
		"content-length: 11\r\n\r\nhello world")
	if resp, _ := rc.mustResponse("POST"); resp.StatusCode != 200 {
		t.Fatalf("status %q", resp.Status)
	}
	in := recv(t, infos, "the handler")
	eq(t, "Method", in.Method, "POST")
	eq(t, "URL.Path", in.Path, "/submit")
	eq(t, "URL.RawQuery", in.RawQuery, "k=v")
	eq(t, "Host", in.Host, "h.test")
	eq(t, `Header["Content-Type"]`, in.Header["Content-Type"], []string{"application/x-www-form-urlencoded"})
	eq(t, "ContentLength", in.ContentLength, int64(11))
	eq(t, "body", in.Body, "hello world")
	eq(t, "body error", in.BodyErr, error(nil))
	if in.RemoteAddr == "" {
		t.Error("RemoteAddr is empty")
	}
	eq(t, "Proto", in.Proto, "HTTP/1.1")
}

func TestRequestTargetForms(t *testing.T) {
	infos := make(chan reqInfo, 1)
	ts := startServer(t, captureHandler(infos))
	t.Run("absolute-form overrides Host (RFC 9112 3.2.2)", func(t *testing.T) {
		rc := dialRaw(t, ts.addr)
		rc.send("GET http://example.com/x?q=1 HTTP/1.1\r\nHost: other.test\r\n\r\n")
		rc.mustResponse("GET")
		in := recv(t, infos, "the handler")
		eq(t, "URL.Path", in.Path, "/x")
		eq(t, "URL.RawQuery", in.RawQuery, "q=1")
		eq(t, "Host", in.Host, "example.com")
	})
	t.Run("percent-encoded path", func(t *testing.T) {
		rc := dialRaw(t, ts.addr)
		rc.send("GET /a%20b/c%2Fd HTTP/1.1\r\nHost: h\r\n\r\n")
		rc.mustResponse("GET")
		in := recv(t, infos, "the handler")
		eq(t, "URL.Path", in.Path, "/a b/c/d")
		eq(t, "URL.RawPath", in.RawPath, "/a%20b/c%2Fd")
		eq(t, "RequestURI", in.RequestURI, "/a%20b/c%2Fd")
	})
}

// ---------------------------------------------------------------- 2. chunked request body

func TestChunkedRequestBody(t *testing.T) {
	infos := make(chan reqInfo, 2)
	ts := startServer(t, captureHandler(infos))
	rc := dialRaw(t, ts.addr)
	rc.send("POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n" +
		"5;ext=1\r\nhello\r\n6;name=\"quoted\"\r\n world\r\n0\r\nX-T: tv\r\n\r\n" +
		"GET /after HTTP/1.1\r\nHost: h\r\n\r\n")
	if resp, _ := rc.mustResponse("POST"); resp.StatusCode != 200 {
		t.Errorf("status %q", resp.Status)
	}
	in := recv(t, infos, "the handler")
	eq(t, "ContentLength", in.ContentLength, int64(-1))
	eq(t, "TransferEncoding", in.TransferEncoding, []string{"chunked"})
	eq(t, "body", in.Body, "hello world")
	eq(t, "body error", in.BodyErr, error(nil))
	// The trailer section was consumed: the next request on the connection parses.
	if resp, _ := rc.mustResponse("GET"); resp.StatusCode != 200 {
		t.Errorf("request after the chunked one: status %q", resp.Status)
	}
	eq(t, "next request's path", recv(t, infos, "the second request").Path, "/after")
}

func TestChunkedRequestTrailerVisible(t *testing.T) {
	infos := make(chan reqInfo, 1)
	ts := startServer(t, captureHandler(infos))
	rc := dialRaw(t, ts.addr)
	rc.send("POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n" +
		"5\r\nhello\r\n0\r\nX-T: tv\r\n\r\n")
	rc.mustResponse("POST")
	in := recv(t, infos, "the handler")
	if got := in.Trailer.Get("X-T"); got != "tv" {
		t.Errorf(`r.Trailer.Get("X-T") after the body's EOF = %q, want "tv" (net/http parity); r.Trailer = %v`, got, in.Trailer)
	}
}

// ---------------------------------------------------------------- 3. keep-alive, pipelining

func TestKeepAliveSequential(t *testing.T) {
	ts := startServer(t, echoPath)
	rc := dialRaw(t, ts.addr)
	for i := 1; i <= 3; i++ {
		rc.send(fmt.Sprintf("GET /%d HTTP/1.1\r\nHost: h\r\n\r\n", i))
		resp, body := rc.mustResponse("GET")
		eq(t, fmt.Sprintf("response %d", i), string(body), fmt.Sprintf("GET /%d:", i))
		if resp.Close {
			t.Fatalf("response %d asks to close the connection", i)
		}
	}
}

func TestPipelining(t *testing.T) {
	ts := startServer(t, echoPath)
	rc := dialRaw(t, ts.addr)
	rc.send("POST /1 HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc" +
		"GET /2 HTTP/1.1\r\nHost: h\r\n\r\n" +
		"GET /3 HTTP/1.1\r\nHost: h\r\n\r\n")
	for i, want := range []string{"POST /1:abc", "GET /2:", "GET /3:"} {
		_, body := rc.mustResponse("GET")
		eq(t, fmt.Sprintf("pipelined response %d", i+1), string(body), want)
	}
}

// ---------------------------------------------------------------- 4. HTTP/1.0

func TestHTTP10ClosesByDefault(t *testing.T) {
	ts := startServer(t, echoPath)
	rc := dialRaw(t, ts.addr)
	rc.send("GET /x HTTP/1.0\r\n\r\n") // no Host: fine in HTTP/1.0
	resp, body := rc.mustResponse("GET")
	eq(t, "status", resp.StatusCode, 200)
	eq(t, "body", string(body), "GET /x:")
	eq(t, "TransferEncoding", resp.TransferEncoding, []string(nil))
	rc.expectClosed()
}

func TestHTTP10KeepAlive(t *testing.T) {
	ts := startServer(t, echoPath)
	rc := dialRaw(t, ts.addr)
	for i := 1; i <= 2; i++ {
		rc.send(fmt.Sprintf("GET /%d HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", i))
		resp, body := rc.mustResponse("GET")
		eq(t, "body", string(body), fmt.Sprintf("GET /%d:", i))
		eq(t, "TransferEncoding", resp.TransferEncoding, []string(nil))
		if resp.ContentLength != int64(len(body)) {
			t.Errorf("response %d: ContentLength %d, want %d", i, resp.ContentLength, len(body))
		}
		if !strings.EqualFold(resp.Header.Get("Connection"), "keep-alive") {
			t.Errorf("response %d to an HTTP/1.0 keep-alive request: Connection %q, want keep-alive (else a 1.0 client closes)",
				i, resp.Header.Get("Connection"))
		}
	}
	rc.send("GET /3 HTTP/1.0\r\n\r\n")
	_, body := rc.mustResponse("GET")
	eq(t, "body", string(body), "GET /3:")
	rc.expectClosed()
}

func TestHTTP10StreamedResponseNotChunked(t *testing.T) {
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "part1")
		w.(http.Flusher).Flush()
		io.WriteString(w, "part2")
	}))
	rc := dialRaw(t, ts.addr)
	rc.send("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
	resp, body := rc.mustResponse("GET")
	eq(t, "TransferEncoding", resp.TransferEncoding, []string(nil))
	eq(t, "body", string(body), "part1part2")
}

// ---------------------------------------------------------------- 5. Connection: close

func TestClientConnectionClose(t *testing.T) {
	ts := startServer(t, echoPath)
	rc := dialRaw(t, ts.addr)
	rc.send("GET /c HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
	resp, body := rc.mustResponse("GET")
	eq(t, "body", string(body), "GET /c:")
	if !resp.Close { // http.ReadResponse turns "Connection: close" into resp.Close
		t.Errorf("response lacks Connection: close")
	}
	rc.expectClosed()
}

func TestHandlerConnectionClose(t *testing.T) {
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		io.WriteString(w, "bye")
	}))
	rc := dialRaw(t, ts.addr)
	rc.send("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	resp, body := rc.mustResponse("GET")
	eq(t, "body", string(body), "bye")
	eq(t, "resp.Close", resp.Close, true)
	rc.expectClosed()
}

// ---------------------------------------------------------------- 6. response framing

var bigBody = bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB

func framingHandler(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/small":
		io.WriteString(w, "hel")
		io.WriteString(w, "lo")
	case "/flush":
		io.WriteString(w, "part1")
		w.(http.Flusher).Flush()
		io.WriteString(w, "part2")
	case "/cl":
		w.Header().Set("Content-Length", "10")
		io.WriteString(w, "01234")
		w.(http.Flusher).Flush()
		io.WriteString(w, "56789")
	case "/big":
		w.Write(bigBody)
	case "/204":
		w.WriteHeader(204)
		io.WriteString(w, "nope204")
	case "/304":
		w.WriteHeader(304)
		io.WriteString(w, "nope304")
	default:
		io.WriteString(w, "hello world")
	}
}

func TestResponseFraming(t *testing.T) {
	ts := startServer(t, http.HandlerFunc(framingHandler))
	followUp := func(t *testing.T, rc *rawConn) {
		t.Helper()
		rc.send("GET /small HTTP/1.1\r\nHost: h\r\n\r\n")
		_, body := rc.mustResponse("GET")
		eq(t, "follow-up response body", string(body), "hello")
	}
	t.Run("Content-Length set for a small body", func(t *testing.T) {
		rc := dialRaw(t, ts.addr)
		rc.send("GET /small HTTP/1.1\r\nHost: h\r\n\r\n")
		resp, body := rc.mustResponse("GET")
		eq(t, "body", string(body), "hello")
		eq(t, "ContentLength", resp.ContentLength, int64(5))
		eq(t, "Content-Length header", resp.Header.Get("Content-Length"), "5")
		eq(t, "TransferEncoding", resp.TransferEncoding, []string(nil))
		followUp(t, rc)
	})
	t.Run("chunked after Flush", func(t *testing.T) {
		rc := dialRaw(t, ts.addr)
		rc.send("GET /flush HTTP/1.1\r\nHost: h\r\n\r\n")
		resp, body := rc.mustResponse("GET")
		eq(t, "TransferEncoding", resp.TransferEncoding, []string{"chunked"})
		eq(t, "ContentLength", resp.ContentLength, int64(-1))
		eq(t, "body", string(body), "part1part2")
		followUp(t, rc)
	})
	t.Run("handler's Content-Length used", func(t *testing.T) {
		rc := dialRaw(t, ts.addr)
		rc.send("GET /cl HTTP/1.1\r\nHost: h\r\n\r\n")
		resp, body := rc.mustResponse("GET")
		eq(t, "ContentLength", resp.ContentLength, int64(10))
		eq(t, "TransferEncoding", resp.TransferEncoding, []string(nil))
		eq(t, "body", string(body), "0123456789")
		followUp(t, rc)
	})
	t.Run("1 MiB body", func(t *testing.T) {
		rc := dialRaw(t, ts.addr)
		rc.send("GET /big HTTP/1.1\r\nHost: h\r\n\r\n")
		_, body := rc.mustResponse("GET")
		if !bytes.Equal(body, bigBody) {
			t.Errorf("body: %d bytes, want %d, equal=%v", len(body), len(bigBody), false)
		}
		followUp(t, rc)
	})
	t.Run("HEAD has no body", func(t *testing.T) {
		rc := dialRaw(t, ts.addr)
		rc.send("HEAD /head HTTP/1.1\r\nHost: h\r\n\r\nGET /head HTTP/1.1\r\nHost: h\r\n\r\n")
		resp, body := rc.mustResponse("HEAD")
		eq(t, "HEAD status", resp.StatusCode, 200)
		eq(t, "HEAD body", string(body), "")
		if resp.ContentLength != 11 {
			t.Errorf("HEAD Content-Length %d, want 11, the GET's (net/http parity)", resp.ContentLength)
		}
		_, body = rc.mustResponse("GET")
		eq(t, "GET after HEAD: body", string(body), "hello world")
	})
	t.Run("HEAD of a streamed response has no body", func(t *testing.T) {
		rc := dialRaw(t, ts.addr)
		rc.send("HEAD /flush HTTP/1.1\r\nHost: h\r\n\r\nGET /small HTTP/1.1\r\nHost: h\r\n\r\n")
		resp, _ := rc.mustResponse("HEAD")
		eq(t, "HEAD status", resp.StatusCode, 200)
		_, body := rc.mustResponse("GET")
		eq(t, "GET after HEAD: body", string(body), "hello")
	})
	t.Run("204 and 304 have no body", func(t *testing.T) {
		rc := dialRaw(t, ts.addr)
		rc.send("GET /204 HTTP/1.1\r\nHost: h\r\n\r\nGET /304 HTTP/1.1\r\nHost: h\r\n\r\n" +
			"GET /small HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
		data, closed := rc.drain(closeWithin)
		if !closed {
			t.Errorf("connection not closed after Connection: close")
		}
		for _, s := range []string{"nope204", "nope304"} {
			if bytes.Contains(data, []byte(s)) {
				t.Errorf("body written after WriteHeader(%s) is on the wire: %q", s[4:], data)
			}
		}
		if i := bytes.Index(data, []byte("\r\n\r\n")); i > 0 {
			h := strings.ToLower(string(data[:i]))
			if strings.Contains(h, "transfer-encoding") || strings.Contains(h, "content-length") {
				t.Errorf("204 response has framing headers (RFC 9110 8.6): %q", data[:i])
			}
		}
		br := bufio.NewReader(bytes.NewReader(data))
		for _, want := range []struct {
			code int
			body string
		}{{204, ""}, {304, ""}, {200, "hello"}} {
			resp, err := http.ReadResponse(br, &http.Request{Method: "GET"})
			if err != nil {
				t.Fatalf("parsing response %d of %q: %v", want.code, data, err)
			}
			body, err := io.ReadAll(resp.Body)
			if err != nil || resp.StatusCode != want.code || string(body) != want.body {
				t.Errorf("response: %d %q (err %v), want %d %q", resp.StatusCode, body, err, want.code, want.body)
			}
		}
	})
}

func TestResponseStatusAndHeaders(t *testing.T) {
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("Set-Cookie", "a=1")
		w.Header().Add("Set-Cookie", "b=2")
		w.WriteHeader(201)
		w.WriteHeader(500) // ignored, as in net/http
		io.WriteString(w, "created")
	}))
	rc := dialRaw(t, ts.addr)
	rc.send("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n")
	resp, body := rc.mustResponse("POST")
	eq(t, "Status", resp.Status, "201 Created")
	eq(t, "Set-Cookie", resp.Header["Set-Cookie"], []string{"a=1", "b=2"})
	eq(t, "body", string(body), "created")
}

func TestResponseHeaderInjection(t *testing.T) {
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Bad", "a\r\nX-Injected: 1")
		w.Header().Set("X-Bad2", "b\nX-Injected2: 2")
		io.WriteString(w, "ok")
	}))
	rc := dialRaw(t, ts.addr)
	rc.send("GET / HTTP/1.1\r\nHost: h\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n")
	for i := 0; i < 2; i++ {
		resp, body := rc.mustResponse("GET")
		eq(t, "body", string(body), "ok")
		for _, k := range []string{"X-Injected", "X-Injected2"} {
			if v, ok := resp.Header[k]; ok {
				t.Errorf("CR/LF in a handler's header value injected header %s: %q", k, v)
			}
		}
	}
}

func TestHandlerContentLengthMismatch(t *testing.T) {
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/long":
			w.Header().Set("Content-Length", "5")
			io.WriteString(w, "hello world")
		case "/short":
			w.Header().Set("Content-Length", "10")
			io.WriteString(w, "hello")
		default:
			io.WriteString(w, "ok")
		}
	}))
	t.Run("more than declared is cut", func(t *testing.T) {
		rc := dialRaw(t, ts.addr)
		rc.send("GET /long HTTP/1.1\r\nHost: h\r\n\r\nGET /ok HTTP/1.1\r\nHost: h\r\n\r\n")
		resp, body, err := rc.response("GET")
		if err != nil {
			// net/http refuses the whole oversized Write and closes the connection.
			if isTimeout(err) || !errors.Is(err, io.ErrUnexpectedEOF) && !isClosedErr(err) {
				t.Fatalf("first response: %v", err)
			}
			rc.expectClosed()
			return
		}
		eq(t, "body", string(body), "hello")
		// The next response is intact, or the server closed: never the excess bytes.
		resp, body, err = rc.response("GET")
		if err == nil {
			if resp.StatusCode != 200 || string(body) != "ok" {
				t.Errorf("next response %q %q, want 200 ok", resp.Status, body)
			}
		} else if !isClosedErr(err) {
			t.Errorf("next response unreadable (excess body bytes on the wire?): %v", err)
		}
	})
	t.Run("less than declared closes the connection", func(t *testing.T) {
		rc := dialRaw(t, ts.addr)
		rc.send("GET /short HTTP/1.1\r\nHost: h\r\n\r\n")
		rc.c.SetReadDeadline(time.Now().Add(closeWithin))
		resp, err := http.ReadResponse(rc.br, nil)
		if err != nil {
			if isTimeout(err) {
				t.Fatalf("no response: %v", err)
			}
			return // closed before the headers: acceptable
		}
		body, err := io.ReadAll(resp.Body)
		if isTimeout(err) {
			t.Fatalf("server neither completed the declared body nor closed the connection; got %q", body)
		}
		if err == nil {
			t.Errorf("short body %q read as complete", body)
		}
	})
}

// ---------------------------------------------------------------- 7. trailers

func TestTrailers(t *testing.T) {
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-A, X-B")
		w.WriteHeader(200)
		io.WriteString(w, "body")
		w.Header().Set("X-A", "va")
		w.Header().Set("X-B", "vb")
	}))
	resp, err := newClient(t).Get("http://" + ts.addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	for _, k := range []string{"X-A", "X-B"} {
		if _, ok := resp.Trailer[k]; !ok {
			t.Errorf("trailer %s not declared before the body: resp.Trailer = %v", k, resp.Trailer)
		}
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	eq(t, "body", string(body), "body")
	eq(t, "TransferEncoding", resp.TransferEncoding, []string{"chunked"})
	eq(t, "trailer X-A", resp.Trailer.Get("X-A"), "va")
	eq(t, "trailer X-B", resp.Trailer.Get("X-B"), "vb")
	if v := resp.Header.Get("X-A"); v != "" {
		t.Errorf("trailer X-A also sent as a header: %q", v)
	}
}

func TestTrailerPrefixUndeclared(t *testing.T) {
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "body")
		w.(http.Flusher).Flush()
		w.Header().Set(http.TrailerPrefix+"X-Late", "late")
	}))
	resp, err := newClient(t).Get("http://" + ts.addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	eq(t, "body", string(body), "body")
	eq(t, "trailer X-Late set through http.TrailerPrefix (net/http parity)", resp.Trailer.Get("X-Late"), "late")
}

// ---------------------------------------------------------------- 8. Date, Content-Type

func TestDateHeader(t *testing.T) {
	ts := startServer(t, echoPath)
	resp, err := newClient(t).Get("http://" + ts.addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	d, err := http.ParseTime(resp.Header.Get("Date"))
	if err != nil {
		t.Fatalf("Date %q: %v", resp.Header.Get("Date"), err)
	}
	if diff := time.Since(d); diff > time.Minute || diff < -time.Minute {
		t.Errorf("Date %v is %v away from now", d, diff)
	}
}

func TestContentTypeSniffing(t *testing.T) {
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/text":
			io.WriteString(w, "just some plain text")
		case "/html":
			io.WriteString(w, "<!DOCTYPE html><html><body>hi</body></html>")
		case "/set":
			w.Header().Set("Content-Type", "application/x-custom")
			io.WriteString(w, "<html>not sniffed</html>")
		case "/bigtext": // one Write larger than any response buffer
			w.Write(bytes.Repeat([]byte("plain text "), 6000))
		case "/empty":
		}
	}))
	client := newClient(t)
	for _, c := range []struct{ method, path, want string }{
		{"GET", "/text", "text/plain; charset=utf-8"},
		{"GET", "/html", "text/html; charset=utf-8"},
		{"GET", "/set", "application/x-custom"},
		{"GET", "/bigtext", "text/plain; charset=utf-8"},
		{"GET", "/empty", ""},
		{"HEAD", "/text", "text/plain; charset=utf-8"}, // RFC 9110 9.3.2: HEAD gets GET's fields
	} {
		req, _ := http.NewRequest(c.method, "http://"+ts.addr+c.path, nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		eq(t, c.method+" "+c.path+" Content-Type", resp.Header.Get("Content-Type"), c.want)
	}
}

// ---------------------------------------------------------------- 9. Expect: 100-continue

func TestExpectContinue(t *testing.T) {
	ts := startServer(t, echoPath)
	rc := dialRaw(t, ts.addr)
	rc.send("POST /e HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
	resp, _, err := rc.response("POST")
	if err != nil {
		t.Fatalf("no 100 Continue before the body was sent: %v", err)
	}
	if resp.StatusCode != 100 {
		t.Fatalf("first response %q, want 100 Continue", resp.Status)
	}
	rc.send("hello")
	resp, body := rc.mustResponse("POST")
	eq(t, "final status", resp.StatusCode, 200)
	eq(t, "body", string(body), "POST /e:hello")
	rc.send("GET /next HTTP/1.1\r\nHost: h\r\n\r\n")
	_, body = rc.mustResponse("GET")
	eq(t, "next body", string(body), "GET /next:")
}

func TestExpectContinueBodyNeverRead(t *testing.T) {
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Expect") != "" || r.Method == "POST" {
			w.WriteHeader(401)
			return
		}
		io.WriteString(w, "next")
	}))
	rc := dialRaw(t, ts.addr)
	rc.send("POST /e HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
	resp, _ := rc.mustResponse("POST")
	if resp.StatusCode == 100 { // allowed, though the body is then expected
		resp, _ = rc.mustResponse("POST")
	}
	eq(t, "final status", resp.StatusCode, 401)
	if resp.Close {
		// The client may close now. If it sends the body anyway, the server
		// must not hang on the connection (net/http reads it, then closes).
		rc.c.Write([]byte("hello"))
		rc.expectClosed()
		return
	}
	// The server keeps the connection: it must then read and discard the body.
	rc.send("hello")
	rc.send("GET /next HTTP/1.1\r\nHost: h\r\n\r\n")
	resp, body, err := rc.response("GET")
	if err != nil {
		t.Fatalf("connection kept without Connection: close, but the next request got no response: %v", err)
	}
	eq(t, "next response", fmt.Sprint(resp.StatusCode, " ", string(body)), "200 next")
}

// ---------------------------------------------------------------- 10. malformed requests

func TestMalformedRequests(t *testing.T) {
	var calls atomic.Int32
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		io.WriteString(w, "handler called")
	}))
	const post = "POST / HTTP/1.1\r\nHost: h\r\n"
	cases := []struct {
		name  string
		raw   string
		codes []int
		ref   bool // also holds for net/http
	}{
		{"garbage request line", "GARBAGE\r\n\r\n", []int{400}, true},
		{"HTTP/1.1 without Host", "GET / HTTP/1.1\r\n\r\n", []int{400}, true},
		{"two Host fields", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", []int{400}, true},
		{"Content-Length and chunked", post + "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", []int{400}, false},
		{"non-numeric Content-Length", post + "Content-Length: abc\r\n\r\n", []int{400}, true},
		{"negative Content-Length", post + "Content-Length: -1\r\n\r\n", []int{400}, true},
		{"two different Content-Lengths", post + "Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", []int{400}, true},
		{"Transfer-Encoding gzip", post + "Transfer-Encoding: gzip\r\n\r\n", []int{501, 400}, true},
		{"obs-fold", "GET / HTTP/1.1\r\nHost: h\r\nX-A: a\r\n  folded\r\n\r\n", []int{400}, false},
		{"space before colon", "GET / HTTP/1.1\r\nHost: h\r\nX-A : a\r\n\r\n", []int{400}, true},
		{"header line without colon", "GET / HTTP/1.1\r\nHost: h\r\nNoColonHere\r\n\r\n", []int{400}, true},
		{"invalid header name", "GET / HTTP/1.1\r\nHost: h\r\nX(A): a\r\n\r\n", []int{400}, true},
		{"HTTP/2.0", "GET / HTTP/2.0\r\nHost: h\r\n\r\n", []int{505}, true},
		{"HTTP/3.0", "GET / HTTP/3.0\r\nHost: h\r\n\r\n", []int{505}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if !c.ref {
				skipInRef(t, "net/http is lenient here")
			}
			before := calls.Load()
			rc := dialRaw(t, ts.addr)
			rc.send(c.raw)
			resp, body, err := rc.response("GET")
			if err != nil {
				t.Fatalf("no error response to %q: %v", c.raw, err)
			}
			if !slicesContains(c.codes, resp.StatusCode) {
				t.Errorf("status %q (body %q), want one of %v", resp.Status, clip(body), c.codes)
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
				t.Errorf("error response Content-Type %q, want text/plain", ct)
			}
			rc.expectClosed()
			if n := calls.Load() - before; n != 0 {
				t.Errorf("handler called %d times for a malformed request", n)
			}
		})
	}
}

func slicesContains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestHeadersTooLarge(t *testing.T) {
	var calls atomic.Int32
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		io.WriteString(w, "ok")
	}), func(s *httpd.Server) { s.MaxHeaderBytes = 4096 })
	t.Run("under the limit", func(t *testing.T) {
		rc := dialRaw(t, ts.addr)
		rc.send("GET / HTTP/1.1\r\nHost: h\r\nX-Big: " + strings.Repeat("a", 2000) + "\r\n\r\n")
		resp, body := rc.mustResponse("GET")
		eq(t, "response", fmt.Sprint(resp.StatusCode, " ", string(body)), "200 ok")
	})
	for _, c := range []struct {
		name, raw string
		codes     []int
	}{
		{"big header", "GET / HTTP/1.1\r\nHost: h\r\nX-Big: " + strings.Repeat("a", 9000) + "\r\n\r\n", []int{431}},
		{"long request line", "GET /" + strings.Repeat("a", 9000) + " HTTP/1.1\r\nHost: h\r\n\r\n", []int{414, 431}},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := calls.Load()
			rc := dialRaw(t, ts.addr)
			rc.send(c.raw)
			resp, body, err := rc.response("GET")
			if err != nil {
				t.Fatalf("no response (a reset here means the server closed with unread input, without lingering): %v", err)
			}
			if !slicesContains(c.codes, resp.StatusCode) {
				t.Errorf("status %q (body %q), want one of %v", resp.Status, clip(body), c.codes)
			}
			rc.expectClosed()
			if n := calls.Load() - before; n != 0 {
				t.Errorf("handler called %d times", n)
			}
		})
	}
}

func TestErrorBody(t *testing.T) {
	skipInRef(t, "ErrorBody is httpd's")
	var mu sync.Mutex
	var seen []int
	ts := startServer(t, echoPath, func(s *httpd.Server) {
		s.MaxHeaderBytes = 4096
		s.ErrorBody = func(status int, message string) (string, []byte) {
			mu.Lock()
			seen = append(seen, status)
			mu.Unlock()
			return "application/problem+json", []byte(fmt.Sprintf(`{"status":%d}`, status))
		}
	})
	for _, c := range []struct {
		raw  string
		code int
	}{
		{"GARBAGE\r\n\r\n", 400},
		{"GET / HTTP/1.1\r\nHost: h\r\nX-Big: " + strings.Repeat("a", 9000) + "\r\n\r\n", 431},
		{"GET / HTTP/2.0\r\nHost: h\r\n\r\n", 505},
	} {
		rc := dialRaw(t, ts.addr)
		rc.send(c.raw)
		resp, body, err := rc.response("GET")
		if err != nil {
			t.Fatalf("%d case: %v", c.code, err)
		}
		eq(t, "status", resp.StatusCode, c.code)
		eq(t, "Content-Type", resp.Header.Get("Content-Type"), "application/problem+json")
		eq(t, "body", string(body), fmt.Sprintf(`{"status":%d}`, c.code))
		eq(t, "Content-Length", resp.Header.Get("Content-Length"), strconv.Itoa(len(body)))
	}
	mu.Lock()
	eq(t, "statuses passed to ErrorBody", seen, []int{400, 431, 505})
	mu.Unlock()
}

// ---------------------------------------------------------------- 11. client disconnect, context

func TestClientDisconnectCancelsContext(t *testing.T) {
	started := make(chan struct{}, 1)
	released := make(chan bool, 1)
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "POST" {
			if b, err := io.ReadAll(r.Body); err != nil || string(b) != "hello" {
				released <- false
				return
			}
		}
		started <- struct{}{}
		select {
		case <-r.Context().Done():
			released <- true
		case <-time.After(ioTimeout):
			released <- false
		}
	}))
	for _, c := range []struct{ name, raw string }{
		{"GET", "GET / HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"POST with body read", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rc := dialRaw(t, ts.addr)
			rc.send(c.raw)
			recv(t, started, "the handler to start")
			rc.c.Close()
			select {
			case ok := <-released:
				if !ok {
					t.Fatal("handler's context not cancelled (or body wrong)")
				}
			case <-time.After(closeWithin):
				t.Fatalf("handler's context not cancelled within %v of the client closing", closeWithin)
			}
		})
	}
}

func TestContextDoneAfterHandlerReturns(t *testing.T) {
	ctxs := make(chan context.Context, 1)
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctxs <- r.Context()
		io.WriteString(w, "ok")
	}))
	rc := dialRaw(t, ts.addr)
	rc.send("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	rc.mustResponse("GET")
	ctx := recv(t, ctxs, "the handler")
	select {
	case <-ctx.Done():
	case <-time.After(closeWithin):
		t.Fatal("r.Context() not done after the handler returned")
	}
	// The connection is still open: the cancellation is not the client leaving.
	rc.send("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	rc.mustResponse("GET")
	recv(t, ctxs, "the second request")
}

func TestPipelinedRequestDoesNotCancelContext(t *testing.T) {
	started := make(chan struct{}, 1)
	outcome := make(chan string, 1)
	release := make(chan struct{})
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			started <- struct{}{}
			select {
			case <-r.Context().Done():
				outcome <- "cancelled"
			case <-release:
				outcome <- "released"
			}
		}
		io.WriteString(w, r.URL.Path)
	}))
	rc := dialRaw(t, ts.addr)
	rc.send("GET /slow HTTP/1.1\r\nHost: h\r\n\r\n")
	recv(t, started, "the handler to start")
	rc.send("GET /next HTTP/1.1\r\nHost: h\r\n\r\n")
	select { // no false failures: a correct server never cancels here
	case o := <-outcome:
		t.Fatalf("handler %s when the client pipelined another request", o)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	eq(t, "outcome", recv(t, outcome, "the handler"), "released")
	for _, want := range []string{"/slow", "/next"} {
		_, body := rc.mustResponse("GET")
		eq(t, "body", string(body), want)
	}
}

// ---------------------------------------------------------------- 12. unread request body

func TestUnreadSmallBody(t *testing.T) {
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok "+r.URL.Path)
	}))
	rc := dialRaw(t, ts.addr)
	body100 := strings.Repeat("x", 100)
	rc.send("POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\n" + body100)
	_, body := rc.mustResponse("POST")
	eq(t, "body", string(body), "ok /a")
	rc.send("GET /b HTTP/1.1\r\nHost: h\r\n\r\n")
	_, body = rc.mustResponse("GET")
	eq(t, "body", string(body), "ok /b")
	// Pipelined: the unread body must be skipped exactly.
	rc.send("POST /c HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\n" + body100 + "GET /d HTTP/1.1\r\nHost: h\r\n\r\n")
	for _, want := range []string{"ok /c", "ok /d"} {
		_, body = rc.mustResponse("GET")
		eq(t, "body", string(body), want)
	}
}

func TestUnreadLargeBody(t *testing.T) {
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok "+r.URL.Path)
	}))
	rc := dialRaw(t, ts.addr)
	const size = 2 << 20
	rc.send("POST /big HTTP/1.1\r\nHost: h\r\nContent-Length: " + strconv.Itoa(size) + "\r\n\r\n")
	wrote := make(chan error, 1)
	go func() {
		_, err := rc.c.Write(bytes.Repeat([]byte("z"), size))
		wrote <- err
	}()
	resp, body, err := rc.response("POST")
	if err != nil {
		t.Fatalf("no response while the body was unread (a reset means the server closed without lingering): %v", err)
	}
	eq(t, "body", string(body), "ok /big")
	if resp.Close {
		rc.expectClosed()
		return
	}
	// Kept alive: the server must have discarded the whole body.
	if err := recv(t, wrote, "the 2 MiB body to be written"); err != nil {
		t.Fatalf("response kept the connection alive, but writing the body failed: %v", err)
	}
	rc.send("GET /next HTTP/1.1\r\nHost: h\r\n\r\n")
	resp, body, err = rc.response("GET")
	if err != nil {
		if isClosedErr(err) {
			t.Fatalf("server closed the connection without saying Connection: close: %v", err)
		}
		t.Fatalf("next request: %v", err)
	}
	eq(t, "next body", string(body), "ok /next")
}

// ---------------------------------------------------------------- 13. panics

func TestPanicBeforeWrite(t *testing.T) {
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/panic" {
			panic("boom")
		}
		io.WriteString(w, "ok")
	}), quietLog)
	rc := dialRaw(t, ts.addr)
	rc.send("GET /panic HTTP/1.1\r\nHost: h\r\n\r\n")
	resp, _, err := rc.response("GET")
	switch {
	case err != nil && isTimeout(err):
		t.Fatalf("no response and no close after a panic: %v", err)
	case err == nil && resp.StatusCode != 500:
		t.Errorf("status after a panic %q, want 500 (or a closed connection)", resp.Status)
	}
	rc2 := dialRaw(t, ts.addr)
	rc2.send("GET /ok HTTP/1.1\r\nHost: h\r\n\r\n")
	_, body := rc2.mustResponse("GET")
	eq(t, "body from a new connection after the panic", string(body), "ok")
}

func TestPanicAbortsResponse(t *testing.T) {
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/abort":
			panic(http.ErrAbortHandler)
		case "/abort-cl":
			w.Header().Set("Content-Length", "100")
			io.WriteString(w, "0123456789")
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		case "/abort-chunked":
			io.WriteString(w, "partial")
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		case "/panic-chunked":
			io.WriteString(w, "partial")
			w.(http.Flusher).Flush()
			panic("boom")
		}
	}), quietLog)
	t.Run("ErrAbortHandler before writing", func(t *testing.T) {
		rc := dialRaw(t, ts.addr)
		rc.send("GET /abort HTTP/1.1\r\nHost: h\r\n\r\n")
		resp, _, err := rc.response("GET")
		if err == nil {
			t.Errorf("ErrAbortHandler: got a response %q, want the connection closed", resp.Status)
			rc.expectClosed()
		} else if isTimeout(err) {
			t.Errorf("ErrAbortHandler: connection neither closed nor answered: %v", err)
		}
	})
	for _, path := range []string{"/abort-cl", "/abort-chunked", "/panic-chunked"} {
		t.Run(path+" is truncated, not completed", func(t *testing.T) {
			rc := dialRaw(t, ts.addr)
			rc.send("GET " + path + " HTTP/1.1\r\nHost: h\r\n\r\n")
			rc.c.SetReadDeadline(time.Now().Add(closeWithin))
			resp, err := http.ReadResponse(rc.br, nil)
			if err != nil {
				t.Fatalf("headers were flushed, yet no response: %v", err)
			}
			body, err := io.ReadAll(resp.Body)
			if err == nil {
				t.Errorf("aborted response body %q ends cleanly: the client cannot tell it was cut", body)
			} else if isTimeout(err) {
				t.Errorf("connection left open after the handler panicked: %v", err)
			}
		})
	}
	rc := dialRaw(t, ts.addr)
	rc.send("GET /fine HTTP/1.1\r\nHost: h\r\n\r\n")
	resp, _ := rc.mustResponse("GET")
	eq(t, "status on a new connection", resp.StatusCode, 200)
}

// ---------------------------------------------------------------- 14. Shutdown, Close

func TestShutdownGraceful(t *testing.T) {
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			started <- struct{}{}
			select {
			case <-release:
			case <-time.After(ioTimeout):
			}
			io.WriteString(w, "slow done")
			return
		}
		io.WriteString(w, "fast")
	}))
	busy := dialRaw(t, ts.addr)
	busy.send("GET /slow HTTP/1.1\r\nHost: h\r\n\r\n")
	recv(t, started, "the slow handler")
	idle := dialRaw(t, ts.addr)
	idle.send("GET /fast HTTP/1.1\r\nHost: h\r\n\r\n")
	idle.mustResponse("GET")

	shutdownDone := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
		defer cancel()
		shutdownDone <- ts.srv.Shutdown(ctx)
	}()
	idle.expectClosed()
	if err := ts.wait(closeWithin); !errors.Is(err, httpd.ErrServerClosed) {
		t.Errorf("during Shutdown, Serve: %v, want ErrServerClosed (net/http returns at once)", err)
	}
	select {
	case err := <-shutdownDone:
		t.Fatalf("Shutdown returned (%v) while a handler was running", err)
	case <-time.After(100 * time.Millisecond):
	}
	if c, err := net.DialTimeout("tcp", ts.addr, time.Second); err == nil {
		c.SetDeadline(time.Now().Add(closeWithin))
		io.WriteString(c, "GET /fast HTTP/1.1\r\nHost: h\r\n\r\n")
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
			t.Errorf("a connection dialled after Shutdown was served: %q", resp.Status)
		} else if isTimeout(err) {
			t.Errorf("a connection dialled after Shutdown hangs open")
		}
		c.Close()
	}
	close(release)
	resp, body := busy.mustResponse("GET")
	eq(t, "in-flight response", fmt.Sprint(resp.StatusCode, " ", string(body)), "200 slow done")
	select {
	case err := <-shutdownDone:
		if err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	case <-time.After(closeWithin):
		t.Errorf("Shutdown did not return within %v of the last handler finishing", closeWithin)
	}
	busy.expectClosed()
}

func TestShutdownContextExpires(t *testing.T) {
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		select {
		case <-release:
		case <-time.After(ioTimeout):
		}
	}))
	t.Cleanup(func() { close(release) }) // runs before the server's Close
	rc := dialRaw(t, ts.addr)
	rc.send("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	recv(t, started, "the handler")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	err := ts.srv.Shutdown(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown with a running handler and an expiring context: %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(t0); d > closeWithin {
		t.Errorf("Shutdown took %v after its context ended", d)
	}
}

func TestCloseClosesConnections(t *testing.T) {
	started := make(chan struct{}, 1)
	cancelled := make(chan bool, 1)
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/block" {
			io.WriteString(w, "ok")
			return
		}
		started <- struct{}{}
		select {
		case <-r.Context().Done():
			cancelled <- true
		case <-time.After(ioTimeout):
			cancelled <- false
		}
	}))
	idle := dialRaw(t, ts.addr)
	idle.send("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	idle.mustResponse("GET")
	busy := dialRaw(t, ts.addr)
	busy.send("GET /block HTTP/1.1\r\nHost: h\r\n\r\n")
	recv(t, started, "the handler")
	if err := ts.srv.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if _, closed := busy.drain(closeWithin); !closed {
		t.Error("Close left the active connection open")
	}
	if _, closed := idle.drain(closeWithin); !closed {
		t.Error("Close left the idle connection open")
	}
	select {
	case ok := <-cancelled:
		if !ok {
			t.Error("handler's context not cancelled by Close")
		}
	case <-time.After(closeWithin):
		t.Error("handler's context not cancelled within 2s of Close")
	}
	if err := ts.wait(closeWithin); !errors.Is(err, httpd.ErrServerClosed) {
		t.Errorf("Serve after Close: %v", err)
	}
}

// ---------------------------------------------------------------- 15. Flush, ResponseController

func TestFlushStreamsBeforeHandlerReturns(t *testing.T) {
	type report struct {
		isFlusher             bool
		wdErr, rdErr, flushEr error
	}
	reports := make(chan report, 1)
	release := make(chan struct{})
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var rep report
		_, rep.isFlusher = w.(http.Flusher)
		rc := http.NewResponseController(w)
		rep.wdErr = rc.SetWriteDeadline(time.Now().Add(ioTimeout))
		rep.rdErr = rc.SetReadDeadline(time.Now().Add(ioTimeout))
		io.WriteString(w, "first")
		rep.flushEr = rc.Flush()
		reports <- rep
		select {
		case <-release:
		case <-time.After(ioTimeout):
		}
		io.WriteString(w, "second")
	}))
	rc := dialRaw(t, ts.addr)
	rc.send("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	rep := recv(t, reports, "the handler")
	eq(t, "ResponseWriter is an http.Flusher", rep.isFlusher, true)
	eq(t, "SetWriteDeadline error", rep.wdErr, error(nil))
	eq(t, "SetReadDeadline error", rep.rdErr, error(nil))
	eq(t, "Flush error", rep.flushEr, error(nil))
	rc.c.SetReadDeadline(time.Now().Add(closeWithin))
	resp, err := http.ReadResponse(rc.br, nil)
	if err != nil {
		close(release)
		t.Fatalf("flushed headers not received while the handler runs: %v", err)
	}
	first := make([]byte, 5)
	_, err = io.ReadFull(resp.Body, first)
	close(release)
	if err != nil || string(first) != "first" {
		t.Fatalf("flushed bytes not received while the handler runs: %q, %v", first, err)
	}
	rc.c.SetReadDeadline(time.Now().Add(ioTimeout))
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(rest) != "second" {
		t.Errorf("rest of the body %q, %v; want \"second\"", rest, err)
	}
}

// ---------------------------------------------------------------- 16. timeouts

func TestIdleTimeout(t *testing.T) {
	ts := startServer(t, echoPath, func(s *httpd.Server) { s.IdleTimeout = 200 * time.Millisecond })
	rc := dialRaw(t, ts.addr)
	for i := 0; i < 2; i++ {
		rc.send("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
		rc.mustResponse("GET")
	}
	t0 := time.Now()
	rc.expectClosed()
	if d := time.Since(t0); d < 100*time.Millisecond {
		t.Errorf("idle connection closed after %v, before IdleTimeout (200ms)", d)
	}
}

func TestReadHeaderTimeout(t *testing.T) {
	var calls atomic.Int32
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }),
		func(s *httpd.Server) { s.ReadHeaderTimeout = 200 * time.Millisecond })
	t.Run("partial headers", func(t *testing.T) {
		rc := dialRaw(t, ts.addr)
		rc.send("GET / HTTP/1.1\r\nHost: h\r\n")
		data, closed := rc.drain(closeWithin)
		if !closed {
			t.Fatalf("connection with partial headers not closed within %v", closeWithin)
		}
		if len(data) > 0 && !bytes.HasPrefix(data, []byte("HTTP/1.1 4")) {
			t.Errorf("unexpected bytes before close: %q", clip(data))
		}
	})
	t.Run("slowloris: bytes keep coming", func(t *testing.T) {
		rc := dialRaw(t, ts.addr)
		rc.send("GET / HTTP/1.1\r\nHost: h\r\nX-Slow: ")
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				if _, err := rc.c.Write([]byte("a")); err != nil {
					return
				}
			}
		}()
		if _, closed := rc.drain(closeWithin); !closed {
			t.Fatalf("ReadHeaderTimeout 200ms did not bound a request whose headers trickle in (%v)", closeWithin)
		}
	})
	t.Run("silent connection", func(t *testing.T) {
		rc := dialRaw(t, ts.addr)
		if _, closed := rc.drain(closeWithin); !closed {
			t.Fatalf("connection that sends nothing still open after %v (IdleTimeout default, ReadHeaderTimeout 200ms)", closeWithin)
		}
	})
	eq(t, "handler calls", calls.Load(), int32(0))
}

// ---------------------------------------------------------------- 17, 18. real clients

func TestClientReusesConnection(t *testing.T) {
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, r.Method+":")
		if r.URL.Query().Get("flush") != "" {
			w.(http.Flusher).Flush()
		}
		w.Write(b)
	}))
	client := newClient(t)
	for i := 0; i < 50; i++ {
		var reused, gotConn bool
		trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) { reused, gotConn = info.Reused, true }}
		url := "http://" + ts.addr + "/"
		if i%2 == 1 {
			url += "?flush=1"
		}
		method, payload := "GET", ""
		var body io.Reader
		if i%3 == 1 {
			method, payload = "POST", strings.Repeat("p", i*97)
			body = strings.NewReader(payload)
		}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), method, url, body)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(got) != method+":"+payload {
			t.Fatalf("request %d: body %q (%v)", i, clip(got), err)
		}
		if !gotConn {
			t.Fatalf("request %d: no GotConn", i)
		}
		if i > 0 && !reused {
			t.Errorf("request %d: new connection, want the first one reused", i)
		}
	}
}

func TestConcurrentEcho(t *testing.T) {
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		w.Write(b)
	}))
	client := newClient(t)
	var wg sync.WaitGroup
	errs := make(chan error, 400)
	for g := 0; g < 20; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 42))
			for i := 0; i < 20; i++ {
				payload := make([]byte, rng.IntN(64<<10+1))
				for j := range payload {
					payload[j] = byte(rng.Uint32())
				}
				var body io.Reader = bytes.NewReader(payload)
				if i%2 == 1 {
					body = io.MultiReader(body) // unknown length: sent chunked
				}
				resp, err := client.Post("http://"+ts.addr+"/echo", "application/octet-stream", body)
				if err != nil {
					errs <- fmt.Errorf("client %d request %d: %v", g, i, err)
					return
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 || !bytes.Equal(got, payload) {
					errs <- fmt.Errorf("client %d request %d: status %d, %d bytes back for %d sent, err %v",
						g, i, resp.StatusCode, len(got), len(payload), err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	n := 0
	for err := range errs {
		if n++; n <= 5 {
			t.Error(err)
		}
	}
}

// ---------------------------------------------------------------- more framing safety

func TestInvalidChunkedBodyClosesConnection(t *testing.T) {
	paths := make(chan string, 4)
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths <- r.URL.Path
		if r.URL.Path == "/read" {
			if _, err := io.ReadAll(r.Body); err != nil {
				http.Error(w, "bad body", 400)
				return
			}
		}
		io.WriteString(w, "ok")
	}))
	for _, path := range []string{"/read", "/ignore"} {
		t.Run(path, func(t *testing.T) {
			rc := dialRaw(t, ts.addr)
			rc.send("POST " + path + " HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n" +
				"zz\r\nhello\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: h\r\n\r\n")
			if _, _, err := rc.response("POST"); isTimeout(err) {
				t.Fatalf("no response: %v", err)
			}
			data, closed := rc.drain(closeWithin)
			if !closed {
				t.Errorf("connection kept open after an invalid chunked body")
			}
			if len(data) > 0 {
				t.Errorf("more responses after an invalid chunked body: %q", clip(data))
			}
			if p := recv(t, paths, "the handler"); p != path {
				t.Errorf("handler saw %q first", p)
			}
			select {
			case p := <-paths:
				t.Errorf("handler called again, for %q, after an invalid chunked body", p)
			default:
			}
		})
	}
}

func TestInformationalResponse(t *testing.T) {
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</a.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		io.WriteString(w, "final")
	}))
	rc := dialRaw(t, ts.addr)
	rc.send("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	resp, _ := rc.mustResponse("GET")
	eq(t, "first status (WriteHeader(103), net/http parity)", resp.StatusCode, 103)
	eq(t, "103 Link", resp.Header.Get("Link"), "</a.css>; rel=preload")
	if resp.StatusCode == 103 {
		resp, body := rc.mustResponse("GET")
		eq(t, "final", fmt.Sprint(resp.StatusCode, " ", string(body)), "200 final")
	}
}

// ---------------------------------------------------------------- smaller net/http parity points

func TestOptionsAsterisk(t *testing.T) {
	var calls atomic.Int32
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		io.WriteString(w, "handler")
	}))
	rc := dialRaw(t, ts.addr)
	rc.send("OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n")
	resp, body := rc.mustResponse("OPTIONS")
	// net/http answers "OPTIONS *" itself: 200, empty body, handler not called.
	eq(t, "OPTIONS * response", fmt.Sprint(resp.StatusCode, " ", string(body)), "200 ")
	eq(t, "handler calls for OPTIONS *", calls.Load(), int32(0))
}

func TestLocalAddrInContext(t *testing.T) {
	addrs := make(chan any, 1)
	ts := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		addrs <- r.Context().Value(http.LocalAddrContextKey)
	}))
	rc := dialRaw(t, ts.addr)
	rc.send("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	rc.mustResponse("GET")
	a, _ := recv(t, addrs, "the handler").(net.Addr)
	if a == nil || a.String() != ts.addr {
		t.Errorf("r.Context().Value(http.LocalAddrContextKey) = %v, want the listener's %s (net/http parity)", a, ts.addr)
	}
}
