package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// SetSessionKey records the session's playground key and returns the one
// it replaces: the row is locked by the sub-select, so a concurrent setter
// waits and then reads this one's key as its previous.
func (db *DB) SetSessionKey(ctx context.Context, h tollgate.KeyHash, keyID string) (string, error) {
	var previous string
	err := db.pool.QueryRow(ctx, `UPDATE console_sessions s SET playground_key = $2
		FROM (SELECT hash, playground_key FROM console_sessions WHERE hash = $1 FOR UPDATE) old
		WHERE s.hash = old.hash RETURNING old.playground_key`, h.String(), keyID).Scan(&previous)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("session: %w", tollgate.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("postgres: set session key: %w", err)
	}
	return previous, nil
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

// SavedDays reads the account's saved days in [since, until) with their
// sums, in one statement (one snapshot, so a day is read as one save wrote
// it). A day without sums comes back as one row with no sum.
func (db *DB) SavedDays(ctx context.Context, accountID string, since, until time.Time) ([]tollgate.SavedDay, error) {
	rows, err := db.pool.Query(ctx, `SELECT d.day, d.ledger_rows, d.last_seq, s.day IS NOT NULL,
		coalesce(s.key_id, ''), coalesce(s.model, ''), coalesce(s.class, ''), coalesce(s.requests, 0),
		coalesce(s.prompt_tokens, 0), coalesce(s.completion_tokens, 0), coalesce(s.cached_tokens, 0), coalesce(s.reasoning_tokens, 0),
		coalesce(s.estimated, 0), coalesce(s.searches, 0), coalesce(s.cost, 0), coalesce(s.uncollected, 0)
		FROM console_days d LEFT JOIN console_day_sums s ON s.account_id = d.account_id AND s.day = d.day
		WHERE d.account_id = $1 AND d.day >= $2::date AND d.day < $3::date
		ORDER BY d.day, s.key_id, s.model, s.class`, accountID, since.UTC(), until.UTC()) // dates of UTC days
	if err != nil {
		return nil, fmt.Errorf("postgres: saved days: %w", err)
	}
	defer rows.Close()
	out := []tollgate.SavedDay{}
	for rows.Next() {
		var m tollgate.DayMark
		var d tollgate.ChargeDay
		var day time.Time
		var cost, unc int64
		var class string
		var sum bool
		if err := rows.Scan(&day, &m.Rows, &m.LastSeq, &sum, &d.KeyID, &d.Model, &class, &d.Requests, &d.PromptTokens, &d.CompletionTokens,
			&d.CachedTokens, &d.ReasoningTokens, &d.Estimated, &d.Searches, &cost, &unc); err != nil {
			return nil, fmt.Errorf("postgres: saved days: %w", err)
		}
		m.Day = time.Unix(day.Unix(), 0).UTC() // as DayMarks gives it
		out = tollgate.AppendSavedRow(out, m, sum, d, class, cost, unc)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("postgres: saved days: %w", err)
	}
	return out, nil
}

// SaveDays replaces the given days and deletes the account's days before
// since, in one transaction sent as one batch, committed without waiting
// for the WAL's flush. A day's mark is written
// first: its row lock makes a concurrent saver of the same day wait until
// this one commits, then replace all of its sums (under READ COMMITTED each
// statement sees what committed before it), so the day ends up as one
// saver's, never a mix.
func (db *DB) SaveDays(ctx context.Context, accountID string, since time.Time, days []tollgate.SavedDay) error {
	// Days in order, so that savers of overlapping days lock them in the
	// same order.
	days = slices.SortedFunc(slices.Values(days), func(a, b tollgate.SavedDay) int { return a.Mark.Day.Compare(b.Mark.Day) })
	// Each column as an array, for unnest: one statement per table.
	var dayList, sumDay []time.Time
	var dayRows, dayLast []int64
	var keys, models, classes []string
	var reqs, prompt, completion, cached, reasoning, est, searches, cost, unc []int64
	for _, d := range days {
		dayList, dayRows, dayLast = append(dayList, d.Mark.Day.UTC()), append(dayRows, d.Mark.Rows), append(dayLast, d.Mark.LastSeq)
		for _, s := range d.Sums {
			sumDay, keys, models, classes = append(sumDay, d.Mark.Day.UTC()), append(keys, s.KeyID), append(models, s.Model), append(classes, string(s.Class))
			reqs, prompt, completion = append(reqs, s.Requests), append(prompt, s.PromptTokens), append(completion, s.CompletionTokens)
			cached, reasoning, est = append(cached, s.CachedTokens), append(reasoning, s.ReasoningTokens), append(est, s.Estimated)
			searches, cost, unc = append(searches, s.Searches), append(cost, int64(s.Cost)), append(unc, int64(s.Uncollected))
		}
	}
	err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		// The rows are a cache: the commit need not wait for the WAL's
		// flush, and a save lost in a crash is a day summed again.
		b.Queue(`SET LOCAL synchronous_commit TO off`)
		// The sums go with their days (ON DELETE CASCADE).
		b.Queue(`DELETE FROM console_days WHERE account_id = $1 AND day < $2::date`, accountID, since.UTC())
		if len(days) > 0 {
			b.Queue(`INSERT INTO console_days (account_id, day, ledger_rows, last_seq)
				SELECT $1, * FROM unnest($2::date[], $3::bigint[], $4::bigint[])
				ON CONFLICT (account_id, day) DO UPDATE SET ledger_rows = excluded.ledger_rows, last_seq = excluded.last_seq`,
				accountID, dayList, dayRows, dayLast)
			b.Queue(`DELETE FROM console_day_sums WHERE account_id = $1 AND day = ANY($2::date[])`, accountID, dayList)
		}
		if len(sumDay) > 0 {
			b.Queue(`INSERT INTO console_day_sums (account_id, day, key_id, model, class, requests, prompt_tokens, completion_tokens,
				cached_tokens, reasoning_tokens, estimated, searches, cost, uncollected)
				SELECT $1, * FROM unnest($2::date[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::bigint[], $8::bigint[],
					$9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[], $13::bigint[], $14::bigint[])`,
				accountID, sumDay, keys, models, classes, reqs, prompt, completion, cached, reasoning, est, searches, cost, unc)
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if pgCode(err) == foreignKeyViolation {
		return fmt.Errorf("account %s: %w", accountID, tollgate.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("postgres: save days of %s: %w", accountID, err)
	}
	return nil
}

// Invite returns the invitation, used or not.
func (db *DB) Invite(ctx context.Context, h tollgate.KeyHash) (tollgate.ConsoleInvite, error) {
	var inv tollgate.ConsoleInvite
	var used *time.Time
	err := db.pool.QueryRow(ctx, `SELECT account_id, created, expires, used FROM console_invites WHERE hash = $1`, h.String()).
		Scan(&inv.AccountID, &inv.Created, &inv.Expires, &used)
	if errors.Is(err, pgx.ErrNoRows) {
		return inv, fmt.Errorf("invitation: %w", tollgate.ErrNotFound)
	}
	if err != nil {
		return inv, fmt.Errorf("postgres: invitation: %w", err)
	}
	inv.Created, inv.Expires = inv.Created.UTC(), inv.Expires.UTC()
	if used != nil {
		inv.Used = used.UTC()
	}
	return inv, nil
}

// ConsoleSecret returns the stored secret, storing fresh when there is none.
// The read is a statement of its own: it sees the row of a racing insert
// that the insert above waited for.
func (db *DB) ConsoleSecret(ctx context.Context, fresh []byte) ([]byte, error) {
	if _, err := db.pool.Exec(ctx, `INSERT INTO console_secret (id, secret) VALUES (1, $1) ON CONFLICT (id) DO NOTHING`, fresh); err != nil {
		return nil, fmt.Errorf("postgres: console secret: %w", err)
	}
	var secret []byte
	if err := db.pool.QueryRow(ctx, `SELECT secret FROM console_secret WHERE id = 1`).Scan(&secret); err != nil {
		return nil, fmt.Errorf("postgres: console secret: %w", err)
	}
	return secret, nil
}

// OperatorEntries returns the account's entries other than charges, newest
// first, through the partial index of migration 0014.
func (db *DB) OperatorEntries(ctx context.Context, accountID string, limit int) ([]tollgate.LedgerEntry, error) {
	rows, err := db.pool.Query(ctx, `SELECT `+ledgerColumns+` FROM ledger WHERE account_id = $1 AND kind <> 'charge'
		ORDER BY seq DESC LIMIT $2`, accountID, limit)
	if err != nil {
		return nil, fmt.Errorf("postgres: operator entries: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanEntry)
	if err != nil {
		return nil, fmt.Errorf("postgres: operator entries: %w", err)
	}
	return out, nil
}
