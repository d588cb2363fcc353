package simulate_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stripe/stripe-go/v82"

	"github.com/tollgate/tollgate/internal/browsertest"
	"github.com/tollgate/tollgate/simulate"
)

// The Checkout page in a real browser (headless Chromium): a decline shows
// on the page and leaves the session open, Pay takes the browser to the
// success page with the session id, and the webhook follows. It runs when
// TOLLGATE_TEST_BROWSER is set; then a missing Chromium fails it.
func TestStripeCheckoutInBrowser(t *testing.T) {
	browserPath := browsertest.Path(t)
	env := newStripeEnv(t, simulate.StripeConfig{})
	shop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `<!doctype html><p id="done">back from checkout: %s</p>`, r.URL.Query().Get("session"))
	}))
	defer shop.Close()
	p := sessionParams("acct_b", 2500)
	p.SuccessURL = stripe.String(shop.URL + "/paid?session={CHECKOUT_SESSION_ID}")
	sess, err := env.sc.V1CheckoutSessions.Create(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}

	ctx := browsertest.Context(t, browserPath)
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("read %s: %v", sel, err)
		}
		return s
	}
	if err := chromedp.Do(ctx,
		chromedp.Navigate(sess.URL),
		chromedp.WaitVisible(chromedp.CSS(`#pay`)),
		chromedp.Click(chromedp.CSS(`#decline`)),
		chromedp.WaitVisible(chromedp.CSS(`#error`)),
	); err != nil {
		t.Fatalf("decline: %v", err)
	}
	if msg := text("#error"); msg != "Your card was declined." {
		t.Fatalf("decline message %q", msg)
	}
	if amount := text("#amount"); amount != "$25.00" {
		t.Fatalf("amount shown %q", amount)
	}
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`#pay`)),
		chromedp.WaitVisible(chromedp.CSS(`#done`)),
	); err != nil {
		t.Fatalf("pay: %v", err)
	}
	if done := text("#done"); !strings.HasSuffix(done, sess.ID) {
		t.Fatalf("success page says %q, want the session id %s", done, sess.ID)
	}
	if cs := env.hook.sessionEvent(t, "checkout.session.completed", sess.ID); cs.PaymentStatus != stripe.CheckoutSessionPaymentStatusPaid {
		t.Fatalf("completed session: %+v", cs)
	}
}
