package admin

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate"
)

// Payments is what the payment routes use (docs/admin-api.md, "Payments");
// nil in Options when payments are off, and the routes answer 404.
type Payments interface {
	Payments(ctx context.Context, accountID string, limit int) ([]tollgate.Payment, error)
	Payment(ctx context.Context, id string) (tollgate.Payment, error)
	PaymentEvents(ctx context.Context, problemsOnly bool, limit int) ([]tollgate.PaymentEvent, error)
	OwedAmounts(ctx context.Context) ([]tollgate.Owed, error)
	CollectOwed(ctx context.Context, accountID string, at time.Time) (tollgate.PaymentResult, error)
	// Recheck asks the provider for a checkout session's state and
	// credits it if it is paid and not yet credited.
	Recheck(ctx context.Context, sessionID string) (tollgate.PaymentResult, error)
}

// payments is Options.Payments, or the error a payment route answers when
// payments are off.
func (a *API) payments() (Payments, error) {
	if a.opts.Payments == nil {
		return nil, tollgate.Errorf(tollgate.CodeNotFound, "payments are off (config payments.provider)")
	}
	return a.opts.Payments, nil
}

func limitParam(r *http.Request) (int, error) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return 100, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 1000 {
		return 0, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "limit", "limit %q: want 1 to 1000", v)
	}
	return n, nil
}

// PaymentResultView is what a re-check or a collection did.
type PaymentResultView struct {
	Outcome  tollgate.PaymentOutcome `json:"outcome"`
	Payment  *tollgate.Payment       `json:"payment,omitzero"`
	Entries  []tollgate.LedgerEntry  `json:"entries"`
	Owed     tollgate.Amount         `json:"owed"`
	Disabled bool                    `json:"disabled_account"`
	Enabled  bool                    `json:"enabled_account"`
}

func resultView(r tollgate.PaymentResult) PaymentResultView {
	v := PaymentResultView{Outcome: r.Outcome, Entries: r.Entries, Owed: r.Owed, Disabled: r.Disabled, Enabled: r.Enabled}
	if v.Entries == nil {
		v.Entries = []tollgate.LedgerEntry{}
	}
	if r.Payment.ID != "" {
		v.Payment = &r.Payment
	}
	return v
}

// ListPayments lists the payments, newest first; ?account= one account's.
func (a *API) ListPayments(w http.ResponseWriter, r *http.Request) error {
	p, err := a.payments()
	if err != nil {
		return err
	}
	n, err := limitParam(r)
	if err != nil {
		return err
	}
	ps, err := p.Payments(r.Context(), r.URL.Query().Get("account"), n)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, list(ps))
}

// ShowPayment is one payment.
func (a *API) ShowPayment(w http.ResponseWriter, r *http.Request) error {
	p, err := a.payments()
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	got, err := p.Payment(r.Context(), id)
	if err != nil {
		return notFound("payment", id, err)
	}
	return writeJSON(w, http.StatusOK, got)
}

// Recheck takes a payment id or a checkout session id.
func (a *API) Recheck(w http.ResponseWriter, r *http.Request) error {
	p, err := a.payments()
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	session := id
	if got, err := p.Payment(r.Context(), id); err == nil {
		session = got.CheckoutSession
	} else if !strings.HasPrefix(id, "cs_") {
		return notFound("payment", id, err)
	}
	if session == "" {
		return tollgate.Errorf(tollgate.CodeInvalidRequest, "payment %s has no checkout session to re-check", id)
	}
	res, err := p.Recheck(r.Context(), session)
	if err != nil {
		return err
	}
	a.opts.Log.Info("admin: payment re-checked", "payment", id, "session", session, "outcome", res.Outcome)
	return writeJSON(w, http.StatusOK, resultView(res))
}

// PaymentEvents lists the provider's events; ?problems=true those to look at.
func (a *API) PaymentEvents(w http.ResponseWriter, r *http.Request) error {
	p, err := a.payments()
	if err != nil {
		return err
	}
	n, err := limitParam(r)
	if err != nil {
		return err
	}
	evs, err := p.PaymentEvents(r.Context(), r.URL.Query().Get("problems") == "true", n)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, list(evs))
}

// Owed lists the accounts that owe what a refund or dispute could not take.
func (a *API) Owed(w http.ResponseWriter, r *http.Request) error {
	p, err := a.payments()
	if err != nil {
		return err
	}
	o, err := p.OwedAmounts(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, list(o))
}

// CollectOwed takes what an account owes from its free balance.
func (a *API) CollectOwed(w http.ResponseWriter, r *http.Request) error {
	p, err := a.payments()
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	res, err := p.CollectOwed(r.Context(), id, a.opts.Now())
	if err != nil {
		return notFound("account", id, err)
	}
	return writeJSON(w, http.StatusOK, resultView(res))
}
