package payments

import (
	"context"
	"errors"
	"time"

	"github.com/tollgate/tollgate"
)

// TopUpClaim is how long a top-up's claim holds before another instance
// may take the account's top-up over (its instance crashed mid-charge).
// Long, so that a live charge is never doubled; the payment's credit or
// failure ends the claim at once.
const TopUpClaim = time.Hour

// RunAutoTopUps charges the saved cards of the accounts whose free balance
// fell below their threshold, every interval, until ctx ends.
func (s *Service) RunAutoTopUps(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := s.TopUpOnce(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("payments: auto top-up", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// TopUpOnce runs the top-ups due now and returns the payments it started.
// Each account's top-up is claimed in the store first, so that of several
// instances (or calls) at most one charges it.
func (s *Service) TopUpOnce(ctx context.Context) ([]tollgate.Payment, error) {
	now := s.now().UTC().Truncate(time.Microsecond)
	due, err := s.st.DueTopUps(ctx, now)
	if err != nil {
		return nil, err
	}
	var started []tollgate.Payment
	for _, a := range due {
		q, err := s.Quote(a.Amount)
		if err != nil {
			if err := s.st.DisableAutoTopUp(ctx, a.AccountID, "Auto top-up was turned off: "+err.Error(), now); err != nil {
				return started, err
			}
			continue
		}
		p := tollgate.Payment{ID: tollgate.NewOrderedID("pay_", now), AccountID: a.AccountID, Provider: s.p.Name(),
			Kind: tollgate.PaymentAutoTopUp, Status: tollgate.PaymentPending, Customer: a.Customer, Credit: q.Credit, Fee: q.Fee,
			AmountCents: q.AmountCents, Currency: q.Currency, Created: now, Updated: now}
		ok, err := s.st.ClaimTopUp(ctx, p, now.Add(TopUpClaim), now)
		if err != nil {
			return started, err
		}
		if !ok {
			continue // another instance has it
		}
		started = append(started, p)
		if err := s.charge(ctx, a, p); err != nil {
			return started, err
		}
	}
	return started, nil
}

// charge charges a claimed top-up. A declined card fails the payment and
// turns the account's top-up off with a notice; any other error fails the
// payment (the next due top-up is a new one). A charge that succeeded at
// once is credited now; otherwise payment_intent.succeeded credits it.
func (s *Service) charge(ctx context.Context, a tollgate.AutoTopUp, p tollgate.Payment) error {
	in, err := s.p.ChargeSaved(ctx, SavedChargeRequest{IdempotencyKey: "tollgate-topup-" + p.ID, PaymentID: p.ID,
		AccountID: p.AccountID, Credit: p.Credit.String(), Fee: p.Fee.String(), AmountCents: p.AmountCents, Currency: p.Currency,
		Customer: a.Customer, PaymentMethod: a.PaymentMethod})
	now := s.now()
	if errors.Is(err, ErrDeclined) {
		s.log.Warn("payments: auto top-up declined; turned off", "account", p.AccountID, "payment", p.ID, "err", err)
		if _, ferr := s.st.FailPayment(ctx, p.ID, "the card was declined: "+in.Failure, now); ferr != nil {
			return ferr
		}
		if s.o.Observer != nil {
			s.o.Observer.PaymentEvent(tollgate.OutcomeFailed)
		}
		return s.st.DisableAutoTopUp(ctx, p.AccountID, "Auto top-up was turned off: the card was declined ("+in.Failure+").", now)
	}
	if err != nil {
		s.log.Error("payments: auto top-up could not be charged", "account", p.AccountID, "payment", p.ID, "err", err)
		_, ferr := s.st.FailPayment(ctx, p.ID, "could not be charged: "+err.Error(), now)
		return ferr
	}
	if in.Status != "succeeded" {
		return nil
	}
	r, _, err := s.intentPaid(ctx, &in, now)
	if err == nil && s.o.Observer != nil {
		s.o.Observer.PaymentEvent(r.Outcome)
	}
	return err
}

// saveCard keeps the card of a paid checkout that saved it (its intent's
// setup_future_usage is off_session) for the account's auto top-ups.
func (s *Service) saveCard(ctx context.Context, account string, ses *Session) error {
	if !s.o.AutoTopUp || ses.Customer == "" || ses.PaymentIntent == "" {
		return nil
	}
	in, err := s.p.Intent(ctx, ses.PaymentIntent)
	if err != nil {
		return err
	}
	if in.SetupFutureUsage != "off_session" || in.PaymentMethod == "" {
		return nil
	}
	return s.st.SaveCard(ctx, account, ses.Customer, in.PaymentMethod, s.now())
}
