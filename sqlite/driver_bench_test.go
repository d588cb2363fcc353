package sqlite

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
)

// benchDrivers are the drivers BenchmarkDriver compares. The pure-Go driver
// is always here; driver_cgo_bench_test.go adds mattn/go-sqlite3 when built
// with `-tags mattn` and cgo (CGO_ENABLED=1 and a C compiler), so neither the
// binary nor the default test run compiles cgo. go.mod still lists
// mattn/go-sqlite3: `go mod tidy` keeps what any build tag needs.
var benchDrivers = []driver{moderncDriver, {name: "sqlite", label: "modernc-sync-normal", synchronous: "NORMAL"}}

// BenchmarkDriver measures the store's hot operations through each driver:
// a key lookup (the cache miss of auth), a traffic flush (a small write
// transaction) and a key creation (a write transaction with two statements),
// serially and from many goroutines.
//
//	go test -run '^$' -bench BenchmarkDriver -benchtime 2s ./sqlite/
func BenchmarkDriver(b *testing.B) {
	for _, d := range benchDrivers {
		b.Run(d.label, func(b *testing.B) {
			ctx := context.Background()
			db, err := open(ctx, d, filepath.Join(b.TempDir(), "bench.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			now := time.Now()
			if err := db.CreateAccount(ctx, tollgate.Account{ID: "acct_b", Name: "b", Created: now}); err != nil {
				b.Fatal(err)
			}
			var hashes []tollgate.KeyHash
			for i := range 1000 {
				s := tollgate.NewKeySecret()
				k := tollgate.Key{ID: fmt.Sprintf("key_%d", i), AccountID: "acct_b", Prefix: tollgate.DisplayPrefix(s), Created: now, AllowedModels: []string{"chat-1"}}
				if err := db.CreateKey(ctx, k, tollgate.HashKey(s)); err != nil {
					b.Fatal(err)
				}
				hashes = append(hashes, tollgate.HashKey(s))
			}
			b.Run("KeyByHash", func(b *testing.B) {
				i := 0
				for b.Loop() {
					if _, _, err := db.KeyByHash(ctx, hashes[i%len(hashes)]); err != nil {
						b.Fatal(err)
					}
					i++
				}
			})
			b.Run("KeyByHashParallel", func(b *testing.B) {
				b.RunParallel(func(pb *testing.PB) {
					i := 0
					for pb.Next() {
						if _, _, err := db.KeyByHash(ctx, hashes[i%len(hashes)]); err != nil {
							b.Error(err)
							return
						}
						i++
					}
				})
			})
			counts := []tollgate.TrafficCount{
				{Hour: now, Class: tollgate.ClassNetwork, Requests: 3},
				{Hour: now, Class: tollgate.ClassFallback, Requests: 1},
			}
			b.Run("AddTraffic", func(b *testing.B) {
				for b.Loop() {
					if err := db.AddTraffic(ctx, counts); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("AddTrafficParallel", func(b *testing.B) {
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := db.AddTraffic(ctx, counts); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
			b.Run("CreateKey", func(b *testing.B) {
				for b.Loop() {
					s := tollgate.NewKeySecret()
					k := tollgate.Key{ID: tollgate.NewID("key_"), AccountID: "acct_b", Prefix: "p", Created: now}
					if err := db.CreateKey(ctx, k, tollgate.HashKey(s)); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
