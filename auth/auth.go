// Package auth authenticates API keys on the hot path of POST
// /v1/chat/completions without a database round trip per request.
//
// Keys are looked up by their SHA-256 hash and the results, found or not,
// are kept in a bounded in-memory cache. A background loop (Run) reads the
// store's AuthVersion, a counter that grows in the same transaction as every
// key creation, key revocation and account disable/enable; when it moves,
// the whole cache is dropped. So a revocation made through any instance
// takes effect on every instance within one poll interval plus one query
// (default 1s + a few ms). If the counter cannot be read, the cache is
// bypassed once the last good read is older than MaxStale, so the bound
// holds even while the database is slow or unreachable: the worst case is
// MaxStale (default 3s), never "until the process restarts".
//
// Secrets never reach a log line or an error message: errors name the
// failure (error.code), not the key.
package auth

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/storefail"
)

// Options tune an Authenticator. The zero value is the default.
type Options struct {
	// PollInterval is how often AuthVersion is read. Default 1s.
	PollInterval time.Duration
	// MaxStale is how old the last successful AuthVersion read may be for
	// the cache to be used; past it every request goes to the store.
	// Default 3 × PollInterval. It is the hard bound on how long a
	// revocation can go unnoticed.
	MaxStale time.Duration
	// CacheSize bounds the found and the not-found entries (each). Default
	// 100,000. A negative value turns the cache off (a store query per request).
	CacheSize int
	// Logger receives poll failures (never keys). Default slog.Default().
	Logger *slog.Logger
}

const (
	defaultPollInterval = time.Second
	defaultCacheSize    = 100_000
)

// Authenticator checks Authorization headers against a KeyStore through a
// cache. Build it with New, start Run in a goroutine, then call Authenticate
// from any number of goroutines.
type Authenticator struct {
	store tollgate.KeyStore
	opts  Options
	clock func() time.Time // the wall clock for cache freshness; tests replace it

	mu      sync.RWMutex
	version int64
	checked time.Time // start of the last successful AuthVersion read; zero: never
	epoch   uint64    // grows on every drop; a lookup caches only if it did not move
	found   map[tollgate.KeyHash]entry
	missing map[tollgate.KeyHash]struct{}

	hits, misses atomic.Int64
	failing      atomic.Bool
}

type entry struct {
	key     tollgate.Key
	account tollgate.Account
}

// New returns an Authenticator on store. Until Run (or Sync) has read the
// AuthVersion once, every request is looked up in the store.
func New(store tollgate.KeyStore, opts Options) *Authenticator {
	if opts.PollInterval <= 0 {
		opts.PollInterval = defaultPollInterval
	}
	if opts.MaxStale <= 0 {
		opts.MaxStale = 3 * opts.PollInterval
	}
	if opts.CacheSize == 0 {
		opts.CacheSize = defaultCacheSize
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Authenticator{
		store:   store,
		opts:    opts,
		clock:   time.Now,
		found:   map[tollgate.KeyHash]entry{},
		missing: map[tollgate.KeyHash]struct{}{},
	}
}

// Run reads AuthVersion now and then every PollInterval until ctx is done,
// dropping the cache whenever it changes. It returns ctx's error.
func (a *Authenticator) Run(ctx context.Context) error {
	t := time.NewTicker(a.opts.PollInterval)
	defer t.Stop()
	for {
		if err := a.Sync(ctx); err != nil && ctx.Err() == nil {
			if !a.failing.Swap(true) {
				a.opts.Logger.Warn("auth: cannot read the auth version; keys are looked up in the store until it recovers", "err", err)
			}
		} else if err == nil && a.failing.Swap(false) {
			a.opts.Logger.Info("auth: auth version readable again")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Sync reads AuthVersion once and drops the cache if it changed. Run calls
// it; tests and start-up code may call it to have a warm, valid cache at once.
func (a *Authenticator) Sync(ctx context.Context) error {
	start := a.clock()
	v, err := a.store.AuthVersion(ctx)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if v != a.version || a.checked.IsZero() {
		a.version = v
		a.epoch++
		clear(a.found)
		clear(a.missing)
	}
	if start.After(a.checked) {
		a.checked = start
	}
	return nil
}

// Authenticate checks an Authorization header value at now and returns the
// key and its account. Failures are *tollgate.Error with code
// missing_api_key (no "Bearer <token>" header), invalid_api_key (a token of
// the wrong shape, without any store query, or an unknown key),
// api_key_revoked, api_key_expired, or account_disabled; a store failure is
// internal_error with the cause in Err.
func (a *Authenticator) Authenticate(ctx context.Context, authorization string, now time.Time) (tollgate.Key, tollgate.Account, error) {
	token, ok := bearerToken(authorization)
	if !ok {
		return tollgate.Key{}, tollgate.Account{}, tollgate.Errorf(tollgate.CodeMissingAPIKey,
			"You didn't provide an API key. Send it in the Authorization header as 'Bearer <API_KEY>'.")
	}
	if !tollgate.LooksLikeKey(token) {
		return tollgate.Key{}, tollgate.Account{}, errInvalid()
	}
	k, acct, err := a.lookup(ctx, tollgate.HashKey(token))
	if err != nil {
		return tollgate.Key{}, tollgate.Account{}, err
	}
	switch {
	case !k.Revoked.IsZero():
		return tollgate.Key{}, tollgate.Account{}, tollgate.Errorf(tollgate.CodeAPIKeyRevoked, "The API key has been revoked.")
	case !k.Expires.IsZero() && !now.Before(k.Expires):
		return tollgate.Key{}, tollgate.Account{}, tollgate.Errorf(tollgate.CodeAPIKeyExpired, "The API key expired at %s.", k.Expires.UTC().Format(time.RFC3339))
	case acct.Disabled:
		return tollgate.Key{}, tollgate.Account{}, tollgate.Errorf(tollgate.CodeAccountDisabled, "The account of this API key is disabled.")
	}
	return k, acct, nil
}

func errInvalid() *tollgate.Error {
	return tollgate.Errorf(tollgate.CodeInvalidAPIKey, "Incorrect API key provided.")
}

// bearerToken extracts the token of "Bearer <token>" (the scheme is
// case-insensitive, RFC 9110 §11.1).
func bearerToken(h string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

func (a *Authenticator) lookup(ctx context.Context, h tollgate.KeyHash) (tollgate.Key, tollgate.Account, error) {
	caching := a.opts.CacheSize > 0
	var epoch uint64
	if caching {
		a.mu.RLock()
		fresh := !a.checked.IsZero() && a.clock().Sub(a.checked) <= a.opts.MaxStale
		if fresh {
			if e, ok := a.found[h]; ok {
				a.mu.RUnlock()
				a.hits.Add(1)
				return e.key, e.account, nil
			}
			if _, ok := a.missing[h]; ok {
				a.mu.RUnlock()
				a.hits.Add(1)
				return tollgate.Key{}, tollgate.Account{}, errInvalid()
			}
		}
		epoch = a.epoch
		a.mu.RUnlock()
		// A stale cache is neither read nor filled.
		caching = fresh
	}
	a.misses.Add(1)
	k, acct, err := a.store.KeyByHash(ctx, h)
	if err != nil && !errors.Is(err, tollgate.ErrNotFound) {
		err = storefail.Wrap("auth_key", err)
		code := tollgate.CodeInternal
		if _, ok := storefail.Op(err); ok {
			code = tollgate.CodeStoreUnavailable
		}
		return k, acct, &tollgate.Error{Code: code, Message: "Authentication is temporarily unavailable.", Err: err}
	}
	if caching {
		a.mu.Lock()
		// A drop since the lookup began means the row read may predate the
		// change that caused it: do not cache it.
		if a.epoch == epoch {
			if err != nil {
				if len(a.missing) >= a.opts.CacheSize {
					evictOne(a.missing)
				}
				a.missing[h] = struct{}{}
			} else {
				if len(a.found) >= a.opts.CacheSize {
					evictOne(a.found)
				}
				a.found[h] = entry{key: k, account: acct}
			}
		}
		a.mu.Unlock()
	}
	if err != nil {
		return tollgate.Key{}, tollgate.Account{}, errInvalid()
	}
	return k, acct, nil
}

// evictOne deletes an arbitrary entry (Go randomises where iteration starts).
func evictOne[V any](m map[tollgate.KeyHash]V) {
	for h := range m {
		delete(m, h)
		return
	}
}

// Stats are counters for metrics and tests.
type Stats struct {
	Hits, Misses   int64 // requests answered from the cache / by the store
	Found, Missing int   // entries cached now
	Version        int64 // last AuthVersion read
}

// Stats returns the current counters.
func (a *Authenticator) Stats() Stats {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return Stats{Hits: a.hits.Load(), Misses: a.misses.Load(), Found: len(a.found), Missing: len(a.missing), Version: a.version}
}

// AllowModel returns 403 model_not_allowed when the key is restricted to
// other models than model.
func AllowModel(k tollgate.Key, model string) error {
	if k.AllowsModel(model) {
		return nil
	}
	return tollgate.ParamErrorf(tollgate.CodeModelNotAllowed, "model", "This API key may not use model %q.", model)
}
