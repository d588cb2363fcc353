package payments

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/tollgate/tollgate"
)

// Store is what the service keeps payments in.
type Store interface {
	tollgate.PaymentStore
	Account(ctx context.Context, id string) (tollgate.Account, error)
}

// Observer is told what the service did (the metrics; nil: nothing).
type Observer interface {
	// PaymentEvent counts a webhook event (or re-check) by its outcome.
	PaymentEvent(outcome tollgate.PaymentOutcome)
	// WebhookRejected counts a delivery refused before any change
	// (reason: signature, body).
	WebhookRejected(reason string)
	// CreditLatency is the time from the provider's payment to the credit.
	CreditLatency(d time.Duration)
}

// Options are the operator's settings (config `payments:`).
type Options struct {
	// Min and Max bound one credit (USD, whole cents).
	Min, Max tollgate.Amount
	// FeePercent (a percentage: "2.9" is 2.9 %) and FeeFixed are added to
	// the credit; the sum is rounded up to the cent.
	FeePercent tollgate.Amount
	FeeFixed   tollgate.Amount
	// SuccessURL and CancelURL are where the hosted page sends the holder
	// back ({PAYMENT_ID} is replaced by the payment's id).
	SuccessURL, CancelURL string
	// AutoTopUp allows saving a card for off-session top-ups.
	AutoTopUp bool
	// DeferUnknown is how long a refund or dispute of a payment not known
	// yet is answered with a retryable error, so the provider delivers it
	// again after the payment's own event (default 24 h); after that it
	// is recorded as unmatched.
	DeferUnknown time.Duration
	Now          func() time.Time
	Log          *slog.Logger
	Observer     Observer
}

// Service takes payments through a provider and applies its events.
type Service struct {
	p   Provider
	st  Store
	o   Options
	now func() time.Time
	log *slog.Logger
}

// New returns the service.
func New(p Provider, st Store, o Options) *Service {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.DeferUnknown == 0 {
		o.DeferUnknown = 24 * time.Hour
	}
	return &Service{p: p, st: st, o: o, now: o.Now, log: o.Log}
}

// Provider returns the service's provider.
func (s *Service) Provider() Provider { return s.p }

// Options returns the service's options.
func (s *Service) Options() Options { return s.o }

// Quote is what a credit costs the account holder.
type Quote struct {
	Credit      tollgate.Amount `json:"credit"`
	Fee         tollgate.Amount `json:"fee"`
	Total       tollgate.Amount `json:"total"`
	AmountCents int64           `json:"amount_cents"`
	Currency    string          `json:"currency"`
}

// Quote checks a credit against the bounds and adds the fee.
func (s *Service) Quote(credit tollgate.Amount) (Quote, error) {
	if _, err := credit.Cents(); err != nil || credit <= 0 {
		return Quote{}, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "amount", "the amount must be a positive number of dollars and cents, got %s", credit)
	}
	if credit < s.o.Min || (s.o.Max > 0 && credit > s.o.Max) {
		return Quote{}, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "amount", "the amount must be between %s and %s USD, got %s", s.o.Min, s.o.Max, credit)
	}
	// credit × percent / 100 + fixed, then rounded up to the cent.
	fee := tollgate.MulDivCeil(credit, s.o.FeePercent, 100*tollgate.Dollars(1)) + s.o.FeeFixed
	feeCents := fee.CentsCeil()
	fee, _ = tollgate.AmountFromCents(feeCents)
	total := credit + fee
	cents, err := total.Cents()
	if err != nil {
		return Quote{}, err
	}
	return Quote{Credit: credit, Fee: fee, Total: total, AmountCents: cents, Currency: "usd"}, nil
}

// StartCheckout records a pending payment of credit for the account and
// begins the provider's hosted page; the holder pays at the returned URL.
func (s *Service) StartCheckout(ctx context.Context, accountID string, credit tollgate.Amount, saveCard bool) (tollgate.Payment, Checkout, error) {
	q, err := s.Quote(credit)
	if err != nil {
		return tollgate.Payment{}, Checkout{}, err
	}
	a, err := s.st.Account(ctx, accountID)
	if err != nil {
		return tollgate.Payment{}, Checkout{}, err
	}
	if a.Disabled {
		h, err := s.st.PaymentHold(ctx, accountID)
		if err != nil {
			return tollgate.Payment{}, Checkout{}, err
		}
		if !h.Held {
			// One the operator disabled would pay and get nothing
			// credited (docs/payments.md).
			return tollgate.Payment{}, Checkout{}, tollgate.Errorf(tollgate.CodeAccountDisabled, "the account is disabled")
		}
		if err := s.CheckOwed(h, credit); err != nil {
			return tollgate.Payment{}, Checkout{}, err
		}
	}
	now := s.now().UTC().Truncate(time.Microsecond)
	id := tollgate.NewOrderedID("pay_", now)
	co, err := s.p.CreateCheckout(ctx, CheckoutRequest{PaymentID: id, AccountID: accountID, Credit: q.Credit.String(),
		Fee: q.Fee.String(), AmountCents: q.AmountCents, Currency: q.Currency,
		Description: "tollgate credit: " + q.Credit.String() + " USD",
		SuccessURL:  expandURL(s.o.SuccessURL, id), CancelURL: expandURL(s.o.CancelURL, id),
		SaveCard: saveCard && s.o.AutoTopUp})
	if err != nil {
		return tollgate.Payment{}, Checkout{}, err
	}
	kind := tollgate.PaymentCheckout
	p := tollgate.Payment{ID: id, AccountID: accountID, Provider: s.p.Name(), Kind: kind, Status: tollgate.PaymentPending,
		CheckoutSession: co.SessionID, Credit: q.Credit, Fee: q.Fee, AmountCents: q.AmountCents, Currency: q.Currency,
		Created: now, Updated: now}
	if err := s.st.CreatePayment(ctx, p); err != nil {
		return p, co, err
	}
	return p, co, nil
}

// CheckOwed refuses a credit below OwedMin for an account that payments
// disabled for what it owes: the credit settles what is owed first, and a
// smaller one would leave the account disabled with its balance gone.
func (s *Service) CheckOwed(h tollgate.PaymentHold, credit tollgate.Amount) error {
	if least := s.OwedMin(h.Owed); h.Held && h.Owed > 0 && credit < least {
		return tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "amount",
			"the account owes %s USD: the amount must be at least %s USD", h.Owed, least)
	}
	return nil
}

// OwedMin is the least credit a checkout of an account that owes owed
// (and that payments disabled) may ask: what it owes rounded up to the
// cent, and at least Min; at most Max, so that a debt above Max is paid
// in several checkouts.
func (s *Service) OwedMin(owed tollgate.Amount) tollgate.Amount {
	least, err := tollgate.AmountFromCents(owed.CentsCeil())
	if err != nil {
		least = owed
	}
	least = max(least, s.o.Min)
	if s.o.Max > 0 {
		least = min(least, s.o.Max)
	}
	return least
}

// Recheck asks the provider for a checkout session's state and credits it
// if it is paid and was not credited (the operator's fix for a webhook
// that never came). It goes through the same checks as the webhook.
func (s *Service) Recheck(ctx context.Context, sessionID string) (tollgate.PaymentResult, error) {
	ses, err := s.p.Session(ctx, sessionID)
	if err != nil {
		return tollgate.PaymentResult{}, err
	}
	r, _, err := s.sessionPaid(ctx, &ses, time.Time{})
	if err == nil && s.o.Observer != nil {
		s.o.Observer.PaymentEvent(r.Outcome)
	}
	return r, err
}

// errRetry is an event to be delivered again later (its payment is not
// known yet): the webhook answers 409 and changes nothing.
var errRetry = errors.New("payments: the event's payment is not known yet; deliver it again later")

// Apply applies a verified event to the store and records it. An error
// means nothing was recorded and the provider should deliver it again.
func (s *Service) Apply(ctx context.Context, ev Event) (tollgate.PaymentEvent, error) {
	rec := tollgate.PaymentEvent{ID: ev.ID, Type: ev.Type, Provider: s.p.Name(), Outcome: tollgate.OutcomeIgnored}
	var r tollgate.PaymentResult
	var detail string
	var err error
	at := s.now()
	switch {
	case ev.Session != nil:
		rec.Object, rec.AccountID = ev.Session.ID, ev.Session.AccountID
		switch ev.Type {
		case EventSessionCompleted, EventSessionAsyncSucceeded:
			r, detail, err = s.sessionPaid(ctx, ev.Session, ev.Created)
		case EventSessionAsyncFailed, EventSessionExpired:
			r, err = s.st.FailPayment(ctx, ev.Session.ID, "the provider reports "+ev.Type, at)
			if errors.Is(err, tollgate.ErrNotFound) {
				r.Outcome, detail, err = tollgate.OutcomeUnmatched, "no payment has this checkout session", nil
			}
		}
	case ev.Intent != nil:
		rec.Object, rec.AccountID = ev.Intent.ID, ev.Intent.Metadata[MetaAccount]
		if ev.Intent.Metadata[MetaKind] != "auto_topup" {
			break // a Checkout Session's intent: the session's events credit it
		}
		switch ev.Type {
		case EventIntentSucceeded:
			r, detail, err = s.intentPaid(ctx, ev.Intent, ev.Created)
		case EventIntentFailed:
			r, err = s.st.FailPayment(ctx, firstOf(ev.Intent.Metadata[MetaPayment], ev.Intent.ID), "declined: "+ev.Intent.Failure, at)
			if errors.Is(err, tollgate.ErrNotFound) {
				r.Outcome, detail, err = tollgate.OutcomeUnmatched, "no payment has this payment intent", nil
				break
			}
			if err == nil && r.Payment.AccountID != "" {
				err = s.st.DisableAutoTopUp(ctx, r.Payment.AccountID,
					"Auto top-up was turned off: the card was declined ("+ev.Intent.Failure+").", at)
			}
		}
	case ev.Charge != nil:
		rec.Object = ev.Charge.ID
		if ev.Charge.PaymentIntent == "" {
			r.Outcome, detail = tollgate.OutcomeUnmatched, "the charge has no payment intent"
			break
		}
		r, err = s.st.RefundPayment(ctx, ev.Charge.PaymentIntent, ev.Charge.ID, ev.Charge.AmountRefunded, at)
		r, detail, err = s.unknownPayment(ev, r, err)
	case ev.Dispute != nil:
		rec.Object = ev.Dispute.ID
		if ev.Dispute.PaymentIntent == "" {
			r.Outcome, detail = tollgate.OutcomeUnmatched, "the dispute's charge has no payment intent"
			break
		}
		switch ev.Type {
		case EventDisputeCreated:
			r, err = s.st.DisputePayment(ctx, ev.Dispute.PaymentIntent, ev.Dispute.ID, ev.Dispute.Amount, at)
		case EventDisputeClosed:
			switch ev.Dispute.Status {
			case "won", "lost":
				r, err = s.st.CloseDispute(ctx, ev.Dispute.PaymentIntent, ev.Dispute.ID, ev.Dispute.Status == "won", at)
			default:
				r.Outcome, detail = tollgate.OutcomeNoChange, "closed as "+ev.Dispute.Status
			}
		}
		r, detail, err = s.unknownPayment(ev, r, err)
	}
	if err != nil {
		return rec, err
	}
	if r.Outcome != "" {
		rec.Outcome = r.Outcome
	}
	rec.PaymentID = r.Payment.ID
	if rec.AccountID == "" {
		rec.AccountID = r.Payment.AccountID
	}
	if detail == "" {
		detail = r.Payment.Note
	}
	rec.Detail = detail
	rec.First, rec.Last = at, at
	if err := s.st.RecordPaymentEvent(ctx, rec); err != nil {
		// The change (if any) is committed and idempotent: a redelivery
		// finds it done and records the event then.
		return rec, err
	}
	if s.o.Observer != nil {
		s.o.Observer.PaymentEvent(rec.Outcome)
	}
	if r.Disabled || r.Enabled {
		s.log.Warn("payments: account state changed", "account", r.Payment.AccountID, "disabled", r.Disabled, "enabled", r.Enabled,
			"owed", r.Owed.String(), "event", ev.ID, "type", ev.Type)
	}
	return rec, nil
}

// unknownPayment turns a refund or dispute of a payment not known yet into
// a retry (while the event is young) or an unmatched record.
func (s *Service) unknownPayment(ev Event, r tollgate.PaymentResult, err error) (tollgate.PaymentResult, string, error) {
	if !errors.Is(err, tollgate.ErrNotFound) {
		return r, "", err
	}
	if s.now().Sub(ev.Created) < s.o.DeferUnknown {
		return r, "", errRetry
	}
	r.Outcome = tollgate.OutcomeUnmatched
	return r, "no payment has this payment intent", nil
}

// sessionPaid checks a checkout session and credits it if it is paid and
// is what tollgate asked for.
// paid is when the provider announced the payment (zero: unknown).
func (s *Service) sessionPaid(ctx context.Context, ses *Session, paid time.Time) (tollgate.PaymentResult, string, error) {
	var r tollgate.PaymentResult
	c, outcome, detail := s.creditFrom(ses.AccountID, ses.Metadata, ses.AmountTotal, ses.Currency)
	if detail != "" {
		return s.mismatch(ctx, ses.ID, outcome, detail)
	}
	if ses.PaymentStatus != "paid" {
		r.Outcome = tollgate.OutcomeUnpaid
		return r, "payment_status " + ses.PaymentStatus, nil
	}
	c.CheckoutSession, c.PaymentIntent, c.Customer, c.Paid = ses.ID, ses.PaymentIntent, ses.Customer, paid
	c.Kind = tollgate.PaymentCheckout
	r, detail, err := s.credit(ctx, c)
	if err == nil && (r.Outcome == tollgate.OutcomeCredited || r.Outcome == tollgate.OutcomeAlreadyCredited) {
		// An error here is the webhook's: Stripe's retry saves the card.
		err = s.saveCard(ctx, r.Payment.AccountID, ses)
	}
	return r, detail, err
}

// intentPaid credits an auto top-up's payment intent.
func (s *Service) intentPaid(ctx context.Context, in *Intent, paid time.Time) (tollgate.PaymentResult, string, error) {
	c, outcome, detail := s.creditFrom(in.Metadata[MetaAccount], in.Metadata, in.AmountReceived, in.Currency)
	if detail != "" {
		return s.mismatch(ctx, in.ID, outcome, detail)
	}
	c.PaymentIntent, c.Customer, c.Charge, c.ReceiptURL, c.Paid = in.ID, in.Customer, in.Charge, in.ReceiptURL, paid
	c.Kind = tollgate.PaymentAutoTopUp
	return s.credit(ctx, c)
}

func (s *Service) credit(ctx context.Context, c tollgate.PaymentCredit) (tollgate.PaymentResult, string, error) {
	c.Provider, c.Time = s.p.Name(), s.now()
	if c.Paid.IsZero() {
		c.Paid = c.Time
	}
	r, err := s.st.CreditPayment(ctx, c)
	if err != nil {
		return r, "", err
	}
	if r.Outcome == tollgate.OutcomeCredited && s.o.Observer != nil {
		s.o.Observer.CreditLatency(r.Payment.Credited.Sub(r.Payment.Paid))
	}
	return r, "", nil
}

// creditFrom reads the credit a provider object carries (account, metadata
// credit and fee) and checks it against what was paid: currency usd and
// the amount equal to the credit plus the fee in cents. A non-empty detail
// says why it cannot be credited, and outcome how to record it.
func (s *Service) creditFrom(account string, meta map[string]string, paidCents int64, currency string) (c tollgate.PaymentCredit, outcome tollgate.PaymentOutcome, detail string) {
	c = tollgate.PaymentCredit{AccountID: account, ID: meta[MetaPayment], AmountCents: paidCents, Currency: currency}
	if account == "" {
		return c, tollgate.OutcomeUnmatched, "no account: client_reference_id is empty"
	}
	credit, err := tollgate.ParseAmount(meta[MetaCredit])
	if err != nil || credit <= 0 {
		return c, tollgate.OutcomeMismatch, fmt.Sprintf("metadata %s %q is not a positive decimal", MetaCredit, meta[MetaCredit])
	}
	var fee tollgate.Amount
	if f := meta[MetaFee]; f != "" {
		if fee, err = tollgate.ParseAmount(f); err != nil || fee < 0 {
			return c, tollgate.OutcomeMismatch, fmt.Sprintf("metadata %s %q is not a decimal", MetaFee, f)
		}
	}
	c.Credit, c.Fee = credit, fee
	if currency != "usd" {
		return c, tollgate.OutcomeMismatch, fmt.Sprintf("paid in %q, not usd", currency)
	}
	want, err := (credit + fee).Cents()
	if err != nil || want != paidCents {
		return c, tollgate.OutcomeMismatch, fmt.Sprintf("paid %d cents for a credit of %s USD and a fee of %s USD", paidCents, credit, fee)
	}
	return c, "", ""
}

// mismatch fails the payment (if tollgate knows it) and reports why.
func (s *Service) mismatch(ctx context.Context, providerID string, outcome tollgate.PaymentOutcome, detail string) (tollgate.PaymentResult, string, error) {
	r, err := s.st.FailPayment(ctx, providerID, detail, s.now())
	if err != nil && !errors.Is(err, tollgate.ErrNotFound) {
		return r, detail, err
	}
	r.Outcome = outcome
	return r, detail, nil
}

func expandURL(u, paymentID string) string { return strings.ReplaceAll(u, "{PAYMENT_ID}", paymentID) }

func firstOf(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
