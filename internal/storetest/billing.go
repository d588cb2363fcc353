package storetest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/operator"
)

// BillingStore is what a store must offer for billing (both stores do).
type BillingStore interface {
	tollgate.Store
	billing.Store
	billing.BooksStore
	Holds(ctx context.Context, accountID string) ([]tollgate.Hold, error)
	LedgerEntry(ctx context.Context, id string) (tollgate.LedgerEntry, error)
}

// runBilling runs the billing part of the suite.
func runBilling(t *testing.T, open func(t *testing.T) Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s BillingStore)
	}{
		{"OpeningEntry", testBillingOpening},
		{"HoldSettle", testBillingHoldSettle},
		{"Insufficient", testBillingInsufficient},
		{"Excess", testBillingExcess},
		{"Release", testBillingRelease},
		{"KeyLimit", testBillingKeyLimit},
		{"RateLimit", testBillingRateLimit},
		{"LeaseSweep", testBillingLeaseSweep},
		{"EndedHolds", testBillingEndedHolds},
		{"LateSettle", testBillingLateSettle},
		{"CreditDebit", testBillingCreditDebit},
		{"ConcurrentHolds", testBillingConcurrentHolds},
		{"Reservation", testBillingReservation},
		{"ReservationReturnAll", testBillingReservationReturnAll},
		{"LedgerFilters", testBillingLedgerFilters},
		{"SearchFees", testBillingSearchFees},
		{"AuditRuns", testAuditRuns},
	}
	for _, tc := range tests {
		t.Run("Billing"+tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, open(t))
		})
	}
}

func fundedKey(t *testing.T, s BillingStore, balance tollgate.Amount, mod func(*tollgate.Key)) (tollgate.Account, tollgate.Key) {
	t.Helper()
	a := tollgate.Account{ID: tollgate.NewID("acct_"), Name: "billing", Created: t0, Balance: balance}
	if err := s.CreateAccount(ctx(t), a); err != nil {
		t.Fatalf("CreateAccount: %v", err)
	}
	k, _ := newKey(t, s, a.ID, mod)
	return a, k
}

func holdOp(a tollgate.Account, k tollgate.Key, amount tollgate.Amount, now time.Time) *tollgate.BillingOp {
	return &tollgate.BillingOp{Kind: tollgate.OpHold, Hold: tollgate.Hold{
		ID: tollgate.NewID("hold_"), RequestID: tollgate.NewID("req_"), AccountID: a.ID, KeyID: k.ID, Model: "m",
		Class: tollgate.ClassNetwork, Amount: amount, Tokens: 1000, Minute: now.Unix() / 60, Owner: "inst_test",
		Created: now, Expires: now.Add(time.Minute),
	}}
}

func settleOp(h *tollgate.BillingOp, cost tollgate.Amount, now time.Time) *tollgate.BillingOp {
	return &tollgate.BillingOp{Kind: tollgate.OpSettle, HoldID: h.Hold.ID, Charge: tollgate.Charge{
		RequestID: h.Hold.RequestID, AccountID: h.Hold.AccountID, KeyID: h.Hold.KeyID, Model: "m", Class: tollgate.ClassNetwork,
		Node: "gpu-1", PromptTokens: 100, CompletionTokens: 20, CachedTokens: 7, ReasoningTokens: 5,
		Prices: tollgate.Prices{Input: tollgate.MustParseRate("0.3"), Output: tollgate.MustParseRate("1.2")},
		Cost:   cost, Estimated: true, Time: now,
	}}
}

func apply(t *testing.T, s BillingStore, ops ...*tollgate.BillingOp) {
	t.Helper()
	if err := s.ApplyBilling(ctx(t), ops); err != nil {
		t.Fatalf("ApplyBilling: %v", err)
	}
}

func wantBalance(t *testing.T, s BillingStore, acct string, balance, held tollgate.Amount) {
	t.Helper()
	b, err := s.Balance(ctx(t), acct)
	if err != nil {
		t.Fatalf("Balance: %v", err)
	}
	if b.Balance != balance || b.Held != held || b.Free != balance-held {
		t.Errorf("balance/held/free = %s/%s/%s, want %s/%s/%s", b.Balance, b.Held, b.Free, balance, held, balance-held)
	}
}

func auditClean(t *testing.T, s BillingStore, now time.Time) billing.AuditReport {
	t.Helper()
	r, err := billing.Audit(ctx(t), s, now, time.Second)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	if !r.OK {
		t.Errorf("audit found problems: %v", r.Problems)
	}
	return r
}

var usd = tollgate.MustParseAmount

func testBillingOpening(t *testing.T, s BillingStore) {
	a, _ := fundedKey(t, s, usd("5.5"), nil)
	var entries []tollgate.LedgerEntry
	if err := s.Ledger(ctx(t), tollgate.UsageFilter{AccountID: a.ID}, func(e tollgate.LedgerEntry) error {
		entries = append(entries, e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Kind != tollgate.LedgerOpening || entries[0].Amount != usd("5.5") {
		t.Fatalf("ledger of a new account = %+v, want one opening entry of 5.5", entries)
	}
	// An account created without money has no entry.
	z := tollgate.Account{ID: tollgate.NewID("acct_"), Name: "zero", Created: t0}
	if err := s.CreateAccount(ctx(t), z); err != nil {
		t.Fatal(err)
	}
	n := 0
	_ = s.Ledger(ctx(t), tollgate.UsageFilter{AccountID: z.ID}, func(tollgate.LedgerEntry) error { n++; return nil })
	if n != 0 {
		t.Errorf("a zero-balance account has %d ledger entries", n)
	}
	auditClean(t, s, t0)
}

func testBillingHoldSettle(t *testing.T, s BillingStore) {
	a, k := fundedKey(t, s, usd("1"), nil)
	h := holdOp(a, k, usd("0.25"), t0)
	apply(t, s, h)
	if h.Outcome != tollgate.HoldOK {
		t.Fatalf("hold outcome = %d, want OK", h.Outcome)
	}
	wantBalance(t, s, a.ID, usd("1"), usd("0.25"))
	hs, err := s.Holds(ctx(t), a.ID)
	if err != nil || len(hs) != 1 || hs[0].ID != h.Hold.ID || hs[0].Amount != usd("0.25") || hs[0].Owner != "inst_test" {
		t.Fatalf("Holds = %+v, %v", hs, err)
	}
	st := settleOp(h, usd("0.000123456789"), t0.Add(time.Second))
	apply(t, s, st)
	if st.Charged != usd("0.000123456789") || st.Uncollected != 0 || st.Replayed {
		t.Fatalf("settle: charged %s uncollected %s replayed %t", st.Charged, st.Uncollected, st.Replayed)
	}
	wantBalance(t, s, a.ID, usd("0.999876543211"), 0)
	e, err := s.LedgerEntry(ctx(t), h.Hold.RequestID)
	if err != nil {
		t.Fatal(err)
	}
	c := e.Charge
	if e.Kind != tollgate.LedgerCharge || e.Amount != -usd("0.000123456789") || e.HoldID != h.Hold.ID || c == nil ||
		c.KeyID != k.ID || c.Model != "m" || c.Class != tollgate.ClassNetwork || c.Node != "gpu-1" ||
		c.PromptTokens != 100 || c.CompletionTokens != 20 || c.CachedTokens != 7 || c.ReasoningTokens != 5 ||
		c.Prices.Input != tollgate.MustParseRate("0.3") || c.Prices.Output != tollgate.MustParseRate("1.2") ||
		c.Cost != usd("0.000123456789") || !c.Estimated || !e.Time.Equal(t0.Add(time.Second).Truncate(time.Microsecond)) {
		t.Errorf("ledger row = %+v charge %+v", e, c)
	}
	// A retried settle charges nothing more and returns the first charge.
	again := settleOp(h, usd("0.5"), t0.Add(2*time.Second))
	apply(t, s, again)
	if !again.Replayed || again.Charged != usd("0.000123456789") {
		t.Errorf("second settle: replayed %t charged %s", again.Replayed, again.Charged)
	}
	wantBalance(t, s, a.ID, usd("0.999876543211"), 0)
	auditClean(t, s, t0)
}

func testBillingInsufficient(t *testing.T, s BillingStore) {
	a, k := fundedKey(t, s, usd("1"), nil)
	h1 := holdOp(a, k, usd("0.6"), t0)
	h2 := holdOp(a, k, usd("0.6"), t0)
	apply(t, s, h1, h2)
	if h1.Outcome != tollgate.HoldOK || h2.Outcome != tollgate.HoldInsufficient || h2.Free != usd("0.4") {
		t.Fatalf("outcomes %d, %d (free %s); want OK, insufficient with 0.4 free", h1.Outcome, h2.Outcome, h2.Free)
	}
	wantBalance(t, s, a.ID, usd("1"), usd("0.6"))
	exact := holdOp(a, k, usd("0.4"), t0)
	apply(t, s, exact)
	if exact.Outcome != tollgate.HoldOK {
		t.Errorf("a hold of exactly the free balance: outcome %d", exact.Outcome)
	}
	none := holdOp(tollgate.Account{ID: "acct_nope"}, k, 1, t0)
	apply(t, s, none)
	if none.Outcome != tollgate.HoldNoAccount {
		t.Errorf("hold on a missing account: outcome %d", none.Outcome)
	}
	auditClean(t, s, t0)
}

// A backend reporting more than the hold: the excess is charged from the
// free balance, never from other holds, never below zero.
func testBillingExcess(t *testing.T, s BillingStore) {
	a, k := fundedKey(t, s, usd("1"), nil)
	h1 := holdOp(a, k, usd("0.3"), t0)
	h2 := holdOp(a, k, usd("0.5"), t0)
	apply(t, s, h1, h2)
	// Free is 0.2: h1 may take its 0.3 plus 0.2, not h2's 0.5.
	st := settleOp(h1, usd("0.7"), t0)
	apply(t, s, st)
	if st.Charged != usd("0.5") || st.Uncollected != usd("0.2") {
		t.Fatalf("charged %s uncollected %s, want 0.5 and 0.2", st.Charged, st.Uncollected)
	}
	wantBalance(t, s, a.ID, usd("0.5"), usd("0.5"))
	st2 := settleOp(h2, usd("9"), t0)
	apply(t, s, st2)
	if st2.Charged != usd("0.5") || st2.Uncollected != usd("8.5") {
		t.Fatalf("charged %s uncollected %s, want 0.5 and 8.5", st2.Charged, st2.Uncollected)
	}
	wantBalance(t, s, a.ID, 0, 0)
	e, err := s.LedgerEntry(ctx(t), h2.Hold.RequestID)
	if err != nil || e.Uncollected != usd("8.5") || e.Charge.Cost != usd("9") || e.Amount != -usd("0.5") {
		t.Errorf("ledger row %+v, %v", e, err)
	}
	auditClean(t, s, t0)
}

func testBillingRelease(t *testing.T, s BillingStore) {
	a, k := fundedKey(t, s, usd("1"), func(k *tollgate.Key) { k.TPM = 1_000_000 })
	h := holdOp(a, k, usd("0.9"), t0)
	apply(t, s, h)
	rel := &tollgate.BillingOp{Kind: tollgate.OpRelease, HoldID: h.Hold.ID}
	apply(t, s, rel)
	if rel.Replayed {
		t.Error("first release reported as replayed")
	}
	wantBalance(t, s, a.ID, usd("1"), 0)
	again := &tollgate.BillingOp{Kind: tollgate.OpRelease, HoldID: h.Hold.ID}
	apply(t, s, again)
	if !again.Replayed {
		t.Error("second release not reported as replayed")
	}
	wantBalance(t, s, a.ID, usd("1"), 0)
	if hs, _ := s.Holds(ctx(t), a.ID); len(hs) != 0 {
		t.Errorf("holds after release: %+v", hs)
	}
	auditClean(t, s, t0)
}

func testBillingKeyLimit(t *testing.T, s BillingStore) {
	a, k := fundedKey(t, s, usd("10"), func(k *tollgate.Key) { k.SpendLimit = usd("1") })
	keys, err := s.Keys(ctx(t), a.ID)
	if err != nil || len(keys) != 1 || keys[0].SpendLimit != usd("1") {
		t.Fatalf("Keys = %+v, %v; want the spend limit stored", keys, err)
	}
	h1 := holdOp(a, k, usd("0.7"), t0)
	h2 := holdOp(a, k, usd("0.4"), t0)
	apply(t, s, h1, h2)
	if h1.Outcome != tollgate.HoldOK || h2.Outcome != tollgate.HoldKeyLimit || h2.Free != usd("0.3") {
		t.Fatalf("outcomes %d, %d (left %s); want OK, key limit with 0.3 left", h1.Outcome, h2.Outcome, h2.Free)
	}
	apply(t, s, settleOp(h1, usd("0.6"), t0))
	h3 := holdOp(a, k, usd("0.4"), t0)
	h4 := holdOp(a, k, usd("0.01"), t0)
	apply(t, s, h3, h4)
	if h3.Outcome != tollgate.HoldOK || h4.Outcome != tollgate.HoldKeyLimit || h4.Free != 0 {
		t.Errorf("after spending 0.6 of 1: outcomes %d, %d (left %s)", h3.Outcome, h4.Outcome, h4.Free)
	}
	wantBalance(t, s, a.ID, usd("9.4"), usd("0.4"))
	auditClean(t, s, t0)
}

func testBillingRateLimit(t *testing.T, s BillingStore) {
	now := time.Date(2025, 3, 14, 15, 9, 10, 0, time.UTC)
	a, k := fundedKey(t, s, usd("10"), func(k *tollgate.Key) { k.RPM = 2 })
	ops := []*tollgate.BillingOp{holdOp(a, k, 1, now), holdOp(a, k, 1, now), holdOp(a, k, 1, now)}
	apply(t, s, ops...)
	if ops[0].Outcome != tollgate.HoldOK || ops[1].Outcome != tollgate.HoldOK || ops[2].Outcome != tollgate.HoldRateLimited {
		t.Fatalf("rpm 2: outcomes %d %d %d", ops[0].Outcome, ops[1].Outcome, ops[2].Outcome)
	}
	if want := time.Date(2025, 3, 14, 15, 10, 0, 0, time.UTC); !ops[2].RetryAt.Equal(want) {
		t.Errorf("RetryAt = %v, want the next minute %v", ops[2].RetryAt, want)
	}
	// A release frees tokens, not requests: the request was made.
	apply(t, s, &tollgate.BillingOp{Kind: tollgate.OpRelease, HoldID: ops[0].Hold.ID})
	again := holdOp(a, k, 1, now)
	next := holdOp(a, k, 1, now.Add(time.Minute))
	apply(t, s, again, next)
	if again.Outcome != tollgate.HoldRateLimited || next.Outcome != tollgate.HoldOK {
		t.Errorf("same minute after a release: %d (want rate limited); next minute: %d (want OK)", again.Outcome, next.Outcome)
	}

	// Tokens per minute: the bound counts while in flight, the actual tokens after.
	a2, k2 := fundedKey(t, s, usd("10"), func(k *tollgate.Key) { k.TPM = 1500 })
	t1 := holdOp(a2, k2, 1, now) // 1000 tokens
	t2 := holdOp(a2, k2, 1, now) // 2000 < 1500? no: admitted while the window is below the limit
	t3 := holdOp(a2, k2, 1, now)
	apply(t, s, t1, t2, t3)
	if t1.Outcome != tollgate.HoldOK || t2.Outcome != tollgate.HoldOK || t3.Outcome != tollgate.HoldRateLimited {
		t.Fatalf("tpm 1500 with bounds of 1000: outcomes %d %d %d", t1.Outcome, t2.Outcome, t3.Outcome)
	}
	// Settling both at 120 tokens each brings the window to 240: room again.
	apply(t, s, settleOp(t1, 1, now), settleOp(t2, 1, now))
	t4 := holdOp(a2, k2, 1, now)
	apply(t, s, t4)
	if t4.Outcome != tollgate.HoldOK {
		t.Errorf("after settling below the bound: outcome %d, want OK", t4.Outcome)
	}
	auditClean(t, s, now)
}

func testBillingLeaseSweep(t *testing.T, s BillingStore) {
	a, k := fundedKey(t, s, usd("1"), nil)
	mine := holdOp(a, k, usd("0.1"), t0)
	other := holdOp(a, k, usd("0.2"), t0)
	other.Hold.Owner = "inst_dead"
	apply(t, s, mine, other)
	n, err := s.RenewHolds(ctx(t), "inst_test", t0.Add(10*time.Minute), t0.Add(-time.Hour))
	if err != nil || n != 1 {
		t.Fatalf("RenewHolds = %d, %v; want 1", n, err)
	}
	// Holds older than createdAfter are not renewed.
	if n, _ := s.RenewHolds(ctx(t), "inst_test", t0.Add(20*time.Minute), t0.Add(time.Second)); n != 0 {
		t.Errorf("RenewHolds renewed %d holds created before createdAfter", n)
	}
	// The audit sees the dead instance's expired hold as orphaned.
	r, err := billing.Audit(ctx(t), s, t0.Add(5*time.Minute), time.Second)
	if err != nil || r.OK {
		t.Errorf("audit with an expired hold: ok=%t %v (problems %v)", r.OK, err, r.Problems)
	}
	swept, err := s.SweepHolds(ctx(t), t0.Add(5*time.Minute), time.Time{}, 100)
	if err != nil || len(swept) != 1 || swept[0].ID != other.Hold.ID {
		t.Fatalf("SweepHolds = %+v, %v; want the dead instance's hold alone", swept, err)
	}
	wantBalance(t, s, a.ID, usd("1"), usd("0.1"))
	if again, _ := s.SweepHolds(ctx(t), t0.Add(5*time.Minute), time.Time{}, 100); len(again) != 0 {
		t.Errorf("second sweep released %d holds", len(again))
	}
	auditClean(t, s, t0.Add(5*time.Minute))
}

// A hold whose request ended while its settle or release could not be
// written is marked ended (EndHolds, once: the first mark stays; a
// reservation is never marked): renewals skip it, the audit lists it once
// its mark is older than the grace (and not before), and the sweep
// releases it once its mark is older than endedBefore, whatever its lease.
func testBillingEndedHolds(t *testing.T, s BillingStore) {
	a, k := fundedKey(t, s, usd("1"), nil)
	ended, running := holdOp(a, k, usd("0.1"), t0), holdOp(a, k, usd("0.2"), t0)
	ended.Hold.Expires, running.Hold.Expires = t0.Add(time.Hour), t0.Add(time.Hour)
	rsv := &tollgate.BillingOp{Kind: tollgate.OpReserve, Reservation: "rsv_ended", Need: usd("0.1"), Fraction: 1, Create: true,
		Hold: tollgate.Hold{ID: "rsv_ended", AccountID: a.ID, KeyID: k.ID, Owner: "inst_test", Created: t0, Expires: t0.Add(time.Hour), Amount: usd("0.3")}}
	apply(t, s, ended, running, rsv)
	if rsv.Outcome != tollgate.HoldOK || rsv.Granted != usd("0.3") {
		t.Fatalf("reserve: outcome %d granted %s", rsv.Outcome, rsv.Granted)
	}
	mark := t0.Add(time.Minute)
	n, err := s.EndHolds(ctx(t), []string{ended.Hold.ID, "rsv_ended", "hold_gone"}, mark)
	if err != nil || n != 1 {
		t.Fatalf("EndHolds = %d, %v; want the request's hold alone marked", n, err)
	}
	if n, err := s.EndHolds(ctx(t), []string{ended.Hold.ID}, mark.Add(time.Hour)); err != nil || n != 0 {
		t.Errorf("EndHolds of a marked hold = %d, %v; want 0 (the first mark stays)", n, err)
	}
	if n, err := s.EndHolds(ctx(t), nil, mark); err != nil || n != 0 {
		t.Errorf("EndHolds of nothing = %d, %v", n, err)
	}
	hs, err := s.Holds(ctx(t), a.ID)
	if err != nil || len(hs) != 3 {
		t.Fatalf("Holds = %+v, %v", hs, err)
	}
	for _, h := range hs {
		if want := (h.ID == ended.Hold.ID); want != !h.Ended.IsZero() || (want && !h.Ended.Equal(mark.Truncate(time.Microsecond))) {
			t.Errorf("hold %s: ended %v", h.ID, h.Ended)
		}
	}
	// Renewals skip the ended hold: the running one and the reservation.
	if n, err := s.RenewHolds(ctx(t), "inst_test", t0.Add(2*time.Hour), t0.Add(-time.Hour)); err != nil || n != 2 {
		t.Errorf("RenewHolds = %d, %v; want 2 (the running hold and the reservation, not the ended one)", n, err)
	}
	hs, _ = s.Holds(ctx(t), a.ID)
	for _, h := range hs {
		if h.ID == ended.Hold.ID && !h.Expires.Equal(t0.Add(time.Hour).Truncate(time.Microsecond)) {
			t.Errorf("the ended hold's lease was renewed to %v", h.Expires)
		}
	}
	// The audit: clean while the mark is within the grace, the hold
	// listed once it is older.
	auditClean(t, s, mark.Add(500*time.Millisecond))
	r, err := billing.Audit(ctx(t), s, mark.Add(2*time.Second), time.Second)
	if err != nil || r.OK || len(r.Problems) != 1 {
		t.Fatalf("audit with a stranded hold: ok=%t %v problems %v", r.OK, err, r.Problems)
	}
	var got []string
	for _, d := range r.Details {
		got = append(got, d.StrandedHolds...)
	}
	if !slices.Equal(got, []string{ended.Hold.ID}) {
		t.Errorf("stranded holds %v, want [%s]", got, ended.Hold.ID)
	}
	// The sweep releases it once its mark is older than endedBefore, not before.
	if hs, err := s.SweepHolds(ctx(t), mark, mark, 100); err != nil || len(hs) != 0 {
		t.Errorf("sweep before the bound: %+v, %v", hs, err)
	}
	swept, err := s.SweepHolds(ctx(t), mark, mark.Add(time.Second), 100)
	if err != nil || len(swept) != 1 || swept[0].ID != ended.Hold.ID || swept[0].Ended.IsZero() {
		t.Fatalf("SweepHolds = %+v, %v; want the ended hold alone", swept, err)
	}
	wantBalance(t, s, a.ID, usd("1"), usd("0.5"))
	auditClean(t, s, mark.Add(time.Hour))
}

// A settle after the sweeper released the hold (the lease ran out) still
// charges the request, from the free balance only.
func testBillingLateSettle(t *testing.T, s BillingStore) {
	a, k := fundedKey(t, s, usd("1"), nil)
	h := holdOp(a, k, usd("0.5"), t0)
	other := holdOp(a, k, usd("0.8"), t0)
	apply(t, s, h)
	if _, err := s.SweepHolds(ctx(t), t0.Add(time.Hour), time.Time{}, 10); err != nil {
		t.Fatal(err)
	}
	other.Hold.Expires = t0.Add(2 * time.Hour)
	apply(t, s, other)
	st := settleOp(h, usd("0.3"), t0)
	apply(t, s, st)
	if st.Charged != usd("0.2") || st.Uncollected != usd("0.1") {
		t.Errorf("late settle: charged %s uncollected %s; want 0.2 (the free balance) and 0.1", st.Charged, st.Uncollected)
	}
	wantBalance(t, s, a.ID, usd("0.8"), usd("0.8"))
	auditClean(t, s, t0)
}

func testBillingCreditDebit(t *testing.T, s BillingStore) {
	a, k := fundedKey(t, s, usd("1"), nil)
	now := t0.Add(time.Minute)
	p, err := operator.Post(ctx(t), s, tollgate.LedgerCredit, a.ID, usd("2.5"), "top-up", "the CLI as ops@host", now)
	if err != nil || p.Entry.Amount != usd("2.5") || p.Entry.Seq == 0 || p.Balance.Balance != usd("3.5") || p.Balance.Free != usd("3.5") {
		t.Fatalf("credit: %+v, %v", p, err)
	}
	apply(t, s, holdOp(a, k, usd("3"), now))
	// Free is 0.5: a debit of 0.6 would leave the hold uncovered.
	_, err = operator.Post(ctx(t), s, tollgate.LedgerDebit, a.ID, usd("0.6"), "refund", "", now)
	if tollgate.ErrorCode(err) != tollgate.CodeInsufficientBalance {
		t.Fatalf("debit beyond the free balance: %v, want insufficient_balance", err)
	}
	p, err = operator.Post(ctx(t), s, tollgate.LedgerDebit, a.ID, usd("0.5"), "refund", "the admin API from 10.0.0.2", now)
	if err != nil || p.Entry.Amount != -usd("0.5") || p.Balance.Balance != usd("3") || p.Balance.Held != usd("3") || p.Balance.Free != 0 {
		t.Fatalf("debit: %+v, %v", p, err)
	}
	wantBalance(t, s, a.ID, usd("3"), usd("3"))
	if _, err := operator.Post(ctx(t), s, tollgate.LedgerCredit, "acct_nope", 1, "", "", now); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("credit of a missing account: %v, want ErrNotFound", err)
	}
	r := auditClean(t, s, now)
	if len(r.Details) != 1 || r.Details[0].Opening != usd("1") || r.Details[0].Credits != usd("2.5") || r.Details[0].Debits != usd("0.5") {
		t.Errorf("audit details = %+v", r.Details)
	}
}

// Many writers at once against an account that affords exactly n holds:
// exactly n succeed, whichever connection or process they come from.
func testBillingConcurrentHolds(t *testing.T, s BillingStore) {
	const n, tries = 7, 40
	a, k := fundedKey(t, s, usd("0.7"), nil)
	var wg sync.WaitGroup
	results := make([]*tollgate.BillingOp, tries)
	for i := range tries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			op := holdOp(a, k, usd("0.1"), t0)
			if err := s.ApplyBilling(context.Background(), []*tollgate.BillingOp{op}); err != nil {
				t.Errorf("ApplyBilling: %v", err)
			}
			results[i] = op
		}()
	}
	wg.Wait()
	ok := 0
	for _, op := range results {
		if op.Outcome == tollgate.HoldOK {
			ok++
		}
	}
	if ok != n {
		t.Errorf("%d holds placed, want exactly %d", ok, n)
	}
	wantBalance(t, s, a.ID, usd("0.7"), usd("0.7"))
	auditClean(t, s, t0)
}

// Reservations: a top-up is counted in held, refused when the free balance
// is too small or the key has limits; charges against it write one ledger row
// each and move the sum in the same transaction (a batch with a duplicate
// request id changes nothing); a return gives back the rest and deletes the
// row; a dead instance's reservation is swept.
func testBillingReservation(t *testing.T, s BillingStore) {
	now := time.Now().UTC().Truncate(time.Microsecond)
	a, k := fundedKey(t, s, usd("10"), nil)
	reserve := func(id string, want, need, minFree tollgate.Amount, create bool) *tollgate.BillingOp {
		return &tollgate.BillingOp{Kind: tollgate.OpReserve, Reservation: id, Need: need, MinFree: minFree, Fraction: 4, Create: create,
			Hold: tollgate.Hold{ID: id, AccountID: a.ID, KeyID: k.ID, Owner: "inst_r", Created: now, Expires: now.Add(time.Minute), Amount: want}}
	}
	rsv := tollgate.NewID("rsv_")
	op := reserve(rsv, usd("5"), usd("0.1"), 0, true)
	apply(t, s, op)
	if op.Outcome != tollgate.HoldOK || op.Granted != usd("2.5") { // at most a quarter of the free balance
		t.Fatalf("reserve: outcome %d granted %s, want OK and 2.5", op.Outcome, op.Granted)
	}
	wantBalance(t, s, a.ID, usd("10"), usd("2.5"))
	op = reserve(rsv, usd("1"), usd("0.1"), usd("100"), false)
	apply(t, s, op)
	if op.Outcome != tollgate.HoldInsufficient || op.Free != usd("7.5") || op.Granted != 0 {
		t.Errorf("reserve below MinFree: outcome %d free %s granted %s", op.Outcome, op.Free, op.Granted)
	}
	op = reserve(rsv, usd("1"), usd("0.1"), 0, false)
	apply(t, s, op)
	if op.Outcome != tollgate.HoldOK || op.Granted != usd("1") {
		t.Errorf("top-up: outcome %d granted %s", op.Outcome, op.Granted)
	}
	wantBalance(t, s, a.ID, usd("10"), usd("3.5"))

	charge := func(cost, covered tollgate.Amount) *tollgate.BillingOp {
		h := holdOp(a, k, 0, now)
		c := settleOp(h, cost, now)
		c.Kind, c.Reservation, c.Covered = tollgate.OpCharge, rsv, covered
		return c
	}
	c1, c2 := charge(usd("0.5"), usd("0.5")), charge(usd("0.25"), usd("0.25"))
	apply(t, s, c1, c2)
	if c1.Charged != usd("0.5") || c2.Charged != usd("0.25") {
		t.Errorf("charged %s and %s", c1.Charged, c2.Charged)
	}
	wantBalance(t, s, a.ID, usd("9.25"), usd("2.75"))
	// A batch whose second charge repeats a request id fails as a whole.
	c3 := charge(usd("1"), usd("1"))
	dup := charge(usd("1"), usd("1"))
	dup.Charge.RequestID = c1.Charge.RequestID
	if err := s.ApplyBilling(ctx(t), []*tollgate.BillingOp{c3, dup}); err == nil {
		t.Error("a batch with a duplicate request id was applied")
	} else if !errors.Is(err, tollgate.ErrNotApplied) {
		t.Errorf("a batch the store refused: %v, want it marked not applied", err)
	}
	wantBalance(t, s, a.ID, usd("9.25"), usd("2.75"))
	if _, err := s.LedgerEntry(ctx(t), c3.Charge.RequestID); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("the failed batch left a ledger row: %v", err)
	}
	// Excess beyond the reservation's cover comes from the free balance.
	c4 := charge(usd("1"), usd("0.5"))
	apply(t, s, c4)
	if c4.Charged != usd("1") || c4.Uncollected != 0 {
		t.Errorf("excess charge: %s charged, %s uncollected", c4.Charged, c4.Uncollected)
	}
	wantBalance(t, s, a.ID, usd("8.25"), usd("2.25"))
	ret := &tollgate.BillingOp{Kind: tollgate.OpReturn, Reservation: rsv, Return: usd("2.25"), Hold: tollgate.Hold{AccountID: a.ID, KeyID: k.ID}}
	apply(t, s, ret)
	if ret.Gone {
		t.Error("return: gone")
	}
	wantBalance(t, s, a.ID, usd("8.25"), 0)
	if hs, _ := s.Holds(ctx(t), a.ID); len(hs) != 0 {
		t.Errorf("an empty reservation row is left: %+v", hs)
	}
	// Charged after the row is gone (swept): from the free balance alone.
	c5 := charge(usd("0.25"), usd("0.25"))
	apply(t, s, c5)
	if !c5.Gone || c5.Charged != usd("0.25") {
		t.Errorf("charge on a gone reservation: gone %v charged %s", c5.Gone, c5.Charged)
	}
	wantBalance(t, s, a.ID, usd("8"), 0)
	auditClean(t, s, now)

	// A dead instance's reservation is swept after its lease.
	rsv2 := tollgate.NewID("rsv_")
	apply(t, s, reserve(rsv2, usd("1"), usd("0.1"), 0, true))
	wantBalance(t, s, a.ID, usd("8"), usd("1"))
	if hs, err := s.SweepHolds(ctx(t), now.Add(2*time.Minute), time.Time{}, 100); err != nil || len(hs) != 1 || hs[0].ID != rsv2 {
		t.Errorf("sweep: %+v, %v", hs, err)
	}
	wantBalance(t, s, a.ID, usd("8"), 0)
	op = reserve(rsv2, usd("1"), usd("0.1"), 0, false)
	apply(t, s, op)
	if !op.Gone || op.Granted != 0 {
		t.Errorf("top-up of a swept reservation: gone %v granted %s", op.Gone, op.Granted)
	}

	// A key with limits is refused reservations.
	_, lk := fundedKey(t, s, usd("10"), func(k *tollgate.Key) { k.RPM = 10 })
	op = reserve(tollgate.NewID("rsv_"), usd("1"), usd("0.1"), 0, true)
	op.Hold.AccountID, op.Hold.KeyID = lk.AccountID, lk.ID
	apply(t, s, op)
	if op.Outcome != tollgate.HoldDirect {
		t.Errorf("reserve for a key with a rate limit: outcome %d, want HoldDirect", op.Outcome)
	}
	auditClean(t, s, now)
}

// A return of all (OpReturn with ReturnAll) gives back what the row holds,
// whatever Return says, and deletes it: a row holding more than its
// instance counts (a top-up whose answer was lost) and one holding less (a
// return whose answer was lost) alike. Of a row that does not exist it is a
// no-op reported Gone. Beside another account's operations in one batch.
func testBillingReservationReturnAll(t *testing.T, s BillingStore) {
	now := time.Now().UTC().Truncate(time.Microsecond)
	a, k := fundedKey(t, s, usd("10"), nil)
	b, kb := fundedKey(t, s, usd("10"), nil)
	reserve := func(acct tollgate.Account, key tollgate.Key, id string, want tollgate.Amount, create bool) *tollgate.BillingOp {
		return &tollgate.BillingOp{Kind: tollgate.OpReserve, Reservation: id, Need: usd("0.1"), Fraction: 4, Create: create,
			Hold: tollgate.Hold{ID: id, AccountID: acct.ID, KeyID: key.ID, Owner: "inst_all", Created: now, Expires: now.Add(time.Minute), Amount: want}}
	}
	returnOp := func(acct tollgate.Account, key tollgate.Key, id string, amount tollgate.Amount, all bool) *tollgate.BillingOp {
		return &tollgate.BillingOp{Kind: tollgate.OpReturn, Reservation: id, Return: amount, ReturnAll: all,
			Hold: tollgate.Hold{AccountID: acct.ID, KeyID: key.ID}}
	}
	// The row holds 1.5 (two top-ups); its instance counts 1 (the second
	// top-up's answer was lost), and a charge took 0.25 of it.
	rsv := tollgate.NewID("rsv_")
	apply(t, s, reserve(a, k, rsv, usd("1"), true))
	apply(t, s, reserve(a, k, rsv, usd("0.5"), false))
	c := settleOp(holdOp(a, k, 0, now), usd("0.25"), now)
	c.Kind, c.Reservation, c.Covered = tollgate.OpCharge, rsv, usd("0.25")
	apply(t, s, c)
	wantBalance(t, s, a.ID, usd("9.75"), usd("1.25"))
	// Another account's reservation is topped up in the same batch.
	rsvB := tollgate.NewID("rsv_")
	other := reserve(b, kb, rsvB, usd("2"), true)
	all := returnOp(a, k, rsv, usd("0.75"), true)
	apply(t, s, other, all)
	if all.Gone || all.Returned != usd("1.25") {
		t.Errorf("return all of a row holding 1.25: gone %v returned %s", all.Gone, all.Returned)
	}
	if other.Outcome != tollgate.HoldOK || other.Granted != usd("2") {
		t.Errorf("top-up beside it: outcome %d granted %s", other.Outcome, other.Granted)
	}
	wantBalance(t, s, a.ID, usd("9.75"), 0)
	wantBalance(t, s, b.ID, usd("10"), usd("2"))
	if hs, _ := s.Holds(ctx(t), a.ID); len(hs) != 0 {
		t.Errorf("the row is left after a return of all: %+v", hs)
	}

	// Of a row that is gone: nothing changes, reported Gone.
	again := returnOp(a, k, rsv, usd("1"), true)
	apply(t, s, again)
	if !again.Gone || again.Returned != 0 {
		t.Errorf("return all of a gone row: gone %v returned %s", again.Gone, again.Returned)
	}
	never := returnOp(a, k, tollgate.NewID("rsv_"), 0, true)
	apply(t, s, never)
	if !never.Gone || never.Returned != 0 {
		t.Errorf("return all of a row never created: gone %v returned %s", never.Gone, never.Returned)
	}
	wantBalance(t, s, a.ID, usd("9.75"), 0)

	// The row holds less than its instance counts (a return of 0.5 whose
	// answer was lost): all of it is what goes back, 1.5, not the 2 counted.
	part := returnOp(b, kb, rsvB, usd("0.5"), false)
	apply(t, s, part)
	if part.Gone || part.Returned != usd("0.5") {
		t.Errorf("a partial return: gone %v returned %s", part.Gone, part.Returned)
	}
	wantBalance(t, s, b.ID, usd("10"), usd("1.5"))
	all = returnOp(b, kb, rsvB, usd("2"), true)
	apply(t, s, all)
	if all.Gone || all.Returned != usd("1.5") {
		t.Errorf("return all of a row holding 1.5: gone %v returned %s", all.Gone, all.Returned)
	}
	wantBalance(t, s, b.ID, usd("10"), 0)
	if hs, _ := s.Holds(ctx(t), b.ID); len(hs) != 0 {
		t.Errorf("the row is left after a return of all: %+v", hs)
	}
	// An emptied row (a charge took all of it) is returned, 0, and deleted.
	rsvC := tollgate.NewID("rsv_")
	apply(t, s, reserve(b, kb, rsvC, usd("0.5"), true))
	c = settleOp(holdOp(b, kb, 0, now), usd("0.5"), now)
	c.Kind, c.Reservation, c.Covered = tollgate.OpCharge, rsvC, usd("0.5")
	apply(t, s, c)
	empty := returnOp(b, kb, rsvC, 0, true)
	apply(t, s, empty)
	if empty.Gone || empty.Returned != 0 {
		t.Errorf("return all of an emptied row: gone %v returned %s", empty.Gone, empty.Returned)
	}
	if hs, _ := s.Holds(ctx(t), b.ID); len(hs) != 0 {
		t.Errorf("an emptied row is left after a return of all: %+v", hs)
	}
	wantBalance(t, s, b.ID, usd("9.5"), 0)
	auditClean(t, s, now)
}

// testBillingLedgerFilters checks every UsageFilter field alone and together
// against charges of two accounts, three keys, two models, both classes and
// three times: the entries that match, oldest first.
func testBillingLedgerFilters(t *testing.T, s BillingStore) {
	base := t0.Add(1000 * time.Hour) // after anything another test writes
	a, ka1 := fundedKey(t, s, usd("10"), nil)
	ka2, _ := newKey(t, s, a.ID, nil)
	b, kb := fundedKey(t, s, usd("10"), nil)
	charge := func(acct tollgate.Account, key tollgate.Key, model string, class tollgate.BackendClass, at time.Time) string {
		h := holdOp(acct, key, usd("0.5"), at)
		st := settleOp(h, usd("0.01"), at)
		st.Charge.Model, st.Charge.Class = model, class
		apply(t, s, h, st)
		return h.Hold.RequestID
	}
	c1 := charge(a, ka1, "m1", tollgate.ClassNetwork, base.Add(time.Hour))
	c2 := charge(a, ka2, "m2", tollgate.ClassFallback, base.Add(2*time.Hour))
	c3 := charge(b, kb, "m1", tollgate.ClassNetwork, base.Add(3*time.Hour))
	for _, tc := range []struct {
		name string
		f    tollgate.UsageFilter
		want []string
	}{
		{"period", tollgate.UsageFilter{Since: base}, []string{c1, c2, c3}},
		{"period bounds", tollgate.UsageFilter{Since: base.Add(90 * time.Minute), Until: base.Add(3 * time.Hour)}, []string{c2}},
		{"account", tollgate.UsageFilter{AccountID: a.ID, Since: base}, []string{c1, c2}},
		{"key", tollgate.UsageFilter{KeyID: ka2.ID}, []string{c2}},
		{"key of the other account", tollgate.UsageFilter{KeyID: kb.ID, AccountID: b.ID}, []string{c3}},
		{"key and wrong account", tollgate.UsageFilter{KeyID: kb.ID, AccountID: a.ID}, nil},
		{"model", tollgate.UsageFilter{Model: "m1", Since: base}, []string{c1, c3}},
		{"class", tollgate.UsageFilter{Class: tollgate.ClassFallback, Since: base}, []string{c2}},
		{"model and account", tollgate.UsageFilter{Model: "m1", AccountID: b.ID}, []string{c3}},
		{"unknown key", tollgate.UsageFilter{KeyID: "key_none"}, nil},
	} {
		var got []string
		err := s.Ledger(ctx(t), tc.f, func(e tollgate.LedgerEntry) error {
			got = append(got, e.ID)
			return nil
		})
		if err != nil {
			t.Fatalf("%s: Ledger: %v", tc.name, err)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: Ledger(%+v) = %v, want %v", tc.name, tc.f, got, tc.want)
		}
	}
	// The account filter alone includes the opening entry, first.
	var kinds []tollgate.LedgerKind
	if err := s.Ledger(ctx(t), tollgate.UsageFilter{AccountID: b.ID}, func(e tollgate.LedgerEntry) error {
		kinds = append(kinds, e.Kind)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(kinds, []tollgate.LedgerKind{tollgate.LedgerOpening, tollgate.LedgerCharge}) {
		t.Errorf("account %s: kinds %v, want opening then charge", b.ID, kinds)
	}
	auditClean(t, s, base.Add(4*time.Hour))
}

// Web search fees (docs/billing.md, "Web search fees"): a charge's searches
// and search price round-trip through every write path (a settle, a charge
// summed against its reservation, one alone beyond its cover, one recovered
// from a journal), the balance moves by the whole cost, usage counts the
// searches with the cost as the total, and the audit is clean.
func testBillingSearchFees(t *testing.T, s BillingStore) {
	now := time.Now().UTC().Truncate(time.Microsecond)
	a, k := fundedKey(t, s, usd("10"), nil)
	price := usd("0.005")
	withSearches := func(op *tollgate.BillingOp, n int64) *tollgate.BillingOp {
		c := &op.Charge
		tokens, err := c.Prices.Cost(c.PromptTokens, c.CompletionTokens)
		if err != nil {
			t.Fatal(err)
		}
		fee, err := tollgate.SearchFee(n, price)
		if err != nil {
			t.Fatal(err)
		}
		c.Searches, c.SearchPrice = n, price
		if c.Cost, err = tokens.Add(fee); err != nil {
			t.Fatal(err)
		}
		return op
	}
	// 100 × 0.3 + 20 × 1.2 per 1M tokens = 0.000054; 3 searches: + 0.015.
	h := holdOp(a, k, usd("0.5"), now)
	apply(t, s, h)
	st := withSearches(settleOp(h, 0, now), 3)
	if st.Charge.Cost != usd("0.015054") {
		t.Fatalf("cost = %s, want 0.015054", st.Charge.Cost)
	}
	apply(t, s, st)
	if st.Charged != usd("0.015054") || st.Uncollected != 0 {
		t.Fatalf("settle: charged %s uncollected %s", st.Charged, st.Uncollected)
	}
	wantBalance(t, s, a.ID, usd("9.984946"), 0)

	rsv := tollgate.NewID("rsv_")
	grant := &tollgate.BillingOp{Kind: tollgate.OpReserve, Reservation: rsv, Need: usd("0.1"), Fraction: 4, Create: true,
		Hold: tollgate.Hold{ID: rsv, AccountID: a.ID, KeyID: k.ID, Owner: "inst_s", Created: now, Expires: now.Add(time.Minute), Amount: usd("1")}}
	apply(t, s, grant)
	if grant.Outcome != tollgate.HoldOK || grant.Granted != usd("1") {
		t.Fatalf("reserve: outcome %d granted %s", grant.Outcome, grant.Granted)
	}
	charge := func(searches int64, covered tollgate.Amount) *tollgate.BillingOp {
		c := withSearches(settleOp(holdOp(a, k, 0, now), 0, now), searches)
		c.Kind, c.Reservation, c.Covered = tollgate.OpCharge, rsv, covered
		return c
	}
	summed1, summed2 := charge(1, usd("0.3")), charge(0, usd("0.3"))
	alone := charge(7, usd("0.01"))    // beyond its cover: charged alone, the rest from the free balance
	recovered := charge(2, usd("0.2")) // from a dead instance's journal: alone, checked for an earlier charge
	recovered.Recovered = true
	apply(t, s, summed1, summed2, alone, recovered)
	want := map[*tollgate.BillingOp]tollgate.Amount{
		summed1: usd("0.005054"), summed2: usd("0.000054"), alone: usd("0.035054"), recovered: usd("0.010054"),
	}
	total := st.Charged
	for op, cost := range want {
		if op.Charge.Cost != cost || op.Charged != cost || op.Uncollected != 0 {
			t.Errorf("charge with %d searches: cost %s charged %s uncollected %s, want %s", op.Charge.Searches,
				op.Charge.Cost, op.Charged, op.Uncollected, cost)
		}
		total += cost
	}
	for _, op := range []*tollgate.BillingOp{st, summed1, summed2, alone, recovered} {
		e, err := s.LedgerEntry(ctx(t), op.Charge.RequestID)
		if err != nil {
			t.Fatal(err)
		}
		c := e.Charge
		if c == nil || c.Searches != op.Charge.Searches || c.SearchPrice != price || c.Cost != op.Charge.Cost ||
			e.Amount != -op.Charge.Cost || c.Prices != op.Charge.Prices || c.PromptTokens != 100 || c.CompletionTokens != 20 {
			t.Errorf("ledger row of a charge with %d searches: %+v, charge %+v", op.Charge.Searches, e, c)
		}
	}
	// The balance moved by the whole cost of each: tokens and searches.
	wantBalance(t, s, a.ID, usd("10")-total, usd("0.19")) // the reservation less the four covers

	// A row of the listing and the usage groups: searches counted, cost the total.
	searches := int64(0)
	err := s.Ledger(ctx(t), tollgate.UsageFilter{AccountID: a.ID}, func(e tollgate.LedgerEntry) error {
		if e.Kind == tollgate.LedgerCharge {
			searches += e.Charge.Searches
			if e.Charge.SearchPrice != price {
				t.Errorf("listing: %s has search price %s", e.ID, e.Charge.SearchPrice)
			}
		}
		return nil
	})
	if err != nil || searches != 13 {
		t.Errorf("listing: %d searches, %v; want 13", searches, err)
	}
	rows, err := billing.Usage(ctx(t), s, tollgate.UsageFilter{AccountID: a.ID}, []string{"key"}, "")
	if err != nil || len(rows) != 1 || rows[0].Requests != 5 || rows[0].Searches != 13 || rows[0].Cost != total {
		t.Errorf("usage = %+v, %v; want 5 requests, 13 searches, cost %s", rows, err, total)
	}

	// A charge without searches reads as none.
	h2 := holdOp(a, k, usd("0.1"), now)
	apply(t, s, h2)
	plain := settleOp(h2, usd("0.001"), now)
	apply(t, s, plain)
	if e, err := s.LedgerEntry(ctx(t), h2.Hold.RequestID); err != nil || e.Charge.Searches != 0 || e.Charge.SearchPrice != 0 {
		t.Errorf("a charge without searches: %+v, %v", e.Charge, err)
	}
	apply(t, s, &tollgate.BillingOp{Kind: tollgate.OpReturn, Reservation: rsv, Return: usd("0.19"),
		Hold: tollgate.Hold{AccountID: a.ID, KeyID: k.ID}})
	auditClean(t, s, now)
}
