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
	storetest.Run(t, func(t *testing.T) storetest.Store { return postgres.OpenTest(t) })
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

// During a rolling upgrade to migration 0006 (search fees), instances of the
// previous version keep calling tollgate_settle and tollgate_charge with
// their old arguments: those still work, and write charges with no search
// (docs/store.md, "Upgrades").
func TestPreviousVersionSettlesAfterSearchFees(t *testing.T) {
	db := postgres.OpenTest(t)
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Microsecond)
	a := tollgate.Account{ID: tollgate.NewID("acct_"), Name: "upgrade", Created: now, Balance: tollgate.Dollars(1)}
	if err := db.CreateAccount(ctx, a); err != nil {
		t.Fatal(err)
	}
	k := tollgate.Key{ID: tollgate.NewID("key_"), AccountID: a.ID, Name: "k", Prefix: "sk-tg-abcd", Created: now}
	if err := db.CreateKey(ctx, k, tollgate.HashKey(tollgate.NewKeySecret())); err != nil {
		t.Fatal(err)
	}
	hold := &tollgate.BillingOp{Kind: tollgate.OpHold, Hold: tollgate.Hold{ID: tollgate.NewID("hold_"), RequestID: "req_old",
		AccountID: a.ID, KeyID: k.ID, Model: "m", Class: tollgate.ClassNetwork, Amount: tollgate.MustParseAmount("0.1"),
		Owner: "inst_old", Created: now, Expires: now.Add(time.Minute)}}
	if err := db.ApplyBilling(ctx, []*tollgate.BillingOp{hold}); err != nil || hold.Outcome != tollgate.HoldOK {
		t.Fatalf("hold: %v, outcome %d", err, hold.Outcome)
	}
	var charged int64
	// The previous version's call, argument for argument.
	err := db.Pool().QueryRow(ctx, `SELECT charged FROM tollgate_settle($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)`,
		hold.Hold.ID, "req_old", a.ID, k.ID, "m", "network", "gpu-1", int64(10), int64(5), int64(0), int64(0),
		int64(300000), int64(1200000), int64(9000000), false, now).Scan(&charged)
	if err != nil || charged != 9000000 {
		t.Fatalf("old tollgate_settle: charged %d, %v", charged, err)
	}
	e, err := db.LedgerEntry(ctx, "req_old")
	if err != nil || e.Charge.Searches != 0 || e.Charge.SearchPrice != 0 || e.Charge.Cost != 9000000 {
		t.Fatalf("a charge of the previous version: %+v, %v", e.Charge, err)
	}
	// And the old reservation charge.
	err = db.Pool().QueryRow(ctx, `SELECT charged FROM tollgate_charge($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)`,
		"hold_gone", "rsv_gone", "req_old2", a.ID, k.ID, "m", "network", "gpu-1", int64(10), int64(5), int64(0), int64(0),
		int64(300000), int64(1200000), int64(9000000), int64(0), int64(0), false, now).Scan(&charged)
	if err != nil || charged != 9000000 {
		t.Fatalf("old tollgate_charge: charged %d, %v", charged, err)
	}
	if e, err := db.LedgerEntry(ctx, "req_old2"); err != nil || e.Charge.Searches != 0 {
		t.Fatalf("a reservation charge of the previous version: %+v, %v", e.Charge, err)
	}
}

func TestAuditRunsBounded(t *testing.T) {
	db := postgres.OpenTest(t)
	storetest.AuditRunsBounded(t, db, func() (n int, err error) {
		return n, db.Pool().QueryRow(t.Context(), `SELECT count(*) FROM audit_runs`).Scan(&n)
	})
}
