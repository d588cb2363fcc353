package tollgate

import (
	"errors"
	"fmt"
)

// Code is a stable, documented error code (docs/api.md). Clients branch on it.
// The list is closed: every code the service can return is declared here and
// documented in docs/api.md. The http package maps each to its status.
type Code string

const (
	CodeInvalidJSON                      Code = "invalid_json"
	CodeInvalidRequest                   Code = "invalid_request"
	CodeCapabilityNotSupported           Code = "capability_not_supported"
	CodeCapabilityCombinationUnsupported Code = "capability_combination_unsupported"
	CodeInvalidIdempotencyKey            Code = "invalid_idempotency_key"
	CodeContextLengthExceeded            Code = "context_length_exceeded"
	CodeMissingAPIKey                    Code = "missing_api_key"
	CodeInvalidAPIKey                    Code = "invalid_api_key"
	CodeAPIKeyRevoked                    Code = "api_key_revoked"
	CodeAPIKeyExpired                    Code = "api_key_expired"
	CodeInsufficientBalance              Code = "insufficient_balance"
	CodeModelNotAllowed                  Code = "model_not_allowed"
	CodeKeyLimitReached                  Code = "key_limit_reached"
	CodeAccountDisabled                  Code = "account_disabled"
	CodeModelNotFound                    Code = "model_not_found"
	CodeNotFound                         Code = "not_found"
	CodeMethodNotAllowed                 Code = "method_not_allowed"
	CodeIdempotencyKeyInFlight           Code = "idempotency_key_in_flight"
	CodeRequestTooLarge                  Code = "request_too_large"
	CodeUnsupportedMediaType             Code = "unsupported_media_type"
	CodeIdempotencyKeyReused             Code = "idempotency_key_reused"
	CodeIdempotencyResponseLost          Code = "idempotency_response_lost" // the key's request was charged, its answer lost
	CodeRateLimitExceeded                Code = "rate_limit_exceeded"
	CodeUpstreamError                    Code = "upstream_error"
	CodeBackendUnavailable               Code = "backend_unavailable"
	CodeStoreUnavailable                 Code = "store_unavailable"  // the database cannot be reached: an outage, not a bug
	CodeSearchUnavailable                Code = "search_unavailable" // the web search provider failed or timed out
	CodeTimeout                          Code = "timeout"
	CodeRequestTimeout                   Code = "request_timeout" // the client took too long to send its request body
	CodeInternal                         Code = "internal_error"
	CodeUnauthorized                     Code = "unauthorized" // admin API: missing or wrong admin token
	CodeConflict                         Code = "conflict"     // admin API: the change conflicts with stored state
)

// Error is the one error type that reaches clients. Handlers return it (or
// wrap it); the http package turns it into the protocol's error envelope.
type Error struct {
	Code    Code
	Message string
	Param   string // the request field at fault, or ""
	// RetryAfter, when > 0, is sent as Retry-After (seconds).
	RetryAfter int
	// Err is the underlying cause, logged but never shown to the client.
	Err error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.Err)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf builds an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ParamErrorf builds an *Error naming the request field at fault.
func ParamErrorf(code Code, param, format string, args ...any) *Error {
	return &Error{Code: code, Param: param, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of err if it is (or wraps) an *Error, else
// CodeInternal.
func ErrorCode(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// ErrNotFound is returned by stores when a record does not exist.
var ErrNotFound = errors.New("not found")
