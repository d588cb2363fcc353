package main

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/browsertest"
	"github.com/tollgate/tollgate/operator"
	"github.com/tollgate/tollgate/payments"
	"github.com/tollgate/tollgate/simulate"
)

// holder is an account holder's browser on the console of the api
// listener: cookies kept, redirects not followed.
type holder struct {
	t    *testing.T
	base string
	c    *http.Client
}

func newHolder(t *testing.T, h *harness) *holder {
	jar, _ := cookiejar.New(nil)
	return &holder{t: t, base: "http://" + h.main.Addr("api"),
		c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// do sends a GET (form nil) or a form POST to the console, or to a full
// URL elsewhere (the simulated Checkout page); status, Location and body.
func (b *holder) do(path string, form url.Values) (int, string, string) {
	b.t.Helper()
	u := path
	if strings.HasPrefix(path, "/") {
		u = b.base + path
	}
	var resp *http.Response
	var err error
	if form == nil {
		resp, err = b.c.Get(u)
	} else {
		resp, err = b.c.PostForm(u, form)
	}
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Location"), string(body)
}

var formCSRF = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf is the form token of the page at path.
func (b *holder) csrf(path string) string {
	b.t.Helper()
	_, _, body := b.do(path, nil)
	m := formCSRF.FindStringSubmatch(body)
	if m == nil {
		b.t.Fatalf("no form token on %s:\n%s", path, body)
	}
	return m[1]
}

// signIn sets the account's password through an invitation and signs in;
// it returns where the sign-in sends the browser.
func (b *holder) signIn(h *harness, acct string) string {
	b.t.Helper()
	token, _, err := tollgate.IssueInvite(b.t.Context(), h.main.Store, acct, time.Now())
	if err != nil {
		b.t.Fatal(err)
	}
	pw := holderPassword
	invite := tollgate.InvitePath(token)
	if st, _, body := b.do("/console/invite", url.Values{"csrf": {b.csrf(invite)}, "token": {token}, "password": {pw}, "confirm": {pw}}); st != http.StatusSeeOther {
		b.t.Fatalf("set the password: %d\n%s", st, body)
	}
	st, loc, body := b.do("/console/signin", url.Values{"csrf": {b.csrf("/console/signin")}, "account": {acct}, "password": {pw}})
	if st != http.StatusSeeOther {
		b.t.Fatalf("sign-in: %d\n%s", st, body)
	}
	return loc
}

const holderPassword = "a holder who owes"

var checkoutLink = regexp.MustCompile(`href="([^"]+)" id="checkout-link"`)

// pay starts a checkout of amount on the console's Payments page and pays
// it on the simulated Stripe's Checkout page.
func (b *holder) pay(amount string) {
	b.t.Helper()
	st, _, body := b.do("/console/payments", url.Values{"csrf": {b.csrf("/console/payments")}, "amount": {amount}})
	m := checkoutLink.FindStringSubmatch(body)
	if st != 200 || m == nil {
		b.t.Fatalf("checkout of %s: %d\n%s", amount, st, body)
	}
	if st, _, body := b.do(strings.ReplaceAll(m[1], "&amp;", "&"), url.Values{"action": {"pay"}, "email": {"holder@example.com"}}); st >= 400 {
		b.t.Fatalf("the simulated Checkout page: %d\n%s", st, body)
	}
}

// owingWorld is the service with payments on against the simulated Stripe,
// whose signed webhooks reach the public listener.
func owingWorld(t *testing.T) (*harness, *simulate.RunningStripe) {
	t.Helper()
	sim, err := simulate.StartStripe(simulate.StripeConfig{SecretKey: "sk_test_e2e", WebhookSecret: testWebhookSecret,
		WebhookRetryBase: 50 * time.Millisecond, WebhookRetryMax: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	h := paymentsHarnessAt(t, sim.URL())
	sim.SetWebhook("http://" + h.main.Addr("public") + payments.WebhookPath)
	return h, sim
}

// owingAccount is an account with a key that paid 25 USD through Checkout
// and spent all but 2 of it; its payment's intent is returned.
func owingAccount(t *testing.T, h *harness, b *holder) (tollgate.Account, string, string) {
	t.Helper()
	ctx := t.Context()
	acct, _, key := h.newKey(0, nil)
	if loc := b.signIn(h, acct.ID); loc != "/console/" {
		t.Fatalf("sign-in of an enabled account sends to %q", loc)
	}
	b.pay("25")
	var pi string
	waitFor(t, 10*time.Second, func() bool {
		ps, err := h.main.Store.Payments(ctx, acct.ID, 10)
		if err == nil && len(ps) == 1 && ps[0].Status == tollgate.PaymentCredited {
			pi = ps[0].PaymentIntent
		}
		return pi != ""
	})
	if _, err := operator.Post(ctx, h.main.Store, tollgate.LedgerDebit, acct.ID, tollgate.Dollars(23), "spent", "the test", time.Now()); err != nil {
		t.Fatal(err)
	}
	return acct, key, pi
}

// refund refunds the payment with intent pi in the simulated Stripe, and
// waits until its webhook has disabled acct and its key.
func refund(t *testing.T, h *harness, sim *simulate.RunningStripe, acct, pi, key string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, sim.URL()+"/v1/refunds", strings.NewReader(url.Values{"payment_intent": {pi}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer sk_test_e2e")
	if st, _, body := h.do(req); st != 200 {
		t.Fatalf("refund: %d %s", st, body)
	}
	heldThenRefused(t, h, acct, key)
}

// heldThenRefused waits until payments disabled acct (no request is sent
// before: it would spend, and change what is owed), then checks that its
// key is refused.
func heldThenRefused(t *testing.T, h *harness, acct, key string) {
	t.Helper()
	waitFor(t, 10*time.Second, func() bool {
		hold, err := h.main.Store.PaymentHold(t.Context(), acct)
		return err == nil && hold.Held
	})
	waitFor(t, 10*time.Second, func() bool { return h.chatStatus(key) == http.StatusForbidden })
}

// wantHeld: the console shows the holder only Payments, with the banner.
func wantHeld(t *testing.T, b *holder, banner string) {
	t.Helper()
	if st, loc, _ := b.do("/console/keys", nil); st != http.StatusSeeOther || loc != "/console/payments" {
		t.Fatalf("the keys page of a held account: %d %q", st, loc)
	}
	if st, _, body := b.do("/console/payments", nil); st != 200 || !strings.Contains(body, banner) {
		t.Fatalf("the Payments page of a held account lacks %q: %d\n%s", banner, st, body)
	}
}

// TestOwingAccountPaysInConsole: over real HTTP, with the simulated Stripe
// (its Checkout page, its signed webhooks) — a refund that takes more than
// the free balance leaves the account owing and disabled: its key is
// refused, and its holder signs in to the Payments page, which says what
// is owed and asks at least that; key creation is refused. The holder pays
// more on the Checkout page, the webhook credits the payment, what is owed
// is settled, the rest is the balance and the account is enabled: the key
// works and the console is whole. A dispute leaves an account owing too; its holder pays what is
// owed the same way, and the account stays disabled while the dispute is
// open (the page says so), until the dispute is won.
func TestOwingAccountPaysInConsole(t *testing.T) {
	h, sim := owingWorld(t)
	ctx := context.Background()
	owes := `This account owes <data class="amt" value="23.000000000000"`

	// A refund.
	b := newHolder(t, h)
	acct, key, pi := owingAccount(t, h, b)
	refund(t, h, sim, acct.ID, pi, key)
	if hold, err := h.main.Store.PaymentHold(ctx, acct.ID); err != nil || !hold.Held || hold.Owed != tollgate.Dollars(23) {
		t.Fatalf("hold after the refund: %+v, %v", hold, err)
	}
	wantHeld(t, b, owes) // the session from before goes on, on Payments
	fresh := newHolder(t, h)
	if loc := fresh.signIn(h, acct.ID); loc != "/console/payments" {
		t.Fatalf("sign-in of an owing account sends to %q", loc)
	}
	wantHeld(t, fresh, owes)
	if st, _, body := fresh.do("/console/payments", nil); !strings.Contains(body, `name="amount" value="23"`) || st != 200 {
		t.Fatalf("the amount is not pre-filled with what is owed:\n%s", body)
	}
	if st, _, body := fresh.do("/console/keys", url.Values{"csrf": {fresh.csrf("/console/payments")}, "name": {"k"}}); st != http.StatusForbidden ||
		!strings.Contains(body, `data-code="account_disabled"`) {
		t.Fatalf("a key created by an owing account: %d\n%s", st, body)
	}
	if st, _, body := fresh.do("/console/payments", url.Values{"csrf": {fresh.csrf("/console/payments")}, "amount": {"20"}}); st != 400 ||
		!strings.Contains(body, "at least 23 USD") {
		t.Fatalf("a checkout of less than is owed: %d\n%s", st, body)
	}
	fresh.pay("30") // 23 settle what is owed, 7 to spend
	waitFor(t, 10*time.Second, func() bool { return h.chatStatus(key) == 200 })
	a, err := h.main.Store.Account(ctx, acct.ID)
	if hold, herr := h.main.Store.PaymentHold(ctx, acct.ID); err != nil || herr != nil || a.Disabled || hold.Owed != 0 ||
		a.Balance > tollgate.Dollars(7) || a.Balance < tollgate.MustParseAmount("6.99") {
		t.Fatalf("after paying: %+v, hold %+v (%v %v)", a, hold, err, herr)
	}
	if st, _, body := fresh.do("/console/keys", nil); st != 200 || strings.Contains(body, `id="hold"`) {
		t.Fatalf("the keys page once paid: %d\n%s", st, body)
	}

	// A dispute.
	d := newHolder(t, h)
	acct, key, pi = owingAccount(t, h, d)
	dp, err := sim.Dispute(pi, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	heldThenRefused(t, h, acct.ID, key)
	wantHeld(t, d, owes)
	d.pay("23")
	waitFor(t, 10*time.Second, func() bool {
		hold, err := h.main.Store.PaymentHold(ctx, acct.ID)
		return err == nil && hold.Owed == 0
	})
	wantHeld(t, d, "A payment of this account is disputed")
	if st := h.chatStatus(key); st != http.StatusForbidden {
		t.Fatalf("a request while the dispute is open: %d", st)
	}
	if err := sim.CloseDispute(dp, true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return h.chatStatus(key) == 200 })
	if st, _, _ := d.do("/console/", nil); st != 200 {
		t.Fatalf("the overview once the dispute is won: %d", st)
	}
	if st, body := h.adminGet(t, "/admin/v1/audit", "s3cret"); st != 200 || !strings.Contains(body, `"ok": true`) {
		t.Fatalf("audit: %d %s", st, body)
	}
}

// TestOwingAccountInBrowser: in headless Chromium, the holder of an account
// that a refund left owing signs in and lands on Payments: the banner says
// what is owed, the amount is quoted already, the navigation offers
// Activity and Payments alone and the banner and form fit a phone's width;
// Pay leads to the simulated Checkout page, and once what is owed is paid
// the key is no longer refused (402: nothing left to spend) and the console
// is whole again. It runs when TOLLGATE_TEST_BROWSER is set;
// TOLLGATE_SCREENSHOTS=update rewrites docs/console/payments-owing.png.
func TestOwingAccountInBrowser(t *testing.T) {
	browserPath := browsertest.Path(t)
	h, sim := owingWorld(t)
	b := newHolder(t, h)
	acct, key, pi := owingAccount(t, h, b)
	refund(t, h, sim, acct.ID, pi, key)
	base := "http://" + h.main.Addr("api")

	ctx := browsertest.Context(t, browserPath, chromedp.WindowSize(1280, 900))
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	eval := func(js string) bool { t.Helper(); return browsertest.True(t, ctx, js) }
	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }
	run("sign in",
		chromedp.Navigate(base+"/console/signin"),
		chromedp.WaitVisible(css(`input[name=account]`)),
		chromedp.SendKeys(css(`input[name=account]`), acct.ID),
		chromedp.SendKeys(css(`input[name=password]`), holderPassword),
		chromedp.Click(css(`main button[type=submit]`)),
		chromedp.WaitVisible(css(`#hold`)),
		chromedp.WaitVisible(css(`#quote-total`)),
	)
	if !eval(`location.pathname === "/console/payments" && document.querySelector("#hold").textContent.includes("This account owes 23.000000 USD")`) {
		t.Fatal("the sign-in of an owing account does not land on Payments with what it owes")
	}
	if !eval(`[...document.querySelectorAll("nav a")].map(a => a.getAttribute("href")).join(" ") === "/console/activity /console/payments"`) {
		t.Fatal("the navigation of an owing account offers more than Activity and Payments")
	}
	if dir := os.Getenv("TOLLGATE_SCREENSHOTS"); dir != "" {
		if dir == "update" {
			dir = filepath.Join("..", "..", "docs", "console")
		}
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "payments-owing.png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run("on a phone",
		chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(3), chromedp.EmulateMobile),
		chromedp.Navigate(base+"/console/keys"), // sent to Payments
		chromedp.WaitVisible(css(`#hold`)))
	if eval(`document.documentElement.scrollWidth > window.innerWidth + 1`) {
		t.Error("the Payments page of an owing account is wider than a phone")
	}
	run("pay on the simulated Checkout page",
		chromedp.EmulateViewport(1280, 900),
		chromedp.Click(css(`#quote button[type=submit]`)),
		chromedp.WaitVisible(css(`#pay`)),
		chromedp.Click(css(`#pay`)),
	)
	// Exactly what was owed: the account is enabled with nothing to spend.
	waitFor(t, 10*time.Second, func() bool { return h.chatStatus(key) == http.StatusPaymentRequired })
	run("the console is whole again", chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(css(`#balance`)))
	if eval(`document.getElementById("hold") !== null`) {
		t.Error("the banner stays once what was owed is paid")
	}
}
