package server

import (
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/openai"
	"github.com/tollgate/tollgate/storefail"
)

// StatusOf is the one place where an error code becomes an HTTP status
// (the console answers with it too).
func StatusOf(c tollgate.Code) int {
	switch c {
	case tollgate.CodeInvalidJSON, tollgate.CodeInvalidRequest, tollgate.CodeCapabilityNotSupported,
		tollgate.CodeCapabilityCombinationUnsupported, tollgate.CodeInvalidIdempotencyKey,
		tollgate.CodeContextLengthExceeded:
		return http.StatusBadRequest
	case tollgate.CodeMissingAPIKey, tollgate.CodeInvalidAPIKey, tollgate.CodeAPIKeyRevoked,
		tollgate.CodeAPIKeyExpired, tollgate.CodeUnauthorized:
		return http.StatusUnauthorized
	case tollgate.CodeInsufficientBalance:
		return http.StatusPaymentRequired
	case tollgate.CodeModelNotAllowed, tollgate.CodeKeyLimitReached, tollgate.CodeAccountDisabled:
		return http.StatusForbidden
	case tollgate.CodeModelNotFound, tollgate.CodeNotFound:
		return http.StatusNotFound
	case tollgate.CodeMethodNotAllowed:
		return http.StatusMethodNotAllowed
	case tollgate.CodeIdempotencyKeyInFlight, tollgate.CodeConflict:
		return http.StatusConflict
	case tollgate.CodeRequestTooLarge:
		return http.StatusRequestEntityTooLarge
	case tollgate.CodeUnsupportedMediaType:
		return http.StatusUnsupportedMediaType
	case tollgate.CodeIdempotencyKeyReused:
		return http.StatusUnprocessableEntity
	case tollgate.CodeIdempotencyResponseLost:
		return http.StatusGone
	case tollgate.CodeRateLimitExceeded:
		return http.StatusTooManyRequests
	case tollgate.CodeUpstreamError, tollgate.CodeSearchUnavailable:
		return http.StatusBadGateway
	case tollgate.CodeBackendUnavailable, tollgate.CodeStoreUnavailable:
		return http.StatusServiceUnavailable
	case tollgate.CodeTimeout:
		return http.StatusGatewayTimeout
	case tollgate.CodeRequestTimeout:
		return http.StatusRequestTimeout
	}
	return http.StatusInternalServerError
}

// WriteError writes the protocol's error envelope for err, with the status
// its code maps to; every listener (API, public, admin) answers errors
// through it. Errors that are not *tollgate.Error are bugs: the client gets
// internal_error with the request id, the log gets the cause.
//
// A store that could not be reached (storefail.Unavailable: the database is
// down or restarting) is an outage, not a bug: 503 store_unavailable with
// Retry-After, whatever call met it (authentication, a hold, an
// Idempotency-Key, a settle), and a log line naming that call.
func WriteError(w http.ResponseWriter, log *slog.Logger, err error) {
	var e *tollgate.Error
	id := w.Header().Get("X-Request-Id")
	coded := errors.As(err, &e)
	if outage(err, e) {
		op, ok := storefail.Op(err)
		if !ok {
			op = "unnamed"
		}
		log.Warn("store unavailable", "request_id", id, "operation", op, "err", err)
		msg := "the service's database cannot be reached right now; retry in a moment"
		if coded && e.Code == tollgate.CodeStoreUnavailable {
			msg = strings.TrimSuffix(e.Message, ".")
		}
		e = &tollgate.Error{Code: tollgate.CodeStoreUnavailable, RetryAfter: storefail.RetryAfter,
			Message: msg + " (request id " + id + ")"}
	} else if !coded {
		log.Error("internal error", "request_id", id, "err", err)
		e = &tollgate.Error{Code: tollgate.CodeInternal, Message: "internal error; quote request id " + id + " when reporting it"}
	} else if e.Code == tollgate.CodeInternal && id != "" && !strings.Contains(e.Message, id) {
		log.Error("internal error", "request_id", id, "err", err)
		e = &tollgate.Error{Code: tollgate.CodeInternal, Message: strings.TrimSuffix(e.Message, ".") + " (request id " + id + ")"}
	}
	status := StatusOf(e.Code)
	if ri := infoFrom(w); ri != nil {
		ri.code = e.Code
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	switch e.Code {
	case tollgate.CodeInsufficientBalance, tollgate.CodeKeyLimitReached, tollgate.CodeIdempotencyResponseLost:
		// A retry can only fail the same way until the account changes
		// (or, for a lost answer, ever under this key).
		h.Set("X-Should-Retry", "false")
	}
	body := openai.ErrorEvent(e)
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// outage reports whether err (whose first *tollgate.Error is e, or nil) is
// a store that could not be reached. An error that has a code of its own
// keeps it (a backend's refused connection is upstream_error, not an
// outage of the store); one coded internal_error, or none, is an outage
// when a store call named it so (storefail.Wrap) or its cause says so.
func outage(err error, e *tollgate.Error) bool {
	if e != nil && e.Code == tollgate.CodeStoreUnavailable {
		return true
	}
	if e != nil && e.Code != tollgate.CodeInternal {
		return false
	}
	_, named := storefail.Op(err)
	return named || storefail.Unavailable(err)
}

// HTTPErrorBody renders the HTTP server's own answers to requests it could
// not read (a malformed request line or header, headers too large, an
// unsupported Transfer-Encoding; EnvelopeListener) in the protocol's
// error envelope, so that every answer of the service has an error.code.
func HTTPErrorBody(status int, message string) (contentType string, body []byte) {
	code := tollgate.CodeInvalidRequest
	switch {
	case status == http.StatusRequestEntityTooLarge || status == http.StatusRequestHeaderFieldsTooLarge:
		code = tollgate.CodeRequestTooLarge
	case status == http.StatusInternalServerError:
		code = tollgate.CodeInternal
	}
	return "application/json", append(openai.ErrorEvent(&tollgate.Error{Code: code, Message: message}), '\n')
}
