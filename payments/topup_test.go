package payments_test

import (
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/stripetest"
	"github.com/tollgate/tollgate/payments"
	"github.com/tollgate/tollgate/postgres"
	"github.com/tollgate/tollgate/simulate"
)

// TestStripeRetrieveIntent: reading a payment intent (the card a checkout
// saved) is a well-formed request.
func TestStripeRetrieveIntent(t *testing.T) {
	rc := &recorder{}
	p := newStripe(t, rc.start(t, stripetest.URL(t)))
	in, err := p.Intent(t.Context(), "pi_saved")
	if err != nil {
		t.Fatalf("Intent: %v", err)
	}
	if r := rc.last(t); r.Method != "GET" || r.Path != "/v1/payment_intents/pi_saved" || in.ID != "pi_saved" {
		t.Fatalf("request %+v, intent %+v", r, in)
	}
}

// topUpWorld is tollgate's payments on PostgreSQL against tollgate's
// Stripe simulator, which delivers its signed webhooks to instance 0.
type topUpWorld struct {
	sim  *simulate.RunningStripe
	sts  []store
	svcs []*payments.Service
}

func newTopUpWorld(t *testing.T, instances int) *topUpWorld {
	t.Helper()
	schema := postgres.NewTestSchema(t)
	w := &topUpWorld{}
	hook := &lateHandler{}
	hookSrv := newLoopback(t, hook)
	sim, err := simulate.StartStripe(simulate.StripeConfig{WebhookURL: hookSrv + payments.WebhookPath, WebhookSecret: whsec,
		WebhookRetryBase: 50 * time.Millisecond, WebhookRetryMax: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	w.sim = sim
	for range instances {
		st := postgres.OpenTestSchema(t, schema)
		w.sts = append(w.sts, st)
		w.svcs = append(w.svcs, payments.New(newStripe(t, sim.URL()), st, payments.Options{Min: tollgate.Dollars(5),
			Max: tollgate.Dollars(1000), FeeFixed: tollgate.MustParseAmount("0.5"), AutoTopUp: true,
			SuccessURL: "http://console.test/console/payments?payment={PAYMENT_ID}", CancelURL: "http://console.test/console/payments"}))
	}
	hook.set(w.svcs[0])
	return w
}

// TestAutoTopUp: a checkout that saves the card, paid on the simulated
// Checkout page, credits and keeps the card; with the free balance below
// the threshold, three instances running top-ups at once charge the card
// once, and that top-up is credited once (at once, and again by its
// webhook: already credited); a declined card fails the top-up and turns
// auto top-up off with a notice.
func TestAutoTopUp(t *testing.T) {
	w := newTopUpWorld(t, 3)
	st, svc := w.sts[0], w.svcs[0]
	acct := newAccount(t, st, 0)
	p, co, err := svc.StartCheckout(t.Context(), acct, tollgate.Dollars(10), true)
	if err != nil {
		t.Fatalf("StartCheckout: %v", err)
	}
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.PostForm(co.URL, url.Values{"action": {"pay"}, "email": {"ann@example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	waitUntil(t, "the checkout is credited and its card saved", func() bool {
		got, err := st.Payment(t.Context(), p.ID)
		a, aerr := st.AutoTopUp(t.Context(), acct)
		return err == nil && got.Status == tollgate.PaymentCredited && aerr == nil && a.PaymentMethod != ""
	})
	if err := st.SetAutoTopUp(t.Context(), tollgate.AutoTopUp{AccountID: acct, Enabled: true, Threshold: tollgate.Dollars(15),
		Amount: tollgate.Dollars(20), Updated: time.Now()}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var started []tollgate.Payment
	for _, s := range w.svcs {
		wg.Go(func() {
			ps, err := s.TopUpOnce(t.Context())
			if err != nil {
				t.Errorf("TopUpOnce: %v", err)
			}
			mu.Lock()
			started = append(started, ps...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(started) != 1 {
		t.Fatalf("%d top-ups started by 3 instances, want 1", len(started))
	}
	top := started[0]
	waitUntil(t, "the top-up is credited", func() bool {
		got, err := st.Payment(t.Context(), top.ID)
		return err == nil && got.Status == tollgate.PaymentCredited
	})
	if got := balance(t, st, acct); got != tollgate.Dollars(30) {
		t.Fatalf("balance %s after a checkout of 10 and a top-up of 20, want 30", got)
	}
	if ps, _ := svc.TopUpOnce(t.Context()); len(ps) != 0 {
		t.Fatalf("a top-up above the threshold: %+v", ps)
	}
	cleanAudit(t, st)

	// Spend down, and the card declines.
	if _, err := billingPost(t, st, acct, tollgate.Dollars(25)); err != nil {
		t.Fatal(err)
	}
	w.sim.DeclineNext("insufficient_funds")
	ps, err := svc.TopUpOnce(t.Context())
	if err != nil || len(ps) != 1 {
		t.Fatalf("TopUpOnce with a declining card: %+v, %v", ps, err)
	}
	got, _ := st.Payment(t.Context(), ps[0].ID)
	a, _ := st.AutoTopUp(t.Context(), acct)
	if got.Status != tollgate.PaymentFailed || a.Enabled || !strings.Contains(a.Notice, "declined") || a.InFlight != "" {
		t.Fatalf("after a decline: payment %+v, auto top-up %+v", got, a)
	}
	if ps, _ := svc.TopUpOnce(t.Context()); len(ps) != 0 {
		t.Fatal("a top-up ran after auto top-up was turned off")
	}
	if got := balance(t, st, acct); got != tollgate.Dollars(5) {
		t.Fatalf("balance %s, want 5", got)
	}
	cleanAudit(t, st)
}
