package console

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/stripetest"
	"github.com/tollgate/tollgate/payments"
	"github.com/tollgate/tollgate/server"
	"github.com/tollgate/tollgate/sqlite"
)

const consoleWhsec = "whsec_console"

// paymentsEnv is a console with payments on: the service's Stripe API is
// stripe-mock, its webhook served over loopback HTTP.
func paymentsEnv(t *testing.T, autoTopUp bool) (*env, string) {
	t.Helper()
	return paymentsEnvAt(t, stripetest.URL(t), autoTopUp)
}

// paymentsEnvAt is paymentsEnv with the Stripe API at mock.
func paymentsEnvAt(t *testing.T, mock string, autoTopUp bool) (*env, string) {
	t.Helper()
	st, err := sqlite.Open(t.TempDir() + "/t.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	p, err := payments.NewStripe(payments.StripeOptions{SecretKey: "sk_test_console", WebhookSecret: consoleWhsec, APIURL: mock})
	if err != nil {
		t.Fatal(err)
	}
	svc := payments.New(p, st, payments.Options{Min: tollgate.Dollars(5), Max: tollgate.Dollars(1000),
		FeePercent: tollgate.MustParseAmount("2.9"), FeeFixed: tollgate.MustParseAmount("0.3"),
		AutoTopUp:  autoTopUp,
		SuccessURL: "http://console.test/console/payments?payment={PAYMENT_ID}", CancelURL: "http://console.test/console/payments?payment={PAYMENT_ID}&canceled=1"})
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := svc.ServeWebhook(w, r); err != nil {
			server.WriteError(w, slog.New(slog.DiscardHandler), err)
		}
	}))
	t.Cleanup(hook.Close)
	e := newEnvStore(t, Options{Payments: struct {
		*payments.Service
		tollgate.PaymentStore
	}{svc, st}}, st)
	return e, hook.URL
}

var payRowRE = regexp.MustCompile(`id="pay-(pay_[^"]+)" data-status="([a-z]+)"`)

// TestPaymentsPages: the holder sees the fee before paying, is sent to the
// provider's page, comes back to a pending payment that turns credited
// when the webhook lands, and finds it in the list and the CSV.
func TestPaymentsPages(t *testing.T) {
	e, hook := paymentsEnv(t, false)
	b := e.signedIn(t)
	if p := b.get("/console/"); !strings.Contains(p.body, `href="/console/payments"`) {
		t.Fatal("the overview's navigation has no Payments link")
	}
	p := b.get("/console/payments?amount=25")
	if p.status != 200 || !strings.Contains(p.body, `id="quote-fee"><data class="amt" value="1.030000000000"`) ||
		!strings.Contains(p.body, `id="quote-total"><data class="amt" value="26.030000000000"`) {
		t.Fatalf("quote: %d\n%s", p.status, p.body)
	}
	if p := b.get("/console/payments?amount=4.99"); p.status != 400 || p.code() != "invalid_request" {
		t.Fatalf("an amount below the minimum: %d %s", p.status, p.code())
	}
	form := url.Values{"csrf": {p.csrf(t)}, "amount": {"25"}}
	if r := b.post("/console/payments", url.Values{"amount": {"25"}}); r.status != 400 || r.code() != "invalid_request" {
		t.Fatalf("a checkout without the CSRF token: %d %s", r.status, r.code())
	}
	co := b.post("/console/payments", form)
	if co.status != 200 || !strings.Contains(co.body, `http-equiv="refresh" content="0;url=https://checkout.stripe.com/`) ||
		!strings.Contains(co.body, `id="checkout-link"`) {
		t.Fatalf("checkout: %d\n%s", co.status, co.body)
	}
	m := payRowRE.FindStringSubmatch(co.body)
	if m == nil || m[2] != "pending" {
		t.Fatalf("no pending payment listed:\n%s", co.body)
	}
	payID := m[1]
	back := b.get("/console/payments?payment=" + payID)
	if back.status != 200 || !strings.Contains(back.body, `id="payment" data-status="pending"`) || !strings.Contains(back.body, `http-equiv="refresh" content="2"`) {
		t.Fatalf("return page while pending: %d\n%s", back.status, back.body)
	}
	pay, err := e.opts.Payments.Payment(t.Context(), payID)
	if err != nil || pay.Fee != tollgate.MustParseAmount("1.03") || pay.AmountCents != 2603 {
		t.Fatalf("payment %+v, %v", pay, err)
	}
	ev := stripetest.Event("evt_console", payments.EventSessionCompleted, time.Now(),
		stripetest.Session(pay.CheckoutSession, e.acct.ID, "25", "1.03", 2603, "paid", "pi_console"))
	if st, body := stripetest.Deliver(t, hook, ev, consoleWhsec, time.Now()); st != 200 || !strings.Contains(body, `"credited"`) {
		t.Fatalf("webhook: %d %s", st, body)
	}
	back = b.get("/console/payments?payment=" + payID)
	if !strings.Contains(back.body, `id="payment" data-status="credited"`) || strings.Contains(back.body, `http-equiv="refresh"`) {
		t.Fatalf("return page once credited:\n%s", back.body)
	}
	if bal, _ := e.st.Balance(t.Context(), e.acct.ID); bal.Balance != tollgate.Dollars(35) {
		t.Fatalf("balance %s, want 10 + 25", bal.Balance)
	}
	csv := b.get("/console/payments.csv")
	if csv.status != 200 || !strings.HasPrefix(csv.header.Get("Content-Type"), "text/csv") ||
		!strings.Contains(csv.body, payID+",credited,25,1.03,2603,usd,") {
		t.Fatalf("CSV: %d\n%s", csv.status, csv.body)
	}
	// Another account's payment is not shown.
	other := e.browser(t)
	acct2, _ := e.newAccount(t, "bob", "1")
	other.setPassword(acct2.ID, password)
	other.signin(acct2.ID, password)
	if p := other.get("/console/payments?payment=" + payID); p.status != 404 {
		t.Fatalf("another account's payment: %d", p.status)
	}
}

// TestPaymentsPagesOff: with payments off the console has no payment page
// and no link to one.
func TestPaymentsPagesOff(t *testing.T) {
	e := newEnv(t, Options{})
	b := e.signedIn(t)
	if p := b.get("/console/"); strings.Contains(p.body, "/console/payments") {
		t.Fatal("a Payments link with payments off")
	}
	if p := b.get("/console/payments"); p.status != 404 {
		t.Fatalf("the payments page with payments off: %d", p.status)
	}
}

// TestAutoTopUpSettings: with auto top-up offered, the holder cannot turn
// it on before a card is saved, can once one is, and sees why it was
// turned off.
func TestAutoTopUpSettings(t *testing.T) {
	e, _ := paymentsEnv(t, true)
	b := e.signedIn(t)
	p := b.get("/console/payments?amount=25")
	if !strings.Contains(p.body, `name="save_card"`) || !strings.Contains(p.body, `id="auto-topup"`) {
		t.Fatalf("no auto top-up on the page:\n%s", p.body)
	}
	form := url.Values{"csrf": {p.csrf(t)}, "threshold": {"5"}, "amount": {"20"}, "enabled": {"1"}}
	if r := b.post("/console/payments/auto-topup", form); r.status != 400 || !strings.Contains(r.body, "no card is saved") {
		t.Fatalf("enabling without a card: %d %s", r.status, r.code())
	}
	st := e.st.(interface {
		SaveCard(ctx context.Context, accountID, customer, method string, at time.Time) error
		DisableAutoTopUp(ctx context.Context, accountID, notice string, at time.Time) error
	})
	if err := st.SaveCard(t.Context(), e.acct.ID, "cus_1", "pm_1", time.Now()); err != nil {
		t.Fatal(err)
	}
	if r := b.post("/console/payments/auto-topup", form); r.status != http.StatusSeeOther {
		t.Fatalf("enabling: %d %s\n%s", r.status, r.code(), r.body)
	}
	if p := b.get("/console/payments"); !strings.Contains(p.body, `data-enabled="true"`) || !strings.Contains(p.body, `falls below <data class="amt" value="5.000000000000"`) {
		t.Fatalf("state after enabling:\n%s", p.body)
	}
	form.Set("amount", "2000")
	if r := b.post("/console/payments/auto-topup", form); r.status != 400 || r.code() != "invalid_request" {
		t.Fatalf("an amount above the maximum: %d %s", r.status, r.code())
	}
	if err := st.DisableAutoTopUp(t.Context(), e.acct.ID, "Auto top-up was turned off: the card was declined (insufficient funds).", time.Now()); err != nil {
		t.Fatal(err)
	}
	if p := b.get("/console/payments"); !strings.Contains(p.body, `id="topup-notice">Auto top-up was turned off: the card was declined`) ||
		!strings.Contains(p.body, `data-enabled="false"`) {
		t.Fatalf("after a decline:\n%s", p.body)
	}
}

// TestDeclinedTopUpShows: a declined auto top-up (as payments' TopUpOnce
// records one: the claimed payment failed, auto top-up turned off with a
// notice) shows as a banner on the overview and as an entry in the
// activity, beside a credited payment; a key filter hides them, and
// turning auto top-up on again clears the banner.
func TestDeclinedTopUpShows(t *testing.T) {
	e, hook := paymentsEnv(t, true)
	b := e.signedIn(t)
	if p := b.get("/console/"); strings.Contains(p.body, `id="topup-notice"`) {
		t.Fatal("a top-up banner before any top-up")
	}
	if p := b.get("/console/activity"); strings.Contains(p.body, `id="payment-activity"`) {
		t.Fatal("payments in the activity before any payment")
	}
	// A payment credited by its webhook.
	pay, _, err := e.opts.Payments.StartCheckout(t.Context(), e.acct.ID, tollgate.Dollars(25), true)
	if err != nil {
		t.Fatal(err)
	}
	ev := stripetest.Event("evt_act", payments.EventSessionCompleted, time.Now(),
		stripetest.Session(pay.CheckoutSession, e.acct.ID, "25", "1.03", 2603, "paid", "pi_act"))
	if st, body := stripetest.Deliver(t, hook, ev, consoleWhsec, time.Now()); st != 200 || !strings.Contains(body, `"credited"`) {
		t.Fatalf("webhook: %d %s", st, body)
	}
	// The declined top-up.
	st := e.st.(tollgate.PaymentStore)
	ctx, now := t.Context(), time.Now().UTC().Truncate(time.Microsecond)
	if err := st.SaveCard(ctx, e.acct.ID, "cus_act", "pm_act", now); err != nil {
		t.Fatal(err)
	}
	// A threshold above the balance: the top-up is due, so the claim
	// (which checks that under the account's lock) is granted.
	on := tollgate.AutoTopUp{AccountID: e.acct.ID, Enabled: true, Threshold: tollgate.Dollars(1000), Amount: tollgate.Dollars(20), Updated: now}
	if err := st.SetAutoTopUp(ctx, on); err != nil {
		t.Fatal(err)
	}
	q, _ := e.opts.Payments.Quote(tollgate.Dollars(20))
	topUp := tollgate.Payment{ID: tollgate.NewOrderedID("pay_", now), AccountID: e.acct.ID, Provider: "stripe", Kind: tollgate.PaymentAutoTopUp,
		Status: tollgate.PaymentPending, Customer: "cus_act", Credit: q.Credit, Fee: q.Fee, AmountCents: q.AmountCents, Currency: q.Currency, Created: now, Updated: now}
	if ok, err := st.ClaimTopUp(ctx, topUp, now.Add(time.Hour), now); err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	if _, err := st.FailPayment(ctx, topUp.ID, "the card was declined: insufficient_funds", now); err != nil {
		t.Fatal(err)
	}
	const notice = "Auto top-up was turned off: the card was declined (insufficient_funds)."
	if err := st.DisableAutoTopUp(ctx, e.acct.ID, notice, now); err != nil {
		t.Fatal(err)
	}

	if p := b.get("/console/"); p.status != 200 || !strings.Contains(p.body, `id="topup-notice">`+notice) {
		t.Fatalf("overview after a declined top-up: %d\n%s", p.status, p.body)
	}
	act := b.get("/console/activity")
	if act.status != 200 || !strings.Contains(act.body, `id="payact-`+topUp.ID+`" data-status="failed"`) ||
		!strings.Contains(act.body, "Auto top-up declined") || !strings.Contains(act.body, "the card was declined: insufficient_funds") ||
		!strings.Contains(act.body, `id="payact-`+pay.ID+`" data-status="credited"`) || !strings.Contains(act.body, "Payment credited") {
		t.Fatalf("activity after a declined top-up:\n%s", act.body)
	}
	if i, j := strings.Index(act.body, "payact-"+topUp.ID), strings.Index(act.body, "payact-"+pay.ID); i > j {
		t.Error("the activity does not list the newest payment event first")
	}
	keys, _ := e.st.Keys(ctx, e.acct.ID)
	if p := b.get("/console/activity?key=" + keys[0].ID); strings.Contains(p.body, `id="payment-activity"`) {
		t.Error("a key's activity lists payments")
	}
	if p := b.get("/console/activity?until=2000-01-01"); strings.Contains(p.body, `id="payment-activity"`) {
		t.Error("the activity of days before the payments lists them")
	}
	// Turned on again: the banner goes; the entry stays.
	if err := st.SetAutoTopUp(ctx, on); err != nil {
		t.Fatal(err)
	}
	if p := b.get("/console/"); strings.Contains(p.body, `id="topup-notice"`) {
		t.Error("the banner stays after auto top-up was turned on again")
	}
	if p := b.get("/console/activity"); !strings.Contains(p.body, "Auto top-up declined") {
		t.Error("the declined top-up left the activity")
	}
}

// creditedPayment is a checkout payment of credit on account, credited by
// its webhook; its payment intent is pi.
func creditedPayment(t *testing.T, e *env, hook, account string, credit tollgate.Amount, pi string) tollgate.Payment {
	t.Helper()
	q, err := e.opts.Payments.Quote(credit)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	p := tollgate.Payment{ID: tollgate.NewOrderedID("pay_", now), AccountID: account, Provider: "stripe", Kind: tollgate.PaymentCheckout,
		Status: tollgate.PaymentPending, CheckoutSession: tollgate.NewID("cs_test_"), Credit: q.Credit, Fee: q.Fee,
		AmountCents: q.AmountCents, Currency: "usd", Created: now, Updated: now}
	if err := e.st.(tollgate.PaymentStore).CreatePayment(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	deliver(t, hook, payments.EventSessionCompleted,
		stripetest.Session(p.CheckoutSession, account, q.Credit.String(), q.Fee.String(), q.AmountCents, "paid", pi), "credited")
	return p
}

func deliver(t *testing.T, hook, typ string, object map[string]any, outcome string) {
	t.Helper()
	ev := stripetest.Event(tollgate.NewID("evt_"), typ, time.Now(), object)
	if st, body := stripetest.Deliver(t, hook, ev, consoleWhsec, time.Now()); st != 200 || !strings.Contains(body, `"outcome":"`+outcome+`"`) {
		t.Fatalf("webhook %s: %d %s, want outcome %s", typ, st, body, outcome)
	}
}

// TestPaymentHeldAccount: an account that a refund left owing (disabled by
// payments) signs in and reaches only its Payments page (pre-filled with
// what it owes, refusing less) and its activity, each with the banner that
// says what it owes; every other page sends it to Payments, and a key is
// refused. Its payment settles what it owes and enables it: the console is
// whole again. An account held by a dispute alone is told so; one the
// operator disabled still cannot sign in.
func TestPaymentHeldAccount(t *testing.T) {
	e, hook := paymentsEnv(t, true)
	b := e.signedIn(t)
	creditedPayment(t, e, hook, e.acct.ID, tollgate.Dollars(25), "pi_held")
	e.charge(t, e.key, "chat-small", tollgate.Dollars(33), e.clock.now()) // 10 + 25 − 33 = 2 left
	deliver(t, hook, payments.EventChargeRefunded, stripetest.Charge("ch_held", "pi_held", 2603, 2603), "debited")
	if a, _ := e.st.Account(t.Context(), e.acct.ID); !a.Disabled {
		t.Fatal("the refund beyond the balance did not disable the account")
	}

	// The session open before the refund goes on, on Payments alone.
	for _, path := range []string{"/console/", "/console/keys", "/console/playground"} {
		if p := b.get(path); p.status != http.StatusSeeOther || p.header.Get("Location") != "/console/payments" {
			t.Errorf("GET %s of a held account: %d %q, want 303 to the Payments page", path, p.status, p.header.Get("Location"))
		}
	}
	p := b.get("/console/payments")
	const banner = `This account owes <data class="amt" value="23.000000000000"`
	if p.status != 200 || !strings.Contains(p.body, `id="hold" data-owed="23"`) || !strings.Contains(p.body, banner) ||
		!strings.Contains(p.body, "its API keys are refused until it is paid") {
		t.Fatalf("Payments page of a held account: %d\n%s", p.status, p.body)
	}
	if !strings.Contains(p.body, `id="least"`) || !strings.Contains(p.body, `name="amount" value="23"`) ||
		!strings.Contains(p.body, `id="quote-credit"><data class="amt" value="23.000000000000"`) {
		t.Fatalf("the amount is not pre-filled with what is owed:\n%s", p.body)
	}
	if strings.Contains(p.body, `href="/console/keys"`) || strings.Contains(p.body, `href="/console/playground"`) ||
		strings.Contains(p.body, `id="auto-topup"`) || strings.Contains(p.body, `name="save_card"`) {
		t.Fatalf("a held account is offered more than paying:\n%s", p.body)
	}
	if q := b.get("/console/payments?amount=22.99"); q.status != 400 || q.code() != "invalid_request" || !strings.Contains(q.body, "at least 23 USD") {
		t.Fatalf("an amount below what is owed: %d %s", q.status, q.code())
	}
	if a := b.get("/console/activity"); a.status != 200 || !strings.Contains(a.body, banner) || !strings.Contains(a.body, "Payment refunded") {
		t.Fatalf("activity of a held account: %d\n%s", a.status, a.body)
	}
	csrf := p.csrf(t)
	if r := b.post("/console/keys", url.Values{"csrf": {csrf}, "name": {"new"}}); r.status != http.StatusForbidden || r.code() != "account_disabled" ||
		!strings.Contains(r.body, "owes 23 USD") {
		t.Fatalf("a key created by a held account: %d %s\n%s", r.status, r.code(), r.body)
	}
	req, _ := http.NewRequest("POST", e.srv.URL+"/console/playground/key", nil)
	req.Header.Set("X-CSRF-Token", csrf)
	if r := b.do(req); r.status != http.StatusForbidden || r.code() != "account_disabled" {
		t.Fatalf("a playground key of a held account: %d %s", r.status, r.code())
	}
	if r := b.post("/console/payments/auto-topup", url.Values{"csrf": {csrf}, "threshold": {"5"}, "amount": {"20"}}); r.status != http.StatusForbidden {
		t.Fatalf("auto top-up set by a held account: %d", r.status)
	}
	if keys, _ := e.st.Keys(t.Context(), e.acct.ID); len(keys) != 1 {
		t.Fatalf("%d keys, want the one from before", len(keys))
	}

	// A new sign-in goes to the Payments page.
	fresh := e.browser(t)
	if r := fresh.signin(e.acct.ID, password); r.status != http.StatusSeeOther || r.header.Get("Location") != "/console/payments" {
		t.Fatalf("sign-in of a held account: %d %s %q", r.status, r.code(), r.header.Get("Location"))
	}
	co := fresh.post("/console/payments", url.Values{"csrf": {fresh.get("/console/payments").csrf(t)}, "amount": {"23"}})
	m := payRowRE.FindStringSubmatch(co.body)
	if co.status != 200 || m == nil || m[2] != "pending" {
		t.Fatalf("checkout of what is owed: %d\n%s", co.status, co.body)
	}
	pay, err := e.opts.Payments.Payment(t.Context(), m[1])
	if err != nil {
		t.Fatal(err)
	}
	deliver(t, hook, payments.EventSessionCompleted, stripetest.Session(pay.CheckoutSession, e.acct.ID, "23", pay.Fee.String(),
		pay.AmountCents, "paid", "pi_settle"), "credited")
	if a, _ := e.st.Account(t.Context(), e.acct.ID); a.Disabled || a.Balance != 0 {
		t.Fatalf("after paying what is owed: disabled %t, balance %s; want enabled, 0", a.Disabled, a.Balance)
	}
	for _, br := range []*browser{b, fresh} {
		if p := br.get("/console/keys"); p.status != 200 || strings.Contains(p.body, `id="hold"`) {
			t.Fatalf("keys page once paid: %d\n%s", p.status, p.body)
		}
	}

	// Held by a dispute alone (it took all of a payment, nothing owed).
	bob, _ := e.newAccount(t, "bob", "1")
	creditedPayment(t, e, hook, bob.ID, tollgate.Dollars(20), "pi_bob")
	deliver(t, hook, payments.EventDisputeCreated, stripetest.Dispute("dp_bob", "ch_bob", "pi_bob", 2000, "needs_response"), "debited")
	ob := e.browser(t)
	ob.setPassword(bob.ID, password)
	if r := ob.signin(bob.ID, password); r.status != http.StatusSeeOther || r.header.Get("Location") != "/console/payments" {
		t.Fatalf("sign-in of an account held by a dispute: %d %s", r.status, r.code())
	}
	if p := ob.get("/console/payments"); !strings.Contains(p.body, `data-owed="0" data-disputes="1"`) ||
		!strings.Contains(p.body, "A payment of this account is disputed") || strings.Contains(p.body, `id="least"`) {
		t.Fatalf("Payments page of an account held by a dispute:\n%s", p.body)
	}

	// The operator's disable replaces the hold: no sign-in, no page.
	if err := e.st.SetAccountDisabled(t.Context(), bob.ID, true); err != nil {
		t.Fatal(err)
	}
	if p := ob.get("/console/payments"); p.status != http.StatusForbidden || p.code() != "account_disabled" {
		t.Fatalf("page of an account the operator disabled: %d %s", p.status, p.code())
	}
	if r := e.browser(t).signin(bob.ID, password); r.status != http.StatusForbidden || r.code() != "account_disabled" {
		t.Fatalf("sign-in of an account the operator disabled: %d %s", r.status, r.code())
	}
}
