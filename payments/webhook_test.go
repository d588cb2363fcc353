package payments_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v82/webhook"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/internal/stripetest"
	"github.com/tollgate/tollgate/operator"
	"github.com/tollgate/tollgate/payments"
	"github.com/tollgate/tollgate/postgres"
	"github.com/tollgate/tollgate/server"
	"github.com/tollgate/tollgate/sqlite"
)

const whsec = "whsec_test_tollgate"

// store is what these tests need of a store.
type store interface {
	payments.Store
	billing.BooksStore
	tollgate.Store
}

func openSQLite(t *testing.T) store {
	t.Helper()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "tollgate.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// counts is an Observer that counts.
type counts struct {
	mu       sync.Mutex
	outcomes map[tollgate.PaymentOutcome]int
	rejected map[string]int
	credits  int
}

func (c *counts) PaymentEvent(o tollgate.PaymentOutcome) { c.mu.Lock(); c.outcomes[o]++; c.mu.Unlock() }
func (c *counts) WebhookRejected(r string)               { c.mu.Lock(); c.rejected[r]++; c.mu.Unlock() }
func (c *counts) CreditLatency(time.Duration)            { c.mu.Lock(); c.credits++; c.mu.Unlock() }

// instance is one tollgate instance's webhook: a service on its own store
// handle, served over loopback HTTP.
type instance struct {
	svc *payments.Service
	obs *counts
	url string
}

func newInstance(t *testing.T, st store, apiURL string) *instance {
	t.Helper()
	obs := &counts{outcomes: map[tollgate.PaymentOutcome]int{}, rejected: map[string]int{}}
	svc := payments.New(newStripe(t, apiURL), st, payments.Options{Min: tollgate.Dollars(5), Max: tollgate.Dollars(1000),
		SuccessURL: "https://tg.example/console/payments?payment={PAYMENT_ID}", CancelURL: "https://tg.example/console/payments",
		Observer: obs})
	log := slog.New(slog.DiscardHandler)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != payments.WebhookPath || r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		if err := svc.ServeWebhook(w, r); err != nil {
			server.WriteError(w, log, err)
		}
	}))
	t.Cleanup(srv.Close)
	return &instance{svc: svc, obs: obs, url: srv.URL + payments.WebhookPath}
}

func mustDeliver(t testing.TB, url string, payload []byte, wantStatus int, wantOutcome tollgate.PaymentOutcome) {
	t.Helper()
	status, body := stripetest.Deliver(t, url, payload, whsec, time.Now())
	if status != wantStatus || (wantOutcome != "" && !strings.Contains(body, `"outcome":"`+string(wantOutcome)+`"`)) {
		t.Fatalf("delivery: %d %s; want %d with outcome %q", status, body, wantStatus, wantOutcome)
	}
}

// checkout starts a payment as the console would, with a session id of its
// own (stripe-mock's fixtures give every session the same id).
func checkout(t *testing.T, st store, account string, credit, fee tollgate.Amount) tollgate.Payment {
	t.Helper()
	cents, _ := (credit + fee).Cents()
	now := time.Now().UTC().Truncate(time.Microsecond)
	p := tollgate.Payment{ID: tollgate.NewID("pay_"), AccountID: account, Provider: "stripe", Kind: tollgate.PaymentCheckout,
		CheckoutSession: tollgate.NewID("cs_test_"), Credit: credit, Fee: fee, AmountCents: cents, Currency: "usd", Created: now}
	if err := st.CreatePayment(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	return p
}

func newAccount(t *testing.T, st store, balance tollgate.Amount) string {
	t.Helper()
	a := tollgate.Account{ID: tollgate.NewID("acct_"), Name: "holder", Created: time.Now(), Balance: balance}
	if err := st.CreateAccount(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	return a.ID
}

func balance(t *testing.T, st store, id string) tollgate.Amount {
	t.Helper()
	b, err := st.Balance(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return b.Balance
}

func cleanAudit(t *testing.T, st store) {
	t.Helper()
	r, err := billing.Audit(t.Context(), st, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK {
		t.Fatalf("audit: %v", r.Problems)
	}
}

func completed(p tollgate.Payment, pi string) []byte {
	return stripetest.Event(tollgate.NewID("evt_"), payments.EventSessionCompleted, time.Now(),
		stripetest.Session(p.CheckoutSession, p.AccountID, p.Credit.String(), p.Fee.String(), p.AmountCents, "paid", pi))
}

// TestWebhookRefusesWhatDoesNotVerify: a forged signature (another
// secret), a timestamp older than 5 minutes (a replay of a captured
// delivery), a missing header and a body changed after
// signing are 400 and change nothing.
func TestWebhookRefusesWhatDoesNotVerify(t *testing.T) {
	st := openSQLite(t)
	in := newInstance(t, st, "http://127.0.0.1:9")
	acct := newAccount(t, st, 0)
	p := checkout(t, st, acct, tollgate.Dollars(25), 0)
	payload := completed(p, "pi_forged")
	cases := []struct {
		name   string
		secret string
		ts     time.Time
		mangle func([]byte) []byte
	}{
		{"forged", "whsec_attacker", time.Now(), nil},
		{"stale", whsec, time.Now().Add(-6 * time.Minute), nil},
		{"changed body", whsec, time.Now(), func(b []byte) []byte { return []byte(strings.Replace(string(b), `"25"`, `"2500"`, 1)) }},
	}
	for _, c := range cases {
		sp := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: payload, Secret: c.secret, Timestamp: c.ts})
		body := payload
		if c.mangle != nil {
			body = c.mangle(payload)
		}
		req, _ := http.NewRequest(http.MethodPost, in.url, strings.NewReader(string(body)))
		req.Header.Set("Stripe-Signature", sp.Header)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(b), `"code":"invalid_request"`) {
			t.Errorf("%s: %d %s, want 400 invalid_request", c.name, resp.StatusCode, b)
		}
	}
	resp, err := http.Post(in.url, "application/json", strings.NewReader(string(payload)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("no signature: %d, want 400", resp.StatusCode)
	}
	if got := balance(t, st, acct); got != 0 {
		t.Fatalf("balance %s after refused deliveries", got)
	}
	if evs, _ := st.PaymentEvents(t.Context(), false, 0); len(evs) != 0 {
		t.Fatalf("refused deliveries were recorded: %+v", evs)
	}
	if in.obs.rejected["signature"] != 4 {
		t.Fatalf("rejections %v, want 4 for the signature", in.obs.rejected)
	}
	// The genuine delivery still credits.
	mustDeliver(t, in.url, payload, 200, tollgate.OutcomeCredited)
	if got := balance(t, st, acct); got != tollgate.Dollars(25) {
		t.Fatalf("balance %s", got)
	}
	cleanAudit(t, st)
}

// TestWebhookReplayAndSecondEvent: the same event again, and another
// event for the same session, credit nothing more.
func TestWebhookReplayAndSecondEvent(t *testing.T) {
	st := openSQLite(t)
	in := newInstance(t, st, "http://127.0.0.1:9")
	acct := newAccount(t, st, tollgate.MustParseAmount("0.000000000001"))
	p := checkout(t, st, acct, tollgate.MustParseAmount("12.34"), tollgate.MustParseAmount("0.66"))
	ev := completed(p, "pi_replay")
	mustDeliver(t, in.url, ev, 200, tollgate.OutcomeCredited)
	mustDeliver(t, in.url, ev, 200, tollgate.OutcomeAlreadyCredited)
	mustDeliver(t, in.url, completed(p, "pi_replay"), 200, tollgate.OutcomeAlreadyCredited)
	async := stripetest.Event(tollgate.NewID("evt_"), payments.EventSessionAsyncSucceeded, time.Now(),
		stripetest.Session(p.CheckoutSession, acct, "12.34", "0.66", 1300, "paid", "pi_replay"))
	mustDeliver(t, in.url, async, 200, tollgate.OutcomeAlreadyCredited)
	if got, want := balance(t, st, acct), tollgate.MustParseAmount("12.340000000001"); got != want {
		t.Fatalf("balance %s, want %s", got, want)
	}
	evs, err := st.PaymentEvents(t.Context(), false, 0)
	if err != nil || len(evs) != 3 {
		t.Fatalf("events %+v, %v", evs, err)
	}
	for _, e := range evs {
		if e.Deliveries == 2 && e.Outcome != tollgate.OutcomeCredited {
			t.Errorf("the replayed event's outcome became %s", e.Outcome)
		}
	}
	if in.obs.credits != 1 {
		t.Fatalf("credit latency observed %d times, want once", in.obs.credits)
	}
	cleanAudit(t, st)
}

// TestWebhookConcurrentInstances: the same event 50 times at once to 3
// instances (3 store handles) on one PostgreSQL credits once.
func TestWebhookConcurrentInstances(t *testing.T) {
	schema := postgres.NewTestSchema(t)
	var ins []*instance
	var sts []store
	for range 3 {
		st := postgres.OpenTestSchema(t, schema)
		sts = append(sts, st)
		ins = append(ins, newInstance(t, st, "http://127.0.0.1:9"))
	}
	acct := newAccount(t, sts[0], 0)
	p := checkout(t, sts[1], acct, tollgate.Dollars(40), tollgate.MustParseAmount("1.46"))
	// And a session no instance created (its row is recorded by the event).
	unknown := p
	unknown.CheckoutSession = tollgate.NewID("cs_test_")
	evs := [][]byte{completed(p, "pi_conc"), completed(unknown, "pi_conc2")}
	var wg sync.WaitGroup
	var credited, other atomic.Int64
	start := make(chan struct{})
	for i := range 100 {
		wg.Go(func() {
			<-start
			status, body := stripetest.Deliver(t, ins[i%3].url, evs[i%2], whsec, time.Now())
			switch {
			case status == 200 && strings.Contains(body, `"outcome":"credited"`):
				credited.Add(1)
			case status == 200 && strings.Contains(body, `"outcome":"already_credited"`):
				other.Add(1)
			default:
				t.Errorf("delivery %d: %d %s", i, status, body)
			}
		})
	}
	close(start)
	wg.Wait()
	if credited.Load() != 2 || other.Load() != 98 {
		t.Fatalf("%d credited, %d already credited; want 2 (one per session) and 98", credited.Load(), other.Load())
	}
	if got := balance(t, sts[2], acct); got != tollgate.Dollars(80) {
		t.Fatalf("balance %s, want 80", got)
	}
	recs, err := sts[0].PaymentEvents(t.Context(), false, 0)
	if err != nil || len(recs) != 2 || recs[0].Deliveries+recs[1].Deliveries != 100 {
		t.Fatalf("events %+v, %v", recs, err)
	}
	cleanAudit(t, sts[0])
}

// TestWebhookNotCredited: a paid amount that is not the credit plus the
// fee, another currency, an unknown account, a session without an account,
// an unpaid session: 200, nothing credited, recorded as a problem.
func TestWebhookNotCredited(t *testing.T) {
	st := openSQLite(t)
	in := newInstance(t, st, "http://127.0.0.1:9")
	acct := newAccount(t, st, 0)
	p := checkout(t, st, acct, tollgate.Dollars(25), tollgate.Dollars(1))
	now := time.Now()
	cheap := stripetest.Session(p.CheckoutSession, acct, "25", "1", 100, "paid", "pi_cheap")
	mustDeliver(t, in.url, stripetest.Event("evt_cheap", payments.EventSessionCompleted, now, cheap), 200, tollgate.OutcomeMismatch)
	eur := stripetest.Session(tollgate.NewID("cs_test_"), acct, "25", "1", 2600, "paid", "pi_eur")
	eur["currency"] = "eur"
	mustDeliver(t, in.url, stripetest.Event("evt_eur", payments.EventSessionCompleted, now, eur), 200, tollgate.OutcomeMismatch)
	mustDeliver(t, in.url, stripetest.Event("evt_nobody", payments.EventSessionCompleted, now,
		stripetest.Session(tollgate.NewID("cs_test_"), "acct_nobody", "25", "1", 2600, "paid", "pi_nobody")), 200, tollgate.OutcomeNoAccount)
	mustDeliver(t, in.url, stripetest.Event("evt_noref", payments.EventSessionCompleted, now,
		stripetest.Session(tollgate.NewID("cs_test_"), "", "25", "1", 2600, "paid", "pi_noref")), 200, tollgate.OutcomeUnmatched)
	p2 := checkout(t, st, acct, tollgate.Dollars(10), 0)
	mustDeliver(t, in.url, stripetest.Event("evt_unpaid", payments.EventSessionCompleted, now,
		stripetest.Session(p2.CheckoutSession, acct, "10", "0", 1000, "unpaid", "pi_unpaid")), 200, tollgate.OutcomeUnpaid)
	mustDeliver(t, in.url, stripetest.Event("evt_other", "customer.created", now, map[string]any{"id": "cus_1", "object": "customer"}),
		200, tollgate.OutcomeIgnored)
	if got := balance(t, st, acct); got != 0 {
		t.Fatalf("balance %s, want 0", got)
	}
	got, err := st.Payment(t.Context(), p.ID)
	if err != nil || got.Status != tollgate.PaymentFailed || !strings.Contains(got.Note, "paid 100 cents") {
		t.Fatalf("mismatched payment %+v, %v", got, err)
	}
	problems, err := st.PaymentEvents(t.Context(), true, 0)
	if err != nil || len(problems) != 4 {
		t.Fatalf("problems %+v, %v; want 4 (2 mismatches, unknown account, no account)", problems, err)
	}
	// The delayed payment succeeds later: credited.
	mustDeliver(t, in.url, stripetest.Event("evt_async", payments.EventSessionAsyncSucceeded, now,
		stripetest.Session(p2.CheckoutSession, acct, "10", "0", 1000, "paid", "pi_unpaid")), 200, tollgate.OutcomeCredited)
	if got := balance(t, st, acct); got != tollgate.Dollars(10) {
		t.Fatalf("balance %s, want 10", got)
	}
	cleanAudit(t, st)
}

// TestWebhookRefunds: a refund before the completion is answered 409 (the
// provider delivers it again) and changes nothing; after the completion
// the redelivery takes the refunded share; a refund beyond the balance
// leaves the rest owed and disables the account.
func TestWebhookRefunds(t *testing.T) {
	st := openSQLite(t)
	in := newInstance(t, st, "http://127.0.0.1:9")
	acct := newAccount(t, st, 0)
	p := checkout(t, st, acct, tollgate.Dollars(20), tollgate.Dollars(2))
	refund := stripetest.Event("evt_ref1", payments.EventChargeRefunded, time.Now(), stripetest.Charge("ch_1", "pi_r", 2200, 1100))
	status, body := stripetest.Deliver(t, in.url, refund, whsec, time.Now())
	if status != 409 || !strings.Contains(body, `"code":"conflict"`) {
		t.Fatalf("refund before the completion: %d %s, want 409", status, body)
	}
	mustDeliver(t, in.url, completed(p, "pi_r"), 200, tollgate.OutcomeCredited)
	mustDeliver(t, in.url, refund, 200, tollgate.OutcomeDebited)
	if got := balance(t, st, acct); got != tollgate.Dollars(10) {
		t.Fatalf("balance %s after half refunded, want 10", got)
	}
	mustDeliver(t, in.url, refund, 200, tollgate.OutcomeNoChange)
	cleanAudit(t, st)

	// Spend 8 of the 10 left (an operator's debit), then refund the rest of
	// the payment (10 of credit): 2 taken, 8 owed, the account disabled.
	if _, err := billingPost(t, st, acct, tollgate.Dollars(8)); err != nil {
		t.Fatal(err)
	}
	mustDeliver(t, in.url, stripetest.Event("evt_ref2", payments.EventChargeRefunded, time.Now(), stripetest.Charge("ch_1", "pi_r", 2200, 2200)),
		200, tollgate.OutcomeDebited)
	if got := balance(t, st, acct); got != 0 {
		t.Fatalf("balance %s, want 0", got)
	}
	owed, err := st.OwedAmounts(t.Context())
	if err != nil || len(owed) != 1 || owed[0].Owed != tollgate.Dollars(8) || !owed[0].Disabled {
		t.Fatalf("owed %+v, %v", owed, err)
	}
	a, _ := st.Account(t.Context(), acct)
	if !a.Disabled {
		t.Fatal("an account that owes is not disabled")
	}
	cleanAudit(t, st)
	// A refund of a payment tollgate never saw, older than the deferral: unmatched.
	mustDeliver(t, in.url, stripetest.Event("evt_ref_old", payments.EventChargeRefunded, time.Now().Add(-25*time.Hour),
		stripetest.Charge("ch_x", "pi_x", 1000, 1000)), 200, tollgate.OutcomeUnmatched)
}

// TestWebhookDisputes: a dispute takes the disputed credit and disables
// the account; won, it gives it back and enables it; lost, it keeps both.
func TestWebhookDisputes(t *testing.T) {
	st := openSQLite(t)
	in := newInstance(t, st, "http://127.0.0.1:9")
	for _, won := range []bool{true, false} {
		acct := newAccount(t, st, tollgate.Dollars(3))
		p := checkout(t, st, acct, tollgate.Dollars(30), 0)
		pi := tollgate.NewID("pi_")
		dp := tollgate.NewID("dp_")
		mustDeliver(t, in.url, completed(p, pi), 200, tollgate.OutcomeCredited)
		mustDeliver(t, in.url, stripetest.Event(tollgate.NewID("evt_"), payments.EventDisputeCreated, time.Now(),
			stripetest.Dispute(dp, "ch_d", pi, 3000, "needs_response")), 200, tollgate.OutcomeDebited)
		if got := balance(t, st, acct); got != tollgate.Dollars(3) {
			t.Fatalf("balance %s during the dispute, want 3", got)
		}
		if a, _ := st.Account(t.Context(), acct); !a.Disabled {
			t.Fatal("a disputed account is not disabled")
		}
		cleanAudit(t, st)
		status := "lost"
		want := tollgate.OutcomeNoChange
		if won {
			status, want = "won", tollgate.OutcomeReversed
		}
		closed := stripetest.Event(tollgate.NewID("evt_"), payments.EventDisputeClosed, time.Now(), stripetest.Dispute(dp, "ch_d", pi, 3000, status))
		mustDeliver(t, in.url, closed, 200, want)
		mustDeliver(t, in.url, closed, 200, tollgate.OutcomeNoChange)
		a, _ := st.Account(t.Context(), acct)
		if won && (a.Disabled || balance(t, st, acct) != tollgate.Dollars(33)) {
			t.Fatalf("won: disabled %t, balance %s; want enabled, 33", a.Disabled, balance(t, st, acct))
		}
		if !won && (!a.Disabled || balance(t, st, acct) != tollgate.Dollars(3)) {
			t.Fatalf("lost: disabled %t, balance %s; want disabled, 3", a.Disabled, balance(t, st, acct))
		}
		cleanAudit(t, st)
	}
}

// TestQuote: the fee is the percentage plus the fixed part, rounded up to
// the cent; amounts outside the bounds or with fractions of a cent are
// refused.
func TestQuote(t *testing.T) {
	svc := payments.New(nil, nil, payments.Options{Min: tollgate.Dollars(5), Max: tollgate.Dollars(1000),
		FeePercent: tollgate.MustParseAmount("2.9"), FeeFixed: tollgate.MustParseAmount("0.3")})
	for _, c := range []struct{ credit, fee string }{{"25", "1.03"}, {"5", "0.45"}, {"10.01", "0.6"}, {"1000", "29.3"}} {
		q, err := svc.Quote(tollgate.MustParseAmount(c.credit))
		if err != nil {
			t.Fatalf("Quote(%s): %v", c.credit, err)
		}
		wantCents, _ := (q.Credit + tollgate.MustParseAmount(c.fee)).Cents()
		if q.Fee != tollgate.MustParseAmount(c.fee) || q.AmountCents != wantCents || q.Currency != "usd" {
			t.Errorf("Quote(%s) = %+v, want fee %s", c.credit, q, c.fee)
		}
	}
	for _, bad := range []string{"4.99", "1000.01", "10.001", "0", "-5"} {
		if _, err := svc.Quote(tollgate.MustParseAmount(bad)); tollgate.ErrorCode(err) != tollgate.CodeInvalidRequest {
			t.Errorf("Quote(%s): %v, want invalid_request", bad, err)
		}
	}
}

// lateHandler serves a service's webhook once set (the simulator needs the
// endpoint's URL before the services exist).
type lateHandler struct {
	mu  sync.Mutex
	svc *payments.Service
}

func (h *lateHandler) set(s *payments.Service) { h.mu.Lock(); h.svc = s; h.mu.Unlock() }

func (h *lateHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	svc := h.svc
	h.mu.Unlock()
	if svc == nil {
		http.Error(w, "not yet", http.StatusServiceUnavailable)
		return
	}
	if err := svc.ServeWebhook(w, r); err != nil {
		server.WriteError(w, slog.New(slog.DiscardHandler), err)
	}
}

// newLoopback serves h over loopback HTTP and returns its URL.
func newLoopback(t *testing.T, h http.Handler) string {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// waitUntil polls cond (a webhook arrives in its own time).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 15s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// billingPost debits the account as an operator would (what it spent).
func billingPost(t *testing.T, st store, acct string, amount tollgate.Amount) (operator.Posted, error) {
	return operator.Post(t.Context(), st, tollgate.LedgerDebit, acct, amount, "spent", "test", time.Now())
}

// TestCheckoutOfHeldAccount: an account that a refund left owing (disabled
// by payments) may start a checkout of at least what it owes (rounded up
// to the cent, at least the minimum); one the operator disabled may not.
func TestCheckoutOfHeldAccount(t *testing.T) {
	st := openSQLite(t)
	in := newInstance(t, st, stripetest.URL(t))
	acct := newAccount(t, st, 0)
	p := checkout(t, st, acct, tollgate.Dollars(10), 0)
	pi := tollgate.NewID("pi_")
	mustDeliver(t, in.url, completed(p, pi), 200, tollgate.OutcomeCredited)
	if _, err := operator.Post(t.Context(), st, tollgate.LedgerDebit, acct, tollgate.MustParseAmount("7.000000000001"), "", "", time.Now()); err != nil {
		t.Fatal(err)
	}
	mustDeliver(t, in.url, stripetest.Event(tollgate.NewID("evt_"), payments.EventChargeRefunded, time.Now(),
		stripetest.Charge("ch_h", pi, 1000, 1000)), 200, tollgate.OutcomeDebited)
	if h, err := st.PaymentHold(t.Context(), acct); err != nil || !h.Held || h.Owed != tollgate.MustParseAmount("7.000000000001") {
		t.Fatalf("hold %+v, %v", h, err)
	}
	if got := in.svc.OwedMin(tollgate.MustParseAmount("7.000000000001")); got != tollgate.MustParseAmount("7.01") {
		t.Fatalf("OwedMin = %s, want 7.01", got)
	}
	_, _, err := in.svc.StartCheckout(t.Context(), acct, tollgate.Dollars(7), false)
	if te, ok := err.(*tollgate.Error); !ok || te.Code != tollgate.CodeInvalidRequest || te.Param != "amount" ||
		!strings.Contains(te.Message, "at least 7.01 USD") {
		t.Fatalf("a checkout below what is owed: %v", err)
	}
	if _, _, err := in.svc.StartCheckout(t.Context(), acct, tollgate.MustParseAmount("7.01"), false); err != nil {
		t.Fatalf("a checkout of what is owed: %v", err)
	}
	if err := st.SetAccountDisabled(t.Context(), acct, true); err != nil {
		t.Fatal(err)
	}
	if _, _, err := in.svc.StartCheckout(t.Context(), acct, tollgate.Dollars(20), false); tollgate.ErrorCode(err) != tollgate.CodeAccountDisabled {
		t.Fatalf("a checkout of an account the operator disabled: %v", err)
	}
	for owed, want := range map[string]string{"0.01": "5", "5": "5", "12.5": "12.5", "2000": "1000"} {
		if got := in.svc.OwedMin(tollgate.MustParseAmount(owed)); got != tollgate.MustParseAmount(want) {
			t.Errorf("OwedMin(%s) = %s, want %s", owed, got, want)
		}
	}
}
