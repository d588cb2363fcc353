package server

import (
	"net/http"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/idempotency"
	"github.com/tollgate/tollgate/relay"
)

// serveChat hands an authenticated call with its body to the relay, through
// the Idempotency-Key keeper when the request carries the header (a
// non-streamed request then runs at most once per key; docs/idempotency.md).
// Without the header this is one map lookup more than calling the relay.
func (s *Server) serveChat(w http.ResponseWriter, r *http.Request, call *relay.Call) error {
	values, ok := r.Header["Idempotency-Key"]
	if !ok || s.Idempotency == nil {
		return s.Relay.ServeChat(w, r, call)
	}
	if len(values) != 1 {
		if idempotency.Streamed(call.Body) {
			return s.Relay.ServeChat(w, r, call) // streams ignore the header
		}
		return tollgate.Errorf(tollgate.CodeInvalidIdempotencyKey, "send one Idempotency-Key header, not %d", len(values))
	}
	out, err := s.Idempotency.Serve(r.Context(), w,
		idempotency.Request{Scope: call.Account.ID, Key: values[0], Body: call.Body, ID: call.RequestID},
		func(w http.ResponseWriter) error { return s.Relay.ServeChat(w, r, call) })
	if out == idempotency.Replayed {
		call.Outcome = "replayed"
	}
	return err
}
