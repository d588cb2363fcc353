package tollgate

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Account holds a prepaid USD balance; keys belong to one account.
type Account struct {
	ID       string    `json:"id"`
	Name     string    `json:"name"`
	Created  time.Time `json:"created"`
	Disabled bool      `json:"disabled"`
	// Balance is the settled balance (credits minus debits minus charges).
	// Holds for requests in flight are kept apart; see the billing store.
	Balance Amount `json:"balance"`
}

// Key is an API key's stored record. The secret itself is never stored: only
// its SHA-256 hash (see KeyHash) and a short prefix for listings.
type Key struct {
	ID        string    `json:"id"`
	AccountID string    `json:"account_id"`
	Name      string    `json:"name"`
	Prefix    string    `json:"prefix"` // e.g. "sk-tg-AbCd", shown in listings
	Created   time.Time `json:"created"`
	// Expires is zero when the key never expires.
	Expires time.Time `json:"expires,omitzero"`
	// Revoked is zero while the key is active.
	Revoked time.Time `json:"revoked,omitzero"`
	// AllowedModels restricts the key to these catalogue ids; empty means all.
	AllowedModels []string `json:"allowed_models"`
	// SpendLimit caps what the key may spend in all (charges plus holds in
	// flight); 0 means no limit beyond the account's balance.
	SpendLimit Amount `json:"spend_limit,omitzero"`
	// RPM and TPM cap requests and tokens per minute (0: no limit).
	RPM int64 `json:"rpm,omitzero"`
	TPM int64 `json:"tpm,omitzero"`
}

// Active reports whether the key may be used at now (not revoked, not expired).
func (k Key) Active(now time.Time) bool {
	return k.Revoked.IsZero() && (k.Expires.IsZero() || now.Before(k.Expires))
}

// AllowsModel reports whether the key may call model.
func (k Key) AllowsModel(model string) bool {
	if len(k.AllowedModels) == 0 {
		return true
	}
	for _, m := range k.AllowedModels {
		if m == model {
			return true
		}
	}
	return false
}

// KeyHash is the SHA-256 of a key's secret. Keys are 32 random base62
// characters (~190 bits), so a fast unsalted hash is safe: no dictionary or
// brute force can reach such a space, and a lookup by hash stays one index probe.
type KeyHash [32]byte

// HashKey hashes a secret key.
func HashKey(secret string) KeyHash { return sha256.Sum256([]byte(secret)) }

// String is the hex form used in the database.
func (h KeyHash) String() string { return hex.EncodeToString(h[:]) }

// Equal compares in constant time.
func (h KeyHash) Equal(o KeyHash) bool { return subtle.ConstantTimeCompare(h[:], o[:]) == 1 }

// KeyPrefix is what every tollgate key starts with.
const KeyPrefix = "sk-tg-"

const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// NewKeySecret returns a fresh key: "sk-tg-" + 32 base62 characters from
// crypto/rand (rejection sampling, so every character is uniform).
func NewKeySecret() string {
	return KeyPrefix + randomBase62(32)
}

// NewID returns a random identifier with the given prefix, e.g. "acct_" + 16 base62.
func NewID(prefix string) string { return prefix + randomBase62(16) }

// NewOrderedID returns an identifier that sorts by creation time: prefix, 9
// base62 digits of the Unix time in microseconds (fixed width, good until
// the year 2398), 6 random base62 characters drawn once per process, and a
// 5-digit base62 counter. Ids made later sort later (to the microsecond),
// so a database index on them grows at its right edge instead of writing a
// random page per insert; the process part keeps instances apart and the
// counter keeps one process's ids apart within a microsecond, without a
// system call per id.
func NewOrderedID(prefix string, now time.Time) string {
	var b [9 + 6 + 5]byte
	us := uint64(now.UnixMicro())
	for i := 8; i >= 0; i-- {
		b[i] = base62[us%62]
		us /= 62
	}
	copy(b[9:15], orderedIDProcess)
	n := orderedIDCounter.Add(1)
	for i := len(b) - 1; i >= 15; i-- {
		b[i] = base62[n%62]
		n /= 62
	}
	return prefix + string(b[:])
}

var (
	orderedIDProcess = randomBase62(6)
	orderedIDCounter atomic.Uint64
)

func randomBase62(n int) string {
	var b strings.Builder
	b.Grow(n)
	buf := make([]byte, 64)
	for b.Len() < n {
		if _, err := rand.Read(buf); err != nil {
			panic("crypto/rand failed: " + err.Error())
		}
		for _, c := range buf {
			if c >= 248 { // 248 = 4*62: reject to keep the distribution uniform
				continue
			}
			b.WriteByte(base62[c%62])
			if b.Len() == n {
				break
			}
		}
	}
	return b.String()
}

// LooksLikeKey reports whether s has the shape of a tollgate key.
func LooksLikeKey(s string) bool {
	if len(s) != len(KeyPrefix)+32 || !strings.HasPrefix(s, KeyPrefix) {
		return false
	}
	for i := len(KeyPrefix); i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z') {
			return false
		}
	}
	return true
}

// DisplayPrefix is the part of a key shown in listings: "sk-tg-" and 4 characters.
func DisplayPrefix(secret string) string {
	if len(secret) < len(KeyPrefix)+4 {
		return secret
	}
	return secret[:len(KeyPrefix)+4]
}

// AccountStore manages accounts.
type AccountStore interface {
	CreateAccount(ctx context.Context, a Account) error
	Account(ctx context.Context, id string) (Account, error) // ErrNotFound
	Accounts(ctx context.Context) ([]Account, error)
	SetAccountDisabled(ctx context.Context, id string, disabled bool) error
}

// KeyStore manages API keys.
type KeyStore interface {
	CreateKey(ctx context.Context, k Key, h KeyHash) error
	// KeyByHash returns the key and its account; ErrNotFound if no key has that hash.
	KeyByHash(ctx context.Context, h KeyHash) (Key, Account, error)
	Keys(ctx context.Context, accountID string) ([]Key, error) // all accounts when accountID == ""
	RevokeKey(ctx context.Context, id string, at time.Time) error
	// AuthVersion is a counter that grows on every change to a key or an
	// account's disabled flag; caches compare it to know when to drop entries.
	AuthVersion(ctx context.Context) (int64, error)
}

// TrafficCount is a number of served requests of one backend class in one hour.
type TrafficCount struct {
	Hour     time.Time // truncated to the hour, UTC
	Class    BackendClass
	Requests int64
}

// TrafficStore keeps the hourly traffic buckets behind /pricing's network_uptime_7d.
type TrafficStore interface {
	// AddTraffic adds the counts to their buckets (upsert, additive, atomic).
	AddTraffic(ctx context.Context, counts []TrafficCount) error
	// Traffic returns requests served by the network and in all, in buckets at or after since.
	Traffic(ctx context.Context, since time.Time) (network, total int64, err error)
}

// Store is everything the service keeps in its database.
type Store interface {
	AccountStore
	KeyStore
	TrafficStore
	Close() error
}

// ParseExpiry reads when a key stops working: a duration from now ("720h",
// "30d") or a time (RFC 3339, or a date meaning midnight UTC), which must be
// after now.
func ParseExpiry(s string, now time.Time) (time.Time, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.Atoi(days); err == nil && n > 0 {
			return now.AddDate(0, 0, n), nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d <= 0 {
			return time.Time{}, fmt.Errorf("%q: want a positive duration", s)
		}
		return now.Add(d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, time.DateOnly} {
		if t, err := time.Parse(layout, s); err == nil {
			if !t.After(now) {
				return time.Time{}, fmt.Errorf("%q is in the past", s)
			}
			return t.UTC().Truncate(time.Microsecond), nil
		}
	}
	return time.Time{}, fmt.Errorf("%q: want a duration (720h, 30d) or a time (2026-01-31T00:00:00Z, 2026-01-31)", s)
}
