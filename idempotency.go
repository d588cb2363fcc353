package tollgate

import "time"

// Idempotency-Key (docs/idempotency.md): the types the stores and the
// idempotency package share.

// IdempotencyState is what BeginIdempotency found for a key.
type IdempotencyState uint8

const (
	// IdempotencyStarted: the key was free (never used, released, or its
	// lease or its memory ended); the caller now holds it and runs the request.
	IdempotencyStarted IdempotencyState = iota + 1
	// IdempotencyInFlight: another request with the same fingerprint holds
	// the key's lease and is still running.
	IdempotencyInFlight
	// IdempotencyDone: the request succeeded earlier; Response is its answer.
	IdempotencyDone
	// IdempotencyMismatch: the key is in use (running or remembered) by a
	// request with another fingerprint.
	IdempotencyMismatch
	// IdempotencyLost: the request that held the key was charged (its
	// charge is in the ledger under its request id, Owner) but its answer
	// was never stored: its instance died between the two. It does not run
	// again under this key (docs/idempotency.md, "A crash between the
	// charge and the stored answer").
	IdempotencyLost
)

// IdempotencyStatusLost is the status column of a key whose request was
// charged and whose answer was lost (IdempotencyLost). 0 is in flight; an
// HTTP status is a stored answer.
const IdempotencyStatusLost = -1

func (s IdempotencyState) String() string {
	switch s {
	case IdempotencyStarted:
		return "started"
	case IdempotencyInFlight:
		return "in_flight"
	case IdempotencyDone:
		return "done"
	case IdempotencyMismatch:
		return "mismatch"
	case IdempotencyLost:
		return "lost"
	}
	return "unknown"
}

// IdempotencyKey names one remembered request: the scope (the account) plus
// the Idempotency-Key header's value.
type IdempotencyKey struct {
	Scope string
	Key   string
}

// IdempotencyClaim asks for a key.
type IdempotencyClaim struct {
	IdempotencyKey
	// Fingerprint identifies the request (SHA-256, 32 bytes).
	Fingerprint []byte
	// Owner is a token unique to this attempt (its request id); only the
	// owner may renew, complete or release the claim.
	Owner string
	// Now is the current time; Expires the end of the lease it asks for.
	Now     time.Time
	Expires time.Time
	// LostExpires is how long a key is remembered as IdempotencyLost when
	// the claim finds that the previous holder, whose lease ended, was
	// charged (now + the TTL).
	LostExpires time.Time
}

// IdempotencyResult is the answer of BeginIdempotency.
type IdempotencyResult struct {
	State IdempotencyState
	// Owner and Started are those of the request holding or having held the
	// key (for InFlight, Done and Lost: the original request's id and start).
	Owner   string
	Started time.Time
	// Response is the stored answer (Done only).
	Response StoredResponse
}

// StoredResponse is a response kept for replay.
type StoredResponse struct {
	Status int
	// Header holds the replayed header fields as "Name: value" lines joined
	// by "\n" (values never hold a newline).
	Header string
	Body   []byte
}
