package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v82/webhook"
)

// `tollgate simulate --stripe` serves the Stripe imitation: a session made
// over its API is paid on its Checkout page and the webhook arrives signed
// with the secret given on the command line.
func TestSimulateStripe(t *testing.T) {
	const secret = "whsec_cli_test"
	got := make(chan string, 10)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		ev, err := webhook.ConstructEvent(body, r.Header.Get("Stripe-Signature"), secret)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			got <- "rejected: " + err.Error()
			return
		}
		got <- string(ev.Type)
	}))
	defer hook.Close()

	addr := freeAddr(t)
	runSimulate(t, "simulating Stripe on http://"+addr, "--stripe", "--listen", addr, "--stripe-webhook-url", hook.URL,
		"--stripe-webhook-secret", secret, "--stripe-webhook-events", "checkout.session.completed")

	form := url.Values{"mode": {"payment"}, "success_url": {"https://example.com/ok"},
		"line_items[0][price_data][currency]": {"usd"}, "line_items[0][price_data][unit_amount]": {"500"},
		"line_items[0][price_data][product_data][name]": {"credit"}, "line_items[0][quantity]": {"1"}}
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/checkout/sessions", strings.NewReader(form.Encode()))
	req.Header.Set("Authorization", "Bearer sk_test_cli")
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var sess struct{ ID, URL string }
	json.NewDecoder(resp.Body).Decode(&sess)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(sess.URL, "http://"+addr+"/c/pay/cs_test_") {
		t.Fatalf("create session: %d %+v", resp.StatusCode, sess)
	}
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err = noRedirect.PostForm(sess.URL, url.Values{"action": {"pay"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("pay: %d", resp.StatusCode)
	}
	select {
	case typ := <-got:
		if typ != "checkout.session.completed" {
			t.Fatalf("first delivery: %s (only checkout.session.completed is subscribed)", typ)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no webhook")
	}
}
