package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v82"
	"github.com/stripe/stripe-go/v82/webhook"
)

// StripeOptions configures the Stripe provider.
type StripeOptions struct {
	SecretKey     string // sk_live_... or sk_test_...
	WebhookSecret string // whsec_...: the endpoint's signing secret
	// APIURL is the API's base URL ("" for Stripe's own,
	// https://api.stripe.com); a test server (stripe-mock) or the
	// simulator otherwise.
	APIURL string
	// HTTPClient is the client for API calls (nil: one with a 30 s timeout).
	HTTPClient *http.Client
}

// WebhookTolerance is how old a webhook's signed timestamp may be: older
// deliveries are refused (a replay of a captured delivery).
const WebhookTolerance = 300 * time.Second

// Stripe is the Provider for Stripe, on its official Go library.
type Stripe struct {
	c      *stripe.Client
	secret string
}

var _ Provider = (*Stripe)(nil)

// NewStripe returns the Stripe provider.
func NewStripe(o StripeOptions) (*Stripe, error) {
	if !strings.HasPrefix(o.SecretKey, "sk_") && !strings.HasPrefix(o.SecretKey, "rk_") {
		return nil, errors.New("payments: the Stripe secret key must start with sk_ (or rk_ for a restricted key)")
	}
	if o.WebhookSecret == "" {
		return nil, errors.New("payments: the Stripe webhook signing secret is empty")
	}
	hc := o.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	cfg := &stripe.BackendConfig{HTTPClient: hc, LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull},
		MaxNetworkRetries: stripe.Int64(2)}
	if o.APIURL != "" {
		cfg.URL = stripe.String(strings.TrimRight(o.APIURL, "/"))
	}
	return &Stripe{c: stripe.NewClient(o.SecretKey, stripe.WithBackends(stripe.NewBackendsWithConfig(cfg))),
		secret: o.WebhookSecret}, nil
}

// Name is "stripe".
func (*Stripe) Name() string { return "stripe" }

// CreateCheckout creates a Checkout Session in payment mode: one line item
// of the credit plus the fee, the account as client_reference_id, the
// credit and fee as metadata (on the session and its payment intent), and
// the payment id as the idempotency key, so a retried call gets the same
// session.
func (s *Stripe) CreateCheckout(ctx context.Context, r CheckoutRequest) (Checkout, error) {
	meta := map[string]string{MetaPayment: r.PaymentID, MetaAccount: r.AccountID, MetaCredit: r.Credit, MetaFee: r.Fee}
	p := &stripe.CheckoutSessionCreateParams{
		Mode:              stripe.String("payment"),
		ClientReferenceID: stripe.String(r.AccountID),
		Metadata:          meta,
		LineItems: []*stripe.CheckoutSessionCreateLineItemParams{{
			Quantity: stripe.Int64(1),
			PriceData: &stripe.CheckoutSessionCreateLineItemPriceDataParams{
				Currency:    stripe.String(r.Currency),
				UnitAmount:  stripe.Int64(r.AmountCents),
				ProductData: &stripe.CheckoutSessionCreateLineItemPriceDataProductDataParams{Name: stripe.String(r.Description)},
			},
		}},
		SuccessURL:        stripe.String(r.SuccessURL),
		CancelURL:         stripe.String(r.CancelURL),
		PaymentIntentData: &stripe.CheckoutSessionCreatePaymentIntentDataParams{Metadata: meta},
	}
	if r.SaveCard {
		p.PaymentIntentData.SetupFutureUsage = stripe.String("off_session")
		if r.Customer != "" {
			p.Customer = stripe.String(r.Customer)
		} else {
			p.CustomerCreation = stripe.String("always")
		}
	}
	p.SetIdempotencyKey("tollgate-checkout-" + r.PaymentID)
	cs, err := s.c.V1CheckoutSessions.Create(ctx, p)
	if err != nil {
		return Checkout{}, fmt.Errorf("stripe: create checkout session: %w", err)
	}
	return Checkout{SessionID: cs.ID, URL: cs.URL, Expires: time.Unix(cs.ExpiresAt, 0).UTC()}, nil
}

// Session retrieves a Checkout Session.
func (s *Stripe) Session(ctx context.Context, id string) (Session, error) {
	cs, err := s.c.V1CheckoutSessions.Retrieve(ctx, id, nil)
	if err != nil {
		var se *stripe.Error
		if errors.As(err, &se) && se.HTTPStatusCode == http.StatusNotFound {
			return Session{}, fmt.Errorf("stripe: checkout session %s: %w", id, ErrNotFound)
		}
		return Session{}, fmt.Errorf("stripe: retrieve checkout session %s: %w", id, err)
	}
	return stripeSession(cs), nil
}

// ErrNotFound is an object the provider does not have.
var ErrNotFound = errors.New("payments: no such object at the provider")

// ErrDeclined is an off-session charge the card's bank refused.
var ErrDeclined = errors.New("payments: the card was declined")

// ChargeSaved creates and confirms an off-session PaymentIntent on a saved
// card, with an idempotency key. A declined card returns the intent (as far
// as Stripe reported it) and an error wrapping ErrDeclined.
func (s *Stripe) ChargeSaved(ctx context.Context, r SavedChargeRequest) (Intent, error) {
	p := &stripe.PaymentIntentCreateParams{
		Amount:        stripe.Int64(r.AmountCents),
		Currency:      stripe.String(r.Currency),
		Customer:      stripe.String(r.Customer),
		PaymentMethod: stripe.String(r.PaymentMethod),
		OffSession:    stripe.Bool(true),
		Confirm:       stripe.Bool(true),
		Metadata: map[string]string{MetaPayment: r.PaymentID, MetaAccount: r.AccountID, MetaCredit: r.Credit, MetaFee: r.Fee,
			MetaKind: "auto_topup"},
	}
	p.SetIdempotencyKey(r.IdempotencyKey)
	pi, err := s.c.V1PaymentIntents.Create(ctx, p)
	if err != nil {
		var se *stripe.Error
		if errors.As(err, &se) && se.Type == stripe.ErrorTypeCard {
			in := Intent{Failure: se.Msg}
			if se.PaymentIntent != nil {
				in = stripeIntent(se.PaymentIntent)
				in.Failure = se.Msg
			}
			return in, fmt.Errorf("%w: %s", ErrDeclined, se.Msg)
		}
		return Intent{}, fmt.Errorf("stripe: create payment intent: %w", err)
	}
	return stripeIntent(pi), nil
}

// Intent retrieves a PaymentIntent.
func (s *Stripe) Intent(ctx context.Context, id string) (Intent, error) {
	pi, err := s.c.V1PaymentIntents.Retrieve(ctx, id, nil)
	if err != nil {
		return Intent{}, fmt.Errorf("stripe: retrieve payment intent %s: %w", id, err)
	}
	return stripeIntent(pi), nil
}

// ParseWebhook verifies the Stripe-Signature header over the raw body (HMAC
// with the endpoint's secret, timestamp within WebhookTolerance) and
// decodes the event. Events of any API version are accepted: the fields
// tollgate reads have the same shape in every version since 2020, and
// refusing them would make Stripe retry every event of an endpoint set to
// another version for three days and then give up (docs/payments.md).
func (s *Stripe) ParseWebhook(body []byte, signature string) (Event, error) {
	ev, err := webhook.ConstructEventWithOptions(body, signature, s.secret,
		webhook.ConstructEventOptions{Tolerance: WebhookTolerance, IgnoreAPIVersionMismatch: true})
	if err != nil {
		return Event{}, fmt.Errorf("%w: %v", ErrBadSignature, err)
	}
	out := Event{ID: ev.ID, Type: string(ev.Type), Created: time.Unix(ev.Created, 0).UTC()}
	if ev.Data == nil {
		return out, fmt.Errorf("stripe: event %s has no data", ev.ID)
	}
	raw := ev.Data.Raw
	switch out.Type {
	case EventSessionCompleted, EventSessionAsyncSucceeded, EventSessionAsyncFailed, EventSessionExpired:
		var cs stripe.CheckoutSession
		err = json.Unmarshal(raw, &cs)
		ses := stripeSession(&cs)
		out.Session = &ses
	case EventIntentSucceeded, EventIntentFailed:
		var pi stripe.PaymentIntent
		err = json.Unmarshal(raw, &pi)
		in := stripeIntent(&pi)
		out.Intent = &in
	case EventChargeRefunded:
		var ch stripe.Charge
		err = json.Unmarshal(raw, &ch)
		out.Charge = &Charge{ID: ch.ID, Amount: ch.Amount, AmountRefunded: ch.AmountRefunded, Currency: string(ch.Currency),
			ReceiptURL: ch.ReceiptURL}
		if ch.PaymentIntent != nil {
			out.Charge.PaymentIntent = ch.PaymentIntent.ID
		}
	case EventDisputeCreated, EventDisputeClosed:
		var d stripe.Dispute
		err = json.Unmarshal(raw, &d)
		out.Dispute = &Dispute{ID: d.ID, Amount: d.Amount, Currency: string(d.Currency), Status: string(d.Status)}
		if d.Charge != nil {
			out.Dispute.Charge = d.Charge.ID
		}
		if d.PaymentIntent != nil {
			out.Dispute.PaymentIntent = d.PaymentIntent.ID
		}
	}
	if err != nil {
		return out, fmt.Errorf("stripe: event %s (%s): %w", ev.ID, out.Type, err)
	}
	return out, nil
}

func stripeSession(cs *stripe.CheckoutSession) Session {
	s := Session{ID: cs.ID, AccountID: cs.ClientReferenceID, Metadata: cs.Metadata, AmountTotal: cs.AmountTotal,
		Currency: string(cs.Currency), PaymentStatus: string(cs.PaymentStatus)}
	if cs.PaymentIntent != nil {
		s.PaymentIntent = cs.PaymentIntent.ID
	}
	if cs.Customer != nil {
		s.Customer = cs.Customer.ID
	}
	return s
}

func stripeIntent(pi *stripe.PaymentIntent) Intent {
	in := Intent{ID: pi.ID, Status: string(pi.Status), Amount: pi.Amount, AmountReceived: pi.AmountReceived,
		Currency: string(pi.Currency), Metadata: pi.Metadata}
	if pi.Customer != nil {
		in.Customer = pi.Customer.ID
	}
	if pi.LatestCharge != nil {
		in.Charge, in.ReceiptURL = pi.LatestCharge.ID, pi.LatestCharge.ReceiptURL
	}
	if pi.LastPaymentError != nil {
		in.Failure = pi.LastPaymentError.Msg
	}
	if pi.PaymentMethod != nil {
		in.PaymentMethod = pi.PaymentMethod.ID
	}
	in.SetupFutureUsage = string(pi.SetupFutureUsage)
	return in
}
