package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestEnv is the environment variable that holds the PostgreSQL URL for tests,
// e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable.
const TestEnv = "TOLLGATE_TEST_POSTGRES"

// OpenTest returns a migrated store in a schema of its own, for tests of any
// package: it creates schema t_<random> in the database named by
// $TOLLGATE_TEST_POSTGRES, points the pool's search_path at it, and drops the
// schema when the test ends, so parallel tests and parallel runs never see
// each other's rows. Without the variable it calls tb.Skip.
//
// Two handles on the same schema (two "instances") come from OpenTestSchema.
func OpenTest(tb testing.TB) *DB {
	tb.Helper()
	return OpenTestSchema(tb, NewTestSchema(tb))
}

// NewTestSchema creates a fresh schema for tb, dropped at cleanup, and
// returns its name. It skips tb without $TOLLGATE_TEST_POSTGRES.
func NewTestSchema(tb testing.TB) string {
	tb.Helper()
	url := os.Getenv(TestEnv)
	if url == "" {
		tb.Skip(TestEnv + " is not set; skipping a PostgreSQL test")
	}
	var b [8]byte
	rand.Read(b[:])
	schema := "t_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatalf("postgres: connect to %s: %v", TestEnv, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		tb.Fatalf("postgres: create schema %s: %v", schema, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			tb.Errorf("postgres: drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			tb.Errorf("postgres: drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// OpenTestSchema opens a migrated store whose search_path is schema (made by
// NewTestSchema) and closes it at cleanup. Each call is a separate pool, as a
// separate `tollgate serve` instance would have.
func OpenTestSchema(tb testing.TB, schema string) *DB {
	tb.Helper()
	cfg := TestConfig(tb, schema)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := OpenConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("postgres: open test store in schema %s: %v", schema, err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}

// TestConfig returns the pool configuration of $TOLLGATE_TEST_POSTGRES with
// search_path set to schema, for tests that call OpenConfig themselves.
func TestConfig(tb testing.TB, schema string) *pgxpool.Config {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(os.Getenv(TestEnv))
	if err != nil {
		tb.Fatalf("postgres: parse %s: %v", TestEnv, err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	return cfg
}
