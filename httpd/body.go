package httpd

import (
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"strings"
	"time"
)

// body is a request body: Content-Length bytes of the connection, or its
// chunked encoding decoded. It is read on the handler's goroutine only.
type body struct {
	c         *conn
	resp      *response
	remaining int64     // Content-Length bytes left; -1: chunked
	chunked   io.Reader // the decoder, for chunked bodies
	expect    bool      // Expect: 100-continue not answered yet
	sawEOF    bool
	err       error       // sticky
	closed    bool        // the handler returned
	trailer   http.Header // the request's declared trailer fields (chunked)
	onEOF     func()
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
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	if b.sawEOF {
		return 0, io.EOF
	}
	if b.err != nil {
		return 0, b.err
	}
	if b.expect {
		// The client waits for this before it sends the body (RFC 9110
		// 10.1.1); it is sent only when the handler wants the body.
		b.expect = false
		if b.resp == nil || !b.resp.committed {
			_, _ = b.c.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
			if err := b.c.bw.Flush(); err != nil {
				b.err = err
				return 0, err
			}
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
		if b.onEOF != nil {
			b.onEOF()
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
			return io.EOF
		}
		if b.trailer == nil {
			continue
		}
		k, v, ok := strings.Cut(string(line), ":")
		if !ok || !isToken(k) {
			continue
		}
		k = textproto.CanonicalMIMEHeaderKey(k)
		if _, declared := b.trailer[k]; declared {
			b.trailer[k] = append(b.trailer[k], strings.Trim(v, " \t"))
		}
	}
}

func (b *body) Close() error { return nil }

// discard reads what the handler left of the body, so that the connection
// can serve another request; false if that is not worth it or failed.
func (b *body) discard() bool {
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
	onEOF := b.onEOF
	b.onEOF = nil // the handler is done: nothing to watch
	n, _ := io.CopyN(io.Discard, b, maxDiscard+1)
	b.onEOF = onEOF
	return b.sawEOF && n <= maxDiscard
}
