package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/tollgate/tollgate/internal/browsertest"
)

// `tollgate demo` takes payments as a newcomer would try them, in a real
// browser (headless Chromium): set the demo account's password through the
// printed invitation, sign in, add 25 USD on the Payments page, see the
// declined card refused on the simulated Stripe Checkout, pay with the
// card that pays, come back to the console, watch the payment go from
// pending to credited (the simulated Stripe's signed webhook), and find the
// balance moved by exactly the credit and the payment listed, in the
// payments and in the activity; leave a second payment unpaid, which the
// operator sees pending beside the first on the account's page and
// re-checks (nothing credited), and find the operator's Payments page. It runs when
// TOLLGATE_TEST_BROWSER is set; then a missing Chromium fails it.
func TestDemoPaymentsInBrowser(t *testing.T) {
	browserPath := browsertest.Path(t)
	text := startDemo(t)
	invite := regexp.MustCompile(`set its password once at (\S+)`).FindStringSubmatch(text)
	payURL := regexp.MustCompile(`Add credit at (\S+/console/payments)`).FindStringSubmatch(text)
	if invite == nil || payURL == nil {
		t.Fatalf("the demo's instructions name no invitation or payments page:\n%s", text)
	}

	bctx := browsertest.Context(t, browserPath, chromedp.WindowSize(1280, 900))
	do := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	read := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("read %s: %v", sel, err)
		}
		return s
	}
	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }
	pw := "the demo account's password"
	do("sign in through the invitation",
		chromedp.Navigate(invite[1]),
		chromedp.WaitVisible(css(`input[name=confirm]`)),
		chromedp.SendKeys(css(`input[name=password]`), pw),
		chromedp.SendKeys(css(`input[name=confirm]`), pw),
		chromedp.Click(css(`button[type=submit]`)),
		chromedp.WaitVisible(css(`input[name=account]`)),
		chromedp.SendKeys(css(`input[name=password]`), pw),
		chromedp.Click(css(`main button[type=submit]`)),
		chromedp.WaitVisible(css(`#balance`)),
	)
	if b := read("#balance"); b != "10.000000 USD" {
		t.Fatalf("the demo account's opening balance shows %q", b)
	}
	do("quote 25 USD",
		chromedp.Navigate(payURL[1]),
		chromedp.SendKeys(css(`input[name=amount]`), "25"),
		chromedp.Click(css(`form[action="/console/payments"] button[type=submit]`)),
		chromedp.WaitVisible(css(`#quote-total`)),
	)
	if total := read("#quote-total"); total != "25.000000" {
		t.Fatalf("the total to pay shows %q (the demo charges no fee)", total)
	}
	do("go to the simulated Checkout and be declined",
		chromedp.Click(css(`#quote button[type=submit]`)),
		chromedp.WaitVisible(css(`#pay`)),
		chromedp.SetValue(css(`#card`), "4000 0000 0000 0002"),
		chromedp.Click(css(`#pay`)),
		chromedp.WaitVisible(css(`#error`)),
	)
	if msg := read("#error"); !strings.Contains(msg, "declined") {
		t.Fatalf("the declined card says %q", msg)
	}
	do("pay with the card that pays, back on the console, credited",
		chromedp.SetValue(css(`#card`), "4242 4242 4242 4242"),
		chromedp.Click(css(`#pay`)),
		chromedp.WaitVisible(css(`#payment`)),
		chromedp.WaitVisible(css(`#payment[data-status=credited]`)),
	)
	if row := read(`#payments tbody tr`); !strings.Contains(row, "25.000000") || !strings.Contains(row, "credited") {
		t.Errorf("the payments list's row: %q", row)
	}
	do("the overview", chromedp.Navigate(strings.TrimSuffix(payURL[1], "/payments")+"/"), chromedp.WaitVisible(css(`#balance`)))
	if b := read("#balance"); b != "35.000000 USD" {
		t.Errorf("after paying 25 USD the balance shows %q, want 35.000000 USD", b)
	}
	do("the activity", chromedp.Navigate(strings.TrimSuffix(payURL[1], "/payments")+"/activity"), chromedp.WaitVisible(css(`#payment-activity`)))
	if row := read(`#payment-activity tbody tr`); !strings.Contains(row, "Payment credited") || !strings.Contains(row, "25.000000") {
		t.Errorf("the activity's payment row: %q", row)
	}
	do("start a payment of 5 USD and leave the Checkout page unpaid",
		chromedp.Navigate(payURL[1]),
		chromedp.SendKeys(css(`input[name=amount]`), "5"),
		chromedp.Click(css(`form[action="/console/payments"] button[type=submit]`)),
		chromedp.WaitVisible(css(`#quote-total`)),
		chromedp.Click(css(`#quote button[type=submit]`)),
		chromedp.WaitVisible(css(`#pay`)),
	)

	// The operator sees both payments on the account's page; Re-check of
	// the unpaid one asks the simulated Stripe and credits nothing.
	op := regexp.MustCompile(`operator console \(.*\) is at (\S+)\s+sign in with the admin token (\S+)`).FindStringSubmatch(text)
	if op == nil {
		t.Fatalf("the demo's instructions name no operator console:\n%s", text)
	}
	do("the operator signs in and opens the account",
		chromedp.Navigate(op[1]+"signin"),
		chromedp.WaitVisible(css(`input[name=token]`)),
		chromedp.SendKeys(css(`input[name=token]`), op[2]),
		chromedp.Click(css(`main button[type=submit]`)),
		chromedp.WaitVisible(css(`a[href^="/console/accounts/acct_"]`)),
		chromedp.Click(css(`a[href^="/console/accounts/acct_"]`)),
		chromedp.WaitVisible(css(`#payments-table`)),
	)
	if rows := read(`#payments-table tbody`); !strings.Contains(rows, "credited") || !strings.Contains(rows, "pending") || !strings.Contains(rows, "cs_test_") {
		t.Errorf("the operator's payments of the account: %q", rows)
	}
	do("re-check the pending payment",
		chromedp.Click(css(`#payments-table tr[data-status=pending] button`)),
		chromedp.WaitVisible(css(`div.alert.notice[role=status]`)),
	)
	if page := read(`main`); !strings.Contains(page, "re-checked with the provider: not paid yet; nothing credited.") {
		t.Errorf("after the re-check the page says: %q", page)
	}
	if b := read("#balance"); b != "35.000000 USD" {
		t.Errorf("after re-checking an unpaid payment the balance shows %q, want 35.000000 USD", b)
	}
	do("the operator's payments page", chromedp.Click(css(`nav a[href="/console/payments"]`)), chromedp.WaitVisible(css(`#events-table`)))
	if owed := read(`#owed-table`); !strings.Contains(owed, "No account owes anything.") {
		t.Errorf("the operator's payments page, owed: %q", owed)
	}
}
