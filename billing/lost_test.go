package billing_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/sqlite"
)

// lossyStore is a store whose next batch with an operation of kind lose is
// committed and then reported failed (the connection dropped during its
// COMMIT: the answer is lost), or, with drop, reported failed without
// being applied. It is no Committer: every batch goes through ApplyBilling.
type lossyStore struct {
	db   *sqlite.DB
	lose atomic.Uint32 // a tollgate.BillingOpKind; 0: none
	drop atomic.Bool
	logs lockedBuffer // what the biller over it logged
}

// lockedBuffer is a log's output that the biller's goroutines may write.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// miscounted is the start of the warning of an idle return that found its
// row holding other than the reservation counted.
const miscounted = "an idle reservation's row held other than this instance counted"

func (s *lossyStore) ApplyBilling(ctx context.Context, ops []*tollgate.BillingOp) error {
	for _, op := range ops {
		if k := uint32(op.Kind); s.lose.CompareAndSwap(k, 0) {
			if s.drop.Load() {
				return errors.New("connection refused")
			}
			if err := s.db.ApplyBilling(ctx, ops); err != nil {
				return err
			}
			return errors.New("connection lost during COMMIT")
		}
	}
	return s.db.ApplyBilling(ctx, ops)
}

func (s *lossyStore) RenewHolds(ctx context.Context, owner string, expires, createdAfter time.Time) (int64, error) {
	return s.db.RenewHolds(ctx, owner, expires, createdAfter)
}

func (s *lossyStore) EndHolds(ctx context.Context, ids []string, at time.Time) (int64, error) {
	return s.db.EndHolds(ctx, ids, at)
}

func (s *lossyStore) SweepHolds(ctx context.Context, now, endedBefore time.Time, limit int) ([]tollgate.Hold, error) {
	return s.db.SweepHolds(ctx, now, endedBefore, limit)
}

// lossySetup is a biller with reservations over a lossyStore, and an
// account of 10 USD with its key.
func lossySetup(t *testing.T) (*sqlite.DB, *lossyStore, *billing.Biller, tollgate.Account, tollgate.Key) {
	t.Helper()
	db, a, k := storeWithAccount(t)
	s := &lossyStore{db: db}
	b := billing.New(s, billing.Options{ReserveIdle: time.Hour, Logger: slog.New(slog.NewTextHandler(&s.logs, nil))})
	t.Cleanup(b.Close)
	return db, s, b, a, k
}

// settled is what an idle instance must leave: nothing held, no holds row,
// the balance exactly 10 − charged, and a clean audit.
func settled(t *testing.T, db *sqlite.DB, b *billing.Biller, a tollgate.Account, charged tollgate.Amount) {
	t.Helper()
	ctx := context.Background()
	b.ReturnReservations(ctx, 0) // what the idle sweep does, at once
	bal, err := db.Balance(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if want := tollgate.Dollars(10) - charged; bal.Held != 0 || bal.Balance != want {
		t.Errorf("idle: balance %s held %s, want %s and 0", bal.Balance, bal.Held, want)
	}
	if hs, _ := db.Holds(ctx, a.ID); len(hs) != 0 {
		t.Errorf("idle: holds rows left %+v", hs)
	}
	if r, err := billing.Audit(ctx, db, time.Now(), 0); err != nil || !r.OK {
		t.Errorf("audit: %v %v", r.Problems, err)
	}
}

// A top-up committed whose answer was lost: the hold that asked for it
// fails, but the next one grows the row (a second insert would fail on its
// id), and the idle return gives back all the row holds, including the
// grant nobody counted; also when memory counts nothing at all.
func TestLostTopUpAnswerStrandsNoHold(t *testing.T) {
	db, s, b, a, k := lossySetup(t)
	ctx := context.Background()
	h := tollgate.MustParseAmount("0.01")
	s.lose.Store(uint32(tollgate.OpReserve))
	if _, err := hold(t, b, a, k, h); err == nil {
		t.Fatal("a hold whose top-up's answer was lost succeeded")
	}
	if bal, _ := db.Balance(ctx, a.ID); bal.Held == 0 {
		t.Fatal("the lost top-up was not committed: the test tests nothing")
	}
	id, err := hold(t, b, a, k, h)
	if err != nil {
		t.Fatalf("a hold after a lost top-up answer: %v", err)
	}
	cost := tollgate.MustParseAmount("0.004")
	if got, err := b.Settle(ctx, id, charge(a, k, cost)); err != nil || got != cost {
		t.Fatalf("settle: %s, %v", got, err)
	}
	settled(t, db, b, a, cost)

	// Lost when this instance counted nothing in it: the row it created
	// holds the grant, and the idle return still finds it.
	s.lose.Store(uint32(tollgate.OpReserve))
	if _, err := hold(t, b, a, k, h); err == nil {
		t.Fatal("a hold whose top-up's answer was lost succeeded")
	}
	settled(t, db, b, a, cost)
	if st := b.Stats(); st.Returns != 2 {
		t.Errorf("%d returns, want 2", st.Returns)
	}
}

// A return committed whose answer was lost: the instance counts it as done
// and places no hold against money the row no longer holds, whether the
// return was of the unused part beside a hold in flight or of the whole
// idle row (deleted: the next hold makes a new one). One that failed
// without being applied leaves the row more than counted, given back when
// idle.
func TestLostReturnAnswerStrandsNoHold(t *testing.T) {
	db, s, b, a, k := lossySetup(t)
	ctx := context.Background()
	h, cost := tollgate.MustParseAmount("0.01"), tollgate.MustParseAmount("0.004")
	charged := tollgate.Amount(0)
	serve := func(n int) {
		t.Helper()
		for range n {
			id, err := hold(t, b, a, k, h)
			if err != nil {
				t.Fatalf("a hold after a lost return answer: %v", err)
			}
			if got, err := b.Settle(ctx, id, charge(a, k, cost)); err != nil || got != cost {
				t.Fatalf("a settle after a lost return answer: %s, %v", got, err)
			}
			charged += cost
		}
	}
	// Beside a hold in flight: the row keeps that hold's 0.01 only.
	inFlight, err := hold(t, b, a, k, h)
	if err != nil {
		t.Fatal(err)
	}
	s.lose.Store(uint32(tollgate.OpReturn))
	b.ReturnReservations(ctx, 0)
	if bal, _ := db.Balance(ctx, a.ID); bal.Held != h {
		t.Fatalf("held %s after the lost return, want the hold in flight's %s: the test tests nothing", bal.Held, h)
	}
	if got, err := b.Settle(ctx, inFlight, charge(a, k, cost)); err != nil || got != cost {
		t.Fatalf("settle: %s, %v", got, err)
	}
	charged += cost
	serve(5)
	settled(t, db, b, a, charged)

	// Of the whole idle row: it is deleted.
	serve(1)
	s.lose.Store(uint32(tollgate.OpReturn))
	b.ReturnReservations(ctx, 0)
	if hs, _ := db.Holds(ctx, a.ID); len(hs) != 0 {
		t.Fatalf("the lost return was not committed (rows %+v): the test tests nothing", hs)
	}
	serve(3)
	settled(t, db, b, a, charged)
	// Counted as done, the returns left the count what the rows held.
	if strings.Contains(s.logs.String(), miscounted) {
		t.Errorf("an idle return found the row holding other than counted:\n%s", s.logs.String())
	}

	// Failed without being applied.
	serve(1)
	s.drop.Store(true)
	s.lose.Store(uint32(tollgate.OpReturn))
	b.ReturnReservations(ctx, 0)
	if bal, _ := db.Balance(ctx, a.ID); bal.Held == 0 {
		t.Fatal("the failed return was applied: the test tests nothing")
	}
	settled(t, db, b, a, charged)
	if !strings.Contains(s.logs.String(), miscounted) {
		t.Error("the idle return after a return that was not applied found the row holding what was counted")
	}
}

// A charge against a reservation committed whose answer was lost: without
// a journal its request is told it failed, and the reservation counts
// what the charge took as taken, so the idle return gives back exactly
// what the row still holds (the charge is in the ledger once).
func TestLostChargeAnswerStrandsNoHold(t *testing.T) {
	db, s, b, a, k := lossySetup(t)
	ctx := context.Background()
	h, cost := tollgate.MustParseAmount("0.01"), tollgate.MustParseAmount("0.004")
	id, err := hold(t, b, a, k, h)
	if err != nil {
		t.Fatal(err)
	}
	s.lose.Store(uint32(tollgate.OpCharge))
	if _, err := b.Settle(ctx, id, charge(a, k, cost)); err == nil {
		t.Fatal("a settle whose answer was lost succeeded")
	}
	settled(t, db, b, a, cost)
	if strings.Contains(s.logs.String(), miscounted) {
		t.Errorf("the idle return found the row holding other than counted:\n%s", s.logs.String())
	}
}
