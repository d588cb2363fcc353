package billing

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tollgate/tollgate"
)

// BooksStore is what the operator's tools (CLI and admin API) read and write.
type BooksStore interface {
	// PostEntry records a credit or a debit and changes the balance, atomically.
	PostEntry(ctx context.Context, e *tollgate.LedgerEntry) error
	Balance(ctx context.Context, accountID string) (tollgate.Balance, error)
	// Ledger calls fn for each entry matching f, oldest first.
	Ledger(ctx context.Context, f tollgate.UsageFilter, fn func(tollgate.LedgerEntry) error) error
	// Audit returns stored totals beside the ledger's and the holds' sums.
	Audit(ctx context.Context, expiredBefore time.Time) ([]tollgate.AccountAudit, []tollgate.KeyAudit, error)
	// RecordAudit keeps an audit's run (its first tollgate.AuditProblemsKept
	// problems) and deletes the runs beyond the newest
	// tollgate.AuditRunsKept, in one transaction.
	RecordAudit(ctx context.Context, run tollgate.AuditRun) error
	// LastAudit returns the newest run recorded (by its time);
	// tollgate.ErrNotFound when none was.
	LastAudit(ctx context.Context) (tollgate.AuditRun, error)
}

// UsageRow is one group of a usage report.
type UsageRow struct {
	Account          string          `json:"account,omitzero"`
	Key              string          `json:"key,omitzero"`
	Model            string          `json:"model,omitzero"`
	Backend          string          `json:"backend,omitzero"`
	Period           string          `json:"period,omitzero"`
	Requests         int64           `json:"requests"`
	PromptTokens     int64           `json:"prompt_tokens"`
	CompletionTokens int64           `json:"completion_tokens"`
	CachedTokens     int64           `json:"cached_tokens"`
	ReasoningTokens  int64           `json:"reasoning_tokens"`
	Estimated        int64           `json:"estimated"` // requests whose tokens were counted locally
	Cost             tollgate.Amount `json:"cost"`      // charged: tokens and searches
	Uncollected      tollgate.Amount `json:"uncollected"`
	Searches         int64           `json:"searches"` // web searches that ran
}

// UsageGroups are the dimensions a usage report can group by.
var UsageGroups = []string{"account", "key", "model", "backend"}

// UsagePeriods are the time buckets a usage report can group by (UTC).
var UsagePeriods = []string{"hour", "day", "month"}

// Usage sums the charges matching f, grouped by the named dimensions
// (UsageGroups) and, when period is not "", by period (UsagePeriods).
// Rows come sorted by their group values.
func Usage(ctx context.Context, st BooksStore, f tollgate.UsageFilter, groupBy []string, period string) ([]UsageRow, error) {
	for _, g := range groupBy {
		if !slices.Contains(UsageGroups, g) {
			return nil, tollgate.Errorf(tollgate.CodeInvalidRequest, "cannot group by %q (want %s)", g, strings.Join(UsageGroups, ", "))
		}
	}
	if period != "" && !slices.Contains(UsagePeriods, period) {
		return nil, tollgate.Errorf(tollgate.CodeInvalidRequest, "period %q: want %s", period, strings.Join(UsagePeriods, ", "))
	}
	has := func(g string) bool { return slices.Contains(groupBy, g) }
	groups := map[UsageRow]*UsageRow{}
	err := st.Ledger(ctx, f, func(e tollgate.LedgerEntry) error {
		if e.Kind != tollgate.LedgerCharge || e.Charge == nil {
			return nil
		}
		c := e.Charge
		var k UsageRow
		if has("account") {
			k.Account = e.AccountID
		}
		if has("key") {
			k.Key = c.KeyID
		}
		if has("model") {
			k.Model = c.Model
		}
		if has("backend") {
			k.Backend = string(c.Class)
		}
		switch period {
		case "hour":
			k.Period = e.Time.UTC().Format("2006-01-02T15:00Z")
		case "day":
			k.Period = e.Time.UTC().Format("2006-01-02")
		case "month":
			k.Period = e.Time.UTC().Format("2006-01")
		}
		r := groups[k]
		if r == nil {
			r = &UsageRow{Account: k.Account, Key: k.Key, Model: k.Model, Backend: k.Backend, Period: k.Period}
			groups[k] = r
		}
		r.Requests++
		r.PromptTokens += c.PromptTokens
		r.CompletionTokens += c.CompletionTokens
		r.CachedTokens += c.CachedTokens
		r.ReasoningTokens += c.ReasoningTokens
		if c.Estimated {
			r.Estimated++
		}
		r.Searches += c.Searches
		var err error
		if r.Cost, err = r.Cost.Add(-e.Amount); err != nil {
			return err
		}
		if r.Uncollected, err = r.Uncollected.Add(e.Uncollected); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]UsageRow, 0, len(groups))
	for _, r := range groups {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b UsageRow) int {
		for _, p := range [][2]string{{a.Period, b.Period}, {a.Account, b.Account}, {a.Key, b.Key}, {a.Model, b.Model}, {a.Backend, b.Backend}} {
			if c := strings.Compare(p[0], p[1]); c != 0 {
				return c
			}
		}
		return 0
	})
	return out, nil
}

// AuditReport is the result of checking the books.
type AuditReport struct {
	Time     time.Time               `json:"time"`
	OK       bool                    `json:"ok"`
	Accounts int                     `json:"accounts"`
	Keys     int                     `json:"keys"`
	Balance  tollgate.Amount         `json:"balance"` // sum of all balances
	Held     tollgate.Amount         `json:"held"`
	Problems []string                `json:"problems"`
	Details  []tollgate.AccountAudit `json:"details,omitzero"`
}

// Audit checks, for every account, that balance = opening + credits −
// debits − charges + payments (the sum of its ledger), that what it owes
// is what its refund, dispute and owed_settled entries leave owed, that
// its payment entries are the credits of its credited payments (each
// payment credited once), that what is held is the sum of
// its holds and within the balance, that no hold's lease ended more than
// grace ago (a hold the sweeper should have released: orphaned), and that
// no hold whose request ended (tollgate.Hold.Ended) was marked so more
// than grace ago (stranded: the sweep releases such a hold one sweep
// interval after its mark, docs/billing.md "No hold stranded"); and for
// every key, that its spent and held totals match the ledger and the holds.
func Audit(ctx context.Context, st BooksStore, now time.Time, grace time.Duration) (AuditReport, error) {
	r := AuditReport{Time: now.UTC(), Problems: []string{}}
	accts, keys, err := st.Audit(ctx, now.Add(-grace))
	if err != nil {
		return r, err
	}
	r.Accounts, r.Keys, r.Details = len(accts), len(keys), accts
	bad := func(format string, args ...any) { r.Problems = append(r.Problems, fmt.Sprintf(format, args...)) }
	for _, a := range accts {
		r.Balance += a.Balance
		r.Held += a.Held
		sum := a.Opening + a.Credits - a.Debits - a.Charges + a.Payments
		if a.Balance != sum {
			bad("account %s: balance %s != opening %s + credits %s - debits %s - charges %s + payments %s = %s",
				a.AccountID, a.Balance, a.Opening, a.Credits, a.Debits, a.Charges, a.Payments, sum)
		}
		if a.Owed != a.OwedLedger {
			bad("account %s: owed %s != what its refund, dispute and owed_settled entries leave owed %s", a.AccountID, a.Owed, a.OwedLedger)
		}
		if a.Owed < 0 {
			bad("account %s: owed %s is below zero", a.AccountID, a.Owed)
		}
		if a.PaymentCredits != a.PaidCredits {
			bad("account %s: payment entries credit %s != the credits of its credited payments %s", a.AccountID, a.PaymentCredits, a.PaidCredits)
		}
		if a.Balance < 0 {
			bad("account %s: balance %s is below zero", a.AccountID, a.Balance)
		}
		if a.Held != a.HoldsSum {
			bad("account %s: held %s != sum of its %d holds %s", a.AccountID, a.Held, a.ActiveHolds, a.HoldsSum)
		}
		if a.Held > a.Balance {
			bad("account %s: held %s exceeds the balance %s", a.AccountID, a.Held, a.Balance)
		}
		if a.ExpiredHolds > 0 {
			bad("account %s: %d holds whose lease ended more than %s ago (orphaned: is the sweeper running?)",
				a.AccountID, a.ExpiredHolds, grace)
		}
		if n := len(a.StrandedHolds); n > 0 {
			bad("account %s: %d holds whose request ended more than %s ago are still held (stranded: neither their instance nor a sweep released them): %s",
				a.AccountID, n, grace, strings.Join(a.StrandedHolds, " "))
		}
	}
	for _, k := range keys {
		if k.Spent != k.Charges {
			bad("key %s: spent %s != sum of its charges %s", k.KeyID, k.Spent, k.Charges)
		}
		if k.Held != k.HoldsSum {
			bad("key %s: held %s != sum of its holds %s", k.KeyID, k.Held, k.HoldsSum)
		}
	}
	r.OK = len(r.Problems) == 0
	return r, nil
}

// ErrAuditNotRecorded wraps the error of an audit that ran but whose run
// could not be recorded: RunAudit's report is complete all the same.
var ErrAuditNotRecorded = errors.New("the audit ran but its result was not recorded")

// RunAudit runs Audit, times it and records the run as from source, so that
// the last audit of the books is known wherever it ran and survives
// restarts. If the audit itself fails, its error is returned. If only the
// record fails, the report is returned complete with an error wrapping
// ErrAuditNotRecorded, which callers report beside the result
// (docs/decisions.md).
func RunAudit(ctx context.Context, st BooksStore, now time.Time, grace time.Duration, source tollgate.AuditSource) (AuditReport, error) {
	now = now.UTC().Truncate(time.Microsecond)
	start := time.Now()
	r, err := Audit(ctx, st, now, grace)
	if err != nil {
		return r, err
	}
	run := tollgate.AuditRun{Time: now, Source: source, OK: r.OK, Accounts: int64(r.Accounts), Keys: int64(r.Keys),
		Balance: r.Balance, Held: r.Held, Problems: r.Problems, ProblemCount: int64(len(r.Problems)),
		Took: time.Since(start).Truncate(time.Microsecond)}
	run.Problems = run.KeptProblems()
	if err := st.RecordAudit(ctx, run); err != nil {
		return r, fmt.Errorf("%w: %w", ErrAuditNotRecorded, err)
	}
	return r, nil
}
