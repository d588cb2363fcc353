package httpd

import (
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// bufferLimit is how much of a body is held before the headers go out: a
// handler that ends within it gets a Content-Length, a longer or flushed
// body is sent chunked.
const bufferLimit = 32 << 10

// sniffLen is how much of a body http.DetectContentType looks at.
const sniffLen = 512

var errHandlerDone = errors.New("httpd: write after the handler returned")

// response is the http.ResponseWriter of one request. Like net/http's, it
// is not safe for concurrent use.
type response struct {
	c      *conn
	req    *http.Request
	head   bool        // a HEAD request: no body on the wire
	header http.Header // the handler's; read again at the end for trailers
	sent   http.Header // a copy taken at WriteHeader: what goes out
	hi     *headInfo

	status      int
	wroteHeader bool // the status is decided
	// committed: the status line and headers are in the connection's
	// buffer. Set under c.wmu, since a body read on another goroutine
	// checks it before sending 100 Continue.
	committed  bool
	chunked    bool
	closeAfter bool
	length     int64 // the handler's Content-Length, -1 if none
	written    int64 // body bytes the handler wrote
	trailers   []string
	trailerArr [2]string // trailers' first backing array (one allocation fewer)
	sniff      []byte    // the first write, when it did not fit the buffer
	deadline   bool      // the handler set a write deadline
	done       bool
	// readDeadline: the handler set a read deadline; the body's idle
	// limit then stands aside.
	readDeadline bool
	// afterSend runs once the response is written out (AfterSend).
	afterSend func()
}

// AfterSend arranges for f to run once the response w belongs to has been
// written to the connection, after its handler returned (or panicked): for
// work the client should not wait for, such as an access log line. A
// response is sent only when its handler returns, so work done at the end
// of the handler, even deferred, delays it. It reports false, and does not
// keep f, if w is not this server's (f should then run at once); a second
// call replaces the first's f.
func AfterSend(w http.ResponseWriter, f func()) bool {
	for {
		switch v := w.(type) {
		case *response:
			v.afterSend = f
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = v.Unwrap()
		default:
			return false
		}
	}
}

// runAfterSend runs the AfterSend function, once.
func (w *response) runAfterSend() {
	if f := w.afterSend; f != nil {
		w.afterSend = nil
		f()
	}
}

// newResponse starts the response to req. A response is not reused: a
// handler's goroutine that outlives it must not write into the next one.
func newResponse(c *conn, req *http.Request, hi *headInfo) *response {
	c.respb = c.respb[:0]
	return &response{c: c, req: req, hi: hi, head: req.Method == http.MethodHead,
		header: make(http.Header, 8), length: -1, closeAfter: req.Close}
}

func (w *response) Header() http.Header { return w.header }

func (w *response) WriteHeader(code int) {
	if w.done || w.wroteHeader {
		return
	}
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		// An informational response goes out at once; the final one follows.
		if w.committed || w.req.ProtoMinor == 0 {
			return
		}
		w.c.wmu.Lock() // a body read elsewhere may send 100 Continue
		defer w.c.wmu.Unlock()
		bw := w.c.bw
		_, _ = bw.WriteString("HTTP/1.1 ")
		_, _ = bw.Write(appendStatus(nil, code))
		_, _ = bw.WriteString("\r\n")
		writeFields(bw, w.header, nil)
		_, _ = bw.WriteString("\r\n")
		_ = bw.Flush()
		return
	}
	w.wroteHeader = true
	w.status = code
	// As net/http: later changes to the header map do not go out (but
	// declared trailers are read from it at the end).
	w.sent = cloneHeader(w.header)
	if cl := w.sent.Get("Content-Length"); cl != "" {
		if n, ok := parseLength(cl); ok {
			w.length = n
		} else {
			w.sent.Del("Content-Length")
		}
	}
}

// cloneHeader copies h as http.Header.Clone does (one array for all the
// values), into a map with room for the fields commit adds (Date,
// Transfer-Encoding or Content-Length, Connection, Content-Type): growing
// the map there cost a second allocation on every response.
func cloneHeader(h http.Header) http.Header {
	n := 0
	for _, vs := range h {
		n += len(vs)
	}
	vals := make([]string, n)
	out := make(http.Header, len(h)+4)
	for k, vs := range h {
		if vs == nil {
			out[k] = nil
			continue
		}
		n := copy(vals, vs)
		out[k] = vals[:n:n]
		vals = vals[n:]
	}
	return out
}

// Values commit puts into the header it sends (never changed in place).
var (
	chunkedValue   = []string{"chunked"}
	keepAliveValue = []string{"keep-alive"}
	closeValue     = []string{"close"}
)

// bodyAllowed reports whether the status may have a body (RFC 9110 6.4.1).
func (w *response) bodyAllowed() bool {
	return w.status >= 200 && w.status != http.StatusNoContent && w.status != http.StatusNotModified
}

func (w *response) Write(p []byte) (int, error) {
	if w.done {
		return 0, errHandlerDone
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if !w.bodyAllowed() {
		return 0, http.ErrBodyNotAllowed
	}
	if w.length >= 0 && w.written+int64(len(p)) > w.length {
		return 0, http.ErrContentLength
	}
	w.written += int64(len(p))
	c := w.c
	if w.head {
		// No body on the wire; its first bytes still choose the
		// Content-Type, as they would for GET.
		if !w.committed && len(c.respb) < sniffLen {
			c.respb = append(c.respb, p[:min(len(p), sniffLen-len(c.respb))]...)
		}
		return len(p), nil
	}
	if !w.committed {
		if len(c.respb)+len(p) <= bufferLimit {
			c.respb = append(c.respb, p...)
			return len(p), nil
		}
		w.sniff = p
		w.commit(false)
	}
	if err := w.writeBody(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (w *response) WriteString(s string) (int, error) {
	// Rare here (handlers write []byte); the copy keeps one write path.
	return w.Write([]byte(s))
}

// writeBody writes p as body bytes, in a chunk when the body is chunked.
func (w *response) writeBody(p []byte) error {
	bw := w.c.bw
	if len(p) == 0 {
		return nil
	}
	if w.chunked {
		// The chunk size goes straight into the writer's free space: a
		// local array would escape through bw.Write (an allocation a chunk).
		b := strconv.AppendInt(bw.AvailableBuffer(), int64(len(p)), 16)
		b = append(b, '\r', '\n')
		_, _ = bw.Write(b)
		_, _ = bw.Write(p)
		_, err := bw.WriteString("\r\n")
		return err
	}
	_, err := bw.Write(p)
	return err
}

// Flush sends the headers and everything written so far.
func (w *response) Flush() { _ = w.FlushError() }

// FlushError is Flush that reports a failed write (http.ResponseController).
func (w *response) FlushError() error {
	if w.done {
		return errHandlerDone
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.committed {
		w.commit(false)
	}
	return w.c.bw.Flush()
}

// SetWriteDeadline sets the connection's write deadline for this response
// (http.ResponseController); it is cleared when the response ends.
func (w *response) SetWriteDeadline(t time.Time) error {
	w.deadline = true
	return w.c.nc.SetWriteDeadline(t)
}

// SetReadDeadline is accepted and ignored once the body has been read: the
// connection is then only read to watch for the client going away.
func (w *response) SetReadDeadline(t time.Time) error {
	if b := w.hi.body; b != nil && !b.sawEOF {
		w.readDeadline = true
		return w.c.nc.SetReadDeadline(t)
	}
	return nil
}

// commit writes the status line and headers to the connection's buffer,
// then the body held so far. final: the handler has returned, so the whole
// body is known.
func (w *response) commit(final bool) {
	c := w.c
	c.wmu.Lock()
	defer c.wmu.Unlock()
	w.committed = true
	h := w.sent
	if c.s.closing.Load() {
		w.closeAfter = true
	}
	if tr := h["Trailer"]; len(tr) > 0 && w.req.ProtoMinor >= 1 {
		w.trailers = w.trailerArr[:0]
		for _, v := range tr {
			for v != "" {
				var k string
				k, v, _ = strings.Cut(v, ",")
				if k = strings.Trim(k, " \t"); k != "" && isToken(k) {
					if k = textproto.CanonicalMIMEHeaderKey(k); !isFramingField(k) {
						w.trailers = append(w.trailers, k)
					}
				}
			}
		}
	} else if len(tr) > 0 {
		delete(h, "Trailer") // no trailers in HTTP/1.0
	}
	if hasConnClose(h) {
		w.closeAfter = true
	}
	if final && !w.closeAfter {
		if b := w.hi.body; b != nil && !b.discard() {
			w.closeAfter = true
		}
	}
	h.Del("Transfer-Encoding") // the framing is the server's
	switch {
	case !w.bodyAllowed():
		h.Del("Content-Length")
	case w.length >= 0:
		// The handler's own Content-Length.
	case final && len(w.trailers) == 0 && !hasPrefixedTrailers(w.header):
		if !w.head || w.written > 0 {
			h["Content-Length"] = []string{strconv.FormatInt(w.written, 10)}
		}
	case w.req.ProtoMinor >= 1:
		w.chunked = true
		h["Transfer-Encoding"] = chunkedValue
	default:
		w.closeAfter = true // HTTP/1.0: the body ends with the connection
	}
	if _, ok := h["Date"]; !ok {
		h["Date"] = httpDate(time.Now())
	}
	if _, ok := h["Content-Type"]; !ok && w.bodyAllowed() && len(h["Content-Encoding"]) == 0 {
		first := c.respb
		if len(first) == 0 {
			first = w.sniff
		}
		if len(first) > 0 {
			h["Content-Type"] = []string{http.DetectContentType(first)}
		}
	}
	w.sniff = nil
	if w.closeAfter {
		if !hasConnClose(h) {
			h["Connection"] = closeValue
		}
	} else if w.hi.keepAlive {
		h["Connection"] = keepAliveValue
	}

	bw := c.bw
	if w.req.ProtoMinor == 0 {
		_, _ = bw.WriteString("HTTP/1.0 ")
	} else {
		_, _ = bw.WriteString("HTTP/1.1 ")
	}
	var sb [64]byte
	_, _ = bw.Write(appendStatus(sb[:0], w.status))
	_, _ = bw.WriteString("\r\n")
	writeFields(bw, h, w.trailers)
	_, _ = bw.WriteString("\r\n")
	if !w.head && len(c.respb) > 0 {
		_ = w.writeBody(c.respb)
	}
	c.respb = c.respb[:0]
}

// finish ends the response after the handler returned: headers if none went
// out, the last chunk and the trailers of a chunked body.
func (w *response) finish() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.committed {
		w.commit(true)
	} else if b := w.hi.body; b != nil && !w.closeAfter && !b.discard() {
		w.closeAfter = true
	}
	bw := w.c.bw
	if w.chunked && !w.head {
		_, _ = bw.WriteString("0\r\n")
		for _, k := range w.trailers { // tokens (commit)
			for _, v := range w.header[k] {
				writeField(bw, k, v)
			}
		}
		for k, vs := range w.header {
			if name, ok := strings.CutPrefix(k, http.TrailerPrefix); ok && isToken(name) {
				for _, v := range vs {
					writeField(bw, textproto.CanonicalMIMEHeaderKey(name), v)
				}
			}
		}
		_, _ = bw.WriteString("\r\n")
	}
	if w.length >= 0 && w.written < w.length && w.bodyAllowed() && !w.head {
		// Fewer bytes than announced: only closing tells the client.
		w.closeAfter = true
	}
	w.done = true
}

// hasPrefixedTrailers reports whether the handler set trailers by
// http.TrailerPrefix (they need a chunked body).
func hasPrefixedTrailers(h http.Header) bool {
	for k := range h {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			return true
		}
	}
	return false
}

// hasConnClose reports whether the handler asked to close the connection.
func hasConnClose(h http.Header) bool {
	found := false
	forEachItem(h["Connection"], func(tok string) { found = found || strings.EqualFold(tok, "close") })
	return found
}

// forEachItem calls f with each element of comma-separated list values
// (RFC 9110 5.6.1), trimmed, skipping empty ones.
func forEachItem(vs []string, f func(string)) {
	for _, v := range vs {
		for v != "" {
			var item string
			item, v, _ = strings.Cut(v, ",")
			if item = strings.Trim(item, " \t"); item != "" {
				f(item)
			}
		}
	}
}

// isFramingField reports whether a field frames or routes the message, and
// so may never be a trailer (RFC 9110 6.5.1), in a request or a response.
func isFramingField(k string) bool {
	switch k {
	case "Transfer-Encoding", "Content-Length", "Trailer", "Host", "Connection":
		return true
	}
	return false
}

type stringWriter interface {
	WriteString(string) (int, error)
}

// writeFields writes the header fields, except the declared trailers and
// http.TrailerPrefix keys.
func writeFields(bw stringWriter, h http.Header, trailers []string) {
fields:
	for k, vs := range h {
		if !isToken(k) || strings.HasPrefix(k, http.TrailerPrefix) {
			continue
		}
		for _, t := range trailers {
			if t == k {
				continue fields
			}
		}
		for _, v := range vs {
			writeField(bw, k, v)
		}
	}
}

// writeField writes "k: v" with any CR or LF in v made a space, as net/http
// does, so that a value can never end the header block.
func writeField(bw stringWriter, k, v string) {
	_, _ = bw.WriteString(k)
	_, _ = bw.WriteString(": ")
	if strings.ContainsAny(v, "\r\n") {
		v = strings.NewReplacer("\r", " ", "\n", " ").Replace(v)
	}
	_, _ = bw.WriteString(strings.TrimSpace(v))
	_, _ = bw.WriteString("\r\n")
}

// appendStatus appends "200 OK".
func appendStatus(b []byte, code int) []byte {
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, ' ')
	text := http.StatusText(code)
	if text == "" {
		text = "status code " + strconv.Itoa(code)
	}
	return append(b, text...)
}

// httpDate is now in the Date header's format, formatted once a second, as
// a header value (shared: never changed in place).
func httpDate(now time.Time) []string {
	sec := now.Unix()
	if d := cachedDate.Load(); d != nil && d.sec == sec {
		return d.value
	}
	d := &dateText{sec: sec, value: []string{now.UTC().Format(http.TimeFormat)}}
	cachedDate.Store(d)
	return d.value
}

type dateText struct {
	sec   int64
	value []string
}

var cachedDate atomic.Pointer[dateText]
