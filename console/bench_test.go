package console

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
)

// BenchmarkPages answers each signed-in page for an account with 10,000
// charges over the last 30 days, over loopback HTTP (the bar: every
// page under 50 ms).
func BenchmarkPages(b *testing.B) {
	e := newEnv(b, Options{})
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
	if r := br.signin(e.acct.ID, password); r.status != http.StatusSeeOther {
		b.Fatalf("sign-in: %d", r.status)
	}
	// The overview's first view of the day: nothing cached.
	b.Run("/console/ cold", func(b *testing.B) {
		for b.Loop() {
			e.con.closed = closedDays{}
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
