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
