package tollgate

import (
	"context"
	"time"
)

// The console's records (package console, docs/console.md): invitations an
// operator issues to an account holder, the holder's password, and sign-in
// sessions. Tokens are 32 random base62 characters like API keys, so they
// are stored as their SHA-256 (KeyHash) for the same reason.

// ConsoleInvite is a one-time invitation to set an account's console password.
type ConsoleInvite struct {
	AccountID string
	Created   time.Time
	Expires   time.Time
	Used      time.Time // zero: not used yet
}

// ConsoleSession is a signed-in account holder.
type ConsoleSession struct {
	AccountID string
	Created   time.Time
	Expires   time.Time
	// PlaygroundKey is the id of the short-lived key created for this
	// session's playground ("" until the playground is first opened); it is
	// revoked at sign-out.
	PlaygroundKey string
}

// KeyUsage is what one key has been charged; LastUsed is the time of the
// charge recorded last.
type KeyUsage struct {
	KeyID    string
	Requests int64
	Spent    Amount
	LastUsed time.Time // zero: never used
}

// ChargeDay is the charges of one key on one model and backend class in one
// UTC day, summed as `tollgate usage` sums them.
type ChargeDay struct {
	Day              time.Time // midnight UTC
	KeyID            string
	Model            string
	Class            BackendClass
	Requests         int64
	PromptTokens     int64
	CompletionTokens int64
	CachedTokens     int64
	ReasoningTokens  int64
	Estimated        int64 // requests whose tokens were counted locally
	Searches         int64
	Cost             Amount // charged (−sum of the entries' amounts)
	Uncollected      Amount
}

// DayMark fingerprints an account's ledger rows of one UTC day: how many
// there are and the highest sequence number among them. Rows are only ever
// added, so a day whose mark is unchanged has the same rows, and the sums
// read from them before still hold (console/daycache.go).
type DayMark struct {
	Day     time.Time // midnight UTC
	Rows    int64
	LastSeq int64
}

// SavedDay is one closed day of an account's charges as the console summed
// them (DailyCharges), with the mark of the day's ledger rows they were
// summed at: the sums hold while the day's DayMark is still Mark. A day with
// ledger rows but no charge (a credit's day) has a mark and no sums.
type SavedDay struct {
	Mark DayMark
	Sums []ChargeDay // the day's, ordered as DailyCharges orders them
}

// AppendSavedRow adds one row of a stores' saved-days query, which lists
// the days in order and each day's sums after its mark (one row per sum, or
// one row without a sum for a day that has none), to out. It sets d's Day
// from m, and its Class, Cost and Uncollected from class, cost and unc.
func AppendSavedRow(out []SavedDay, m DayMark, hasSum bool, d ChargeDay, class string, cost, unc int64) []SavedDay {
	if n := len(out); n == 0 || !out[n-1].Mark.Day.Equal(m.Day) {
		out = append(out, SavedDay{Mark: m})
	}
	if hasSum {
		d.Day, d.Class, d.Cost, d.Uncollected = m.Day, BackendClass(class), Amount(cost), Amount(unc)
		last := &out[len(out)-1]
		last.Sums = append(last.Sums, d)
	}
	return out
}

// ConsoleStore keeps the console's invitations, passwords and sessions,
// answers the console's reads the billing store has no shape for, and keeps
// the console's sums of past days (a cache derived from the ledger).
type ConsoleStore interface {
	// CreateInvite stores an invitation under the hash of its token;
	// ErrNotFound if the account does not exist.
	CreateInvite(ctx context.Context, h KeyHash, inv ConsoleInvite) error
	// AcceptInvite uses up the invitation (once, before it expires), sets
	// the account's password hash and ends the account's sessions, revoking
	// their playground keys, atomically; ErrNotFound when there is no such
	// unused, unexpired invitation.
	AcceptInvite(ctx context.Context, h KeyHash, passwordHash string, now time.Time) (accountID string, err error)
	// Invite returns the invitation, used or not, expired or not;
	// ErrNotFound when there is none.
	Invite(ctx context.Context, h KeyHash) (ConsoleInvite, error)
	// ConsoleSecret returns the console's signing secret: the one stored,
	// or fresh, which it stores when none is (of callers racing, all get
	// the one stored first).
	ConsoleSecret(ctx context.Context, fresh []byte) ([]byte, error)
	// OperatorEntries returns the account's ledger entries that are not
	// charges (opening, credits, debits, payments, refunds, disputes),
	// newest first, at most limit.
	OperatorEntries(ctx context.Context, accountID string, limit int) ([]LedgerEntry, error)
	// PasswordHash returns the account's encoded password hash; ErrNotFound
	// when none was set.
	PasswordHash(ctx context.Context, accountID string) (string, error)
	// CreateSession stores a session under the hash of its token (and
	// deletes the account's expired sessions).
	CreateSession(ctx context.Context, h KeyHash, s ConsoleSession) error
	// Session returns the session; ErrNotFound when none or expired at now.
	Session(ctx context.Context, h KeyHash, now time.Time) (ConsoleSession, error)
	// SetSessionKey records the session's playground key and returns the
	// one it replaces ("" if none), atomically: of two pages asking at once,
	// each learns the key it must revoke.
	SetSessionKey(ctx context.Context, h KeyHash, keyID string) (previous string, err error)
	// DeleteSession removes the session and returns it; ErrNotFound if none.
	DeleteSession(ctx context.Context, h KeyHash) (ConsoleSession, error)
	// KeyUsage returns what each of the account's keys was charged (zero
	// for a key never used).
	KeyUsage(ctx context.Context, accountID string) ([]KeyUsage, error)
	// DailyCharges sums the charges matching f (an account is required) by
	// UTC day, key, model and backend class, oldest day first: what the
	// console's chart and CSV export read, without a row per request.
	DailyCharges(ctx context.Context, f UsageFilter) ([]ChargeDay, error)
	// DayMarks returns the mark of each UTC day in [since, until) that has
	// ledger rows of the account (of any kind), oldest first, read from the
	// (account_id, time) index without the rows themselves.
	DayMarks(ctx context.Context, accountID string, since, until time.Time) ([]DayMark, error)
	// SpanMark returns the mark of all the account's ledger rows in [since,
	// until) together (Day: since), read from the same index: a cheaper
	// check than DayMarks that nothing changed.
	SpanMark(ctx context.Context, accountID string, since, until time.Time) (DayMark, error)
	// RecentCharges returns charges matching f, newest first, skipping
	// offset and returning at most limit.
	RecentCharges(ctx context.Context, f UsageFilter, offset, limit int) ([]LedgerEntry, error)
	// SavedDays returns the account's saved days in [since, until), oldest
	// first, each read whole (its mark and its sums as one save wrote them).
	// since and until are UTC midnights (whole days), as are the days.
	SavedDays(ctx context.Context, accountID string, since, until time.Time) ([]SavedDay, error)
	// SaveDays replaces each of the given days (its mark and all its sums)
	// and deletes the account's saved days before since (a UTC midnight), in one
	// transaction: concurrent savers of a day leave one of their saves, never
	// a mix. ErrNotFound if the account does not exist.
	SaveDays(ctx context.Context, accountID string, since time.Time, days []SavedDay) error
}

// InviteTTL is how long an invitation stays usable.
const InviteTTL = 72 * time.Hour

// IssueInvite creates a one-time invitation for the account and returns its
// token (the secret part of the link, shown once) and when it expires.
func IssueInvite(ctx context.Context, st interface {
	CreateInvite(ctx context.Context, h KeyHash, inv ConsoleInvite) error
}, accountID string, now time.Time) (token string, expires time.Time, err error) {
	token = "inv-" + randomBase62(32)
	now = now.UTC().Truncate(time.Microsecond)
	expires = now.Add(InviteTTL)
	if err := st.CreateInvite(ctx, HashKey(token), ConsoleInvite{AccountID: accountID, Created: now, Expires: expires}); err != nil {
		return "", time.Time{}, err
	}
	return token, expires, nil
}

// InvitePath is the console page where an invitation's token is used.
func InvitePath(token string) string { return "/console/invite?token=" + token }
