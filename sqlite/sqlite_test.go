package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/storetest"
	"github.com/tollgate/tollgate/sqlite"
)

// mustOpen opens a fresh database file in a temp dir, closed at cleanup.
func mustOpen(tb testing.TB, path string) *sqlite.DB {
	tb.Helper()
	if path == "" {
		path = filepath.Join(tb.TempDir(), "tollgate.db")
	}
	db, err := sqlite.Open(path)
	if err != nil {
		tb.Fatalf("sqlite.Open(%s): %v", path, err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Store { return mustOpen(t, "") })
}

func TestMigrateIsIdempotent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "dir", "t.db") // Open creates the directories
	db := mustOpen(t, path)
	applied, err := db.Migrate(t.Context())
	if err != nil || len(applied) != 0 {
		t.Fatalf("second Migrate: applied %v, %v; want nothing", applied, err)
	}
	v, err := db.SchemaVersion(t.Context())
	if want := lastMigration(t); err != nil || v != want {
		t.Errorf("SchemaVersion = %q, %v; want %s", v, err, want)
	}
	// Data survives a reopen.
	if err := db.CreateAccount(t.Context(), tollgate.Account{ID: "acct_x", Name: "x", Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	db2 := mustOpen(t, path)
	if _, err := db2.Account(t.Context(), "acct_x"); err != nil {
		t.Errorf("after reopen: %v", err)
	}
}

// lastMigration is the name of the newest file in migrations/.
func lastMigration(t *testing.T) string {
	t.Helper()
	files, err := filepath.Glob("migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("no migrations: %v", err)
	}
	return strings.TrimSuffix(filepath.Base(files[len(files)-1]), ".sql")
}

func TestPragmas(t *testing.T) {
	db := mustOpen(t, "")
	got := db.Pragmas(t.Context())
	// synchronous=NORMAL (1) with the store's own fdatasync of the WAL per
	// commit: as durable as FULL (walsync.go, TestWritesAreSynced).
	for k, want := range map[string]string{"journal_mode": "wal", "foreign_keys": "1", "busy_timeout": "10000", "synchronous": "1", "wal_sync": "fdatasync"} {
		if got[k] != want {
			t.Errorf("PRAGMA %s = %q, want %q", k, got[k], want)
		}
	}
}

// TestConcurrentWritersAcrossHandles is the "database is locked" test: several
// handles on one file (as `tollgate serve` and CLI processes would have),
// each writing from many goroutines at once. Every write must succeed and
// every count must arrive.
func TestConcurrentWritersAcrossHandles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shared.db")
	const handles, goroutines, writes = 3, 8, 40
	// The handles open the fresh file at once: Migrate reads schema_migrations
	// and then writes, the pattern that fails at once without BEGIN IMMEDIATE.
	dbs := make([]*sqlite.DB, handles)
	openErrs := make([]error, handles)
	var wgOpen sync.WaitGroup
	for i := range dbs {
		wgOpen.Add(1)
		go func() {
			defer wgOpen.Done()
			dbs[i], openErrs[i] = sqlite.Open(path)
		}()
	}
	wgOpen.Wait()
	for i, db := range dbs {
		if openErrs[i] != nil {
			t.Fatalf("concurrent Open %d: %v", i, openErrs[i])
		}
		t.Cleanup(func() { db.Close() })
	}
	hour := time.Date(2025, 1, 1, 10, 0, 0, 0, time.UTC)
	var wg sync.WaitGroup
	errs := make(chan error, handles*goroutines*writes)
	for i, db := range dbs {
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := context.Background()
				for w := range writes {
					if w%10 == 0 { // mix in a multi-statement transaction
						id := fmt.Sprintf("acct_%d_%d_%d", i, g, w)
						if err := db.CreateAccount(ctx, tollgate.Account{ID: id, Name: id, Created: hour}); err != nil {
							errs <- err
							continue
						}
						if err := db.SetAccountDisabled(ctx, id, true); err != nil {
							errs <- err
						}
						continue
					}
					if err := db.AddTraffic(ctx, []tollgate.TrafficCount{{Hour: hour, Class: tollgate.ClassNetwork, Requests: 1}}); err != nil {
						errs <- err
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	n := 0
	for err := range errs {
		if n++; n <= 5 {
			t.Errorf("concurrent write: %v", err)
		}
	}
	if n > 0 {
		t.Fatalf("%d writes failed", n)
	}
	net, _, err := dbs[0].Traffic(t.Context(), hour)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(handles * goroutines * writes * 9 / 10); net != want {
		t.Errorf("traffic after concurrent writes: %d, want %d", net, want)
	}
	accts, err := dbs[1].Accounts(t.Context())
	if err != nil || len(accts) != handles*goroutines*writes/10 {
		t.Errorf("accounts: %d, %v; want %d", len(accts), err, handles*goroutines*writes/10)
	}
}

func TestOpenRejectsBadPath(t *testing.T) {
	for _, p := range []string{"", "a?b.db"} {
		if db, err := sqlite.Open(p); err == nil {
			db.Close()
			t.Errorf("Open(%q): got nil error", p)
		}
	}
}

func TestAuditRunsBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tollgate.db")
	db := mustOpen(t, path)
	raw, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	storetest.AuditRunsBounded(t, db, func() (n int, err error) {
		return n, raw.QueryRowContext(t.Context(), `SELECT count(*) FROM audit_runs`).Scan(&n)
	})
}
