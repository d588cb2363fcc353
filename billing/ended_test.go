package billing_test

import (
	"context"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/storefail"
)

// TestHoldOfAnEndedRequestIsMarkedAndNotRenewed: two requests end while
// the database is away, one whose settle could be neither written nor kept
// (its cost is above its hold) and one whose charge is kept in the journal;
// a third is still running. When the database answers again but still
// refuses the kept charge, CatchUp marks both holds ended in the store,
// releases the first; the second stays, marked, and is not renewed with the
// running request's hold. The audit lists it once its mark is older than
// the grace, not before; any sweep releases it one Sweep after its mark; its
// charge goes in (from the free balance) once the database takes it.
func TestHoldOfAnEndedRequestIsMarkedAndNotRenewed(t *testing.T) {
	db, g, dir, a, k := journalSetup(t, true, true)
	g.away.Store(true)
	var clock atomic.Pointer[time.Time]
	set := func(t time.Time) { t = t.Truncate(time.Microsecond); clock.Store(&t) }
	now := func() time.Time { return *clock.Load() }
	set(time.Now().UTC())
	b, err := billing.Open(g, billing.Options{NoReserve: true, Journal: dir, Lease: time.Hour, Sweep: time.Minute, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	failed, c1 := holdAndCharge(t, b, a, k)
	kept, c2 := holdAndCharge(t, b, a, k)
	running, _ := holdAndCharge(t, b, a, k)
	written := now()

	c1.Cost = tollgate.MustParseAmount("0.02") // above its hold: not kept in the journal
	if _, err := b.Settle(ctx, failed, c1); err == nil {
		t.Fatal("a settle that could be neither written nor kept succeeded")
	} else if _, outage := storefail.Op(err); !outage {
		t.Fatalf("settle while the database is away: %v, want store_unavailable", err)
	}
	if got, err := b.Settle(ctx, kept, c2); err != nil || got != c2.Cost {
		t.Fatalf("journaled settle: %s, %v", got, err)
	}
	b.Wait() // its batch failed: kept for the retry
	if _, done := b.CatchUp(ctx); done {
		t.Fatal("CatchUp while the database is away reports nothing kept")
	}
	for _, h := range holdsOf(t, g, a) {
		if !h.Ended.IsZero() {
			t.Errorf("hold %s marked ended while the database is away", h.ID)
		}
	}

	// The database answers, but still refuses the kept charge.
	g.away.Store(false)
	set(now().Add(time.Second))
	mark := now()
	if n, done := b.CatchUp(ctx); n != 1 || done {
		t.Fatalf("CatchUp = %d, %v; want the failed settle's hold released and the kept charge still kept", n, done)
	}
	hs := holdsOf(t, g, a)
	if len(hs) != 2 {
		t.Fatalf("holds %+v: want the kept charge's and the running request's", hs)
	}
	for _, h := range hs {
		switch h.ID {
		case kept:
			if !h.Ended.Equal(mark) {
				t.Errorf("the kept charge's hold: ended %v, want %v", h.Ended, mark)
			}
		case running:
			if !h.Ended.IsZero() {
				t.Errorf("the running request's hold is marked ended at %v", h.Ended)
			}
		default:
			t.Errorf("hold %s is still there", h.ID)
		}
	}

	// Renewals extend the running request's hold, not the ended one.
	set(mark.Add(30 * time.Second))
	if err := b.RenewOnce(ctx); err != nil {
		t.Fatal(err)
	}
	for _, h := range holdsOf(t, g, a) {
		if h.ID == kept && !h.Expires.Equal(written.Add(time.Hour)) {
			t.Errorf("the ended hold's lease was renewed to %v", h.Expires)
		}
		if h.ID == running && !h.Expires.Equal(now().Add(time.Hour)) {
			t.Errorf("the running hold's lease is %v, want renewed to %v", h.Expires, now().Add(time.Hour))
		}
	}

	// The audit: nothing while the mark is within the grace; the hold
	// once it is older.
	if r, err := billing.Audit(ctx, db, now(), 40*time.Second); err != nil || !r.OK {
		t.Errorf("audit within the bound: %v %v", r.Problems, err)
	}
	r, err := billing.Audit(ctx, db, now(), 10*time.Second)
	if err != nil || r.OK || len(r.Problems) != 1 {
		t.Fatalf("audit past the bound: ok=%v %v %v", r.OK, r.Problems, err)
	}
	var stranded []string
	for _, d := range r.Details {
		stranded = append(stranded, d.StrandedHolds...)
	}
	if !slices.Equal(stranded, []string{kept}) {
		t.Errorf("stranded holds %v, want [%s]", stranded, kept)
	}

	// The sweep leaves it for one Sweep after its mark, then releases it.
	if n := b.SweepOnce(ctx); n != 0 {
		t.Errorf("swept %d holds 30 s after the mark, want none before one Sweep (1 min)", n)
	}
	set(mark.Add(61 * time.Second))
	if n := b.SweepOnce(ctx); n != 1 {
		t.Errorf("swept %d holds one Sweep after the mark, want the ended one", n)
	}
	if bal, _ := db.Balance(ctx, a.ID); bal.Held != tollgate.MustParseAmount("0.01") {
		t.Errorf("held %s, want the running request's 0.01", bal.Held)
	}

	// The database takes the charge: it goes in, from the free balance.
	g.fail.Store(false)
	if n, done := b.CatchUp(ctx); n != 1 || !done {
		t.Errorf("CatchUp once the database takes it = %d, %v", n, done)
	}
	if e, err := db.LedgerEntry(ctx, c2.RequestID); err != nil || e.Amount != -c2.Cost {
		t.Errorf("the kept charge: %+v, %v", e, err)
	}
	if err := b.Release(ctx, running); err != nil {
		t.Fatal(err)
	}
	if bal, _ := db.Balance(ctx, a.ID); bal.Held != 0 || bal.Balance != tollgate.MustParseAmount("9.996") {
		t.Errorf("balance %+v, want 9.996 and nothing held", bal)
	}
	if r, err := billing.Audit(ctx, db, now(), time.Second); err != nil || !r.OK {
		t.Errorf("audit: %v %v", r.Problems, err)
	}
}

func holdsOf(t *testing.T, g *chargeGate, a tollgate.Account) []tollgate.Hold {
	t.Helper()
	hs, err := g.db.Holds(context.Background(), a.ID)
	if err != nil {
		t.Fatal(err)
	}
	return hs
}

// TestKeptChargesGoInWhenTheStoreIsBack: charges kept while the database
// was away, this instance's (RetryJournaled) and a dead instance's (its
// journal), go in as soon as the database answers, on an instance that
// serves nothing meanwhile and whose sweep (which also retries them) is an
// hour away; their holds are settled with them.
func TestKeptChargesGoInWhenTheStoreIsBack(t *testing.T) {
	db, g, dir, a, k := journalSetup(t, true, true)
	g.away.Store(true)
	ctx := context.Background()
	dead, err := billing.Open(g, billing.Options{Journal: dir, NoReserve: true})
	if err != nil {
		t.Fatal(err)
	}
	id1, c1 := holdAndCharge(t, dead, a, k)
	if got, err := dead.Settle(ctx, id1, c1); err != nil || got != c1.Cost {
		t.Fatalf("settle: %s, %v", got, err)
	}
	dead.Close() // its charge stays in its journal

	live, err := billing.Open(g, billing.Options{Journal: dir, NoReserve: true, Lease: 2 * time.Hour, Renew: time.Hour, Sweep: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	runCtx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- live.Run(runCtx) }()
	defer func() { cancel(); <-ran }()
	id2, c2 := holdAndCharge(t, live, a, k)
	if got, err := live.Settle(ctx, id2, c2); err != nil || got != c2.Cost {
		t.Fatalf("settle: %s, %v", got, err)
	}
	live.Wait()

	g.fail.Store(false) // the database is back
	deadline := time.Now().Add(20 * time.Second)
	for {
		e1, err1 := db.LedgerEntry(ctx, c1.RequestID)
		e2, err2 := db.LedgerEntry(ctx, c2.RequestID)
		bal, _ := db.Balance(ctx, a.ID)
		if err1 == nil && err2 == nil && bal.Held == 0 {
			if e1.Amount != -c1.Cost || e2.Amount != -c2.Cost {
				t.Fatalf("charges %s and %s, want %s and %s", e1.Amount, e2.Amount, c1.Cost, c2.Cost)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("20 s after the database came back (the next sweep is an hour away): the dead instance's charge %v, "+
				"this instance's %v, held %s", err1, err2, bal.Held)
		}
		time.Sleep(20 * time.Millisecond)
	}
	mustAuditClean(t, db)
	if names := journalFiles(t, dir); len(names) != 1 || filepath.Ext(names[0]) != ".journal" {
		t.Errorf("journal directory %v: want the live instance's own alone", names)
	}
}
