package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/stripetest"
	"github.com/tollgate/tollgate/payments"
)

const testWebhookSecret = "whsec_e2e"

// paymentsHarness runs Main with payments on, its Stripe API at stripe-mock,
// with public and admin listeners.
func paymentsHarness(t *testing.T) *harness {
	t.Helper()
	return paymentsHarnessAt(t, stripetest.URL(t))
}

// paymentsHarnessAt is paymentsHarness with its Stripe API at mock.
func paymentsHarnessAt(t *testing.T, mock string) *harness {
	t.Helper()
	t.Setenv("TG_TEST_ADMIN_TOKEN", "s3cret")
	t.Setenv("TG_TEST_STRIPE_KEY", "sk_test_e2e")
	t.Setenv("TG_TEST_STRIPE_WHSEC", testWebhookSecret)
	return newHarness(t, harnessOptions{models: flatModel, listen: "  public: 127.0.0.1:0\n  admin: 127.0.0.1:0\n",
		extraYAML: `admin_token_env: TG_TEST_ADMIN_TOKEN
payments:
  provider: stripe
  secret_key_env: TG_TEST_STRIPE_KEY
  webhook_secret_env: TG_TEST_STRIPE_WHSEC
  api_url: ` + mock + `
  console_url: https://tollgate.example/console/
  min: "5"
  max: "500"
  fee: {percent: "2.9", fixed: "0.30"}
`})
}

func (h *harness) adminPost(t *testing.T, path string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+h.main.Addr("admin")+path, nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	status, _, b := h.do(req)
	return status, string(b)
}

// chatStatus is the status of a small chat request with key.
func (h *harness) chatStatus(key string) int {
	st, _, _ := h.post("/v1/chat/completions", `{"model":"bill-flat","messages":[{"role":"user","content":"hi"}]}`,
		map[string]string{"Authorization": "Bearer " + key})
	return st
}

// TestPaymentsEndToEnd: an account without money starts a checkout (a
// real Checkout Session request to stripe-mock), Stripe's signed
// completion reaches the public listener's /webhooks/stripe and the
// account can spend at once; the same event on the API listener credits
// nothing more; a dispute disables the key until it is won; the operator
// sees payments, events and a clean audit through the admin API, and the
// payment series on /metrics.
func TestPaymentsEndToEnd(t *testing.T) {
	h := paymentsHarness(t)
	ctx := context.Background()
	acct, _, key := h.newKey(0, nil)
	if st := h.chatStatus(key); st != http.StatusPaymentRequired {
		t.Fatalf("a request without money: %d, want 402", st)
	}
	p, co, err := h.main.Payments.StartCheckout(ctx, acct.ID, tollgate.Dollars(25), false)
	if err != nil {
		t.Fatalf("StartCheckout: %v", err)
	}
	if p.Fee != tollgate.MustParseAmount("1.03") || p.AmountCents != 2603 || p.Status != tollgate.PaymentPending ||
		!strings.HasPrefix(co.SessionID, "cs_") || co.URL == "" {
		t.Fatalf("checkout %+v %+v", p, co)
	}
	completed := stripetest.Event("evt_e2e_1", payments.EventSessionCompleted, time.Now(),
		stripetest.Session(co.SessionID, acct.ID, "25", "1.03", 2603, "paid", "pi_e2e"))
	publicURL := "http://" + h.main.Addr("public") + payments.WebhookPath
	apiURL := "http://" + h.main.Addr("api") + payments.WebhookPath
	if st, body := stripetest.Deliver(t, publicURL, completed, testWebhookSecret, time.Now()); st != 200 || !strings.Contains(body, `"outcome":"credited"`) {
		t.Fatalf("webhook on the public listener: %d %s", st, body)
	}
	waitFor(t, 10*time.Second, func() bool { return h.chatStatus(key) == 200 })
	if st, body := stripetest.Deliver(t, apiURL, completed, testWebhookSecret, time.Now()); st != 200 || !strings.Contains(body, `"outcome":"already_credited"`) {
		t.Fatalf("the same event on the API listener: %d %s", st, body)
	}
	if st, body := stripetest.Deliver(t, publicURL, completed, "whsec_forged", time.Now()); st != 400 {
		t.Fatalf("a forged delivery: %d %s", st, body)
	}

	// A dispute disables the account's keys; won, it enables them again.
	dispute := stripetest.Dispute("dp_e2e", "ch_e2e", "pi_e2e", 2603, "needs_response")
	if st, body := stripetest.Deliver(t, publicURL, stripetest.Event("evt_e2e_2", payments.EventDisputeCreated, time.Now(), dispute),
		testWebhookSecret, time.Now()); st != 200 || !strings.Contains(body, `"outcome":"debited"`) {
		t.Fatalf("dispute: %d %s", st, body)
	}
	waitFor(t, 10*time.Second, func() bool { return h.chatStatus(key) == http.StatusForbidden })
	dispute["status"] = "won"
	if st, body := stripetest.Deliver(t, publicURL, stripetest.Event("evt_e2e_3", payments.EventDisputeClosed, time.Now(), dispute),
		testWebhookSecret, time.Now()); st != 200 || !strings.Contains(body, `"outcome":"reversed"`) {
		t.Fatalf("dispute won: %d %s", st, body)
	}
	waitFor(t, 10*time.Second, func() bool { return h.chatStatus(key) == 200 })

	// The operator's view.
	st, body := h.adminGet(t, "/admin/v1/payments?account="+acct.ID, "s3cret")
	var list struct {
		Data []tollgate.Payment `json:"data"`
	}
	if st != 200 || json.Unmarshal([]byte(body), &list) != nil || len(list.Data) != 1 || list.Data[0].Status != tollgate.PaymentCredited ||
		list.Data[0].PaymentIntent != "pi_e2e" || list.Data[0].DisputeStatus != "won" {
		t.Fatalf("GET /admin/v1/payments: %d %s", st, body)
	}
	if st, body := h.adminGet(t, "/admin/v1/payment-events", "s3cret"); st != 200 || strings.Count(body, `"id": "evt_e2e_`) != 3 ||
		!strings.Contains(body, `"deliveries": 2`) {
		t.Fatalf("GET /admin/v1/payment-events: %d %s", st, body)
	}
	// Re-check: stripe-mock's session fixture is unpaid and names no
	// account, so nothing is credited; the request itself is well formed.
	if st, body := h.adminPost(t, "/admin/v1/payments/"+p.ID+"/recheck"); st != 200 || !strings.Contains(body, `"outcome": "unmatched"`) {
		t.Fatalf("re-check: %d %s", st, body)
	}
	if st, body := h.adminGet(t, "/admin/v1/owed", "s3cret"); st != 200 || !strings.Contains(body, `"data": []`) {
		t.Fatalf("GET /admin/v1/owed: %d %s", st, body)
	}
	if st, body := h.adminGet(t, "/admin/v1/audit", "s3cret"); st != 200 || !strings.Contains(body, `"ok": true`) {
		t.Fatalf("audit: %d %s", st, body)
	}
	b, err := h.main.Store.Balance(ctx, acct.ID)
	if err != nil || b.Balance <= 0 || b.Balance > tollgate.Dollars(25) {
		t.Fatalf("balance %+v, %v: want the 25 credited less what the requests cost", b, err)
	}
	_, scrape := h.adminGet(t, "/metrics", "")
	for _, want := range []string{`tollgate_payment_events_total{outcome="credited"} 1`, `tollgate_payment_events_total{outcome="already_credited"} 1`,
		`tollgate_payment_webhooks_rejected_total{reason="signature"} 1`, `tollgate_payment_credit_latency_seconds_count 1`} {
		if !strings.Contains(scrape, want) {
			t.Errorf("the scrape lacks %s", want)
		}
	}
	promtoolCheck(t, scrape)
}

// TestPaymentsOff: without payments: no webhook route, no admin routes.
func TestPaymentsOff(t *testing.T) {
	t.Setenv("TG_TEST_ADMIN_TOKEN", "s3cret")
	h := newHarness(t, harnessOptions{models: flatModel, listen: "  public: 127.0.0.1:0\n  admin: 127.0.0.1:0\n",
		extraYAML: "admin_token_env: TG_TEST_ADMIN_TOKEN\n"})
	if h.main.Payments != nil {
		t.Fatal("payments are on by default")
	}
	st, _ := stripetest.Deliver(t, "http://"+h.main.Addr("public")+payments.WebhookPath, []byte(`{}`), "whsec_x", time.Now())
	if st != 404 {
		t.Fatalf("webhook with payments off: %d, want 404", st)
	}
	if st, body := h.adminGet(t, "/admin/v1/payments", "s3cret"); st != 404 || !strings.Contains(body, "payments are off") {
		t.Fatalf("admin payments with payments off: %d %s", st, body)
	}
}
