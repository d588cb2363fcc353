// Package storefail tells a store that cannot be reached (the database is
// down, restarting, refusing connections, or too slow to answer) from a store
// that answered with an error (a constraint, a bug). The first is an outage:
// clients get 503 store_unavailable with Retry-After (docs/api.md); the
// second stays 500 internal_error.
//
// Callers name the store call when they wrap its error (Wrap), so the log
// line says which call failed, and every failed call is counted by
// operation for the metrics (Counts).
package storefail

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// Error is a store call that failed because the store could not be reached.
type Error struct {
	// Op names the call: "auth_key", "billing_hold", "billing_settle",
	// "idempotency_begin", ...
	Op  string
	Err error
}

func (e *Error) Error() string { return "store unavailable: " + e.Op + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// RetryAfter is the Retry-After (seconds) of an answer during an outage: a
// database restart takes a second or a few, and clients should come back
// soon rather than pile up retries at once.
const RetryAfter = 2

// Wrap names the store call op in err and counts it. It returns nil for nil;
// an *Error when the store could not be reached (Unavailable); otherwise err
// prefixed with op. An error already wrapped is returned as it is, so the
// innermost name wins.
func Wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	unavailable := Unavailable(err)
	count(op, unavailable)
	if unavailable {
		return &Error{Op: op, Err: err}
	}
	return fmt.Errorf("%s: %w", op, err)
}

// Op returns the name of the store call that could not reach the store, and
// whether err is such a failure.
func Op(err error) (string, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e.Op, true
	}
	return "", false
}

// Unavailable reports whether err says the store could not be reached or did
// not answer in time, as opposed to an answer that is an error:
//   - PostgreSQL's connection exceptions (class 08), admin_shutdown,
//     crash_shutdown and cannot_connect_now (57P01–57P03: a server
//     stopping, crashed or starting) and too_many_connections (53300);
//   - a connection that could not be made (pgconn.ConnectError), that was
//     closed, or that timed out (pgconn.Timeout, a context deadline);
//   - network errors: refused, reset, broken pipe, an unexpected EOF;
//   - SQLite busy or locked beyond its busy timeout, an I/O error, a full
//     disk or a file that cannot be opened.
//
// A cancelled context (the client went away) is not an outage, nor is any
// other error: a constraint violation or a bug stays internal_error.
func Unavailable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case len(pe.Code) == 5 && pe.Code[:2] == "08",
			pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03", pe.Code == "53300":
			return true
		}
		return false
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true
	}
	if pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, pgconn.ErrConnClosed) {
		return true
	}
	var sc interface{ Code() int }
	if errors.As(err, &sc) {
		switch sc.Code() & 0xff {
		case sqliteBusy, sqliteLocked, sqliteIOErr, sqliteFull, sqliteCantOpen:
			return true
		}
	}
	for _, e := range []error{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE,
		syscall.ETIMEDOUT, syscall.EHOSTUNREACH, syscall.ENETUNREACH, io.ErrUnexpectedEOF, net.ErrClosed} {
		if errors.Is(err, e) {
			return true
		}
	}
	var ne net.Error
	return errors.As(err, &ne)
}

// SQLite's primary result codes (sqlite3.h) that mean the file cannot be
// written now rather than that the statement is wrong.
const (
	sqliteBusy     = 5
	sqliteLocked   = 6
	sqliteIOErr    = 10
	sqliteFull     = 13
	sqliteCantOpen = 14
)

// Count is the number of failed calls of one operation since the process
// started; Unavailable of them could not reach the store.
type Count struct {
	Op                  string
	Failed, Unavailable int64
}

type counter struct{ failed, unavailable atomic.Int64 }

var counts sync.Map // op → *counter

func count(op string, unavailable bool) {
	c, ok := counts.Load(op)
	if !ok {
		c, _ = counts.LoadOrStore(op, new(counter))
	}
	cc := c.(*counter)
	cc.failed.Add(1)
	if unavailable {
		cc.unavailable.Add(1)
	}
}

// Counts returns the failed store calls by operation, sorted by name.
func Counts() []Count {
	var out []Count
	counts.Range(func(k, v any) bool {
		c := v.(*counter)
		out = append(out, Count{Op: k.(string), Failed: c.failed.Load(), Unavailable: c.unavailable.Load()})
		return true
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Op < out[j].Op })
	return out
}
