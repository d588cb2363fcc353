package console

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/tollgate/tollgate"
)

// closedDays caches each account's daily charges of the days before today:
// the overview reads 30 of them on every view, and summing a busy account's
// 30 days of ledger rows costs more than the page may (BenchmarkPages). A
// day that has ended almost never gains a row; when it does (a charge
// recovered from a dead instance's journal, by this instance or another, or
// written late by an instance whose clock is behind), its DayMark changes.
// So each view counts the span's rows from the ledger's index alone; when
// that changed, it reads each day's mark and sums again only the days whose
// mark is not the cached one: a day's sums are read once, and a new day adds
// one day's rows.
//
// The days summed are also saved in the store with their marks (SaveDays),
// and an account with nothing in memory starts from the saved days: an
// instance that has just started, or a session signed in on another
// instance, reads 30 days of sums instead of summing the ledger, and sums
// only the days whose mark has changed since they were saved.
type closedDays struct {
	mu       sync.Mutex
	accounts map[string]*accountDays
}

// accountDays is one account's cached days; its lock makes a second view
// wait for the first one's sums rather than read them again.
type accountDays struct {
	mu   sync.Mutex
	days map[time.Time]closedDay
	span tollgate.DayMark // of the days last returned: unchanged, they all are
	out  []tollgate.ChargeDay
}

type closedDay struct {
	mark tollgate.DayMark
	sums []tollgate.ChargeDay
}

const closedDaysMax = 10_000 // accounts; past it the cache starts over

func (c *closedDays) account(id string) *accountDays {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.accounts == nil || len(c.accounts) >= closedDaysMax {
		c.accounts = map[string]*accountDays{}
	}
	a := c.accounts[id]
	if a == nil {
		a = &accountDays{}
		c.accounts[id] = a
	}
	return a
}

// get returns the account's daily charges in [since, until), whole days,
// oldest first. until must be today's start at the latest: only days that
// have ended are saved. The caller must not modify the slice. The saved days
// are a cache: failing to read or write them is logged, not returned.
func (c *closedDays) get(ctx context.Context, st Store, log *slog.Logger, account string, since, until time.Time) ([]tollgate.ChargeDay, error) {
	a := c.account(account)
	a.mu.Lock()
	defer a.mu.Unlock()
	// The usual view: one count over the span's index entries says no day
	// changed.
	span, err := st.SpanMark(ctx, account, since, until)
	if err != nil {
		return nil, err
	}
	if a.out != nil && span == a.span {
		return a.out, nil
	}
	if a.days == nil {
		// Nothing in memory: start from the saved days as if they had been
		// returned last. When the span's mark is their marks together, no
		// day has gained a row since it was saved (rows are only added, so
		// no day's count can have grown while the total stayed), and no day
		// without a saved mark has rows; otherwise the marks below check
		// each saved day like the ones kept in memory.
		saved, err := st.SavedDays(ctx, account, since, until)
		if err != nil {
			log.Warn("console: read the saved past days", "account", account, "err", err)
		}
		a.days = make(map[time.Time]closedDay, len(saved))
		a.span, a.out = tollgate.DayMark{Day: since}, make([]tollgate.ChargeDay, 0, 2*len(saved))
		for _, d := range saved {
			a.days[d.Mark.Day] = closedDay{mark: d.Mark, sums: d.Sums}
			a.out = append(a.out, d.Sums...)
			a.span.Rows += d.Mark.Rows
			a.span.LastSeq = max(a.span.LastSeq, d.Mark.LastSeq)
		}
		if span == a.span {
			return a.out, nil
		}
	}
	marks, err := st.DayMarks(ctx, account, since, until)
	if err != nil {
		return nil, err
	}
	// One sum over the span of the days that changed: usually the day that
	// has just ended, or one a late charge went into. The sums are read after
	// the marks, so they hold at least the rows the marks counted.
	var lo, hi time.Time
	for _, m := range marks {
		if d, ok := a.days[m.Day]; !ok || d.mark != m {
			if lo.IsZero() {
				lo = m.Day
			}
			hi = m.Day.AddDate(0, 0, 1)
		}
	}
	fresh := make(map[time.Time]closedDay, len(marks))
	if !lo.IsZero() {
		sums, err := st.DailyCharges(ctx, tollgate.UsageFilter{AccountID: account, Since: lo, Until: hi})
		if err != nil {
			return nil, err
		}
		for _, s := range sums {
			d := fresh[s.Day]
			d.sums = append(d.sums, s)
			fresh[s.Day] = d
		}
	}
	out := make([]tollgate.ChargeDay, 0, 2*len(marks))
	a.span = tollgate.DayMark{Day: since}
	for _, m := range marks {
		d, summed := fresh[m.Day]
		if !summed && !m.Day.Before(lo) && m.Day.Before(hi) {
			summed = true // in the span summed, with no charge (a credit's day)
		}
		if !summed {
			d = a.days[m.Day]
		}
		d.mark = m
		fresh[m.Day] = d
		out = append(out, d.sums...)
		a.span.Rows += m.Rows
		a.span.LastSeq = max(a.span.LastSeq, m.LastSeq)
	}
	// Days that left the range (or never had rows) are dropped.
	a.days, a.out = fresh, out
	if !lo.IsZero() {
		// Save the days summed, each with the mark read before its sums, and
		// delete the account's saved days that left the range.
		var save []tollgate.SavedDay
		for _, m := range marks {
			if !m.Day.Before(lo) && m.Day.Before(hi) {
				save = append(save, tollgate.SavedDay{Mark: m, Sums: fresh[m.Day].sums})
			}
		}
		if err := st.SaveDays(ctx, account, since, save); err != nil {
			log.Warn("console: save the past days", "account", account, "err", err)
		}
	}
	return out, nil
}
