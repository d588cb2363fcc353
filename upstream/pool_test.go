package upstream

import (
	"bufio"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// A tiny HTTP/1.1 server that counts connections and can close a
// connection right after answering, as a server whose keep-alive ran out.
// It echoes the body and the request id, and checks the fixed head every
// request carries.
func testServer(t *testing.T, closeAfterAnswer bool) (addr string, conns *atomic.Int64) {
	return rawServer(t, func(r rawRequest, c io.Writer) bool {
		req := r.req
		answer := `{"echo":` + string(r.body) + `,"id":"` + req.Header.Get("X-Request-Id") + `"}`
		if req.Method != "POST" || req.URL.Path != "/v1/chat/completions" || req.Header.Get("Authorization") != "Bearer k" ||
			req.Header.Get("Content-Type") != "application/json" || req.Header.Get("Accept") != "application/json, text/event-stream" ||
			req.ContentLength != int64(len(r.body)) || req.Host != r.addr {
			answer = `{"bad head":` + strconv.Quote(fmt.Sprint(req.Method, req.URL, req.Header, req.ContentLength, req.Host)) + `}`
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(answer))+"\r\n\r\n"+answer)
		return !closeAfterAnswer // closed: the client's pooled connection is now dead
	})
}

func post(t *testing.T, p *Pool, id string) string {
	t.Helper()
	resp, err := p.Post(context.Background(), Head{RequestID: id, Authorization: "Bearer k"}, []byte(`{"n":1}`))
	if err != nil {
		t.Fatalf("post %s: %v", id, err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("post %s: %d %v", id, resp.StatusCode, err)
	}
	return string(b)
}

func TestH1PoolReusesConnections(t *testing.T) {
	addr, conns := testServer(t, false)
	p, err := NewPool("http://"+addr+"/v1/chat/completions", &net.Dialer{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if got := post(t, p, "r"+strconv.Itoa(i)); got != `{"echo":{"n":1},"id":"r`+strconv.Itoa(i)+`"}` {
			t.Fatalf("answer %q", got)
		}
	}
	if conns.Load() != 1 {
		t.Fatalf("%d connections for 5 sequential requests, want 1", conns.Load())
	}
}

// A pooled connection the server closed is retried once on a new one.
func TestH1PoolRetriesAConnectionTheServerClosed(t *testing.T) {
	addr, conns := testServer(t, true)
	p, err := NewPool("http://"+addr+"/v1/chat/completions", &net.Dialer{})
	if err != nil {
		t.Fatal(err)
	}
	post(t, p, "a")
	time.Sleep(20 * time.Millisecond) // let the server's close arrive
	post(t, p, "b")
	if conns.Load() != 2 {
		t.Fatalf("%d connections, want 2 (the dead one replaced)", conns.Load())
	}
}

// A server that read a request on a pooled connection and closed it without
// an answer (it crashed while generating: a vLLM answers a non-streamed
// request only when it is done) may have run it: the request fails and is
// not sent again, on a new connection or anywhere else.
func TestH1PoolDoesNotResendARequestTheServerRead(t *testing.T) {
	var got atomic.Int64
	addr, _ := rawServer(t, func(r rawRequest, c io.Writer) bool {
		got.Add(1)
		if r.i == 1 {
			return false // the second request: read whole, then the connection closes
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	})
	p, _ := NewPool("http://"+addr+"/x", &net.Dialer{})
	resp, err := p.Post(context.Background(), Head{}, []byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if _, err := p.Post(context.Background(), Head{}, []byte("{}")); !errors.Is(err, io.EOF) {
		t.Errorf("a request the server read and never answered: %v, want an end of input", err)
	}
	time.Sleep(20 * time.Millisecond) // a resend would have arrived by now
	if got.Load() != 2 {
		t.Errorf("the server got %d requests, want 2 (the second one sent once)", got.Load())
	}
}

// Cancelling the context unblocks a request whose server never answers, and
// the connection is not reused.
func TestH1PoolCancel(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			io.Copy(io.Discard, c) // read forever, never answer
		}
	}()
	p, _ := NewPool("http://"+ln.Addr().String()+"/x", &net.Dialer{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := p.Post(ctx, Head{}, []byte("{}")); err == nil {
		t.Fatal("no error from a cancelled request")
	}
	if len(p.idle) != 0 {
		t.Fatal("a cancelled connection went back to the pool")
	}
}

// A server that sends the chunked terminator a moment after [DONE] (as
// uvicorn does, in a write of its own): Drain finishes the body and the
// connection is reused.
func TestH1DrainReusesAfterLateTerminator(t *testing.T) {
	addr, conns := rawServer(t, func(_ rawRequest, c io.Writer) bool {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		io.WriteString(c, "e\r\ndata: [DONE]\n\n\r\n")
		time.Sleep(5 * time.Millisecond)
		io.WriteString(c, "0\r\n\r\n")
		return true
	})
	p, _ := NewPool("http://"+addr+"/x", &net.Dialer{})
	for i := 0; i < 3; i++ {
		resp, err := p.Post(context.Background(), Head{}, []byte("{}"))
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 14)
		if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "data: [DONE]\n\n" {
			t.Fatalf("read %q: %v", buf, err)
		}
		resp.Body.(*h1Body).Drain(time.Second)
	}
	if conns.Load() != 1 {
		t.Fatalf("%d connections for 3 streams, want 1", conns.Load())
	}
}

// A server that closed every pooled connection (a restart, or keep-alive
// timeouts after a burst): each dead one is found before anything is written
// to it and dropped, and the request goes out on a new connection.
func TestH1PoolRetryDialsWhenSeveralPooledAreDead(t *testing.T) {
	addr, conns := testServer(t, true)
	p, err := NewPool("http://"+addr+"/v1/chat/completions", &net.Dialer{})
	if err != nil {
		t.Fatal(err)
	}
	// Two requests at once leave two connections in the pool.
	var bodies []io.ReadCloser
	for i := 0; i < 2; i++ {
		resp, err := p.Post(context.Background(), Head{}, []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		bodies = append(bodies, resp.Body)
	}
	for _, b := range bodies {
		io.Copy(io.Discard, b)
		b.Close()
	}
	if len(p.idle) != 2 {
		t.Fatalf("%d pooled connections, want 2", len(p.idle))
	}
	time.Sleep(20 * time.Millisecond) // let the server's closes arrive
	for _, c := range p.idle {
		if alive(c) {
			t.Fatal("alive: a connection the server closed")
		}
	}
	post(t, p, "c")
	if conns.Load() != 3 || p.dials.Load() != 3 {
		t.Errorf("%d connections, %d dials; want 3: two dead ones dropped unwritten, one new", conns.Load(), p.dials.Load())
	}
}

// rawRequest is one request a rawServer got: the i-th over all
// connections, with its body read, and the server's own address.
type rawRequest struct {
	i    int64
	req  *http.Request
	body []byte
	addr string
}

// rawServer answers each request with answer, which writes the raw answer
// and reports whether to keep the connection open. It counts connections.
func rawServer(t *testing.T, answer func(r rawRequest, c io.Writer) (keep bool)) (addr string, conns *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	addr = ln.Addr().String()
	conns = new(atomic.Int64)
	var next atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func(c net.Conn) {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					body, _ := io.ReadAll(req.Body)
					if !answer(rawRequest{i: next.Add(1) - 1, req: req, body: body, addr: addr}, c) {
						return
					}
				}
			}(c)
		}
	}()
	return addr, conns
}

// scriptedServer answers the i-th request with answers[i] (raw bytes) and
// closes the connection after the last.
func scriptedServer(t *testing.T, answers ...string) (addr string, conns *atomic.Int64) {
	return rawServer(t, func(r rawRequest, c io.Writer) bool {
		if r.i >= int64(len(answers)) {
			return false
		}
		io.WriteString(c, answers[r.i])
		return r.i < int64(len(answers))-1
	})
}

// Bytes a server sends past an answer's end (here: an answer after a 204)
// must not be read by the next request: the connection is not pooled.
func TestH1PoolDropsAConnectionWithBytesPastTheAnswer(t *testing.T) {
	ok := "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nfine"
	addr, conns := scriptedServer(t, "HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale", ok)
	p, _ := NewPool("http://"+addr+"/x", &net.Dialer{})
	for i, want := range []string{"", "fine"} {
		resp, err := p.Post(context.Background(), Head{}, []byte("{}"))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != want {
			t.Fatalf("request %d: body %q (%v), want %q", i, b, err, want)
		}
	}
	if conns.Load() != 2 {
		t.Errorf("%d connections, want 2 (the first one had bytes past its answer)", conns.Load())
	}
}

// A pooled connection that dies after part of an answer is not retried: the
// POST may have reached a model. (One that dies before any byte is: see
// TestH1PoolRetriesAConnectionTheServerClosed.)
func TestH1PoolDoesNotRetryAfterPartOfAnAnswer(t *testing.T) {
	addr, conns := scriptedServer(t, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", "HTTP/1.1 200 O")
	p, _ := NewPool("http://"+addr+"/x", &net.Dialer{})
	resp, err := p.Post(context.Background(), Head{}, []byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	if _, err := p.Post(context.Background(), Head{}, []byte("{}")); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("half an answer: %v, want io.ErrUnexpectedEOF", err)
	}
	if conns.Load() != 1 {
		t.Errorf("%d connections: the request was sent again after part of an answer", conns.Load())
	}
}

// An https node is served by the same client over TLS: answers arrive, the
// connection is reused, and one the server closed while pooled is replaced
// before anything is written to it.
func TestH1PoolTLS(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"echo":%s,"id":%q,"proto":%q}`, b, r.Header.Get("X-Request-Id"), r.Proto)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.EnableHTTP2 = true // offered; the client asks for http/1.1
	srv.StartTLS()
	defer srv.Close()
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	rootCAs = pool
	defer func() { rootCAs = nil }()

	p, err := NewPool(srv.URL+"/v1/chat/completions", &net.Dialer{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		id := "r" + strconv.Itoa(i)
		if got := post(t, p, id); got != `{"echo":{"n":1},"id":"`+id+`","proto":"HTTP/1.1"}` {
			t.Fatalf("answer %q", got)
		}
	}
	if conns.Load() != 1 {
		t.Fatalf("%d TLS connections for 3 sequential requests, want 1", conns.Load())
	}
	srv.CloseClientConnections()
	time.Sleep(20 * time.Millisecond) // let the close arrive
	post(t, p, "after-close")
	if conns.Load() != 2 || p.dials.Load() != 2 {
		t.Fatalf("%d connections, %d dials after the server closed the pooled one, want 2", conns.Load(), p.dials.Load())
	}

	// A certificate that does not chain to the roots is refused.
	rootCAs = x509.NewCertPool()
	p2, _ := NewPool(srv.URL+"/v1/chat/completions", &net.Dialer{Timeout: 5 * time.Second})
	if _, err := p2.Post(context.Background(), Head{}, []byte("{}")); err == nil {
		t.Fatal("an untrusted certificate was accepted")
	}
}
