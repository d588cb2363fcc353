package console

import (
	"context"
	"sync"
	"time"

	"github.com/tollgate/tollgate"
)

// closedDays caches each account's daily charges before today: the
// overview reads them on every view, and summing 30 days of a busy
// account's ledger costs more than the page may (BenchmarkPages). A day
// that has ended gains no charge, except one recovered from a dead
// instance's journal, which shows within closedDaysTTL.
type closedDays struct {
	mu      sync.Mutex
	entries map[string]closedEntry
}

type closedEntry struct {
	since, until time.Time
	read         time.Time
	days         []tollgate.ChargeDay
}

const (
	closedDaysTTL = 5 * time.Minute
	closedDaysMax = 10_000 // accounts; past it the cache starts over
)

// get returns the account's charges in [since, until), from the cache when
// fresh.
func (c *closedDays) get(ctx context.Context, st Store, account string, since, until, now time.Time) ([]tollgate.ChargeDay, error) {
	c.mu.Lock()
	e, ok := c.entries[account]
	c.mu.Unlock()
	if ok && e.since.Equal(since) && e.until.Equal(until) && now.Sub(e.read) < closedDaysTTL {
		return e.days, nil
	}
	days, err := st.DailyCharges(ctx, tollgate.UsageFilter{AccountID: account, Since: since, Until: until})
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.entries == nil || len(c.entries) >= closedDaysMax {
		c.entries = map[string]closedEntry{}
	}
	c.entries[account] = closedEntry{since: since, until: until, read: now, days: days}
	c.mu.Unlock()
	return days, nil
}
