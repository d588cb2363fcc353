package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/paystore"
)

// The billing store: holds, the ledger and key rate windows (migration
// 0002_billing, docs/billing.md). The three operations are PL/pgSQL functions
// (tollgate_hold, tollgate_settle, tollgate_release) that lock the account
// row (SELECT ... FOR UPDATE) before checking it, so no two instances can
// both spend the same free balance; a batch of them goes to the server in
// one round trip and commits once.

const (
	reservationGone      = "P0002" // raised by tollgate_take
	deadlockDetected     = "40P01"
	serializationFailure = "40001"
)

// opAccount is the account whose row an op locks first (for the lock order).
func opAccount(op *tollgate.BillingOp) string {
	if op.Kind == tollgate.OpSettle || op.Kind == tollgate.OpCharge {
		return op.Charge.AccountID
	}
	return op.Hold.AccountID // OpRelease: the caller may set it to order the lock
}

// ApplyBilling applies ops in one transaction and fills in their results.
// Ops are sent in account order (stable, so one account's ops keep theirs):
// every transaction locks account rows in ascending order, so concurrent
// batches of several instances cannot deadlock on each other. A deadlock with
// anything else is retried. An error wraps tollgate.ErrNotApplied unless
// it is a COMMIT's that got no answer (the batch may have been committed).
func (db *DB) ApplyBilling(ctx context.Context, ops []*tollgate.BillingOp) error {
	sorted := slices.Clone(ops)
	slices.SortStableFunc(sorted, func(a, b *tollgate.BillingOp) int { return strings.Compare(opAccount(a), opAccount(b)) })
	var err error
	var committing bool
	for attempt := 0; attempt < 5; attempt++ {
		committing, err = db.applyTx(ctx, sorted, len(sorted) > 1)
		if pgCode(err) == reservationGone {
			// A reservation was swept: charge by charge, those come from
			// the free balance alone.
			committing, err = db.applyTx(ctx, sorted, false)
		}
		if c := pgCode(err); c != deadlockDetected && c != serializationFailure {
			break
		}
	}
	if err != nil {
		// Only a COMMIT sent without an answer leaves the batch unknown:
		// one the server answered with an error was rolled back, and one
		// that failed before any byte went out was never sent.
		var pe *pgconn.PgError
		if !committing || errors.As(err, &pe) || pgconn.SafeToRetry(err) {
			return fmt.Errorf("postgres: billing batch of %d %w: %w", len(ops), tollgate.ErrNotApplied, err)
		}
		return fmt.Errorf("postgres: billing batch of %d: %w", len(ops), err)
	}
	return nil
}

// applyTx applies ops in one transaction; committing reports that its error,
// if any, is the COMMIT's.
func (db *DB) applyTx(ctx context.Context, ops []*tollgate.BillingOp, sum bool) (committing bool, err error) {
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	if err := applyBatch(ctx, tx, ops, sum); err != nil {
		_ = tx.Rollback(ctx) // the error to report is the batch's
		return false, err
	}
	return true, tx.Commit(ctx)
}

// summed reports whether op is a charge its reservation covers, which
// applyBatch writes as a ledger insert plus one tollgate_take per reservation.
func summed(op *tollgate.BillingOp, sum bool) bool {
	return sum && op.Kind == tollgate.OpCharge && op.Charge.Cost <= op.Covered && !op.Recovered
}

func applyBatch(ctx context.Context, tx pgx.Tx, ops []*tollgate.BillingOp, sum bool) error {
	b := &pgx.Batch{}
	// Summed charges: the reservation's take (which locks the account row
	// first, in account order) goes before the first of its ledger rows.
	taken := map[string]bool{}
	type take struct {
		account, key   string
		taken, charged int64
	}
	takes := map[string]*take{}
	for _, op := range ops {
		if summed(op, sum) {
			t := takes[op.Reservation]
			if t == nil {
				t = &take{account: op.Charge.AccountID, key: op.Charge.KeyID}
				takes[op.Reservation] = t
			}
			t.taken += int64(op.Covered + op.Return)
			t.charged += int64(op.Charge.Cost)
		}
	}
	for _, op := range ops {
		if summed(op, sum) {
			c := &op.Charge
			if !taken[op.Reservation] {
				taken[op.Reservation] = true
				t := takes[op.Reservation]
				b.Queue(`SELECT tollgate_take($1, $2, $3, $4, $5)`, op.Reservation, t.account, t.key, t.taken, t.charged)
			}
			id := c.RequestID
			if id == "" {
				id = op.HoldID
			}
			b.Queue(`INSERT INTO ledger (id, kind, account_id, amount, time, hold_id, key_id, model, class, node,
				prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens, input_rate, output_rate, cost, uncollected, estimated,
				searches, search_price)
				VALUES ($1, 'charge', $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, 0, $17, $18, $19)`,
				id, c.AccountID, -int64(c.Cost), c.Time, op.HoldID, c.KeyID, c.Model, string(c.Class), c.Node, c.PromptTokens,
				c.CompletionTokens, c.CachedTokens, c.ReasoningTokens, int64(c.Prices.Input), int64(c.Prices.Output), int64(c.Cost), c.Estimated,
				c.Searches, int64(c.SearchPrice))
			continue
		}
		switch op.Kind {
		case tollgate.OpReserve:
			h := &op.Hold
			b.Queue(`SELECT outcome, free, granted, gone FROM tollgate_reserve($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
				h.ID, h.AccountID, h.KeyID, h.Owner, h.Created, h.Expires, int64(h.Amount), int64(op.Need), int64(op.MinFree),
				op.Fraction, op.Create)
		case tollgate.OpReturn:
			if op.ReturnAll {
				b.Queue(`SELECT gone, returned FROM tollgate_return_all($1, $2)`, op.Reservation, op.Hold.AccountID)
			} else {
				b.Queue(`SELECT tollgate_return($1, $2, $3)`, op.Reservation, op.Hold.AccountID, int64(op.Return))
			}
		case tollgate.OpCharge:
			c := &op.Charge
			id := c.RequestID
			if id == "" {
				id = op.HoldID
			}
			b.Queue(`SELECT charged, uncollected, replayed, gone FROM tollgate_charge($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)`,
				op.HoldID, op.Reservation, id, c.AccountID, c.KeyID, c.Model, string(c.Class), c.Node, c.PromptTokens, c.CompletionTokens,
				c.CachedTokens, c.ReasoningTokens, int64(c.Prices.Input), int64(c.Prices.Output), int64(c.Cost), int64(op.Covered),
				int64(op.Return), c.Estimated, c.Time, c.Searches, int64(c.SearchPrice))
		case tollgate.OpHold:
			h := &op.Hold
			b.Queue(`SELECT outcome, free, retry_minute FROM tollgate_hold($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
				h.ID, h.RequestID, h.AccountID, h.KeyID, h.Model, string(h.Class), int64(h.Amount), h.Tokens, h.Minute,
				h.Owner, h.Created, h.Expires)
		case tollgate.OpSettle:
			c := &op.Charge
			id := c.RequestID
			if id == "" {
				id = op.HoldID
			}
			b.Queue(`SELECT charged, uncollected, replayed FROM tollgate_settle($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)`,
				op.HoldID, id, c.AccountID, c.KeyID, c.Model, string(c.Class), c.Node, c.PromptTokens, c.CompletionTokens,
				c.CachedTokens, c.ReasoningTokens, int64(c.Prices.Input), int64(c.Prices.Output), int64(c.Cost), c.Estimated, c.Time,
				c.Searches, int64(c.SearchPrice))
		case tollgate.OpRelease:
			b.Queue(`SELECT tollgate_release($1)`, op.HoldID)
		default:
			return fmt.Errorf("unknown op kind %d", op.Kind)
		}
	}
	br := tx.SendBatch(ctx, b)
	taken = map[string]bool{}
	for _, op := range ops {
		var err error
		if summed(op, sum) {
			if !taken[op.Reservation] {
				taken[op.Reservation] = true
				if _, err := br.Exec(); err != nil {
					br.Close()
					return err
				}
			}
			if _, err := br.Exec(); err != nil {
				br.Close()
				return err
			}
			op.Charged, op.Uncollected, op.Replayed, op.Gone = op.Charge.Cost, 0, false, false
			continue
		}
		switch op.Kind {
		case tollgate.OpReserve:
			var outcome int32
			var free, granted int64
			err = br.QueryRow().Scan(&outcome, &free, &granted, &op.Gone)
			op.Outcome, op.Free, op.Granted = tollgate.HoldOutcome(outcome), tollgate.Amount(free), tollgate.Amount(granted)
		case tollgate.OpReturn:
			if op.ReturnAll {
				var returned int64
				err = br.QueryRow().Scan(&op.Gone, &returned)
				op.Returned = tollgate.Amount(returned)
			} else {
				err = br.QueryRow().Scan(&op.Gone)
				op.Returned = 0
				if !op.Gone {
					op.Returned = op.Return
				}
			}
		case tollgate.OpCharge:
			var charged, uncollected int64
			err = br.QueryRow().Scan(&charged, &uncollected, &op.Replayed, &op.Gone)
			op.Charged, op.Uncollected = tollgate.Amount(charged), tollgate.Amount(uncollected)
		case tollgate.OpHold:
			var outcome int32
			var free, retry int64
			err = br.QueryRow().Scan(&outcome, &free, &retry)
			op.Outcome, op.Free = tollgate.HoldOutcome(outcome), tollgate.Amount(free)
			op.RetryAt = time.Time{}
			if retry != 0 {
				op.RetryAt = time.Unix(retry*60, 0).UTC()
			}
		case tollgate.OpSettle:
			var charged, uncollected int64
			err = br.QueryRow().Scan(&charged, &uncollected, &op.Replayed)
			op.Charged, op.Uncollected = tollgate.Amount(charged), tollgate.Amount(uncollected)
		case tollgate.OpRelease:
			var released bool
			err = br.QueryRow().Scan(&released)
			op.Replayed = !released
		}
		if err != nil {
			br.Close()
			return err
		}
	}
	return br.Close()
}

// RenewHolds extends the lease of every hold owned by owner, created after
// createdAfter and not marked ended (EndHolds) to expires, and returns how
// many it renewed.
func (db *DB) RenewHolds(ctx context.Context, owner string, expires, createdAfter time.Time) (int64, error) {
	tag, err := db.pool.Exec(ctx, `UPDATE holds SET expires = $1 WHERE owner = $2 AND (created > $3 OR request_id = '') AND expires < $1
		AND ended IS NULL`, expires, owner, createdAfter)
	if err != nil {
		return 0, fmt.Errorf("postgres: renew holds of %s: %w", owner, err)
	}
	return tag.RowsAffected(), nil
}

// EndHolds marks the holds ids as ended at (their request ended, but their
// settle or release could not be written): RenewHolds no longer extends
// them, SweepHolds releases them once the mark is old enough, and the audit
// reports them when it is older than its grace. A hold already marked keeps
// its first mark; one that is gone is skipped. It returns how many it marked.
func (db *DB) EndHolds(ctx context.Context, ids []string, at time.Time) (int64, error) {
	tag, err := db.pool.Exec(ctx, `UPDATE holds SET ended = $1 WHERE id = ANY($2) AND ended IS NULL AND request_id <> ''`, at, ids)
	if err != nil {
		return 0, fmt.Errorf("postgres: mark %d holds ended: %w", len(ids), err)
	}
	return tag.RowsAffected(), nil
}

// SweepHolds releases up to limit holds whose lease ended before now, or
// that were marked ended (EndHolds) before endedBefore, and returns them; it
// also drops rate windows older than two minutes.
func (db *DB) SweepHolds(ctx context.Context, now, endedBefore time.Time, limit int) ([]tollgate.Hold, error) {
	rows, err := db.pool.Query(ctx, `SELECT `+holdColumns+` FROM holds WHERE expires < $1 OR ended < $2
		ORDER BY account_id LIMIT $3`, now, endedBefore, limit)
	if err != nil {
		return nil, fmt.Errorf("postgres: sweep holds: %w", err)
	}
	hs, err := pgx.CollectRows(rows, scanHold)
	if err != nil {
		return nil, fmt.Errorf("postgres: sweep holds: %w", err)
	}
	var out []tollgate.Hold
	if len(hs) > 0 {
		ops := make([]*tollgate.BillingOp, len(hs))
		for i, h := range hs {
			ops[i] = &tollgate.BillingOp{Kind: tollgate.OpRelease, HoldID: h.ID, Hold: tollgate.Hold{AccountID: h.AccountID}}
		}
		if err := db.ApplyBilling(ctx, ops); err != nil {
			return nil, err
		}
		for i, op := range ops {
			if !op.Replayed {
				out = append(out, hs[i])
			}
		}
	}
	if _, err := db.pool.Exec(ctx, `DELETE FROM key_windows WHERE minute < $1`, now.Unix()/60-2); err != nil {
		return out, fmt.Errorf("postgres: sweep rate windows: %w", err)
	}
	return out, nil
}

const holdColumns = `id, request_id, account_id, key_id, model, class, amount, tokens, minute, owner, created, expires, ended`

func scanHold(row pgx.CollectableRow) (tollgate.Hold, error) {
	var h tollgate.Hold
	var class string
	var amount int64
	var ended *time.Time
	err := row.Scan(&h.ID, &h.RequestID, &h.AccountID, &h.KeyID, &h.Model, &class, &amount, &h.Tokens, &h.Minute,
		&h.Owner, &h.Created, &h.Expires, &ended)
	h.Class, h.Amount = tollgate.BackendClass(class), tollgate.Amount(amount)
	h.Created, h.Expires = h.Created.UTC(), h.Expires.UTC()
	if ended != nil {
		h.Ended = ended.UTC()
	}
	return h, err
}

// Holds returns the active holds of an account ("" for all), oldest first.
func (db *DB) Holds(ctx context.Context, accountID string) ([]tollgate.Hold, error) {
	rows, err := db.pool.Query(ctx, `SELECT `+holdColumns+` FROM holds WHERE $1 = '' OR account_id = $1 ORDER BY created, id`, accountID)
	if err != nil {
		return nil, fmt.Errorf("postgres: holds: %w", err)
	}
	hs, err := pgx.CollectRows(rows, scanHold)
	if err != nil {
		return nil, fmt.Errorf("postgres: holds: %w", err)
	}
	return hs, nil
}

// PostEntry records an operator's credit or debit (e.Kind) of e.Amount on
// e.AccountID and changes the balance in the same transaction. A debit may
// not take more than the free balance (balance − held): 402
// insufficient_balance. It fills in e.Seq and the signed e.Amount.
func (db *DB) PostEntry(ctx context.Context, e *tollgate.LedgerEntry) error {
	signed, err := e.OperatorAmount()
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		var balance, held int64
		err := tx.QueryRow(ctx, `SELECT balance, held FROM accounts WHERE id = $1 FOR UPDATE`, e.AccountID).Scan(&balance, &held)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("account %s: %w", e.AccountID, tollgate.ErrNotFound)
		}
		if err != nil {
			return err
		}
		if err := tollgate.CheckOperatorEntry(signed, tollgate.Amount(balance), tollgate.Amount(held)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + $1 WHERE id = $2`, int64(signed), e.AccountID); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `INSERT INTO ledger (id, kind, account_id, amount, note, time, actor) VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING seq`,
			e.ID, string(e.Kind), e.AccountID, int64(signed), e.Note, e.Time, e.Actor).Scan(&e.Seq)
	})
	if pgCode(err) == uniqueViolation {
		return conflict("ledger entry "+e.ID, err)
	}
	if err != nil {
		var te *tollgate.Error
		if errors.As(err, &te) || errors.Is(err, tollgate.ErrNotFound) {
			return err
		}
		return fmt.Errorf("postgres: post %s on %s: %w", e.Kind, e.AccountID, err)
	}
	e.Amount = signed
	return nil
}

// Balance returns an account's settled balance and what is held.
func (db *DB) Balance(ctx context.Context, accountID string) (tollgate.Balance, error) {
	b := tollgate.Balance{AccountID: accountID}
	var balance, held int64
	err := db.pool.QueryRow(ctx, `SELECT balance, held FROM accounts WHERE id = $1`, accountID).Scan(&balance, &held)
	if errors.Is(err, pgx.ErrNoRows) {
		return b, fmt.Errorf("account %s: %w", accountID, tollgate.ErrNotFound)
	}
	if err != nil {
		return b, fmt.Errorf("postgres: balance of %s: %w", accountID, err)
	}
	b.Balance, b.Held, b.Free = tollgate.Amount(balance), tollgate.Amount(held), tollgate.Amount(balance-held)
	return b, nil
}

const ledgerColumns = `seq, id, kind, account_id, amount, note, time, coalesce(hold_id, ''), coalesce(key_id, ''),
	coalesce(model, ''), coalesce(class, ''), coalesce(node, ''), prompt_tokens, completion_tokens, cached_tokens,
	reasoning_tokens, input_rate, output_rate, cost, uncollected, estimated, searches, search_price, actor`

func scanEntry(row pgx.CollectableRow) (tollgate.LedgerEntry, error) {
	var e tollgate.LedgerEntry
	var kind, class string
	var amount, in, out, cost, unc, price int64
	var c tollgate.Charge
	if err := row.Scan(&e.Seq, &e.ID, &kind, &e.AccountID, &amount, &e.Note, &e.Time, &e.HoldID, &c.KeyID, &c.Model, &class, &c.Node,
		&c.PromptTokens, &c.CompletionTokens, &c.CachedTokens, &c.ReasoningTokens, &in, &out, &cost, &unc, &c.Estimated,
		&c.Searches, &price, &e.Actor); err != nil {
		return e, err
	}
	e.Kind, e.Amount, e.Time, e.Uncollected = tollgate.LedgerKind(kind), tollgate.Amount(amount), e.Time.UTC(), tollgate.Amount(unc)
	if e.Kind == tollgate.LedgerCharge {
		c.RequestID, c.AccountID, c.Class, c.Time = e.ID, e.AccountID, tollgate.BackendClass(class), e.Time
		c.Prices, c.Cost = tollgate.Prices{Input: tollgate.Rate(in), Output: tollgate.Rate(out)}, tollgate.Amount(cost)
		c.SearchPrice = tollgate.Amount(price)
		e.Charge = &c
	}
	return e, nil
}

// Ledger calls fn for the entries matching f, oldest first. A zero filter
// field matches everything; Model, KeyID and Class match charges only.
func (db *DB) Ledger(ctx context.Context, f tollgate.UsageFilter, fn func(tollgate.LedgerEntry) error) error {
	q := `SELECT ` + ledgerColumns + ` FROM ledger WHERE true`
	var args []any
	if f.AccountID != "" {
		args = append(args, f.AccountID)
		q += " AND account_id = $1"
	}
	q, args = filterConds(q, args, f)
	rows, err := db.pool.Query(ctx, q+` ORDER BY seq`, args...)
	if err != nil {
		return fmt.Errorf("postgres: ledger: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		e, err := scanEntry(rows)
		if err != nil {
			return fmt.Errorf("postgres: ledger: %w", err)
		}
		if err := fn(e); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("postgres: ledger: %w", err)
	}
	return nil
}

// LedgerEntry returns one entry by id (a charge's request id), or ErrNotFound.
func (db *DB) LedgerEntry(ctx context.Context, id string) (tollgate.LedgerEntry, error) {
	rows, err := db.pool.Query(ctx, `SELECT `+ledgerColumns+` FROM ledger WHERE id = $1`, id)
	if err != nil {
		return tollgate.LedgerEntry{}, fmt.Errorf("postgres: ledger entry %s: %w", id, err)
	}
	e, err := pgx.CollectExactlyOneRow(rows, scanEntry)
	if errors.Is(err, pgx.ErrNoRows) {
		return e, fmt.Errorf("ledger entry %s: %w", id, tollgate.ErrNotFound)
	}
	if err != nil {
		return e, fmt.Errorf("postgres: ledger entry %s: %w", id, err)
	}
	return e, nil
}

// Audit returns, for every account and key, the stored balances beside what
// the ledger and the holds add up to, from one snapshot (REPEATABLE READ).
// Holds whose lease ended before expiredBefore are counted as expired; those
// whose request was marked ended before it are listed.
func (db *DB) Audit(ctx context.Context, expiredBefore time.Time) ([]tollgate.AccountAudit, []tollgate.KeyAudit, error) {
	var accts []tollgate.AccountAudit
	var keys []tollgate.KeyAudit
	err := pgx.BeginTxFunc(ctx, db.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
			WITH l AS (
				SELECT account_id,
					(sum(amount) FILTER (WHERE kind = 'opening'))::bigint AS opening,
					(sum(amount) FILTER (WHERE kind = 'credit'))::bigint AS credits,
					(-sum(amount) FILTER (WHERE kind = 'debit'))::bigint AS debits,
					(-sum(amount) FILTER (WHERE kind = 'charge'))::bigint AS charges,
					(sum(uncollected) FILTER (WHERE kind = 'charge'))::bigint AS uncollected
				FROM ledger GROUP BY account_id),
			h AS (
				SELECT account_id, (sum(amount))::bigint AS amount, count(*) AS n, count(*) FILTER (WHERE expires < $1) AS expired,
					array_agg(id ORDER BY id) FILTER (WHERE ended < $1) AS stranded
				FROM holds GROUP BY account_id)
			SELECT a.id, a.balance, a.held, coalesce(l.opening, 0), coalesce(l.credits, 0), coalesce(l.debits, 0),
				coalesce(l.charges, 0), coalesce(l.uncollected, 0), coalesce(h.amount, 0), coalesce(h.n, 0), coalesce(h.expired, 0),
				coalesce(h.stranded, '{}'),
				`+paystore.AuditColumns+`
			FROM accounts a LEFT JOIN l ON l.account_id = a.id LEFT JOIN h ON h.account_id = a.id
			ORDER BY a.created, a.id`, expiredBefore)
		if err != nil {
			return err
		}
		accts, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (tollgate.AccountAudit, error) {
			var a tollgate.AccountAudit
			var v [8]int64
			err := r.Scan(append([]any{&a.AccountID, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &a.ActiveHolds, &a.ExpiredHolds,
				&a.StrandedHolds}, paystore.AuditDest(&a)...)...)
			if len(a.StrandedHolds) == 0 {
				a.StrandedHolds = nil
			}
			a.Balance, a.Held, a.Opening, a.Credits, a.Debits = tollgate.Amount(v[0]), tollgate.Amount(v[1]), tollgate.Amount(v[2]), tollgate.Amount(v[3]), tollgate.Amount(v[4])
			a.Charges, a.Uncollected, a.HoldsSum = tollgate.Amount(v[5]), tollgate.Amount(v[6]), tollgate.Amount(v[7])
			return a, err
		})
		if err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `
			WITH l AS (SELECT key_id, (-sum(amount))::bigint AS charges FROM ledger WHERE kind = 'charge' GROUP BY key_id),
			h AS (SELECT key_id, (sum(amount))::bigint AS amount FROM holds GROUP BY key_id)
			SELECT k.id, k.spent, k.held, coalesce(l.charges, 0), coalesce(h.amount, 0)
			FROM api_keys k LEFT JOIN l ON l.key_id = k.id LEFT JOIN h ON h.key_id = k.id
			ORDER BY k.created, k.id`)
		if err != nil {
			return err
		}
		keys, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (tollgate.KeyAudit, error) {
			var k tollgate.KeyAudit
			var v [4]int64
			err := r.Scan(&k.KeyID, &v[0], &v[1], &v[2], &v[3])
			k.Spent, k.Held, k.Charges, k.HoldsSum = tollgate.Amount(v[0]), tollgate.Amount(v[1]), tollgate.Amount(v[2]), tollgate.Amount(v[3])
			return k, err
		})
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: audit: %w", err)
	}
	return accts, keys, nil
}

// filterConds appends f's key, model, class and period conditions (the
// account is the caller's) to q with numbered placeholders after args.
func filterConds(q string, args []any, f tollgate.UsageFilter) (string, []any) {
	add := func(cond string, v any) {
		args = append(args, v)
		q += fmt.Sprintf(" AND "+cond, len(args))
	}
	if f.KeyID != "" {
		add("key_id = $%d", f.KeyID)
	}
	if f.Model != "" {
		add("model = $%d", f.Model)
	}
	if f.Class != "" {
		add("class = $%d", string(f.Class))
	}
	if !f.Since.IsZero() {
		add("time >= $%d", f.Since)
	}
	if !f.Until.IsZero() {
		add("time < $%d", f.Until)
	}
	return q, args
}
