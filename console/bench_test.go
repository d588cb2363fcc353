package console

import (
	"context"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/postgres"
)

// BenchmarkPages answers each signed-in page for an account with 10,000
// charges over the last 30 days, over loopback HTTP (the bar: every page
// under 50 ms), on SQLite and, when $TOLLGATE_TEST_POSTGRES is set, on
// PostgreSQL.
func BenchmarkPages(b *testing.B) {
	b.Run("sqlite", func(b *testing.B) { benchPages(b, newEnv(b, Options{})) })
	if os.Getenv(postgres.TestEnv) != "" {
		b.Run("postgres", func(b *testing.B) { benchPages(b, newEnvStore(b, Options{}, postgres.OpenTest(b))) })
	}
}

// forgetSavedDays deletes the account's saved past days (a save that keeps
// none of them).
func (e *env) forgetSavedDays(tb testing.TB) {
	if err := e.st.SaveDays(context.Background(), e.acct.ID, e.clock.now().AddDate(1, 0, 0), nil); err != nil {
		tb.Fatal(err)
	}
}

func benchPages(b *testing.B, e *env) {
	now := e.clock.now()
	models := []string{"tg-chat", "tg-mini"}
	const rows = 10_000
	ops := make([]*tollgate.BillingOp, 0, 1000)
	for i := range rows {
		at := now.Add(-time.Duration(i) * (30 * 24 * time.Hour / rows))
		ops = append(ops, chargeOps(e.key, models[i%2], tollgate.MustParseAmount("0.000123"), at)...)
		if len(ops) == cap(ops) || i == rows-1 {
			if err := e.st.ApplyBilling(context.Background(), ops); err != nil {
				b.Fatal(err)
			}
			ops = ops[:0]
		}
	}
	br := e.browser(b)
	br.setPassword(e.acct.ID, password)
	// Sign-in (a form's answer, not a page): the password's hash and the
	// overview's past days summed for the page it sends the browser to.
	b.Run("sign-in", func(b *testing.B) {
		for b.Loop() {
			e.con.closed = closedDays{}
			if r := br.signin(e.acct.ID, password); r.status != http.StatusSeeOther {
				b.Fatalf("sign-in: %d", r.status)
			}
		}
	})
	// The first view after sign-in.
	b.Run("/console/ after sign-in", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			e.con.closed = closedDays{}
			if r := br.signin(e.acct.ID, password); r.status != http.StatusSeeOther {
				b.Fatalf("sign-in: %d", r.status)
			}
			b.StartTimer()
			if r := br.get("/console/"); r.status != 200 {
				b.Fatalf("overview: %d", r.status)
			}
		}
	})
	// The overview with nothing in memory: a session older than the
	// instance (restarted since the sign-in), which reads the past days
	// saved in the store.
	b.Run("/console/ cold", func(b *testing.B) {
		for b.Loop() {
			e.con.closed = closedDays{}
			if r := br.get("/console/"); r.status != 200 {
				b.Fatalf("overview: %d", r.status)
			}
		}
	})
	// The same with nothing saved either (the table emptied): the 30 days
	// are summed from the ledger, and saved.
	b.Run("/console/ cold, nothing saved", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			e.con.closed = closedDays{}
			e.forgetSavedDays(b)
			b.StartTimer()
			if r := br.get("/console/"); r.status != 200 {
				b.Fatalf("overview: %d", r.status)
			}
		}
	})
	// The first view of a new day: yesterday's sums are read, the other 29
	// days' are cached.
	b.Run("/console/ new day", func(b *testing.B) {
		yesterday := now.Truncate(24*time.Hour).AddDate(0, 0, -1)
		for b.Loop() {
			a := e.con.closed.account(e.acct.ID)
			a.mu.Lock()
			delete(a.days, yesterday)
			a.out = nil
			a.mu.Unlock()
			if r := br.get("/console/"); r.status != 200 {
				b.Fatalf("overview: %d", r.status)
			}
		}
	})
	for _, path := range []string{"/console/", "/console/keys", "/console/activity", "/console/activity?page=100&model=tg-chat", "/console/activity.csv"} {
		b.Run(path, func(b *testing.B) {
			for b.Loop() {
				if r := br.get(path); r.status != 200 {
					b.Fatalf("%s: %d", path, r.status)
				}
			}
		})
	}
}
