package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tollgate/tollgate"
)

// Idempotency-Key storage (migration 0003, docs/idempotency.md). A claim is
// one INSERT ... ON CONFLICT DO UPDATE ... WHERE expires <= now: PostgreSQL
// takes the row lock and re-checks the condition on the newest version, so
// among instances racing for a key exactly one gets it back.

// BeginIdempotency claims c's key, or reports who holds or held it. A row
// whose expires has passed (a lease nobody renewed, a memory past its TTL)
// is taken over, except an in-flight row whose owner was charged (its
// charge is in the ledger under the owner's request id): its instance died
// between the charge and the stored answer, and the key is kept as lost
// until c.LostExpires instead (IdempotencyLost). No claim can take such a
// row over (the condition is re-checked under the row lock), so racing
// instances all answer lost.
func (db *DB) BeginIdempotency(ctx context.Context, c tollgate.IdempotencyClaim) (tollgate.IdempotencyResult, error) {
	// The row can change between the claim and the read (released, or
	// expired and taken over): then claim again. Each loop needs another
	// request to have changed the row, so a few rounds always suffice.
	for range 8 {
		var owner string
		err := db.pool.QueryRow(ctx,
			`INSERT INTO idempotency_keys AS t (scope, key, fingerprint, owner, created, expires, status)
			 VALUES ($1, $2, $3, $4, $5, $6, 0)
			 ON CONFLICT (scope, key) DO UPDATE SET
			   fingerprint = excluded.fingerprint, owner = excluded.owner, created = excluded.created,
			   expires = excluded.expires, status = 0, header = '', body = NULL
			 WHERE t.expires <= $5 AND NOT (t.status = 0 AND EXISTS
			   (SELECT 1 FROM ledger l WHERE l.id = t.owner AND l.kind = 'charge'))
			 RETURNING owner`,
			c.Scope, c.Key, c.Fingerprint, c.Owner, c.Now, c.Expires).Scan(&owner)
		if err == nil {
			return tollgate.IdempotencyResult{State: tollgate.IdempotencyStarted, Owner: owner,
				Started: c.Now.UTC().Truncate(time.Microsecond)}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return tollgate.IdempotencyResult{}, fmt.Errorf("postgres: begin idempotency: %w", err)
		}
		var res tollgate.IdempotencyResult
		var fp, body []byte
		var status int
		var header string
		err = db.pool.QueryRow(ctx,
			`SELECT fingerprint, owner, created, status, header, body FROM idempotency_keys
			 WHERE scope = $1 AND key = $2 AND expires > $3`,
			c.Scope, c.Key, c.Now).Scan(&fp, &res.Owner, &res.Started, &status, &header, &body)
		if errors.Is(err, pgx.ErrNoRows) {
			// Released or expired meanwhile, or its holder was charged and
			// died before storing the answer: keep that as lost, and look again.
			if _, err := db.pool.Exec(ctx, lostSQL, c.LostExpires, c.Scope, c.Key, c.Now); err != nil {
				return tollgate.IdempotencyResult{}, fmt.Errorf("postgres: begin idempotency: %w", err)
			}
			continue
		}
		if err != nil {
			return tollgate.IdempotencyResult{}, fmt.Errorf("postgres: begin idempotency: %w", err)
		}
		res.Started = res.Started.UTC()
		switch {
		case !bytes.Equal(fp, c.Fingerprint):
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
		return res, nil
	}
	return tollgate.IdempotencyResult{}, errors.New("postgres: begin idempotency: the key kept changing under the claim")
}

// RenewIdempotency moves the end of the owner's lease to expires.
// tollgate.ErrNotFound when owner no longer holds the key in flight.
func (db *DB) RenewIdempotency(ctx context.Context, k tollgate.IdempotencyKey, owner string, expires time.Time) error {
	return db.idemUpdate(ctx, "renew",
		`UPDATE idempotency_keys SET expires = $1 WHERE scope = $2 AND key = $3 AND owner = $4 AND status = 0`,
		expires, k.Scope, k.Key, owner)
}

// CompleteIdempotency stores the owner's response, remembered until
// expires. tollgate.ErrNotFound when owner no longer holds the key.
func (db *DB) CompleteIdempotency(ctx context.Context, k tollgate.IdempotencyKey, owner string, r tollgate.StoredResponse, expires time.Time) error {
	if r.Status <= 0 {
		return fmt.Errorf("postgres: complete idempotency: status %d", r.Status)
	}
	body := r.Body
	if body == nil {
		body = []byte{}
	}
	return db.idemUpdate(ctx, "complete",
		`UPDATE idempotency_keys SET status = $1, header = $2, body = $3, expires = $4
		 WHERE scope = $5 AND key = $6 AND owner = $7 AND status = 0`,
		r.Status, r.Header, body, expires, k.Scope, k.Key, owner)
}

// ReleaseIdempotency frees a key the owner holds in flight, so that a retry
// runs afresh. tollgate.ErrNotFound when owner no longer holds it.
func (db *DB) ReleaseIdempotency(ctx context.Context, k tollgate.IdempotencyKey, owner string) error {
	return db.idemUpdate(ctx, "release",
		`DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2 AND owner = $3 AND status = 0`,
		k.Scope, k.Key, owner)
}

func (db *DB) idemUpdate(ctx context.Context, what, q string, args ...any) error {
	tag, err := db.pool.Exec(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("postgres: %s idempotency: %w", what, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%s idempotency key: %w", what, tollgate.ErrNotFound)
	}
	return nil
}

// purgeBatch bounds one purge statement, so that no instance holds many row
// locks at once.
const purgeBatch = 1000

// lostSQL keeps the in-flight row of key ($2, $3) whose lease ended before
// $4 and whose owner was charged as lost until $1.
const lostSQL = `UPDATE idempotency_keys t SET status = -1, header = '', body = NULL, expires = $1
	WHERE scope = $2 AND key = $3 AND status = 0 AND expires <= $4
	AND EXISTS (SELECT 1 FROM ledger l WHERE l.id = t.owner AND l.kind = 'charge')`

// PurgeIdempotency deletes the rows whose expires is before before
// (forgotten responses, leases of dead instances) and returns how many.
// Several instances may purge at once: SKIP LOCKED keeps them apart. An
// in-flight row whose owner was charged is not deleted but kept as lost
// until lostExpires (BeginIdempotency): deleting it would let the key run,
// and be charged, again.
func (db *DB) PurgeIdempotency(ctx context.Context, before, lostExpires time.Time) (int64, error) {
	if _, err := db.pool.Exec(ctx, `UPDATE idempotency_keys t SET status = -1, header = '', body = NULL, expires = $1
		WHERE status = 0 AND expires < $2 AND EXISTS (SELECT 1 FROM ledger l WHERE l.id = t.owner AND l.kind = 'charge')`,
		lostExpires, before); err != nil {
		return 0, fmt.Errorf("postgres: purge idempotency: %w", err)
	}
	var total int64
	for {
		// An in-flight row whose lease ended after the update above and
		// whose owner was charged is left to the next purge.
		tag, err := db.pool.Exec(ctx,
			`DELETE FROM idempotency_keys WHERE ctid IN
			   (SELECT ctid FROM idempotency_keys t WHERE expires < $1
			    AND NOT (status = 0 AND EXISTS (SELECT 1 FROM ledger l WHERE l.id = t.owner AND l.kind = 'charge'))
			    LIMIT $2 FOR UPDATE SKIP LOCKED)`,
			before, purgeBatch)
		if err != nil {
			return total, fmt.Errorf("postgres: purge idempotency: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < purgeBatch {
			return total, nil
		}
	}
}
