package simulate_test

// These tests drive the simulated Stripe through stripe-go itself (the
// library tollgate's payments use) and through its Checkout page over real
// HTTP, and check every webhook with stripe-go's webhook.ConstructEvent.

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v82"
	"github.com/stripe/stripe-go/v82/webhook"

	"github.com/tollgate/tollgate/simulate"
)

const testKey = "sk_test_simulated_1234"

// hookReceiver is a webhook endpoint that verifies every delivery with
// stripe-go and keeps the events.
type hookReceiver struct {
	ts     *httptest.Server
	secret atomic.Pointer[string]
	failN  atomic.Int32 // answer 500 to this many more deliveries

	mu       sync.Mutex
	events   []stripe.Event
	rejected []error
}

func newHookReceiver(t *testing.T) *hookReceiver {
	h := &hookReceiver{}
	h.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		ev, err := webhook.ConstructEvent(body, r.Header.Get("Stripe-Signature"), *h.secret.Load())
		h.mu.Lock()
		defer h.mu.Unlock()
		if err != nil {
			h.rejected = append(h.rejected, err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if h.failN.Add(-1) >= 0 {
			http.Error(w, "try later", http.StatusInternalServerError)
			return
		}
		h.events = append(h.events, ev)
	}))
	t.Cleanup(h.ts.Close)
	return h
}

func (h *hookReceiver) received() []stripe.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]stripe.Event(nil), h.events...)
}

func (h *hookReceiver) ofType(typ string) []stripe.Event {
	var out []stripe.Event
	for _, ev := range h.received() {
		if string(ev.Type) == typ {
			out = append(out, ev)
		}
	}
	return out
}

// hookWait bounds how long a test waits for deliveries: only a simulator
// that lost them takes this long. It is generous because the suite runs
// under -race beside other work on a small machine, which stretches the
// simulator's own delays and retries by a factor nobody controls.
const hookWait = 30 * time.Second

// waitEvent waits until n events of typ were accepted.
func (h *hookReceiver) waitEvent(t *testing.T, typ string, n int) []stripe.Event {
	t.Helper()
	deadline := time.Now().Add(hookWait)
	for time.Now().Before(deadline) {
		if evs := h.ofType(typ); len(evs) >= n {
			return evs
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no %d %s event(s) within %v; got %v", n, typ, hookWait, eventTypes(h.received()))
	return nil
}

// sessionEvent waits for an event of typ about one Checkout Session.
func (h *hookReceiver) sessionEvent(t *testing.T, typ, id string) stripe.CheckoutSession {
	t.Helper()
	deadline := time.Now().Add(hookWait)
	for time.Now().Before(deadline) {
		for _, ev := range h.ofType(typ) {
			var cs stripe.CheckoutSession
			if err := json.Unmarshal(ev.Data.Raw, &cs); err != nil {
				t.Fatal(err)
			}
			if cs.ID == id {
				return cs
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no %s event for %s within %v; got %v", typ, id, hookWait, eventTypes(h.received()))
	return stripe.CheckoutSession{}
}

func eventTypes(evs []stripe.Event) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, string(ev.Type))
	}
	return out
}

type stripeEnv struct {
	run  *simulate.RunningStripe
	sc   *stripe.Client
	hook *hookReceiver
}

func newStripeEnv(t *testing.T, cfg simulate.StripeConfig) *stripeEnv {
	t.Helper()
	hook := newHookReceiver(t)
	cfg.WebhookURL = hook.ts.URL
	if cfg.WebhookRetryBase == 0 {
		cfg.WebhookRetryBase, cfg.WebhookRetryMax = 10*time.Millisecond, 40*time.Millisecond
	}
	if cfg.AsyncDelay == 0 {
		cfg.AsyncDelay = 50 * time.Millisecond
	}
	run, err := simulate.StartStripe(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run.Close() })
	secret := run.WebhookSecret()
	hook.secret.Store(&secret)
	return &stripeEnv{run: run, sc: stripeClient(run.URL(), testKey), hook: hook}
}

func stripeClient(url, key string) *stripe.Client {
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(url),
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	return stripe.NewClient(key, stripe.WithBackends(&stripe.Backends{API: backend}))
}

// sessionParams is the Checkout Session tollgate creates for a top-up.
func sessionParams(account string, cents int64) *stripe.CheckoutSessionCreateParams {
	p := &stripe.CheckoutSessionCreateParams{
		Mode:              stripe.String("payment"),
		ClientReferenceID: stripe.String(account),
		SuccessURL:        stripe.String("https://console.example/payments?session={CHECKOUT_SESSION_ID}"),
		CancelURL:         stripe.String("https://console.example/payments?cancelled=1"),
		LineItems: []*stripe.CheckoutSessionCreateLineItemParams{{
			PriceData: &stripe.CheckoutSessionCreateLineItemPriceDataParams{
				Currency:    stripe.String("usd"),
				UnitAmount:  stripe.Int64(cents),
				ProductData: &stripe.CheckoutSessionCreateLineItemPriceDataProductDataParams{Name: stripe.String("tollgate credit")},
			},
			Quantity: stripe.Int64(1),
		}},
	}
	p.AddMetadata("credit_usd", "25.00")
	return p
}

// browser is a customer's browser that does not follow redirects, so the
// test sees where Checkout sends it.
var browser = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// payOnPage loads the Checkout page and presses a button on it.
func payOnPage(t *testing.T, pageURL, action, card string) *http.Response {
	t.Helper()
	resp, err := browser.Get(pageURL)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), `id="pay"`) {
		t.Fatalf("checkout page: %d %s", resp.StatusCode, page)
	}
	form := url.Values{"action": {action}, "email": {"ann@example.com"}}
	if card != "" {
		form.Set("card", card)
	}
	resp, err = browser.PostForm(pageURL, form)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func TestStripeCheckoutPaidThroughStripeGo(t *testing.T) {
	env := newStripeEnv(t, simulate.StripeConfig{})
	ctx := context.Background()
	sess, err := env.sc.V1CheckoutSessions.Create(ctx, sessionParams("acct_42", 2500))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(sess.ID, "cs_test_") || sess.Status != stripe.CheckoutSessionStatusOpen ||
		sess.PaymentStatus != stripe.CheckoutSessionPaymentStatusUnpaid || sess.AmountTotal != 2500 ||
		sess.Currency != "usd" || sess.ClientReferenceID != "acct_42" || sess.Metadata["credit_usd"] != "25.00" {
		t.Fatalf("created session: %+v", sess)
	}
	if sess.URL != env.run.URL()+"/c/pay/"+sess.ID || sess.PaymentIntent != nil {
		t.Fatalf("url %q, payment_intent %v", sess.URL, sess.PaymentIntent)
	}

	resp := payOnPage(t, sess.URL, "pay", "")
	want := "https://console.example/payments?session=" + sess.ID
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != want {
		t.Fatalf("after Pay: %d to %q, want 303 to %q", resp.StatusCode, resp.Header.Get("Location"), want)
	}

	ev := env.hook.waitEvent(t, "checkout.session.completed", 1)[0]
	if ev.APIVersion != stripe.APIVersion || ev.Livemode || ev.Object != "event" || !strings.HasPrefix(ev.ID, "evt_") {
		t.Fatalf("event envelope: %+v", ev)
	}
	var done stripe.CheckoutSession
	if err := json.Unmarshal(ev.Data.Raw, &done); err != nil {
		t.Fatal(err)
	}
	if done.ID != sess.ID || done.PaymentStatus != stripe.CheckoutSessionPaymentStatusPaid ||
		done.Status != stripe.CheckoutSessionStatusComplete || done.AmountTotal != 2500 ||
		done.ClientReferenceID != "acct_42" || done.Metadata["credit_usd"] != "25.00" ||
		done.PaymentIntent == nil || !strings.HasPrefix(done.PaymentIntent.ID, "pi_") || done.URL != "" {
		t.Fatalf("completed session in the event: %+v", done)
	}

	// Retrieve with expand, as a "re-check" does.
	params := &stripe.CheckoutSessionRetrieveParams{}
	params.AddExpand("payment_intent.latest_charge")
	got, err := env.sc.V1CheckoutSessions.Retrieve(ctx, sess.ID, params)
	if err != nil {
		t.Fatal(err)
	}
	pi := got.PaymentIntent
	if pi == nil || pi.ID != done.PaymentIntent.ID || pi.Status != stripe.PaymentIntentStatusSucceeded ||
		pi.AmountReceived != 2500 || pi.LatestCharge == nil || !pi.LatestCharge.Paid ||
		!strings.HasPrefix(pi.LatestCharge.ReceiptURL, env.run.URL()+"/receipts/payment/ch_") {
		t.Fatalf("expanded payment intent: %+v", pi)
	}
	receipt, err := http.Get(pi.LatestCharge.ReceiptURL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(receipt.Body)
	receipt.Body.Close()
	if receipt.StatusCode != 200 || !strings.Contains(string(body), "$25.00") {
		t.Fatalf("receipt: %d %s", receipt.StatusCode, body)
	}
	// The page of a completed session cannot pay again.
	again, err := browser.PostForm(sess.URL, url.Values{"action": {"pay"}})
	if err != nil {
		t.Fatal(err)
	}
	again.Body.Close()
	if again.StatusCode != http.StatusConflict {
		t.Fatalf("paying a complete session again: %d", again.StatusCode)
	}
	for _, typ := range []string{"payment_intent.created", "charge.succeeded", "payment_intent.succeeded"} {
		env.hook.waitEvent(t, typ, 1)
	}
	if len(env.hook.ofType("checkout.session.completed")) != 1 {
		t.Fatalf("completed events: %v", eventTypes(env.hook.received()))
	}
}

func TestStripeCheckoutDeclineKeepsSessionOpen(t *testing.T) {
	env := newStripeEnv(t, simulate.StripeConfig{})
	ctx := context.Background()
	sess, err := env.sc.V1CheckoutSessions.Create(ctx, sessionParams("acct_1", 1000))
	if err != nil {
		t.Fatal(err)
	}
	resp := payOnPage(t, sess.URL, "decline", "")
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusPaymentRequired || !strings.Contains(string(body), "Your card was declined.") {
		t.Fatalf("decline page: %d %s", resp.StatusCode, body)
	}
	failed := env.hook.waitEvent(t, "payment_intent.payment_failed", 1)[0]
	var pi stripe.PaymentIntent
	json.Unmarshal(failed.Data.Raw, &pi)
	if pi.LastPaymentError == nil || pi.LastPaymentError.DeclineCode != "generic_decline" ||
		pi.Status != stripe.PaymentIntentStatusRequiresPaymentMethod {
		t.Fatalf("failed intent: %+v", pi)
	}
	got, err := env.sc.V1CheckoutSessions.Retrieve(ctx, sess.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != stripe.CheckoutSessionStatusOpen || got.PaymentStatus != stripe.CheckoutSessionPaymentStatusUnpaid || got.URL == "" {
		t.Fatalf("session after a decline: %+v", got)
	}
	// An insufficient-funds card declines too; then a good card pays the
	// same session, on the same PaymentIntent.
	resp = payOnPage(t, sess.URL, "pay", "4000 0000 0000 9995")
	body, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusPaymentRequired || !strings.Contains(string(body), "insufficient funds") {
		t.Fatalf("insufficient funds page: %d %s", resp.StatusCode, body)
	}
	if resp := payOnPage(t, sess.URL, "pay", ""); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("pay after declines: %d", resp.StatusCode)
	}
	done := env.hook.waitEvent(t, "checkout.session.completed", 1)[0]
	var cs stripe.CheckoutSession
	json.Unmarshal(done.Data.Raw, &cs)
	if cs.PaymentIntent == nil || cs.PaymentIntent.ID != pi.ID {
		t.Fatalf("the session's intent changed: %v, first %s", cs.PaymentIntent, pi.ID)
	}
	// DeclineNext declines whatever the card.
	sess2, _ := env.sc.V1CheckoutSessions.Create(ctx, sessionParams("acct_1", 1000))
	env.run.DeclineNext("lost_card")
	if resp := payOnPage(t, sess2.URL, "pay", ""); resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("DeclineNext: %d", resp.StatusCode)
	}
	if resp := payOnPage(t, sess2.URL, "pay", ""); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("after the one decline: %d", resp.StatusCode)
	}
}

func TestStripeAsyncPayment(t *testing.T) {
	env := newStripeEnv(t, simulate.StripeConfig{})
	ctx := context.Background()
	for _, c := range []struct{ action, then string }{
		{"async", "checkout.session.async_payment_succeeded"},
		{"async_fail", "checkout.session.async_payment_failed"},
	} {
		sess, err := env.sc.V1CheckoutSessions.Create(ctx, sessionParams("acct_"+c.action, 2500))
		if err != nil {
			t.Fatal(err)
		}
		if resp := payOnPage(t, sess.URL, c.action, ""); resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("%s: %d", c.action, resp.StatusCode)
		}
		completed := env.hook.sessionEvent(t, "checkout.session.completed", sess.ID)
		if completed.PaymentStatus != stripe.CheckoutSessionPaymentStatusUnpaid {
			t.Fatalf("%s: completed with payment_status %q, want unpaid", c.action, completed.PaymentStatus)
		}
		cs := env.hook.sessionEvent(t, c.then, sess.ID)
		wantStatus := stripe.CheckoutSessionPaymentStatusPaid
		if c.action == "async_fail" {
			wantStatus = stripe.CheckoutSessionPaymentStatusUnpaid
		}
		if cs.ID != sess.ID || cs.PaymentStatus != wantStatus {
			t.Fatalf("%s: %s carries %s %s", c.action, c.then, cs.ID, cs.PaymentStatus)
		}
	}
	// A session limited to cards offers no delayed method.
	p := sessionParams("acct_card", 2500)
	p.PaymentMethodTypes = []*string{stripe.String("card")}
	sess, _ := env.sc.V1CheckoutSessions.Create(ctx, p)
	resp, _ := browser.Get(sess.URL)
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(page), "pay-later") {
		t.Fatal("a card-only session offers Pay later")
	}
}

func TestStripeWebhookDelayRetryAndDuplicates(t *testing.T) {
	env := newStripeEnv(t, simulate.StripeConfig{WebhookDelay: 150 * time.Millisecond, WebhookDuplicates: 2})
	ctx := context.Background()
	env.hook.failN.Store(1) // the endpoint is down for the first delivery
	sess, _ := env.sc.V1CheckoutSessions.Create(ctx, sessionParams("acct_9", 900))
	start := time.Now()
	payOnPage(t, sess.URL, "pay", "")
	evs := env.hook.waitEvent(t, "checkout.session.completed", 3)
	if time.Since(start) < 150*time.Millisecond {
		t.Fatalf("delivered before the configured delay (%v)", time.Since(start))
	}
	for _, ev := range evs[1:] {
		if ev.ID != evs[0].ID {
			t.Fatalf("duplicates carry other ids: %s %s", evs[0].ID, ev.ID)
		}
	}
	err := env.run.WaitDeliveries(hookWait, func(ds []simulate.WebhookDelivery) bool {
		var failed, retried bool
		for _, d := range ds {
			failed = failed || d.Status == 500
			retried = retried || d.Attempt > 1 && d.OK()
		}
		return failed && retried
	})
	if err != nil {
		t.Fatalf("no failed-then-retried delivery: %v", err)
	}
	env.hook.mu.Lock()
	rejected := env.hook.rejected
	env.hook.mu.Unlock()
	if len(rejected) > 0 {
		t.Fatalf("deliveries failed verification: %v", rejected)
	}
}

func TestStripeWebhookSignatureAndSecret(t *testing.T) {
	env := newStripeEnv(t, simulate.StripeConfig{WebhookSecret: "whsec_test_fixed", WebhookAttempts: 2})
	// The endpoint checks with another secret: every delivery fails
	// verification, is answered 400 and retried until attempts run out.
	wrong := "whsec_other"
	env.hook.secret.Store(&wrong)
	sess, _ := env.sc.V1CheckoutSessions.Create(context.Background(), sessionParams("acct_x", 700))
	payOnPage(t, sess.URL, "pay", "")
	// Every event's deliveries end at their second attempt.
	events := len(env.run.Events())
	err := env.run.WaitDeliveries(10*time.Second, func(ds []simulate.WebhookDelivery) bool {
		second := 0
		for _, d := range ds {
			if d.Attempt == 2 {
				second++
			}
		}
		return second == events
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond) // several retry intervals: no third attempt comes
	for _, d := range env.run.Deliveries() {
		if d.Attempt > 2 {
			t.Fatalf("attempt %d beyond WebhookAttempts 2: %+v", d.Attempt, d)
		}
	}
	env.hook.mu.Lock()
	rejected := env.hook.rejected
	env.hook.mu.Unlock()
	if len(rejected) == 0 || !errors.Is(rejected[0], webhook.ErrNoValidSignature) {
		t.Fatalf("rejections: %v", rejected)
	}
	// A sender six minutes behind signs stale deliveries: refused.
	env.run.SetWebhookClockSkew(6 * time.Minute)
	right0 := "whsec_test_fixed"
	env.hook.secret.Store(&right0)
	stale := env.run.Events()[0]
	before := len(env.run.Deliveries())
	if err := env.run.ResendEvent(stale.ID); err != nil {
		t.Fatal(err)
	}
	err = env.run.WaitDeliveries(10*time.Second, func(ds []simulate.WebhookDelivery) bool {
		return len(ds) > before && ds[before].EventID == stale.ID && ds[before].Status == 400
	})
	if err != nil {
		t.Fatal(err)
	}
	env.hook.mu.Lock()
	last := env.hook.rejected[len(env.hook.rejected)-1]
	env.hook.mu.Unlock()
	if !errors.Is(last, webhook.ErrTooOld) {
		t.Fatalf("stale delivery rejected with %v", last)
	}
	env.run.SetWebhookClockSkew(0)
	// Rolling the secret while keeping the old one signs with both.
	env.run.RollWebhookSecret("whsec_new", true)
	right := "whsec_new"
	env.hook.secret.Store(&right)
	evs := env.run.Events()
	newest := evs[len(evs)-1]
	if err := env.run.ResendEvent(newest.ID); err != nil {
		t.Fatal(err)
	}
	env.hook.waitEvent(t, newest.Type, 1)
	old := "whsec_test_fixed"
	env.hook.secret.Store(&old)
	if err := env.run.ResendEvent(newest.ID); err != nil {
		t.Fatal(err)
	}
	env.hook.waitEvent(t, newest.Type, 2)
}

func TestStripeWebhooksHeldAndReleasedOutOfOrder(t *testing.T) {
	env := newStripeEnv(t, simulate.StripeConfig{})
	ctx := context.Background()
	env.run.HoldWebhooks()
	sess, _ := env.sc.V1CheckoutSessions.Create(ctx, sessionParams("acct_r", 2500))
	payOnPage(t, sess.URL, "pay", "")
	got, _ := env.sc.V1CheckoutSessions.Retrieve(ctx, sess.ID, nil)
	re, err := env.sc.V1Refunds.Create(ctx, &stripe.RefundCreateParams{PaymentIntent: stripe.String(got.PaymentIntent.ID), Amount: stripe.Int64(1000)})
	if err != nil {
		t.Fatal(err)
	}
	if re.Amount != 1000 || re.Status != stripe.RefundStatusSucceeded {
		t.Fatalf("refund: %+v", re)
	}
	time.Sleep(50 * time.Millisecond)
	if n := len(env.hook.received()); n != 0 {
		t.Fatalf("%d events delivered while held", n)
	}
	if n := env.run.ReleaseWebhooks(true); n < 5 {
		t.Fatalf("released %d events", n)
	}
	env.hook.waitEvent(t, "payment_intent.created", 1)
	types := eventTypes(env.hook.received())
	refunded, completed := -1, -1
	for i, typ := range types {
		switch typ {
		case "charge.refunded":
			refunded = i
		case "checkout.session.completed":
			completed = i
		}
	}
	if refunded < 0 || completed < 0 || refunded > completed {
		t.Fatalf("want charge.refunded before checkout.session.completed: %v", types)
	}
}

func TestStripeOffSessionPaymentIntent(t *testing.T) {
	env := newStripeEnv(t, simulate.StripeConfig{})
	ctx := context.Background()
	cus, err := env.sc.V1Customers.Create(ctx, &stripe.CustomerCreateParams{Email: stripe.String("ann@example.com")})
	if err != nil {
		t.Fatal(err)
	}
	// Checkout saves the card for later when asked to.
	p := sessionParams("acct_auto", 2000)
	p.Customer = stripe.String(cus.ID)
	p.PaymentIntentData = &stripe.CheckoutSessionCreatePaymentIntentDataParams{SetupFutureUsage: stripe.String("off_session")}
	sess, err := env.sc.V1CheckoutSessions.Create(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	payOnPage(t, sess.URL, "pay", "")
	rp := &stripe.CheckoutSessionRetrieveParams{}
	rp.AddExpand("payment_intent")
	got, err := env.sc.V1CheckoutSessions.Retrieve(ctx, sess.ID, rp)
	if err != nil {
		t.Fatal(err)
	}
	pm := got.PaymentIntent.PaymentMethod
	if pm == nil || got.Customer == nil || got.Customer.ID != cus.ID {
		t.Fatalf("session: customer %v, payment method %v", got.Customer, pm)
	}
	saved, err := env.sc.V1PaymentMethods.Retrieve(ctx, pm.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if saved.Customer == nil || saved.Customer.ID != cus.ID || saved.Card.Last4 != "4242" {
		t.Fatalf("saved card: %+v", saved)
	}

	topUp := func(key string) (*stripe.PaymentIntent, error) {
		pp := &stripe.PaymentIntentCreateParams{Amount: stripe.Int64(2000), Currency: stripe.String("usd"),
			Customer: stripe.String(cus.ID), PaymentMethod: stripe.String(pm.ID),
			OffSession: stripe.Bool(true), Confirm: stripe.Bool(true)}
		pp.AddMetadata("credit_usd", "20.00")
		pp.SetIdempotencyKey(key)
		return env.sc.V1PaymentIntents.Create(ctx, pp)
	}
	pi, err := topUp("topup-1")
	if err != nil {
		t.Fatal(err)
	}
	if pi.Status != stripe.PaymentIntentStatusSucceeded || pi.Metadata["credit_usd"] != "20.00" || pi.LatestCharge == nil {
		t.Fatalf("off-session intent: %+v", pi)
	}
	// The same key and parameters give the same intent, not a second charge.
	again, err := topUp("topup-1")
	if err != nil || again.ID != pi.ID {
		t.Fatalf("idempotent replay: %v %v", again, err)
	}
	succeeded := env.hook.waitEvent(t, "payment_intent.succeeded", 2)
	time.Sleep(50 * time.Millisecond)
	if n := len(env.hook.ofType("payment_intent.succeeded")); n != 2 { // the checkout's and the top-up's
		t.Fatalf("%d payment_intent.succeeded events after a replay, want 2: %v", n, succeeded)
	}
	// The page's event has no API request behind it; the top-up's names its
	// request and idempotency key.
	for _, ev := range succeeded {
		var p stripe.PaymentIntent
		json.Unmarshal(ev.Data.Raw, &p)
		if p.ID == pi.ID {
			if ev.Request == nil || !strings.HasPrefix(ev.Request.ID, "req_") || ev.Request.IdempotencyKey != "topup-1" {
				t.Fatalf("the top-up's event names no request: %+v", ev.Request)
			}
		} else if ev.Request != nil && ev.Request.ID != "" {
			t.Fatalf("the Checkout page's event names a request: %+v", ev.Request)
		}
	}

	// A declined top-up: 402 card_error with the failed intent in it.
	env.run.DeclineNext("insufficient_funds")
	_, err = topUp("topup-2")
	var se *stripe.Error
	if !errors.As(err, &se) || se.HTTPStatusCode != 402 || se.Type != stripe.ErrorTypeCard ||
		se.Code != stripe.ErrorCodeCardDeclined || se.DeclineCode != "insufficient_funds" ||
		se.PaymentIntent == nil || se.PaymentIntent.Status != stripe.PaymentIntentStatusRequiresPaymentMethod ||
		!strings.HasPrefix(se.ChargeID, "ch_") {
		t.Fatalf("decline: %#v", err)
	}
	var ce *stripe.CardError
	if !errors.As(se.Err, &ce) {
		t.Fatalf("not a CardError: %T", se.Err)
	}
	env.hook.waitEvent(t, "payment_intent.payment_failed", 1)
	// Replaying the declined request's key gives the same 402.
	_, err2 := topUp("topup-2")
	var se2 *stripe.Error
	if !errors.As(err2, &se2) || se2.ChargeID != se.ChargeID {
		t.Fatalf("replayed decline: %v", err2)
	}
	// The same key with other parameters is refused.
	pp := &stripe.PaymentIntentCreateParams{Amount: stripe.Int64(999), Currency: stripe.String("usd"),
		Customer: stripe.String(cus.ID), PaymentMethod: stripe.String(pm.ID), OffSession: stripe.Bool(true), Confirm: stripe.Bool(true)}
	pp.SetIdempotencyKey("topup-1")
	_, err = env.sc.V1PaymentIntents.Create(ctx, pp)
	if !errors.As(err, &se) || se.HTTPStatusCode != 400 || se.Type != stripe.ErrorTypeIdempotency {
		t.Fatalf("key reused with other parameters: %v", err)
	}
	// A card that needs authentication declines off-session.
	pp = &stripe.PaymentIntentCreateParams{Amount: stripe.Int64(2000), Currency: stripe.String("usd"),
		Customer: stripe.String(cus.ID), PaymentMethod: stripe.String("pm_card_authenticationRequired"),
		OffSession: stripe.Bool(true), Confirm: stripe.Bool(true)}
	_, err = env.sc.V1PaymentIntents.Create(ctx, pp)
	if !errors.As(err, &se) || se.Code != stripe.ErrorCodeAuthenticationRequired {
		t.Fatalf("authentication_required card: %v", err)
	}
	// Retrieve.
	fetched, err := env.sc.V1PaymentIntents.Retrieve(ctx, pi.ID, nil)
	if err != nil || fetched.AmountReceived != 2000 {
		t.Fatalf("retrieve: %+v %v", fetched, err)
	}
}

func TestStripeRefundAndDispute(t *testing.T) {
	env := newStripeEnv(t, simulate.StripeConfig{})
	ctx := context.Background()
	sess, _ := env.sc.V1CheckoutSessions.Create(ctx, sessionParams("acct_d", 2500))
	payOnPage(t, sess.URL, "pay", "")
	got, _ := env.sc.V1CheckoutSessions.Retrieve(ctx, sess.ID, nil)
	piID := got.PaymentIntent.ID

	if _, err := env.sc.V1Refunds.Create(ctx, &stripe.RefundCreateParams{PaymentIntent: stripe.String(piID), Amount: stripe.Int64(1000)}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.sc.V1Refunds.Create(ctx, &stripe.RefundCreateParams{PaymentIntent: stripe.String(piID), Amount: stripe.Int64(2000)}); err == nil {
		t.Fatal("refunding more than is left succeeded")
	}
	evs := env.hook.waitEvent(t, "charge.refunded", 1)
	var ch stripe.Charge
	json.Unmarshal(evs[0].Data.Raw, &ch)
	if ch.AmountRefunded != 1000 || ch.Refunded || ch.PaymentIntent == nil || ch.PaymentIntent.ID != piID || ch.Amount != 2500 {
		t.Fatalf("charge.refunded: %+v", ch)
	}
	if _, err := env.sc.V1Refunds.Create(ctx, &stripe.RefundCreateParams{Charge: stripe.String(ch.ID)}); err != nil {
		t.Fatal(err)
	}
	evs = env.hook.waitEvent(t, "charge.refunded", 2)
	json.Unmarshal(evs[1].Data.Raw, &ch)
	if ch.AmountRefunded != 2500 || !ch.Refunded {
		t.Fatalf("second charge.refunded (cumulative): %+v", ch)
	}

	// A dispute through the operator's endpoint, then won.
	sess2, _ := env.sc.V1CheckoutSessions.Create(ctx, sessionParams("acct_d", 3000))
	payOnPage(t, sess2.URL, "pay", "")
	got2, _ := env.sc.V1CheckoutSessions.Retrieve(ctx, sess2.ID, nil)
	resp, err := http.PostForm(env.run.URL()+"/_sim/disputes", url.Values{"payment_intent": {got2.PaymentIntent.ID}})
	if err != nil {
		t.Fatal(err)
	}
	var dp stripe.Dispute
	json.NewDecoder(resp.Body).Decode(&dp)
	resp.Body.Close()
	if resp.StatusCode != 200 || dp.Status != stripe.DisputeStatusNeedsResponse || dp.Amount != 3000 {
		t.Fatalf("open dispute: %d %+v", resp.StatusCode, dp)
	}
	created := env.hook.waitEvent(t, "charge.dispute.created", 1)[0]
	var dpEv stripe.Dispute
	json.Unmarshal(created.Data.Raw, &dpEv)
	if dpEv.ID != dp.ID || dpEv.PaymentIntent == nil || dpEv.PaymentIntent.ID != got2.PaymentIntent.ID || dpEv.Charge == nil {
		t.Fatalf("charge.dispute.created: %+v", dpEv)
	}
	if _, err := env.sc.V1Refunds.Create(ctx, &stripe.RefundCreateParams{PaymentIntent: stripe.String(got2.PaymentIntent.ID)}); err == nil {
		t.Fatal("refunded a disputed charge")
	}
	resp, err = http.PostForm(env.run.URL()+"/_sim/disputes/"+dp.ID+"/close", url.Values{"status": {"won"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	closed := env.hook.waitEvent(t, "charge.dispute.closed", 1)[0]
	json.Unmarshal(closed.Data.Raw, &dpEv)
	if dpEv.Status != stripe.DisputeStatusWon {
		t.Fatalf("closed dispute: %s", dpEv.Status)
	}
	// The dispute test card is disputed right after paying; lost this time.
	sess3, _ := env.sc.V1CheckoutSessions.Create(ctx, sessionParams("acct_d", 1500))
	payOnPage(t, sess3.URL, "pay", "4000 0000 0000 0259")
	disputes := env.hook.waitEvent(t, "charge.dispute.created", 2)
	json.Unmarshal(disputes[1].Data.Raw, &dpEv)
	if dpEv.Amount != 1500 || dpEv.Reason != stripe.DisputeReasonFraudulent {
		t.Fatalf("test-card dispute: %+v", dpEv)
	}
	// The dispute follows the payment: its session completed first.
	env.hook.sessionEvent(t, "checkout.session.completed", sess3.ID)
	completedAt, disputedAt := -1, -1
	for i, ev := range env.hook.received() {
		var obj struct{ ID string }
		json.Unmarshal(ev.Data.Raw, &obj)
		if ev.Type == "checkout.session.completed" && obj.ID == sess3.ID {
			completedAt = i
		}
		if ev.Type == "charge.dispute.created" && obj.ID == dpEv.ID {
			disputedAt = i
		}
	}
	if completedAt < 0 || disputedAt < completedAt {
		t.Fatalf("dispute event at %d, session completed at %d", disputedAt, completedAt)
	}
	if err := env.run.CloseDispute(dpEv.ID, false); err != nil {
		t.Fatal(err)
	}
	closedEvs := env.hook.waitEvent(t, "charge.dispute.closed", 2)
	json.Unmarshal(closedEvs[1].Data.Raw, &dpEv)
	if dpEv.Status != stripe.DisputeStatusLost {
		t.Fatalf("lost dispute: %s", dpEv.Status)
	}
}

func TestStripeAPIErrors(t *testing.T) {
	env := newStripeEnv(t, simulate.StripeConfig{SecretKey: testKey})
	ctx := context.Background()
	var se *stripe.Error

	_, err := stripeClient(env.run.URL(), "sk_test_wrong_key_9999").V1CheckoutSessions.Create(ctx, sessionParams("a", 2500))
	if !errors.As(err, &se) || se.HTTPStatusCode != 401 || !strings.Contains(se.Msg, "sk_test_****") || !strings.HasSuffix(se.Msg, "9999") {
		t.Fatalf("wrong key: %v", err)
	}
	req, _ := http.NewRequest(http.MethodGet, env.run.URL()+"/v1/payment_intents/pi_x", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("no key: %d", resp.StatusCode)
	}

	// A JSON body is not Stripe's v1 encoding.
	req, _ = http.NewRequest(http.MethodPost, env.run.URL()+"/v1/customers", strings.NewReader(`{"email":"a@example.com"}`))
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(body), "application/x-www-form-urlencoded") {
		t.Fatalf("JSON body: %d %s", resp.StatusCode, body)
	}

	_, err = env.sc.V1CheckoutSessions.Retrieve(ctx, "cs_test_missing", nil)
	if !errors.As(err, &se) || se.HTTPStatusCode != 404 || se.Code != stripe.ErrorCodeResourceMissing {
		t.Fatalf("missing session: %v", err)
	}
	small := sessionParams("a", 49)
	if _, err = env.sc.V1CheckoutSessions.Create(ctx, small); !errors.As(err, &se) || se.HTTPStatusCode != 400 {
		t.Fatalf("49 cents: %v", err)
	}
	noQty := sessionParams("a", 2500)
	noQty.LineItems[0].Quantity = nil
	if _, err = env.sc.V1CheckoutSessions.Create(ctx, noQty); !errors.As(err, &se) || se.Code != stripe.ErrorCodeParameterMissing || se.Param != "line_items[0][quantity]" {
		t.Fatalf("no quantity: %v", err)
	}
	unknown := sessionParams("a", 2500)
	unknown.AddExtra("colour", "blue")
	if _, err = env.sc.V1CheckoutSessions.Create(ctx, unknown); !errors.As(err, &se) || se.Code != stripe.ErrorCodeParameterUnknown {
		t.Fatalf("unknown parameter: %v", err)
	}
	if _, err = env.sc.V1PaymentIntents.Create(ctx, &stripe.PaymentIntentCreateParams{Amount: stripe.Int64(10), Currency: stripe.String("usd")}); !errors.As(err, &se) || se.Code != stripe.ErrorCodeAmountTooSmall {
		t.Fatalf("10 cents: %v", err)
	}
	// A key first used on one endpoint cannot be used on another.
	p := sessionParams("a", 2500)
	p.SetIdempotencyKey("k-1")
	if _, err = env.sc.V1CheckoutSessions.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	cp := &stripe.CustomerCreateParams{}
	cp.SetIdempotencyKey("k-1")
	if _, err = env.sc.V1Customers.Create(ctx, cp); !errors.As(err, &se) || se.Type != stripe.ErrorTypeIdempotency {
		t.Fatalf("key on another endpoint: %v", err)
	}
	// Same key, same parameters: the same session, marked replayed.
	s1, _ := env.sc.V1CheckoutSessions.Create(ctx, p)
	s2, err := env.sc.V1CheckoutSessions.Create(ctx, p)
	if err != nil || s1.ID != s2.ID || s2.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %v %v %v", s1, s2, err)
	}
	// Concurrent requests with one key create one session; those that come
	// while the first runs get 409 (stripe-go retries those by itself).
	var wg sync.WaitGroup
	ids := make(chan string, 20)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := sessionParams("a", 2500)
			p.SetIdempotencyKey("k-concurrent")
			s, err := env.sc.V1CheckoutSessions.Create(ctx, p)
			var se *stripe.Error
			if err == nil {
				ids <- s.ID
			} else if !errors.As(err, &se) || se.HTTPStatusCode != 409 {
				t.Errorf("concurrent create: %v", err)
			}
		}()
	}
	wg.Wait()
	close(ids)
	first := ""
	for id := range ids {
		if first == "" {
			first = id
		}
		if id != first {
			t.Fatalf("one key created two sessions: %s %s", first, id)
		}
	}
	if first == "" {
		t.Fatal("no concurrent create succeeded")
	}
	// Expire.
	s3, _ := env.sc.V1CheckoutSessions.Create(ctx, sessionParams("a", 2500))
	exp, err := env.sc.V1CheckoutSessions.Expire(ctx, s3.ID, nil)
	if err != nil || exp.Status != stripe.CheckoutSessionStatusExpired || exp.URL != "" {
		t.Fatalf("expire: %+v %v", exp, err)
	}
	env.hook.waitEvent(t, "checkout.session.expired", 1)
}

// Answers are snapshots: retrieving a session while its page is paid
// neither races (go test -race) nor shows a half-paid session.
func TestStripeRetrieveWhilePaying(t *testing.T) {
	env := newStripeEnv(t, simulate.StripeConfig{})
	ctx := context.Background()
	p := sessionParams("acct_c", 2500)
	p.CustomerCreation = stripe.String("always")
	sess, err := env.sc.V1CheckoutSessions.Create(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 10; j++ {
				got, err := env.sc.V1CheckoutSessions.Retrieve(ctx, sess.ID, nil)
				if err != nil {
					t.Error(err)
					return
				}
				paid := got.PaymentStatus == stripe.CheckoutSessionPaymentStatusPaid
				if paid != (got.Status == stripe.CheckoutSessionStatusComplete) || paid != (got.Customer != nil) {
					t.Errorf("half-paid session: status %s, payment_status %s, customer %v", got.Status, got.PaymentStatus, got.Customer)
				}
			}
		}()
	}
	payOnPage(t, sess.URL, "pay", "")
	wg.Wait()
	done := env.hook.sessionEvent(t, "checkout.session.completed", sess.ID)
	if done.Customer == nil || !strings.HasPrefix(done.Customer.ID, "cus_") || done.CustomerDetails == nil || done.CustomerDetails.Email != "ann@example.com" {
		t.Fatalf("customer_creation=always: %+v %+v", done.Customer, done.CustomerDetails)
	}
	env.hook.waitEvent(t, "customer.created", 1)
}

// An unpaid session expires on its own at the end of its lifetime.
func TestStripeSessionExpiresOnItsOwn(t *testing.T) {
	env := newStripeEnv(t, simulate.StripeConfig{SessionLifetime: 100 * time.Millisecond})
	ctx := context.Background()
	sess, err := env.sc.V1CheckoutSessions.Create(ctx, sessionParams("acct_e", 2500))
	if err != nil {
		t.Fatal(err)
	}
	expired := env.hook.sessionEvent(t, "checkout.session.expired", sess.ID)
	if expired.Status != stripe.CheckoutSessionStatusExpired || expired.URL != "" {
		t.Fatalf("expired session: %+v", expired)
	}
	resp, err := browser.PostForm(sess.URL, url.Values{"action": {"pay"}})
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(page), "expired") {
		t.Fatalf("paying an expired session: %d %s", resp.StatusCode, page)
	}
	if _, err := env.sc.V1CheckoutSessions.Expire(ctx, sess.ID, nil); err == nil {
		t.Fatal("expired an expired session")
	}
	if n := len(env.hook.ofType("checkout.session.expired")); n != 1 {
		t.Fatalf("%d expired events", n)
	}
}

// A redirect is a failed delivery: Stripe follows none.
func TestStripeWebhookRedirectIsAFailure(t *testing.T) {
	env := newStripeEnv(t, simulate.StripeConfig{WebhookAttempts: 2, WebhookEvents: []string{"customer.created"}})
	moved := httptest.NewServer(http.RedirectHandler(env.hook.ts.URL, http.StatusMovedPermanently))
	defer moved.Close()
	env.run.SetWebhook(moved.URL)
	if _, err := env.sc.V1Customers.Create(context.Background(), &stripe.CustomerCreateParams{}); err != nil {
		t.Fatal(err)
	}
	err := env.run.WaitDeliveries(10*time.Second, func(ds []simulate.WebhookDelivery) bool { return len(ds) == 2 })
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range env.run.Deliveries() {
		if d.Status != http.StatusMovedPermanently || d.OK() {
			t.Fatalf("delivery to a redirect: %+v", d)
		}
	}
	if n := len(env.hook.received()); n != 0 {
		t.Fatalf("the redirect was followed: %d events at its target", n)
	}
}

// Close stops pending deliveries (delayed, retrying, duplicated) at once.
func TestStripeCloseStopsDeliveries(t *testing.T) {
	hook := newHookReceiver(t)
	hook.failN.Store(1000)
	secret := "whsec_close"
	hook.secret.Store(&secret)
	run, err := simulate.StartStripe(simulate.StripeConfig{WebhookURL: hook.ts.URL, WebhookSecret: secret,
		WebhookDuplicates: 2, WebhookRetryBase: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	sc := stripeClient(run.URL(), testKey)
	if _, err := sc.V1Customers.Create(context.Background(), &stripe.CustomerCreateParams{}); err != nil {
		t.Fatal(err)
	}
	// Every copy fails its first attempt and waits an hour to retry.
	if err := run.WaitDeliveries(10*time.Second, func(ds []simulate.WebhookDelivery) bool { return len(ds) == 3 }); err != nil {
		t.Fatal(err)
	}
	run.SetWebhookDelay(time.Hour)
	sc.V1Customers.Create(context.Background(), &stripe.CustomerCreateParams{})
	closed := make(chan struct{})
	go func() { run.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited for pending deliveries")
	}
}

// Events can be listed as Stripe lists them, and those the endpoint never
// accepted found (delivery_success=false): what an operator does when a
// webhook is lost.
func TestStripeListEvents(t *testing.T) {
	env := newStripeEnv(t, simulate.StripeConfig{WebhookAttempts: 1})
	ctx := context.Background()
	env.hook.failN.Store(1) // the first delivery is lost
	cus, err := env.sc.V1Customers.Create(ctx, &stripe.CustomerCreateParams{})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.run.WaitDeliveries(10*time.Second, func(ds []simulate.WebhookDelivery) bool { return len(ds) == 1 }); err != nil {
		t.Fatal(err)
	}
	sess, _ := env.sc.V1CheckoutSessions.Create(ctx, sessionParams("acct_l", 2500))
	payOnPage(t, sess.URL, "pay", "")
	env.hook.sessionEvent(t, "checkout.session.completed", sess.ID)
	events := len(env.run.Events())
	if err := env.run.WaitDeliveries(10*time.Second, func(ds []simulate.WebhookDelivery) bool { return len(ds) == events }); err != nil {
		t.Fatal(err)
	}

	lost := &stripe.EventListParams{DeliverySuccess: stripe.Bool(false)}
	var lostIDs []string
	for ev, err := range env.sc.V1Events.List(ctx, lost) {
		if err != nil {
			t.Fatal(err)
		}
		lostIDs = append(lostIDs, string(ev.Type))
		if ev.PendingWebhooks != 1 {
			t.Fatalf("a lost event with pending_webhooks %d", ev.PendingWebhooks)
		}
	}
	if len(lostIDs) != 1 || lostIDs[0] != "customer.created" {
		t.Fatalf("undelivered events: %v (want the customer.created of %s)", lostIDs, cus.ID)
	}

	// Paging through the session's events two at a time, newest first.
	p := &stripe.EventListParams{Types: []*string{stripe.String("charge.*"), stripe.String("checkout.session.completed")}}
	p.Limit = stripe.Int64(1)
	var types []string
	for ev, err := range env.sc.V1Events.List(ctx, p) {
		if err != nil {
			t.Fatal(err)
		}
		types = append(types, string(ev.Type))
	}
	if strings.Join(types, ",") != "checkout.session.completed,charge.succeeded" {
		t.Fatalf("listed %v", types)
	}
	delivered := &stripe.EventListParams{DeliverySuccess: stripe.Bool(true), Type: stripe.String("payment_intent.succeeded")}
	n := 0
	for ev, err := range env.sc.V1Events.List(ctx, delivered) {
		if err != nil || ev.PendingWebhooks != 0 {
			t.Fatalf("delivered event: %+v %v", ev, err)
		}
		n++
	}
	if n != 1 {
		t.Fatalf("%d delivered payment_intent.succeeded events", n)
	}
}
