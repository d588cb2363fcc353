package storetest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
)

// runPayments runs the payments part of the suite.
func runPayments(t *testing.T, open func(t *testing.T) Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s Store)
	}{
		{"CreditOnce", testPaymentCreditOnce},
		{"ConcurrentCredit", testPaymentConcurrentCredit},
		{"UnknownPayment", testPaymentUnknown},
		{"Mismatch", testPaymentMismatch},
		{"DisabledAccount", testPaymentDisabledAccount},
		{"Refunds", testPaymentRefunds},
		{"RefundBeyondBalance", testPaymentRefundOwed},
		{"RefundBeforeCredit", testPaymentRefundBeforeCredit},
		{"Hold", testPaymentHold},
		{"DisputeWon", testPaymentDisputeWon},
		{"DisputeLost", testPaymentDisputeLost},
		{"Events", testPaymentEvents},
		{"Fail", testPaymentFail},
		{"AutoTopUp", testAutoTopUp},
	}
	for _, tc := range tests {
		t.Run("Payments"+tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, open(t))
		})
	}
}

// pendingPayment creates an account with balance and a pending checkout
// payment of credit (+ fee) on it.
func pendingPayment(t *testing.T, s Store, balance, credit, fee tollgate.Amount) (tollgate.Account, tollgate.Payment) {
	t.Helper()
	a := tollgate.Account{ID: tollgate.NewID("acct_"), Name: "payer", Created: t0, Balance: balance}
	if err := s.CreateAccount(ctx(t), a); err != nil {
		t.Fatal(err)
	}
	cents, err := (credit + fee).Cents()
	if err != nil {
		t.Fatal(err)
	}
	p := tollgate.Payment{ID: tollgate.NewID("pay_"), AccountID: a.ID, Provider: "stripe", Kind: tollgate.PaymentCheckout,
		CheckoutSession: tollgate.NewID("cs_test_"), Credit: credit, Fee: fee, AmountCents: cents, Currency: "usd", Created: t0}
	if err := s.CreatePayment(ctx(t), p); err != nil {
		t.Fatal(err)
	}
	return a, p
}

func creditOf(p tollgate.Payment, pi string) tollgate.PaymentCredit {
	return tollgate.PaymentCredit{CheckoutSession: p.CheckoutSession, PaymentIntent: pi, AccountID: p.AccountID,
		Provider: "stripe", Credit: p.Credit, Fee: p.Fee, AmountCents: p.AmountCents, Currency: p.Currency,
		Charge: "ch_" + pi, ReceiptURL: "https://pay.stripe.com/receipts/" + pi, Paid: t0.Add(time.Second), Time: t0.Add(2 * time.Second)}
}

func wantDisabled(t *testing.T, s Store, id string, want bool) {
	t.Helper()
	a, err := s.Account(ctx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if a.Disabled != want {
		t.Fatalf("account %s disabled = %t, want %t", id, a.Disabled, want)
	}
}

func credit(t *testing.T, s Store, c tollgate.PaymentCredit, want tollgate.PaymentOutcome) tollgate.PaymentResult {
	t.Helper()
	r, err := s.CreditPayment(ctx(t), c)
	if err != nil {
		t.Fatalf("CreditPayment: %v", err)
	}
	if r.Outcome != want {
		t.Fatalf("CreditPayment: outcome %s, want %s (%+v)", r.Outcome, want, r.Payment)
	}
	return r
}

// testPaymentCreditOnce: a paid payment is credited once, with its ledger
// row and provider ids; the same payment again changes nothing.
func testPaymentCreditOnce(t *testing.T, s Store) {
	open := tollgate.MustParseAmount("1.5")
	a, p := pendingPayment(t, s, open, tollgate.Dollars(25), tollgate.MustParseAmount("1.03"))
	if p.AmountCents != 2603 {
		t.Fatalf("cents %d", p.AmountCents)
	}
	r := credit(t, s, creditOf(p, "pi_1"), tollgate.OutcomeCredited)
	if len(r.Entries) != 1 || r.Entries[0].Kind != tollgate.LedgerPayment || r.Entries[0].Amount != tollgate.Dollars(25) ||
		r.Entries[0].ID != tollgate.PaymentCreditEntryID(p.ID) {
		t.Fatalf("entries %+v", r.Entries)
	}
	got, err := s.PaymentByProviderID(ctx(t), "pi_1")
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != p.ID || got.Status != tollgate.PaymentCredited || got.Charge != "ch_pi_1" || got.ReceiptURL == "" ||
		!got.Paid.Equal(t0.Add(time.Second).Truncate(time.Microsecond)) || !got.Credited.Equal(t0.Add(2*time.Second).Truncate(time.Microsecond)) {
		t.Fatalf("stored payment %+v", got)
	}
	wantBalance(t, s, a.ID, open+tollgate.Dollars(25), 0)
	credit(t, s, creditOf(p, "pi_1"), tollgate.OutcomeAlreadyCredited)
	// By the intent alone (a payment_intent.succeeded for the same payment).
	c := creditOf(p, "pi_1")
	c.CheckoutSession = ""
	credit(t, s, c, tollgate.OutcomeAlreadyCredited)
	wantBalance(t, s, a.ID, open+tollgate.Dollars(25), 0)
	list, err := s.Payments(ctx(t), a.ID, 0)
	if err != nil || len(list) != 1 || list[0].ID != p.ID {
		t.Fatalf("Payments: %+v, %v", list, err)
	}
	auditClean(t, s, time.Now())
}

// testPaymentConcurrentCredit: many credits of one session at once, some
// for a payment the store did not know: one credit.
func testPaymentConcurrentCredit(t *testing.T, s Store) {
	a, p := pendingPayment(t, s, 0, tollgate.Dollars(10), 0)
	unknown := p
	unknown.CheckoutSession = tollgate.NewID("cs_test_")
	var wg sync.WaitGroup
	var mu sync.Mutex
	outcomes := map[tollgate.PaymentOutcome]int{}
	for i := range 24 {
		wg.Go(func() {
			c := creditOf(p, "pi_c")
			if i%2 == 1 {
				c = creditOf(unknown, "pi_u")
			}
			r, err := s.CreditPayment(ctx(t), c)
			if err != nil {
				t.Errorf("CreditPayment: %v", err)
				return
			}
			mu.Lock()
			outcomes[r.Outcome]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if outcomes[tollgate.OutcomeCredited] != 2 || outcomes[tollgate.OutcomeAlreadyCredited] != 22 {
		t.Fatalf("outcomes %v, want 2 credited (one per session), 22 already credited", outcomes)
	}
	wantBalance(t, s, a.ID, tollgate.Dollars(20), 0)
	auditClean(t, s, time.Now())
}

// testPaymentUnknown: a payment the store does not know is recorded and
// credited when its account exists; nothing is credited otherwise.
func testPaymentUnknown(t *testing.T, s Store) {
	a, p := pendingPayment(t, s, 0, tollgate.Dollars(5), 0)
	c := creditOf(p, "pi_x")
	c.CheckoutSession = "cs_test_unknown"
	r := credit(t, s, c, tollgate.OutcomeCredited)
	if r.Payment.AccountID != a.ID || r.Payment.CheckoutSession != "cs_test_unknown" {
		t.Fatalf("recorded %+v", r.Payment)
	}
	// Its metadata names the id of a payment of another session: recorded
	// under an id of its own.
	c2 := creditOf(p, "pi_x2")
	c2.CheckoutSession, c2.ID = "cs_test_unknown2", p.ID
	r = credit(t, s, c2, tollgate.OutcomeCredited)
	if r.Payment.ID == p.ID || r.Payment.CheckoutSession != "cs_test_unknown2" {
		t.Fatalf("recorded %+v over the payment %s", r.Payment, p.ID)
	}
	c.CheckoutSession, c.PaymentIntent, c.AccountID = "cs_test_other", "pi_y", "acct_nobody"
	credit(t, s, c, tollgate.OutcomeNoAccount)
	c.AccountID = ""
	credit(t, s, c, tollgate.OutcomeUnmatched)
	if _, err := s.PaymentByProviderID(ctx(t), "cs_test_other"); !errors.Is(err, tollgate.ErrNotFound) {
		t.Fatalf("a payment was recorded for no account: %v", err)
	}
	wantBalance(t, s, a.ID, tollgate.Dollars(10), 0)
	auditClean(t, s, time.Now())
}

// testPaymentMismatch: a payment whose amount is not what was asked is
// failed and credits nothing.
func testPaymentMismatch(t *testing.T, s Store) {
	a, p := pendingPayment(t, s, 0, tollgate.Dollars(25), 0)
	c := creditOf(p, "pi_m")
	c.Credit, c.AmountCents = tollgate.Dollars(250), 25000
	r := credit(t, s, c, tollgate.OutcomeMismatch)
	if r.Payment.Status != tollgate.PaymentFailed || r.Payment.Note == "" || len(r.Entries) != 0 {
		t.Fatalf("%+v", r)
	}
	wantBalance(t, s, a.ID, 0, 0)
	auditClean(t, s, time.Now())
}

// testPaymentDisabledAccount: an account the operator disabled gets no
// credit; once enabled, the same payment credits.
func testPaymentDisabledAccount(t *testing.T, s Store) {
	a, p := pendingPayment(t, s, 0, tollgate.Dollars(5), 0)
	if err := s.SetAccountDisabled(ctx(t), a.ID, true); err != nil {
		t.Fatal(err)
	}
	credit(t, s, creditOf(p, "pi_d"), tollgate.OutcomeAccountDisabled)
	wantBalance(t, s, a.ID, 0, 0)
	if err := s.SetAccountDisabled(ctx(t), a.ID, false); err != nil {
		t.Fatal(err)
	}
	credit(t, s, creditOf(p, "pi_d"), tollgate.OutcomeCredited)
	wantBalance(t, s, a.ID, tollgate.Dollars(5), 0)
	auditClean(t, s, time.Now())
}

// testPaymentRefunds: refunds take the refunded share of the credit (the
// provider's amount is cumulative), exactly; repeats and older events
// change nothing.
func testPaymentRefunds(t *testing.T, s Store) {
	a, p := pendingPayment(t, s, 0, tollgate.Dollars(30), tollgate.Dollars(3)) // 3300 cents
	credit(t, s, creditOf(p, "pi_r"), tollgate.OutcomeCredited)
	r, err := s.RefundPayment(ctx(t), "pi_r", "ch_pi_r", 1100, t0)
	if err != nil || r.Outcome != tollgate.OutcomeDebited {
		t.Fatalf("refund: %+v, %v", r, err)
	}
	wantBalance(t, s, a.ID, tollgate.Dollars(20), 0) // 30 × 1100/3300 = 10
	for _, cents := range []int64{1100, 500} {
		if r, err := s.RefundPayment(ctx(t), "pi_r", "ch_pi_r", cents, t0); err != nil || r.Outcome != tollgate.OutcomeNoChange {
			t.Fatalf("refund of %d again: %+v, %v", cents, r, err)
		}
	}
	if _, err := s.RefundPayment(ctx(t), "pi_r", "ch_pi_r", 1101, t0); err != nil {
		t.Fatal(err)
	}
	// 30 × 1101/3300 = 10.00909090909090909... → 10.009090909091 (half up).
	wantBalance(t, s, a.ID, tollgate.Dollars(30)-tollgate.MustParseAmount("10.009090909091"), 0)
	if _, err := s.RefundPayment(ctx(t), "pi_r", "ch_pi_r", 3300, t0); err != nil {
		t.Fatal(err)
	}
	wantBalance(t, s, a.ID, 0, 0)
	got, _ := s.Payment(ctx(t), p.ID)
	if got.Status != tollgate.PaymentRefunded || got.Refunded != tollgate.Dollars(30) || got.RefundedCents != 3300 {
		t.Fatalf("%+v", got)
	}
	if _, err := s.RefundPayment(ctx(t), "pi_nobody", "", 100, t0); !errors.Is(err, tollgate.ErrNotFound) {
		t.Fatalf("refund of an unknown payment: %v", err)
	}
	wantDisabled(t, s, a.ID, false)
	auditClean(t, s, time.Now())
}

// testPaymentRefundOwed: a refund beyond the free balance takes what there
// is, records the rest as owed and disables the account; the next payment
// settles it and enables the account.
func testPaymentRefundOwed(t *testing.T, s Store) {
	a, p := pendingPayment(t, s, 0, tollgate.Dollars(10), 0)
	credit(t, s, creditOf(p, "pi_o"), tollgate.OutcomeCredited)
	if err := s.PostEntry(ctx(t), &tollgate.LedgerEntry{ID: tollgate.NewID("le_"), Kind: tollgate.LedgerDebit, AccountID: a.ID,
		Amount: tollgate.Dollars(7), Time: t0}); err != nil {
		t.Fatal(err)
	}
	r, err := s.RefundPayment(ctx(t), "pi_o", "", 1000, t0)
	if err != nil {
		t.Fatal(err)
	}
	if r.Owed != tollgate.Dollars(7) || !r.Disabled || r.Entries[0].Amount != -tollgate.Dollars(3) || r.Entries[0].Uncollected != tollgate.Dollars(7) {
		t.Fatalf("refund beyond the balance: %+v", r)
	}
	wantBalance(t, s, a.ID, 0, 0)
	wantDisabled(t, s, a.ID, true)
	owed, err := s.OwedAmounts(ctx(t))
	if err != nil || len(owed) != 1 || owed[0].AccountID != a.ID || owed[0].Owed != tollgate.Dollars(7) || !owed[0].Disabled {
		t.Fatalf("OwedAmounts: %+v, %v", owed, err)
	}
	auditClean(t, s, time.Now())

	// A payment of 5 settles 5 of the 7 owed; the account stays disabled.
	p2 := tollgate.Payment{ID: tollgate.NewID("pay_"), AccountID: a.ID, Provider: "stripe", Kind: tollgate.PaymentCheckout,
		CheckoutSession: tollgate.NewID("cs_test_"), Credit: tollgate.Dollars(5), AmountCents: 500, Currency: "usd", Created: t0}
	if err := s.CreatePayment(ctx(t), p2); err != nil {
		t.Fatal(err)
	}
	r = credit(t, s, creditOf(p2, "pi_o2"), tollgate.OutcomeCredited)
	if r.Owed != tollgate.Dollars(2) || r.Enabled || len(r.Entries) != 2 || r.Entries[1].Kind != tollgate.LedgerOwedSettled {
		t.Fatalf("partial settle: %+v", r)
	}
	wantBalance(t, s, a.ID, 0, 0)
	wantDisabled(t, s, a.ID, true)
	// The operator credits 10 and collects: the account is enabled.
	if err := s.PostEntry(ctx(t), &tollgate.LedgerEntry{ID: tollgate.NewID("le_"), Kind: tollgate.LedgerCredit, AccountID: a.ID,
		Amount: tollgate.Dollars(10), Time: t0}); err != nil {
		t.Fatal(err)
	}
	r, err = s.CollectOwed(ctx(t), a.ID, t0)
	if err != nil || r.Owed != 0 || !r.Enabled {
		t.Fatalf("CollectOwed: %+v, %v", r, err)
	}
	wantBalance(t, s, a.ID, tollgate.Dollars(8), 0)
	wantDisabled(t, s, a.ID, false)
	if owed, _ := s.OwedAmounts(ctx(t)); len(owed) != 0 {
		t.Fatalf("still owed: %+v", owed)
	}
	auditClean(t, s, time.Now())
}

func wantHold(t *testing.T, s Store, id string, want tollgate.PaymentHold) {
	t.Helper()
	if h, err := s.PaymentHold(ctx(t), id); err != nil || h != want {
		t.Fatalf("PaymentHold(%s) = %+v, %v; want %+v", id, h, err, want)
	}
}

// testPaymentHold: the hold reads whether payments disabled the account,
// what it owes and its disputes open or lost; the operator's decision
// replaces it; the next payment settles it.
func testPaymentHold(t *testing.T, s Store) {
	a, p := pendingPayment(t, s, 0, tollgate.Dollars(10), 0)
	wantHold(t, s, a.ID, tollgate.PaymentHold{})
	credit(t, s, creditOf(p, "pi_h"), tollgate.OutcomeCredited)
	if err := s.PostEntry(ctx(t), &tollgate.LedgerEntry{ID: tollgate.NewID("le_"), Kind: tollgate.LedgerDebit, AccountID: a.ID,
		Amount: tollgate.MustParseAmount("6.5"), Time: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DisputePayment(ctx(t), "pi_h", "dp_h", 1000, t0); err != nil {
		t.Fatal(err)
	}
	wantHold(t, s, a.ID, tollgate.PaymentHold{Held: true, Owed: tollgate.MustParseAmount("6.5"), Disputes: 1})
	// The operator disables it: no longer a hold of payments'.
	if err := s.SetAccountDisabled(ctx(t), a.ID, true); err != nil {
		t.Fatal(err)
	}
	wantHold(t, s, a.ID, tollgate.PaymentHold{Owed: tollgate.MustParseAmount("6.5"), Disputes: 1})
	if _, err := s.PaymentHold(ctx(t), "acct_none"); !errors.Is(err, tollgate.ErrNotFound) {
		t.Fatalf("PaymentHold of no account: %v", err)
	}

	// A refund beyond the balance holds an account; its next payment
	// settles what it owes and ends the hold.
	b, q := pendingPayment(t, s, 0, tollgate.Dollars(10), 0)
	credit(t, s, creditOf(q, "pi_h2"), tollgate.OutcomeCredited)
	if err := s.PostEntry(ctx(t), &tollgate.LedgerEntry{ID: tollgate.NewID("le_"), Kind: tollgate.LedgerDebit, AccountID: b.ID,
		Amount: tollgate.Dollars(9), Time: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RefundPayment(ctx(t), "pi_h2", "", 1000, t0); err != nil {
		t.Fatal(err)
	}
	wantHold(t, s, b.ID, tollgate.PaymentHold{Held: true, Owed: tollgate.Dollars(9)})
	q2 := tollgate.Payment{ID: tollgate.NewID("pay_"), AccountID: b.ID, Provider: "stripe", Kind: tollgate.PaymentCheckout,
		CheckoutSession: tollgate.NewID("cs_test_"), Credit: tollgate.Dollars(9), AmountCents: 900, Currency: "usd", Created: t0}
	if err := s.CreatePayment(ctx(t), q2); err != nil {
		t.Fatal(err)
	}
	if r := credit(t, s, creditOf(q2, "pi_h3"), tollgate.OutcomeCredited); !r.Enabled || r.Owed != 0 {
		t.Fatalf("the payment of what is owed: %+v", r)
	}
	wantHold(t, s, b.ID, tollgate.PaymentHold{})
	wantDisabled(t, s, b.ID, false)
	auditClean(t, s, time.Now())
}

// testPaymentRefundBeforeCredit: a refund of a payment not credited yet
// is kept and taken in the credit's transaction.
func testPaymentRefundBeforeCredit(t *testing.T, s Store) {
	a, p := pendingPayment(t, s, tollgate.Dollars(1), tollgate.Dollars(10), 0)
	// A payment whose intent is known before it is paid (an auto top-up).
	p2 := p
	p2.ID, p2.CheckoutSession, p2.PaymentIntent = tollgate.NewID("pay_"), tollgate.NewID("cs_test_"), "pi_early"
	if err := s.CreatePayment(ctx(t), p2); err != nil {
		t.Fatal(err)
	}
	r, err := s.RefundPayment(ctx(t), "pi_early", "ch_early", 1000, t0)
	if err != nil || r.Outcome != tollgate.OutcomeNoChange || len(r.Entries) != 0 {
		t.Fatalf("refund before the credit: %+v, %v", r, err)
	}
	wantBalance(t, s, a.ID, tollgate.Dollars(1), 0)
	r = credit(t, s, creditOf(p2, "pi_early"), tollgate.OutcomeCredited)
	if len(r.Entries) != 2 || r.Entries[1].Kind != tollgate.LedgerRefund || r.Entries[1].Amount != -tollgate.Dollars(10) {
		t.Fatalf("credit after a refund: %+v", r.Entries)
	}
	wantBalance(t, s, a.ID, tollgate.Dollars(1), 0)
	auditClean(t, s, time.Now())
}

// testPaymentDisputeWon: a dispute takes the disputed credit and disables
// the account; won, it gives it back and enables the account.
func testPaymentDisputeWon(t *testing.T, s Store) {
	a, p := pendingPayment(t, s, tollgate.Dollars(2), tollgate.Dollars(20), 0)
	credit(t, s, creditOf(p, "pi_w"), tollgate.OutcomeCredited)
	r, err := s.DisputePayment(ctx(t), "pi_w", "dp_1", 2000, t0)
	if err != nil || r.Outcome != tollgate.OutcomeDebited || !r.Disabled {
		t.Fatalf("dispute: %+v, %v", r, err)
	}
	wantBalance(t, s, a.ID, tollgate.Dollars(2), 0)
	wantDisabled(t, s, a.ID, true)
	if r, err := s.DisputePayment(ctx(t), "pi_w", "dp_1", 2000, t0); err != nil || r.Outcome != tollgate.OutcomeNoChange {
		t.Fatalf("dispute again: %+v, %v", r, err)
	}
	auditClean(t, s, time.Now())
	r, err = s.CloseDispute(ctx(t), "pi_w", "dp_1", true, t0)
	if err != nil || r.Outcome != tollgate.OutcomeReversed || !r.Enabled || r.Payment.Status != tollgate.PaymentCredited {
		t.Fatalf("dispute won: %+v, %v", r, err)
	}
	wantBalance(t, s, a.ID, tollgate.Dollars(22), 0)
	wantDisabled(t, s, a.ID, false)
	if r, err := s.CloseDispute(ctx(t), "pi_w", "dp_1", true, t0); err != nil || r.Outcome != tollgate.OutcomeNoChange {
		t.Fatalf("won again: %+v, %v", r, err)
	}
	wantBalance(t, s, a.ID, tollgate.Dollars(22), 0)
	auditClean(t, s, time.Now())
}

// testPaymentDisputeLost: a lost dispute keeps its debit and the account
// disabled, until the operator enables it; an account the operator
// disabled is not enabled by payments.
func testPaymentDisputeLost(t *testing.T, s Store) {
	a, p := pendingPayment(t, s, 0, tollgate.Dollars(20), 0)
	credit(t, s, creditOf(p, "pi_l"), tollgate.OutcomeCredited)
	if _, err := s.DisputePayment(ctx(t), "pi_l", "dp_2", 1000, t0); err != nil {
		t.Fatal(err)
	}
	wantBalance(t, s, a.ID, tollgate.Dollars(10), 0)
	r, err := s.CloseDispute(ctx(t), "pi_l", "dp_2", false, t0)
	if err != nil || r.Outcome != tollgate.OutcomeNoChange || r.Payment.DisputeStatus != "lost" || r.Payment.Status != tollgate.PaymentDisputed {
		t.Fatalf("dispute lost: %+v, %v", r, err)
	}
	wantBalance(t, s, a.ID, tollgate.Dollars(10), 0)
	wantDisabled(t, s, a.ID, true)
	auditClean(t, s, time.Now())
	if err := s.SetAccountDisabled(ctx(t), a.ID, false); err != nil {
		t.Fatal(err)
	}
	wantDisabled(t, s, a.ID, false)
}

// testPaymentEvents: events are kept once per id with their deliveries;
// a redelivery that changed nothing keeps the first outcome.
func testPaymentEvents(t *testing.T, s Store) {
	e := tollgate.PaymentEvent{ID: "evt_1", Type: "checkout.session.completed", Provider: "stripe", Object: "cs_1",
		AccountID: "acct_1", Outcome: tollgate.OutcomeCredited, First: t0, Last: t0}
	if err := s.RecordPaymentEvent(ctx(t), e); err != nil {
		t.Fatal(err)
	}
	e.Outcome, e.Last = tollgate.OutcomeAlreadyCredited, t0.Add(time.Minute)
	if err := s.RecordPaymentEvent(ctx(t), e); err != nil {
		t.Fatal(err)
	}
	bad := tollgate.PaymentEvent{ID: "evt_2", Type: "checkout.session.completed", Provider: "stripe", Object: "cs_2",
		Outcome: tollgate.OutcomeMismatch, Detail: "paid 1 cent", First: t0, Last: t0}
	if err := s.RecordPaymentEvent(ctx(t), bad); err != nil {
		t.Fatal(err)
	}
	all, err := s.PaymentEvents(ctx(t), false, 0)
	if err != nil || len(all) != 2 || all[0].ID != "evt_1" || all[0].Deliveries != 2 || all[0].Outcome != tollgate.OutcomeCredited ||
		!all[0].Last.Equal(t0.Add(time.Minute).Truncate(time.Microsecond)) {
		t.Fatalf("PaymentEvents: %+v, %v", all, err)
	}
	problems, err := s.PaymentEvents(ctx(t), true, 0)
	if err != nil || len(problems) != 1 || problems[0].ID != "evt_2" || problems[0].Detail != "paid 1 cent" {
		t.Fatalf("problems: %+v, %v", problems, err)
	}
}

// testPaymentFail: a payment not paid is failed; a credited one is not.
func testPaymentFail(t *testing.T, s Store) {
	_, p := pendingPayment(t, s, 0, tollgate.Dollars(5), 0)
	r, err := s.FailPayment(ctx(t), p.CheckoutSession, "card declined", t0)
	if err != nil || r.Outcome != tollgate.OutcomeFailed || r.Payment.Note != "card declined" {
		t.Fatalf("FailPayment: %+v, %v", r, err)
	}
	credit(t, s, creditOf(p, "pi_f"), tollgate.OutcomeCredited) // async success after an earlier failure
	if r, err := s.FailPayment(ctx(t), p.CheckoutSession, "late", t0); err != nil || r.Outcome != tollgate.OutcomeNoChange {
		t.Fatalf("FailPayment of a credited payment: %+v, %v", r, err)
	}
	if _, err := s.FailPayment(ctx(t), "cs_nobody", "x", t0); !errors.Is(err, tollgate.ErrNotFound) {
		t.Fatalf("FailPayment of nothing: %v", err)
	}
	auditClean(t, s, time.Now())
}

// testAutoTopUp: settings and the saved card; a top-up is due when the free
// balance is below the threshold; of many claims at once one wins; its
// intent's credit (found by the payment id its metadata carries) ends it,
// and so does its failure; a disabled top-up is not due.
func testAutoTopUp(t *testing.T, s Store) {
	a, _ := pendingPayment(t, s, tollgate.Dollars(3), tollgate.Dollars(5), 0)
	if _, err := s.AutoTopUp(ctx(t), a.ID); !errors.Is(err, tollgate.ErrNotFound) {
		t.Fatalf("AutoTopUp of an account without one: %v", err)
	}
	if err := s.SaveCard(ctx(t), a.ID, "cus_1", "pm_1", t0); err != nil {
		t.Fatal(err)
	}
	if err := s.SetAutoTopUp(ctx(t), tollgate.AutoTopUp{AccountID: a.ID, Enabled: true, Threshold: tollgate.Dollars(5),
		Amount: tollgate.Dollars(20), Updated: t0}); err != nil {
		t.Fatal(err)
	}
	got, err := s.AutoTopUp(ctx(t), a.ID)
	if err != nil || !got.Enabled || got.Customer != "cus_1" || got.PaymentMethod != "pm_1" || got.Amount != tollgate.Dollars(20) {
		t.Fatalf("AutoTopUp: %+v, %v", got, err)
	}
	due, err := s.DueTopUps(ctx(t), t0)
	if err != nil || len(due) != 1 || due[0].AccountID != a.ID {
		t.Fatalf("DueTopUps with 3 free under a threshold of 5: %+v, %v", due, err)
	}
	var wg sync.WaitGroup
	var won sync.Map
	for range 16 {
		wg.Go(func() {
			p := tollgate.Payment{ID: tollgate.NewID("pay_"), AccountID: a.ID, Provider: "stripe", Kind: tollgate.PaymentAutoTopUp,
				Credit: tollgate.Dollars(20), AmountCents: 2000, Currency: "usd", Created: t0}
			ok, err := s.ClaimTopUp(ctx(t), p, t0.Add(time.Hour), t0)
			if err != nil {
				t.Errorf("ClaimTopUp: %v", err)
			}
			if ok {
				won.Store(p.ID, p)
			}
		})
	}
	wg.Wait()
	var claimed []tollgate.Payment
	won.Range(func(_, v any) bool { claimed = append(claimed, v.(tollgate.Payment)); return true })
	if len(claimed) != 1 {
		t.Fatalf("%d claims won, want 1", len(claimed))
	}
	p := claimed[0]
	if due, _ := s.DueTopUps(ctx(t), t0); len(due) != 0 {
		t.Fatalf("due while one is in flight: %+v", due)
	}
	if due, _ := s.DueTopUps(ctx(t), t0.Add(2*time.Hour)); len(due) != 1 {
		t.Fatal("a lapsed claim is not due again")
	}
	// The intent's webhook: found by the payment id in its metadata.
	r := credit(t, s, tollgate.PaymentCredit{PaymentIntent: "pi_top", ID: p.ID, AccountID: a.ID, Kind: tollgate.PaymentAutoTopUp,
		Provider: "stripe", Credit: tollgate.Dollars(20), AmountCents: 2000, Currency: "usd", Time: t0}, tollgate.OutcomeCredited)
	if r.Payment.ID != p.ID || r.Payment.PaymentIntent != "pi_top" {
		t.Fatalf("credited %+v, want payment %s", r.Payment, p.ID)
	}
	if got, _ := s.AutoTopUp(ctx(t), a.ID); got.InFlight != "" {
		t.Fatalf("still in flight after the credit: %+v", got)
	}
	wantBalance(t, s, a.ID, tollgate.Dollars(23), 0)
	if due, _ := s.DueTopUps(ctx(t), t0); len(due) != 0 {
		t.Fatal("due with 23 free")
	}
	// A claim made from a list read before that credit: no longer due.
	late := tollgate.Payment{ID: tollgate.NewID("pay_"), AccountID: a.ID, Provider: "stripe", Kind: tollgate.PaymentAutoTopUp,
		Credit: tollgate.Dollars(20), AmountCents: 2000, Currency: "usd", Created: t0}
	if ok, err := s.ClaimTopUp(ctx(t), late, t0.Add(time.Hour), t0); ok || err != nil {
		t.Fatalf("a claim above the threshold: %t, %v", ok, err)
	}
	// A declined top-up: failed, no longer in flight, turned off.
	if err := s.PostEntry(ctx(t), &tollgate.LedgerEntry{ID: tollgate.NewID("le_"), Kind: tollgate.LedgerDebit, AccountID: a.ID,
		Amount: tollgate.Dollars(22), Time: t0}); err != nil {
		t.Fatal(err)
	}
	p2 := tollgate.Payment{ID: tollgate.NewID("pay_"), AccountID: a.ID, Provider: "stripe", Kind: tollgate.PaymentAutoTopUp,
		Credit: tollgate.Dollars(20), AmountCents: 2000, Currency: "usd", Created: t0}
	if ok, err := s.ClaimTopUp(ctx(t), p2, t0.Add(time.Hour), t0); !ok || err != nil {
		t.Fatalf("claim: %t, %v", ok, err)
	}
	if _, err := s.FailPayment(ctx(t), p2.ID, "card declined", t0); err != nil {
		t.Fatal(err)
	}
	if err := s.DisableAutoTopUp(ctx(t), a.ID, "card declined", t0); err != nil {
		t.Fatal(err)
	}
	got, _ = s.AutoTopUp(ctx(t), a.ID)
	if got.Enabled || got.InFlight != "" || got.Notice != "card declined" {
		t.Fatalf("after a decline: %+v", got)
	}
	if due, _ := s.DueTopUps(ctx(t), t0); len(due) != 0 {
		t.Fatal("a disabled top-up is due")
	}
	// Enabling again clears the notice and keeps the card.
	if err := s.SetAutoTopUp(ctx(t), tollgate.AutoTopUp{AccountID: a.ID, Enabled: true, Threshold: tollgate.Dollars(5),
		Amount: tollgate.Dollars(10), Updated: t0}); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.AutoTopUp(ctx(t), a.ID); got.Notice != "" || got.PaymentMethod != "pm_1" || !got.Enabled {
		t.Fatalf("enabled again: %+v", got)
	}
	auditClean(t, s, time.Now())
}
