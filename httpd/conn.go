package httpd

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Connection states, for Shutdown: only an idle connection (between
// requests) is closed under a client's feet.
const (
	stateActive int32 = iota
	stateIdle
	stateClosed
)

// maxDiscard is how much of a body the handler left unread is read and
// thrown away to keep the connection; beyond it the connection is closed
// (net/http's figure).
const maxDiscard = 256 << 10

// aLongTimeAgo is a read deadline in the past: it makes a blocked Read
// return at once.
var aLongTimeAgo = time.Unix(1, 0)

// conn is one client connection, served by one goroutine (serve), plus the
// watcher once a request has run for WatchDelay.
type conn struct {
	s      *Server
	nc     net.Conn
	ctx    context.Context // the parent of its requests' contexts
	remote string
	br     *bufio.Reader // over src
	bw     *bufio.Writer // over nc
	src    connReader
	state  atomic.Int32

	head  []byte // the request head being read
	respb []byte // the response body held before the headers go out

	// The watcher reads one byte from the connection to learn that the
	// client went away. It runs only while nothing else reads: after the
	// request's body has been read, until the handler returns.
	watchTimer *time.Timer
	watchMu    sync.Mutex
	watchOn    bool               // the current request may be watched (under watchMu)
	watching   bool               // the watcher is reading (under watchMu)
	cancel     context.CancelFunc // the current request's (under watchMu)
	watchDone  chan struct{}
	armedAt    time.Time // when the current request was armed (under watchMu)
	readErr    error     // the watcher saw the client go away
	linger     bool      // close with lingerClose

	// wmu orders the one write that may come from another goroutine (a
	// body read there sends 100 Continue) with the response's headers.
	wmu sync.Mutex
}

// connReader reads the connection, first returning the byte the watcher
// read, if any.
type connReader struct {
	nc     net.Conn
	peeked bool
	b      [1]byte
	// bodyIdle, while a handler reads its body: every read of the
	// connection must bring bytes within it (BodyIdleTimeout).
	bodyIdle time.Duration
}

func (r *connReader) Read(p []byte) (int, error) {
	if r.peeked && len(p) > 0 {
		p[0] = r.b[0]
		r.peeked = false
		return 1, nil
	}
	if r.bodyIdle > 0 {
		_ = r.nc.SetReadDeadline(time.Now().Add(r.bodyIdle))
	}
	return r.nc.Read(p)
}

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{s: s, nc: nc, remote: nc.RemoteAddr().String(), watchDone: make(chan struct{}, 1),
		ctx: context.WithValue(context.Background(), http.LocalAddrContextKey, nc.LocalAddr())}
	c.src.nc = nc
	c.br = bufio.NewReaderSize(&c.src, 4096)
	c.bw = bufio.NewWriterSize(nc, 4096)
	c.watchTimer = time.AfterFunc(time.Hour, c.watch)
	c.watchTimer.Stop()
	return c
}

// serve reads and answers requests until the connection ends.
func (c *conn) serve() {
	defer func() {
		c.watchTimer.Stop()
		if c.linger {
			c.lingerClose()
		}
		c.state.Store(stateClosed)
		_ = c.nc.Close()
		c.s.forget(c)
	}()
	first := true
	for {
		if !c.state.CompareAndSwap(stateActive, stateIdle) {
			return
		}
		if c.s.closing.Load() {
			return // Shutdown: no new request on this connection
		}
		wait := c.s.idleTimeout()
		if first {
			wait = c.s.readHeaderTimeout()
		}
		first = false
		_ = c.nc.SetReadDeadline(time.Now().Add(wait))
		if _, err := c.br.Peek(1); err != nil {
			return // the client closed the connection, or it stayed idle too long
		}
		if !c.state.CompareAndSwap(stateIdle, stateActive) {
			return // Shutdown closed it just now
		}
		_ = c.nc.SetReadDeadline(time.Now().Add(c.s.readHeaderTimeout()))
		req, hr, perr := c.readRequest()
		if perr != nil {
			c.fail(perr)
			return
		}
		_ = c.nc.SetReadDeadline(time.Time{})
		h := c.s.Handler
		if req.RequestURI == "*" {
			h = optionsStar // about the server, not a resource: answered here, as net/http does
		}
		if !c.serveRequest(h, req, hr) {
			return
		}
	}
}

// serveRequest runs the handler for one request and finishes its response.
// It reports whether the connection can serve another request.
func (c *conn) serveRequest(h http.Handler, req *http.Request, hr *headInfo) bool {
	ctx, cancel := context.WithCancel(c.ctx)
	req = req.WithContext(ctx)
	w := newResponse(c, req, hr)
	b := hr.body
	if b != nil {
		b.resp = w
	}
	c.watchMu.Lock()
	c.cancel = cancel
	c.readErr = nil
	c.watchMu.Unlock()
	if b == nil {
		c.arm() // nothing else will read the connection until the next request
	} else {
		b.armOnEOF = true // not a method value: that cost an allocation a request
	}

	panicked, aborted := c.runHandler(h, w, req)
	if b != nil {
		b.close() // a goroutine the handler left reading it is done now
	}
	c.disarm()
	cancel()
	if panicked {
		if !w.committed && !aborted {
			c.writeError(http.StatusInternalServerError, "internal server error")
			_ = c.bw.Flush()
		}
		w.runAfterSend()
		return false
	}
	w.finish()
	if cap(c.respb) > 8<<10 {
		c.respb = nil // an idle connection keeps no large buffer
	}
	werr := c.bw.Flush() // still under the handler's write deadline, if it set one
	if w.deadline {
		_ = c.nc.SetWriteDeadline(time.Time{})
	}
	w.runAfterSend()
	if werr != nil {
		return false
	}
	if c.readErr != nil && c.br.Buffered() == 0 {
		// The client went away (or shut its side after sending). Requests
		// it pipelined before that are still answered, as net/http does.
		return false
	}
	if w.closeAfter && (b != nil && !b.sawEOF || c.br.Buffered() > 0) {
		c.linger = true // the client may still be sending: see lingerClose
	}
	return !w.closeAfter && !c.s.closing.Load()
}

// optionsStar answers OPTIONS * with an empty 200.
var optionsStar = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Length", "0")
})

// runHandler calls the handler, turning a panic into panicked (logged unless
// it is http.ErrAbortHandler: aborted).
func (c *conn) runHandler(h http.Handler, w *response, req *http.Request) (panicked, aborted bool) {
	defer func() {
		if v := recover(); v != nil {
			panicked = true
			aborted = v == http.ErrAbortHandler
			if !aborted {
				buf := make([]byte, 16<<10)
				buf = buf[:runtime.Stack(buf, false)]
				c.s.log().Error("handler panicked", "remote", c.remote, "path", req.URL.Path, "panic", v, "stack", string(buf))
			}
		}
	}()
	h.ServeHTTP(w, req)
	return false, false
}

// arm lets the watcher start after WatchDelay: from here until disarm,
// nothing but the watcher reads the connection.
func (c *conn) arm() {
	c.watchMu.Lock()
	c.watchOn = true
	c.armedAt = time.Now()
	c.watchMu.Unlock()
	c.watchTimer.Reset(c.s.watchDelay())
}

// disarm stops the watcher: once it returns, the watcher no longer reads
// the connection and will not start until the next arm.
func (c *conn) disarm() {
	c.watchTimer.Stop()
	c.watchMu.Lock()
	c.watchOn = false
	running := c.watching
	c.watchMu.Unlock()
	if running {
		_ = c.nc.SetReadDeadline(aLongTimeAgo)
		<-c.watchDone
		_ = c.nc.SetReadDeadline(time.Time{})
	}
}

// watch waits for the client to send something or go away while the
// handler runs (on the timer's goroutine). A byte read is kept for the next
// request; an error or the end of the stream cancels the request.
func (c *conn) watch() {
	c.watchMu.Lock()
	// Not for this request: a timer run of an earlier request that is
	// late (too soon after this arm; the run for it comes at its time),
	// or a byte is already held for the next request.
	if !c.watchOn || c.watching || c.src.peeked || time.Since(c.armedAt) < c.s.watchDelay() {
		c.watchMu.Unlock()
		return
	}
	c.watching = true
	// No deadline left from the body or the handler may end this read
	// and pass for a disconnect. Under watchMu: disarm's deadline in the
	// past, to interrupt the read, comes after this.
	_ = c.nc.SetReadDeadline(time.Time{})
	c.watchMu.Unlock()

	n, err := c.nc.Read(c.src.b[:])

	c.watchMu.Lock()
	c.watching = false
	if n == 1 {
		// The client sent more (a pipelined request): it is there. Keep
		// the byte for the next request and stop watching.
		c.src.peeked = true
	} else if c.watchOn {
		// Not our own interruption: the client went away.
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		c.readErr = err
		c.cancel()
	}
	stopping := !c.watchOn
	c.watchMu.Unlock()
	if stopping {
		c.watchDone <- struct{}{}
	}
}

// writeContinue sends 100 Continue unless the final response has started
// (its body may be read on a goroutine other than the handler's).
func (c *conn) writeContinue(w *response) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if w != nil && w.committed {
		return nil
	}
	_, _ = c.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
	return c.bw.Flush()
}

// closeIfIdle closes the connection if it is waiting for a request
// (Shutdown).
func (c *conn) closeIfIdle() {
	if c.state.CompareAndSwap(stateIdle, stateClosed) {
		_ = c.nc.Close()
	}
}

// requestError is a request the server answers itself, then closes.
type requestError struct {
	status int
	msg    string
}

func (e *requestError) Error() string { return e.msg }

func badRequest(msg string) *requestError {
	return &requestError{status: http.StatusBadRequest, msg: msg}
}

// fail answers a request that could not be read, unless the connection
// itself failed (then the client is gone or silent).
func (c *conn) fail(err error) {
	var re *requestError
	if !errors.As(err, &re) {
		return
	}
	c.writeError(re.status, re.msg)
	_ = c.bw.Flush()
	c.linger = true
}

// lingerClose ends a connection whose client may still be sending (a body
// the handler did not read, a request the server refused): closing a socket
// with unread data sends a reset, which can destroy the answer before the
// client reads it. So the server says it is done (FIN), then reads and
// drops what still comes, for up to half a second, before closing.
func (c *conn) lingerClose() {
	tc, ok := c.nc.(interface{ CloseWrite() error })
	if !ok {
		return
	}
	_ = c.bw.Flush()
	_ = tc.CloseWrite()
	_ = c.nc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	_, _ = io.CopyN(io.Discard, c.br, 64<<20)
}

// writeError writes one of the server's own error responses.
func (c *conn) writeError(status int, msg string) {
	ct, body := "text/plain; charset=utf-8", []byte(msg+"\n")
	if c.s.ErrorBody != nil {
		func() {
			defer func() {
				if v := recover(); v != nil {
					c.s.log().Error("ErrorBody panicked", "panic", v)
				}
			}()
			ct, body = c.s.ErrorBody(status, msg)
		}()
	}
	b := c.respb[:0]
	b = append(b, "HTTP/1.1 "...)
	b = appendStatus(b, status)
	b = append(b, "\r\nContent-Type: "...)
	b = append(b, ct...)
	b = append(b, "\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	if c.s.RequestID != nil {
		b = append(b, "\r\nX-Request-Id: "...)
		b = append(b, c.s.RequestID()...)
	}
	b = append(b, "\r\nConnection: close\r\nDate: "...)
	b = append(b, httpDate(time.Now())[0]...)
	b = append(b, "\r\n\r\n"...)
	b = append(b, body...)
	c.respb = b[:0]
	_, _ = c.bw.Write(b)
}

// headInfo is what reading a request's head found beyond *http.Request.
type headInfo struct {
	body      *body // nil: no body
	keepAlive bool  // HTTP/1.0 with Connection: keep-alive
}

// readLine appends the next line of the head to c.head, without its line
// ending, and returns it. Lines end in CRLF or LF.
func (c *conn) readLine(limit int) ([]byte, error) {
	start := len(c.head)
	for {
		frag, err := c.br.ReadSlice('\n')
		if len(c.head)+len(frag) > limit {
			return nil, &requestError{status: http.StatusRequestHeaderFieldsTooLarge, msg: "request headers too large"}
		}
		c.head = append(c.head, frag...)
		if err == nil {
			break
		}
		if err != bufio.ErrBufferFull {
			return nil, err
		}
	}
	line := c.head[start : len(c.head)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// readRequest reads a request's line and headers and sets up its body.
func (c *conn) readRequest() (*http.Request, *headInfo, error) {
	limit := c.s.maxHeaderBytes()
	var line []byte
	var err error
	for range 4 { // RFC 9112 2.2: ignore empty lines before the request line
		c.head = c.head[:0]
		if line, err = c.readLine(limit); err != nil || len(line) > 0 {
			break
		}
	}
	if err != nil {
		return nil, nil, err
	}
	if len(line) == 0 {
		return nil, nil, badRequest("malformed request line")
	}
	reqLineEnd := len(c.head)
	for {
		l, err := c.readLine(limit)
		if err != nil {
			return nil, nil, err
		}
		if len(l) == 0 {
			break
		}
	}
	// One string for the whole head: the method, path, names and values
	// are slices of it.
	head := string(c.head)
	c.shrinkHead()
	return c.parse(head, reqLineEnd)
}

// shrinkHead drops a large head buffer: an idle connection keeps none.
func (c *conn) shrinkHead() {
	if cap(c.head) > 8<<10 {
		c.head = nil
	}
}

// parse builds the request from its head (request line, then headers, each
// line ending in LF, CR kept where the client sent it).
func (c *conn) parse(head string, reqLineEnd int) (*http.Request, *headInfo, error) {
	reqLine := strings.TrimSuffix(head[:reqLineEnd-1], "\r")
	method, rest, ok1 := strings.Cut(reqLine, " ")
	target, proto, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || !isToken(method) || target == "" || strings.ContainsAny(target, " \t\r") {
		return nil, nil, badRequest("malformed request line")
	}
	major, minor, ok := parseVersion(proto)
	if !ok {
		return nil, nil, badRequest("malformed HTTP version")
	}
	if major != 1 {
		return nil, nil, &requestError{status: http.StatusHTTPVersionNotSupported, msg: "HTTP version not supported"}
	}
	req := &http.Request{
		Method: method, Proto: proto, ProtoMajor: major, ProtoMinor: minor,
		RequestURI: target, RemoteAddr: c.remote, Body: http.NoBody,
	}
	var err error
	if method == http.MethodConnect || target == "*" && method != http.MethodOptions {
		return nil, nil, badRequest("unsupported request target")
	}
	if req.URL, err = url.ParseRequestURI(target); err != nil {
		return nil, nil, badRequest("malformed request target")
	}

	// Headers.
	lines := head[reqLineEnd:]
	n := strings.Count(lines, "\n") - 1 // the last line is the empty one
	vals := make([]string, n)           // the header's values share one array
	h := make(http.Header, n)
	hi := &headInfo{}
	var hosts, lengths, encodings int
	var length, encoding, expect string
	keepAlive, closeConn := false, false
	for i := 0; i < n; i++ {
		end := strings.IndexByte(lines, '\n')
		k, v, ferr := parseField(strings.TrimSuffix(lines[:end], "\r"))
		lines = lines[end+1:]
		if ferr != nil {
			return nil, nil, ferr
		}
		switch k {
		case "Host":
			hosts++
			req.Host = v
			continue // like net/http: in r.Host, not r.Header
		case "Content-Length":
			if lengths > 0 && v != length {
				return nil, nil, badRequest("conflicting Content-Length headers")
			}
			lengths++
			length = v
		case "Transfer-Encoding":
			encodings++
			encoding = v
		case "Connection":
			forEachItem([]string{v}, func(tok string) {
				closeConn = closeConn || strings.EqualFold(tok, "close")
				keepAlive = keepAlive || strings.EqualFold(tok, "keep-alive")
			})
		case "Expect":
			expect = v
		}
		vals[i] = v
		if prev, ok := h[k]; ok {
			h[k] = append(prev, v)
		} else {
			h[k] = vals[i : i+1 : i+1]
		}
	}
	req.Header = h
	if u := req.URL; u.Host != "" {
		req.Host = u.Host // absolute form: the target's authority wins (RFC 9112 3.2.2)
	}
	if hosts > 1 {
		return nil, nil, badRequest("more than one Host header")
	}
	if minor >= 1 && hosts == 0 {
		return nil, nil, badRequest("missing Host header")
	}
	if strings.ContainsAny(req.Host, " \t/\\") {
		return nil, nil, badRequest("malformed Host header")
	}

	// Framing (RFC 9112 6): chunked or Content-Length, never both.
	switch {
	case encodings > 0:
		if lengths > 0 {
			return nil, nil, badRequest("both Transfer-Encoding and Content-Length")
		}
		if minor == 0 {
			return nil, nil, badRequest("Transfer-Encoding in an HTTP/1.0 request")
		}
		if encodings > 1 || !strings.EqualFold(encoding, "chunked") {
			return nil, nil, &requestError{status: http.StatusNotImplemented, msg: "unsupported Transfer-Encoding (only chunked)"}
		}
		req.ContentLength = -1
		req.TransferEncoding = []string{"chunked"}
		hi.body = newBody(c, -1)
		if tr := h["Trailer"]; len(tr) > 0 {
			// Declared trailer fields: filled in when the body has been
			// read (net/http's r.Trailer).
			req.Trailer = http.Header{}
			var bad string
			forEachItem(tr, func(k string) {
				if isToken(k) {
					if k = textproto.CanonicalMIMEHeaderKey(k); isFramingField(k) {
						bad = k
					}
					req.Trailer[k] = nil
				}
			})
			if bad != "" {
				return nil, nil, badRequest("forbidden field in the Trailer header: " + bad)
			}
			hi.body.trailer = req.Trailer
		}
	case lengths > 0:
		cl, ok := parseLength(length)
		if !ok {
			return nil, nil, badRequest("malformed Content-Length")
		}
		req.ContentLength = cl
		if cl > 0 {
			hi.body = newBody(c, cl)
		}
	}
	if hi.body != nil {
		req.Body = hi.body
	}
	if expect != "" {
		if !strings.EqualFold(expect, "100-continue") {
			return nil, nil, &requestError{status: http.StatusExpectationFailed, msg: "unsupported Expect header"}
		}
		if hi.body != nil && minor >= 1 {
			hi.body.expect = true
		}
	}
	if minor == 0 {
		closeConn = closeConn || !keepAlive
		hi.keepAlive = keepAlive && !closeConn
	}
	req.Close = closeConn
	return req, hi, nil
}

// parseField splits a header (or trailer) line into its canonical name and
// its trimmed value, refusing what RFC 9112 5 does not allow.
func parseField(l string) (k, v string, err *requestError) {
	if l[0] == ' ' || l[0] == '\t' {
		return "", "", badRequest("obsolete line folding in headers")
	}
	k, v, ok := strings.Cut(l, ":")
	if !ok || !isToken(k) {
		return "", "", badRequest("malformed header line")
	}
	if v = strings.Trim(v, " \t"); !validValue(v) {
		return "", "", badRequest("invalid character in a header value")
	}
	return textproto.CanonicalMIMEHeaderKey(k), v, nil
}

// parseVersion parses "HTTP/x.y".
func parseVersion(v string) (major, minor int, ok bool) {
	switch v {
	case "HTTP/1.1":
		return 1, 1, true
	case "HTTP/1.0":
		return 1, 0, true
	}
	if len(v) != 8 || !strings.HasPrefix(v, "HTTP/") || v[6] != '.' {
		return 0, 0, false
	}
	if v[5] < '0' || v[5] > '9' || v[7] < '0' || v[7] > '9' {
		return 0, 0, false
	}
	return int(v[5] - '0'), int(v[7] - '0'), true
}

// parseLength parses a Content-Length: digits only.
func parseLength(v string) (int64, bool) {
	if v == "" || len(v) > 18 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
		n = n*10 + int64(v[i]-'0')
	}
	return n, true
}

// isToken reports whether s is an RFC 9110 token (a method or a field name).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tokenChar[s[i]] {
			return false
		}
	}
	return true
}

var tokenChar = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

// validValue reports whether a field value has no control character other
// than HTAB (obs-text, 0x80-0xFF, is allowed).
func validValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if b := v[i]; b < ' ' && b != '\t' || b == 0x7f {
			return false
		}
	}
	return true
}
