// Package payments takes account holders' money through a payment provider
// and credits it to their balance exactly once (docs/payments.md). A
// Provider speaks to the provider's API and verifies its webhooks; the
// Service starts payments, applies the provider's events to the store
// (tollgate.PaymentStore, whose transactions make each credit happen once)
// and answers the webhook. Stripe is the provider tollgate ships.
package payments

import (
	"context"
	"errors"
	"time"
)

// Provider is a payment provider. The Stripe implementation is Stripe; a
// second provider implements the same calls.
type Provider interface {
	// Name is the provider's name as stored with its payments ("stripe").
	Name() string
	// CreateCheckout begins a hosted payment page for one credit.
	CreateCheckout(ctx context.Context, r CheckoutRequest) (Checkout, error)
	// Session returns a checkout session's state as the provider has it
	// now (the operator's re-check of a payment whose webhook never came).
	Session(ctx context.Context, id string) (Session, error)
	// ChargeSaved charges a saved payment method off-session and confirms
	// at once (auto top-up); IdempotencyKey makes a retry the same charge.
	ChargeSaved(ctx context.Context, r SavedChargeRequest) (Intent, error)
	// Intent returns a payment intent (its saved payment method, once a
	// checkout that saves the card is paid).
	Intent(ctx context.Context, id string) (Intent, error)
	// ParseWebhook verifies a webhook delivery (its raw body and
	// signature header) and returns its event; ErrBadSignature if it is
	// not the provider's, or too old.
	ParseWebhook(body []byte, signature string) (Event, error)
}

// ErrBadSignature is a webhook delivery that does not verify.
var ErrBadSignature = errors.New("payments: webhook signature does not verify")

// Metadata keys tollgate puts on what it creates at the provider, and reads
// back from its events.
const (
	MetaPayment = "tollgate_payment" // the tollgate payment id
	MetaAccount = "account_id"
	MetaCredit  = "credit_usd" // the credit as a decimal string
	MetaFee     = "fee_usd"    // the fee as a decimal string
	MetaKind    = "tollgate_kind"
)

// CheckoutRequest is one credit to pay on a hosted page.
type CheckoutRequest struct {
	PaymentID   string // tollgate's payment id, sent as metadata
	AccountID   string // client_reference_id
	Credit, Fee string // decimal USD strings (metadata)
	AmountCents int64  // credit + fee in cents: the one line item
	Currency    string // "usd"
	Description string // the line item's name
	SuccessURL  string
	CancelURL   string
	// SaveCard asks the provider to keep the card for off-session charges
	// (auto top-up); Customer is the provider's customer to keep it on
	// ("" lets the provider create one).
	SaveCard bool
	Customer string
}

// Checkout is a hosted payment page begun.
type Checkout struct {
	SessionID string
	URL       string // where the account holder pays
	Expires   time.Time
}

// SavedChargeRequest is an off-session charge of a saved card.
type SavedChargeRequest struct {
	IdempotencyKey string
	PaymentID      string
	AccountID      string
	Credit, Fee    string
	AmountCents    int64
	Currency       string
	Customer       string
	PaymentMethod  string
}

// Session is a checkout session as the provider reports it.
type Session struct {
	ID            string
	AccountID     string            // client_reference_id
	Metadata      map[string]string // MetaCredit, MetaFee, MetaPayment
	AmountTotal   int64             // cents
	Currency      string
	PaymentStatus string // paid, unpaid, no_payment_required
	PaymentIntent string
	Customer      string
}

// Intent is a payment intent as the provider reports it.
type Intent struct {
	ID             string
	Status         string // succeeded, requires_payment_method, ...
	Amount         int64  // cents
	AmountReceived int64
	Currency       string
	Customer       string
	Metadata       map[string]string
	Charge         string
	ReceiptURL     string
	Failure        string // the last payment error's message
	// PaymentMethod and SetupFutureUsage ("off_session" when the card is
	// saved for later charges).
	PaymentMethod    string
	SetupFutureUsage string
}

// Charge is a charge as the provider reports it.
type Charge struct {
	ID             string
	PaymentIntent  string
	Amount         int64
	AmountRefunded int64 // cumulative
	Currency       string
	ReceiptURL     string
}

// Dispute is a dispute as the provider reports it.
type Dispute struct {
	ID            string
	Charge        string
	PaymentIntent string
	Amount        int64
	Currency      string
	Status        string // warning_needs_response, needs_response, under_review, won, lost, ...
}

// Event is a verified webhook event, its object decoded by type.
type Event struct {
	ID      string
	Type    string
	Created time.Time
	// One of these, by Type ("" types tollgate does not act on).
	Session *Session
	Intent  *Intent
	Charge  *Charge
	Dispute *Dispute
}

// The event types tollgate acts on.
const (
	EventSessionCompleted      = "checkout.session.completed"
	EventSessionAsyncSucceeded = "checkout.session.async_payment_succeeded"
	EventSessionAsyncFailed    = "checkout.session.async_payment_failed"
	EventSessionExpired        = "checkout.session.expired"
	EventIntentSucceeded       = "payment_intent.succeeded"
	EventIntentFailed          = "payment_intent.payment_failed"
	EventChargeRefunded        = "charge.refunded"
	EventDisputeCreated        = "charge.dispute.created"
	EventDisputeClosed         = "charge.dispute.closed"
)

// EventTypes lists the event types to subscribe the webhook endpoint to.
var EventTypes = []string{EventSessionCompleted, EventSessionAsyncSucceeded, EventSessionAsyncFailed, EventSessionExpired,
	EventIntentSucceeded, EventIntentFailed, EventChargeRefunded, EventDisputeCreated, EventDisputeClosed}
