package console

import (
	"sync"
	"time"
)

// attempts counts failed sign-ins per account and per client address in
// fixed windows. It lives in the instance's memory: behind several
// instances an attacker gets the limit once per instance, which still
// turns millions of guesses into dozens (docs/decisions.md).
type attempts struct {
	mu     sync.Mutex
	window time.Duration
	max    int
	seen   map[string]*attemptWindow
}

type attemptWindow struct {
	start    time.Time
	failures int
}

// maxTracked bounds the map; past it, windows that ended are dropped.
const maxTracked = 100_000

func newAttempts(max int, window time.Duration) *attempts {
	return &attempts{window: window, max: max, seen: map[string]*attemptWindow{}}
}

// blocked reports whether key has used up its failures at now, and when
// its window ends.
func (a *attempts) blocked(key string, now time.Time) (bool, time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.seen[key]
	if w == nil || now.Sub(w.start) >= a.window {
		return false, time.Time{}
	}
	return w.failures >= a.max, w.start.Add(a.window)
}

// fail counts one failure of key.
func (a *attempts) fail(key string, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.seen[key]
	if w == nil || now.Sub(w.start) >= a.window {
		if len(a.seen) >= maxTracked {
			for k, old := range a.seen {
				if now.Sub(old.start) >= a.window {
					delete(a.seen, k)
				}
			}
		}
		w = &attemptWindow{start: now}
		a.seen[key] = w
	}
	w.failures++
}

// reset forgets key's failures (after a successful sign-in).
func (a *attempts) reset(key string) {
	a.mu.Lock()
	delete(a.seen, key)
	a.mu.Unlock()
}
