package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/paystore"
)

// The billing store: holds, the ledger and key rate windows (migration
// 0002_billing, docs/billing.md). Every write runs on the single writer
// connection inside BEGIN IMMEDIATE, so a check followed by an update can
// never interleave with another writer, in this process or another.

// billStmts are the hot-path statements, prepared once on the writer
// connection: parsing SQL costs more than running these point updates.
type billStmts struct {
	holdAccount, holdKey, selWindow, addWindow, insHold                 *sql.Stmt
	delHold, selReplay, selAccount, settleAccount, settleKey, fixWindow *sql.Stmt
	relAccount, relKey, relWindow                                       *sql.Stmt
	takeReservation                                                     *sql.Stmt
	// insLedgerN[i] inserts 2^i charge rows in one statement
	// (up to 2^(ledgerRowsBits-1)): a batch of n summed charges takes one statement
	// per bit of n instead of n.
	insLedgerN [ledgerRowsBits]*sql.Stmt
}

// ledgerRowsBits bounds the rows of one multi-row insert: 2^(7-1) = 64 rows of
// 20 values, far below SQLite's limit on bound variables.
const ledgerRowsBits = 7

const insLedgerHead = `INSERT INTO ledger (id, kind, account_id, amount, time, hold_id, key_id, model, class, node,
			prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens, input_rate, output_rate, cost, uncollected, estimated,
			searches, search_price) VALUES `

const insLedgerRow = `(?, 'charge', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

func (db *DB) prepareBilling(ctx context.Context) error {
	b := &db.bill
	for _, p := range []struct {
		st **sql.Stmt
		q  string
	}{
		// A hold takes from the free balance only if it is there: the check
		// and the update are one statement.
		{&b.holdAccount, `UPDATE accounts SET held = held + ?1 WHERE id = ?2 AND balance - held >= ?1`},
		{&b.holdKey, `UPDATE api_keys SET held = held + ?1 WHERE id = ?2 AND account_id = ?3
			AND (spend_limit = 0 OR spent + held + ?1 <= spend_limit) RETURNING rpm, tpm`},
		{&b.selWindow, `SELECT requests, tokens FROM key_windows WHERE key_id = ? AND minute = ?`},
		{&b.addWindow, `INSERT INTO key_windows (key_id, minute, requests, tokens) VALUES (?, ?, 1, ?)
			ON CONFLICT (key_id, minute) DO UPDATE SET requests = requests + 1, tokens = tokens + excluded.tokens`},
		{&b.insHold, `INSERT INTO holds (id, request_id, account_id, key_id, model, class, amount, tokens, minute, owner, created, expires)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`},
		{&b.delHold, `DELETE FROM holds WHERE id = ? RETURNING account_id, key_id, amount, tokens, minute`},
		{&b.selReplay, `SELECT amount, uncollected FROM ledger WHERE hold_id = ?`},
		{&b.selAccount, `SELECT balance, held FROM accounts WHERE id = ?`},
		{&b.settleAccount, `UPDATE accounts SET balance = balance - ?, held = held - ? WHERE id = ?`},
		{&b.settleKey, `UPDATE api_keys SET spent = spent + ?, held = held - ? WHERE id = ?`},
		{&b.fixWindow, `UPDATE key_windows SET tokens = max(tokens - ?, 0) WHERE key_id = ? AND minute = ?`},
		{&b.relAccount, `UPDATE accounts SET held = held - ? WHERE id = ?`},
		{&b.relKey, `UPDATE api_keys SET held = held - ? WHERE id = ?`},
		{&b.relWindow, `UPDATE key_windows SET tokens = max(tokens - ?, 0) WHERE key_id = ? AND minute = ?`},
		{&b.takeReservation, `UPDATE holds SET amount = amount - ? WHERE id = ? AND request_id = ''`},
	} {
		st, err := db.w.PrepareContext(ctx, p.q)
		if err != nil {
			return fmt.Errorf("billing statement %q: %w", p.q, err)
		}
		*p.st = st
	}
	for i := range ledgerRowsBits {
		q := insLedgerHead + insLedgerRow + strings.Repeat(", "+insLedgerRow, 1<<i-1)
		st, err := db.w.PrepareContext(ctx, q)
		if err != nil {
			return fmt.Errorf("billing statement for %d ledger rows: %w", 1<<i, err)
		}
		b.insLedgerN[i] = st
	}
	return nil
}

// ApplyBilling applies ops in order in one transaction (group commit: one
// fsync for the whole batch). Each op's result is filled in; a refused hold
// is a result, not an error. An error means nothing of the batch was applied.
//
// Charges against reservations (OpCharge within what their reservation
// covers) are the hot path: each writes its ledger row, and the balance,
// key and reservation updates are summed per reservation and written once
// per run of consecutive charges (docs/billing.md, "Reservations").
func (db *DB) ApplyBilling(ctx context.Context, ops []*tollgate.BillingOp) error {
	durable, err := db.ApplyBillingCommitted(ctx, ops)
	if err != nil {
		return err
	}
	durable()
	return nil
}

// ApplyBillingCommitted is ApplyBilling without the wait for durability
// (billing.Committer): the batch is committed when it returns, and durable
// returns once it is on disk. The caller answers no one before that.
func (db *DB) ApplyBillingCommitted(ctx context.Context, ops []*tollgate.BillingOp) (durable func(), err error) {
	durable, err = db.applyBilling(ctx, ops, true)
	if errors.Is(err, errReservationGone) {
		// A reservation was swept: apply the batch again charge by charge,
		// which charges those from the free balance alone.
		durable, err = db.applyBilling(ctx, ops, false)
	}
	if err != nil {
		// A failed transaction is rolled back whole, its commit
		// included: the file is local, no answer can be lost.
		return nil, fmt.Errorf("sqlite: billing batch of %d %w: %w", len(ops), tollgate.ErrNotApplied, err)
	}
	return durable, nil
}

var errReservationGone = errors.New("a reservation is gone")

func (db *DB) applyBilling(ctx context.Context, ops []*tollgate.BillingOp, sum bool) (func(), error) {
	// The statements run under a context that cannot end: with one that can,
	// the driver starts a goroutine per statement to interrupt it (and the
	// statement's end wakes that goroutine), several per batch on the path
	// of every charge. The caller's context still bounds the batch: it is
	// checked before the transaction and before each statement (txStmts.c), and a
	// statement's one wait, for SQLite's write lock, is bounded by
	// busy_timeout. (So a batch retried op by op after its deadline fails at
	// once instead of waiting busy_timeout per op.)
	limit := ctx
	if err := limit.Err(); err != nil {
		return nil, err
	}
	ctx = context.WithoutCancel(ctx)
	return db.writeCommitted(ctx, func(tx *sql.Tx) error {
		b := &txStmts{ctx: ctx, limit: limit, tx: tx, s: &db.bill}
		for _, op := range ops {
			var err error
			summed := sum && op.Kind == tollgate.OpCharge && op.Charge.Cost <= op.Covered && !op.Recovered
			if !summed {
				if err := b.flushCharges(); err != nil {
					return err
				}
			}
			switch op.Kind {
			case tollgate.OpHold:
				err = b.hold(op)
			case tollgate.OpSettle:
				err = b.settle(op)
			case tollgate.OpRelease:
				_, err = b.release(op.HoldID, op)
			case tollgate.OpReserve:
				err = b.reserve(op)
			case tollgate.OpReturn:
				err = b.giveBack(op)
			case tollgate.OpCharge:
				if summed {
					err = b.chargeSummed(op)
				} else {
					err = b.charge(op)
				}
			default:
				err = fmt.Errorf("unknown op kind %d", op.Kind)
			}
			if err != nil {
				return err
			}
		}
		return b.flushCharges()
	})
}

// txStmts binds the prepared statements to one transaction, once each.
type txStmts struct {
	ctx   context.Context // cannot end (applyBilling)
	limit context.Context // the caller's: checked before each statement
	tx    *sql.Tx
	s     *billStmts
	bound map[*sql.Stmt]*sql.Stmt
	sums  []*chargeSum // charges summed per reservation, not yet written
	rows  []any        // ledger rows of summed charges not yet written, ledgerRowValues each
}

// ledgerRowValues is the number of values of one charge row (insLedgerRow).
const ledgerRowValues = 20

// chargeSum is what consecutive charges take from one reservation.
type chargeSum struct {
	reservation, account, key string
	taken, charged            int64 // from the reservation (and held); from the balance
}

func (b *txStmts) st(s *sql.Stmt) *sql.Stmt {
	if b.bound == nil {
		b.bound = make(map[*sql.Stmt]*sql.Stmt, 16)
	}
	t, ok := b.bound[s]
	if !ok {
		t = b.tx.StmtContext(b.ctx, s)
		b.bound[s] = t
	}
	return t
}

func (b *txStmts) exec(s *sql.Stmt, args ...any) (int64, error) {
	res, err := b.st(s).ExecContext(b.c(), args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (b *txStmts) row(s *sql.Stmt, args ...any) *sql.Row {
	return b.st(s).QueryRowContext(b.c(), args...)
}

// c is the context for the next statement: b.ctx, which cannot end, unless
// the caller's context has ended; then that one, so that the statement fails
// at once with its error.
func (b *txStmts) c() context.Context {
	if b.limit != nil && b.limit.Err() != nil {
		return b.limit
	}
	return b.ctx
}

func (b *txStmts) hold(op *tollgate.BillingOp) error {
	h := &op.Hold
	op.Outcome = tollgate.HoldOK
	amt := int64(h.Amount)
	n, err := b.exec(b.s.holdAccount, amt, h.AccountID)
	if err != nil {
		return err
	}
	if n == 0 {
		var balance, held int64
		err := b.row(b.s.selAccount, h.AccountID).Scan(&balance, &held)
		if errors.Is(err, sql.ErrNoRows) {
			op.Outcome = tollgate.HoldNoAccount
			return nil
		}
		op.Outcome, op.Free = tollgate.HoldInsufficient, tollgate.Amount(balance-held)
		return err
	}
	// From here a refusal gives the account's reservation back.
	undo := func(outcome tollgate.HoldOutcome, key bool) error {
		op.Outcome = outcome
		if _, err := b.exec(b.s.relAccount, amt, h.AccountID); err != nil {
			return err
		}
		if key {
			_, err := b.exec(b.s.relKey, amt, h.KeyID)
			return err
		}
		return nil
	}
	var rpm, tpm int64
	err = b.row(b.s.holdKey, amt, h.KeyID, h.AccountID).Scan(&rpm, &tpm)
	if errors.Is(err, sql.ErrNoRows) {
		var limit, spent, kheld int64
		err := b.tx.QueryRowContext(b.c(), `SELECT spend_limit, spent, held FROM api_keys WHERE id = ? AND account_id = ?`,
			h.KeyID, h.AccountID).Scan(&limit, &spent, &kheld)
		if errors.Is(err, sql.ErrNoRows) {
			return undo(tollgate.HoldNoAccount, false)
		}
		if err != nil {
			return err
		}
		op.Free = tollgate.Amount(max(limit-spent-kheld, 0))
		return undo(tollgate.HoldKeyLimit, false)
	}
	if err != nil {
		return err
	}
	minute := int64(0)
	if rpm > 0 || tpm > 0 {
		minute = h.Minute
		var reqs, toks int64
		err := b.row(b.s.selWindow, h.KeyID, minute).Scan(&reqs, &toks)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if (rpm > 0 && reqs+1 > rpm) || (tpm > 0 && toks >= tpm) {
			op.RetryAt = time.Unix((minute+1)*60, 0).UTC()
			return undo(tollgate.HoldRateLimited, true)
		}
		if _, err := b.exec(b.s.addWindow, h.KeyID, minute, h.Tokens); err != nil {
			return err
		}
	}
	_, err = b.exec(b.s.insHold, h.ID, h.RequestID, h.AccountID, h.KeyID, h.Model, string(h.Class), amt, h.Tokens, minute,
		h.Owner, toMicros(h.Created), toMicros(h.Expires))
	return err
}

func (b *txStmts) settle(op *tollgate.BillingOp) error {
	c := &op.Charge
	acct, key := c.AccountID, c.KeyID
	var amount, tokens, minute int64
	err := b.row(b.s.delHold, op.HoldID).Scan(&acct, &key, &amount, &tokens, &minute)
	if errors.Is(err, sql.ErrNoRows) {
		// No hold: settled already (a retry), or swept after its lease
		// ended. A swept hold's request was still served, so it is
		// charged, from the free balance only.
		var charged, uncollected int64
		err := b.row(b.s.selReplay, op.HoldID).Scan(&charged, &uncollected)
		if err == nil {
			op.Replayed, op.Charged, op.Uncollected = true, tollgate.Amount(-charged), tollgate.Amount(uncollected)
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		acct, key = c.AccountID, c.KeyID
	} else if err != nil {
		return err
	}
	var balance, held int64
	if err := b.row(b.s.selAccount, acct).Scan(&balance, &held); err != nil {
		return fmt.Errorf("settle %s: account %s: %w", op.HoldID, acct, err)
	}
	charged := min(int64(c.Cost), max(balance-held+amount, 0))
	op.Charged, op.Uncollected = tollgate.Amount(charged), c.Cost-tollgate.Amount(charged)
	if _, err := b.exec(b.s.settleAccount, charged, amount, acct); err != nil {
		return err
	}
	if _, err := b.exec(b.s.settleKey, charged, amount, key); err != nil {
		return err
	}
	if used := c.PromptTokens + c.CompletionTokens; minute != 0 && tokens > used {
		if _, err := b.exec(b.s.fixWindow, tokens-used, key, minute); err != nil {
			return err
		}
	}
	return b.ledgerRow(op, acct, key, charged)
}

// reserve grows or creates an instance's reservation: a holds row with no
// request id, counted in accounts.held and api_keys.held like any hold.
func (b *txStmts) reserve(op *tollgate.BillingOp) error {
	h := &op.Hold
	op.Outcome, op.Granted, op.Gone, op.Free = tollgate.HoldOK, 0, false, 0
	var balance, held int64
	err := b.row(b.s.selAccount, h.AccountID).Scan(&balance, &held)
	if errors.Is(err, sql.ErrNoRows) {
		op.Outcome = tollgate.HoldNoAccount
		return nil
	}
	if err != nil {
		return err
	}
	var limit, rpm, tpm int64
	err = b.tx.QueryRowContext(b.c(), `SELECT spend_limit, rpm, tpm FROM api_keys WHERE id = ? AND account_id = ?`,
		h.KeyID, h.AccountID).Scan(&limit, &rpm, &tpm)
	if errors.Is(err, sql.ErrNoRows) {
		op.Outcome = tollgate.HoldNoAccount
		return nil
	}
	if err != nil {
		return err
	}
	if limit > 0 || rpm > 0 || tpm > 0 {
		op.Outcome = tollgate.HoldDirect
		return nil
	}
	free := balance - held
	grant, ok := reservationGrant(free, int64(h.Amount), int64(op.Need), int64(op.MinFree), op.Fraction)
	if !ok {
		op.Outcome, op.Free = tollgate.HoldInsufficient, tollgate.Amount(free)
		return nil
	}
	if op.Create {
		_, err = b.tx.ExecContext(b.c(), `INSERT INTO holds (id, request_id, account_id, key_id, model, class, amount, tokens, minute, owner, created, expires)
			VALUES (?, '', ?, ?, '', '', ?, 0, 0, ?, ?, ?)`, h.ID, h.AccountID, h.KeyID, grant, h.Owner, toMicros(h.Created), toMicros(h.Expires))
	} else {
		var n int64
		n, err = b.execQ(`UPDATE holds SET amount = amount + ?, expires = max(expires, ?) WHERE id = ? AND request_id = ''`,
			grant, toMicros(h.Expires), h.ID)
		if err == nil && n == 0 {
			op.Gone, op.Outcome = true, tollgate.HoldInsufficient
			op.Free = tollgate.Amount(free)
			return nil
		}
	}
	if err != nil {
		return err
	}
	if _, err := b.execQ(`UPDATE accounts SET held = held + ? WHERE id = ?`, grant, h.AccountID); err != nil {
		return err
	}
	if _, err := b.execQ(`UPDATE api_keys SET held = held + ? WHERE id = ?`, grant, h.KeyID); err != nil {
		return err
	}
	op.Granted = tollgate.Amount(grant)
	return nil
}

// reservationGrant is what a reservation request gets: want, but no more
// than free/fraction, and nothing (false) if that is below need or the free
// balance is below minFree.
func reservationGrant(free, want, need, minFree, fraction int64) (int64, bool) {
	if fraction < 1 {
		fraction = 1
	}
	grant := min(want, free/fraction)
	if free < minFree || grant < need || grant <= 0 {
		return 0, false
	}
	return grant, true
}

func (b *txStmts) execQ(q string, args ...any) (int64, error) {
	res, err := b.tx.ExecContext(b.c(), q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// giveBack returns op.Return of reservation op.Reservation to the free
// balance, and deletes the row when nothing is left in it; with
// op.ReturnAll, whatever the row holds, and deletes it. A reservation that
// is gone (swept, or for ReturnAll never created) is Gone and changes
// nothing. op.Returned is what left the row.
func (b *txStmts) giveBack(op *tollgate.BillingOp) error {
	op.Gone, op.Returned = false, 0
	var acct, key string
	amount := int64(op.Return)
	var err error
	if op.ReturnAll {
		err = b.tx.QueryRowContext(b.c(), `DELETE FROM holds WHERE id = ? AND request_id = '' RETURNING account_id, key_id, amount`,
			op.Reservation).Scan(&acct, &key, &amount)
	} else {
		err = b.tx.QueryRowContext(b.c(), `UPDATE holds SET amount = amount - ? WHERE id = ? AND request_id = '' RETURNING account_id, key_id`,
			amount, op.Reservation).Scan(&acct, &key)
	}
	if errors.Is(err, sql.ErrNoRows) {
		op.Gone = true
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := b.exec(b.s.relAccount, amount, acct); err != nil {
		return err
	}
	if _, err := b.exec(b.s.relKey, amount, key); err != nil {
		return err
	}
	op.Returned = tollgate.Amount(amount)
	if op.ReturnAll {
		return nil
	}
	_, err = b.execQ(`DELETE FROM holds WHERE id = ? AND request_id = '' AND amount = 0`, op.Reservation)
	return err
}

// chargeSummed writes the ledger row of a charge that its reservation
// covers (charged = cost) and adds what it takes to the reservation's sum.
func (b *txStmts) chargeSummed(op *tollgate.BillingOp) error {
	c := &op.Charge
	op.Charged, op.Uncollected, op.Gone, op.Replayed = c.Cost, 0, false, false
	b.rows = appendLedgerRow(b.rows, op, c.AccountID, c.KeyID, int64(c.Cost))
	var s *chargeSum
	for _, x := range b.sums {
		if x.reservation == op.Reservation {
			s = x
			break
		}
	}
	if s == nil {
		s = &chargeSum{reservation: op.Reservation, account: c.AccountID, key: c.KeyID}
		b.sums = append(b.sums, s)
	}
	s.taken += int64(op.Covered + op.Return)
	s.charged += int64(c.Cost)
	return nil
}

// flushCharges writes the summed charges: their ledger rows, and per
// reservation one update of the reservation, the account and the key.
func (b *txStmts) flushCharges() error {
	if err := b.flushRows(); err != nil {
		return err
	}
	for _, s := range b.sums {
		n, err := b.exec(b.s.takeReservation, s.taken, s.reservation)
		if err != nil {
			return err
		}
		if n == 0 {
			return errReservationGone
		}
		if _, err := b.exec(b.s.settleAccount, s.charged, s.taken, s.account); err != nil {
			return err
		}
		if _, err := b.exec(b.s.settleKey, s.charged, s.taken, s.key); err != nil {
			return err
		}
	}
	b.sums = b.sums[:0]
	return nil
}

// charge settles one request against its reservation, alone: charged =
// min(cost, free balance + what the reservation covers). If the
// reservation is gone (swept), the charge comes from the free balance alone.
func (b *txStmts) charge(op *tollgate.BillingOp) error {
	c := &op.Charge
	op.Gone, op.Replayed = false, false
	var charged, uncollected int64
	err := b.row(b.s.selReplay, op.HoldID).Scan(&charged, &uncollected)
	if err == nil {
		op.Replayed, op.Charged, op.Uncollected = true, tollgate.Amount(-charged), tollgate.Amount(uncollected)
		return nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	var have int64
	err = b.tx.QueryRowContext(b.c(), `SELECT amount FROM holds WHERE id = ? AND request_id = ''`, op.Reservation).Scan(&have)
	covered, taken := int64(op.Covered), int64(op.Covered+op.Return)
	if errors.Is(err, sql.ErrNoRows) {
		op.Gone, covered, taken = true, 0, 0
	} else if err != nil {
		return err
	}
	var balance, held int64
	if err := b.row(b.s.selAccount, c.AccountID).Scan(&balance, &held); err != nil {
		return fmt.Errorf("charge %s: account %s: %w", op.HoldID, c.AccountID, err)
	}
	ch := min(int64(c.Cost), max(balance-held+covered, 0))
	op.Charged, op.Uncollected = tollgate.Amount(ch), c.Cost-tollgate.Amount(ch)
	if taken > 0 {
		if _, err := b.exec(b.s.takeReservation, taken, op.Reservation); err != nil {
			return err
		}
	}
	if _, err := b.exec(b.s.settleAccount, ch, taken, c.AccountID); err != nil {
		return err
	}
	if _, err := b.exec(b.s.settleKey, ch, taken, c.KeyID); err != nil {
		return err
	}
	return b.ledgerRow(op, c.AccountID, c.KeyID, ch)
}

// ledgerID is the id of op's charge row: the request id, or the hold id for
// a charge without one.
func ledgerID(op *tollgate.BillingOp) string {
	if op.Charge.RequestID != "" {
		return op.Charge.RequestID
	}
	return op.HoldID
}

// appendLedgerRow appends the values of op's charge row to vs (insLedgerRow).
func appendLedgerRow(vs []any, op *tollgate.BillingOp, acct, key string, charged int64) []any {
	c := &op.Charge
	return append(vs, ledgerID(op), acct, -charged, toMicros(c.Time), op.HoldID, key, c.Model, string(c.Class), c.Node,
		c.PromptTokens, c.CompletionTokens, c.CachedTokens, c.ReasoningTokens, int64(c.Prices.Input), int64(c.Prices.Output),
		int64(c.Cost), int64(c.Cost)-charged, c.Estimated, c.Searches, int64(c.SearchPrice))
}

// ledgerRow writes op's charge row now.
func (b *txStmts) ledgerRow(op *tollgate.BillingOp, acct, key string, charged int64) error {
	var vs [ledgerRowValues]any
	_, err := b.exec(b.s.insLedgerN[0], appendLedgerRow(vs[:0], op, acct, key, charged)...)
	return err
}

// flushRows writes the queued charge rows, as few statements as the bits of
// their number (largest first, so the rows keep their order).
func (b *txStmts) flushRows() error {
	n := len(b.rows) / ledgerRowValues
	done := 0
	for i := ledgerRowsBits - 1; i >= 0; i-- {
		for n-done >= 1<<i {
			k := 1 << i
			if _, err := b.exec(b.s.insLedgerN[i], b.rows[done*ledgerRowValues:(done+k)*ledgerRowValues]...); err != nil {
				return err
			}
			done += k
		}
	}
	b.rows = b.rows[:0]
	return nil
}

// release frees a hold without a charge. It reports false (and marks op
// Replayed, when op is not nil) if there was no such hold.
func (b *txStmts) release(id string, op *tollgate.BillingOp) (bool, error) {
	var acct, key string
	var amount, tokens, minute int64
	err := b.row(b.s.delHold, id).Scan(&acct, &key, &amount, &tokens, &minute)
	if errors.Is(err, sql.ErrNoRows) {
		if op != nil {
			op.Replayed = true
		}
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if _, err := b.exec(b.s.relAccount, amount, acct); err != nil {
		return false, err
	}
	if _, err := b.exec(b.s.relKey, amount, key); err != nil {
		return false, err
	}
	if minute != 0 && tokens > 0 {
		if _, err := b.exec(b.s.relWindow, tokens, key, minute); err != nil {
			return false, err
		}
	}
	return true, nil
}

// RenewHolds extends the lease of every hold owned by owner to expires, for
// holds created after createdAfter (a hold older than the longest request is
// left to expire, whatever its owner thinks) and not marked ended (EndHolds).
// It returns how many it renewed.
func (db *DB) RenewHolds(ctx context.Context, owner string, expires, createdAfter time.Time) (int64, error) {
	var n int64
	err := db.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE holds SET expires = ? WHERE owner = ? AND (created > ? OR request_id = '') AND expires < ?
			AND ended = 0`,
			toMicros(expires), owner, toMicros(createdAfter), toMicros(expires))
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("sqlite: renew holds of %s: %w", owner, err)
	}
	return n, nil
}

// EndHolds marks the holds ids as ended at (their request ended, but their
// settle or release could not be written): RenewHolds no longer extends
// them, SweepHolds releases them once the mark is old enough, and the audit
// reports them when it is older than its grace. A hold already marked keeps
// its first mark; one that is gone is skipped. It returns how many it marked.
func (db *DB) EndHolds(ctx context.Context, ids []string, at time.Time) (int64, error) {
	var n int64
	err := db.write(ctx, func(tx *sql.Tx) error {
		n = 0
		st, err := tx.PrepareContext(ctx, `UPDATE holds SET ended = ? WHERE id = ? AND ended = 0 AND request_id <> ''`)
		if err != nil {
			return err
		}
		defer st.Close()
		for _, id := range ids {
			res, err := st.ExecContext(ctx, toMicros(at), id)
			if err != nil {
				return err
			}
			k, err := res.RowsAffected()
			if err != nil {
				return err
			}
			n += k
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("sqlite: mark %d holds ended: %w", len(ids), err)
	}
	return n, nil
}

// SweepHolds releases up to limit holds whose lease ended before now, or
// that were marked ended (EndHolds) before endedBefore, and returns them; it
// also drops rate windows older than two minutes.
func (db *DB) SweepHolds(ctx context.Context, now, endedBefore time.Time, limit int) ([]tollgate.Hold, error) {
	var out []tollgate.Hold
	err := db.write(ctx, func(tx *sql.Tx) error {
		out = out[:0]
		b := &txStmts{ctx: ctx, tx: tx, s: &db.bill}
		rows, err := tx.QueryContext(ctx, `SELECT `+holdColumns+` FROM holds WHERE expires < ? OR (ended > 0 AND ended < ?)
			ORDER BY expires LIMIT ?`, toMicros(now), toMicros(endedBefore), limit)
		if err != nil {
			return err
		}
		hs, err := scanHolds(rows)
		if err != nil {
			return err
		}
		for _, h := range hs {
			if ok, err := b.release(h.ID, nil); err != nil {
				return err
			} else if ok {
				out = append(out, h)
			}
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM key_windows WHERE minute < ?`, now.Unix()/60-2)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("sqlite: sweep holds: %w", err)
	}
	return out, nil
}

const holdColumns = `id, request_id, account_id, key_id, model, class, amount, tokens, minute, owner, created, expires, ended`

func scanHolds(rows *sql.Rows) ([]tollgate.Hold, error) {
	defer rows.Close()
	var out []tollgate.Hold
	for rows.Next() {
		var h tollgate.Hold
		var class string
		var amount, created, expires, ended int64
		if err := rows.Scan(&h.ID, &h.RequestID, &h.AccountID, &h.KeyID, &h.Model, &class, &amount, &h.Tokens, &h.Minute,
			&h.Owner, &created, &expires, &ended); err != nil {
			return nil, err
		}
		h.Class, h.Amount = tollgate.BackendClass(class), tollgate.Amount(amount)
		h.Created, h.Expires = fromMicros(created), fromMicros(expires)
		if ended > 0 {
			h.Ended = fromMicros(ended)
		}
		out = append(out, h)
	}
	return out, rows.Err()
}

// Holds returns the active holds of an account ("" for all), oldest first.
func (db *DB) Holds(ctx context.Context, accountID string) ([]tollgate.Hold, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT `+holdColumns+` FROM holds WHERE ? = '' OR account_id = ? ORDER BY created, id`, accountID, accountID)
	if err != nil {
		return nil, fmt.Errorf("sqlite: holds: %w", err)
	}
	hs, err := scanHolds(rows)
	if err != nil {
		return nil, fmt.Errorf("sqlite: holds: %w", err)
	}
	return hs, nil
}

// PostEntry records an operator's credit or debit (e.Kind) of e.Amount > 0 on
// e.AccountID and changes the balance in the same transaction. A debit may
// not take more than the free balance (balance − held): 402
// insufficient_balance. It fills in e.Seq and the signed e.Amount.
func (db *DB) PostEntry(ctx context.Context, e *tollgate.LedgerEntry) error {
	signed, err := e.OperatorAmount()
	if err != nil {
		return err
	}
	err = db.write(ctx, func(tx *sql.Tx) error {
		var balance, held int64
		err := tx.QueryRowContext(ctx, `SELECT balance, held FROM accounts WHERE id = ?`, e.AccountID).Scan(&balance, &held)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("account %s: %w", e.AccountID, tollgate.ErrNotFound)
		}
		if err != nil {
			return err
		}
		if err := tollgate.CheckOperatorEntry(signed, tollgate.Amount(balance), tollgate.Amount(held)); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + ? WHERE id = ?`, int64(signed), e.AccountID); err != nil {
			return err
		}
		return tx.QueryRowContext(ctx, `INSERT INTO ledger (id, kind, account_id, amount, note, time, actor) VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING seq`,
			e.ID, string(e.Kind), e.AccountID, int64(signed), e.Note, toMicros(e.Time), e.Actor).Scan(&e.Seq)
	})
	if isUnique(err) {
		return conflict("ledger entry "+e.ID, err)
	}
	if err != nil {
		return fmt.Errorf("sqlite: post %s on %s: %w", e.Kind, e.AccountID, err)
	}
	e.Amount = signed
	return nil
}

// Balance returns an account's settled balance and what is held.
func (db *DB) Balance(ctx context.Context, accountID string) (tollgate.Balance, error) {
	b := tollgate.Balance{AccountID: accountID}
	var balance, held int64
	err := db.r.QueryRowContext(ctx, `SELECT balance, held FROM accounts WHERE id = ?`, accountID).Scan(&balance, &held)
	if errors.Is(err, sql.ErrNoRows) {
		return b, fmt.Errorf("account %s: %w", accountID, tollgate.ErrNotFound)
	}
	if err != nil {
		return b, fmt.Errorf("sqlite: balance of %s: %w", accountID, err)
	}
	b.Balance, b.Held, b.Free = tollgate.Amount(balance), tollgate.Amount(held), tollgate.Amount(balance-held)
	return b, nil
}

const ledgerColumns = `seq, id, kind, account_id, amount, note, time, coalesce(hold_id, ''), coalesce(key_id, ''),
	coalesce(model, ''), coalesce(class, ''), coalesce(node, ''), prompt_tokens, completion_tokens, cached_tokens,
	reasoning_tokens, input_rate, output_rate, cost, uncollected, estimated, searches, search_price, actor`

func scanEntry(rows *sql.Rows) (tollgate.LedgerEntry, error) {
	var e tollgate.LedgerEntry
	var kind, class string
	var amount, tm, in, out, cost, unc, price int64
	var c tollgate.Charge
	if err := rows.Scan(&e.Seq, &e.ID, &kind, &e.AccountID, &amount, &e.Note, &tm, &e.HoldID, &c.KeyID, &c.Model, &class, &c.Node,
		&c.PromptTokens, &c.CompletionTokens, &c.CachedTokens, &c.ReasoningTokens, &in, &out, &cost, &unc, &c.Estimated,
		&c.Searches, &price, &e.Actor); err != nil {
		return e, err
	}
	e.Kind, e.Amount, e.Time, e.Uncollected = tollgate.LedgerKind(kind), tollgate.Amount(amount), fromMicros(tm), tollgate.Amount(unc)
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
	q := `SELECT ` + ledgerColumns + ` FROM ledger WHERE 1 = 1`
	var args []any
	add := func(cond string, v any) { q += " AND " + cond; args = append(args, v) }
	// Every query goes through the (account_id, time) index, the only one
	// the ledger keeps besides its ids (migration 0005): by the key's
	// account for a key, and account by account when no account is given.
	switch {
	case f.AccountID != "":
		add("account_id = ?", f.AccountID)
	case f.KeyID != "":
		add("account_id = (SELECT account_id FROM api_keys WHERE id = ?)", f.KeyID)
	default:
		q += " AND account_id IN (SELECT id FROM accounts)"
	}
	q, args = filterConds(q, args, f)
	rows, err := db.r.QueryContext(ctx, q+` ORDER BY seq`, args...)
	if err != nil {
		return fmt.Errorf("sqlite: ledger: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		e, err := scanEntry(rows)
		if err != nil {
			return fmt.Errorf("sqlite: ledger: %w", err)
		}
		if err := fn(e); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("sqlite: ledger: %w", err)
	}
	return nil
}

// LedgerEntry returns one entry by id (a charge's request id), or ErrNotFound.
func (db *DB) LedgerEntry(ctx context.Context, id string) (tollgate.LedgerEntry, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT `+ledgerColumns+` FROM ledger WHERE id = ?`, id)
	if err != nil {
		return tollgate.LedgerEntry{}, fmt.Errorf("sqlite: ledger entry %s: %w", id, err)
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return tollgate.LedgerEntry{}, fmt.Errorf("sqlite: ledger entry %s: %w", id, err)
		}
		return tollgate.LedgerEntry{}, fmt.Errorf("ledger entry %s: %w", id, tollgate.ErrNotFound)
	}
	e, err := scanEntry(rows)
	if err != nil {
		return e, fmt.Errorf("sqlite: ledger entry %s: %w", id, err)
	}
	return e, nil
}

// Audit returns, for every account and key, the stored balances beside what
// the ledger and the holds add up to, in one read transaction (a consistent
// snapshot). Holds whose lease ended before expiredBefore are counted as
// expired; those whose request was marked ended before it are listed.
func (db *DB) Audit(ctx context.Context, expiredBefore time.Time) ([]tollgate.AccountAudit, []tollgate.KeyAudit, error) {
	tx, err := db.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, nil, fmt.Errorf("sqlite: audit: %w", err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, `SELECT a.id, a.balance, a.held,
		coalesce((SELECT sum(amount) FROM ledger l WHERE l.account_id = a.id AND kind = 'opening'), 0),
		coalesce((SELECT sum(amount) FROM ledger l WHERE l.account_id = a.id AND kind = 'credit'), 0),
		coalesce((SELECT -sum(amount) FROM ledger l WHERE l.account_id = a.id AND kind = 'debit'), 0),
		coalesce((SELECT -sum(amount) FROM ledger l WHERE l.account_id = a.id AND kind = 'charge'), 0),
		coalesce((SELECT sum(uncollected) FROM ledger l WHERE l.account_id = a.id AND kind = 'charge'), 0),
		coalesce((SELECT sum(amount) FROM holds h WHERE h.account_id = a.id), 0),
		(SELECT count(*) FROM holds h WHERE h.account_id = a.id),
		(SELECT count(*) FROM holds h WHERE h.account_id = a.id AND h.expires < ?1),
		coalesce((SELECT group_concat(id, ' ') FROM (SELECT id FROM holds h WHERE h.account_id = a.id AND h.ended > 0 AND h.ended < ?1 ORDER BY id)), ''),
		`+paystore.AuditColumns+`
		FROM accounts a ORDER BY a.created, a.id`, toMicros(expiredBefore))
	if err != nil {
		return nil, nil, fmt.Errorf("sqlite: audit: %w", err)
	}
	var accts []tollgate.AccountAudit
	for rows.Next() {
		var a tollgate.AccountAudit
		var v [9]int64
		var stranded string
		if err := rows.Scan(append([]any{&a.AccountID, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &a.ActiveHolds, &a.ExpiredHolds, &stranded},
			paystore.AuditDest(&a)...)...); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("sqlite: audit: %w", err)
		}
		a.StrandedHolds = strings.Fields(stranded)
		a.Balance, a.Held, a.Opening, a.Credits, a.Debits = tollgate.Amount(v[0]), tollgate.Amount(v[1]), tollgate.Amount(v[2]), tollgate.Amount(v[3]), tollgate.Amount(v[4])
		a.Charges, a.Uncollected, a.HoldsSum = tollgate.Amount(v[5]), tollgate.Amount(v[6]), tollgate.Amount(v[7])
		accts = append(accts, a)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("sqlite: audit: %w", err)
	}
	// The keys' charges in one grouped scan: key_id has no index (migration 0005).
	rows, err = tx.QueryContext(ctx, `WITH c AS (SELECT key_id, -sum(amount) AS charges FROM ledger WHERE kind = 'charge' GROUP BY key_id)
		SELECT k.id, k.spent, k.held, coalesce(c.charges, 0),
		coalesce((SELECT sum(amount) FROM holds h WHERE h.key_id = k.id), 0)
		FROM api_keys k LEFT JOIN c ON c.key_id = k.id ORDER BY k.created, k.id`)
	if err != nil {
		return nil, nil, fmt.Errorf("sqlite: audit keys: %w", err)
	}
	defer rows.Close()
	var keys []tollgate.KeyAudit
	for rows.Next() {
		var k tollgate.KeyAudit
		var v [4]int64
		if err := rows.Scan(&k.KeyID, &v[0], &v[1], &v[2], &v[3]); err != nil {
			return nil, nil, fmt.Errorf("sqlite: audit keys: %w", err)
		}
		k.Spent, k.Held, k.Charges, k.HoldsSum = tollgate.Amount(v[0]), tollgate.Amount(v[1]), tollgate.Amount(v[2]), tollgate.Amount(v[3])
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("sqlite: audit keys: %w", err)
	}
	return accts, keys, nil
}

// filterConds appends f's key, model, class and period conditions (the
// account is the caller's) to q and their values to args.
func filterConds(q string, args []any, f tollgate.UsageFilter) (string, []any) {
	add := func(cond string, v any) { q += " AND " + cond; args = append(args, v) }
	if f.KeyID != "" {
		add("key_id = ?", f.KeyID)
	}
	if f.Model != "" {
		add("model = ?", f.Model)
	}
	if f.Class != "" {
		add("class = ?", string(f.Class))
	}
	if !f.Since.IsZero() {
		add("time >= ?", toMicros(f.Since))
	}
	if !f.Until.IsZero() {
		add("time < ?", toMicros(f.Until))
	}
	return q, args
}
