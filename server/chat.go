package server

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"net/http"
	"os"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/relay"
)

// chat is POST /v1/chat/completions: authenticate, check the body's type and
// size, then hand over to the relay.
func (s *Server) chat(w http.ResponseWriter, r *http.Request) error {
	var authSpan trace.Span
	if s.Tracer != nil {
		_, authSpan = s.Tracer.Start(r.Context(), "auth")
	}
	key, acct, err := s.Auth.Authenticate(r.Context(), r.Header.Get("Authorization"), s.Now())
	if authSpan != nil {
		if err != nil {
			authSpan.SetStatus(codes.Error, string(tollgate.ErrorCode(err)))
		}
		authSpan.End()
	}
	if err != nil {
		return err
	}
	ri := infoFrom(w)
	call := &relay.Call{Key: key, Account: acct}
	if ri != nil {
		call.RequestID = ri.id
		ri.call = call
	}
	if !isJSON(r.Header.Get("Content-Type")) {
		return tollgate.Errorf(tollgate.CodeUnsupportedMediaType, "Content-Type must be application/json")
	}
	buf := s.bodies.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= 1<<20 { // keep small buffers only
			buf.Reset()
			s.bodies.Put(buf)
		}
	}()
	buf.Reset()
	err = readBody(buf, r)
	if ri != nil && ri.bodyDeadline {
		// The body is in (or failed): from here on the connection is read
		// only to see the client go away.
		_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
		ri.bodyDeadline = false
	}
	if err != nil {
		// The answer goes at once and the connection closes after it
		// (linger.go).
		return err
	}
	call.Body = buf.Bytes()
	return s.serveChat(w, r, call)
}

// isJSON reports whether a Content-Type is application/json, with or without
// parameters. The exact value every client sends needs no parsing (the full
// parse builds a map of the parameters on every request).
func isJSON(ct string) bool {
	if ct == "application/json" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "application/json"
}

// readBody reads at most MaxBodyBytes. A larger body is 413 whether it came
// with a Content-Length or chunked.
func readBody(buf *bytes.Buffer, r *http.Request) error {
	tooLarge := func() error { // built only when needed: this runs on every request
		return tollgate.Errorf(tollgate.CodeRequestTooLarge,
			"request body is larger than %d bytes (8 MiB; about 6 MiB of file when inlined as base64)", MaxBodyBytes)
	}
	if r.ContentLength > MaxBodyBytes {
		return tooLarge()
	}
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength))
	}
	n, err := buf.ReadFrom(io.LimitReader(r.Body, MaxBodyBytes+1))
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return &tollgate.Error{Code: tollgate.CodeRequestTimeout, Err: err,
			Message: "the request body did not arrive in time (timeouts.request_body); send it whole, without pauses"}
	}
	if err != nil {
		return &tollgate.Error{Code: tollgate.CodeInvalidRequest, Message: "could not read the request body", Err: err}
	}
	if n > MaxBodyBytes {
		return tooLarge()
	}
	return nil
}
