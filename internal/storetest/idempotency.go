package storetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/idempotency"
)

// testIdempotency runs the idempotency cases as subtests on one store.
func testIdempotency(t *testing.T, s Store) {
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, s idempotency.Store)
	}{
		{"Claim", testIdemClaim},
		{"CompleteReplay", testIdemCompleteReplay},
		{"Release", testIdemRelease},
		{"LeaseExpiry", testIdemLeaseExpiry},
		{"Renew", testIdemRenew},
		{"TTL", testIdemTTL},
		{"Purge", testIdemPurge},
		{"Concurrent", testIdemConcurrent},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, s) })
	}
	t.Run("ChargedThenLost", func(t *testing.T) {
		testIdemChargedThenLost(t, s, s)
	})
}

func fingerprint(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

// idemKey returns a key unique to the test, so subtests never share rows.
func idemKey(t *testing.T) tollgate.IdempotencyKey {
	return tollgate.IdempotencyKey{Scope: tollgate.NewID("acct_"), Key: "key-" + t.Name()}
}

func claim(k tollgate.IdempotencyKey, fp, owner string, now time.Time, lease time.Duration) tollgate.IdempotencyClaim {
	return tollgate.IdempotencyClaim{IdempotencyKey: k, Fingerprint: fingerprint(fp), Owner: owner, Now: now, Expires: now.Add(lease)}
}

func begin(t *testing.T, s idempotency.Store, c tollgate.IdempotencyClaim, want tollgate.IdempotencyState) tollgate.IdempotencyResult {
	t.Helper()
	res, err := s.BeginIdempotency(ctx(t), c)
	if err != nil {
		t.Fatalf("BeginIdempotency(%s/%s, owner %s): %v", c.Scope, c.Key, c.Owner, err)
	}
	if res.State != want {
		t.Fatalf("BeginIdempotency(%s, owner %s) at %s: state %s, want %s", c.Key, c.Owner, c.Now.Format(time.RFC3339Nano), res.State, want)
	}
	return res
}

func testIdemClaim(t *testing.T, s idempotency.Store) {
	k := idemKey(t)
	begin(t, s, claim(k, "body", "req_a", t0, time.Minute), tollgate.IdempotencyStarted)
	res := begin(t, s, claim(k, "body", "req_b", t0.Add(time.Second), time.Minute), tollgate.IdempotencyInFlight)
	if res.Owner != "req_a" || !res.Started.Equal(t0.Truncate(time.Microsecond)) {
		t.Errorf("in flight: owner %q started %v, want req_a at %v", res.Owner, res.Started, t0.Truncate(time.Microsecond))
	}
	begin(t, s, claim(k, "other body", "req_c", t0.Add(time.Second), time.Minute), tollgate.IdempotencyMismatch)
	// The same value under another account is another key.
	other := tollgate.IdempotencyKey{Scope: tollgate.NewID("acct_"), Key: k.Key}
	begin(t, s, claim(other, "other body", "req_d", t0, time.Minute), tollgate.IdempotencyStarted)
}

func testIdemCompleteReplay(t *testing.T, s idempotency.Store) {
	k := idemKey(t)
	begin(t, s, claim(k, "body", "req_a", t0, time.Minute), tollgate.IdempotencyStarted)
	resp := tollgate.StoredResponse{
		Status: 200,
		Header: "Content-Type: application/json\nX-Request-Id: req_a",
		Body:   []byte("{\"id\":\"x\"}\n\x00\xff\xfe binary-safe"),
	}
	if err := s.CompleteIdempotency(ctx(t), k, "req_other", resp, t0.Add(time.Hour)); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("CompleteIdempotency by a non-owner: %v, want ErrNotFound", err)
	}
	if err := s.CompleteIdempotency(ctx(t), k, "req_a", resp, t0.Add(time.Hour)); err != nil {
		t.Fatalf("CompleteIdempotency: %v", err)
	}
	res := begin(t, s, claim(k, "body", "req_b", t0.Add(time.Second), time.Minute), tollgate.IdempotencyDone)
	if res.Owner != "req_a" || res.Response.Status != 200 || res.Response.Header != resp.Header || !bytes.Equal(res.Response.Body, resp.Body) {
		t.Errorf("replay = %+v (body %q), want owner req_a and %+v", res, res.Response.Body, resp)
	}
	// A stored response is final: the owner can neither complete it again nor release it.
	if err := s.CompleteIdempotency(ctx(t), k, "req_a", resp, t0.Add(time.Hour)); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("second CompleteIdempotency: %v, want ErrNotFound", err)
	}
	if err := s.ReleaseIdempotency(ctx(t), k, "req_a"); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("ReleaseIdempotency after completion: %v, want ErrNotFound", err)
	}
	begin(t, s, claim(k, "body", "req_c", t0.Add(2*time.Second), time.Minute), tollgate.IdempotencyDone)
	begin(t, s, claim(k, "other", "req_c", t0.Add(2*time.Second), time.Minute), tollgate.IdempotencyMismatch)

	// An empty body is stored as empty, not lost.
	k2 := idemKey(t)
	k2.Key += "-empty"
	begin(t, s, claim(k2, "body", "req_e", t0, time.Minute), tollgate.IdempotencyStarted)
	if err := s.CompleteIdempotency(ctx(t), k2, "req_e", tollgate.StoredResponse{Status: 204}, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	res = begin(t, s, claim(k2, "body", "req_f", t0, time.Minute), tollgate.IdempotencyDone)
	if res.Response.Status != 204 || res.Response.Body == nil || len(res.Response.Body) != 0 || res.Response.Header != "" {
		t.Errorf("empty response replayed as %+v", res.Response)
	}
}

func testIdemRelease(t *testing.T, s idempotency.Store) {
	k := idemKey(t)
	begin(t, s, claim(k, "body", "req_a", t0, time.Minute), tollgate.IdempotencyStarted)
	if err := s.ReleaseIdempotency(ctx(t), k, "req_b"); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("ReleaseIdempotency by a non-owner: %v, want ErrNotFound", err)
	}
	begin(t, s, claim(k, "body", "req_b", t0, time.Minute), tollgate.IdempotencyInFlight)
	if err := s.ReleaseIdempotency(ctx(t), k, "req_a"); err != nil {
		t.Fatalf("ReleaseIdempotency: %v", err)
	}
	// Released: a retry runs afresh, even with another body.
	res := begin(t, s, claim(k, "another body", "req_c", t0.Add(time.Second), time.Minute), tollgate.IdempotencyStarted)
	if res.Owner != "req_c" {
		t.Errorf("owner after release = %q, want req_c", res.Owner)
	}
	if err := s.ReleaseIdempotency(ctx(t), k, "req_a"); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("second release by the old owner: %v, want ErrNotFound", err)
	}
}

func testIdemLeaseExpiry(t *testing.T, s idempotency.Store) {
	k := idemKey(t)
	begin(t, s, claim(k, "body", "req_a", t0, time.Minute), tollgate.IdempotencyStarted)
	begin(t, s, claim(k, "body", "req_b", t0.Add(time.Minute-time.Microsecond), time.Minute), tollgate.IdempotencyInFlight)
	// The lease ended (req_a's instance died): the next claim takes it over.
	res := begin(t, s, claim(k, "body", "req_c", t0.Add(time.Minute), time.Minute), tollgate.IdempotencyStarted)
	if res.Owner != "req_c" {
		t.Errorf("owner after takeover = %q, want req_c", res.Owner)
	}
	// The old owner, if it was only slow, can no longer touch the key.
	if err := s.RenewIdempotency(ctx(t), k, "req_a", t0.Add(time.Hour)); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("renew by the old owner: %v, want ErrNotFound", err)
	}
	if err := s.CompleteIdempotency(ctx(t), k, "req_a", tollgate.StoredResponse{Status: 200}, t0.Add(time.Hour)); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("complete by the old owner: %v, want ErrNotFound", err)
	}
	if err := s.ReleaseIdempotency(ctx(t), k, "req_a"); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("release by the old owner: %v, want ErrNotFound", err)
	}
	begin(t, s, claim(k, "body", "req_d", t0.Add(time.Minute+time.Second), time.Minute), tollgate.IdempotencyInFlight)
	// A taken-over key also forgets the old fingerprint once it expires.
	begin(t, s, claim(k, "new body", "req_e", t0.Add(3*time.Minute), time.Minute), tollgate.IdempotencyStarted)
}

func testIdemRenew(t *testing.T, s idempotency.Store) {
	k := idemKey(t)
	begin(t, s, claim(k, "body", "req_a", t0, time.Minute), tollgate.IdempotencyStarted)
	if err := s.RenewIdempotency(ctx(t), k, "req_a", t0.Add(2*time.Minute)); err != nil {
		t.Fatalf("RenewIdempotency: %v", err)
	}
	begin(t, s, claim(k, "body", "req_b", t0.Add(2*time.Minute-time.Microsecond), time.Minute), tollgate.IdempotencyInFlight)
	begin(t, s, claim(k, "body", "req_c", t0.Add(2*time.Minute), time.Minute), tollgate.IdempotencyStarted)
	if err := s.RenewIdempotency(ctx(t), tollgate.IdempotencyKey{Scope: k.Scope, Key: "never used"}, "req_a", t0); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("renew of an unknown key: %v, want ErrNotFound", err)
	}
}

func testIdemTTL(t *testing.T, s idempotency.Store) {
	k := idemKey(t)
	begin(t, s, claim(k, "body", "req_a", t0, time.Minute), tollgate.IdempotencyStarted)
	forget := t0.Add(24 * time.Hour)
	if err := s.CompleteIdempotency(ctx(t), k, "req_a", tollgate.StoredResponse{Status: 200, Body: []byte("{}")}, forget); err != nil {
		t.Fatal(err)
	}
	// Remembered past the lease, until the TTL.
	begin(t, s, claim(k, "body", "req_b", forget.Add(-time.Microsecond), time.Minute), tollgate.IdempotencyDone)
	begin(t, s, claim(k, "other", "req_b", forget.Add(-time.Microsecond), time.Minute), tollgate.IdempotencyMismatch)
	// Forgotten: the key runs afresh, with any body.
	begin(t, s, claim(k, "other", "req_c", forget, time.Minute), tollgate.IdempotencyStarted)
}

func testIdemPurge(t *testing.T, s idempotency.Store) {
	scope := tollgate.NewID("acct_")
	key := func(name string) tollgate.IdempotencyKey { return tollgate.IdempotencyKey{Scope: scope, Key: name} }
	// done, expiring at t0+1h; in flight, lease ends at t0+1m; done, expiring at t0+48h.
	begin(t, s, claim(key("old"), "b", "req_1", t0, time.Minute), tollgate.IdempotencyStarted)
	if err := s.CompleteIdempotency(ctx(t), key("old"), "req_1", tollgate.StoredResponse{Status: 200}, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	begin(t, s, claim(key("dead"), "b", "req_2", t0, time.Minute), tollgate.IdempotencyStarted)
	begin(t, s, claim(key("young"), "b", "req_3", t0, time.Minute), tollgate.IdempotencyStarted)
	if err := s.CompleteIdempotency(ctx(t), key("young"), "req_3", tollgate.StoredResponse{Status: 200}, t0.Add(48*time.Hour)); err != nil {
		t.Fatal(err)
	}
	n, err := s.PurgeIdempotency(ctx(t), t0.Add(2*time.Hour), t0.Add(26*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	// Other tests' rows may be purged too (they share the store in the
	// PostgreSQL suite run), so only a lower bound is certain.
	if n < 2 {
		t.Errorf("PurgeIdempotency removed %d rows, want at least 2", n)
	}
	// The purged keys are gone (a non-owner release of a live row would be
	// ErrNotFound too, so check through a claim far in the past: only a row
	// that still exists can make it anything but Started).
	begin(t, s, claim(key("old"), "other", "req_4", t0, time.Minute), tollgate.IdempotencyStarted)
	begin(t, s, claim(key("dead"), "other", "req_5", t0, time.Minute), tollgate.IdempotencyStarted)
	begin(t, s, claim(key("young"), "other", "req_6", t0.Add(2*time.Hour), time.Minute), tollgate.IdempotencyMismatch)
	if n, err := s.PurgeIdempotency(ctx(t), t0.Add(-time.Hour), t0.Add(23*time.Hour)); err != nil || n != 0 {
		t.Errorf("purge before anything expires: %d, %v; want 0", n, err)
	}
}

func testIdemConcurrent(t *testing.T, s idempotency.Store) {
	k := idemKey(t)
	results, errs := beginAtOnce(s, 20, func(i int) tollgate.IdempotencyClaim {
		return claim(k, "body", "req_"+string(rune('a'+i)), t0, time.Minute)
	})
	started := 0
	for i, r := range results {
		if errs[i] != nil {
			t.Fatalf("claim %d: %v", i, errs[i])
		}
		switch r.State {
		case tollgate.IdempotencyStarted:
			started++
		case tollgate.IdempotencyInFlight:
		default:
			t.Errorf("claim %d: state %s, want started or in_flight", i, r.State)
		}
	}
	if started != 1 {
		t.Errorf("%d of %d concurrent claims started, want exactly 1", started, len(results))
	}
}

// lostClaim is a claim as the Keeper makes it: a lost key is remembered for
// a day from the claim that finds it.
func lostClaim(k tollgate.IdempotencyKey, fp, owner string, now time.Time) tollgate.IdempotencyClaim {
	c := claim(k, fp, owner, now, time.Minute)
	c.LostExpires = now.Add(24 * time.Hour)
	return c
}

// A crash between the charge and the stored answer (docs/idempotency.md):
// the holder's lease ends with its charge in the ledger under its request
// id (the claim's owner) and no answer stored. No claim takes the key over:
// it is kept as lost, with the original request id, for every claimant,
// racing or not, until LostExpires; a purge keeps it rather than delete it.
// A holder that died uncharged is taken over as before (testIdemLeaseExpiry).
func testIdemChargedThenLost(t *testing.T, bs BillingStore, s idempotency.Store) {
	acct, key := fundedKey(t, bs, usd("1"), nil)
	charge := func(owner string) {
		t.Helper()
		h := holdOp(acct, key, usd("0.1"), t0)
		h.Hold.RequestID = owner
		apply(t, bs, h)
		apply(t, bs, settleOp(h, usd("0.01"), t0))
	}
	k := idemKey(t)
	owner := tollgate.NewID("req_")
	begin(t, s, lostClaim(k, "body", owner, t0), tollgate.IdempotencyStarted)
	charge(owner) // ... and its instance dies before CompleteIdempotency
	begin(t, s, lostClaim(k, "body", "req_b", t0.Add(30*time.Second)), tollgate.IdempotencyInFlight)

	// The lease ended: racing retries all find the charge.
	results, errs := beginAtOnce(s, 8, func(i int) tollgate.IdempotencyClaim {
		return lostClaim(k, "body", "req_retry"+string(rune('a'+i)), t0.Add(time.Minute))
	})
	for i, r := range results {
		if errs[i] != nil || r.State != tollgate.IdempotencyLost || r.Owner != owner {
			t.Errorf("retry %d after the lease: %s owner %q, %v; want lost, owner %s", i, r.State, r.Owner, errs[i], owner)
		}
	}
	// Remembered as lost for a day from the first claim that found it;
	// another request with the key is a mismatch, as for a stored answer.
	begin(t, s, lostClaim(k, "body", "req_c", t0.Add(time.Hour)), tollgate.IdempotencyLost)
	begin(t, s, lostClaim(k, "other body", "req_d", t0.Add(time.Hour)), tollgate.IdempotencyMismatch)
	if err := s.CompleteIdempotency(ctx(t), k, owner, tollgate.StoredResponse{Status: 200}, t0.Add(48*time.Hour)); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("complete of a lost key by its dead owner: %v, want ErrNotFound", err)
	}
	begin(t, s, lostClaim(k, "body", "req_e", t0.Add(time.Minute+24*time.Hour-time.Microsecond)), tollgate.IdempotencyLost)
	begin(t, s, lostClaim(k, "body", "req_f", t0.Add(time.Minute+24*time.Hour)), tollgate.IdempotencyStarted)

	// Nobody retried before the purge: the purge keeps the key as lost.
	k2 := tollgate.IdempotencyKey{Scope: k.Scope, Key: k.Key + "-purged"}
	owner2 := tollgate.NewID("req_")
	begin(t, s, lostClaim(k2, "body", owner2, t0), tollgate.IdempotencyStarted)
	charge(owner2)
	if _, err := s.PurgeIdempotency(ctx(t), t0.Add(2*time.Hour), t0.Add(26*time.Hour)); err != nil {
		t.Fatal(err)
	}
	res := begin(t, s, lostClaim(k2, "body", "req_g", t0.Add(3*time.Hour)), tollgate.IdempotencyLost)
	if res.Owner != owner2 {
		t.Errorf("lost after a purge: owner %q, want %s", res.Owner, owner2)
	}
	if _, err := s.PurgeIdempotency(ctx(t), t0.Add(27*time.Hour), t0.Add(51*time.Hour)); err != nil {
		t.Fatal(err)
	}
	begin(t, s, lostClaim(k2, "body", "req_h", t0.Add(27*time.Hour)), tollgate.IdempotencyStarted)
	auditClean(t, bs, t0)
}

// beginAtOnce makes n claims (claimOf(i)) from n goroutines at once.
func beginAtOnce(s idempotency.Store, n int, claimOf func(i int) tollgate.IdempotencyClaim) ([]tollgate.IdempotencyResult, []error) {
	results := make([]tollgate.IdempotencyResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { results[i], errs[i] = s.BeginIdempotency(context.Background(), claimOf(i)) })
	}
	wg.Wait()
	return results, errs
}
