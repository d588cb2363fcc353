package upstream

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// A lean HTTP/1.1 response reader for Pool. http.ReadResponse builds a
// full MIME header (a map entry and a canonicalised key per field), a
// chunked reader, a LimitReader and a body wrapper: about 14 allocations
// per answer, on the path of every request. The gateway looks at three
// things in an answer (its status, its Content-Type and its framing), so
// this reader keeps those and drops the rest, in three or four allocations.
//
// It is stricter than net/http where leniency could desynchronise a pooled
// connection (folded lines, a space before a field's colon, stray CRs,
// Transfer-Encoding in an HTTP/1.0 answer) and follows RFC 9112 where
// net/http is stricter than the RFC (Transfer-Encoding lists, repeated or
// listed Content-Length values, bare LF line ends). FuzzResponseReader in
// response_test.go compares the two and lists the differences.

const (
	// maxHeaderBytes bounds an answer's header blocks together, interim
	// (1xx) ones included, and separately its trailer.
	maxHeaderBytes = 64 << 10
	// maxChunkLine bounds a chunk-size line (with its extensions), as
	// net/http does.
	maxChunkLine = 4096
	// maxChunkSize is far beyond any answer; it keeps arithmetic on sizes
	// away from overflow.
	maxChunkSize = 1 << 40
)

var (
	// errClosedBeforeAnswer is a connection that ended before the first byte
	// of an answer: on a pooled connection, the server had closed it while
	// idle. It wraps io.EOF so that Post retries it.
	errClosedBeforeAnswer = fmt.Errorf("upstream closed the connection before answering: %w", io.EOF)

	errStatusLine       = errors.New("malformed status line")
	errVersion          = errors.New("unsupported HTTP version (want HTTP/1.0 or HTTP/1.1)")
	errSwitching        = errors.New("unexpected 101 Switching Protocols")
	errLineTooLong      = errors.New("header line longer than the read buffer")
	errHeaderTooLarge   = errors.New("header over 64 KiB")
	errFolding          = errors.New("obsolete line folding in header")
	errNoColon          = errors.New("header line without ':'")
	errFieldName        = errors.New("invalid header field name")
	errNameSpace        = errors.New("whitespace in header field name")
	errStrayCR          = errors.New("CR inside a header line")
	errFieldValue       = errors.New("invalid byte in header field value")
	errContentLength    = errors.New("invalid Content-Length")
	errTransferEncoding = errors.New("invalid Transfer-Encoding")
	errTE10             = errors.New("Transfer-Encoding in an HTTP/1.0 answer")
	errChunkLine        = errors.New("malformed chunk size line")
	errChunkTooLarge    = errors.New("chunk size too large")
	errChunkEnd         = errors.New("chunk data not followed by CRLF")
)

// answerError is a malformed answer: which rule (one of the errors above,
// for errors.Is) and the line that broke it.
type answerError struct {
	kind error
	line string // the start of the line; empty if the rule is not about one line
}

func (e *answerError) Error() string {
	if e.line == "" {
		return "upstream answer: " + e.kind.Error()
	}
	return "upstream answer: " + e.kind.Error() + ": " + strconv.Quote(e.line)
}

func (e *answerError) Unwrap() error { return e.kind }

func malformed(kind error, line []byte) error {
	if len(line) > 80 {
		line = line[:80]
	}
	return &answerError{kind: kind, line: string(line)}
}

// lax marks the places where the reader accepted what net/http rejects
// (RFC 9112 allows it); the fuzz test uses it to tell deliberate differences
// from bugs. It costs a byte and is never read on the request path.
const (
	laxContentLength = 1 << iota // a Content-Length list, or the field repeated
	laxTE                        // Transfer-Encoding other than one field "chunked"
	laxTEAndCL                   // both: Content-Length ignored, connection not reused
	laxBareLF                    // a chunk-size or trailer line ended in a bare LF
	laxChunkBWS                  // whitespace between a chunk size and ';'
)

// Body framings.
const (
	bodyNone    = iota // 1xx, 204, 304, Content-Length: 0
	bodyLength         // Content-Length bytes
	bodyChunked        // chunked transfer coding
	bodyClose          // until the server closes the connection
)

// States of the chunked decoder.
const (
	chSize    = iota // next: a chunk-size line
	chData           // n bytes of chunk data left
	chEnd            // next: the CRLF after a chunk's data
	chTrailer        // next: a trailer line, or the empty line that ends the body
)

// Content-Type values interned, so the common answers cost no string.
var commonContentTypes = [...]string{
	"text/event-stream",
	"text/event-stream; charset=utf-8",
	"application/json",
	"application/json; charset=utf-8",
	"application/x-ndjson",
	"text/plain; charset=utf-8",
}

// statusTexts["200"] is "200 OK": the usual status strings, interned.
var statusTexts = func() [600]string {
	var s [600]string
	for code := 100; code < 600; code++ {
		if t := http.StatusText(code); t != "" {
			s[code] = strconv.Itoa(code) + " " + t
		}
	}
	return s
}()

// chunkedTE is the TransferEncoding of every chunked answer, shared: no
// caller modifies it.
var chunkedTE = []string{"chunked"}

// answer is one allocation for what an answer needs: the response, its
// body and the backing array of the header values kept.
type answer struct {
	resp http.Response
	body h1Body
	vals [2]string
}

// head is what one header block says, while it is read.
type head struct {
	code    int
	minor   byte // HTTP/1.minor
	status  string
	ct, ra  string
	hasCT   bool
	hasRA   bool
	cl      int64 // -1: no Content-Length
	clSeen  int   // Content-Length fields
	te      bool  // Transfer-Encoding present
	chunked bool  // its last coding is chunked
	teCodes int   // codings listed, over all its fields
	teLines int   // Transfer-Encoding fields
	teExact bool  // a field was just "chunked" (net/http's only form)
	close   bool  // Connection: close
	keep    bool  // Connection: keep-alive
	lax     uint8
}

// readResponse reads an answer's status line and header from br, skipping
// interim (1xx) answers, and returns it with its body, which reads from br.
//
// Only what the gateway uses is kept: the status, Content-Type and
// Retry-After (resp.Header has those two, under their canonical keys, first
// value only). Content-Length, Transfer-Encoding and Connection decide the
// framing and resp.ContentLength and resp.Close (RFC 9112 §6.3); every
// other field is checked for syntax and dropped. resp.Body is the returned
// body; the caller attaches the connection to it (exchange).
//
// An end of input before the answer's first byte is errClosedBeforeAnswer
// (it wraps io.EOF; Post does not send the request again: the server may
// have run it). Anywhere later in the header, an end of input is
// io.ErrUnexpectedEOF.
// Read errors come back as they are.
func readResponse(br *bufio.Reader) (*http.Response, *h1Body, error) {
	if _, err := br.Peek(1); err != nil {
		if err == io.EOF {
			err = errClosedBeforeAnswer
		}
		return nil, nil, err
	}
	budget := maxHeaderBytes
	var h head
	for {
		h = head{cl: -1, lax: h.lax}
		if err := readHead(br, &h, &budget); err != nil {
			return nil, nil, err
		}
		if h.code >= 200 {
			break
		}
		if h.code == http.StatusSwitchingProtocols {
			return nil, nil, malformed(errSwitching, nil)
		}
		// 100 Continue, 102 Processing, 103 Early Hints: the answer follows.
	}

	a := new(answer)
	resp, b := &a.resp, &a.body
	resp.Status = h.status
	resp.StatusCode = h.code
	resp.Proto = "HTTP/1.1"
	if h.minor == 0 {
		resp.Proto = "HTTP/1.0"
	}
	resp.ProtoMajor, resp.ProtoMinor = 1, int(h.minor)
	resp.Header = make(http.Header, 2)
	if h.hasCT {
		a.vals[0] = h.ct
		resp.Header["Content-Type"] = a.vals[0:1:1]
	}
	if h.hasRA {
		a.vals[1] = h.ra
		resp.Header["Retry-After"] = a.vals[1:2:2]
	}
	if h.chunked {
		resp.TransferEncoding = chunkedTE
	}

	b.br = br
	b.lax = h.lax
	switch {
	case h.code == http.StatusNoContent || h.code == http.StatusNotModified:
		b.mode = bodyNone // and we never send HEAD
		resp.ContentLength = 0
	case h.te && h.chunked:
		b.mode = bodyChunked
		resp.ContentLength = -1
	case h.te:
		b.mode = bodyClose // the last coding is not chunked: RFC 9112 §6.3
		resp.ContentLength = -1
	case h.cl == 0:
		b.mode = bodyNone
		resp.ContentLength = 0
	case h.cl > 0:
		b.mode = bodyLength
		b.n = h.cl
		resp.ContentLength = h.cl
	default:
		b.mode = bodyClose
		resp.ContentLength = -1
	}
	resp.Close = h.close || (h.minor == 0 && !h.keep) || b.mode == bodyClose ||
		// Both framings: someone between us and the model may have read
		// the other one, so what follows on the connection is suspect.
		(h.te && h.cl >= 0)
	b.reuse = !resp.Close
	resp.Body = b
	return resp, b, nil
}

// readHead reads one status line and header block into h.
func readHead(br *bufio.Reader, h *head, budget *int) error {
	line, _, err := readLine(br, budget)
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	if err := parseStatusLine(line, h); err != nil {
		return err
	}
	keep := h.code >= 200 // an interim answer's fields are checked, not kept
	for {
		line, _, err := readLine(br, budget)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		if len(line) == 0 {
			break
		}
		name, value, err := splitField(line)
		if err != nil {
			return err
		}
		if err := h.field(name, value, keep); err != nil {
			return malformed(err, line)
		}
	}
	if h.te {
		if h.teCodes == 0 {
			return malformed(errTransferEncoding, nil)
		}
		if h.teLines != 1 || !h.teExact {
			h.lax |= laxTE
		}
		if h.cl >= 0 {
			h.lax |= laxTEAndCL
		}
	}
	return nil
}

// readLine returns the next line from br without its CRLF or bare LF
// (RFC 9112 §2.2 allows it), counted against budget. The line is only valid
// until the next read of br. An end of input before any byte is io.EOF;
// within a line, io.ErrUnexpectedEOF.
func readLine(br *bufio.Reader, budget *int) (line []byte, bareLF bool, err error) {
	line, err = br.ReadSlice('\n')
	if err != nil {
		switch {
		case err == bufio.ErrBufferFull:
			return nil, false, malformed(errLineTooLong, line)
		case err == io.EOF && len(line) > 0:
			return nil, false, io.ErrUnexpectedEOF
		}
		return nil, false, err
	}
	if *budget -= len(line); *budget < 0 {
		return nil, false, malformed(errHeaderTooLarge, nil)
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		return line[:n-1], false, nil
	}
	return line, true, nil
}

// parseStatusLine reads "HTTP/1.x SSS reason".
func parseStatusLine(line []byte, h *head) error {
	if len(line) < len("HTTP/1.1 200") || string(line[:5]) != "HTTP/" {
		return malformed(errStatusLine, line)
	}
	if string(line[5:7]) != "1." || (line[7] != '0' && line[7] != '1') {
		return malformed(errVersion, line)
	}
	h.minor = line[7] - '0'
	c := line[9:12]
	if line[8] != ' ' || !isDigit(c[0]) || !isDigit(c[1]) || !isDigit(c[2]) || c[0] == '0' ||
		(len(line) > 12 && line[12] != ' ') {
		return malformed(errStatusLine, line)
	}
	h.code = int(c[0]-'0')*100 + int(c[1]-'0')*10 + int(c[2]-'0')
	// Status is the code and the reason as sent, usually the standard text.
	if h.code < len(statusTexts) && statusTexts[h.code] == string(line[9:]) {
		h.status = statusTexts[h.code]
	} else {
		h.status = string(line[9:])
	}
	return nil
}

// splitField splits a header (or trailer) line into its name and its value
// trimmed of spaces and tabs, checking both.
func splitField(line []byte) (name, value []byte, err error) {
	if line[0] == ' ' || line[0] == '\t' {
		// A continuation of the previous line (RFC 9112 §5.2 lets us reject it).
		return nil, nil, malformed(errFolding, line)
	}
	colon := bytes.IndexByte(line, ':')
	if colon < 0 {
		return nil, nil, malformed(errNoColon, line)
	}
	if bytes.IndexByte(line, '\r') >= 0 {
		return nil, nil, malformed(errStrayCR, line)
	}
	name = line[:colon]
	if len(name) == 0 {
		return nil, nil, malformed(errFieldName, line)
	}
	for _, c := range name {
		if !isTokenChar(c) {
			if c == ' ' || c == '\t' {
				// "Content-Length : 5" is a classic smuggling trick.
				return nil, nil, malformed(errNameSpace, line)
			}
			return nil, nil, malformed(errFieldName, line)
		}
	}
	value = trimOWS(line[colon+1:])
	for _, c := range value {
		if c < ' ' && c != '\t' || c == 0x7f {
			return nil, nil, malformed(errFieldValue, line)
		}
	}
	return name, value, nil
}

// field takes in one header field.
func (h *head) field(name, value []byte, keep bool) error {
	switch {
	case fieldIs(name, "content-type"):
		if keep && !h.hasCT {
			h.ct, h.hasCT = internContentType(value), true
		}
	case fieldIs(name, "retry-after"):
		if keep && !h.hasRA {
			h.ra, h.hasRA = string(value), true
		}
	case fieldIs(name, "content-length"):
		return h.contentLength(value)
	case fieldIs(name, "transfer-encoding"):
		if h.minor == 0 {
			// RFC 9112 §6.1: the framing of such a message is faulty.
			return errTE10
		}
		return h.transferEncoding(value)
	case fieldIs(name, "connection"):
		for rest := value; rest != nil; {
			var tok []byte
			tok, rest = nextElement(rest)
			h.close = h.close || fieldIs(tok, "close")
			h.keep = h.keep || fieldIs(tok, "keep-alive")
		}
	}
	return nil
}

// contentLength takes a Content-Length value: a decimal, or a list of equal
// ones (RFC 9110 §8.6), equal to any earlier field's.
func (h *head) contentLength(value []byte) error {
	h.clSeen++
	if h.clSeen > 1 || bytes.IndexByte(value, ',') >= 0 {
		h.lax |= laxContentLength
	}
	for rest := value; rest != nil; {
		var e []byte
		e, rest = nextElement(rest)
		n, ok := parseDecimal(e)
		if !ok || (h.cl >= 0 && n != h.cl) {
			return errContentLength
		}
		h.cl = n
	}
	return nil
}

// transferEncoding takes a Transfer-Encoding value: a list of codings,
// possibly over several fields; the last one decides whether the body is
// chunked. Parameters (";q=...") are not checked.
func (h *head) transferEncoding(value []byte) error {
	h.te = true
	h.teLines++
	h.teExact = fieldIs(value, "chunked")
	for rest := value; rest != nil; {
		var e []byte
		e, rest = nextElement(rest)
		if len(e) == 0 {
			continue // empty list elements are allowed (RFC 9110 §5.6.1)
		}
		coding := e
		if i := bytes.IndexByte(e, ';'); i >= 0 {
			coding = trimOWS(e[:i])
		}
		for _, c := range coding {
			if !isTokenChar(c) {
				return errTransferEncoding
			}
		}
		if len(coding) == 0 || (h.chunked && fieldIs(coding, "chunked")) {
			// Chunked may be applied only once (RFC 9112 §7).
			return errTransferEncoding
		}
		h.chunked = fieldIs(e, "chunked")
		h.teCodes++
	}
	return nil
}

// nextElement splits a comma-separated list: its first element (trimmed)
// and the rest, nil after the last element.
func nextElement(list []byte) (elem, rest []byte) {
	if i := bytes.IndexByte(list, ','); i >= 0 {
		return trimOWS(list[:i]), list[i+1:]
	}
	return trimOWS(list), nil
}

// fieldIs compares b to lower, a lower-case name or token of letters and
// '-', ignoring ASCII case. OR-ing 0x20 maps only letters onto letters, and
// only '-' and CR onto '-'; b passed splitField, so it holds no CR.
func fieldIs(b []byte, lower string) bool {
	if len(b) != len(lower) {
		return false
	}
	for i := range len(b) {
		if b[i]|0x20 != lower[i] {
			return false
		}
	}
	return true
}

// parseDecimal parses a non-negative decimal up to 1<<63 - 1.
func parseDecimal(b []byte) (int64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if !isDigit(c) || n > (1<<63-1-int64(c-'0'))/10 {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

func internContentType(v []byte) string {
	for _, s := range commonContentTypes {
		if string(v) == s {
			return s
		}
	}
	return string(v)
}

func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// isTokenChar: tchar of RFC 9110 §5.6.2.
func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// h1Body is an answer's body: it decodes the framing from the connection's
// reader and, at the end, hands the connection back to the pool.
//
// Read returns what is at hand, the bufio buffer's bytes or one read of the
// connection, and never waits to fill p: an event stream's chunks must go on
// as they arrive. An input that ends early is io.ErrUnexpectedEOF, never
// io.EOF. Errors stick: every later Read returns the same.
type h1Body struct {
	br    *bufio.Reader
	mode  uint8
	state uint8 // of the chunked decoder
	lax   uint8
	n     int64 // bytes left: of the body (bodyLength) or of the chunk (chData)
	tbudg int   // trailer bytes left, once in chTrailer
	err   error // set once the body ended (io.EOF) or failed

	// The connection, nil in tests that read from a bytes.Reader.
	c     *h1Conn
	p     *Pool
	stop  func() bool // the cancel hook's stop: true if it had not fired
	reuse bool
	done  bool // the connection was handed back or closed
}

func (b *h1Body) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	n, err := b.decode(p)
	if err != nil {
		b.err = err
		if err == io.EOF {
			b.finish()
		}
	}
	return n, err
}

// finish hands the connection back if it may be reused and the cancel hook
// had not fired (it poisons the deadline), else closes it.
func (b *h1Body) finish() {
	if b.done || b.c == nil {
		return
	}
	b.done = true
	// Bytes already buffered past the body's end belong to no request (a
	// server that sent more than it framed): the next request on this
	// connection would read them as its answer, so it is not reused.
	if b.stop() && b.reuse && b.br.Buffered() == 0 {
		b.p.put(b.c)
	} else {
		b.c.c.Close()
	}
}

// Drain finishes an answer whose last event was already read (after
// "data: [DONE]" only the chunked terminator is left, and some servers send
// it a moment later): it reads what remains for at most wait, and hands the
// connection back if that reached the end. A server that keeps the stream
// open costs only the connection.
func (b *h1Body) Drain(wait time.Duration) {
	if b.err != nil || b.c == nil {
		b.Close()
		return
	}
	_ = b.c.c.SetReadDeadline(time.Now().Add(wait))
	var buf [512]byte
	for read := 0; read < 64<<10; {
		n, err := b.decode(buf[:])
		read += n
		if err == io.EOF {
			// The deadline goes before the connection does back to the pool.
			_ = b.c.c.SetReadDeadline(time.Time{})
			b.err = io.EOF
			b.finish()
			return
		}
		if err != nil {
			b.err = err
			break
		}
	}
	b.Close()
}

// Close discards the connection unless the body was read to its end.
func (b *h1Body) Close() error {
	if b.err == nil {
		b.err = http.ErrBodyReadAfterClose
	}
	if !b.done && b.c != nil {
		b.done = true
		b.stop()
		b.c.c.Close()
	}
	return nil
}

// decode reads body bytes into p (len(p) > 0) per the framing.
func (b *h1Body) decode(p []byte) (int, error) {
	switch b.mode {
	case bodyNone:
		return 0, io.EOF
	case bodyClose:
		return b.br.Read(p)
	case bodyLength:
		if b.n == 0 {
			return 0, io.EOF
		}
		if int64(len(p)) > b.n {
			p = p[:b.n]
		}
		n, err := b.br.Read(p)
		b.n -= int64(n)
		if b.n == 0 {
			// The end with the last bytes: the connection goes back sooner.
			return n, io.EOF
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return n, err
	}
	return b.chunked(p)
}

// chunked decodes the chunked coding (RFC 9112 §7.1). Once it has bytes
// for p it goes on only through what is already buffered: the next chunk's
// header, or the end of the body, are read with the data before them if
// they came with it, and never waited for.
func (b *h1Body) chunked(p []byte) (n int, err error) {
	for {
		switch b.state {
		case chData:
			if n == len(p) || (n > 0 && b.br.Buffered() == 0) {
				return n, nil
			}
			q := p[n:]
			if int64(len(q)) > b.n {
				q = q[:b.n]
			}
			k, err := b.br.Read(q)
			n += k
			b.n -= int64(k)
			if err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return n, err
			}
			if b.n == 0 {
				b.state = chEnd
			}
		case chEnd:
			if n > 0 && b.br.Buffered() < 2 {
				return n, nil
			}
			crlf, err := b.br.Peek(2)
			if err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return n, err
			}
			if crlf[0] != '\r' || crlf[1] != '\n' {
				return n, malformed(errChunkEnd, crlf)
			}
			b.br.Discard(2)
			b.state = chSize
		case chSize:
			if n > 0 && !b.lineBuffered() {
				return n, nil
			}
			size, err := b.chunkSize()
			if err != nil {
				return n, err
			}
			if size == 0 {
				b.state, b.tbudg = chTrailer, maxHeaderBytes
			} else {
				b.state, b.n = chData, size
			}
		case chTrailer:
			if n > 0 && !b.lineBuffered() {
				return n, nil
			}
			line, bareLF, err := readLine(b.br, &b.tbudg)
			if bareLF {
				b.lax |= laxBareLF
			}
			if err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return n, err
			}
			if len(line) == 0 {
				return n, io.EOF
			}
			if _, _, err := splitField(line); err != nil {
				return n, err // trailers are dropped, but must be fields
			}
		}
	}
}

// lineBuffered: a whole line is in the buffer, so reading it won't block.
func (b *h1Body) lineBuffered() bool {
	buf, _ := b.br.Peek(b.br.Buffered())
	return bytes.IndexByte(buf, '\n') >= 0
}

// chunkSize reads a chunk-size line: hex digits, then optional extensions,
// which are ignored.
func (b *h1Body) chunkSize() (int64, error) {
	line, err := b.br.ReadSlice('\n')
	if err != nil {
		switch err {
		case io.EOF:
			return 0, io.ErrUnexpectedEOF
		case bufio.ErrBufferFull:
			return 0, malformed(errChunkLine, line)
		}
		return 0, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	} else {
		b.lax |= laxBareLF // RFC 9112 §2.2
	}
	if len(line) >= maxChunkLine || bytes.IndexByte(line, '\r') >= 0 {
		return 0, malformed(errChunkLine, line)
	}
	var size int64
	i := 0
	for ; i < len(line); i++ {
		d, ok := unhex(line[i])
		if !ok {
			break
		}
		// At most 16 digits, as net/http reads them, and a sane size.
		if size = size<<4 | int64(d); size > maxChunkSize || i >= 16 {
			return 0, malformed(errChunkTooLarge, line)
		}
	}
	if i == 0 {
		return 0, malformed(errChunkLine, line)
	}
	rest := trimOWS(line[i:])
	if len(rest) > 0 && rest[0] != ';' {
		return 0, malformed(errChunkLine, line)
	}
	if len(rest) > 0 && len(rest) < len(line[i:]) {
		b.lax |= laxChunkBWS // BWS before ';' (RFC 9112 §7.1.1)
	}
	return size, nil
}
