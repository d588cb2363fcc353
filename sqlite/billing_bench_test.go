package sqlite

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
)

// BenchmarkCharges measures the store's share of a settled request on the
// hot path: batches of charges against one reservation (billing's group
// commit), each charge one ledger row, one commit per batch, durable as the
// store makes it (fdatasync of the WAL, the default), with SQLite's own
// synchronous=FULL (an fsync inside each commit), and with NORMAL (no sync).
// The ledger starts with 50,000 rows so that its indexes have a realistic
// depth. µs/charge is what one request costs the writer (CPU and sync wait;
// the writer is one goroutine).
//
//	go test -run '^$' -bench BenchmarkCharges -benchtime 2000x ./sqlite/
func BenchmarkCharges(b *testing.B) {
	for _, d := range []driver{
		{name: "sqlite", label: "fdatasync", synchronous: "NORMAL", syncWAL: true},
		{name: "sqlite", label: "FULL", synchronous: "FULL"},
		{name: "sqlite", label: "NORMAL", synchronous: "NORMAL"},
	} {
		for _, batch := range []int{1, 10, 32} {
			b.Run(fmt.Sprintf("sync=%s/batch=%d", d.label, batch), func(b *testing.B) {
				benchCharges(b, d, batch)
			})
		}
	}
}

func benchCharges(b *testing.B, d driver, batch int) {
	ctx := context.Background()
	db, err := open(ctx, d, filepath.Join(b.TempDir(), "bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	now := time.Now()
	acct := tollgate.Account{ID: tollgate.NewID("acct_"), Name: "b", Balance: tollgate.Dollars(1_000_000), Created: now}
	if err := db.CreateAccount(ctx, acct); err != nil {
		b.Fatal(err)
	}
	key := tollgate.Key{ID: tollgate.NewID("key_"), AccountID: acct.ID, Prefix: "sk-tg-bench", Created: now}
	if err := db.CreateKey(ctx, key, tollgate.HashKey(tollgate.NewKeySecret())); err != nil {
		b.Fatal(err)
	}
	rsv := tollgate.NewID("rsv_")
	reserve := &tollgate.BillingOp{Kind: tollgate.OpReserve, Reservation: rsv, Need: tollgate.Dollars(100_000),
		MinFree: 1, Fraction: 1, Create: true, Hold: tollgate.Hold{ID: rsv, AccountID: acct.ID, KeyID: key.ID,
			Owner: "inst_bench", Created: now, Expires: now.Add(time.Hour), Amount: tollgate.Dollars(100_000)}}
	if err := db.ApplyBilling(ctx, []*tollgate.BillingOp{reserve}); err != nil || reserve.Outcome != tollgate.HoldOK {
		b.Fatalf("reserve: %v, outcome %d", err, reserve.Outcome)
	}
	// Request ids as the server makes them: a per-process prefix and a counter.
	n := 0
	charge := func() *tollgate.BillingOp {
		n++
		cost := tollgate.Amount(123_456_789)
		return &tollgate.BillingOp{Kind: tollgate.OpCharge, HoldID: holdID(n), Reservation: rsv, Covered: cost,
			Charge: tollgate.Charge{RequestID: "req_0123456789ab" + strconv.FormatInt(int64(n), 36), AccountID: acct.ID, KeyID: key.ID,
				Model: "bench", Class: tollgate.ClassNetwork, Node: "node-1", PromptTokens: 20, CompletionTokens: 16,
				Prices: tollgate.Prices{Input: 300_000, Output: 1_200_000}, Cost: cost, Time: time.Now()}}
	}
	ops := make([]*tollgate.BillingOp, 0, 500)
	for range 100 {
		ops = ops[:0]
		for range 500 {
			ops = append(ops, charge())
		}
		if err := db.ApplyBilling(ctx, ops); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	cpu0 := cpuTime()
	for b.Loop() {
		ops = ops[:0]
		for range batch {
			ops = append(ops, charge())
		}
		if err := db.ApplyBilling(ctx, ops); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*batch), "µs/charge")
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N*batch), "cpu-µs/charge")
}

// holdID makes the charges' hold ids as billing does: in time order.
func holdID(int) string { return tollgate.NewOrderedID("hold_", time.Now()) }
