package console

import (
	"context"
	"net/netip"
	"sync"
	"time"

	"github.com/tollgate/tollgate"
)

// attempts counts sign-in attempts per key (an account, a client address)
// in fixed windows. An attempt is counted before its password is checked
// and taken back when it succeeds, so requests sent at once cannot all pass
// the check before any failure is recorded. It lives in the instance's
// memory: behind several instances an attacker gets the limit once per
// instance, which still turns millions of guesses into dozens
// (docs/decisions.md).
type attempts struct {
	mu     sync.Mutex
	window time.Duration
	max    int
	seen   map[string]*attemptWindow
}

type attemptWindow struct {
	start    time.Time
	attempts int
}

// maxTracked bounds the map. Past it, windows that ended are dropped, and
// if that is not enough, arbitrary ones until a tenth is free: someone who
// makes the map overflow (a hundred thousand client networks) can at most
// reset counts of others, never grow the process.
const maxTracked = 100_000

func newAttempts(max int, window time.Duration) *attempts {
	return &attempts{window: window, max: max, seen: map[string]*attemptWindow{}}
}

// try counts an attempt of key at now, unless key has used up its window;
// then it reports false and when the window ends.
func (a *attempts) try(key string, now time.Time) (bool, time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.seen[key]
	if w == nil || now.Sub(w.start) >= a.window {
		if len(a.seen) >= maxTracked {
			a.evict(now)
		}
		w = &attemptWindow{start: now}
		a.seen[key] = w
	}
	if w.attempts >= a.max {
		return false, w.start.Add(a.window)
	}
	w.attempts++
	return true, time.Time{}
}

func (a *attempts) evict(now time.Time) {
	for k, w := range a.seen {
		if now.Sub(w.start) >= a.window {
			delete(a.seen, k)
		}
	}
	for k := range a.seen { // map order is random
		if len(a.seen) < maxTracked*9/10 {
			break
		}
		delete(a.seen, k)
	}
}

// forgive takes back one attempt of key (it succeeded).
func (a *attempts) forgive(key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if w := a.seen[key]; w != nil && w.attempts > 0 {
		w.attempts--
	}
}

// reset forgets key's attempts.
func (a *attempts) reset(key string) {
	a.mu.Lock()
	delete(a.seen, key)
	a.mu.Unlock()
}

// limited is one limiter and the key an attempt counts against.
type limited struct {
	a   *attempts
	key string
}

// tryAll counts the attempt against every limiter, or against none when
// one of them refuses it (then it reports when that one's window ends).
func tryAll(now time.Time, ls ...limited) (bool, time.Time) {
	for i, l := range ls {
		if ok, until := l.a.try(l.key, now); !ok {
			for _, done := range ls[:i] {
				done.a.forgive(done.key)
			}
			return false, until
		}
	}
	return true, time.Time{}
}

// addressKey is what a client address's attempts count against: the
// address, or for IPv6 its /64, the block one subscriber usually holds (one
// client could otherwise rotate through 2^64 addresses).
func addressKey(addr string) string {
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		// A proxy may append the client's port ("1.2.3.4:5678",
		// "[2001:db8::1]:443"): the port must not make a new client.
		ap, perr := netip.ParseAddrPort(addr)
		if perr != nil {
			return addr
		}
		ip = ap.Addr()
	}
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

// plausibleID reports whether s could be an account id (tollgate.NewID's
// shape, or an operator's own of at most 64 letters, digits, '_' and '-'),
// so that what a client types never grows the limiter's keys past that.
func plausibleID(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// hashSlots bounds the password hashes computed at once (each holds
// argon2id's memory, 19 MiB by default, and a core for about 30 ms), so a
// flood of sign-ins or invitations cannot exhaust the process's memory.
type hashSlots chan struct{}

// hashWait is how long a sign-in waits for a slot before it is told to
// try again.
const hashWait = 5 * time.Second

var errHashBusy = tollgate.Errorf(tollgate.CodeRateLimitExceeded,
	"the console is busy checking other passwords; try again in a moment")

// acquire takes a slot, or gives up after hashWait or when ctx ends.
func (s hashSlots) acquire(ctx context.Context) error {
	select {
	case s <- struct{}{}:
		return nil
	default:
	}
	t := time.NewTimer(hashWait)
	defer t.Stop()
	select {
	case s <- struct{}{}:
		return nil
	case <-t.C:
		return errHashBusy
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s hashSlots) release() { <-s }
