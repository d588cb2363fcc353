package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/tollgate/tollgate"
)

// Idempotency-Key storage (migration 0003, docs/idempotency.md). Every
// operation is one write transaction on the single writer connection, so a
// claim is atomic within the process and, through SQLite's write lock,
// across processes sharing the file.

// BeginIdempotency claims c's key, or reports who holds or held it. A row
// whose expires has passed (a lease nobody renewed, a memory past its TTL)
// is taken over.
func (db *DB) BeginIdempotency(ctx context.Context, c tollgate.IdempotencyClaim) (tollgate.IdempotencyResult, error) {
	var res tollgate.IdempotencyResult
	err := db.write(ctx, func(tx *sql.Tx) error {
		var owner string
		err := tx.QueryRowContext(ctx,
			`INSERT INTO idempotency_keys (scope, key, fingerprint, owner, created, expires, status)
			 VALUES (?, ?, ?, ?, ?, ?, 0)
			 ON CONFLICT (scope, key) DO UPDATE SET
			   fingerprint = excluded.fingerprint, owner = excluded.owner, created = excluded.created,
			   expires = excluded.expires, status = 0, header = '', body = NULL
			 WHERE idempotency_keys.expires <= ?
			 RETURNING owner`,
			c.Scope, c.Key, c.Fingerprint, c.Owner, toMicros(c.Now), toMicros(c.Expires), toMicros(c.Now)).Scan(&owner)
		if err == nil {
			res = tollgate.IdempotencyResult{State: tollgate.IdempotencyStarted, Owner: owner, Started: fromMicros(toMicros(c.Now))}
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		// The key is live: read it in the same transaction.
		var fp []byte
		var created int64
		var status int
		var header string
		var body []byte
		if err := tx.QueryRowContext(ctx,
			`SELECT fingerprint, owner, created, status, header, body FROM idempotency_keys WHERE scope = ? AND key = ?`,
			c.Scope, c.Key).Scan(&fp, &res.Owner, &created, &status, &header, &body); err != nil {
			return err
		}
		res.Started = fromMicros(created)
		switch {
		case string(fp) != string(c.Fingerprint):
			res.State = tollgate.IdempotencyMismatch
			res.Owner = ""
		case status == 0:
			res.State = tollgate.IdempotencyInFlight
		default:
			res.State = tollgate.IdempotencyDone
			if body == nil {
				body = []byte{}
			}
			res.Response = tollgate.StoredResponse{Status: status, Header: header, Body: body}
		}
		return nil
	})
	if err != nil {
		return tollgate.IdempotencyResult{}, fmt.Errorf("sqlite: begin idempotency: %w", err)
	}
	return res, nil
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

func (db *DB) idemUpdate(ctx context.Context, what, q string, args ...any) error {
	res, err := db.w.ExecContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("sqlite: %s idempotency: %w", what, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("sqlite: %s idempotency: %w", what, err)
	}
	if n == 0 {
		return fmt.Errorf("%s idempotency key: %w", what, tollgate.ErrNotFound)
	}
	return nil
}

// purgeBatch bounds one purge transaction, so that the single writer is
// never held for long.
const purgeBatch = 1000

// PurgeIdempotency deletes the rows whose expires is before before
// (forgotten responses, leases of dead instances) and returns how many.
func (db *DB) PurgeIdempotency(ctx context.Context, before time.Time) (int64, error) {
	var total int64
	for {
		res, err := db.w.ExecContext(ctx,
			`DELETE FROM idempotency_keys WHERE rowid IN
			   (SELECT rowid FROM idempotency_keys WHERE expires < ? LIMIT ?)`, toMicros(before), purgeBatch)
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
