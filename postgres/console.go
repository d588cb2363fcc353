package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tollgate/tollgate"
)

// The console's invitations, passwords and sessions (tollgate.ConsoleStore).

var _ tollgate.ConsoleStore = (*DB)(nil)

// CreateInvite stores an invitation; ErrNotFound if the account does not exist.
func (db *DB) CreateInvite(ctx context.Context, h tollgate.KeyHash, inv tollgate.ConsoleInvite) error {
	_, err := db.pool.Exec(ctx, `INSERT INTO console_invites (hash, account_id, created, expires) VALUES ($1, $2, $3, $4)`,
		h.String(), inv.AccountID, inv.Created, inv.Expires)
	if pgCode(err) == foreignKeyViolation {
		return fmt.Errorf("account %s: %w", inv.AccountID, tollgate.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("postgres: create invite for %s: %w", inv.AccountID, err)
	}
	return nil
}

// AcceptInvite uses up the invitation, sets the account's password and ends
// its sessions, revoking their playground keys, in one statement.
func (db *DB) AcceptInvite(ctx context.Context, h tollgate.KeyHash, passwordHash string, now time.Time) (string, error) {
	var acct string
	err := db.pool.QueryRow(ctx, `WITH used AS (
			UPDATE console_invites SET used = $3 WHERE hash = $1 AND used IS NULL AND expires > $3 RETURNING account_id),
		set AS (INSERT INTO console_passwords (account_id, hash, updated) SELECT account_id, $2, $3 FROM used
			ON CONFLICT (account_id) DO UPDATE SET hash = excluded.hash, updated = excluded.updated),
		ended AS (DELETE FROM console_sessions WHERE account_id IN (SELECT account_id FROM used) RETURNING playground_key),
		revoked AS (UPDATE api_keys SET revoked = $3 WHERE revoked IS NULL
			AND id IN (SELECT playground_key FROM ended WHERE playground_key <> '') RETURNING 1),
		bumped AS (`+bumpAuthVersion+` AND EXISTS (SELECT 1 FROM revoked))
		SELECT account_id FROM used`, h.String(), passwordHash, now).Scan(&acct)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("invitation: %w", tollgate.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("postgres: accept invitation: %w", err)
	}
	return acct, nil
}

// PasswordHash returns the account's encoded password hash.
func (db *DB) PasswordHash(ctx context.Context, accountID string) (string, error) {
	var h string
	err := db.pool.QueryRow(ctx, `SELECT hash FROM console_passwords WHERE account_id = $1`, accountID).Scan(&h)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("password of %s: %w", accountID, tollgate.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("postgres: password of %s: %w", accountID, err)
	}
	return h, nil
}

// CreateSession stores a session and deletes the account's expired ones.
func (db *DB) CreateSession(ctx context.Context, h tollgate.KeyHash, s tollgate.ConsoleSession) error {
	_, err := db.pool.Exec(ctx, `WITH gone AS (DELETE FROM console_sessions WHERE account_id = $2 AND expires <= $3)
		INSERT INTO console_sessions (hash, account_id, created, expires, playground_key) VALUES ($1, $2, $3, $4, $5)`,
		h.String(), s.AccountID, s.Created, s.Expires, s.PlaygroundKey)
	if pgCode(err) == foreignKeyViolation {
		return fmt.Errorf("account %s: %w", s.AccountID, tollgate.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("postgres: create session: %w", err)
	}
	return nil
}

func scanSession(row pgx.Row) (tollgate.ConsoleSession, error) {
	var s tollgate.ConsoleSession
	err := row.Scan(&s.AccountID, &s.Created, &s.Expires, &s.PlaygroundKey)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, fmt.Errorf("session: %w", tollgate.ErrNotFound)
	}
	if err != nil {
		return s, fmt.Errorf("postgres: session: %w", err)
	}
	s.Created, s.Expires = s.Created.UTC(), s.Expires.UTC()
	return s, nil
}

// Session returns an unexpired session.
func (db *DB) Session(ctx context.Context, h tollgate.KeyHash, now time.Time) (tollgate.ConsoleSession, error) {
	return scanSession(db.pool.QueryRow(ctx, `SELECT account_id, created, expires, playground_key FROM console_sessions
		WHERE hash = $1 AND expires > $2`, h.String(), now))
}

// SetSessionKey records the session's playground key.
func (db *DB) SetSessionKey(ctx context.Context, h tollgate.KeyHash, keyID string) error {
	tag, err := db.pool.Exec(ctx, `UPDATE console_sessions SET playground_key = $2 WHERE hash = $1`, h.String(), keyID)
	if err != nil {
		return fmt.Errorf("postgres: set session key: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("session: %w", tollgate.ErrNotFound)
	}
	return nil
}

// DeleteSession removes the session and returns it.
func (db *DB) DeleteSession(ctx context.Context, h tollgate.KeyHash) (tollgate.ConsoleSession, error) {
	return scanSession(db.pool.QueryRow(ctx, `DELETE FROM console_sessions WHERE hash = $1
		RETURNING account_id, created, expires, playground_key`, h.String()))
}

// KeyUsage returns the usage of each of the account's keys: the key's
// spent total, its charges counted on the ledger's key index, and the time
// of its latest charge.
func (db *DB) KeyUsage(ctx context.Context, accountID string) ([]tollgate.KeyUsage, error) {
	rows, err := db.pool.Query(ctx, `SELECT k.id, k.spent,
		(SELECT count(*) FROM ledger l WHERE l.key_id = k.id),
		(SELECT l.time FROM ledger l WHERE l.key_id = k.id ORDER BY l.seq DESC LIMIT 1)
		FROM api_keys k WHERE k.account_id = $1`, accountID)
	if err != nil {
		return nil, fmt.Errorf("postgres: key usage: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (tollgate.KeyUsage, error) {
		var u tollgate.KeyUsage
		var spent int64
		var last *time.Time
		err := r.Scan(&u.KeyID, &spent, &u.Requests, &last)
		u.Spent, u.LastUsed = tollgate.Amount(spent), fromNullTime(last)
		return u, err
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: key usage: %w", err)
	}
	if out == nil {
		out = []tollgate.KeyUsage{}
	}
	return out, nil
}

// RecentCharges returns charges matching f, newest first.
func (db *DB) RecentCharges(ctx context.Context, f tollgate.UsageFilter, offset, limit int) ([]tollgate.LedgerEntry, error) {
	if f.AccountID == "" {
		return nil, errors.New("postgres: recent charges: an account is required")
	}
	q := `SELECT ` + ledgerColumns + ` FROM ledger WHERE account_id = $1 AND kind = 'charge'`
	q, args := filterConds(q, []any{f.AccountID}, f)
	q += fmt.Sprintf(` ORDER BY time DESC, seq DESC LIMIT $%d OFFSET $%d`, len(args)+1, len(args)+2)
	rows, err := db.pool.Query(ctx, q, append(args, limit, offset)...)
	if err != nil {
		return nil, fmt.Errorf("postgres: recent charges: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanEntry)
	if err != nil {
		return nil, fmt.Errorf("postgres: recent charges: %w", err)
	}
	return out, nil
}

// DailyCharges sums the account's charges by UTC day, key, model and class.
func (db *DB) DailyCharges(ctx context.Context, f tollgate.UsageFilter) ([]tollgate.ChargeDay, error) {
	if f.AccountID == "" {
		return nil, errors.New("postgres: daily charges: an account is required")
	}
	q := `SELECT floor(extract(epoch FROM time) / 86400)::bigint AS day, coalesce(key_id, ''), coalesce(model, ''), coalesce(class, ''),
		count(*), sum(prompt_tokens)::bigint, sum(completion_tokens)::bigint, sum(cached_tokens)::bigint, sum(reasoning_tokens)::bigint,
		count(*) FILTER (WHERE estimated), sum(searches)::bigint, -sum(amount)::bigint, sum(uncollected)::bigint
		FROM ledger WHERE account_id = $1 AND kind = 'charge'`
	q, args := filterConds(q, []any{f.AccountID}, f)
	rows, err := db.pool.Query(ctx, q+` GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4`, args...)
	if err != nil {
		return nil, fmt.Errorf("postgres: daily charges: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (tollgate.ChargeDay, error) {
		var d tollgate.ChargeDay
		var day, cost, unc int64
		var class string
		err := r.Scan(&day, &d.KeyID, &d.Model, &class, &d.Requests, &d.PromptTokens, &d.CompletionTokens, &d.CachedTokens,
			&d.ReasoningTokens, &d.Estimated, &d.Searches, &cost, &unc)
		d.Day, d.Class, d.Cost, d.Uncollected = time.Unix(day*86400, 0).UTC(), tollgate.BackendClass(class), tollgate.Amount(cost), tollgate.Amount(unc)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: daily charges: %w", err)
	}
	if out == nil {
		out = []tollgate.ChargeDay{}
	}
	return out, nil
}

// DayMarks counts the account's ledger rows per UTC day in [since, until)
// and takes their highest seq.
func (db *DB) DayMarks(ctx context.Context, accountID string, since, until time.Time) ([]tollgate.DayMark, error) {
	rows, err := db.pool.Query(ctx, `SELECT floor(extract(epoch FROM time) / 86400)::bigint, count(*), max(seq) FROM ledger
		WHERE account_id = $1 AND time >= $2 AND time < $3 GROUP BY 1 ORDER BY 1`, accountID, since, until)
	if err != nil {
		return nil, fmt.Errorf("postgres: day marks: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (tollgate.DayMark, error) {
		var m tollgate.DayMark
		var day int64
		err := r.Scan(&day, &m.Rows, &m.LastSeq)
		m.Day = time.Unix(day*86400, 0).UTC()
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: day marks: %w", err)
	}
	if out == nil {
		out = []tollgate.DayMark{}
	}
	return out, nil
}

// SpanMark counts the account's ledger rows in [since, until) and takes
// their highest seq.
func (db *DB) SpanMark(ctx context.Context, accountID string, since, until time.Time) (tollgate.DayMark, error) {
	m := tollgate.DayMark{Day: since}
	err := db.pool.QueryRow(ctx, `SELECT count(*), coalesce(max(seq), 0) FROM ledger WHERE account_id = $1 AND time >= $2 AND time < $3`,
		accountID, since, until).Scan(&m.Rows, &m.LastSeq)
	if err != nil {
		return m, fmt.Errorf("postgres: span mark: %w", err)
	}
	return m, nil
}
