package tollgate

import (
	"context"
	"fmt"
	"math/big"
	"time"
)

// Payments: money an account holder pays through a payment provider
// (docs/payments.md). A payment is credited exactly once: its credit is a
// ledger row whose id is derived from the payment (PaymentCreditEntryID),
// written in the same transaction as the payment's change of status, so a
// second credit of the same payment fails at the store's unique index.

// The ledger kinds of payments (docs/payments.md, "The ledger").
const (
	// LedgerPayment is the credit of a paid payment (+ the credit, not the fee).
	LedgerPayment LedgerKind = "payment"
	// LedgerRefund takes back the refunded part of a payment's credit (−).
	LedgerRefund LedgerKind = "refund"
	// LedgerDispute takes back the disputed part of a payment's credit (−).
	LedgerDispute LedgerKind = "dispute"
	// LedgerDisputeWon gives back what a dispute took, once it is won (+).
	LedgerDisputeWon LedgerKind = "dispute_won"
	// LedgerOwedSettled takes an owed amount from the balance (−) when
	// money comes in (a payment, a dispute won) or the operator collects it.
	LedgerOwedSettled LedgerKind = "owed_settled"
)

// A refund or dispute row (LedgerRefund, LedgerDispute) takes at most the
// free balance: its Amount is −(taken) and its Uncollected is what could not
// be taken, which the account owes. An owed_settled row has Uncollected =
// Amount (negative: it reduces what is owed). So an account's owed amount is
// the sum of Uncollected over those three kinds, which the audit checks.

// PaymentStatus is where a payment stands.
type PaymentStatus string

const (
	PaymentPending  PaymentStatus = "pending"  // created, not paid (yet)
	PaymentCredited PaymentStatus = "credited" // paid and credited
	PaymentFailed   PaymentStatus = "failed"   // not paid, or not creditable (see Note)
	PaymentRefunded PaymentStatus = "refunded" // credited, then refunded in part or in full
	PaymentDisputed PaymentStatus = "disputed" // credited, then disputed (open or lost)
)

// PaymentKind says how a payment was started.
type PaymentKind string

const (
	PaymentCheckout  PaymentKind = "checkout"   // a Checkout page the holder paid on
	PaymentAutoTopUp PaymentKind = "auto_topup" // charged off-session to a saved card
)

// Payment is one payment an account holder made (or began).
type Payment struct {
	ID        string        `json:"id"` // "pay_..."
	AccountID string        `json:"account_id"`
	Provider  string        `json:"provider"` // "stripe"
	Kind      PaymentKind   `json:"kind"`
	Status    PaymentStatus `json:"status"`
	// The provider's ids ("" until known).
	CheckoutSession string `json:"checkout_session,omitzero"`
	PaymentIntent   string `json:"payment_intent,omitzero"`
	Charge          string `json:"charge,omitzero"`
	Customer        string `json:"customer,omitzero"`
	// Credit is what the balance receives; Fee what the operator charges on
	// top; AmountCents = cents(Credit + Fee) is what the card pays.
	Credit      Amount `json:"credit"`
	Fee         Amount `json:"fee"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	ReceiptURL  string `json:"receipt_url,omitzero"`
	// RefundedCents is the provider's cumulative refunded amount; Refunded
	// the part of the credit taken back for it.
	RefundedCents int64  `json:"refunded_cents,omitzero"`
	Refunded      Amount `json:"refunded,omitzero"`
	// The dispute, if any: its id, status (open, won, lost), the cents
	// disputed and the part of the credit taken back for it.
	Dispute       string    `json:"dispute,omitzero"`
	DisputeStatus string    `json:"dispute_status,omitzero"`
	DisputedCents int64     `json:"disputed_cents,omitzero"`
	Disputed      Amount    `json:"disputed,omitzero"`
	Note          string    `json:"note,omitzero"` // why it failed, or what the operator should know
	Created       time.Time `json:"created"`
	// Paid is when the provider says it was paid; Credited when the ledger
	// received it (their difference is the credit latency).
	Paid     time.Time `json:"paid,omitzero"`
	Credited time.Time `json:"credited,omitzero"`
	Updated  time.Time `json:"updated"`
}

// PaymentCreditEntryID is the id of the ledger row that credits payment id:
// one per payment, so the ledger's unique id makes a second credit fail.
func PaymentCreditEntryID(paymentID string) string { return "le_pay_" + paymentID }

// PaymentCredit is what a provider says about a paid payment.
type PaymentCredit struct {
	// Which payment: by CheckoutSession if set, else by PaymentIntent.
	CheckoutSession string
	PaymentIntent   string
	// Used to record the payment when the store does not know it yet (a
	// session created by an instance whose record was lost, a re-check).
	ID          string // for a new record; the store assigns one if ""
	AccountID   string
	Kind        PaymentKind
	Provider    string
	Credit      Amount
	Fee         Amount
	AmountCents int64
	Currency    string
	// Filled in on the stored record.
	Charge     string
	Customer   string
	ReceiptURL string
	Paid       time.Time
	Time       time.Time // now
}

// PaymentOutcome is what a store did with a payment event.
type PaymentOutcome string

const (
	OutcomeCredited        PaymentOutcome = "credited"         // the credit was written now
	OutcomeAlreadyCredited PaymentOutcome = "already_credited" // it had been: nothing changed
	OutcomeNoAccount       PaymentOutcome = "unknown_account"  // nothing credited
	OutcomeAccountDisabled PaymentOutcome = "account_disabled" // by the operator: nothing credited
	OutcomeMismatch        PaymentOutcome = "mismatch"         // the payment is not what was asked
	OutcomeUnpaid          PaymentOutcome = "unpaid"           // not paid (yet)
	OutcomeFailed          PaymentOutcome = "failed"           // marked failed
	OutcomeDebited         PaymentOutcome = "debited"          // a refund or dispute took its part
	OutcomeReversed        PaymentOutcome = "reversed"         // a won dispute gave back its part
	OutcomeNoChange        PaymentOutcome = "no_change"        // seen before, or nothing to do
	OutcomeUnmatched       PaymentOutcome = "unmatched"        // no payment tollgate knows
	OutcomeIgnored         PaymentOutcome = "ignored"          // an event type tollgate does not act on
)

// PaymentResult is what a store's payment operation did.
type PaymentResult struct {
	Outcome PaymentOutcome
	Payment Payment
	// Ledger rows written (credit, refund, dispute, owed settled...).
	Entries []LedgerEntry
	// Owed is what the account owes after the operation.
	Owed Amount
	// Disabled/Enabled: the account was disabled (owed or disputed) or
	// enabled again (settled, dispute won) by this operation.
	Disabled, Enabled bool
}

// PaymentEvent is a provider's event as tollgate received it, kept for the
// operator: every event whose outcome is not a plain success, and the others.
type PaymentEvent struct {
	ID         string         `json:"id"` // the provider's event id
	Type       string         `json:"type"`
	Provider   string         `json:"provider"`
	Object     string         `json:"object,omitzero"` // the session, intent, charge or dispute id
	AccountID  string         `json:"account_id,omitzero"`
	PaymentID  string         `json:"payment_id,omitzero"`
	Outcome    PaymentOutcome `json:"outcome"`
	Detail     string         `json:"detail,omitzero"`
	Deliveries int64          `json:"deliveries"`
	First      time.Time      `json:"first"` // first received
	Last       time.Time      `json:"last"`  // last received
}

// Problem reports whether an event's outcome is one the
// operator should look at.
func (o PaymentOutcome) Problem() bool {
	switch o {
	case OutcomeNoAccount, OutcomeAccountDisabled, OutcomeMismatch, OutcomeUnmatched, OutcomeFailed:
		return true
	}
	return false
}

// Owed is what an account owes after refunds or disputes that its balance
// could not cover.
type Owed struct {
	AccountID string `json:"account_id"`
	Owed      Amount `json:"owed"`
	Disabled  bool   `json:"disabled"`
}

// PaymentHold is what keeps an account disabled by payments (not by the
// operator): Held while it is, Owed what it owes (refunds and disputes its
// free balance could not cover), and Disputes how many of its payments
// have a dispute open or lost, which keep it disabled once nothing is owed.
type PaymentHold struct {
	Held     bool
	Owed     Amount
	Disputes int64
}

// AutoTopUp is an account's automatic top-up: when its free balance falls
// below Threshold, its saved card is charged off-session for Amount.
type AutoTopUp struct {
	AccountID string `json:"account_id"`
	Enabled   bool   `json:"enabled"`
	Threshold Amount `json:"threshold"`
	Amount    Amount `json:"amount"`
	// The saved card at the provider ("" until a checkout saved one).
	Customer      string `json:"customer,omitzero"`
	PaymentMethod string `json:"payment_method,omitzero"`
	// InFlight is the payment of the top-up running, "" if none;
	// ClaimedUntil when its claim lapses (a crashed instance's).
	InFlight     string    `json:"in_flight,omitzero"`
	ClaimedUntil time.Time `json:"claimed_until,omitzero"`
	// Notice says why it was turned off (a declined card), for the holder.
	Notice  string    `json:"notice,omitzero"`
	Updated time.Time `json:"updated"`
}

// AutoTopUpStore keeps auto top-ups; at most one top-up per account is in
// flight, whatever the number of instances.
type AutoTopUpStore interface {
	// AutoTopUp returns an account's settings; ErrNotFound if it never had any.
	AutoTopUp(ctx context.Context, accountID string) (AutoTopUp, error)
	// SetAutoTopUp sets Enabled, Threshold and Amount (enabling clears the
	// notice); the saved card is kept.
	SetAutoTopUp(ctx context.Context, a AutoTopUp) error
	// SaveCard keeps the card a checkout saved for the account.
	SaveCard(ctx context.Context, accountID, customer, paymentMethod string, at time.Time) error
	// DueTopUps lists the enabled top-ups with a saved card whose account
	// (not disabled) has a free balance below the threshold and none in
	// flight (or a lapsed claim).
	DueTopUps(ctx context.Context, now time.Time) ([]AutoTopUp, error)
	// ClaimTopUp records p (a pending auto top-up payment) as the account's
	// top-up in flight until until, if none is in flight (or its claim
	// lapsed at now); false if another claim holds.
	ClaimTopUp(ctx context.Context, p Payment, until, now time.Time) (bool, error)
	// DisableAutoTopUp turns an account's top-up off with a notice.
	DisableAutoTopUp(ctx context.Context, accountID, notice string, at time.Time) error
}

// PaymentStore keeps payments and applies the provider's events to the
// books, each in one transaction with its ledger rows.
type PaymentStore interface {
	// CreatePayment records a payment tollgate began (status pending).
	// A conflict if its id or provider ids exist.
	CreatePayment(ctx context.Context, p Payment) error
	// Payment returns one payment by id; ErrNotFound.
	Payment(ctx context.Context, id string) (Payment, error)
	// PaymentByProviderID finds a payment by its checkout session or
	// payment intent id; ErrNotFound.
	PaymentByProviderID(ctx context.Context, id string) (Payment, error)
	// Payments lists an account's payments (all accounts when ""), newest first.
	Payments(ctx context.Context, accountID string, limit int) ([]Payment, error)
	// CreditPayment credits a paid payment exactly once, recording it if
	// the store does not know it; then applies any refund or dispute that
	// arrived before it and settles what the account owes.
	CreditPayment(ctx context.Context, c PaymentCredit) (PaymentResult, error)
	// FailPayment marks a payment that is not credited as failed, with a note.
	FailPayment(ctx context.Context, providerID, note string, at time.Time) (PaymentResult, error)
	// RefundPayment records the provider's cumulative refunded cents of the
	// payment with intent (or session) providerID and takes the refunded
	// part of the credit. ErrNotFound if no payment has that id.
	RefundPayment(ctx context.Context, providerID, charge string, refundedCents int64, at time.Time) (PaymentResult, error)
	// DisputePayment records a dispute and takes the disputed part of the
	// credit; the account is disabled until the dispute is won.
	DisputePayment(ctx context.Context, providerID, dispute string, cents int64, at time.Time) (PaymentResult, error)
	// CloseDispute records a dispute's end: won gives back what it took.
	CloseDispute(ctx context.Context, providerID, dispute string, won bool, at time.Time) (PaymentResult, error)
	// RecordPaymentEvent keeps an event (a redelivery adds to Deliveries
	// and keeps the latest outcome).
	RecordPaymentEvent(ctx context.Context, e PaymentEvent) error
	// PaymentEvents lists kept events, newest first; problems only if asked.
	PaymentEvents(ctx context.Context, problemsOnly bool, limit int) ([]PaymentEvent, error)
	// OwedAmounts lists the accounts that owe something.
	OwedAmounts(ctx context.Context) ([]Owed, error)
	// PaymentHold reads what keeps an account disabled by payments;
	// ErrNotFound if there is no such account.
	PaymentHold(ctx context.Context, accountID string) (PaymentHold, error)
	// CollectOwed takes what an account owes from its free balance, as far
	// as it goes, and enables the account if nothing is owed or disputed.
	CollectOwed(ctx context.Context, accountID string, at time.Time) (PaymentResult, error)
	AutoTopUpStore
}

// centsScale is picodollars per cent.
const centsScale = picoPerDollar / 100

// AmountFromCents returns c cents as an Amount (exact), or ErrMoneyOverflow.
func AmountFromCents(c int64) (Amount, error) { return Amount(c).mulInt(centsScale) }

// Cents returns a as a whole number of cents; an error if a has a fraction
// of a cent (never rounded).
func (a Amount) Cents() (int64, error) {
	if a%centsScale != 0 {
		return 0, fmt.Errorf("money: %s USD is not a whole number of cents", a)
	}
	return int64(a / centsScale), nil
}

// CentsCeil returns a in cents, rounded up to the cent (a >= 0).
func (a Amount) CentsCeil() int64 {
	c := int64(a / centsScale)
	if a%centsScale > 0 {
		c++
	}
	return c
}

// ProRata returns whole × part / total rounded half up to the picodollar,
// and exactly whole when part >= total: the share of a credit that part
// cents of a payment of total cents stand for.
func ProRata(whole Amount, part, total int64) Amount {
	if part <= 0 || total <= 0 || whole <= 0 {
		return 0
	}
	if part >= total {
		return whole
	}
	n := new(big.Int).Mul(big.NewInt(int64(whole)), big.NewInt(part))
	n.Mul(n, big.NewInt(2))
	n.Add(n, big.NewInt(total))
	n.Quo(n, big.NewInt(2*total))
	return Amount(n.Int64())
}

// MulDivCeil returns a × b / d rounded up (a, b >= 0, d > 0): a share of
// an amount at an exact rate, never less than its exact value.
func MulDivCeil(a, b, d Amount) Amount {
	if a <= 0 || b <= 0 || d <= 0 {
		return 0
	}
	n := new(big.Int).Mul(big.NewInt(int64(a)), big.NewInt(int64(b)))
	q, m := new(big.Int).QuoRem(n, big.NewInt(int64(d)), new(big.Int))
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	return Amount(q.Int64())
}
