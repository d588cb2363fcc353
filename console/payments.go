package console

import (
	"context"
	"encoding/csv"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/payments"
)

// Payments is what the console's payment pages use (docs/payments.md);
// nil in Options when payments are off, and the pages do not exist.
type Payments interface {
	Quote(credit tollgate.Amount) (payments.Quote, error)
	StartCheckout(ctx context.Context, accountID string, credit tollgate.Amount, saveCard bool) (tollgate.Payment, payments.Checkout, error)
	Options() payments.Options
	Payments(ctx context.Context, accountID string, limit int) ([]tollgate.Payment, error)
	Payment(ctx context.Context, id string) (tollgate.Payment, error)
	AutoTopUp(ctx context.Context, accountID string) (tollgate.AutoTopUp, error)
	SetAutoTopUp(ctx context.Context, a tollgate.AutoTopUp) error
	// PaymentHold, OwedMin and CheckOwed: an account that payments
	// disabled signs in to pay what it owes (docs/payments.md).
	PaymentHold(ctx context.Context, accountID string) (tollgate.PaymentHold, error)
	OwedMin(owed tollgate.Amount) tollgate.Amount
	CheckOwed(h tollgate.PaymentHold, credit tollgate.Amount) error
}

// paymentsPath is the Payments page, where an account that payments
// disabled is sent from every other page.
const paymentsPath = "/console/payments"

// paymentHold is what keeps acct disabled by payments; nil if it is
// enabled, if the operator disabled it, or if payments are off (its holder
// could not pay).
func (c *Console) paymentHold(ctx context.Context, acct tollgate.Account) (*tollgate.PaymentHold, error) {
	if c.o.Payments == nil || !acct.Disabled {
		return nil, nil
	}
	h, err := c.o.Payments.PaymentHold(ctx, acct.ID)
	if err != nil || !h.Held {
		return nil, err
	}
	return &h, nil
}

// holdMessage says why an account that payments disabled has its keys
// refused, and what ends it (the banner says the same, in layout.html).
func holdMessage(h *tollgate.PaymentHold) string {
	if h.Owed > 0 {
		return "This account owes " + h.Owed.String() + " USD (a refund or dispute took more than its balance): " +
			"its API keys are refused until it is paid on the Payments page."
	}
	return "A payment of this account is disputed: its API keys are refused until the dispute is won, or the operator enables the account."
}

// paymentsShown is how many payments the page lists (and the CSV holds).
const paymentsShown = 1000

type paymentsData struct {
	Min, Max    tollgate.Amount
	FeePercent  tollgate.Amount
	FeeFixed    tollgate.Amount
	Amount      string          // the amount asked, as typed
	Quote       *payments.Quote // its quote, once asked
	Payment     *tollgate.Payment
	Canceled    bool
	Payments    []tollgate.Payment
	CheckoutURL string // the page that sends the browser to the provider
	// AutoTopUp: offered (the operator's auto_topup), and the account's.
	AutoTopUpOn bool
	TopUp       tollgate.AutoTopUp
	// Least is what an account that payments disabled for what it owes
	// (Owed) must pay at least (0: any amount within Min and Max); Split:
	// that is capped by Max, and what is owed takes more than one payment.
	Least, Owed tollgate.Amount
	Split       bool
}

func (c *Console) paymentsData(r *http.Request) (*paymentsData, error) {
	o := c.o.Payments.Options()
	d := &paymentsData{Min: o.Min, Max: o.Max, FeePercent: o.FeePercent, FeeFixed: o.FeeFixed}
	ps, err := c.o.Payments.Payments(r.Context(), current(r).account.ID, paymentsShown)
	if err != nil {
		return nil, err
	}
	d.Payments = ps
	if h := current(r).hold; h != nil {
		if h.Owed > 0 {
			d.Least, d.Owed = c.o.Payments.OwedMin(h.Owed), h.Owed
			d.Split = h.Owed > d.Least
		}
		// Auto top-up does not run for a disabled account: its form
		// waits until the account is enabled.
		return d, nil
	}
	if d.AutoTopUpOn = o.AutoTopUp; d.AutoTopUpOn {
		d.TopUp, err = c.o.Payments.AutoTopUp(r.Context(), current(r).account.ID)
		if err != nil && !errors.Is(err, tollgate.ErrNotFound) {
			return nil, err
		}
	}
	return d, nil
}

// Payments lists the account's payments, with the form to add credit.
// ?amount= shows what that credit costs (the fee) before paying;
// ?payment= is where the provider's page sends the holder back: that
// payment's state, refreshed while it is pending.
func (c *Console) Payments(w http.ResponseWriter, r *http.Request) error {
	// The payment the page returns to is read before the list: a credit
	// that lands between the two reads then shows as pending above a
	// credited row, and the page refreshes, rather than as credited above
	// a stale pending row that no refresh corrects.
	q := r.URL.Query()
	var shown *tollgate.Payment
	if id := q.Get("payment"); id != "" {
		p, err := c.o.Payments.Payment(r.Context(), id)
		if err != nil || p.AccountID != current(r).account.ID {
			return tollgate.Errorf(tollgate.CodeNotFound, "there is no payment %s", id)
		}
		shown = &p
	}
	d, err := c.paymentsData(r)
	if err != nil {
		return err
	}
	v := c.accountView(r, "Payments", "payments")
	v.Data = d
	if p := shown; p != nil {
		d.Payment, d.Canceled = p, q.Get("canceled") != ""
		if p.Status == tollgate.PaymentPending && !d.Canceled {
			v.Refresh = "2"
		}
	}
	a := q.Get("amount")
	if a == "" && d.Least > 0 && d.Payment == nil {
		a = d.Least.String() // what is owed, quoted before it is asked
	}
	if a != "" {
		d.Amount = a
		quote, err := c.quote(r, a)
		if err != nil {
			return c.pageError(w, v, err)
		}
		d.Quote = &quote
	}
	return c.render(w, http.StatusOK, "payments", v)
}

// quote is what amount costs the signed-in holder; an account that
// payments disabled for what it owes is told the least it must pay.
func (c *Console) quote(r *http.Request, amount string) (payments.Quote, error) {
	a, err := tollgate.ParseAmount(strings.TrimSpace(amount))
	if err != nil {
		return payments.Quote{}, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "amount", "%q is not an amount of USD", amount)
	}
	if h := current(r).hold; h != nil {
		if err := c.o.Payments.CheckOwed(*h, a); err != nil {
			return payments.Quote{}, err
		}
	}
	return c.o.Payments.Quote(a)
}

// pageError renders the page with err shown (a form's mistake).
func (c *Console) pageError(w http.ResponseWriter, v *view, err error) error {
	var te *tollgate.Error
	if !errors.As(err, &te) {
		return err
	}
	v.Error = te
	return c.render(w, statusOf(te.Code), "payments", v)
}

// Checkout starts a payment and sends the browser to the provider's page.
// The answer is a page that goes there itself (a redirect after a form
// would be refused by the console's form-action policy, which allows only
// the console's own origin).
func (c *Console) Checkout(w http.ResponseWriter, r *http.Request) error {
	v := c.accountView(r, "Payments", "payments")
	amount := r.PostFormValue("amount")
	quote, qerr := c.quote(r, amount)
	var p tollgate.Payment
	var co payments.Checkout
	if qerr == nil {
		p, co, qerr = c.o.Payments.StartCheckout(r.Context(), current(r).account.ID, quote.Credit, r.PostFormValue("save_card") == "1")
	}
	d, err := c.paymentsData(r) // after the checkout: the list shows it
	if err != nil {
		return err
	}
	v.Data, d.Amount = d, amount
	if qerr != nil {
		return c.pageError(w, v, qerr)
	}
	c.o.Log.Info("console: checkout started", "account", p.AccountID, "payment", p.ID, "credit", p.Credit.String())
	d.Quote, d.Payment, d.CheckoutURL = &quote, &p, co.URL
	v.Refresh = "0;url=" + co.URL
	return c.render(w, http.StatusOK, "payments", v)
}

// PaymentsCSV is the account's payments as CSV.
func (c *Console) PaymentsCSV(w http.ResponseWriter, r *http.Request) error {
	ps, err := c.o.Payments.Payments(r.Context(), current(r).account.ID, paymentsShown)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "text/csv; charset=utf-8")
	w.Header().Set("Content-Disposition", `attachment; filename="tollgate-payments-`+current(r).account.ID+`.csv"`)
	cw := csv.NewWriter(w)
	if err := cw.Write([]string{"created", "payment", "status", "credit_usd", "fee_usd", "paid_cents", "currency",
		"refunded_usd", "disputed_usd", "credited", "receipt_url"}); err != nil {
		return err
	}
	for _, p := range ps {
		credited := ""
		if !p.Credited.IsZero() {
			credited = p.Credited.UTC().Format("2006-01-02T15:04:05Z")
		}
		if err := cw.Write([]string{p.Created.UTC().Format("2006-01-02T15:04:05Z"), p.ID, string(p.Status), p.Credit.String(),
			p.Fee.String(), strconv.FormatInt(p.AmountCents, 10), p.Currency, p.Refunded.String(), p.Disputed.String(),
			credited, p.ReceiptURL}); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// SetAutoTopUp turns the account's auto top-up on or off: "when the free
// balance falls below threshold, add amount" to the card a checkout saved.
func (c *Console) SetAutoTopUp(w http.ResponseWriter, r *http.Request) error {
	d, err := c.paymentsData(r)
	if err != nil {
		return err
	}
	v := c.accountView(r, "Payments", "payments")
	v.Data = d
	if !d.AutoTopUpOn {
		return tollgate.Errorf(tollgate.CodeNotFound, "auto top-up is not offered")
	}
	a := tollgate.AutoTopUp{AccountID: current(r).account.ID, Enabled: r.PostFormValue("enabled") == "1", Updated: c.o.Now()}
	if a.Threshold, err = tollgate.ParseAmount(strings.TrimSpace(r.PostFormValue("threshold"))); err != nil || a.Threshold < 0 {
		return c.pageError(w, v, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "threshold", "the threshold must be an amount of USD"))
	}
	q, err := c.quote(r, r.PostFormValue("amount"))
	if err != nil {
		return c.pageError(w, v, err)
	}
	a.Amount = q.Credit
	if a.Enabled && d.TopUp.PaymentMethod == "" {
		return c.pageError(w, v, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "enabled",
			"no card is saved yet: add credit once with \"Save this card for auto top-up\" ticked"))
	}
	if err := c.o.Payments.SetAutoTopUp(r.Context(), a); err != nil {
		return err
	}
	http.Redirect(w, r, "/console/payments#auto-topup", http.StatusSeeOther)
	return nil
}

// topUpNotice is why the account's auto top-up was turned off (a declined
// card), for the overview's banner; "" if it was not, or payments or auto
// top-up are off.
func (c *Console) topUpNotice(r *http.Request) (string, error) {
	if c.o.Payments == nil || !c.o.Payments.Options().AutoTopUp {
		return "", nil
	}
	a, err := c.o.Payments.AutoTopUp(r.Context(), current(r).account.ID)
	if errors.Is(err, tollgate.ErrNotFound) {
		return "", nil
	}
	if err != nil || a.Enabled {
		return "", err
	}
	return a.Notice, nil
}

// activityPayments is how many payment events the activity lists.
const activityPayments = 10

// paymentActivity is a payment as the activity lists it: what happened
// to it, when.
type paymentActivity struct {
	tollgate.Payment
	What string
	Time time.Time
}

// paymentsActivity lists the account's payments that came to something
// (credited, failed — a declined auto top-up among them —, refunded,
// disputed), newest first, within the filter's days; none when the filter
// names a key or a model (a payment has neither), or payments are off.
func (c *Console) paymentsActivity(r *http.Request, uf tollgate.UsageFilter) ([]paymentActivity, error) {
	if c.o.Payments == nil || uf.KeyID != "" || uf.Model != "" {
		return nil, nil
	}
	ps, err := c.o.Payments.Payments(r.Context(), uf.AccountID, paymentsShown)
	if err != nil {
		return nil, err
	}
	var out []paymentActivity
	for _, p := range ps {
		a := paymentActivity{Payment: p, Time: p.Updated}
		if !p.Credited.IsZero() {
			a.Time = p.Credited
		}
		topUp := p.Kind == tollgate.PaymentAutoTopUp
		switch p.Status {
		case tollgate.PaymentPending:
			continue
		case tollgate.PaymentCredited:
			a.What = pick(topUp, "Auto top-up credited", "Payment credited")
		case tollgate.PaymentFailed:
			a.What = pick(topUp, "Auto top-up declined", "Payment failed")
			if topUp && !strings.Contains(p.Note, "declined") {
				a.What = "Auto top-up failed"
			}
		case tollgate.PaymentRefunded:
			a.What = pick(topUp, "Auto top-up refunded", "Payment refunded")
		case tollgate.PaymentDisputed:
			a.What = pick(topUp, "Auto top-up disputed", "Payment disputed")
		}
		if (!uf.Since.IsZero() && a.Time.Before(uf.Since)) || (!uf.Until.IsZero() && !a.Time.Before(uf.Until)) {
			continue
		}
		out = append(out, a)
	}
	slices.SortStableFunc(out, func(a, b paymentActivity) int { return b.Time.Compare(a.Time) })
	return out[:min(len(out), activityPayments)], nil
}

func pick(cond bool, yes, no string) string {
	if cond {
		return yes
	}
	return no
}
