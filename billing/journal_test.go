package billing_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/sqlite"
	"github.com/tollgate/tollgate/storefail"
)

// chargeGate is a store whose batches with a charge in them wait for open
// (or fail, with fail set); everything else goes straight to the database.
type chargeGate struct {
	db   *sqlite.DB
	open chan struct{}
	fail atomic.Bool
	// away: with fail, every operation but holds (so that a test can
	// place them) fails as with an unreachable database (a refused
	// connection), not with an error of the database's.
	away atomic.Bool
	// lost: the next batch with a charge commits, and its caller is told
	// it failed (a connection lost during COMMIT).
	lost atomic.Bool
}

func (g *chargeGate) ApplyBilling(ctx context.Context, ops []*tollgate.BillingOp) error {
	for _, op := range ops {
		if err := g.unreachable("billing batch"); err != nil && op.Kind != tollgate.OpHold && op.Kind != tollgate.OpReserve {
			return err
		}
		if op.Kind == tollgate.OpCharge || op.Kind == tollgate.OpSettle {
			if g.fail.Load() {
				return errors.New("the database is unwell")
			}
			<-g.open
			if g.lost.CompareAndSwap(true, false) {
				if err := g.db.ApplyBilling(ctx, ops); err != nil {
					return err
				}
				return errors.New("connection lost during COMMIT")
			}
			break
		}
	}
	return g.db.ApplyBilling(ctx, ops)
}

// unreachable is the error of a call while the gate's database is away.
func (g *chargeGate) unreachable(call string) error {
	if g.fail.Load() && g.away.Load() {
		return fmt.Errorf("%s: %w", call, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
	}
	return nil
}

func (g *chargeGate) RenewHolds(ctx context.Context, owner string, expires, createdAfter time.Time) (int64, error) {
	if err := g.unreachable("renew holds"); err != nil {
		return 0, err
	}
	return g.db.RenewHolds(ctx, owner, expires, createdAfter)
}

func (g *chargeGate) EndHolds(ctx context.Context, ids []string, at time.Time) (int64, error) {
	if err := g.unreachable("end holds"); err != nil {
		return 0, err
	}
	return g.db.EndHolds(ctx, ids, at)
}

func (g *chargeGate) SweepHolds(ctx context.Context, now, endedBefore time.Time, limit int) ([]tollgate.Hold, error) {
	if err := g.unreachable("sweep holds"); err != nil {
		return nil, err
	}
	return g.db.SweepHolds(ctx, now, endedBefore, limit)
}

// journalSetup is an account with 10 USD and its key, a journal directory,
// and a gate in front of the database: open (charges pass) or shut (they
// wait), failing or not.
func journalSetup(t *testing.T, open, fail bool) (*sqlite.DB, *chargeGate, string, tollgate.Account, tollgate.Key) {
	t.Helper()
	db, _, a, k := setup(t, billing.Options{NoReserve: true}, tollgate.MustParseAmount("10"))
	g := &chargeGate{db: db, open: make(chan struct{})}
	if open {
		close(g.open)
	}
	g.fail.Store(fail)
	return db, g, filepath.Join(t.TempDir(), "charges"), a, k
}

// holdAndCharge places a hold of 0.01 USD through b and returns it with a
// charge of 0.004 USD for it.
func holdAndCharge(t *testing.T, b *billing.Biller, a tollgate.Account, k tollgate.Key) (string, tollgate.Charge) {
	t.Helper()
	id, err := hold(t, b, a, k, tollgate.MustParseAmount("0.01"))
	if err != nil {
		t.Fatal(err)
	}
	return id, charge(a, k, tollgate.MustParseAmount("0.004"))
}

func journalFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// With a journal, a settle within its hold returns its charge while the
// database has not committed it yet; the commit follows, and a clean close
// leaves no journal behind.
//
// Both kinds of hold: one placed in memory against a reservation (the
// settle is an OpCharge) and a holds row (an OpSettle).
func TestJournalAnswersBeforeTheCommit(t *testing.T) {
	for _, noReserve := range []bool{false, true} {
		t.Run(fmt.Sprintf("reservations=%v", !noReserve), func(t *testing.T) { journalAnswersBeforeTheCommit(t, noReserve) })
	}
}

func journalAnswersBeforeTheCommit(t *testing.T, noReserve bool) {
	db, g, dir, a, k := journalSetup(t, false, false)
	b, err := billing.Open(g, billing.Options{Journal: dir, NoReserve: noReserve})
	if err != nil {
		t.Fatal(err)
	}
	id, c := holdAndCharge(t, b, a, k)
	done := make(chan tollgate.Amount)
	go func() {
		got, err := b.Settle(context.Background(), id, c)
		if err != nil {
			t.Error(err)
		}
		done <- got
	}()
	select {
	case got := <-done:
		if got != c.Cost {
			t.Errorf("settle returned %s, want %s", got, c.Cost)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the settle waited for its commit")
	}
	if _, err := db.LedgerEntry(context.Background(), c.RequestID); err == nil {
		t.Fatal("the charge is in the ledger while its batch is held at the gate")
	}
	if st := b.Stats(); st.Journaled != 1 {
		t.Errorf("journaled %d, want 1", st.Journaled)
	}
	if names := journalFiles(t, dir); len(names) != 1 || !strings.HasSuffix(names[0], ".journal") {
		t.Errorf("journal directory: %v", names)
	}
	close(g.open)
	b.Wait()
	e, err := db.LedgerEntry(context.Background(), c.RequestID)
	if err != nil || e.Amount != -c.Cost {
		t.Fatalf("ledger row %+v, %v", e, err)
	}
	b.Close()
	if names := journalFiles(t, dir); len(names) != 0 {
		t.Errorf("after a clean close the journal directory holds %v", names)
	}
	mustAuditClean(t, db)
}

// A charge answered from the journal whose commit never happens (here the
// database refuses it; in life the process dies) stays in the journal; the
// next instance applies it once, from the dead instance's reservation, and
// deletes the journal. A live instance's journal is never touched, and a
// charge already in the ledger is not charged again.
func TestJournalRecoveredByTheNextInstance(t *testing.T) {
	for _, noReserve := range []bool{false, true} {
		t.Run(fmt.Sprintf("reservations=%v", !noReserve), func(t *testing.T) { journalRecoveredByTheNextInstance(t, noReserve) })
	}
}

func journalRecoveredByTheNextInstance(t *testing.T, noReserve bool) {
	db, g, dir, a, k := journalSetup(t, false, true)
	dead, err := billing.Open(g, billing.Options{Journal: dir, NoReserve: noReserve})
	if err != nil {
		t.Fatal(err)
	}
	id, c := holdAndCharge(t, dead, a, k)
	if got, err := dead.Settle(context.Background(), id, c); err != nil || got != c.Cost {
		t.Fatalf("settle: %s, %v", got, err)
	}
	dead.Wait() // the commit failed: the record stays

	// While its owner lives, another instance leaves the journal alone.
	next, err := billing.Open(db, billing.Options{Journal: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if n, err := next.RecoverJournals(context.Background()); n != 0 || err != nil {
		t.Fatalf("recovered %d (%v) from a live instance's journal", n, err)
	}
	dead.Close()
	var kept string
	for _, n := range journalFiles(t, dir) {
		if strings.HasSuffix(n, ".journal") && !strings.HasPrefix(n, next.Instance()) {
			kept = filepath.Join(dir, n)
		}
	}
	if kept == "" {
		t.Fatalf("the failed charge's journal was not kept: %v", journalFiles(t, dir))
	}
	saved, err := os.ReadFile(kept)
	if err != nil {
		t.Fatal(err)
	}

	if n, err := next.RecoverJournals(context.Background()); n != 1 || err != nil {
		t.Fatalf("recovered %d, %v; want 1", n, err)
	}
	e, err := db.LedgerEntry(context.Background(), c.RequestID)
	if err != nil || e.Amount != -c.Cost || e.HoldID != id || e.Charge.Model != c.Model {
		t.Fatalf("recovered ledger row %+v, %v", e, err)
	}
	if names := journalFiles(t, dir); len(names) != 1 {
		t.Errorf("after recovery the directory holds %v; want only the live instance's journal", names)
	}
	bal, _ := db.Balance(context.Background(), a.ID)
	if want := tollgate.MustParseAmount("10") - c.Cost; bal.Balance != want {
		t.Errorf("balance %s, want %s", bal.Balance, want)
	}

	// The same journal again (say, a recovery that died before deleting
	// it): the charge is found in the ledger and not charged twice.
	if err := os.WriteFile(filepath.Join(dir, "inst_again.journal"), saved, 0o600); err != nil {
		t.Fatal(err)
	}
	if n, err := next.RecoverJournals(context.Background()); n != 1 || err != nil {
		t.Fatalf("second recovery: %d, %v", n, err)
	}
	if st := next.Stats(); st.JournalRecovered != 1 {
		t.Errorf("JournalRecovered %d, want 1 (the second was already in the ledger)", st.JournalRecovered)
	}
	if bal2, _ := db.Balance(context.Background(), a.ID); bal2.Balance != bal.Balance {
		t.Errorf("balance moved on a replayed journal: %s then %s", bal.Balance, bal2.Balance)
	}
	// Nothing is held for the request any more (its hold row was settled,
	// or its reservation paid the charge); the audit is clean.
	if noReserve && bal.Held != 0 {
		t.Errorf("still held after recovery: %s", bal.Held)
	}
	mustAuditClean(t, db)
}

func mustAuditClean(t *testing.T, db *sqlite.DB) {
	t.Helper()
	r, err := billing.Audit(context.Background(), db, time.Now(), time.Minute)
	if err != nil || !r.OK {
		t.Errorf("audit: %v, %v", r.Problems, err)
	}
}

// A settle that comes after Close (a request cut at shutdown that outlived
// the drain) is refused; it neither writes into the closed journal nor
// crashes the process, and Close may be called again.
func TestJournalSettleAfterClose(t *testing.T) {
	db, _, dir, a, k := journalSetup(t, true, false)
	b, err := billing.Open(db, billing.Options{Journal: dir})
	if err != nil {
		t.Fatal(err)
	}
	id, c := holdAndCharge(t, b, a, k)
	b.Close()
	if _, err := b.Settle(context.Background(), id, c); !errors.Is(err, billing.ErrClosed) {
		t.Errorf("settle after close: %v, want ErrClosed", err)
	}
	b.Close()
	if st := b.Stats(); st.Journaled != 0 {
		t.Errorf("journaled %d after close", st.Journaled)
	}
	if names := journalFiles(t, dir); len(names) != 0 {
		t.Errorf("journal directory after close: %v", names)
	}
}

// A journaled charge whose batch fails keeps its money held and its record,
// and goes in when the database is back (RetryJournaled runs at every
// sweep); the journal is then empty.
func TestJournalRetriesAFailedCommit(t *testing.T) {
	for _, noReserve := range []bool{false, true} {
		t.Run(fmt.Sprintf("reservations=%v", !noReserve), func(t *testing.T) {
			db, g, dir, a, k := journalSetup(t, true, true)
			b, err := billing.Open(g, billing.Options{Journal: dir, NoReserve: noReserve})
			if err != nil {
				t.Fatal(err)
			}
			id, c := holdAndCharge(t, b, a, k)
			if got, err := b.Settle(context.Background(), id, c); err != nil || got != c.Cost {
				t.Fatalf("settle: %s, %v", got, err)
			}
			b.Wait() // the batch failed; Wait gives back what is unused
			bal, _ := db.Balance(context.Background(), a.ID)
			if bal.Held < tollgate.MustParseAmount("0.004") {
				t.Errorf("held %s after the failed commit: the charge's money was let go", bal.Held)
			}
			if n := b.RetryJournaled(context.Background()); n != 0 {
				t.Errorf("retried %d while the database still refuses", n)
			}
			g.fail.Store(false)
			if n := b.RetryJournaled(context.Background()); n != 1 {
				t.Fatalf("retried %d, want 1", n)
			}
			e, err := db.LedgerEntry(context.Background(), c.RequestID)
			if err != nil || e.Amount != -c.Cost {
				t.Fatalf("ledger row %+v, %v", e, err)
			}
			if n := b.RetryJournaled(context.Background()); n != 0 {
				t.Errorf("retried %d more", n)
			}
			b.Close()
			if names := journalFiles(t, dir); len(names) != 0 {
				t.Errorf("journal directory after close: %v", names)
			}
			bal, _ = db.Balance(context.Background(), a.ID)
			if want := tollgate.MustParseAmount("10") - c.Cost; bal.Balance != want || bal.Held != 0 {
				t.Errorf("balance %+v, want %s and nothing held", bal, want)
			}
			mustAuditClean(t, db)
		})
	}
}

// An instance started with the id of a dead one (a fixed Options.Instance)
// does not overwrite the dead one's journal: it sets it aside and applies
// it.
func TestJournalOfTheSameInstanceIDIsKept(t *testing.T) {
	db, g, dir, a, k := journalSetup(t, false, true)
	first, err := billing.Open(g, billing.Options{Journal: dir, Instance: "inst_fixed"})
	if err != nil {
		t.Fatal(err)
	}
	id, c := holdAndCharge(t, first, a, k)
	if _, err := first.Settle(context.Background(), id, c); err != nil {
		t.Fatal(err)
	}
	if _, err := billing.Open(db, billing.Options{Journal: dir, Instance: "inst_fixed"}); err == nil {
		t.Fatal("a second instance with the id of a live one got a journal")
	}
	first.Close() // the charge stays in the journal
	second, err := billing.Open(db, billing.Options{Journal: dir, Instance: "inst_fixed"})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if n, err := second.RecoverJournals(context.Background()); n != 1 || err != nil {
		t.Fatalf("recovered %d, %v; want the first run's charge", n, err)
	}
	if _, err := db.LedgerEntry(context.Background(), c.RequestID); err != nil {
		t.Fatal(err)
	}
}

// A journal file still being created (its temporary name, younger than a
// minute) is left alone by recovery; an old one, whose process died while
// creating it, is deleted.
func TestJournalRecoveryLeavesFreshTemporaryFiles(t *testing.T) {
	db, _, _, _ := setup(t, billing.Options{NoReserve: true}, tollgate.MustParseAmount("1"))
	dir := t.TempDir()
	fresh, old := filepath.Join(dir, "inst_a.journal-tmp"), filepath.Join(dir, "inst_b.journal-tmp")
	for _, p := range []string{fresh, old} {
		if err := os.WriteFile(p, make([]byte, 512), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	past := time.Now().Add(-2 * time.Minute)
	if err := os.Chtimes(old, past, past); err != nil {
		t.Fatal(err)
	}
	r, err := billing.Open(db, billing.Options{Journal: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.RecoverJournals(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("a fresh temporary journal was removed: %v", err)
	}
	if _, err := os.Stat(old); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an old temporary journal was kept: %v", err)
	}
}

// A batch of operations nobody waits for lingers up to 4 × BatchWait; an
// operation that somebody waits for, joining it, cuts that back to
// BatchWait after its arrival. BatchWait is 250 ms here: settles answered
// early keep arriving every 5 ms, and a hold placed 50 ms after the first
// of them would return after about 1 s without this rule, about 250 ms
// with it.
func TestAWaitedOperationShortensAnAsyncBatchsLinger(t *testing.T) {
	db, _, a, k := setup(t, billing.Options{NoReserve: true}, tollgate.MustParseAmount("10"))
	b := billing.New(db, billing.Options{NoReserve: true, AsyncSettle: true, BatchWait: 250 * time.Millisecond})
	defer b.Close()
	// Placed together, so that the last batch a request waited for held
	// several operations: under load, which is when batches linger.
	ids := make([]string, 240)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := hold(t, b, a, k, tollgate.MustParseAmount("0.001"))
			if err != nil {
				t.Error(err)
			}
			ids[i] = id
		}()
	}
	wg.Wait()
	stop := make(chan struct{})
	settled := make(chan struct{})
	go func() {
		defer close(settled)
		for _, id := range ids {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if _, err := b.Settle(context.Background(), id, charge(a, k, tollgate.MustParseAmount("0.0005"))); err != nil {
				t.Error(err)
			}
		}
	}()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	if _, err := hold(t, b, a, k, tollgate.MustParseAmount("0.001")); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	close(stop)
	<-settled
	t.Logf("the hold took %s", took)
	// With the fix about BatchWait and a write; without it, up to 4 ×
	// BatchWait (the early-answered settles' linger). The times are long
	// enough that a loaded machine's delays under -race do not blur them.
	if took > 650*time.Millisecond {
		t.Errorf("a hold that joined a lingering batch of early-answered settles waited %s; BatchWait is 250ms", took)
	}
}

// A batch reported as failed that had committed after all: its retry finds
// the charge in the ledger, and the reservation in memory counts the charge
// as paid (it was, from the reservation row); the next charges and the
// give-back of the slice then agree with the database.
func TestJournalRetryOfACommittedBatch(t *testing.T) {
	db, g, dir, a, k := journalSetup(t, true, false)
	b, err := billing.Open(g, billing.Options{Journal: dir})
	if err != nil {
		t.Fatal(err)
	}
	id, c := holdAndCharge(t, b, a, k)
	g.lost.Store(true)
	if _, err := b.Settle(context.Background(), id, c); err != nil {
		t.Fatal(err)
	}
	// The retry (at a sweep), once the failed batch has been answered.
	deadline := time.Now().Add(10 * time.Second)
	for b.RetryJournaled(context.Background()) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the charge was never kept for a retry")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The slice's unused part goes back: all of it, no more than the row
	// holds (a give-back counted with the first charge's money still in
	// it is refused by the row's amount >= 0 check).
	b.Wait()
	if bal, _ := db.Balance(context.Background(), a.ID); bal.Held != 0 {
		t.Errorf("held %s after the give-back; want nothing", bal.Held)
	}
	for range 3 {
		id, err := hold(t, b, a, k, tollgate.MustParseAmount("0.01"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Settle(context.Background(), id, charge(a, k, tollgate.MustParseAmount("0.01"))); err != nil {
			t.Fatal(err)
		}
	}
	b.Close()
	if names := journalFiles(t, dir); len(names) != 0 {
		t.Errorf("journal directory after close: %v (a charge could not be committed)", names)
	}
	bal, _ := db.Balance(context.Background(), a.ID)
	if want := tollgate.MustParseAmount("10") - c.Cost - tollgate.MustParseAmount("0.03"); bal.Balance != want || bal.Held != 0 {
		t.Errorf("balance %+v, want %s and nothing held", bal, want)
	}
	mustAuditClean(t, db)
}

// A dead instance's journal that cannot be applied (here the database
// refuses every charge) is tried at each recovery, then set aside as
// *.journal-failed after ten failures, so that it no longer holds up the
// sweep of expired holds.
func TestJournalThatCannotBeAppliedIsSetAside(t *testing.T) {
	_, g, dir, a, k := journalSetup(t, true, true)
	dead, err := billing.Open(g, billing.Options{Journal: dir})
	if err != nil {
		t.Fatal(err)
	}
	id, c := holdAndCharge(t, dead, a, k)
	if _, err := dead.Settle(context.Background(), id, c); err != nil {
		t.Fatal(err)
	}
	dead.Close() // the charge stays in the journal
	next, err := billing.Open(g, billing.Options{Journal: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	for i := range 10 {
		if _, err := next.RecoverJournals(context.Background()); err == nil {
			t.Fatalf("recovery %d succeeded against a database that refuses", i+1)
		}
	}
	if _, err := next.RecoverJournals(context.Background()); err != nil {
		t.Errorf("recovery after the journal was set aside: %v", err)
	}
	var failed int
	for _, n := range journalFiles(t, dir) {
		if strings.HasSuffix(n, ".journal-failed") {
			failed++
		}
	}
	if failed != 1 {
		t.Errorf("journal directory %v: want one .journal-failed", journalFiles(t, dir))
	}
}

// A dead instance's journal is never set aside for an outage of the
// database, however many recoveries it fails: its charges go in when the
// database is back.
func TestJournalWaitsOutAnOutage(t *testing.T) {
	db, g, dir, a, k := journalSetup(t, true, true)
	g.away.Store(true)
	dead, err := billing.Open(g, billing.Options{Journal: dir})
	if err != nil {
		t.Fatal(err)
	}
	id, c := holdAndCharge(t, dead, a, k)
	if got, err := dead.Settle(context.Background(), id, c); err != nil || got != c.Cost {
		t.Fatalf("settle: %s, %v", got, err)
	}
	dead.Close() // the charge stays in the journal
	next, err := billing.Open(g, billing.Options{Journal: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	for i := range 15 {
		_, err := next.RecoverJournals(context.Background())
		if _, outage := storefail.Op(err); !outage {
			t.Fatalf("recovery %d during the outage: %v, want a store_unavailable error", i+1, err)
		}
	}
	g.fail.Store(false)
	if n, err := next.RecoverJournals(context.Background()); n != 1 || err != nil {
		t.Fatalf("recovery once the database is back: %d, %v", n, err)
	}
	e, err := db.LedgerEntry(context.Background(), c.RequestID)
	if err != nil || e.Amount != -c.Cost {
		t.Fatalf("ledger row %+v, %v", e, err)
	}
	if names := journalFiles(t, dir); len(names) != 1 { // next's own
		t.Errorf("journal directory %v", names)
	}
}

// A running request's progress (Biller.Progress: a stream's charge so far)
// is a provisional record in the journal. If its process dies before the
// settle, the next instance charges the latest one, estimated; a settle
// replaces it, and nothing of it is left to charge.
func TestJournalProgressOfARequestCutByACrash(t *testing.T) {
	for _, noReserve := range []bool{false, true} {
		t.Run(fmt.Sprintf("reservations=%v", !noReserve), func(t *testing.T) { journalProgress(t, noReserve) })
	}
}

func journalProgress(t *testing.T, noReserve bool) {
	db, g, dir, a, k := journalSetup(t, true, false)
	ctx := context.Background()
	dead, err := billing.Open(g, billing.Options{Journal: dir, NoReserve: noReserve})
	if err != nil {
		t.Fatal(err)
	}
	id, c := holdAndCharge(t, dead, a, k)
	for i, cost := range []string{"0.001", "0.002"} {
		so := c
		so.CompletionTokens, so.Cost, so.Estimated = int64(10*(i+1)), tollgate.MustParseAmount(cost), true
		if !dead.Progress(id, so) {
			t.Fatalf("progress %d not recorded", i)
		}
	}
	if dead.Progress("hold_unknown", c) {
		t.Error("progress of a hold the instance does not know was recorded")
	}
	// The process ends without the settle: what it left is the latest record.
	dead.Close()
	next, err := billing.Open(db, billing.Options{Journal: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if n, err := next.RecoverJournals(ctx); n != 1 || err != nil {
		t.Fatalf("recovered %d, %v; want the one latest progress record", n, err)
	}
	e, err := db.LedgerEntry(ctx, c.RequestID)
	if err != nil || e.Amount != -tollgate.MustParseAmount("0.002") || e.HoldID != id || !e.Charge.Estimated ||
		e.Charge.CompletionTokens != 20 {
		t.Fatalf("the charge of the cut request: %+v %+v, %v", e, e.Charge, err)
	}
	if bal, _ := db.Balance(ctx, a.ID); bal.Balance != tollgate.MustParseAmount("9.998") {
		t.Errorf("balance %s, want 9.998", bal.Balance)
	}

	// A request that settles: its progress is replaced, nothing is left.
	ldir := t.TempDir()
	live, err := billing.Open(db, billing.Options{Journal: ldir, NoReserve: noReserve})
	if err != nil {
		t.Fatal(err)
	}
	id2, c2 := holdAndCharge(t, live, a, k)
	so := c2
	so.Cost = tollgate.MustParseAmount("0.001")
	if !live.Progress(id2, so) {
		t.Fatal("progress not recorded")
	}
	if got, err := live.Settle(ctx, id2, c2); err != nil || got != c2.Cost {
		t.Fatalf("settle: %s, %v", got, err)
	}
	live.Wait()
	if st := live.Stats(); st.Settled != 1 {
		t.Errorf("settled %d", st.Settled)
	}
	live.Close()
	if names := journalFiles(t, ldir); len(names) != 0 {
		t.Errorf("a clean close left %v: the progress record was not cleared", names)
	}
	e2, err := db.LedgerEntry(ctx, c2.RequestID)
	if err != nil || e2.Amount != -c2.Cost {
		t.Errorf("the settled request: %+v, %v", e2, err)
	}
}

// A settle that can be neither written nor kept (no journal, the database
// away) fails, and its hold does not stay held for as long as the instance
// lives: a hold placed in memory goes back to the reservation at once, a
// hold row is released by the first sweep that reaches the database
// (ReleaseEnded).
func TestHoldOfAFailedSettleIsReleased(t *testing.T) {
	for _, noReserve := range []bool{false, true} {
		t.Run(fmt.Sprintf("reservations=%v", !noReserve), func(t *testing.T) {
			db, g, _, a, k := journalSetup(t, true, true)
			g.away.Store(true)
			b := billing.New(g, billing.Options{NoReserve: noReserve})
			defer b.Close()
			id, c := holdAndCharge(t, b, a, k)
			_, err := b.Settle(context.Background(), id, c)
			if _, outage := storefail.Op(err); !outage {
				t.Fatalf("settle while the database is away: %v, want a store_unavailable error", err)
			}
			if n := b.ReleaseEnded(context.Background()); n != 0 {
				t.Errorf("released %d hold rows while the database is away", n)
			}
			g.fail.Store(false)
			if n := b.ReleaseEnded(context.Background()); noReserve && n != 1 {
				t.Errorf("released %d hold rows, want 1", n)
			}
			b.Wait() // gives back the unused reservation
			bal, _ := db.Balance(context.Background(), a.ID)
			if bal.Held != 0 || bal.Balance != tollgate.MustParseAmount("10") {
				t.Errorf("balance %+v: want 10 USD, nothing held, nothing charged", bal)
			}
			mustAuditClean(t, db)
		})
	}
}
