package tollgate

import (
	"errors"
	"time"
)

// The books: holds, the ledger and what the operator reads from them. The
// billing package implements Biller on top of these; the store packages keep
// them (docs/billing.md describes the model).

// LedgerKind says what moved an account's balance.
type LedgerKind string

const (
	// LedgerOpening is the balance an account was created with.
	LedgerOpening LedgerKind = "opening"
	// LedgerCredit is an operator's top-up.
	LedgerCredit LedgerKind = "credit"
	// LedgerDebit is an operator's deduction.
	LedgerDebit LedgerKind = "debit"
	// LedgerCharge is the settled cost of one request.
	LedgerCharge LedgerKind = "charge"
)

// LedgerEntry is one row of the ledger. Amount is the signed change of the
// balance (+ for opening and credit, − for debit and charge), so an
// account's balance is always the sum of its entries' Amount.
type LedgerEntry struct {
	Seq       int64      `json:"seq"` // order of entry, assigned by the store
	ID        string     `json:"id"`  // the request id for a charge, "le_..." otherwise
	Kind      LedgerKind `json:"kind"`
	AccountID string     `json:"account_id"`
	Amount    Amount     `json:"amount"`
	Note      string     `json:"note,omitzero"`
	Time      time.Time  `json:"time"`
	// Actor says who made an operator's entry, for the people who read the
	// books later: "the operator console from 203.0.113.7", "the CLI as
	// alice@host". Empty for charges.
	Actor string `json:"actor,omitzero"`
	// For a charge: the request, its hold and what it cost. Charge.Cost is
	// the cost at the backend's rates; Amount is −(Cost − Uncollected).
	Charge      *Charge `json:"charge,omitzero"`
	HoldID      string  `json:"hold_id,omitzero"`
	Uncollected Amount  `json:"uncollected,omitzero"`
}

// Hold is balance reserved for one request in flight. It belongs to the
// instance (Owner) that runs the request, which renews its lease (Expires)
// while it lives; a sweeper releases holds whose lease ended.
type Hold struct {
	ID        string
	RequestID string
	AccountID string
	KeyID     string
	Model     string
	Class     BackendClass
	Amount    Amount
	// Tokens is the token bound counted against the key's tokens-per-minute
	// window; Minute is that window (unix time / 60). The store counts the
	// hold in the window only when the key has a rate limit.
	Tokens  int64
	Minute  int64
	Owner   string
	Created time.Time
	Expires time.Time
	// Ended is when the store learnt that the hold's request had ended
	// while its settle or release could not be written (zero: running).
	// Such a hold is no longer renewed and is released by the sweep
	// (docs/billing.md, "No hold stranded").
	Ended time.Time
}

// ErrNotApplied is in the error of a store's ApplyBilling when the store
// knows that nothing of the batch was applied (it was never sent, or the
// transaction failed before its commit). Any other error may come from a
// batch that was committed with its answer lost: billing then counts its
// reservations' operations as the worse case (docs/billing.md,
// "Reservations").
var ErrNotApplied = errors.New("not applied")

// BillingOpKind is the kind of one operation in a billing batch.
type BillingOpKind uint8

const (
	OpHold BillingOpKind = iota + 1
	OpSettle
	OpRelease
	// OpReserve grows (or creates) an instance's reservation on an account
	// and key: a holds row with no request (docs/billing.md, "Reservations").
	OpReserve
	// OpReturn gives part of a reservation back to the free balance, or
	// all the row holds (BillingOp.ReturnAll).
	OpReturn
	// OpCharge settles a request whose hold was placed in memory against a
	// reservation: the charge is paid from the reservation.
	OpCharge
)

// HoldOutcome is why a hold was refused (or HoldOK).
type HoldOutcome uint8

const (
	HoldOK HoldOutcome = iota
	HoldInsufficient
	HoldKeyLimit
	HoldRateLimited
	HoldNoAccount
	// HoldDirect (OpReserve): the key has a spend or rate limit, so its
	// requests take the per-request path.
	HoldDirect
)

// BillingOp is one hold, settle or release. A store applies a batch of them
// in order in one transaction, each as if alone, and fills in the results.
type BillingOp struct {
	Kind BillingOpKind
	// OpHold: the hold to place (ID, Owner, Created and Expires set by the
	// caller) and the key's limits as of now are read by the store.
	Hold Hold
	// OpSettle and OpRelease: the hold.
	HoldID string
	// OpSettle: the charge; Charge.Cost is what the request cost.
	Charge Charge

	// Results.
	Outcome HoldOutcome
	// Free is the account's free balance when Outcome is HoldInsufficient;
	// the key's remaining spend when HoldKeyLimit.
	Free Amount
	// RetryAt is when the key's rate window frees up (HoldRateLimited).
	RetryAt time.Time
	// Charged and Uncollected (OpSettle): what was taken from the balance
	// and what could not be (the backend reported more than the hold and
	// the free balance covered). Charged + Uncollected = Charge.Cost.
	Charged     Amount
	Uncollected Amount
	// Replayed (OpSettle, OpRelease): the hold was already settled or
	// released; nothing changed, Charged is the earlier charge.
	Replayed bool

	// Reservations (OpReserve, OpReturn, OpCharge). Reservation is the id
	// of the reservation row (OpReserve: Hold.ID). OpReserve asks for
	// Hold.Amount and accepts no less than Need, and never more than
	// 1/Fraction of the free balance, nor anything when the free balance is
	// below MinFree; Create inserts the row, else it must exist (Gone if it
	// does not: it was swept). Granted is what was added.
	Reservation string
	Need        Amount
	MinFree     Amount
	Fraction    int64
	Create      bool
	Granted     Amount
	// OpCharge: Covered is taken from the reservation towards Charge.Cost
	// (the rest, if any, from the free balance); Return (OpCharge and
	// OpReturn) is given back from the reservation to the free balance.
	Covered Amount
	Return  Amount
	// ReturnAll (OpReturn): give back everything the row holds, whatever
	// Return says, and delete the row; Returned is what it held. The
	// instance's count of its reservation can be wrong after an answer of
	// the store was lost (docs/billing.md, "Reservations"); the row cannot.
	ReturnAll bool
	Returned  Amount
	// Gone: the reservation row does not exist (swept after its lease, or,
	// for ReturnAll, never created or already returned): OpCharge then
	// charged from the free balance alone; OpReturn changed nothing.
	Gone bool
	// Recovered (OpSettle, OpCharge): the operation comes from a dead
	// instance's charge journal and may already be in the ledger: a store
	// applies it alone, with its check for an earlier charge of the hold,
	// never summed with others.
	Recovered bool
	// Provisional (OpSettle, OpCharge, in the charge journal only): what a
	// request still running had delivered when its record was written (a
	// stream's tokens, counted locally). Its settle replaces it; recovery
	// applies it only when the journal holds no settle of the same hold
	// (docs/billing.md, "Streams cut by a crash"). Stores ignore it.
	Provisional bool
}

// Balance is an account's money as the books see it.
type Balance struct {
	AccountID string `json:"account_id"`
	Balance   Amount `json:"balance"` // settled
	Held      Amount `json:"held"`    // sum of active holds
	Free      Amount `json:"free"`    // Balance − Held: what new holds may take
}

// AccountAudit is what the ledger and the holds say about one account.
type AccountAudit struct {
	AccountID    string `json:"account_id"`
	Balance      Amount `json:"balance"`
	Held         Amount `json:"held"`
	Opening      Amount `json:"opening"`
	Credits      Amount `json:"credits"`
	Debits       Amount `json:"debits"`  // positive: the sum of debit amounts taken
	Charges      Amount `json:"charges"` // positive: the sum charged
	HoldsSum     Amount `json:"holds_sum"`
	ActiveHolds  int64  `json:"active_holds"`
	ExpiredHolds int64  `json:"expired_holds"` // active holds whose lease ended before the audit's cut-off
	// StrandedHolds are the ids of the holds whose request ended (Hold.Ended)
	// before the audit's cut-off and that are still held.
	StrandedHolds []string `json:"stranded_holds,omitzero"`
	Uncollected   Amount   `json:"uncollected"`
	// Payments (docs/payments.md): the net of the payment kinds' rows,
	// what the account owes as stored and as its rows say, and the payment
	// credits in the ledger beside the credits of its credited payments.
	Payments       Amount `json:"payments"`
	Owed           Amount `json:"owed"`
	OwedLedger     Amount `json:"owed_ledger"`
	PaymentCredits Amount `json:"payment_credits"`
	PaidCredits    Amount `json:"paid_credits"`
}

// AuditSource is where an audit of the books ran from.
type AuditSource string

const (
	AuditFromCLI      AuditSource = "cli"       // tollgate audit
	AuditFromAdminAPI AuditSource = "admin_api" // GET /admin/v1/audit
	AuditFromConsole  AuditSource = "console"   // the operator console's "Run the audit"
)

// AuditProblemsKept is how many of a run's problems the store keeps (the
// first ones); ProblemCount counts them all. AuditRunsKept is how many runs
// it keeps: recording one deletes those beyond the newest AuditRunsKept.
const (
	AuditProblemsKept = 50
	AuditRunsKept     = 100
)

// AuditRun is the record of one audit of the books (billing.RunAudit),
// kept so that the last result survives restarts and is the same on every
// instance, wherever the audit ran.
type AuditRun struct {
	Time         time.Time // when it ran, to the microsecond
	Source       AuditSource
	OK           bool
	Accounts     int64
	Keys         int64
	Balance      Amount        // sum of all balances
	Held         Amount        // sum of all held amounts
	Problems     []string      // the first AuditProblemsKept
	ProblemCount int64         // all of them
	Took         time.Duration // to the microsecond
}

// KeptProblems returns the problems a store keeps: the first
// AuditProblemsKept.
func (r AuditRun) KeptProblems() []string {
	if len(r.Problems) > AuditProblemsKept {
		return r.Problems[:AuditProblemsKept]
	}
	return r.Problems
}

// KeyAudit is what the ledger and the holds say about one key.
type KeyAudit struct {
	KeyID    string `json:"key_id"`
	Spent    Amount `json:"spent"`
	Held     Amount `json:"held"`
	Charges  Amount `json:"charges"`
	HoldsSum Amount `json:"holds_sum"`
}

// UsageFilter selects charges for a usage report.
type UsageFilter struct {
	AccountID string
	KeyID     string
	Model     string
	Class     BackendClass
	Since     time.Time // inclusive; zero: from the start
	Until     time.Time // exclusive; zero: up to now
}

// OperatorAmount checks an operator's credit or debit entry and returns its
// signed amount (+ for a credit, − for a debit, whatever sign was given).
func (e *LedgerEntry) OperatorAmount() (Amount, error) {
	if e.ID == "" || e.AccountID == "" || e.Time.IsZero() {
		return 0, errors.New("post entry: ID, AccountID and Time are required")
	}
	amt := e.Amount
	if amt < 0 {
		amt = -amt
	}
	if amt == 0 {
		return 0, Errorf(CodeInvalidRequest, "the amount must not be zero")
	}
	switch e.Kind {
	case LedgerCredit:
		return amt, nil
	case LedgerDebit:
		return -amt, nil
	}
	return 0, Errorf(CodeInvalidRequest, "an operator entry is a credit or a debit, not %q", e.Kind)
}

// CheckOperatorEntry applies an operator entry's rules to an account's
// balance and held amount: the balance stays in range, and a debit may take
// at most the free balance (it never touches money held for requests).
func CheckOperatorEntry(signed, balance, held Amount) error {
	nb, err := balance.Add(signed)
	if err != nil {
		return Errorf(CodeInvalidRequest, "the balance would be out of range")
	}
	if signed < 0 && nb < held {
		return Errorf(CodeInsufficientBalance, "a debit of %s USD exceeds the free balance of %s USD",
			(-signed).String(), (balance - held).String())
	}
	return nil
}
