package sqlite

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
)

// endsAfter is a context that ends at the n+1st call of Err: the batch
// looks at Err between statements, and nothing else ends it.
type endsAfter struct {
	context.Context
	n    atomic.Int32
	once sync.Once
	done chan struct{}
}

func newEndsAfter(n int32) *endsAfter {
	c := &endsAfter{Context: context.Background(), done: make(chan struct{})}
	c.n.Store(n)
	return c
}

func (c *endsAfter) Err() error {
	if c.n.Add(-1) < 0 {
		c.once.Do(func() { close(c.done) })
		return context.Canceled
	}
	return nil
}

func (c *endsAfter) Done() <-chan struct{} { return c.done }

// TestBillingBatchHonoursItsContext checks that a billing batch, whose
// statements run under a context that cannot end (so that the driver starts
// no goroutine per statement), still stops when the caller's context ends:
// before it starts, and between two statements, and then writes nothing.
func TestBillingBatchHonoursItsContext(t *testing.T) {
	ctx := context.Background()
	db, err := Open(filepath.Join(t.TempDir(), "b.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	now := time.Now()
	acct := tollgate.Account{ID: "acct_l", Name: "l", Balance: tollgate.Dollars(100), Created: now}
	if err := db.CreateAccount(ctx, acct); err != nil {
		t.Fatal(err)
	}
	key := tollgate.Key{ID: "key_l", AccountID: acct.ID, Prefix: "sk-tg-l", Created: now}
	if err := db.CreateKey(ctx, key, tollgate.HashKey(tollgate.NewKeySecret())); err != nil {
		t.Fatal(err)
	}
	holds := func() []*tollgate.BillingOp {
		var ops []*tollgate.BillingOp
		for i := range 3 {
			id := tollgate.NewOrderedID("hold_", time.Now())
			ops = append(ops, &tollgate.BillingOp{Kind: tollgate.OpHold, Hold: tollgate.Hold{ID: id, RequestID: "req_l" + id, AccountID: acct.ID,
				KeyID: key.ID, Owner: "inst_l", Created: now, Expires: now.Add(time.Hour), Amount: tollgate.Dollars(1) + tollgate.Amount(i)}})
		}
		return ops
	}
	balance := func() (tollgate.Amount, tollgate.Amount) {
		b, err := db.Balance(ctx, acct.ID)
		if err != nil {
			t.Fatal(err)
		}
		return b.Balance, b.Held
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := db.ApplyBilling(cancelled, holds()); !errors.Is(err, context.Canceled) {
		t.Errorf("a batch under an ended context: %v, want context.Canceled", err)
	}
	for _, n := range []int32{1, 2, 3} {
		c := newEndsAfter(n)
		if err := db.ApplyBilling(c, holds()); !errors.Is(err, context.Canceled) {
			t.Errorf("a batch whose context ends after %d checks: %v, want context.Canceled", n, err)
		}
	}
	if b, h := balance(); b != tollgate.Dollars(100) || h != 0 {
		t.Errorf("after batches that stopped: balance %s held %s, want 100 and 0", b, h)
	}
	ops := holds()
	if err := db.ApplyBilling(ctx, ops); err != nil {
		t.Fatal(err)
	}
	if _, h := balance(); h != tollgate.Dollars(3)+3 {
		t.Errorf("held %s after three holds, want 3.000000000003", h)
	}
}
