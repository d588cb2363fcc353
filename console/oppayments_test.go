package console

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/stripetest"
	"github.com/tollgate/tollgate/payments"
	"github.com/tollgate/tollgate/simulate"
)

// operatorPayments signs an operator in to a console whose payments are
// the holder's console's (e.opts.Payments).
func operatorPayments(t *testing.T, e *env) *browser {
	t.Helper()
	b := newOperator(t, e, adminToken, func(o *OperatorOptions) { o.Payments = e.opts.Payments.(OperatorPayments) })
	if r := b.operatorSignin(adminToken); r.status != http.StatusSeeOther {
		t.Fatalf("sign-in: %d %s", r.status, r.code())
	}
	return b
}

// TestOperatorRecheck: a payment paid on the provider's page whose webhook
// never came stays pending; the operator's Re-check credits it once, and
// a second re-check changes nothing. The provider is the simulated Stripe
// with no webhook endpoint (the lost webhook).
func TestOperatorRecheck(t *testing.T) {
	sim := simulate.NewStripe(simulate.StripeConfig{})
	t.Cleanup(sim.Close)
	api := httptest.NewServer(sim)
	t.Cleanup(api.Close)
	e, _ := paymentsEnvAt(t, api.URL, false)
	pay, co, err := e.opts.Payments.StartCheckout(t.Context(), e.acct.ID, tollgate.Dollars(25), false)
	if err != nil {
		t.Fatal(err)
	}
	// Paid on the simulated Checkout page; no webhook is sent.
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.PostForm(co.URL, url.Values{"action": {"pay"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("paying on the Checkout page: %d", resp.StatusCode)
	}

	b := operatorPayments(t, e)
	page := b.get("/console/accounts/" + e.acct.ID)
	if page.status != 200 || !strings.Contains(page.body, `href="/console/payments"`) ||
		!strings.Contains(page.body, `id="pay-`+pay.ID+`" data-status="pending"`) || !strings.Contains(page.body, pay.CheckoutSession) ||
		!strings.Contains(page.body, `id="recheck-`+pay.ID+`"`) || !strings.Contains(page.body, `id="owed">Owes nothing.`) {
		t.Fatalf("account page before the re-check: %d\n%s", page.status, page.body)
	}
	if r := b.post("/console/payments/"+pay.ID+"/recheck", url.Values{}); r.status != http.StatusBadRequest || r.code() != "invalid_request" {
		t.Fatalf("a re-check without the CSRF token: %d %s", r.status, r.code())
	}
	if bal, _ := e.st.Balance(t.Context(), e.acct.ID); bal.Balance != tollgate.Dollars(10) {
		t.Fatalf("balance %s before the re-check, want 10", bal.Balance)
	}
	csrf := url.Values{"csrf": {page.csrf(t)}}
	r := b.post("/console/payments/"+pay.ID+"/recheck", csrf)
	if r.status != http.StatusSeeOther || !strings.HasPrefix(r.header.Get("Location"), "/console/accounts/"+e.acct.ID+"?") {
		t.Fatalf("re-check: %d %q %s", r.status, r.header.Get("Location"), r.body)
	}
	after := b.get(r.header.Get("Location"))
	if !strings.Contains(after.body, "re-checked with the provider: paid, and credited now.") ||
		!strings.Contains(after.body, `id="pay-`+pay.ID+`" data-status="credited"`) || strings.Contains(after.body, `id="recheck-`+pay.ID+`"`) {
		t.Fatalf("account page after the re-check:\n%s", after.body)
	}
	if bal, _ := e.st.Balance(t.Context(), e.acct.ID); bal.Balance != tollgate.Dollars(35) {
		t.Fatalf("balance %s after the re-check, want 10 + 25", bal.Balance)
	}
	// Again (a second tab, a double click): credited once.
	r = b.post("/console/payments/"+pay.ID+"/recheck", csrf)
	if again := b.get(r.header.Get("Location")); !strings.Contains(again.body, "already credited; nothing changed.") {
		t.Fatalf("second re-check: %d\n%s", r.status, again.body)
	}
	if bal, _ := e.st.Balance(t.Context(), e.acct.ID); bal.Balance != tollgate.Dollars(35) {
		t.Fatalf("balance %s after a second re-check, want 35", bal.Balance)
	}
	if r := b.post("/console/payments/pay_nope/recheck", csrf); r.status != 404 || r.code() != "not_found" {
		t.Fatalf("re-check of an unknown payment: %d %s", r.status, r.code())
	}
}

// TestOperatorPaymentProblems: the payments page lists the events that
// credited nothing and the accounts that owe; a refund beyond the balance
// shows as owed on the account's page too.
func TestOperatorPaymentProblems(t *testing.T) {
	e, hook := paymentsEnv(t, false)
	b := operatorPayments(t, e)
	if p := b.get("/console/payments"); p.status != 200 || !strings.Contains(p.body, "No account owes anything.") ||
		!strings.Contains(p.body, "None: every event was applied.") {
		t.Fatalf("payments page with nothing to show: %d\n%s", p.status, p.body)
	}
	// A session for an account that does not exist: unknown_account.
	ev := stripetest.Event("evt_nobody", payments.EventSessionCompleted, time.Now(),
		stripetest.Session("cs_test_nobody", "acct_nobody", "25", "0", 2500, "paid", "pi_nobody"))
	if st, body := stripetest.Deliver(t, hook, ev, consoleWhsec, time.Now()); st != 200 {
		t.Fatalf("webhook: %d %s", st, body)
	}
	// A payment credited, then refunded in full after the balance was spent.
	pay, _, err := e.opts.Payments.StartCheckout(t.Context(), e.acct.ID, tollgate.Dollars(25), false)
	if err != nil {
		t.Fatal(err)
	}
	ev = stripetest.Event("evt_paid", payments.EventSessionCompleted, time.Now(),
		stripetest.Session(pay.CheckoutSession, e.acct.ID, "25", "1.03", 2603, "paid", "pi_owed"))
	if st, body := stripetest.Deliver(t, hook, ev, consoleWhsec, time.Now()); st != 200 || !strings.Contains(body, `"credited"`) {
		t.Fatalf("webhook: %d %s", st, body)
	}
	// The operator takes the whole balance out; the refund then cannot be
	// taken and is owed.
	page := b.get("/console/accounts/" + e.acct.ID)
	if r := b.post("/console/accounts/"+e.acct.ID+"/debit", url.Values{"csrf": {page.csrf(t)}, "amount": {"35"}}); r.status != http.StatusSeeOther {
		t.Fatalf("debit: %d %s", r.status, r.code())
	}
	ev = stripetest.Event("evt_refund", payments.EventChargeRefunded, time.Now(), stripetest.Charge("ch_owed", "pi_owed", 2603, 2603))
	if st, body := stripetest.Deliver(t, hook, ev, consoleWhsec, time.Now()); st != 200 || !strings.Contains(body, `"debited"`) {
		t.Fatalf("refund webhook: %d %s", st, body)
	}
	p := b.get("/console/payments")
	if p.status != 200 || !strings.Contains(p.body, `id="ev-evt_nobody" data-outcome="unknown_account"`) ||
		strings.Contains(p.body, `id="ev-evt_paid"`) || !strings.Contains(p.body, `id="owed-`+e.acct.ID+`"`) ||
		!strings.Contains(p.body, `<data class="amt" value="25.000000000000"`) {
		t.Fatalf("payments page: %d\n%s", p.status, p.body)
	}
	acct := b.get("/console/accounts/" + e.acct.ID)
	if !strings.Contains(acct.body, `id="owed"><span class="status-revoked">Owes <data class="amt" value="25.000000000000"`) ||
		!strings.Contains(acct.body, `id="pay-`+pay.ID+`" data-status="refunded"`) || !strings.Contains(acct.body, "pi_owed") {
		t.Fatalf("account page of an account that owes:\n%s", acct.body)
	}
}

// TestOperatorPaymentsOff: with payments off the operator's console has
// no payment page, link, section or re-check.
func TestOperatorPaymentsOff(t *testing.T) {
	e := newEnv(t, Options{})
	b := newOperator(t, e, adminToken)
	b.operatorSignin(adminToken)
	acct := b.get("/console/accounts/" + e.acct.ID)
	if acct.status != 200 || strings.Contains(acct.body, "/console/payments") || strings.Contains(acct.body, `id="payments"`) {
		t.Fatalf("account page with payments off:\n%s", acct.body)
	}
	if p := b.get("/console/payments"); p.status != 404 {
		t.Fatalf("payments page with payments off: %d", p.status)
	}
	if r := b.post("/console/payments/pay_x/recheck", url.Values{"csrf": {acct.csrf(t)}}); r.status != 404 {
		t.Fatalf("re-check with payments off: %d", r.status)
	}
}
