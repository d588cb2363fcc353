// Package stripetest helps tests reach stripe-mock (Stripe's own API test
// server) and build webhook deliveries signed as Stripe signs them.
package stripetest

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v82"
	"github.com/stripe/stripe-go/v82/webhook"
)

// Env names the variable that holds stripe-mock's URL (.ci/run starts one
// on a free port and sets it).
const Env = "TOLLGATE_TEST_STRIPE_MOCK"

// URL returns stripe-mock's URL. Without Env the test skips (a laptop with
// Go alone); with it, a stripe-mock that does not answer fails the test.
func URL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(Env)
	if u == "" {
		t.Skip(Env + " is not set (go install github.com/stripe/stripe-mock@v0.203.0; .ci/run starts it)")
	}
	resp, err := http.Get(u + "/v1/charges")
	if err != nil {
		t.Fatalf("%s=%s is set but stripe-mock does not answer: %v", Env, u, err)
	}
	resp.Body.Close()
	return u
}

// Event is a Stripe event of type typ around object, as Stripe sends it
// (the API version stripe-go pins).
func Event(id, typ string, created time.Time, object map[string]any) []byte {
	b, err := json.Marshal(map[string]any{"id": id, "object": "event", "api_version": stripe.APIVersion,
		"created": created.Unix(), "type": typ, "livemode": false, "pending_webhooks": 1,
		"data": map[string]any{"object": object}})
	if err != nil {
		panic(err)
	}
	return b
}

// Session is a Checkout Session object as tollgate creates them.
func Session(id, account, credit, fee string, cents int64, status, pi string) map[string]any {
	return map[string]any{"id": id, "object": "checkout.session", "client_reference_id": account, "mode": "payment",
		"metadata": map[string]string{"credit_usd": credit, "fee_usd": fee, "account_id": account}, "amount_total": cents,
		"currency": "usd", "payment_status": status, "payment_intent": pi, "status": "complete"}
}

// Charge is a Charge object with its cumulative refunded amount.
func Charge(id, pi string, amount, refunded int64) map[string]any {
	return map[string]any{"id": id, "object": "charge", "payment_intent": pi, "amount": amount, "amount_refunded": refunded,
		"refunded": refunded >= amount, "currency": "usd"}
}

// Dispute is a Dispute object.
func Dispute(id, charge, pi string, amount int64, status string) map[string]any {
	return map[string]any{"id": id, "object": "dispute", "charge": charge, "payment_intent": pi, "amount": amount,
		"currency": "usd", "status": status}
}

// Deliver posts payload to url signed with secret at ts, as Stripe
// delivers a webhook, and returns the status and body.
func Deliver(t testing.TB, url string, payload []byte, secret string, ts time.Time) (int, string) {
	t.Helper()
	sp := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: payload, Secret: secret, Timestamp: ts})
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(string(payload)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Stripe-Signature", sp.Header)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}
