package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/storefail"
)

// WriteError answers a store that cannot be reached as an outage (503
// store_unavailable, Retry-After, the request id, a log line naming the
// call) and anything else that is not a *tollgate.Error as a bug.
func TestWriteErrorOutageAndBug(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, c := range []struct {
		name       string
		err        error
		status     int
		code, op   string
		retryAfter string
	}{
		{"named store call", fmt.Errorf("hold for r: %w", storefail.Wrap("billing_hold", refused)), 503, "store_unavailable", "billing_hold", "2"},
		{"unnamed refused connection", fmt.Errorf("query: %w", refused), 503, "store_unavailable", "unnamed", "2"},
		{"authentication", &tollgate.Error{Code: tollgate.CodeStoreUnavailable, Message: "Authentication is temporarily unavailable.",
			Err: storefail.Wrap("auth_key", refused)}, 503, "store_unavailable", "auth_key", "2"},
		{"a bug", errors.New("nil map"), 500, "internal_error", "", ""},
		{"a backend's refused connection", &tollgate.Error{Code: tollgate.CodeUpstreamError, Message: "the backend refused the connection", Err: refused},
			502, "upstream_error", "", ""},
		{"internal, caused by an outage", &tollgate.Error{Code: tollgate.CodeInternal, Message: "pricing is unavailable right now",
			Err: storefail.Wrap("pricing", refused)}, 503, "store_unavailable", "pricing", "2"},
		{"a constraint", storefail.Wrap("billing_hold", errors.New("ERROR: duplicate key (SQLSTATE 23505)")), 500, "internal_error", "", ""},
		{"internal with a message", &tollgate.Error{Code: tollgate.CodeInternal, Message: "pricing is unavailable right now"}, 500, "internal_error", "", ""},
	} {
		var logs bytes.Buffer
		w := httptest.NewRecorder()
		w.Header().Set("X-Request-Id", "req_test1")
		WriteError(w, slog.New(slog.NewJSONHandler(&logs, nil)), c.err)
		var e struct {
			Error struct{ Code, Message, Type string }
		}
		if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if w.Code != c.status || e.Error.Code != c.code || w.Header().Get("Retry-After") != c.retryAfter {
			t.Errorf("%s: %d %s Retry-After %q", c.name, w.Code, w.Body, w.Header().Get("Retry-After"))
		}
		if c.code != "upstream_error" && !strings.Contains(e.Error.Message, "req_test1") {
			t.Errorf("%s: no request id in %q", c.name, e.Error.Message)
		}
		if c.op != "" && !strings.Contains(logs.String(), `"operation":"`+c.op+`"`) {
			t.Errorf("%s: log does not name %s: %s", c.name, c.op, logs.String())
		}
		if c.status == 503 && strings.Contains(logs.String(), "internal error") {
			t.Errorf("%s: logged as a bug: %s", c.name, logs.String())
		}
	}
}
