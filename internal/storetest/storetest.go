// Package storetest is the conformance suite every tollgate.Store must pass
// (SQLite and PostgreSQL alike): what the service relies on, stated once.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/idempotency"
)

// Store is what the suite tests: everything a store keeps for the service
// (accounts and keys, traffic, billing and the books, the console's
// records, Idempotency-Keys, payments).
type Store interface {
	BillingStore
	tollgate.ConsoleStore
	idempotency.Store
	tollgate.PaymentStore
}

// Run runs the suite. open must return a fresh, empty, migrated store for
// each call (a new file, a new schema); it may register its own cleanup.
func Run(t *testing.T, open func(t *testing.T) Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s tollgate.Store)
	}{
		{"AccountCreateGet", testAccountCreateGet},
		{"AccountDuplicate", testAccountDuplicate},
		{"AccountNotFound", testAccountNotFound},
		{"AccountsList", testAccountsList},
		{"AccountDisable", testAccountDisable},
		{"KeyCreateLookup", testKeyCreateLookup},
		{"KeyUnknownAccount", testKeyUnknownAccount},
		{"KeyDuplicateHash", testKeyDuplicateHash},
		{"KeysList", testKeysList},
		{"KeyRevoke", testKeyRevoke},
		{"AuthVersion", testAuthVersion},
		{"TrafficAdd", testTrafficAdd},
		{"TrafficWindow", testTrafficWindow},
		{"TrafficConcurrent", testTrafficConcurrent},
		{"ConcurrentWrites", testConcurrentWrites},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := open(t)
			tc.fn(t, s)
		})
	}
	t.Run("Idempotency", func(t *testing.T) {
		t.Parallel()
		testIdempotency(t, open(t))
	})
	runBilling(t, open)
	runConsole(t, open)
	runPayments(t, open)
}

// t0 is a fixed instant with sub-microsecond digits, which stores drop.
var t0 = time.Date(2025, 3, 14, 15, 9, 26, 535897932, time.UTC)

func ctx(t *testing.T) context.Context { return t.Context() }

func newAccount(t *testing.T, s tollgate.Store, name string) tollgate.Account {
	t.Helper()
	a := tollgate.Account{ID: tollgate.NewID("acct_"), Name: name, Created: t0, Balance: tollgate.MustParseAmount("12.000000000345")}
	if err := s.CreateAccount(ctx(t), a); err != nil {
		t.Fatalf("CreateAccount(%s): %v", name, err)
	}
	a.Created = a.Created.Truncate(time.Microsecond)
	return a
}

func newKey(t *testing.T, s tollgate.Store, accountID string, mod func(*tollgate.Key)) (tollgate.Key, string) {
	t.Helper()
	secret := tollgate.NewKeySecret()
	k := tollgate.Key{
		ID:        tollgate.NewID("key_"),
		AccountID: accountID,
		Name:      "test key",
		Prefix:    tollgate.DisplayPrefix(secret),
		Created:   t0,
	}
	if mod != nil {
		mod(&k)
	}
	if err := s.CreateKey(ctx(t), k, tollgate.HashKey(secret)); err != nil {
		t.Fatalf("CreateKey: %v", err)
	}
	return normKey(k), secret
}

// normKey is k as a store returns it: times to the microsecond, UTC, models never nil.
func normKey(k tollgate.Key) tollgate.Key {
	trunc := func(t time.Time) time.Time {
		if t.IsZero() {
			return t
		}
		return t.UTC().Truncate(time.Microsecond)
	}
	k.Created, k.Expires, k.Revoked = trunc(k.Created), trunc(k.Expires), trunc(k.Revoked)
	if k.AllowedModels == nil {
		k.AllowedModels = []string{}
	}
	return k
}

func equalAccount(t *testing.T, what string, got, want tollgate.Account) {
	t.Helper()
	if got.ID != want.ID || got.Name != want.Name || !got.Created.Equal(want.Created) ||
		got.Disabled != want.Disabled || got.Balance != want.Balance {
		t.Errorf("%s: got %+v, want %+v", what, got, want)
	}
	if got.Created.Location() != time.UTC {
		t.Errorf("%s: Created in %v, want UTC", what, got.Created.Location())
	}
}

func equalKey(t *testing.T, what string, got, want tollgate.Key) {
	t.Helper()
	if got.ID != want.ID || got.AccountID != want.AccountID || got.Name != want.Name || got.Prefix != want.Prefix ||
		!got.Created.Equal(want.Created) || !got.Expires.Equal(want.Expires) || !got.Revoked.Equal(want.Revoked) ||
		!slices.Equal(got.AllowedModels, want.AllowedModels) {
		t.Errorf("%s:\n got  %+v\n want %+v", what, got, want)
	}
	if got.AllowedModels == nil {
		t.Errorf("%s: AllowedModels is nil, want an empty slice (JSON [])", what)
	}
}

func wantNotFound(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("%s: got error %v, want tollgate.ErrNotFound", what, err)
	}
}

func authVersion(t *testing.T, s tollgate.Store) int64 {
	t.Helper()
	v, err := s.AuthVersion(ctx(t))
	if err != nil {
		t.Fatalf("AuthVersion: %v", err)
	}
	return v
}

func testAccountCreateGet(t *testing.T, s tollgate.Store) {
	want := newAccount(t, s, "Ada")
	got, err := s.Account(ctx(t), want.ID)
	if err != nil {
		t.Fatalf("Account: %v", err)
	}
	equalAccount(t, "Account", got, want)

	// A negative balance and the extremes of int64 survive exactly.
	for _, bal := range []tollgate.Amount{-1, 1<<63 - 1, -1 << 63} {
		a := tollgate.Account{ID: tollgate.NewID("acct_"), Name: "edge", Created: t0, Balance: bal, Disabled: true}
		if err := s.CreateAccount(ctx(t), a); err != nil {
			t.Fatalf("CreateAccount(balance %d): %v", bal, err)
		}
		got, err := s.Account(ctx(t), a.ID)
		if err != nil {
			t.Fatalf("Account: %v", err)
		}
		if got.Balance != bal || !got.Disabled {
			t.Errorf("balance %d disabled true: got balance %d disabled %t", bal, got.Balance, got.Disabled)
		}
	}

	if err := s.CreateAccount(ctx(t), tollgate.Account{Name: "no id", Created: t0}); err == nil {
		t.Errorf("CreateAccount without ID: got nil error")
	}
}

func testAccountDuplicate(t *testing.T, s tollgate.Store) {
	a := newAccount(t, s, "first")
	err := s.CreateAccount(ctx(t), tollgate.Account{ID: a.ID, Name: "second", Created: t0})
	if tollgate.ErrorCode(err) != tollgate.CodeConflict {
		t.Errorf("CreateAccount with an existing id: got %v, want code %s", err, tollgate.CodeConflict)
	}
	got, err := s.Account(ctx(t), a.ID)
	if err != nil || got.Name != "first" {
		t.Errorf("after duplicate: got %+v, %v; want the first account untouched", got, err)
	}
}

func testAccountNotFound(t *testing.T, s tollgate.Store) {
	_, err := s.Account(ctx(t), "acct_missing")
	wantNotFound(t, "Account(missing)", err)
	wantNotFound(t, "SetAccountDisabled(missing)", s.SetAccountDisabled(ctx(t), "acct_missing", true))
	wantNotFound(t, "RevokeKey(missing)", s.RevokeKey(ctx(t), "key_missing", t0))
	_, _, err = s.KeyByHash(ctx(t), tollgate.HashKey(tollgate.NewKeySecret()))
	wantNotFound(t, "KeyByHash(unknown)", err)
}

func testAccountsList(t *testing.T, s tollgate.Store) {
	got, err := s.Accounts(ctx(t))
	if err != nil {
		t.Fatalf("Accounts on an empty store: %v", err)
	}
	if got == nil || len(got) != 0 {
		t.Errorf("Accounts on an empty store: got %#v, want an empty non-nil slice", got)
	}
	var want []tollgate.Account
	for i := range 3 {
		a := tollgate.Account{ID: fmt.Sprintf("acct_%d", i), Name: fmt.Sprintf("n%d", i), Created: t0.Add(time.Duration(2-i) * time.Hour)}
		if err := s.CreateAccount(ctx(t), a); err != nil {
			t.Fatal(err)
		}
		a.Created = a.Created.Truncate(time.Microsecond)
		want = append([]tollgate.Account{a}, want...) // created later = listed earlier here
	}
	got, err = s.Accounts(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("Accounts: got %d, want %d", len(got), len(want))
	}
	for i := range want {
		equalAccount(t, fmt.Sprintf("Accounts[%d] (oldest first)", i), got[i], want[i])
	}
}

func testAccountDisable(t *testing.T, s tollgate.Store) {
	a := newAccount(t, s, "Bob")
	k, secret := newKey(t, s, a.ID, nil)
	_ = k
	if err := s.SetAccountDisabled(ctx(t), a.ID, true); err != nil {
		t.Fatal(err)
	}
	got, err := s.Account(ctx(t), a.ID)
	if err != nil || !got.Disabled {
		t.Fatalf("after disable: got %+v, %v; want Disabled", got, err)
	}
	_, ka, err := s.KeyByHash(ctx(t), tollgate.HashKey(secret))
	if err != nil || !ka.Disabled {
		t.Errorf("KeyByHash after disable: account %+v, %v; want Disabled", ka, err)
	}
	if err := s.SetAccountDisabled(ctx(t), a.ID, false); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Account(ctx(t), a.ID); got.Disabled {
		t.Errorf("after enable: still disabled")
	}
}

func testKeyCreateLookup(t *testing.T, s tollgate.Store) {
	a := newAccount(t, s, "Cy")
	cases := map[string]func(*tollgate.Key){
		"plain":    nil,
		"expiring": func(k *tollgate.Key) { k.Expires = t0.Add(30*24*time.Hour + 123456789) },
		"models":   func(k *tollgate.Key) { k.AllowedModels = []string{"coder-1", "chat-1"} },
		"unnamed":  func(k *tollgate.Key) { k.Name = "" },
	}
	for name, mod := range cases {
		want, secret := newKey(t, s, a.ID, mod)
		gk, ga, err := s.KeyByHash(ctx(t), tollgate.HashKey(secret))
		if err != nil {
			t.Fatalf("%s: KeyByHash: %v", name, err)
		}
		equalKey(t, name+": KeyByHash key", gk, want)
		equalAccount(t, name+": KeyByHash account", ga, a)
	}
	// A hash that differs from a stored one in one bit is not found.
	_, secret := newKey(t, s, a.ID, nil)
	h := tollgate.HashKey(secret)
	h[31] ^= 1
	_, _, err := s.KeyByHash(ctx(t), h)
	wantNotFound(t, "KeyByHash(one bit off)", err)
}

func testKeyUnknownAccount(t *testing.T, s tollgate.Store) {
	before := authVersion(t, s)
	secret := tollgate.NewKeySecret()
	err := s.CreateKey(ctx(t), tollgate.Key{ID: tollgate.NewID("key_"), AccountID: "acct_missing", Prefix: "sk-tg-x", Created: t0}, tollgate.HashKey(secret))
	wantNotFound(t, "CreateKey(unknown account)", err)
	if keys, err := s.Keys(ctx(t), ""); err != nil || len(keys) != 0 {
		t.Errorf("Keys after a failed create: %v, %v; want none", keys, err)
	}
	if after := authVersion(t, s); after != before {
		t.Errorf("AuthVersion moved from %d to %d on a failed create", before, after)
	}
}

func testKeyDuplicateHash(t *testing.T, s tollgate.Store) {
	a := newAccount(t, s, "Di")
	first, secret := newKey(t, s, a.ID, nil)
	err := s.CreateKey(ctx(t), tollgate.Key{ID: tollgate.NewID("key_"), AccountID: a.ID, Prefix: "p", Created: t0}, tollgate.HashKey(secret))
	if tollgate.ErrorCode(err) != tollgate.CodeConflict {
		t.Errorf("CreateKey with an existing hash: got %v, want code %s", err, tollgate.CodeConflict)
	}
	err = s.CreateKey(ctx(t), tollgate.Key{ID: first.ID, AccountID: a.ID, Prefix: "p", Created: t0}, tollgate.HashKey(tollgate.NewKeySecret()))
	if tollgate.ErrorCode(err) != tollgate.CodeConflict {
		t.Errorf("CreateKey with an existing id: got %v, want code %s", err, tollgate.CodeConflict)
	}
	if keys, _ := s.Keys(ctx(t), a.ID); len(keys) != 1 {
		t.Errorf("Keys after duplicates: got %d keys, want 1", len(keys))
	}
}

func testKeysList(t *testing.T, s tollgate.Store) {
	a, b := newAccount(t, s, "A"), newAccount(t, s, "B")
	empty, err := s.Keys(ctx(t), a.ID)
	if err != nil || empty == nil || len(empty) != 0 {
		t.Errorf("Keys of an account without keys: %#v, %v; want an empty non-nil slice", empty, err)
	}
	var wantA, wantAll []tollgate.Key
	for i := range 4 {
		acct := a.ID
		if i%2 == 1 {
			acct = b.ID
		}
		k, _ := newKey(t, s, acct, func(k *tollgate.Key) {
			k.Created = t0.Add(time.Duration(i) * time.Minute)
			k.Name = fmt.Sprintf("k%d", i)
		})
		if acct == a.ID {
			wantA = append(wantA, k)
		}
		wantAll = append(wantAll, k)
	}
	for _, c := range []struct {
		account string
		want    []tollgate.Key
	}{{a.ID, wantA}, {"", wantAll}, {"acct_missing", nil}} {
		got, err := s.Keys(ctx(t), c.account)
		if err != nil {
			t.Fatalf("Keys(%q): %v", c.account, err)
		}
		if len(got) != len(c.want) {
			t.Fatalf("Keys(%q): got %d keys, want %d", c.account, len(got), len(c.want))
		}
		for i := range got {
			equalKey(t, fmt.Sprintf("Keys(%q)[%d]", c.account, i), got[i], c.want[i])
		}
	}
}

func testKeyRevoke(t *testing.T, s tollgate.Store) {
	a := newAccount(t, s, "E")
	k, secret := newKey(t, s, a.ID, nil)
	other, otherSecret := newKey(t, s, a.ID, nil)
	at := t0.Add(time.Hour + 999)
	if err := s.RevokeKey(ctx(t), k.ID, at); err != nil {
		t.Fatal(err)
	}
	got, _, err := s.KeyByHash(ctx(t), tollgate.HashKey(secret))
	if err != nil {
		t.Fatal(err)
	}
	if !got.Revoked.Equal(at.Truncate(time.Microsecond)) || got.Active(at.Add(time.Second)) {
		t.Errorf("after revoke: Revoked %v, want %v and inactive", got.Revoked, at)
	}
	// Revoking again keeps the first time.
	if err := s.RevokeKey(ctx(t), k.ID, at.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	got, _, _ = s.KeyByHash(ctx(t), tollgate.HashKey(secret))
	if !got.Revoked.Equal(at.Truncate(time.Microsecond)) {
		t.Errorf("after a second revoke: Revoked %v, want the first time %v", got.Revoked, at)
	}
	// The other key is untouched.
	og, _, err := s.KeyByHash(ctx(t), tollgate.HashKey(otherSecret))
	if err != nil {
		t.Fatal(err)
	}
	equalKey(t, "other key", og, other)
}

func testAuthVersion(t *testing.T, s tollgate.Store) {
	v := authVersion(t, s)
	step := func(what string, fn func() error) {
		t.Helper()
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		nv := authVersion(t, s)
		if nv <= v {
			t.Errorf("%s: AuthVersion %d -> %d, want it to grow", what, v, nv)
		}
		v = nv
	}
	var a tollgate.Account
	var k tollgate.Key
	step("create account+key", func() error { a = newAccount(t, s, "V"); k, _ = newKey(t, s, a.ID, nil); return nil })
	step("revoke key", func() error { return s.RevokeKey(ctx(t), k.ID, t0) })
	step("disable account", func() error { return s.SetAccountDisabled(ctx(t), a.ID, true) })
	step("enable account", func() error { return s.SetAccountDisabled(ctx(t), a.ID, false) })

	// Reads do not move it.
	if _, err := s.Keys(ctx(t), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Accounts(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if nv := authVersion(t, s); nv != v {
		t.Errorf("reads moved AuthVersion from %d to %d", v, nv)
	}
}

func traffic(t *testing.T, s tollgate.Store, since time.Time) (int64, int64) {
	t.Helper()
	n, all, err := s.Traffic(ctx(t), since)
	if err != nil {
		t.Fatalf("Traffic: %v", err)
	}
	return n, all
}

func testTrafficAdd(t *testing.T, s tollgate.Store) {
	if n, all := traffic(t, s, time.Time{}); n != 0 || all != 0 {
		t.Errorf("empty store: Traffic = %d, %d; want 0, 0", n, all)
	}
	if err := s.AddTraffic(ctx(t), nil); err != nil {
		t.Errorf("AddTraffic(nil): %v", err)
	}
	h := t0.Truncate(time.Hour)
	// Hours are truncated by the store; duplicates in one call add up; zeros are ignored.
	err := s.AddTraffic(ctx(t), []tollgate.TrafficCount{
		{Hour: h.Add(17 * time.Minute), Class: tollgate.ClassNetwork, Requests: 5},
		{Hour: h, Class: tollgate.ClassNetwork, Requests: 2},
		{Hour: h, Class: tollgate.ClassFallback, Requests: 3},
		{Hour: h, Class: tollgate.ClassFallback, Requests: 0},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.AddTraffic(ctx(t), []tollgate.TrafficCount{{Hour: h.In(time.FixedZone("x", 3600)), Class: tollgate.ClassNetwork, Requests: 10}}); err != nil {
		t.Fatal(err)
	}
	if n, all := traffic(t, s, h); n != 17 || all != 20 {
		t.Errorf("Traffic(since hour) = %d, %d; want 17, 20", n, all)
	}
	if n, all := traffic(t, s, h.Add(time.Hour)); n != 0 || all != 0 {
		t.Errorf("Traffic(since next hour) = %d, %d; want 0, 0", n, all)
	}
}

func testTrafficWindow(t *testing.T, s tollgate.Store) {
	now := t0.Truncate(time.Hour)
	var counts []tollgate.TrafficCount
	// One network and two fallback requests in each of the last 10 days' hour now-24h*d.
	for d := range 10 {
		hour := now.Add(-time.Duration(d) * 24 * time.Hour)
		counts = append(counts,
			tollgate.TrafficCount{Hour: hour, Class: tollgate.ClassNetwork, Requests: 1},
			tollgate.TrafficCount{Hour: hour, Class: tollgate.ClassFallback, Requests: 2})
	}
	if err := s.AddTraffic(ctx(t), counts); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		since    time.Time
		net, all int64
	}{
		{now, 1, 3},
		{now.Add(-7 * 24 * time.Hour), 8, 24}, // inclusive: days 0..7
		{now.Add(-7*24*time.Hour + time.Second), 7, 21},
		{time.Time{}, 10, 30},
	} {
		if n, all := traffic(t, s, c.since); n != c.net || all != c.all {
			t.Errorf("Traffic(since %v) = %d, %d; want %d, %d", c.since, n, all, c.net, c.all)
		}
	}
}

func testTrafficConcurrent(t *testing.T, s tollgate.Store) {
	const workers, rounds = 16, 25
	h := t0.Truncate(time.Hour)
	var wg sync.WaitGroup
	errs := make(chan error, workers*rounds)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				// Two buckets per call, the same rows for every worker: the worst case for lost updates.
				err := s.AddTraffic(context.Background(), []tollgate.TrafficCount{
					{Hour: h, Class: tollgate.ClassNetwork, Requests: int64(w + 1)},
					{Hour: h, Class: tollgate.ClassFallback, Requests: int64(r + 1)},
				})
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent AddTraffic: %v", err)
	}
	wantNet := int64(rounds * workers * (workers + 1) / 2)
	wantFb := int64(workers * rounds * (rounds + 1) / 2)
	if n, all := traffic(t, s, h); n != wantNet || all != wantNet+wantFb {
		t.Errorf("after concurrent adds: Traffic = %d, %d; want %d, %d", n, all, wantNet, wantNet+wantFb)
	}
}

func testConcurrentWrites(t *testing.T, s tollgate.Store) {
	const workers = 12
	v0 := authVersion(t, s)
	var wg sync.WaitGroup
	errs := make(chan error, workers*4)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := context.Background()
			a := tollgate.Account{ID: fmt.Sprintf("acct_c%02d", w), Name: "c", Created: t0}
			if err := s.CreateAccount(c, a); err != nil {
				errs <- err
				return
			}
			k := tollgate.Key{ID: fmt.Sprintf("key_c%02d", w), AccountID: a.ID, Prefix: "sk-tg-c", Created: t0}
			if err := s.CreateKey(c, k, tollgate.HashKey(tollgate.NewKeySecret())); err != nil {
				errs <- err
			}
			if err := s.RevokeKey(c, k.ID, t0); err != nil {
				errs <- err
			}
			if err := s.SetAccountDisabled(c, a.ID, true); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent write: %v", err)
	}
	// Every change counted exactly once: 3 per worker (create key, revoke, disable).
	if v := authVersion(t, s); v != v0+3*workers {
		t.Errorf("AuthVersion after %d concurrent workers: %d, want %d", workers, v, v0+3*workers)
	}
	keys, err := s.Keys(ctx(t), "")
	if err != nil || len(keys) != workers {
		t.Fatalf("Keys: %d, %v; want %d", len(keys), err, workers)
	}
	for _, k := range keys {
		if k.Revoked.IsZero() {
			t.Errorf("key %s not revoked", k.ID)
		}
	}
}
