package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tollgate/tollgate"
)

// Idempotency-Key storage (migration 0003, docs/idempotency.md). Every
// write runs in a transaction on the single writer connection (grouped with
// the writes queued at the same time, see idemWrite), so a claim is atomic
// within the process and, through SQLite's write lock, across processes
// sharing the file. The writes ignore their ctx: a group serves several
// callers, and the Keeper never cancels a store call anyway.

// BeginIdempotency claims c's key, or reports who holds or held it. A row
// whose expires has passed (a lease nobody renewed, a memory past its TTL)
// is taken over, except an in-flight row whose owner was charged (its
// charge is in the ledger under the owner's request id): its instance died
// between the charge and the stored answer, and the key is kept as lost
// until c.LostExpires instead (IdempotencyLost), in the same transaction.
//
// A live row is first looked up on a reader connection: a duplicate (409,
// 422 or a replay) then never queues for the writer. Its answer can only be
// stale towards "in flight" (the holder finished meanwhile), which the
// client retries anyway; a free key is always claimed on the writer.
func (db *DB) BeginIdempotency(ctx context.Context, c tollgate.IdempotencyClaim) (tollgate.IdempotencyResult, error) {
	res, live, err := scanIdemRow(c, db.r.QueryRowContext(ctx,
		`SELECT fingerprint, owner, created, status, header, body FROM idempotency_keys
		 WHERE scope = ? AND key = ? AND expires > ?`, c.Scope, c.Key, toMicros(c.Now)))
	if err != nil {
		return tollgate.IdempotencyResult{}, fmt.Errorf("sqlite: begin idempotency: %w", err)
	}
	if live {
		return res, nil
	}
	err = db.idemWrite(func(tx *sql.Tx) error {
		var owner string
		err := tx.QueryRow(
			`INSERT INTO idempotency_keys (scope, key, fingerprint, owner, created, expires, status)
			 VALUES (?, ?, ?, ?, ?, ?, 0)
			 ON CONFLICT (scope, key) DO UPDATE SET
			   fingerprint = excluded.fingerprint, owner = excluded.owner, created = excluded.created,
			   expires = excluded.expires, status = 0, header = '', body = NULL
			 WHERE idempotency_keys.expires <= ?7 AND NOT (idempotency_keys.status = 0 AND EXISTS
			   (SELECT 1 FROM ledger WHERE ledger.id = idempotency_keys.owner AND ledger.kind = 'charge'))
			 RETURNING owner`,
			c.Scope, c.Key, c.Fingerprint, c.Owner, toMicros(c.Now), toMicros(c.Expires), toMicros(c.Now)).Scan(&owner)
		if err == nil {
			res = tollgate.IdempotencyResult{State: tollgate.IdempotencyStarted, Owner: owner, Started: fromMicros(toMicros(c.Now))}
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		// The key became live since the look-up, or its holder was charged
		// and died before storing the answer: keep that as lost, then read
		// the row in this transaction.
		if _, err := tx.Exec(lostSQL, toMicros(c.LostExpires), c.Scope, c.Key, toMicros(c.Now)); err != nil {
			return err
		}
		res, _, err = scanIdemRow(c, tx.QueryRow(
			`SELECT fingerprint, owner, created, status, header, body FROM idempotency_keys WHERE scope = ? AND key = ?`,
			c.Scope, c.Key))
		return err
	})
	if err != nil {
		return tollgate.IdempotencyResult{}, fmt.Errorf("sqlite: begin idempotency: %w", err)
	}
	return res, nil
}

// scanIdemRow classifies a live row against claim c; live is false when
// there is no row.
func scanIdemRow(c tollgate.IdempotencyClaim, row *sql.Row) (res tollgate.IdempotencyResult, live bool, err error) {
	var fp []byte
	var created int64
	var status int
	var header string
	var body []byte
	err = row.Scan(&fp, &res.Owner, &created, &status, &header, &body)
	if errors.Is(err, sql.ErrNoRows) {
		return res, false, nil
	}
	if err != nil {
		return res, false, err
	}
	res.Started = fromMicros(created)
	switch {
	case string(fp) != string(c.Fingerprint):
		res.State = tollgate.IdempotencyMismatch
		res.Owner = ""
	case status == 0:
		res.State = tollgate.IdempotencyInFlight
	case status == tollgate.IdempotencyStatusLost:
		res.State = tollgate.IdempotencyLost
	default:
		res.State = tollgate.IdempotencyDone
		if body == nil {
			body = []byte{}
		}
		res.Response = tollgate.StoredResponse{Status: status, Header: header, Body: body}
	}
	return res, true, nil
}

// RenewIdempotency moves the end of the owner's lease to expires.
// tollgate.ErrNotFound when owner no longer holds the key in flight.
func (db *DB) RenewIdempotency(ctx context.Context, k tollgate.IdempotencyKey, owner string, expires time.Time) error {
	return db.idemUpdate(ctx, "renew",
		`UPDATE idempotency_keys SET expires = ? WHERE scope = ? AND key = ? AND owner = ? AND status = 0`,
		toMicros(expires), k.Scope, k.Key, owner)
}

// CompleteIdempotency stores the owner's response, remembered until
// expires. tollgate.ErrNotFound when owner no longer holds the key.
func (db *DB) CompleteIdempotency(ctx context.Context, k tollgate.IdempotencyKey, owner string, r tollgate.StoredResponse, expires time.Time) error {
	if r.Status <= 0 {
		return fmt.Errorf("sqlite: complete idempotency: status %d", r.Status)
	}
	body := r.Body
	if body == nil {
		body = []byte{}
	}
	return db.idemUpdate(ctx, "complete",
		`UPDATE idempotency_keys SET status = ?, header = ?, body = ?, expires = ?
		 WHERE scope = ? AND key = ? AND owner = ? AND status = 0`,
		r.Status, r.Header, body, toMicros(expires), k.Scope, k.Key, owner)
}

// ReleaseIdempotency frees a key the owner holds in flight, so that a retry
// runs afresh. tollgate.ErrNotFound when owner no longer holds it.
func (db *DB) ReleaseIdempotency(ctx context.Context, k tollgate.IdempotencyKey, owner string) error {
	return db.idemUpdate(ctx, "release",
		`DELETE FROM idempotency_keys WHERE scope = ? AND key = ? AND owner = ? AND status = 0`,
		k.Scope, k.Key, owner)
}

func (db *DB) idemUpdate(_ context.Context, what, q string, args ...any) error {
	var n int64
	err := db.idemWrite(func(tx *sql.Tx) error {
		res, err := tx.Exec(q, args...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return fmt.Errorf("sqlite: %s idempotency: %w", what, err)
	}
	if n == 0 {
		return fmt.Errorf("%s idempotency key: %w", what, tollgate.ErrNotFound)
	}
	return nil
}

// Group commit. With synchronous=FULL every commit is an fsync (~0.6 ms,
// docs/performance.md), and a request with an Idempotency-Key makes two
// writes (claim, then store or release). Writes that arrive while a
// transaction runs wait and go together into the next one: one fsync for
// the whole group. The first writer to find no transaction running leads:
// it commits everything queued, then hands the lead to the oldest writer
// queued meanwhile, so nobody commits for others for long.

// idemQueue holds the writes waiting for the next group commit.
type idemQueue struct {
	mu      sync.Mutex
	pending []*idemOp
	busy    bool // a leader is committing
}

// idemOp is one write of a group.
type idemOp struct {
	fn   func(tx *sql.Tx) error
	err  error
	done bool          // fn ran and its group committed (or failed)
	wake chan struct{} // done, or lead the next group
}

// idemBatchTimeout bounds one group's transaction. Store calls finish even
// when their caller's client has gone away, so no caller context is used.
const idemBatchTimeout = 30 * time.Second

// idemWrite runs fn in a write transaction shared with the writes queued at
// the same time. fn must not keep tx; its error is its own (it does not
// abort the others: SQLite undoes only the failed statement).
func (db *DB) idemWrite(fn func(tx *sql.Tx) error) error {
	q := &db.idem
	op := &idemOp{fn: fn, wake: make(chan struct{}, 1)}
	q.mu.Lock()
	q.pending = append(q.pending, op)
	lead := !q.busy
	q.busy = true
	q.mu.Unlock()
	if !lead {
		<-op.wake
		if op.done {
			return op.err
		}
		// Woken to lead the next group, which holds op.
	}
	q.mu.Lock()
	group := q.pending
	q.pending = nil
	q.mu.Unlock()
	db.commitGroup(group)
	q.mu.Lock()
	var next *idemOp
	if len(q.pending) > 0 {
		next = q.pending[0]
	} else {
		q.busy = false
	}
	q.mu.Unlock()
	if next != nil {
		next.wake <- struct{}{}
	}
	return op.err
}

func (db *DB) commitGroup(group []*idemOp) {
	ctx, cancel := context.WithTimeout(context.Background(), idemBatchTimeout)
	defer cancel()
	err := db.write(ctx, func(tx *sql.Tx) error {
		for _, op := range group {
			op.err = op.fn(tx)
		}
		return nil
	})
	for _, op := range group {
		if err != nil {
			op.err = err
		}
		op.done = true
		op.wake <- struct{}{}
	}
}

// purgeBatch bounds one purge transaction, so that the single writer is
// never held for long.
const purgeBatch = 1000

// lostSQL keeps the in-flight row of key (?2, ?3) whose lease ended
// before ?4 and whose owner was charged as lost until ?1.
const lostSQL = `UPDATE idempotency_keys SET status = -1, header = '', body = NULL, expires = ?1
	WHERE scope = ?2 AND key = ?3 AND status = 0 AND expires <= ?4
	AND EXISTS (SELECT 1 FROM ledger WHERE ledger.id = idempotency_keys.owner AND ledger.kind = 'charge')`

// PurgeIdempotency deletes the rows whose expires is before before
// (forgotten responses, leases of dead instances) and returns how many. An
// in-flight row whose owner was charged is not deleted but kept as lost
// until lostExpires (BeginIdempotency): deleting it would let the key run,
// and be charged, again.
func (db *DB) PurgeIdempotency(ctx context.Context, before, lostExpires time.Time) (int64, error) {
	if _, err := db.execDurable(ctx, `UPDATE idempotency_keys SET status = -1, header = '', body = NULL, expires = ?
		WHERE status = 0 AND expires < ?
		AND EXISTS (SELECT 1 FROM ledger WHERE ledger.id = idempotency_keys.owner AND ledger.kind = 'charge')`,
		toMicros(lostExpires), toMicros(before)); err != nil {
		return 0, fmt.Errorf("sqlite: purge idempotency: %w", err)
	}
	var total int64
	for {
		res, err := db.execDurable(ctx,
			`DELETE FROM idempotency_keys WHERE rowid IN
			   (SELECT rowid FROM idempotency_keys WHERE expires < ?
			    AND NOT (status = 0 AND EXISTS (SELECT 1 FROM ledger WHERE ledger.id = idempotency_keys.owner AND ledger.kind = 'charge'))
			    LIMIT ?)`, toMicros(before), purgeBatch)
		if err != nil {
			return total, fmt.Errorf("sqlite: purge idempotency: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return total, fmt.Errorf("sqlite: purge idempotency: %w", err)
		}
		total += n
		if n < purgeBatch {
			return total, nil
		}
	}
}
