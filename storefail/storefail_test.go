package storefail_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "modernc.org/sqlite"

	"github.com/tollgate/tollgate/storefail"
)

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestPostgresConnectionRefusedIsUnavailable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := pgx.Connect(ctx, "postgres://postgres@"+closedPort(t)+"/test?sslmode=disable&connect_timeout=2")
	if err == nil {
		t.Fatal("connected to a closed port")
	}
	if !storefail.Unavailable(err) {
		t.Fatalf("connection refused not classified unavailable: %T %v", err, err)
	}
	w := storefail.Wrap("test.connect", fmt.Errorf("open: %w", err))
	if op, ok := storefail.Op(w); !ok || op != "test.connect" {
		t.Fatalf("Op = %q, %v", op, ok)
	}
	// Wrapping again keeps the innermost name.
	if op, _ := storefail.Op(storefail.Wrap("outer", w)); op != "test.connect" {
		t.Fatalf("re-wrapped Op = %q", op)
	}
}

// TestPostgresAnswers checks real server answers: a session terminated by
// the server (admin_shutdown, what a fast shutdown sends) and a dead
// connection are outages; a constraint violation is not.
func TestPostgresAnswers(t *testing.T) {
	dsn := os.Getenv("TOLLGATE_TEST_POSTGRES")
	if dsn == "" {
		t.Skip("TOLLGATE_TEST_POSTGRES not set")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Exec(ctx, "CREATE TEMP TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1)")
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Exec(ctx, "INSERT INTO t VALUES (1)")
	if err == nil || storefail.Unavailable(err) {
		t.Fatalf("unique violation: err %v, unavailable %v", err, storefail.Unavailable(err))
	}
	_, err = c.Exec(ctx, "SELECT 1/0")
	if err == nil || storefail.Unavailable(err) {
		t.Fatalf("division by zero: err %v classified unavailable", err)
	}
	_, err = c.Exec(ctx, "SELECT pg_terminate_backend(pg_backend_pid())")
	if err == nil || !storefail.Unavailable(err) {
		t.Fatalf("terminated session: err %v not unavailable", err)
	}
	_, err = c.Exec(ctx, "SELECT 1")
	if err == nil || !storefail.Unavailable(err) {
		t.Fatalf("query on a dead connection: err %v not unavailable", err)
	}
	c.Close(ctx)
}

func TestSQLiteBusyIsUnavailable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	open := func(busyMS int) *sql.DB {
		db, err := sql.Open("sqlite", fmt.Sprintf("%s?_pragma=busy_timeout(%d)&_txlock=immediate", path, busyMS))
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(1)
		t.Cleanup(func() { db.Close() })
		return db
	}
	a, b := open(1000), open(50)
	if _, err := a.Exec("CREATE TABLE t (id INTEGER PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	tx, err := a.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec("INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	_, err = b.Exec("INSERT INTO t VALUES (2)")
	if err == nil || !storefail.Unavailable(err) {
		t.Fatalf("write while another holds the lock: err %v not unavailable", err)
	}
	tx.Commit()
	_, err = a.Exec("INSERT INTO t VALUES (1)")
	if err == nil || storefail.Unavailable(err) {
		t.Fatalf("constraint violation: err %v classified unavailable", err)
	}
}

func TestOtherErrorsAreNotUnavailable(t *testing.T) {
	for _, err := range []error{nil, errors.New("bug"), context.Canceled, fmt.Errorf("x: %w", context.Canceled)} {
		if storefail.Unavailable(err) {
			t.Errorf("%v classified unavailable", err)
		}
	}
	if !storefail.Unavailable(fmt.Errorf("query: %w", context.DeadlineExceeded)) {
		t.Error("a store call past its deadline is not unavailable")
	}
	if storefail.Wrap("x", nil) != nil {
		t.Error("Wrap(nil) != nil")
	}
	if _, ok := storefail.Op(storefail.Wrap("x", errors.New("bug"))); ok {
		t.Error("a bug wrapped as unavailable")
	}
}
