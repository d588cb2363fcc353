package payments_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/tollgate/tollgate/internal/stripetest"
	"github.com/tollgate/tollgate/payments"
)

// recorded is one API request tollgate sent, as it reached stripe-mock.
type recorded struct {
	Method, Path, Idempotency, Auth string
	Form                            url.Values
}

// recorder is a reverse proxy in front of stripe-mock that keeps the
// requests; edit, if set, rewrites a response's JSON (to play a paid
// session, which stripe-mock's fixtures never are).
type recorder struct {
	mu   sync.Mutex
	reqs []recorded
	edit func(path string, body map[string]any)
}

func (rc *recorder) start(t *testing.T, target string) string {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	proxy.ModifyResponse = func(resp *http.Response) error {
		if rc.edit == nil || resp.StatusCode != http.StatusOK {
			return nil
		}
		var body map[string]any
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(b, &body); err != nil {
			return err
		}
		rc.edit(resp.Request.URL.Path, body)
		b, _ = json.Marshal(body)
		resp.Body = io.NopCloser(bytes.NewReader(b))
		resp.ContentLength = int64(len(b))
		resp.Header.Del("Content-Length")
		return nil
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		form, _ := url.ParseQuery(string(b))
		rc.mu.Lock()
		rc.reqs = append(rc.reqs, recorded{r.Method, r.URL.Path, r.Header.Get("Idempotency-Key"), r.Header.Get("Authorization"), form})
		rc.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(b))
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func (rc *recorder) last(t *testing.T) recorded {
	t.Helper()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.reqs) == 0 {
		t.Fatal("no request reached stripe-mock")
	}
	return rc.reqs[len(rc.reqs)-1]
}

func newStripe(t *testing.T, apiURL string) *payments.Stripe {
	t.Helper()
	p, err := payments.NewStripe(payments.StripeOptions{SecretKey: "sk_test_tollgate", WebhookSecret: whsec, APIURL: apiURL})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func wantForm(t *testing.T, r recorded, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got := r.Form.Get(k); got != v {
			t.Errorf("%s %s: %s = %q, want %q (form %v)", r.Method, r.Path, k, got, v, r.Form)
		}
	}
}

// TestStripeCreateCheckout: the Checkout Session tollgate creates is
// accepted by stripe-mock (which validates it against Stripe's API
// specification) and carries the account, the credit, one line item of
// credit + fee in cents, the return URLs and the idempotency key.
func TestStripeCreateCheckout(t *testing.T) {
	rc := &recorder{}
	p := newStripe(t, rc.start(t, stripetest.URL(t)))
	co, err := p.CreateCheckout(t.Context(), payments.CheckoutRequest{PaymentID: "pay_1", AccountID: "acct_1", Credit: "25",
		Fee: "0.75", AmountCents: 2575, Currency: "usd", Description: "tollgate credit: 25 USD",
		SuccessURL: "https://tg.example/console/payments?payment=pay_1", CancelURL: "https://tg.example/console/payments?canceled=1"})
	if err != nil {
		t.Fatalf("CreateCheckout: %v", err)
	}
	if !strings.HasPrefix(co.SessionID, "cs_") || !strings.HasPrefix(co.URL, "https://") {
		t.Fatalf("checkout %+v", co)
	}
	r := rc.last(t)
	if r.Method != "POST" || r.Path != "/v1/checkout/sessions" || r.Idempotency != "tollgate-checkout-pay_1" || r.Auth != "Bearer sk_test_tollgate" {
		t.Fatalf("request %+v", r)
	}
	wantForm(t, r, map[string]string{
		"mode": "payment", "client_reference_id": "acct_1",
		"metadata[credit_usd]": "25", "metadata[fee_usd]": "0.75", "metadata[account_id]": "acct_1", "metadata[tollgate_payment]": "pay_1",
		"payment_intent_data[metadata][credit_usd]": "25",
		"line_items[0][quantity]":                   "1", "line_items[0][price_data][unit_amount]": "2575", "line_items[0][price_data][currency]": "usd",
		"line_items[0][price_data][product_data][name]": "tollgate credit: 25 USD",
		"success_url": "https://tg.example/console/payments?payment=pay_1", "cancel_url": "https://tg.example/console/payments?canceled=1",
		"payment_intent_data[setup_future_usage]": "", "customer_creation": "",
	})

	// Saving the card for auto top-ups: off_session future usage, on a new
	// customer, or on the account's customer.
	if _, err := p.CreateCheckout(t.Context(), payments.CheckoutRequest{PaymentID: "pay_2", AccountID: "acct_1", Credit: "10", Fee: "0",
		AmountCents: 1000, Currency: "usd", Description: "d", SuccessURL: "https://x/s", CancelURL: "https://x/c", SaveCard: true}); err != nil {
		t.Fatalf("CreateCheckout saving the card: %v", err)
	}
	wantForm(t, rc.last(t), map[string]string{"payment_intent_data[setup_future_usage]": "off_session", "customer_creation": "always"})
	if _, err := p.CreateCheckout(t.Context(), payments.CheckoutRequest{PaymentID: "pay_3", AccountID: "acct_1", Credit: "10", Fee: "0",
		AmountCents: 1000, Currency: "usd", Description: "d", SuccessURL: "https://x/s", CancelURL: "https://x/c", SaveCard: true,
		Customer: "cus_1"}); err != nil {
		t.Fatalf("CreateCheckout on a customer: %v", err)
	}
	wantForm(t, rc.last(t), map[string]string{"customer": "cus_1", "customer_creation": ""})
}

// TestStripeRetrieveSession: the operator's re-check reads a session.
func TestStripeRetrieveSession(t *testing.T) {
	rc := &recorder{}
	p := newStripe(t, rc.start(t, stripetest.URL(t)))
	s, err := p.Session(t.Context(), "cs_test_recheck")
	if err != nil {
		t.Fatalf("Session: %v", err)
	}
	if r := rc.last(t); r.Method != "GET" || r.Path != "/v1/checkout/sessions/cs_test_recheck" {
		t.Fatalf("request %+v", r)
	}
	if s.ID != "cs_test_recheck" || s.PaymentStatus == "" {
		t.Fatalf("session %+v", s)
	}
}

// TestStripeChargeSaved: an auto top-up is an off-session, confirmed
// PaymentIntent with an idempotency key and tollgate's metadata.
func TestStripeChargeSaved(t *testing.T) {
	rc := &recorder{}
	p := newStripe(t, rc.start(t, stripetest.URL(t)))
	in, err := p.ChargeSaved(t.Context(), payments.SavedChargeRequest{IdempotencyKey: "topup-acct_1-7", PaymentID: "pay_t",
		AccountID: "acct_1", Credit: "20", Fee: "0.5", AmountCents: 2050, Currency: "usd", Customer: "cus_1", PaymentMethod: "pm_card_visa"})
	if err != nil {
		t.Fatalf("ChargeSaved: %v", err)
	}
	if !strings.HasPrefix(in.ID, "pi_") {
		t.Fatalf("intent %+v", in)
	}
	r := rc.last(t)
	if r.Method != "POST" || r.Path != "/v1/payment_intents" || r.Idempotency != "topup-acct_1-7" {
		t.Fatalf("request %+v", r)
	}
	wantForm(t, r, map[string]string{"amount": "2050", "currency": "usd", "customer": "cus_1", "payment_method": "pm_card_visa",
		"off_session": "true", "confirm": "true", "metadata[tollgate_kind]": "auto_topup", "metadata[credit_usd]": "20",
		"metadata[fee_usd]": "0.5", "metadata[account_id]": "acct_1", "metadata[tollgate_payment]": "pay_t"})
}

// TestStripeErrors: an API that does not answer is an error (after
// stripe-go's own retries); a publishable key is not a secret key.
func TestStripeErrors(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	p := newStripe(t, dead.URL)
	if _, err := p.Session(t.Context(), "cs_test_x"); err == nil {
		t.Fatal("a session was read from an API that is not there")
	}
	if _, err := payments.NewStripe(payments.StripeOptions{SecretKey: "pk_test_x", WebhookSecret: "whsec_x"}); err == nil {
		t.Fatal("a publishable key was accepted as the secret key")
	}
	if _, err := payments.NewStripe(payments.StripeOptions{SecretKey: "sk_test_x"}); err == nil {
		t.Fatal("an empty webhook secret was accepted")
	}
}
