// Package paystore is the payments part of the stores (tollgate.PaymentStore),
// written once over a small transaction interface that the SQLite and the
// PostgreSQL stores adapt: the rules that keep a payment credited exactly
// once and the books exact are the same in both, so they are stated once.
//
// Queries use `?` placeholders and may end in FOR UPDATE; an adapter
// rewrites them for its database (numbered placeholders for PostgreSQL, no
// row lock for SQLite, whose write transactions are serial). Time arguments
// are time.Time (nil for NULL), which an adapter converts to its column
// type; scans of times go through Time.
//
// Lock order: the payment's row, then its account's row. The billing
// operations lock the account alone, so no two transactions wait on each
// other in a cycle.
package paystore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tollgate/tollgate"
)

// Tx is one transaction (or, for reads, a connection) of a store.
type Tx interface {
	Exec(q string, args ...any) (int64, error)
	QueryRow(q string, args ...any) Row
	Query(q string, args ...any) (Rows, error)
	// IsUnique reports a unique constraint's violation.
	IsUnique(err error) bool
}

// Row is one result row; Scan returns ErrNoRows when there is none.
type Row interface{ Scan(dest ...any) error }

// Rows are result rows.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// ErrNoRows is what an adapter's Row.Scan returns when the query had no row.
var ErrNoRows = errors.New("paystore: no rows")

// Time scans a time column: unix microseconds (SQLite), a time.Time
// (PostgreSQL) or NULL (the zero time).
type Time struct{ T *time.Time }

// Scan implements sql.Scanner.
func (t Time) Scan(v any) error {
	switch x := v.(type) {
	case nil:
		*t.T = time.Time{}
	case int64:
		*t.T = time.UnixMicro(x).UTC()
	case time.Time:
		*t.T = x.UTC()
	default:
		return fmt.Errorf("paystore: cannot scan %T into a time", v)
	}
	return nil
}

var _ interface{ Scan(any) error } = Time{}

// NullTime is t as a query argument: nil for the zero time.
func NullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC()
}

const paymentColumns = `id, account_id, provider, kind, status, coalesce(checkout_session, ''), coalesce(payment_intent, ''),
	charge, customer, credit, fee, amount_cents, currency, receipt_url, refunded_cents, refunded, dispute, dispute_status,
	disputed_cents, disputed, note, created, paid, credited, updated, credit_entry IS NOT NULL`

// payment is a stored payment and whether its credit was written.
type payment struct {
	tollgate.Payment
	credited bool
}

func scanPayment(r Row) (payment, error) {
	var p payment
	var kind, status string
	var credit, fee, refunded, disputed int64
	err := r.Scan(&p.ID, &p.AccountID, &p.Provider, &kind, &status, &p.CheckoutSession, &p.PaymentIntent,
		&p.Charge, &p.Customer, &credit, &fee, &p.AmountCents, &p.Currency, &p.ReceiptURL, &p.RefundedCents, &refunded,
		&p.Dispute, &p.DisputeStatus, &p.DisputedCents, &disputed, &p.Note,
		Time{&p.Created}, Time{&p.Paid}, Time{&p.Credited}, Time{&p.Updated}, &p.credited)
	p.Kind, p.Status = tollgate.PaymentKind(kind), tollgate.PaymentStatus(status)
	p.Credit, p.Fee, p.Refunded, p.Disputed = tollgate.Amount(credit), tollgate.Amount(fee), tollgate.Amount(refunded), tollgate.Amount(disputed)
	return p, err
}

// CreatePayment inserts a pending payment.
func CreatePayment(tx Tx, p tollgate.Payment) error {
	if p.ID == "" || p.AccountID == "" || p.Created.IsZero() || p.Credit <= 0 || p.AmountCents <= 0 {
		return errors.New("create payment: ID, AccountID, Created, Credit and AmountCents are required")
	}
	if p.Status == "" {
		p.Status = tollgate.PaymentPending
	}
	if p.Updated.IsZero() {
		p.Updated = p.Created
	}
	_, err := tx.Exec(`INSERT INTO payments (id, account_id, provider, kind, status, checkout_session, payment_intent, charge,
		customer, credit, fee, amount_cents, currency, receipt_url, note, created, updated)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		p.ID, p.AccountID, p.Provider, string(p.Kind), string(p.Status), nullString(p.CheckoutSession), nullString(p.PaymentIntent),
		p.Charge, p.Customer, int64(p.Credit), int64(p.Fee), p.AmountCents, p.Currency, p.ReceiptURL, p.Note, p.Created.UTC(), p.Updated.UTC())
	if tx.IsUnique(err) {
		return &tollgate.Error{Code: tollgate.CodeConflict, Message: "payment " + p.ID + " already exists", Err: err}
	}
	return err
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// Get returns a payment by its id or one of its provider ids.
func Get(tx Tx, id string) (tollgate.Payment, error) {
	p, err := find(tx, id, false)
	return p.Payment, err
}

func find(tx Tx, id string, lock bool) (payment, error) {
	q := `SELECT ` + paymentColumns + ` FROM payments WHERE id = ? OR checkout_session = ? OR payment_intent = ?`
	if lock {
		q += ` FOR UPDATE`
	}
	p, err := scanPayment(tx.QueryRow(q, id, id, id))
	if errors.Is(err, ErrNoRows) {
		return p, fmt.Errorf("payment %s: %w", id, tollgate.ErrNotFound)
	}
	return p, err
}

// List returns an account's payments (every account's when ""), newest first.
func List(tx Tx, accountID string, limit int) ([]tollgate.Payment, error) {
	if limit <= 0 {
		limit = 1000
	}
	q := `SELECT ` + paymentColumns + ` FROM payments`
	args := []any{}
	if accountID != "" {
		q += ` WHERE account_id = ?`
		args = append(args, accountID)
	}
	rows, err := tx.Query(q+` ORDER BY created DESC, id DESC LIMIT ?`, append(args, limit)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []tollgate.Payment{}
	for rows.Next() {
		p, err := scanPayment(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, p.Payment)
	}
	return out, rows.Err()
}

// account is an account's row as a payment operation sees it, locked.
type account struct {
	id                          string
	balance, held, owed         tollgate.Amount
	disabled, paymentHold, seen bool
}

func lockAccount(tx Tx, id string) (*account, error) {
	a := &account{id: id}
	var balance, held, owed int64
	err := tx.QueryRow(`SELECT balance, held, owed, disabled, payment_hold FROM accounts WHERE id = ? FOR UPDATE`, id).
		Scan(&balance, &held, &owed, &a.disabled, &a.paymentHold)
	if errors.Is(err, ErrNoRows) {
		return nil, fmt.Errorf("account %s: %w", id, tollgate.ErrNotFound)
	}
	a.balance, a.held, a.owed = tollgate.Amount(balance), tollgate.Amount(held), tollgate.Amount(owed)
	return a, err
}

// op is one payment operation in its transaction: the result it builds.
type op struct {
	tx  Tx
	at  time.Time
	res tollgate.PaymentResult
}

func (o *op) ledger(kind tollgate.LedgerKind, id string, a *account, amount, cost, uncollected tollgate.Amount, note string) error {
	e := tollgate.LedgerEntry{ID: id, Kind: kind, AccountID: a.id, Amount: amount, Note: note, Time: o.at, Uncollected: uncollected}
	err := o.tx.QueryRow(`INSERT INTO ledger (id, kind, account_id, amount, note, time, cost, uncollected)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING seq`,
		id, string(kind), a.id, int64(amount), note, o.at, int64(cost), int64(uncollected)).Scan(&e.Seq)
	if err != nil {
		if o.tx.IsUnique(err) {
			return &tollgate.Error{Code: tollgate.CodeConflict, Message: "ledger entry " + id + " already exists", Err: err}
		}
		return err
	}
	if _, err := o.tx.Exec(`UPDATE accounts SET balance = balance + ?, owed = owed + ? WHERE id = ?`,
		int64(amount), int64(uncollected), a.id); err != nil {
		return err
	}
	a.balance += amount
	a.owed += uncollected
	o.res.Entries = append(o.res.Entries, e)
	return nil
}

// debit takes want from the account's free balance as far as it goes; the
// rest is owed, and an account that owes is disabled.
func (o *op) debit(kind tollgate.LedgerKind, id string, a *account, want tollgate.Amount, note string) error {
	if want <= 0 {
		return nil
	}
	take := min(want, max(a.balance-a.held, 0))
	if err := o.ledger(kind, id, a, -take, want, want-take, note); err != nil {
		return err
	}
	if a.owed > 0 {
		return o.disable(a)
	}
	return nil
}

// settleOwed takes what the account owes from its free balance, as far as
// it goes, under ledger id.
func (o *op) settleOwed(id string, a *account) error {
	take := min(a.owed, max(a.balance-a.held, 0))
	if take <= 0 {
		return nil
	}
	return o.ledger(tollgate.LedgerOwedSettled, id, a, -take, 0, -take, "owed amount settled")
}

func (o *op) disable(a *account) error {
	if a.disabled {
		return nil
	}
	if _, err := o.tx.Exec(`UPDATE accounts SET disabled = true, payment_hold = true WHERE id = ?`, a.id); err != nil {
		return err
	}
	a.disabled, a.paymentHold, o.res.Disabled = true, true, true
	return bumpAuth(o.tx)
}

// holdingDisputes, followed by an account id (a placeholder or a column),
// counts the disputes that keep that account disabled by payments: those
// open or lost. maybeEnable decides by it and Hold reports it, so both must
// read the same ones.
const holdingDisputes = `SELECT count(*) FROM payments WHERE dispute_status IN ('open', 'lost') AND account_id = `

// maybeEnable enables an account that payments disabled once it owes
// nothing and has no dispute open or lost.
func (o *op) maybeEnable(a *account) error {
	if !a.paymentHold || a.owed > 0 {
		return nil
	}
	var n int64
	if err := o.tx.QueryRow(holdingDisputes+`?`, a.id).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	if _, err := o.tx.Exec(`UPDATE accounts SET disabled = false, payment_hold = false WHERE id = ?`, a.id); err != nil {
		return err
	}
	a.disabled, a.paymentHold, o.res.Enabled = false, false, true
	return bumpAuth(o.tx)
}

func bumpAuth(tx Tx) error {
	_, err := tx.Exec(`UPDATE auth_version SET version = version + 1 WHERE id = 1`)
	return err
}

func (o *op) finish(p payment, a *account) (tollgate.PaymentResult, error) {
	o.res.Payment = p.Payment
	if a != nil {
		o.res.Owed = a.owed
	}
	return o.res, nil
}

func (o *op) setPayment(p *payment, set string, args ...any) error {
	_, err := o.tx.Exec(`UPDATE payments SET `+set+`, updated = ? WHERE id = ?`, append(args, o.at, p.ID)...)
	p.Updated = o.at
	return err
}

// Credit credits a paid payment exactly once (tollgate.PaymentStore.CreditPayment).
func Credit(tx Tx, c tollgate.PaymentCredit) (tollgate.PaymentResult, error) {
	o := &op{tx: tx, at: c.Time.UTC().Truncate(time.Microsecond)}
	key := c.CheckoutSession
	if key == "" {
		key = c.PaymentIntent
	}
	if key == "" {
		return o.res, errors.New("credit payment: a checkout session or payment intent id is required")
	}
	p, err := find(tx, key, true)
	if errors.Is(err, tollgate.ErrNotFound) && c.ID != "" && c.CheckoutSession == "" {
		// An auto top-up's payment, recorded before its intent existed:
		// found by the id its intent's metadata carries.
		if q, qerr := find(tx, c.ID, true); qerr == nil && q.PaymentIntent == "" && q.CheckoutSession == "" {
			p, err = q, nil
		}
	}
	if errors.Is(err, tollgate.ErrNotFound) {
		if p, err = o.record(c); err != nil || o.res.Outcome != "" {
			return o.res, err
		}
	} else if err != nil {
		return o.res, err
	}
	if p.credited {
		o.res.Outcome = tollgate.OutcomeAlreadyCredited
		return o.finish(p, nil)
	}
	if c.Credit != p.Credit || c.AmountCents != p.AmountCents || c.Currency != p.Currency || (c.AccountID != "" && c.AccountID != p.AccountID) {
		note := fmt.Sprintf("paid %d %s cents for a credit of %s USD on %s; tollgate asked %d %s cents for %s USD on %s",
			c.AmountCents, c.Currency, c.Credit, c.AccountID, p.AmountCents, p.Currency, p.Credit, p.AccountID)
		return o.fail(p, tollgate.OutcomeMismatch, note)
	}
	a, err := lockAccount(tx, p.AccountID)
	if err != nil {
		return o.res, err
	}
	if a.disabled && !a.paymentHold {
		return o.fail(p, tollgate.OutcomeAccountDisabled, "the account was disabled by the operator when the payment came in")
	}
	entry := tollgate.PaymentCreditEntryID(p.ID)
	pi := p.PaymentIntent
	if pi == "" {
		pi = c.PaymentIntent
	}
	if err := o.setPayment(&p, `status = ?, credit_entry = ?, payment_intent = ?, charge = ?, customer = ?, receipt_url = ?,
		paid = ?, credited = ?, note = ''`, string(tollgate.PaymentCredited), entry, nullString(pi),
		firstNonEmpty(c.Charge, p.Charge), firstNonEmpty(c.Customer, p.Customer), firstNonEmpty(c.ReceiptURL, p.ReceiptURL),
		NullTime(c.Paid), o.at); err != nil {
		if tx.IsUnique(err) {
			return o.res, &tollgate.Error{Code: tollgate.CodeConflict, Message: "payment " + p.ID + " is already credited", Err: err}
		}
		return o.res, err
	}
	p.Status, p.credited, p.PaymentIntent, p.Credited, p.Paid, p.Note = tollgate.PaymentCredited, true, pi, o.at, c.Paid.UTC().Truncate(time.Microsecond), ""
	p.Charge = firstNonEmpty(c.Charge, p.Charge)
	p.Customer, p.ReceiptURL = firstNonEmpty(c.Customer, p.Customer), firstNonEmpty(c.ReceiptURL, p.ReceiptURL)
	note := p.Provider + " " + firstNonEmpty(p.CheckoutSession, p.PaymentIntent)
	if err := o.ledger(tollgate.LedgerPayment, entry, a, p.Credit, 0, 0, note); err != nil {
		return o.res, err
	}
	o.res.Outcome = tollgate.OutcomeCredited
	// A refund or a dispute that came before the credit takes its part now.
	if err := o.refund(&p, a); err != nil {
		return o.res, err
	}
	if p.Dispute != "" && (p.DisputeStatus == "open" || p.DisputeStatus == "lost") {
		if err := o.dispute(&p, a); err != nil {
			return o.res, err
		}
	}
	o.res.Outcome = tollgate.OutcomeCredited
	if err := o.endTopUp(p.ID); err != nil {
		return o.res, err
	}
	if err := o.settleOwed("le_ows_"+p.ID, a); err != nil {
		return o.res, err
	}
	if err := o.maybeEnable(a); err != nil {
		return o.res, err
	}
	return o.finish(p, a)
}

// record inserts the payment a provider reports that the store does not
// know. It sets o.res.Outcome when nothing more is to be done.
func (o *op) record(c tollgate.PaymentCredit) (payment, error) {
	key := firstNonEmpty(c.CheckoutSession, c.PaymentIntent)
	if c.AccountID == "" {
		o.res.Outcome = tollgate.OutcomeUnmatched
		return payment{}, nil
	}
	var n int64
	if err := o.tx.QueryRow(`SELECT count(*) FROM accounts WHERE id = ?`, c.AccountID).Scan(&n); err != nil {
		return payment{}, err
	}
	if n == 0 {
		o.res.Outcome = tollgate.OutcomeNoAccount
		return payment{}, nil
	}
	if c.Credit <= 0 || c.AmountCents <= 0 {
		o.res.Outcome = tollgate.OutcomeMismatch
		return payment{}, nil
	}
	id := c.ID
	if id == "" {
		id = tollgate.NewOrderedID("pay_", o.at)
	}
	kind := c.Kind
	if kind == "" {
		kind = tollgate.PaymentCheckout
	}
	// Two deliveries of one event may both get here: the provider id's
	// unique index lets one insert and the other find its row.
	insert := func(id string) (int64, error) {
		return o.tx.Exec(`INSERT INTO payments (id, account_id, provider, kind, status, checkout_session, payment_intent,
			credit, fee, amount_cents, currency, created, updated) VALUES (?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT DO NOTHING`,
			id, c.AccountID, c.Provider, string(kind), nullString(c.CheckoutSession), nullString(c.PaymentIntent),
			int64(c.Credit), int64(c.Fee), c.AmountCents, c.Currency, o.at, o.at)
	}
	n, err := insert(id)
	if err != nil {
		return payment{}, err
	}
	p, err := find(o.tx, key, true)
	if n == 0 && errors.Is(err, tollgate.ErrNotFound) {
		// The id was taken by another payment (the metadata named a payment
		// of another session): this one gets an id of its own.
		if _, err := insert(tollgate.NewOrderedID("pay_", o.at)); err != nil {
			return payment{}, err
		}
		return find(o.tx, key, true)
	}
	return p, err
}

func (o *op) fail(p payment, outcome tollgate.PaymentOutcome, note string) (tollgate.PaymentResult, error) {
	if err := o.setPayment(&p, `status = ?, note = ?`, string(tollgate.PaymentFailed), note); err != nil {
		return o.res, err
	}
	if err := o.endTopUp(p.ID); err != nil {
		return o.res, err
	}
	p.Status, p.Note = tollgate.PaymentFailed, note
	o.res.Outcome = outcome
	return o.finish(p, nil)
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Fail marks a payment that was not credited as failed.
func Fail(tx Tx, providerID, note string, at time.Time) (tollgate.PaymentResult, error) {
	o := &op{tx: tx, at: at.UTC().Truncate(time.Microsecond)}
	p, err := find(tx, providerID, true)
	if err != nil {
		return o.res, err
	}
	if p.credited || p.Status == tollgate.PaymentFailed {
		o.res.Outcome = tollgate.OutcomeNoChange
		return o.finish(p, nil)
	}
	return o.fail(p, tollgate.OutcomeFailed, note)
}

// refund takes the part of the credit that the payment's refunded cents
// stand for and that was not taken yet (a credited payment only).
func (o *op) refund(p *payment, a *account) error {
	if !p.credited || p.RefundedCents <= 0 {
		return nil
	}
	target := min(tollgate.ProRata(p.Credit, p.RefundedCents, p.AmountCents), p.Credit-p.Disputed)
	want := target - p.Refunded
	if want <= 0 {
		return nil
	}
	id := fmt.Sprintf("le_ref_%s_%d", p.ID, p.RefundedCents)
	note := fmt.Sprintf("%s refund of %d of %d cents (%s)", p.Provider, p.RefundedCents, p.AmountCents, firstNonEmpty(p.Charge, p.PaymentIntent))
	if err := o.debit(tollgate.LedgerRefund, id, a, want, note); err != nil {
		return err
	}
	status := tollgate.PaymentRefunded
	if p.Status == tollgate.PaymentDisputed {
		status = p.Status
	}
	if err := o.setPayment(p, `refunded = ?, status = ?`, int64(target), string(status)); err != nil {
		return err
	}
	p.Refunded, p.Status = target, status
	o.res.Outcome = tollgate.OutcomeDebited
	return nil
}

// dispute takes the disputed part of the credit (a credited payment whose
// dispute took nothing yet).
func (o *op) dispute(p *payment, a *account) error {
	if err := o.disable(a); err != nil {
		return err
	}
	if !p.credited || p.Disputed > 0 {
		return nil
	}
	want := min(tollgate.ProRata(p.Credit, p.DisputedCents, p.AmountCents), p.Credit-p.Refunded)
	if want <= 0 {
		return nil
	}
	note := fmt.Sprintf("%s dispute %s of %d of %d cents", p.Provider, p.Dispute, p.DisputedCents, p.AmountCents)
	if err := o.debit(tollgate.LedgerDispute, "le_dsp_"+p.Dispute, a, want, note); err != nil {
		return err
	}
	if err := o.setPayment(p, `disputed = ?, status = ?`, int64(want), string(tollgate.PaymentDisputed)); err != nil {
		return err
	}
	p.Disputed, p.Status = want, tollgate.PaymentDisputed
	o.res.Outcome = tollgate.OutcomeDebited
	return nil
}

// Refund records a payment's cumulative refunded cents and takes their part.
func Refund(tx Tx, providerID, charge string, refundedCents int64, at time.Time) (tollgate.PaymentResult, error) {
	o := &op{tx: tx, at: at.UTC().Truncate(time.Microsecond), res: tollgate.PaymentResult{Outcome: tollgate.OutcomeNoChange}}
	p, err := find(tx, providerID, true)
	if err != nil {
		return o.res, err
	}
	if refundedCents <= p.RefundedCents {
		return o.finish(p, nil) // an earlier or repeated event: amount_refunded only grows
	}
	if err := o.setPayment(&p, `refunded_cents = ?, charge = ?`, refundedCents, firstNonEmpty(p.Charge, charge)); err != nil {
		return o.res, err
	}
	p.RefundedCents = refundedCents
	p.Charge = firstNonEmpty(p.Charge, charge)
	a, err := lockAccount(tx, p.AccountID)
	if err != nil {
		return o.res, err
	}
	if err := o.refund(&p, a); err != nil {
		return o.res, err
	}
	return o.finish(p, a)
}

// Dispute records a dispute on a payment and takes the disputed part.
func Dispute(tx Tx, providerID, dispute string, cents int64, at time.Time) (tollgate.PaymentResult, error) {
	o := &op{tx: tx, at: at.UTC().Truncate(time.Microsecond), res: tollgate.PaymentResult{Outcome: tollgate.OutcomeNoChange}}
	p, err := find(tx, providerID, true)
	if err != nil {
		return o.res, err
	}
	if p.Dispute != "" {
		return o.finish(p, nil) // this dispute again, or a later one on a charge already disputed
	}
	if err := o.setPayment(&p, `dispute = ?, dispute_status = 'open', disputed_cents = ?`, dispute, cents); err != nil {
		return o.res, err
	}
	p.Dispute, p.DisputeStatus, p.DisputedCents = dispute, "open", cents
	a, err := lockAccount(tx, p.AccountID)
	if err != nil {
		return o.res, err
	}
	if err := o.dispute(&p, a); err != nil {
		return o.res, err
	}
	return o.finish(p, a)
}

// CloseDispute records a dispute's end; a won dispute gives back what it took.
func CloseDispute(tx Tx, providerID, dispute string, won bool, at time.Time) (tollgate.PaymentResult, error) {
	o := &op{tx: tx, at: at.UTC().Truncate(time.Microsecond), res: tollgate.PaymentResult{Outcome: tollgate.OutcomeNoChange}}
	p, err := find(tx, providerID, true)
	if err != nil {
		return o.res, err
	}
	if p.Dispute != dispute || p.DisputeStatus != "open" {
		return o.finish(p, nil)
	}
	if !won {
		if err := o.setPayment(&p, `dispute_status = 'lost'`); err != nil {
			return o.res, err
		}
		p.DisputeStatus = "lost"
		return o.finish(p, nil)
	}
	a, err := lockAccount(tx, p.AccountID)
	if err != nil {
		return o.res, err
	}
	status := p.Status
	if p.credited {
		status = tollgate.PaymentCredited
		if p.Refunded > 0 {
			status = tollgate.PaymentRefunded
		}
	}
	if err := o.setPayment(&p, `dispute_status = 'won', status = ?`, string(status)); err != nil {
		return o.res, err
	}
	p.DisputeStatus, p.Status = "won", status
	if p.Disputed > 0 {
		note := fmt.Sprintf("%s dispute %s won", p.Provider, dispute)
		if err := o.ledger(tollgate.LedgerDisputeWon, "le_dsw_"+dispute, a, p.Disputed, 0, 0, note); err != nil {
			return o.res, err
		}
		o.res.Outcome = tollgate.OutcomeReversed
	}
	if err := o.settleOwed("le_ows_"+dispute, a); err != nil {
		return o.res, err
	}
	if err := o.maybeEnable(a); err != nil {
		return o.res, err
	}
	return o.finish(p, a)
}

// CollectOwed takes what an account owes from its free balance.
func CollectOwed(tx Tx, accountID string, at time.Time) (tollgate.PaymentResult, error) {
	o := &op{tx: tx, at: at.UTC().Truncate(time.Microsecond), res: tollgate.PaymentResult{Outcome: tollgate.OutcomeNoChange}}
	a, err := lockAccount(tx, accountID)
	if err != nil {
		return o.res, err
	}
	if err := o.settleOwed(tollgate.NewOrderedID("le_ows_", o.at), a); err != nil {
		return o.res, err
	}
	if len(o.res.Entries) > 0 {
		o.res.Outcome = tollgate.OutcomeDebited
	}
	if err := o.maybeEnable(a); err != nil {
		return o.res, err
	}
	o.res.Owed = a.owed
	return o.res, nil
}

// RecordEvent keeps an event; a redelivery counts and keeps the first
// outcome unless the new one changed something.
func RecordEvent(tx Tx, e tollgate.PaymentEvent) error {
	at := e.Last.UTC()
	_, err := tx.Exec(`INSERT INTO payment_events (id, type, provider, object, account_id, payment_id, outcome, problem, detail,
		deliveries, first, last) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?)
		ON CONFLICT (id) DO UPDATE SET deliveries = payment_events.deliveries + 1, last = excluded.last,
		outcome = CASE WHEN excluded.outcome IN ('already_credited', 'no_change') THEN payment_events.outcome ELSE excluded.outcome END,
		problem = CASE WHEN excluded.outcome IN ('already_credited', 'no_change') THEN payment_events.problem ELSE excluded.problem END,
		detail = CASE WHEN excluded.outcome IN ('already_credited', 'no_change') THEN payment_events.detail ELSE excluded.detail END,
		account_id = CASE WHEN excluded.account_id = '' THEN payment_events.account_id ELSE excluded.account_id END,
		payment_id = CASE WHEN excluded.payment_id = '' THEN payment_events.payment_id ELSE excluded.payment_id END`,
		e.ID, e.Type, e.Provider, e.Object, e.AccountID, e.PaymentID, string(e.Outcome), e.Outcome.Problem(), e.Detail, at, at)
	return err
}

// Events lists kept events, newest first.
func Events(tx Tx, problemsOnly bool, limit int) ([]tollgate.PaymentEvent, error) {
	if limit <= 0 {
		limit = 1000
	}
	q := `SELECT id, type, provider, object, account_id, payment_id, outcome, detail, deliveries, first, last FROM payment_events`
	if problemsOnly {
		q += ` WHERE problem = true`
	}
	rows, err := tx.Query(q+` ORDER BY last DESC, id LIMIT ?`, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []tollgate.PaymentEvent{}
	for rows.Next() {
		var e tollgate.PaymentEvent
		var outcome string
		if err := rows.Scan(&e.ID, &e.Type, &e.Provider, &e.Object, &e.AccountID, &e.PaymentID, &outcome, &e.Detail,
			&e.Deliveries, Time{&e.First}, Time{&e.Last}); err != nil {
			return nil, err
		}
		e.Outcome = tollgate.PaymentOutcome(outcome)
		out = append(out, e)
	}
	return out, rows.Err()
}

// Owed lists the accounts that owe something.
func Owed(tx Tx) ([]tollgate.Owed, error) {
	rows, err := tx.Query(`SELECT id, owed, disabled FROM accounts WHERE owed > 0 ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []tollgate.Owed{}
	for rows.Next() {
		var o tollgate.Owed
		var owed int64
		if err := rows.Scan(&o.AccountID, &owed, &o.Disabled); err != nil {
			return nil, err
		}
		o.Owed = tollgate.Amount(owed)
		out = append(out, o)
	}
	return out, rows.Err()
}

// Hold reads what keeps an account disabled by payments.
func Hold(tx Tx, accountID string) (tollgate.PaymentHold, error) {
	var h tollgate.PaymentHold
	var owed int64
	err := tx.QueryRow(`SELECT a.payment_hold, a.owed, (`+holdingDisputes+`a.id)
		FROM accounts a WHERE a.id = ?`, accountID).Scan(&h.Held, &owed, &h.Disputes)
	if errors.Is(err, ErrNoRows) {
		return h, fmt.Errorf("account %s: %w", accountID, tollgate.ErrNotFound)
	}
	h.Owed = tollgate.Amount(owed)
	return h, err
}

// AuditColumns are the payment sums the audit reads for each account `a`
// of the accounts table, in the order of AuditDest: owed, the net of the
// payment kinds, what those rows say is owed, the payment credits in the
// ledger and the credits of credited payments.
const AuditColumns = `a.owed,
	CAST(coalesce((SELECT sum(amount) FROM ledger l WHERE l.account_id = a.id
		AND kind IN ('payment', 'refund', 'dispute', 'dispute_won', 'owed_settled')), 0) AS bigint),
	CAST(coalesce((SELECT sum(uncollected) FROM ledger l WHERE l.account_id = a.id
		AND kind IN ('refund', 'dispute', 'owed_settled')), 0) AS bigint),
	CAST(coalesce((SELECT sum(amount) FROM ledger l WHERE l.account_id = a.id AND kind = 'payment'), 0) AS bigint),
	CAST(coalesce((SELECT sum(credit) FROM payments p WHERE p.account_id = a.id AND p.credit_entry IS NOT NULL), 0) AS bigint)`

// AuditDest returns the scan destinations of AuditColumns in a.
func AuditDest(a *tollgate.AccountAudit) []any {
	return []any{(*int64)(&a.Owed), (*int64)(&a.Payments), (*int64)(&a.OwedLedger), (*int64)(&a.PaymentCredits), (*int64)(&a.PaidCredits)}
}

// Store is tollgate.PaymentStore over a store's transactions: a store
// embeds it with its two functions set.
type Store struct {
	// Write runs fn in one write transaction, committed (and durable)
	// when it returns nil.
	Write func(ctx context.Context, fn func(tx Tx) error) error
	// Read returns a Tx for reads outside a transaction.
	Read func(ctx context.Context) Tx
}

var _ tollgate.PaymentStore = Store{}

// CreatePayment records a payment tollgate began.
func (s Store) CreatePayment(ctx context.Context, p tollgate.Payment) error {
	return s.Write(ctx, func(tx Tx) error { return CreatePayment(tx, p) })
}

// Payment returns a payment by id.
func (s Store) Payment(ctx context.Context, id string) (tollgate.Payment, error) {
	return Get(s.Read(ctx), id)
}

// PaymentByProviderID returns a payment by its checkout session or payment intent.
func (s Store) PaymentByProviderID(ctx context.Context, id string) (tollgate.Payment, error) {
	return Get(s.Read(ctx), id)
}

// Payments lists payments, newest first.
func (s Store) Payments(ctx context.Context, accountID string, limit int) ([]tollgate.Payment, error) {
	return List(s.Read(ctx), accountID, limit)
}

func (s Store) result(ctx context.Context, fn func(tx Tx) (tollgate.PaymentResult, error)) (r tollgate.PaymentResult, err error) {
	err = s.Write(ctx, func(tx Tx) (err error) { r, err = fn(tx); return err })
	return r, err
}

// CreditPayment credits a paid payment exactly once.
func (s Store) CreditPayment(ctx context.Context, c tollgate.PaymentCredit) (tollgate.PaymentResult, error) {
	return s.result(ctx, func(tx Tx) (tollgate.PaymentResult, error) { return Credit(tx, c) })
}

// FailPayment marks a payment as failed.
func (s Store) FailPayment(ctx context.Context, providerID, note string, at time.Time) (tollgate.PaymentResult, error) {
	return s.result(ctx, func(tx Tx) (tollgate.PaymentResult, error) { return Fail(tx, providerID, note, at) })
}

// RefundPayment takes a payment's refunded part.
func (s Store) RefundPayment(ctx context.Context, providerID, charge string, cents int64, at time.Time) (tollgate.PaymentResult, error) {
	return s.result(ctx, func(tx Tx) (tollgate.PaymentResult, error) { return Refund(tx, providerID, charge, cents, at) })
}

// DisputePayment takes a payment's disputed part.
func (s Store) DisputePayment(ctx context.Context, providerID, dispute string, cents int64, at time.Time) (tollgate.PaymentResult, error) {
	return s.result(ctx, func(tx Tx) (tollgate.PaymentResult, error) { return Dispute(tx, providerID, dispute, cents, at) })
}

// CloseDispute records a dispute's end.
func (s Store) CloseDispute(ctx context.Context, providerID, dispute string, won bool, at time.Time) (tollgate.PaymentResult, error) {
	return s.result(ctx, func(tx Tx) (tollgate.PaymentResult, error) { return CloseDispute(tx, providerID, dispute, won, at) })
}

// CollectOwed takes what an account owes from its free balance.
func (s Store) CollectOwed(ctx context.Context, accountID string, at time.Time) (tollgate.PaymentResult, error) {
	return s.result(ctx, func(tx Tx) (tollgate.PaymentResult, error) { return CollectOwed(tx, accountID, at) })
}

// RecordPaymentEvent keeps a provider's event.
func (s Store) RecordPaymentEvent(ctx context.Context, e tollgate.PaymentEvent) error {
	return s.Write(ctx, func(tx Tx) error { return RecordEvent(tx, e) })
}

// PaymentEvents lists kept events, newest first.
func (s Store) PaymentEvents(ctx context.Context, problemsOnly bool, limit int) ([]tollgate.PaymentEvent, error) {
	return Events(s.Read(ctx), problemsOnly, limit)
}

// OwedAmounts lists the accounts that owe something.
func (s Store) OwedAmounts(ctx context.Context) ([]tollgate.Owed, error) {
	return Owed(s.Read(ctx))
}

// PaymentHold reads what keeps an account disabled by payments.
func (s Store) PaymentHold(ctx context.Context, accountID string) (tollgate.PaymentHold, error) {
	return Hold(s.Read(ctx), accountID)
}

// IsDomain reports an error a caller branches on (a *tollgate.Error or
// ErrNotFound), which stores return without wrapping.
func IsDomain(err error) bool {
	var te *tollgate.Error
	return errors.As(err, &te) || errors.Is(err, tollgate.ErrNotFound)
}

// endTopUp ends the account's top-up in flight if it is payment id.
func (o *op) endTopUp(id string) error {
	_, err := o.tx.Exec(`UPDATE auto_topups SET in_flight = NULL, claimed_until = NULL WHERE in_flight = ?`, id)
	return err
}

const topUpColumns = `t.account_id, t.enabled, t.threshold, t.amount, t.customer, t.payment_method, coalesce(t.in_flight, ''),
	t.claimed_until, t.notice, t.updated`

func scanTopUp(r Row) (tollgate.AutoTopUp, error) {
	var a tollgate.AutoTopUp
	var threshold, amount int64
	err := r.Scan(&a.AccountID, &a.Enabled, &threshold, &amount, &a.Customer, &a.PaymentMethod, &a.InFlight,
		Time{&a.ClaimedUntil}, &a.Notice, Time{&a.Updated})
	a.Threshold, a.Amount = tollgate.Amount(threshold), tollgate.Amount(amount)
	return a, err
}

// GetTopUp returns an account's auto top-up.
func GetTopUp(tx Tx, accountID string) (tollgate.AutoTopUp, error) {
	a, err := scanTopUp(tx.QueryRow(`SELECT `+topUpColumns+` FROM auto_topups t WHERE t.account_id = ?`, accountID))
	if errors.Is(err, ErrNoRows) {
		return a, fmt.Errorf("auto top-up of %s: %w", accountID, tollgate.ErrNotFound)
	}
	return a, err
}

// SetTopUp sets an account's auto top-up settings, keeping its card.
func SetTopUp(tx Tx, a tollgate.AutoTopUp) error {
	if a.Threshold < 0 || a.Amount < 0 {
		return tollgate.Errorf(tollgate.CodeInvalidRequest, "the threshold and the amount must not be negative")
	}
	_, err := tx.Exec(`INSERT INTO auto_topups (account_id, enabled, threshold, amount, updated) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (account_id) DO UPDATE SET enabled = excluded.enabled, threshold = excluded.threshold,
		amount = excluded.amount, updated = excluded.updated,
		notice = CASE WHEN excluded.enabled THEN '' ELSE auto_topups.notice END`,
		a.AccountID, a.Enabled, int64(a.Threshold), int64(a.Amount), a.Updated.UTC())
	return err
}

// SaveCard keeps an account's saved card.
func SaveCard(tx Tx, accountID, customer, method string, at time.Time) error {
	_, err := tx.Exec(`INSERT INTO auto_topups (account_id, enabled, threshold, amount, customer, payment_method, updated)
		VALUES (?, false, 0, 0, ?, ?, ?)
		ON CONFLICT (account_id) DO UPDATE SET customer = excluded.customer, payment_method = excluded.payment_method,
		updated = excluded.updated`, accountID, customer, method, at.UTC())
	return err
}

// DueTopUps lists the top-ups to run now.
func DueTopUps(tx Tx, now time.Time) ([]tollgate.AutoTopUp, error) {
	rows, err := tx.Query(`SELECT `+topUpColumns+` FROM auto_topups t JOIN accounts a ON a.id = t.account_id
		WHERE t.enabled = true AND t.payment_method <> '' AND t.amount > 0 AND a.disabled = false
		AND a.balance - a.held < t.threshold AND (t.in_flight IS NULL OR t.claimed_until < ?)
		ORDER BY t.account_id`, now.UTC())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []tollgate.AutoTopUp{}
	for rows.Next() {
		a, err := scanTopUp(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// ClaimTopUp makes p the account's top-up in flight if it is still due:
// enabled with a card, the account not disabled and its free balance below
// the threshold, and none in flight (or its claim lapsed). The account's
// row is locked first, as a credit locks it, so a claim sees the balance a
// top-up that just ended has credited.
func ClaimTopUp(tx Tx, p tollgate.Payment, until, now time.Time) (bool, error) {
	a, err := lockAccount(tx, p.AccountID)
	if err != nil {
		return false, err
	}
	t, err := scanTopUp(tx.QueryRow(`SELECT `+topUpColumns+` FROM auto_topups t WHERE t.account_id = ? FOR UPDATE`, p.AccountID))
	if errors.Is(err, ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if !t.Enabled || t.PaymentMethod == "" || a.disabled || a.balance-a.held >= t.Threshold ||
		(t.InFlight != "" && !t.ClaimedUntil.Before(now)) {
		return false, nil
	}
	if _, err := tx.Exec(`UPDATE auto_topups SET in_flight = ?, claimed_until = ? WHERE account_id = ?`,
		p.ID, until.UTC(), p.AccountID); err != nil {
		return false, err
	}
	return true, CreatePayment(tx, p)
}

// DisableTopUp turns an account's top-up off with a notice.
func DisableTopUp(tx Tx, accountID, notice string, at time.Time) error {
	_, err := tx.Exec(`UPDATE auto_topups SET enabled = false, notice = ?, updated = ? WHERE account_id = ?`,
		notice, at.UTC(), accountID)
	return err
}

// AutoTopUp returns an account's auto top-up.
func (s Store) AutoTopUp(ctx context.Context, accountID string) (tollgate.AutoTopUp, error) {
	return GetTopUp(s.Read(ctx), accountID)
}

// SetAutoTopUp sets an account's auto top-up settings.
func (s Store) SetAutoTopUp(ctx context.Context, a tollgate.AutoTopUp) error {
	return s.Write(ctx, func(tx Tx) error { return SetTopUp(tx, a) })
}

// SaveCard keeps an account's saved card.
func (s Store) SaveCard(ctx context.Context, accountID, customer, method string, at time.Time) error {
	return s.Write(ctx, func(tx Tx) error { return SaveCard(tx, accountID, customer, method, at) })
}

// DueTopUps lists the top-ups to run now.
func (s Store) DueTopUps(ctx context.Context, now time.Time) ([]tollgate.AutoTopUp, error) {
	return DueTopUps(s.Read(ctx), now)
}

// ClaimTopUp makes p the account's top-up in flight if none is.
func (s Store) ClaimTopUp(ctx context.Context, p tollgate.Payment, until, now time.Time) (ok bool, err error) {
	err = s.Write(ctx, func(tx Tx) (err error) { ok, err = ClaimTopUp(tx, p, until, now); return err })
	return ok, err
}

// DisableAutoTopUp turns an account's top-up off with a notice.
func (s Store) DisableAutoTopUp(ctx context.Context, accountID, notice string, at time.Time) error {
	return s.Write(ctx, func(tx Tx) error { return DisableTopUp(tx, accountID, notice, at) })
}
