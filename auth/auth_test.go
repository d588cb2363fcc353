package auth

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/postgres"
	"github.com/tollgate/tollgate/sqlite"
)

// countingStore counts store queries and can fail AuthVersion or hold KeyByHash.
type countingStore struct {
	tollgate.KeyStore
	lookups, versions atomic.Int64
	versionErr        atomic.Bool
	// gate, when set, is called inside KeyByHash after the store answered.
	gate func()
}

func (s *countingStore) KeyByHash(ctx context.Context, h tollgate.KeyHash) (tollgate.Key, tollgate.Account, error) {
	s.lookups.Add(1)
	k, a, err := s.KeyStore.KeyByHash(ctx, h)
	if s.gate != nil {
		s.gate()
	}
	return k, a, err
}

func (s *countingStore) AuthVersion(ctx context.Context) (int64, error) {
	s.versions.Add(1)
	if s.versionErr.Load() {
		return 0, errors.New("database unreachable")
	}
	return s.KeyStore.AuthVersion(ctx)
}

var now0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

type fixture struct {
	db      tollgate.Store
	account tollgate.Account
}

func newFixture(t *testing.T, db tollgate.Store) *fixture {
	t.Helper()
	if db == nil {
		s, err := sqlite.Open(filepath.Join(t.TempDir(), "auth.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		db = s
	}
	f := &fixture{db: db, account: tollgate.Account{ID: tollgate.NewID("acct_"), Name: "a", Created: now0}}
	if err := db.CreateAccount(t.Context(), f.account); err != nil {
		t.Fatal(err)
	}
	return f
}

// key creates a key on account (the fixture's when "") and returns it with its secret.
func (f *fixture) key(t *testing.T, account string, mod func(*tollgate.Key)) (tollgate.Key, string) {
	t.Helper()
	if account == "" {
		account = f.account.ID
	}
	secret := tollgate.NewKeySecret()
	k := tollgate.Key{ID: tollgate.NewID("key_"), AccountID: account, Prefix: tollgate.DisplayPrefix(secret), Created: now0}
	if mod != nil {
		mod(&k)
	}
	if err := f.db.CreateKey(t.Context(), k, tollgate.HashKey(secret)); err != nil {
		t.Fatal(err)
	}
	return k, secret
}

func wantCode(t *testing.T, what string, err error, want tollgate.Code) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Errorf("%s: got error %v, want success", what, err)
		}
		return
	}
	var te *tollgate.Error
	if !errors.As(err, &te) || te.Code != want {
		t.Errorf("%s: got %v, want code %s", what, err, want)
	}
}

func TestAuthenticateCodes(t *testing.T) {
	f := newFixture(t, nil)
	store := &countingStore{KeyStore: f.db}
	a := New(store, Options{})
	if err := a.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}

	good, goodSecret := f.key(t, "", nil)
	_, revokedSecret := f.key(t, "", nil)
	revokedKey, _, _ := f.db.KeyByHash(t.Context(), tollgate.HashKey(revokedSecret))
	if err := f.db.RevokeKey(t.Context(), revokedKey.ID, now0); err != nil {
		t.Fatal(err)
	}
	_, expiringSecret := f.key(t, "", func(k *tollgate.Key) { k.Expires = now0.Add(time.Hour) })
	disabled := tollgate.Account{ID: tollgate.NewID("acct_"), Name: "off", Created: now0}
	if err := f.db.CreateAccount(t.Context(), disabled); err != nil {
		t.Fatal(err)
	}
	_, disabledSecret := f.key(t, disabled.ID, nil)
	if err := f.db.SetAccountDisabled(t.Context(), disabled.ID, true); err != nil {
		t.Fatal(err)
	}
	unknownSecret := tollgate.NewKeySecret()
	if err := a.Sync(t.Context()); err != nil { // the changes above moved the version
		t.Fatal(err)
	}

	cases := []struct {
		name      string
		header    string
		now       time.Time
		want      tollgate.Code
		noLookups bool // answered without a store query
	}{
		{"empty", "", now0, tollgate.CodeMissingAPIKey, true},
		{"basic scheme", "Basic " + goodSecret, now0, tollgate.CodeMissingAPIKey, true},
		{"bare token", goodSecret, now0, tollgate.CodeMissingAPIKey, true},
		{"bearer without token", "Bearer ", now0, tollgate.CodeMissingAPIKey, true},
		{"bearer alone", "Bearer", now0, tollgate.CodeMissingAPIKey, true},
		{"short token", "Bearer sk-tg-abc", now0, tollgate.CodeInvalidAPIKey, true},
		{"foreign key shape", "Bearer sk-proj-" + strings.Repeat("a", 40), now0, tollgate.CodeInvalidAPIKey, true},
		{"bad character", "Bearer " + goodSecret[:len(goodSecret)-1] + "_", now0, tollgate.CodeInvalidAPIKey, true},
		{"unknown key", "Bearer " + unknownSecret, now0, tollgate.CodeInvalidAPIKey, false},
		{"good", "Bearer " + goodSecret, now0, "", false},
		{"scheme case-insensitive, spaces", "  bEaReR   " + goodSecret + " ", now0, "", false},
		{"revoked", "Bearer " + revokedSecret, now0, tollgate.CodeAPIKeyRevoked, false},
		{"before expiry", "Bearer " + expiringSecret, now0.Add(time.Hour - time.Nanosecond), "", false},
		{"at expiry", "Bearer " + expiringSecret, now0.Add(time.Hour), tollgate.CodeAPIKeyExpired, false},
		{"disabled account", "Bearer " + disabledSecret, now0, tollgate.CodeAccountDisabled, false},
	}
	for _, c := range cases {
		before := store.lookups.Load()
		k, acct, err := a.Authenticate(t.Context(), c.header, c.now)
		wantCode(t, c.name, err, c.want)
		if c.noLookups && store.lookups.Load() != before {
			t.Errorf("%s: the store was queried for a header that cannot be a key", c.name)
		}
		if err != nil {
			// The secret never appears in what a client or a log sees, not even in part.
			for _, s := range []string{goodSecret, revokedSecret, expiringSecret, disabledSecret, unknownSecret} {
				if strings.Contains(err.Error(), s[len(tollgate.KeyPrefix):len(tollgate.KeyPrefix)+8]) {
					t.Errorf("%s: error %q contains part of a key", c.name, err)
				}
			}
			continue
		}
		if c.name == "good" && (k.ID != good.ID || acct.ID != f.account.ID) {
			t.Errorf("%s: got key %s account %s, want %s %s", c.name, k.ID, acct.ID, good.ID, f.account.ID)
		}
	}
}

func TestCacheAvoidsStore(t *testing.T) {
	f := newFixture(t, nil)
	_, secret := f.key(t, "", nil)
	store := &countingStore{KeyStore: f.db}
	a := New(store, Options{})

	// Before the first version read the cache is not trusted: every call queries.
	for range 3 {
		_, _, err := a.Authenticate(t.Context(), "Bearer "+secret, now0)
		wantCode(t, "before Sync", err, "")
	}
	if n := store.lookups.Load(); n != 3 {
		t.Errorf("before Sync: %d store lookups for 3 requests, want 3", n)
	}

	if err := a.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	unknown := tollgate.NewKeySecret()
	store.lookups.Store(0)
	for range 100 {
		_, _, err := a.Authenticate(t.Context(), "Bearer "+secret, now0)
		wantCode(t, "known key", err, "")
		_, _, err = a.Authenticate(t.Context(), "Bearer "+unknown, now0)
		wantCode(t, "unknown key", err, tollgate.CodeInvalidAPIKey)
	}
	if n := store.lookups.Load(); n != 2 {
		t.Errorf("200 requests with 2 distinct keys: %d store lookups, want 2", n)
	}
	st := a.Stats()
	if st.Hits != 198 || st.Found != 1 || st.Missing != 1 {
		t.Errorf("Stats = %+v; want 198 hits, 1 found, 1 missing", st)
	}

	// A new key bumps the version; Sync drops the negative entry so it works at once.
	created := tollgate.Key{ID: tollgate.NewID("key_"), AccountID: f.account.ID, Prefix: "p", Created: now0}
	if err := f.db.CreateKey(t.Context(), created, tollgate.HashKey(unknown)); err != nil {
		t.Fatal(err)
	}
	if err := a.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, _, err := a.Authenticate(t.Context(), "Bearer "+unknown, now0)
	wantCode(t, "key created after a negative entry", err, "")

	// A revocation too.
	if err := f.db.RevokeKey(t.Context(), created.ID, now0); err != nil {
		t.Fatal(err)
	}
	_, _, err = a.Authenticate(t.Context(), "Bearer "+unknown, now0)
	wantCode(t, "revoked, before Sync (cached)", err, "")
	if err := a.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, _, err = a.Authenticate(t.Context(), "Bearer "+unknown, now0)
	wantCode(t, "revoked, after Sync", err, tollgate.CodeAPIKeyRevoked)
}

func TestCacheOff(t *testing.T) {
	f := newFixture(t, nil)
	_, secret := f.key(t, "", nil)
	store := &countingStore{KeyStore: f.db}
	a := New(store, Options{CacheSize: -1})
	if err := a.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		_, _, err := a.Authenticate(t.Context(), "Bearer "+secret, now0)
		wantCode(t, "cache off", err, "")
	}
	if n := store.lookups.Load(); n != 5 {
		t.Errorf("cache off: %d lookups for 5 requests, want 5", n)
	}
}

func TestCacheBounded(t *testing.T) {
	f := newFixture(t, nil)
	a := New(f.db, Options{CacheSize: 3})
	if err := a.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	var secrets []string
	for range 10 {
		_, s := f.key(t, "", nil)
		secrets = append(secrets, s)
	}
	if err := a.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets {
		_, _, err := a.Authenticate(t.Context(), "Bearer "+s, now0)
		wantCode(t, "known key", err, "")
		_, _, err = a.Authenticate(t.Context(), "Bearer "+tollgate.NewKeySecret(), now0)
		wantCode(t, "unknown key", err, tollgate.CodeInvalidAPIKey)
	}
	if st := a.Stats(); st.Found != 3 || st.Missing != 3 {
		t.Errorf("after 10 known and 10 unknown keys with CacheSize 3: %+v; want 3 and 3 entries", st)
	}
}

// TestStaleCacheBypassed: when AuthVersion cannot be read, the cache stops
// being used after MaxStale, so a revocation still takes effect.
func TestStaleCacheBypassed(t *testing.T) {
	f := newFixture(t, nil)
	k, secret := f.key(t, "", nil)
	store := &countingStore{KeyStore: f.db}
	a := New(store, Options{PollInterval: time.Second, MaxStale: 3 * time.Second})
	var clock atomic.Int64 // seconds after now0
	a.clock = func() time.Time { return now0.Add(time.Duration(clock.Load()) * time.Second) }
	if err := a.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, _, err := a.Authenticate(t.Context(), "Bearer "+secret, now0)
	wantCode(t, "first", err, "")

	store.versionErr.Store(true)
	if err := a.Sync(t.Context()); err == nil {
		t.Fatal("Sync with a failing store: got nil error")
	}
	if err := f.db.RevokeKey(t.Context(), k.ID, now0); err != nil {
		t.Fatal(err)
	}
	clock.Store(3) // exactly MaxStale: still served from the cache
	_, _, err = a.Authenticate(t.Context(), "Bearer "+secret, now0)
	wantCode(t, "within MaxStale (cached)", err, "")
	clock.Store(4) // past it: the store answers, every time
	before := store.lookups.Load()
	for range 2 {
		_, _, err = a.Authenticate(t.Context(), "Bearer "+secret, now0)
		wantCode(t, "past MaxStale", err, tollgate.CodeAPIKeyRevoked)
	}
	if n := store.lookups.Load() - before; n != 2 {
		t.Errorf("past MaxStale: %d lookups for 2 requests, want 2", n)
	}

	store.versionErr.Store(false)
	if err := a.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	before = store.lookups.Load()
	for range 3 {
		_, _, err = a.Authenticate(t.Context(), "Bearer "+secret, now0)
		wantCode(t, "recovered", err, tollgate.CodeAPIKeyRevoked)
	}
	if n := store.lookups.Load() - before; n != 1 {
		t.Errorf("after recovery: %d lookups for 3 requests, want 1 (cached again)", n)
	}
}

// TestDropDuringLookup: a lookup that read the row before a change, and
// finishes after the cache was dropped for that change, must not cache the
// old row (else the revocation would be forgotten until the next change).
func TestDropDuringLookup(t *testing.T) {
	f := newFixture(t, nil)
	k, secret := f.key(t, "", nil)
	store := &countingStore{KeyStore: f.db}
	a := New(store, Options{})
	if err := a.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	read, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	store.gate = func() { once.Do(func() { close(read); <-release }) }
	done := make(chan error, 1)
	go func() {
		_, _, err := a.Authenticate(context.Background(), "Bearer "+secret, now0)
		done <- err
	}()
	<-read // the lookup holds the active row
	if err := f.db.RevokeKey(t.Context(), k.ID, now0); err != nil {
		t.Fatal(err)
	}
	if err := a.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	close(release)
	wantCode(t, "in-flight lookup", <-done, "") // it read the row before the revocation
	_, _, err := a.Authenticate(t.Context(), "Bearer "+secret, now0)
	wantCode(t, "after the drop", err, tollgate.CodeAPIKeyRevoked)
}

func TestRunStopsAndPolls(t *testing.T) {
	f := newFixture(t, nil)
	store := &countingStore{KeyStore: f.db}
	a := New(store, Options{PollInterval: time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	waitFor(t, "three polls", func() bool { return store.versions.Load() >= 3 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run after cancel: %v, want context.Canceled", err)
	}
}

func TestAllowModel(t *testing.T) {
	k := tollgate.Key{AllowedModels: []string{"chat-1"}}
	wantCode(t, "allowed", AllowModel(k, "chat-1"), "")
	wantCode(t, "other model", AllowModel(k, "coder-1"), tollgate.CodeModelNotAllowed)
	wantCode(t, "unrestricted", AllowModel(tollgate.Key{}, "coder-1"), "")
}

// waitFor polls cond until it holds or a generous deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRevocationAcrossInstances: two instances (two pools, two
// Authenticators) on one PostgreSQL; a key revoked through one is refused by
// the other once it polls.
func TestRevocationAcrossInstances(t *testing.T) {
	schema := postgres.NewTestSchema(t)
	db1, db2 := postgres.OpenTestSchema(t, schema), postgres.OpenTestSchema(t, schema)
	f := newFixture(t, db1)
	k, secret := f.key(t, "", nil)

	opts := Options{PollInterval: 20 * time.Millisecond}
	a1, a2 := New(db1, opts), New(db2, opts)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go a1.Run(ctx)
	go a2.Run(ctx)
	waitFor(t, "both caches valid", func() bool { return a1.Stats().Version > 0 && a2.Stats().Version > 0 })
	for _, a := range []*Authenticator{a1, a2} {
		for range 2 {
			_, _, err := a.Authenticate(ctx, "Bearer "+secret, now0)
			wantCode(t, "before revocation", err, "")
		}
	}
	if a2.Stats().Hits == 0 {
		t.Fatalf("instance 2 did not cache the key: %+v", a2.Stats())
	}

	if err := db1.RevokeKey(ctx, k.ID, now0); err != nil {
		t.Fatal(err)
	}
	var last error
	waitFor(t, "instance 2 to refuse the revoked key", func() bool {
		_, _, last = a2.Authenticate(ctx, "Bearer "+secret, now0)
		return last != nil
	})
	wantCode(t, "instance 2 after revocation", last, tollgate.CodeAPIKeyRevoked)

	// Disabling the account through instance 2 reaches instance 1 the same way.
	_, secret2 := f.key(t, "", nil)
	waitFor(t, "instance 1 to accept a new key", func() bool {
		_, _, err := a1.Authenticate(ctx, "Bearer "+secret2, now0)
		return err == nil
	})
	if err := db2.SetAccountDisabled(ctx, f.account.ID, true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "instance 1 to refuse a key of a disabled account", func() bool {
		_, _, last = a1.Authenticate(ctx, "Bearer "+secret2, now0)
		return last != nil
	})
	wantCode(t, "instance 1 after disable", last, tollgate.CodeAccountDisabled)
}
