package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/tollgate/tollgate"
)

// The console's invitations, passwords and sessions (tollgate.ConsoleStore).

var _ tollgate.ConsoleStore = (*DB)(nil)

// CreateInvite stores an invitation; ErrNotFound if the account does not exist.
func (db *DB) CreateInvite(ctx context.Context, h tollgate.KeyHash, inv tollgate.ConsoleInvite) error {
	_, err := db.execDurable(ctx, `INSERT INTO console_invites (hash, account_id, created, expires) VALUES (?, ?, ?, ?)`,
		h.String(), inv.AccountID, toMicros(inv.Created), toMicros(inv.Expires))
	if isForeignKey(err) {
		return fmt.Errorf("account %s: %w", inv.AccountID, tollgate.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("sqlite: create invite for %s: %w", inv.AccountID, err)
	}
	return nil
}

// AcceptInvite uses up the invitation, sets the account's password and ends
// its sessions, revoking their playground keys.
func (db *DB) AcceptInvite(ctx context.Context, h tollgate.KeyHash, passwordHash string, now time.Time) (string, error) {
	var acct string
	err := db.write(ctx, func(tx *sql.Tx) error {
		err := tx.QueryRowContext(ctx, `UPDATE console_invites SET used = ? WHERE hash = ? AND used IS NULL AND expires > ? RETURNING account_id`,
			toMicros(now), h.String(), toMicros(now)).Scan(&acct)
		if errors.Is(err, sql.ErrNoRows) {
			return tollgate.ErrNotFound
		}
		if err != nil {
			return err
		}
		if _, err = tx.ExecContext(ctx, `INSERT INTO console_passwords (account_id, hash, updated) VALUES (?, ?, ?)
			ON CONFLICT (account_id) DO UPDATE SET hash = excluded.hash, updated = excluded.updated`, acct, passwordHash, toMicros(now)); err != nil {
			return err
		}
		// A new password ends the account's sessions and their playground keys.
		res, err := tx.ExecContext(ctx, `UPDATE api_keys SET revoked = ? WHERE revoked IS NULL AND id IN
			(SELECT playground_key FROM console_sessions WHERE account_id = ? AND playground_key <> '')`, toMicros(now), acct)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM console_sessions WHERE account_id = ?`, acct); err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return err
		}
		return bumpAuthVersion(ctx, tx)
	})
	if errors.Is(err, tollgate.ErrNotFound) {
		return "", fmt.Errorf("invitation: %w", tollgate.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("sqlite: accept invitation: %w", err)
	}
	return acct, nil
}

// PasswordHash returns the account's encoded password hash.
func (db *DB) PasswordHash(ctx context.Context, accountID string) (string, error) {
	var h string
	err := db.r.QueryRowContext(ctx, `SELECT hash FROM console_passwords WHERE account_id = ?`, accountID).Scan(&h)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("password of %s: %w", accountID, tollgate.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("sqlite: password of %s: %w", accountID, err)
	}
	return h, nil
}

// CreateSession stores a session and deletes the account's expired ones.
func (db *DB) CreateSession(ctx context.Context, h tollgate.KeyHash, s tollgate.ConsoleSession) error {
	err := db.write(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM console_sessions WHERE account_id = ? AND expires <= ?`,
			s.AccountID, toMicros(s.Created)); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO console_sessions (hash, account_id, created, expires, playground_key) VALUES (?, ?, ?, ?, ?)`,
			h.String(), s.AccountID, toMicros(s.Created), toMicros(s.Expires), s.PlaygroundKey)
		return err
	})
	if isForeignKey(err) {
		return fmt.Errorf("account %s: %w", s.AccountID, tollgate.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("sqlite: create session: %w", err)
	}
	return nil
}

// Session returns an unexpired session.
func (db *DB) Session(ctx context.Context, h tollgate.KeyHash, now time.Time) (tollgate.ConsoleSession, error) {
	var s tollgate.ConsoleSession
	var created, expires int64
	err := db.r.QueryRowContext(ctx, `SELECT account_id, created, expires, playground_key FROM console_sessions WHERE hash = ? AND expires > ?`,
		h.String(), toMicros(now)).Scan(&s.AccountID, &created, &expires, &s.PlaygroundKey)
	if errors.Is(err, sql.ErrNoRows) {
		return s, fmt.Errorf("session: %w", tollgate.ErrNotFound)
	}
	if err != nil {
		return s, fmt.Errorf("sqlite: session: %w", err)
	}
	s.Created, s.Expires = fromMicros(created), fromMicros(expires)
	return s, nil
}

// SetSessionKey records the session's playground key and returns the one
// it replaces, in one write transaction (SQLite's one writer makes the read
// and the update one step).
func (db *DB) SetSessionKey(ctx context.Context, h tollgate.KeyHash, keyID string) (string, error) {
	var previous string
	err := db.write(ctx, func(tx *sql.Tx) error {
		err := tx.QueryRowContext(ctx, `SELECT playground_key FROM console_sessions WHERE hash = ?`, h.String()).Scan(&previous)
		if errors.Is(err, sql.ErrNoRows) {
			return tollgate.ErrNotFound
		}
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `UPDATE console_sessions SET playground_key = ? WHERE hash = ?`, keyID, h.String())
		return err
	})
	if errors.Is(err, tollgate.ErrNotFound) {
		return "", fmt.Errorf("session: %w", tollgate.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("sqlite: set session key: %w", err)
	}
	return previous, nil
}

// DeleteSession removes the session and returns it.
func (db *DB) DeleteSession(ctx context.Context, h tollgate.KeyHash) (tollgate.ConsoleSession, error) {
	var s tollgate.ConsoleSession
	var created, expires int64
	err := db.write(ctx, func(tx *sql.Tx) error {
		return tx.QueryRowContext(ctx, `DELETE FROM console_sessions WHERE hash = ? RETURNING account_id, created, expires, playground_key`,
			h.String()).Scan(&s.AccountID, &created, &expires, &s.PlaygroundKey)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return s, fmt.Errorf("session: %w", tollgate.ErrNotFound)
	}
	if err != nil {
		return s, fmt.Errorf("sqlite: delete session: %w", err)
	}
	s.Created, s.Expires = fromMicros(created), fromMicros(expires)
	return s, nil
}

// KeyUsage returns the usage of each of the account's keys: the key's
// spent total, its charges counted on the ledger's key index alone, and the
// time of its latest charge (one index probe).
func (db *DB) KeyUsage(ctx context.Context, accountID string) ([]tollgate.KeyUsage, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT k.id, k.spent,
		(SELECT count(*) FROM ledger l WHERE l.key_id = k.id),
		(SELECT l.time FROM ledger l WHERE l.key_id = k.id ORDER BY l.seq DESC LIMIT 1)
		FROM api_keys k WHERE k.account_id = ?`, accountID)
	if err != nil {
		return nil, fmt.Errorf("sqlite: key usage: %w", err)
	}
	defer rows.Close()
	out := []tollgate.KeyUsage{}
	for rows.Next() {
		var u tollgate.KeyUsage
		var spent int64
		var last sql.NullInt64
		if err := rows.Scan(&u.KeyID, &spent, &u.Requests, &last); err != nil {
			return nil, fmt.Errorf("sqlite: key usage: %w", err)
		}
		u.Spent, u.LastUsed = tollgate.Amount(spent), fromNullMicros(last)
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: key usage: %w", err)
	}
	return out, nil
}

// RecentCharges returns charges matching f, newest first.
func (db *DB) RecentCharges(ctx context.Context, f tollgate.UsageFilter, offset, limit int) ([]tollgate.LedgerEntry, error) {
	if f.AccountID == "" {
		return nil, errors.New("sqlite: recent charges: an account is required")
	}
	q := `SELECT ` + ledgerColumns + ` FROM ledger WHERE account_id = ? AND kind = 'charge'`
	q, args := filterConds(q, []any{f.AccountID}, f)
	return db.entries(ctx, "recent charges", limit, q+` ORDER BY time DESC, seq DESC LIMIT ? OFFSET ?`, append(args, limit, offset)...)
}

// entries reads the ledger rows q selects (ledgerColumns); what names the
// read in errors, and size is how many rows to make room for.
func (db *DB) entries(ctx context.Context, what string, size int, q string, args ...any) ([]tollgate.LedgerEntry, error) {
	rows, err := db.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("sqlite: %s: %w", what, err)
	}
	defer rows.Close()
	out := make([]tollgate.LedgerEntry, 0, size)
	for rows.Next() {
		e, err := scanEntry(rows)
		if err != nil {
			return nil, fmt.Errorf("sqlite: %s: %w", what, err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: %s: %w", what, err)
	}
	return out, nil
}

// DailyCharges sums the account's charges by UTC day, key, model and class.
func (db *DB) DailyCharges(ctx context.Context, f tollgate.UsageFilter) ([]tollgate.ChargeDay, error) {
	if f.AccountID == "" {
		return nil, errors.New("sqlite: daily charges: an account is required")
	}
	q := `SELECT time / 86400000000 AS day, coalesce(key_id, ''), coalesce(model, ''), coalesce(class, ''), count(*),
		sum(prompt_tokens), sum(completion_tokens), sum(cached_tokens), sum(reasoning_tokens), sum(estimated), sum(searches),
		-sum(amount), sum(uncollected)
		FROM ledger WHERE account_id = ? AND kind = 'charge'`
	q, args := filterConds(q, []any{f.AccountID}, f)
	rows, err := db.r.QueryContext(ctx, q+` GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4`, args...)
	if err != nil {
		return nil, fmt.Errorf("sqlite: daily charges: %w", err)
	}
	defer rows.Close()
	out := []tollgate.ChargeDay{}
	for rows.Next() {
		var d tollgate.ChargeDay
		var day, cost, unc int64
		var class string
		if err := rows.Scan(&day, &d.KeyID, &d.Model, &class, &d.Requests, &d.PromptTokens, &d.CompletionTokens, &d.CachedTokens,
			&d.ReasoningTokens, &d.Estimated, &d.Searches, &cost, &unc); err != nil {
			return nil, fmt.Errorf("sqlite: daily charges: %w", err)
		}
		d.Day, d.Class, d.Cost, d.Uncollected = time.Unix(day*86400, 0).UTC(), tollgate.BackendClass(class), tollgate.Amount(cost), tollgate.Amount(unc)
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: daily charges: %w", err)
	}
	return out, nil
}

// DayMarks counts the account's ledger rows per UTC day in [since, until)
// and takes their highest seq; seq is the rowid, which ledger_account_time
// holds, so the query reads that index alone.
func (db *DB) DayMarks(ctx context.Context, accountID string, since, until time.Time) ([]tollgate.DayMark, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT time / 86400000000, count(*), max(seq) FROM ledger
		WHERE account_id = ? AND time >= ? AND time < ? GROUP BY 1 ORDER BY 1`, accountID, toMicros(since), toMicros(until))
	if err != nil {
		return nil, fmt.Errorf("sqlite: day marks: %w", err)
	}
	defer rows.Close()
	out := []tollgate.DayMark{}
	for rows.Next() {
		var m tollgate.DayMark
		var day int64
		if err := rows.Scan(&day, &m.Rows, &m.LastSeq); err != nil {
			return nil, fmt.Errorf("sqlite: day marks: %w", err)
		}
		m.Day = time.Unix(day*86400, 0).UTC()
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: day marks: %w", err)
	}
	return out, nil
}

// SpanMark counts the account's ledger rows in [since, until) and takes
// their highest seq, from ledger_account_time alone.
func (db *DB) SpanMark(ctx context.Context, accountID string, since, until time.Time) (tollgate.DayMark, error) {
	m := tollgate.DayMark{Day: since}
	var last sql.NullInt64
	err := db.r.QueryRowContext(ctx, `SELECT count(*), max(seq) FROM ledger WHERE account_id = ? AND time >= ? AND time < ?`,
		accountID, toMicros(since), toMicros(until)).Scan(&m.Rows, &last)
	if err != nil {
		return m, fmt.Errorf("sqlite: span mark: %w", err)
	}
	m.LastSeq = last.Int64
	return m, nil
}

// SavedDays reads the account's saved days in [since, until) with their
// sums, in one statement (one snapshot, so a day is read as one save wrote
// it). A day without sums comes back as one row with no sum.
func (db *DB) SavedDays(ctx context.Context, accountID string, since, until time.Time) ([]tollgate.SavedDay, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT d.day, d.ledger_rows, d.last_seq, s.day IS NOT NULL,
		coalesce(s.key_id, ''), coalesce(s.model, ''), coalesce(s.class, ''), coalesce(s.requests, 0),
		coalesce(s.prompt_tokens, 0), coalesce(s.completion_tokens, 0), coalesce(s.cached_tokens, 0), coalesce(s.reasoning_tokens, 0),
		coalesce(s.estimated, 0), coalesce(s.searches, 0), coalesce(s.cost, 0), coalesce(s.uncollected, 0)
		FROM console_days d LEFT JOIN console_day_sums s ON s.account_id = d.account_id AND s.day = d.day
		WHERE d.account_id = ? AND d.day >= ? AND d.day < ?
		ORDER BY d.day, s.key_id, s.model, s.class`, accountID, toMicros(since), toMicros(until))
	if err != nil {
		return nil, fmt.Errorf("sqlite: saved days: %w", err)
	}
	defer rows.Close()
	out := []tollgate.SavedDay{}
	for rows.Next() {
		var m tollgate.DayMark
		var d tollgate.ChargeDay
		var day, cost, unc int64
		var class string
		var sum bool
		if err := rows.Scan(&day, &m.Rows, &m.LastSeq, &sum, &d.KeyID, &d.Model, &class, &d.Requests, &d.PromptTokens, &d.CompletionTokens,
			&d.CachedTokens, &d.ReasoningTokens, &d.Estimated, &d.Searches, &cost, &unc); err != nil {
			return nil, fmt.Errorf("sqlite: saved days: %w", err)
		}
		m.Day = fromMicros(day)
		out = tollgate.AppendSavedRow(out, m, sum, d, class, cost, unc)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: saved days: %w", err)
	}
	return out, nil
}

// SaveDays replaces the given days and deletes the account's days before
// since, in one write transaction (SQLite's one writer serialises savers).
// It does not wait for the commit to be synced: the rows are a cache, and a
// day lost in a crash is summed again from the ledger.
func (db *DB) SaveDays(ctx context.Context, accountID string, since time.Time, days []tollgate.SavedDay) error {
	_, err := db.writeCommitted(ctx, func(tx *sql.Tx) error {
		// The sums are deleted with their days (ON DELETE CASCADE), and
		// explicitly below: rows left by a DELETE run without foreign keys
		// (the sqlite3 shell's default) must not join a later save.
		if _, err := tx.ExecContext(ctx, `DELETE FROM console_days WHERE account_id = ? AND day < ?`, accountID, toMicros(since)); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM console_day_sums WHERE account_id = ? AND day < ?`, accountID, toMicros(since)); err != nil {
			return err
		}
		if len(days) == 0 {
			return nil
		}
		// Prepared once for the days' many rows.
		mark, err := tx.PrepareContext(ctx, `INSERT INTO console_days (account_id, day, ledger_rows, last_seq) VALUES (?, ?, ?, ?)
			ON CONFLICT (account_id, day) DO UPDATE SET ledger_rows = excluded.ledger_rows, last_seq = excluded.last_seq`)
		if err != nil {
			return err
		}
		defer mark.Close()
		drop, err := tx.PrepareContext(ctx, `DELETE FROM console_day_sums WHERE account_id = ? AND day = ?`)
		if err != nil {
			return err
		}
		defer drop.Close()
		sum, err := tx.PrepareContext(ctx, `INSERT INTO console_day_sums (account_id, day, key_id, model, class, requests,
			prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens, estimated, searches, cost, uncollected)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
		if err != nil {
			return err
		}
		defer sum.Close()
		for _, d := range days {
			day := toMicros(d.Mark.Day)
			if _, err := mark.ExecContext(ctx, accountID, day, d.Mark.Rows, d.Mark.LastSeq); err != nil {
				return err
			}
			if _, err := drop.ExecContext(ctx, accountID, day); err != nil {
				return err
			}
			for _, s := range d.Sums {
				if _, err := sum.ExecContext(ctx, accountID, day, s.KeyID, s.Model, string(s.Class), s.Requests, s.PromptTokens, s.CompletionTokens,
					s.CachedTokens, s.ReasoningTokens, s.Estimated, s.Searches, int64(s.Cost), int64(s.Uncollected)); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if isForeignKey(err) {
		return fmt.Errorf("account %s: %w", accountID, tollgate.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("sqlite: save days of %s: %w", accountID, err)
	}
	return nil
}

// Invite returns the invitation, used or not.
func (db *DB) Invite(ctx context.Context, h tollgate.KeyHash) (tollgate.ConsoleInvite, error) {
	var inv tollgate.ConsoleInvite
	var created, expires int64
	var used sql.NullInt64
	err := db.r.QueryRowContext(ctx, `SELECT account_id, created, expires, used FROM console_invites WHERE hash = ?`, h.String()).
		Scan(&inv.AccountID, &created, &expires, &used)
	if errors.Is(err, sql.ErrNoRows) {
		return inv, fmt.Errorf("invitation: %w", tollgate.ErrNotFound)
	}
	if err != nil {
		return inv, fmt.Errorf("sqlite: invitation: %w", err)
	}
	inv.Created, inv.Expires = fromMicros(created), fromMicros(expires)
	if used.Valid {
		inv.Used = fromMicros(used.Int64)
	}
	return inv, nil
}

// ConsoleSecret returns the stored secret, storing fresh when there is none.
func (db *DB) ConsoleSecret(ctx context.Context, fresh []byte) ([]byte, error) {
	var secret []byte
	err := db.write(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO console_secret (id, secret) VALUES (1, ?) ON CONFLICT (id) DO NOTHING`, fresh); err != nil {
			return err
		}
		return tx.QueryRowContext(ctx, `SELECT secret FROM console_secret WHERE id = 1`).Scan(&secret)
	})
	if err != nil {
		return nil, fmt.Errorf("sqlite: console secret: %w", err)
	}
	return secret, nil
}

// OperatorEntries returns the account's entries other than charges, newest
// first, through the partial index of migration 0014.
func (db *DB) OperatorEntries(ctx context.Context, accountID string, limit int) ([]tollgate.LedgerEntry, error) {
	return db.entries(ctx, "operator entries", min(limit, 64), `SELECT `+ledgerColumns+` FROM ledger WHERE account_id = ? AND kind <> 'charge'
		ORDER BY seq DESC LIMIT ?`, accountID, limit)
}
