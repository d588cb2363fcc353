package httpd_test

// FuzzServerRequestBytes feeds arbitrary client bytes to a real httpd.Server
// over loopback TCP and checks what must hold for any input:
//
//  1. The server neither panics (a panic on a connection's goroutine kills
//     the process) nor hangs: the client writes the input, half-closes, and
//     must see the end of the stream within fzDeadline.
//  2. What comes back is a sequence of complete HTTP/1.x responses (bodies
//     included) and then the end of the stream: no garbage, nothing after a
//     response that announced Connection: close.
//  3. Every handler call produces exactly one response, on the connection
//     it came from; a 200 from the handler echoes a body whose length is the
//     request's Content-Length (when it had one).
//  4. When net/http's own parser (http.ReadRequest, body read to the end)
//     accepts the first request of the input and httpd's handler answered it
//     with 200, both saw the same request: method, target, path, X-Echo and
//     body (length and SHA-256). A disagreement means the two parsers frame
//     the bytes differently (request smuggling). httpd may reject what
//     net/http accepts (it is stricter on purpose); that is not checked.
//
// One server per process, started on first use and reused by every input.

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/httpd"
)

const (
	fzDeadline = 3 * time.Second // for the whole exchange of one input
	fzMaxInput = 64 << 10        // larger inputs are skipped (nothing new, just slower)
)

// HTTPD_FUZZ_VERBOSE=1 logs what each input got back; HTTPD_FUZZ_WATCH_DELAY
// sets the server's WatchDelay.
var fzVerbose = os.Getenv("HTTPD_FUZZ_VERBOSE") != ""

var (
	fzOnce  sync.Once
	fzAddr  string
	fzErr   error
	fzCalls sync.Map // client address (r.RemoteAddr) -> *atomic.Int32: handler calls
)

// fzServer starts the process's server on first use.
func fzServer() (string, error) {
	fzOnce.Do(func() {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fzErr = err
			return
		}
		s := &httpd.Server{
			Handler:           http.HandlerFunc(fzEcho),
			MaxHeaderBytes:    8192,
			ReadHeaderTimeout: 500 * time.Millisecond,
			IdleTimeout:       500 * time.Millisecond,
			Log:               slog.New(slog.DiscardHandler),
		}
		if d, err := time.ParseDuration(os.Getenv("HTTPD_FUZZ_WATCH_DELAY")); err == nil {
			s.WatchDelay = d // e.g. 1ns: watch every request (default: 1ms, rarely reached)
		}
		go s.Serve(ln) // never stopped: it lives as long as the process
		fzAddr = ln.Addr().String()
	})
	return fzAddr, fzErr
}

// fzEcho reads the whole body and describes the request, in the body (text)
// and, for HEAD's sake, quoted in the X-Fz-Echo header. A body that could
// not be read is answered 400.
func fzEcho(w http.ResponseWriter, r *http.Request) {
	if n, ok := fzCalls.Load(r.RemoteAddr); ok {
		n.(*atomic.Int32).Add(1)
	}
	h := sha256.New()
	n, err := io.Copy(h, r.Body)
	status, errText := http.StatusOK, ""
	if err != nil {
		status, errText = http.StatusBadRequest, err.Error()
	}
	text := fmt.Sprintf("method=%q\nuri=%q\npath=%q\nx-echo=%q\ncl=%d\nte=%q\nlen=%d\nsha256=%x\nerr=%q\n",
		r.Method, r.RequestURI, r.URL.Path, r.Header.Get("X-Echo"), r.ContentLength,
		strings.Join(r.TransferEncoding, ","), n, h.Sum(nil), errText)
	wh := w.Header()
	wh.Set("Content-Type", "text/plain; charset=utf-8")
	wh.Set("X-Fz-Conn", r.RemoteAddr)
	wh.Set("X-Fz-Method", r.Method)
	wh.Set("X-Fz-Echo", strconv.Quote(text))
	w.WriteHeader(status)
	io.WriteString(w, text)
}

// fzEchoed is the handler's description of a request.
type fzEchoed struct {
	method, uri, path, xecho, te, sha, err string
	cl, n                                  int64
}

func fzParseEcho(text string) (e fzEchoed, err error) {
	seen := 0
	for _, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return e, fmt.Errorf("line %q", line)
		}
		seen++
		var s *string
		switch k {
		case "method":
			s = &e.method
		case "uri":
			s = &e.uri
		case "path":
			s = &e.path
		case "x-echo":
			s = &e.xecho
		case "te":
			s = &e.te
		case "err":
			s = &e.err
		case "sha256":
			e.sha = v
		case "cl":
			e.cl, err = strconv.ParseInt(v, 10, 64)
		case "len":
			e.n, err = strconv.ParseInt(v, 10, 64)
		default:
			return e, fmt.Errorf("key %q", k)
		}
		if s != nil {
			*s, err = strconv.Unquote(v)
		}
		if err != nil {
			return e, fmt.Errorf("line %q: %v", line, err)
		}
	}
	if seen != 9 {
		return e, fmt.Errorf("%d lines, want 9", seen)
	}
	return e, nil
}

// fzRef is net/http's reading of one request of the input.
type fzRef struct {
	err                      error // ReadRequest's or the body's
	method, uri, path, xecho string
	cl                       int64
	te                       []string
	n                        int
	sha                      string
}

func (r fzRef) String() string {
	if r.err != nil && r.method == "" {
		return fmt.Sprintf("rejected: %v", r.err)
	}
	return fmt.Sprintf("method=%q uri=%q path=%q x-echo=%q cl=%d te=%q len=%d sha256=%s err=%v",
		r.method, r.uri, r.path, r.xecho, r.cl, r.te, r.n, r.sha, r.err)
}

// fzReference parses input as a sequence of requests with net/http, up to
// the first failure.
func fzReference(input []byte) []fzRef {
	br := bufio.NewReader(bytes.NewReader(input))
	var refs []fzRef
	for len(refs) < 16 {
		req, err := http.ReadRequest(br)
		if err != nil {
			return append(refs, fzRef{err: err})
		}
		body, err := io.ReadAll(req.Body)
		sum := sha256.Sum256(body)
		refs = append(refs, fzRef{err: err, method: req.Method, uri: req.RequestURI, path: req.URL.Path,
			xecho: req.Header.Get("X-Echo"), cl: req.ContentLength, te: req.TransferEncoding,
			n: len(body), sha: hex.EncodeToString(sum[:])})
		if err != nil {
			return refs
		}
		if _, err := br.Peek(1); err != nil {
			return refs
		}
	}
	return refs
}

// fzResp is one response as the client read it.
type fzResp struct {
	status  int
	proto   string
	tagged  bool // written by the handler
	conn    string
	echo    fzEchoed
	body    []byte
	closing bool
}

// fzExchange sends input on a new connection, half-closes, and reads until
// the server closes. calls is how many times the handler ran for it.
func fzExchange(t *testing.T, addr string, input []byte) (raw []byte, key string, calls int32, rerr error) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, fzDeadline)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	tc := c.(*net.TCPConn)
	key = c.LocalAddr().String()
	counter := new(atomic.Int32)
	fzCalls.Store(key, counter)
	defer fzCalls.Delete(key)
	c.SetDeadline(time.Now().Add(fzDeadline))
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		// The server may close before reading everything (an error it
		// answered): write errors are expected then.
		tc.Write(input)
		tc.CloseWrite()
	}()
	raw, rerr = io.ReadAll(tc)
	<-wrote
	tc.SetLinger(0) // no TIME_WAIT: the exchange is over
	tc.Close()
	return raw, key, counter.Load(), rerr
}

func FuzzServerRequestBytes(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /echo?q=1 HTTP/1.1\r\nHost: a\r\nX-Echo: hello\r\n\r\n",
		"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
		"POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\n\r\n",
		"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nPOST /2 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabcGET /3 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
		"GET /k HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /k2 HTTP/1.0\r\n\r\n",
		"POST /e HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\nbody",
		"HEAD /h HTTP/1.1\r\nHost: a\r\n\r\nGET /after-head HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
		"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
		"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET / HTTP/1.1\nHost: a\nX-Echo: lf\n\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, input []byte) {
		if len(input) > fzMaxInput {
			t.Skip("input too large")
		}
		addr, err := fzServer()
		if err != nil {
			t.Fatalf("starting the server: %v", err)
		}
		raw, key, calls, rerr := fzExchange(t, addr, input)
		refs := fzReference(input)
		report := func(format string, args ...any) {
			t.Helper()
			var b strings.Builder
			fmt.Fprintf(&b, format, args...)
			fmt.Fprintf(&b, "\ninput:    %q\nreceived: %q\nread error: %v\nhandler calls: %d", input, raw, rerr, calls)
			for i, r := range refs {
				fmt.Fprintf(&b, "\nnet/http request %d: %v", i, r)
			}
			t.Fatal(b.String())
		}

		// 1. An answer, or the end of the stream, in time.
		var ne net.Error
		if errors.As(rerr, &ne) && ne.Timeout() {
			report("the server neither answered nor closed within %v", fzDeadline)
		}
		reset := errors.Is(rerr, syscall.ECONNRESET)
		if rerr != nil && !reset {
			report("reading: %v", rerr)
		}

		// 2. A sequence of valid responses, then EOF.
		var resps []fzResp
		br := bufio.NewReader(bytes.NewReader(raw))
		for {
			if _, err := br.Peek(1); err == io.EOF {
				break
			}
			if n := len(resps); n > 0 && resps[n-1].closing {
				report("bytes after response %d, which announced Connection: close", n-1)
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				if reset {
					report("connection reset by the server, response %d cut short: %v", len(resps), err)
				}
				report("response %d does not parse: %v", len(resps), err)
			}
			if resp.ProtoMajor != 1 || resp.StatusCode < 100 || resp.StatusCode > 599 {
				report("response %d: %q %d", len(resps), resp.Proto, resp.StatusCode)
			}
			if resp.StatusCode < 200 {
				if resp.StatusCode != http.StatusContinue {
					report("response %d: unexpected informational status %d", len(resps), resp.StatusCode)
				}
				continue // 100 Continue: the final response follows
			}
			r := fzResp{status: resp.StatusCode, proto: resp.Proto, closing: resp.Close, conn: resp.Header.Get("X-Fz-Conn")}
			r.tagged = r.conn != ""
			if r.tagged && resp.Header.Get("X-Fz-Method") == http.MethodHead {
				// The answer to HEAD has no body, whatever its
				// Content-Length says; leave resp.Body unread.
			} else if r.body, err = io.ReadAll(resp.Body); err != nil {
				report("response %d: reading its body: %v", len(resps), err)
			}
			if r.tagged {
				q, err := strconv.Unquote(resp.Header.Get("X-Fz-Echo"))
				if err != nil {
					report("response %d: X-Fz-Echo: %v", len(resps), err)
				}
				if resp.Header.Get("X-Fz-Method") != http.MethodHead && string(r.body) != q {
					report("response %d: body %q differs from its X-Fz-Echo %q", len(resps), r.body, q)
				}
				if r.echo, err = fzParseEcho(q); err != nil {
					report("response %d: echo: %v", len(resps), err)
				}
			}
			resps = append(resps, r)
		}
		if reset && (len(resps) == 0 || !resps[len(resps)-1].closing) {
			// A reset is tolerated only where net/http's server resets too:
			// after a complete response that announced Connection: close,
			// with more of the client's bytes left unread (pipelined after
			// Connection: close or an HTTP/1.0 request), which the close
			// turns into a RST.
			report("connection reset by the server after %d complete responses, the last not announcing Connection: close", len(resps))
		}

		// 3. One response per handler call, each on its own connection; a
		// 200 echoes the body its framing announced.
		tagged := 0
		for i, r := range resps {
			if !r.tagged {
				if r.status < 400 && !(r.status == http.StatusOK && len(r.body) == 0) {
					report("response %d: status %d not from the handler", i, r.status)
				}
				continue
			}
			tagged++
			if r.conn != key {
				report("response %d: the handler ran for connection %s, this is %s", i, r.conn, key)
			}
			e := r.echo
			switch r.status {
			case http.StatusOK:
				if e.err != "" {
					report("response %d: 200 after a body error %q", i, e.err)
				}
				if e.cl >= 0 && e.n != e.cl {
					report("response %d: body of %d bytes for Content-Length %d", i, e.n, e.cl)
				}
				if e.cl < 0 && e.te != "chunked" {
					report("response %d: unknown length without chunked (te=%q)", i, e.te)
				}
			case http.StatusBadRequest:
				if e.err == "" {
					report("response %d: handler's 400 without a body error", i)
				}
			default:
				report("response %d: status %d from the handler", i, r.status)
			}
		}
		if int(calls) != tagged {
			report("the handler ran %d times for %d responses of its own", calls, tagged)
		}

		if fzVerbose {
			var b strings.Builder
			for i, r := range resps {
				fmt.Fprintf(&b, " [%d %d tagged=%v close=%v %+v]", i, r.status, r.tagged, r.closing, r.echo)
			}
			t.Logf("calls=%d responses:%s\nnet/http: %v", calls, b.String(), refs)
		}

		// 4. The first request: httpd and net/http agree on what it is.
		if len(refs) == 0 || refs[0].err != nil || len(resps) == 0 || resps[0].status != http.StatusOK {
			return
		}
		ref, r := refs[0], resps[0]
		if !r.tagged {
			// The server's own 200: OPTIONS *.
			if ref.method != http.MethodOptions || ref.uri != "*" {
				report("desync: httpd answered OPTIONS * itself, net/http read %v", ref)
			}
			return
		}
		e := r.echo
		if e.method != ref.method || e.uri != ref.uri || e.path != ref.path || e.xecho != ref.xecho ||
			e.n != int64(ref.n) || e.sha != ref.sha {
			report("desync: httpd and net/http read the first request differently\nhttpd:    method=%q uri=%q path=%q x-echo=%q cl=%d te=%q len=%d sha256=%s\nnet/http: %v",
				e.method, e.uri, e.path, e.xecho, e.cl, e.te, e.n, e.sha, ref)
		}
	})
}
