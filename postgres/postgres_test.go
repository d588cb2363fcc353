package postgres_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/storetest"
	"github.com/tollgate/tollgate/postgres"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) tollgate.Store { return postgres.OpenTest(t) })
}

// TestConcurrentStartup starts several "instances" on one empty schema at
// once: the advisory lock lets exactly one apply each migration.
func TestConcurrentStartup(t *testing.T) {
	schema := postgres.NewTestSchema(t)
	const n = 6
	dbs := make([]*postgres.DB, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		cfg := postgres.TestConfig(t, schema)
		wg.Add(1)
		go func() {
			defer wg.Done()
			dbs[i], errs[i] = postgres.OpenConfig(context.Background(), cfg)
		}()
	}
	wg.Wait()
	for i, db := range dbs {
		if errs[i] != nil {
			t.Fatalf("instance %d: %v", i, errs[i])
		}
		t.Cleanup(func() { db.Close() })
	}
	var count int
	if err := dbs[0].Pool().QueryRow(t.Context(), `SELECT count(*) FROM schema_migrations`).Scan(&count); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("no migrations: %v", err)
	}
	if count != len(files) {
		t.Errorf("schema_migrations has %d rows after %d concurrent starts, want %d (one per file)", count, n, len(files))
	}
	// All instances see one store.
	if err := dbs[1].CreateAccount(t.Context(), tollgate.Account{ID: "acct_1", Name: "x", Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := dbs[n-1].Account(t.Context(), "acct_1"); err != nil {
		t.Errorf("account created through one instance, read through another: %v", err)
	}
	v, err := dbs[2].SchemaVersion(context.Background())
	if want := strings.TrimSuffix(filepath.Base(files[len(files)-1]), ".sql"); err != nil || v != want {
		t.Errorf("SchemaVersion = %q, %v; want %s", v, err, want)
	}
}
