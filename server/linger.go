package server

import (
	"context"
	"io"
	"net/http"
	"time"
)

// Early answers: a handler may answer before it has read the request body
// (401 before the body of a request without a valid key, 413 as soon as
// the body is over the limit, 408 when it stopped arriving). net/http on
// its own then reads up to 256 KiB more of the body before it sends the
// answer, so a client that trickles its body gets nothing for as long as it
// trickles; and it closes the connection with the rest of the body unread,
// so the kernel resets it and a client that writes its whole body before it
// reads (Python's http.client and httpx) sees a broken pipe instead of the
// answer. Mature servers answer at once and then read and discard what the
// client is still sending before they close (nginx's lingering close).
//
// Here: an answer begun before the body was read to its end carries
// `Connection: close`, which keeps net/http from reading the body first;
// once the handler returns, the answer is flushed, and the rest of the body
// is read and discarded, at most lingerBytes of it and no later than the
// body's own deadline (timeouts.request_body from the end of the headers),
// nor past the start of a shutdown; then the connection closes.

// lingerBytes bounds what is discarded after an early answer: twice the
// body limit, so that a client that sent up to 16 MiB more than it may
// still reads its 413. A declared body larger than that is not read at all.
const lingerBytes = 2 * MaxBodyBytes

// lingerTime bounds the discarding when no body timeout is set (nginx's
// lingering_time).
const lingerTime = 30 * time.Second

// bodyWatch wraps a request body to learn whether the handler read it to
// its end, and how much of it.
type bodyWatch struct {
	rc   io.ReadCloser
	read int64
	eof  bool
}

func (b *bodyWatch) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	b.read += int64(n)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *bodyWatch) Close() error { return b.rc.Close() }

// watchBody puts w's body watch on r's body, for a request with a body on
// HTTP/1 (HTTP/2 ends an unread body with a stream reset, and the
// connection lives on).
func (w *statusWriter) watchBody(r *http.Request) {
	if r.ContentLength == 0 || r.Body == nil || r.Body == http.NoBody || r.ProtoMajor != 1 {
		return
	}
	w.body.rc = r.Body
	r.Body = &w.body
}

// early reports whether the answer is written before the body was read to
// its end.
func (w *statusWriter) early() bool { return w.body.rc != nil && !w.body.eof }

// closeIfEarly marks an answer about to be written before the body was
// read as the connection's last: net/http then sends it at once instead of
// reading the body first.
func (w *statusWriter) closeIfEarly() {
	if w.status == 0 && w.early() {
		w.Header()["Connection"] = connectionClose
	}
}

var connectionClose = []string{"close"}

// linger reads and discards the rest of the body of an early answer, once
// that is flushed, within the bounds above; net/http closes the connection
// after.
// w is net/http's own writer (the middleware's is unwrapped already).
func (s *Server) linger(w http.ResponseWriter, sw *statusWriter, r *http.Request, start time.Time) {
	rc := http.NewResponseController(w)
	b := &sw.body
	stop := func() { _ = rc.SetReadDeadline(time.Now()) }
	if r.ContentLength > 0 && r.ContentLength-b.read > lingerBytes ||
		// The client waits for a 100 Continue before it sends the body:
		// reading would ask it for the body just refused.
		b.read == 0 && r.Header.Get("Expect") != "" ||
		s.drainContext().Err() != nil {
		stop()
		return
	}
	deadline := start.Add(s.BodyTimeout)
	if s.BodyTimeout <= 0 {
		deadline = time.Now().Add(lingerTime)
	}
	_ = rc.SetReadDeadline(deadline)
	// A shutdown does not wait for a client still sending what was refused.
	cancel := context.AfterFunc(s.drainContext(), stop)
	_, _ = io.CopyN(io.Discard, b.rc, lingerBytes)
	cancel()
	// Whatever is left stays unread: net/http would read more when it
	// closes the body.
	stop()
}

// drainContext is cancelled when the shutdown begins (SetDraining).
func (s *Server) drainContext() context.Context {
	s.drainOnce.Do(func() { s.drainCtx, s.drainStop = context.WithCancel(context.Background()) })
	return s.drainCtx
}
