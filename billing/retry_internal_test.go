package billing

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/sqlite"
)

// retryStore is a database with an account of 10 USD and its key.
func retryStore(t *testing.T) (*sqlite.DB, tollgate.Account, tollgate.Key) {
	t.Helper()
	ctx := context.Background()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "r.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	a := tollgate.Account{ID: tollgate.NewID("acct_"), Name: "r", Balance: tollgate.Dollars(10), Created: time.Now()}
	k := tollgate.Key{ID: tollgate.NewID("key_"), AccountID: a.ID, Prefix: "sk-tg-rrrr", Created: time.Now()}
	if err := db.CreateAccount(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateKey(ctx, k, tollgate.HashKey(tollgate.NewKeySecret())); err != nil {
		t.Fatal(err)
	}
	return db, a, k
}

// TestRetryAloneAppliesNoReturnTwice: a batch committed whose answer was
// lost is retried op by op. A reservation's return is not applied again
// (it would take twice from its row) but fails with the batch; a top-up is
// applied again and marked alone (its reservation counts it as uncertain);
// a release, idempotent, succeeds.
func TestRetryAloneAppliesNoReturnTwice(t *testing.T) {
	ctx := context.Background()
	db, a, k := retryStore(t)
	b := New(db, Options{})
	defer b.Close()
	usd := tollgate.MustParseAmount
	now := time.Now()
	reserve := func(id string, amount tollgate.Amount, create bool) tollgate.BillingOp {
		return tollgate.BillingOp{Kind: tollgate.OpReserve, Reservation: id, Need: amount, Fraction: 1, Create: create,
			Hold: tollgate.Hold{ID: id, AccountID: a.ID, KeyID: k.ID, Owner: "inst_r", Created: now, Expires: now.Add(time.Hour), Amount: amount}}
	}
	rsv, rsv2 := tollgate.NewID("rsv_"), tollgate.NewID("rsv_")
	for _, op := range []tollgate.BillingOp{reserve(rsv, usd("1"), true), reserve(rsv2, usd("1"), true)} {
		if err := db.ApplyBilling(ctx, []*tollgate.BillingOp{&op}); err != nil {
			t.Fatal(err)
		}
	}
	batch := []*pending{
		{op: tollgate.BillingOp{Kind: tollgate.OpReturn, Reservation: rsv, Return: usd("0.4"), Hold: tollgate.Hold{AccountID: a.ID, KeyID: k.ID}}},
		{op: reserve(rsv2, usd("0.5"), false)},
		{op: tollgate.BillingOp{Kind: tollgate.OpRelease, HoldID: "hold_none"}},
	}
	ops := make([]*tollgate.BillingOp, len(batch))
	for i, p := range batch {
		p.done = make(chan struct{})
		ops[i] = &p.op
	}
	if err := db.ApplyBilling(ctx, ops); err != nil { // committed; its answer is lost
		t.Fatal(err)
	}
	lost := errors.New("connection lost during COMMIT")
	b.retryAlone(ctx, batch, ops, lost)
	for _, p := range batch {
		<-p.done
		if !p.alone {
			t.Errorf("op %d: not marked alone", p.op.Kind)
		}
	}
	if !errors.Is(batch[0].err, lost) {
		t.Errorf("the return: %v, want the batch's error", batch[0].err)
	}
	if batch[1].err != nil || batch[2].err != nil {
		t.Errorf("the top-up and the release retried alone: %v, %v", batch[1].err, batch[2].err)
	}
	hs, err := db.Holds(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]tollgate.Amount{}
	for _, h := range hs {
		got[h.ID] = h.Amount
	}
	// The return taken once; the top-up twice (the batch's and the retry's).
	if got[rsv] != usd("0.6") || got[rsv2] != usd("2") {
		t.Errorf("rows %v: want %s 0.6 and %s 2", got, rsv, rsv2)
	}
	if bal, _ := db.Balance(ctx, a.ID); bal.Held != usd("2.6") {
		t.Errorf("held %s, want 2.6", bal.Held)
	}

	// A batch the store says it did not apply: the return is retried too.
	p := &pending{op: tollgate.BillingOp{Kind: tollgate.OpReturn, Reservation: rsv, Return: usd("0.4"),
		Hold: tollgate.Hold{AccountID: a.ID, KeyID: k.ID}}, done: make(chan struct{})}
	other := &pending{op: tollgate.BillingOp{Kind: tollgate.OpRelease, HoldID: "hold_none"}, done: make(chan struct{})}
	b.retryAlone(ctx, []*pending{p, other}, []*tollgate.BillingOp{&p.op, &other.op}, fmt.Errorf("refused %w", tollgate.ErrNotApplied))
	<-p.done
	<-other.done
	if p.err != nil || p.alone || p.op.Returned != usd("0.4") {
		t.Errorf("a return whose batch was not applied, retried: %v, alone %v, returned %s", p.err, p.alone, p.op.Returned)
	}
	if bal, _ := db.Balance(ctx, a.ID); bal.Held != usd("2.2") {
		t.Errorf("held %s, want 2.2", bal.Held)
	}
}

// TestRetryAloneCountsAReplayedCharge: a charge against a reservation whose
// batch was committed with its answer lost is replayed when retried alone;
// the batch's commit took it from the row, so the reservation counts it as
// taken, or it would place holds against money its row no longer holds.
func TestRetryAloneCountsAReplayedCharge(t *testing.T) {
	ctx := context.Background()
	db, a, k := retryStore(t)
	b := New(db, Options{})
	defer b.Close()
	usd := tollgate.MustParseAmount
	now := time.Now()
	rsv := tollgate.NewID("rsv_")
	create := tollgate.BillingOp{Kind: tollgate.OpReserve, Reservation: rsv, Need: usd("1"), Fraction: 1, Create: true,
		Hold: tollgate.Hold{ID: rsv, AccountID: a.ID, KeyID: k.ID, Owner: "inst_r", Created: now, Expires: now.Add(time.Hour), Amount: usd("1")}}
	if err := db.ApplyBilling(ctx, []*tollgate.BillingOp{&create}); err != nil {
		t.Fatal(err)
	}
	// A hold of 0.5 in memory, settled for 0.3 of which the reservation
	// covers 0.2, as chargeReserved does. A charge beyond what is covered
	// is not summed, so that SQLite checks for an earlier charge of the
	// hold as PostgreSQL does for any charge applied alone.
	r := &resv{id: rsv, account: a.ID, key: k.ID, res: usd("1"), exists: true, pending: usd("0.2")}
	p := &pending{op: tollgate.BillingOp{Kind: tollgate.OpCharge, HoldID: tollgate.NewID("hold_"), Reservation: rsv, Covered: usd("0.2"),
		Charge: tollgate.Charge{RequestID: tollgate.NewID("req_"), AccountID: a.ID, KeyID: k.ID, Model: "m",
			Class: tollgate.ClassNetwork, PromptTokens: 1, CompletionTokens: 1, Cost: usd("0.3"), Time: now}},
		mem: &memHold{r: r, amount: usd("0.5")}, done: make(chan struct{})}
	other := &pending{op: tollgate.BillingOp{Kind: tollgate.OpRelease, HoldID: "hold_none"}, done: make(chan struct{})}
	ops := []*tollgate.BillingOp{&p.op, &other.op}
	if err := db.ApplyBilling(ctx, ops); err != nil { // committed; its answer is lost
		t.Fatal(err)
	}
	b.retryAlone(ctx, []*pending{p, other}, ops, errors.New("connection lost during COMMIT"))
	<-p.done
	<-other.done
	if p.err != nil || !p.alone {
		t.Fatalf("the charge retried alone: %v, alone %v", p.err, p.alone)
	}
	hs, err := db.Holds(ctx, a.ID)
	if err != nil || len(hs) != 1 || hs[0].Amount != usd("0.8") {
		t.Fatalf("rows %+v, %v: want the reservation holding 0.8 (the charge taken once)", hs, err)
	}
	if r.res != usd("0.8") || r.pending != 0 {
		t.Errorf("the reservation counts %s (pending %s), want its row's 0.8", r.res, r.pending)
	}
}
