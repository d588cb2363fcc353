package httpd

import (
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"sync"
	"time"
)

// body is a request body: Content-Length bytes of the connection, or its
// chunked encoding decoded. A handler may hand it to another goroutine (a
// proxy does), so reads hold mu, and the connection closes it under mu
// when the handler returns: after that nobody but the connection reads it.
type body struct {
	c         *conn
	resp      *response
	mu        sync.Mutex
	remaining int64     // Content-Length bytes left; -1: chunked
	chunked   io.Reader // the decoder, for chunked bodies
	expect    bool      // Expect: 100-continue not answered yet
	sawEOF    bool
	err       error       // sticky
	closed    bool        // the handler returned
	trailer   http.Header // the request's declared trailer fields (chunked)
	armOnEOF  bool        // arm the connection's watcher at the end of the body
}

var errBodyTruncated = errors.New("httpd: request body ended early")

func newBody(c *conn, length int64) *body {
	b := &body{c: c, remaining: length}
	if length < 0 {
		b.chunked = httputil.NewChunkedReader(c.br)
	}
	return b
}

func (b *body) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	// The client may stall its body no longer than BodyIdleTimeout (a
	// slow-loris body would hold the connection and its handler forever),
	// unless the handler set a read deadline of its own.
	if b.resp == nil || !b.resp.readDeadline {
		b.c.src.bodyIdle = b.c.s.bodyIdleTimeout()
		defer func() { b.c.src.bodyIdle = 0 }()
	}
	return b.readLocked(p)
}

// close ends the handler's use of the body; from then on nothing arms the
// watcher. A read still blocked on another goroutine (one the handler left
// behind) is interrupted, and the body fails: the connection then closes.
func (b *body) close() {
	if !b.mu.TryLock() {
		for {
			_ = b.c.nc.SetReadDeadline(aLongTimeAgo)
			if b.mu.TryLock() {
				break
			}
			time.Sleep(time.Millisecond)
		}
		_ = b.c.nc.SetReadDeadline(time.Time{})
		if !b.sawEOF && b.err == nil {
			b.err = errBodyTruncated
		}
	}
	b.closed = true
	b.armOnEOF = false
	b.mu.Unlock()
}

func (b *body) readLocked(p []byte) (int, error) {
	if b.sawEOF {
		return 0, io.EOF
	}
	if b.err != nil {
		return 0, b.err
	}
	if b.expect {
		// The client waits for this before it sends the body (RFC 9110
		// 10.1.1); it is sent only when the handler wants the body, and
		// not once the final response has started.
		b.expect = false
		if err := b.c.writeContinue(b.resp); err != nil {
			b.err = err
			return 0, err
		}
	}
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var err error
	if b.chunked != nil {
		n, err = b.chunked.Read(p)
		if err == io.EOF {
			err = b.readTrailer()
		}
	} else {
		if int64(len(p)) > b.remaining {
			p = p[:b.remaining]
		}
		n, err = b.c.br.Read(p)
		b.remaining -= int64(n)
		if b.remaining == 0 {
			err = io.EOF
		} else if err == io.EOF {
			err = errBodyTruncated
		}
	}
	if err == io.EOF {
		b.sawEOF = true
		if b.armOnEOF {
			b.c.arm()
		}
	} else if err != nil {
		b.err = err
	}
	return n, err
}

// readTrailer reads the trailer section after the last chunk up to its
// empty line, and returns io.EOF. Fields the request declared in its
// Trailer header go to r.Trailer; others are dropped (RFC 9110 6.5.1).
func (b *body) readTrailer() error {
	c := b.c
	c.head = c.head[:0]
	for {
		line, err := c.readLine(c.s.maxHeaderBytes())
		if err != nil {
			if err == io.EOF {
				return errBodyTruncated
			}
			return err
		}
		if len(line) == 0 {
			c.shrinkHead()
			return io.EOF
		}
		// A trailer line is a header line: anything else ends the body in
		// error (and the connection), so that the end of a chunked body
		// is never read more leniently than a request head.
		k, v, ferr := parseField(string(line))
		if ferr != nil {
			return errBadTrailer
		}
		if _, declared := b.trailer[k]; declared {
			b.trailer[k] = append(b.trailer[k], v)
		}
	}
}

var errBadTrailer = errors.New("httpd: malformed trailer field in a chunked body")

func (b *body) Close() error { return nil }

// discard reads what the handler left of the body (after close), so that
// the connection can serve another request; false if that is not worth it
// or failed.
func (b *body) discard() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sawEOF {
		return true
	}
	if b.err != nil || b.expect || b.remaining > maxDiscard {
		// The client has not sent the body (it waits for 100 Continue),
		// or it is too large to read for nothing: close instead.
		return false
	}
	_ = b.c.nc.SetReadDeadline(time.Now().Add(b.c.s.readHeaderTimeout()))
	defer b.c.nc.SetReadDeadline(time.Time{})
	n, _ := io.CopyN(io.Discard, readerFunc(b.readLocked), maxDiscard+1)
	return b.sawEOF && n <= maxDiscard
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }
