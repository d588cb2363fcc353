package auth

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/postgres"
	"github.com/tollgate/tollgate/sqlite"
)

// BenchmarkAuth compares Authenticate with the cache against a store lookup
// per request (CacheSize -1), on SQLite and on PostgreSQL, serially and from
// many goroutines, over 1,000 keys.
//
//	TOLLGATE_TEST_POSTGRES=postgres://postgres@127.0.0.1:5432/test?sslmode=disable \
//	  go test -run '^$' -bench BenchmarkAuth -benchtime 2s ./auth/
func BenchmarkAuth(b *testing.B) {
	stores := []struct {
		name string
		open func(b *testing.B) tollgate.Store
	}{
		{"sqlite", func(b *testing.B) tollgate.Store {
			db, err := sqlite.Open(filepath.Join(b.TempDir(), "bench.db"))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { db.Close() })
			return db
		}},
		{"postgres", func(b *testing.B) tollgate.Store { return postgres.OpenTest(b) }},
	}
	for _, s := range stores {
		b.Run(s.name, func(b *testing.B) {
			ctx := context.Background()
			st := s.open(b)
			now := time.Now()
			if err := st.CreateAccount(ctx, tollgate.Account{ID: "acct_b", Name: "b", Created: now}); err != nil {
				b.Fatal(err)
			}
			var headers []string
			for i := range 1000 {
				secret := tollgate.NewKeySecret()
				k := tollgate.Key{ID: fmt.Sprintf("key_%d", i), AccountID: "acct_b", Prefix: tollgate.DisplayPrefix(secret), Created: now}
				if err := st.CreateKey(ctx, k, tollgate.HashKey(secret)); err != nil {
					b.Fatal(err)
				}
				headers = append(headers, "Bearer "+secret)
			}
			for _, mode := range []struct {
				name string
				size int
			}{{"cache", 0}, {"store", -1}} {
				a := New(st, Options{CacheSize: mode.size})
				if err := a.Sync(ctx); err != nil {
					b.Fatal(err)
				}
				// The poll loop keeps the cache valid (without it the cache
				// would be bypassed after MaxStale, by design).
				runCtx, stop := context.WithCancel(ctx)
				go a.Run(runCtx)
				b.Cleanup(stop)
				b.Run(mode.name+"/serial", func(b *testing.B) {
					i := 0
					for b.Loop() {
						if _, _, err := a.Authenticate(ctx, headers[i%len(headers)], now); err != nil {
							b.Fatal(err)
						}
						i++
					}
				})
				b.Run(mode.name+"/parallel", func(b *testing.B) {
					b.RunParallel(func(pb *testing.PB) {
						i := 0
						for pb.Next() {
							if _, _, err := a.Authenticate(ctx, headers[i%len(headers)], now); err != nil {
								b.Error(err)
								return
							}
							i++
						}
					})
				})
			}
		})
	}
}
