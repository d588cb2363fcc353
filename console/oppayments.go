package console

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/tollgate/tollgate"
)

// OperatorPayments is what the operator's console uses of payments: the
// same methods as the admin API's payment routes (admin.Payments), so
// one value serves both.
type OperatorPayments interface {
	Payments(ctx context.Context, accountID string, limit int) ([]tollgate.Payment, error)
	Payment(ctx context.Context, id string) (tollgate.Payment, error)
	PaymentEvents(ctx context.Context, problemsOnly bool, limit int) ([]tollgate.PaymentEvent, error)
	OwedAmounts(ctx context.Context) ([]tollgate.Owed, error)
	// Recheck asks the provider for a checkout session's state and
	// credits it if it is paid and not yet credited.
	Recheck(ctx context.Context, sessionID string) (tollgate.PaymentResult, error)
}

// How many payments an account's page lists, and how many events the
// payments page lists.
const (
	opPayments = 50
	opEvents   = 100
)

// accountPayments fills in the account's payments and what it owes.
func (op *Operator) accountPayments(ctx context.Context, id string, d *opAccountData) error {
	p := op.o.Payments
	if p == nil {
		return nil
	}
	d.PaymentsOn = true
	var err error
	if d.Payments, err = p.Payments(ctx, id, opPayments); err != nil {
		return err
	}
	owed, err := p.OwedAmounts(ctx)
	if err != nil {
		return err
	}
	for _, o := range owed {
		if o.AccountID == id {
			d.Owed = o.Owed
		}
	}
	return nil
}

type opPaymentsData struct {
	Events []tollgate.PaymentEvent // the problems, newest first
	Owed   []tollgate.Owed
}

// Payments lists the payment events to look at (failed, unmatched, a
// mismatch, an unknown or disabled account) and the accounts that owe.
func (op *Operator) Payments(w http.ResponseWriter, r *http.Request) error {
	var d opPaymentsData
	var err error
	if d.Events, err = op.o.Payments.PaymentEvents(r.Context(), true, opEvents); err != nil {
		return err
	}
	if d.Owed, err = op.o.Payments.OwedAmounts(r.Context()); err != nil {
		return err
	}
	v := op.view(r, "Payments", "payments")
	v.Data = d
	return op.render(w, http.StatusOK, "op_payments", v)
}

// Recheck asks the provider for a payment's checkout session and credits
// it if it is paid and was not credited (a webhook that never came). It
// is safe to repeat: a payment is credited at most once.
func (op *Operator) Recheck(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	p, err := op.o.Payments.Payment(r.Context(), id)
	if errors.Is(err, tollgate.ErrNotFound) {
		return tollgate.Errorf(tollgate.CodeNotFound, "there is no payment %s", id)
	}
	if err != nil {
		return err
	}
	if p.CheckoutSession == "" {
		return tollgate.Errorf(tollgate.CodeInvalidRequest, "payment %s has no checkout session to re-check (an auto top-up is settled by its payment intent's events)", id)
	}
	res, err := op.o.Payments.Recheck(r.Context(), p.CheckoutSession)
	if err != nil {
		return err
	}
	op.o.Log.Info("payment re-checked in the operator console", "payment", id, "session", p.CheckoutSession, "outcome", res.Outcome)
	q := url.Values{"done": {"recheck"}, "payment": {id}, "outcome": {string(res.Outcome)}}
	http.Redirect(w, r, "/console/accounts/"+url.PathEscape(p.AccountID)+"?"+q.Encode()+"#payments", http.StatusSeeOther)
	return nil
}

// recheckOutcomes say what a re-check did, for the notice.
var recheckOutcomes = map[tollgate.PaymentOutcome]string{
	tollgate.OutcomeCredited:        "paid, and credited now",
	tollgate.OutcomeAlreadyCredited: "already credited; nothing changed",
	tollgate.OutcomeUnpaid:          "not paid yet; nothing credited",
	tollgate.OutcomeMismatch:        "paid, but not what was asked (amount or currency); nothing credited",
	tollgate.OutcomeNoAccount:       "its account does not exist; nothing credited",
	tollgate.OutcomeAccountDisabled: "its account is disabled; nothing credited",
	tollgate.OutcomeFailed:          "failed; nothing credited",
}

func recheckNotice(payment string, o tollgate.PaymentOutcome) string {
	what, ok := recheckOutcomes[o]
	if !ok {
		what = strings.ReplaceAll(string(o), "_", " ")
	}
	return "Payment " + payment + " re-checked with the provider: " + what + "."
}
