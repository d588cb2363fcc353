package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/postgres"
	"github.com/tollgate/tollgate/simulate"
)

// BenchmarkIdempotencyKey measures what the Idempotency-Key header costs a
// non-streamed request, end to end over loopback HTTP through the real Main
// (billing on) against the simulator:
//
//	none:   no header (the baseline; the header check is one map lookup)
//	key:    a new key on every request (claim, run, store the response)
//	replay: the same key every time (claim finds the stored response; nothing runs)
//
// serial is one client (ns/op is the latency); parallel is 4 clients per
// CPU (ns/op is the inverse of throughput). SQLite always; PostgreSQL too
// with TOLLGATE_TEST_POSTGRES. docs/performance.md has the figures.
//
//	go test -run '^$' -bench IdempotencyKey -benchtime 3s ./cmd/tollgate
func BenchmarkIdempotencyKey(b *testing.B) {
	stores := []string{"sqlite"}
	if os.Getenv(postgres.TestEnv) != "" {
		stores = append(stores, "postgres")
	}
	for _, st := range stores {
		b.Run(st, func(b *testing.B) {
			base, secret := benchMain(b, st)
			body := []byte(`{"model":"bench","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Write one short sentence about gateways."}],"temperature":0.7}`)
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}}
			var seq atomic.Int64
			prefix := strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
			send := func(key string) error {
				req, _ := http.NewRequest(http.MethodPost, base, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+secret)
				if key != "" {
					req.Header.Set("Idempotency-Key", key)
				}
				resp, err := client.Do(req)
				if err != nil {
					return err
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					return fmt.Errorf("status %d", resp.StatusCode)
				}
				return nil
			}
			keyFor := map[string]func() string{
				"none":   func() string { return "" },
				"key":    func() string { return prefix + strconv.FormatInt(seq.Add(1), 36) },
				"replay": func() string { return prefix + "replayed" },
			}
			for _, mode := range []string{"none", "key", "replay"} {
				b.Run(mode+"/serial", func(b *testing.B) {
					for b.Loop() {
						if err := send(keyFor[mode]()); err != nil {
							b.Fatal(err)
						}
					}
				})
				b.Run(mode+"/parallel", func(b *testing.B) {
					b.SetParallelism(4)
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							if err := send(keyFor[mode]()); err != nil {
								b.Error(err)
								return
							}
						}
					})
				})
			}
		})
	}
}

// benchMain starts Main on the simulator with a funded key and returns the
// chat completions URL and the key.
func benchMain(b *testing.B, store string) (string, string) {
	b.Helper()
	sim, err := simulate.Start(simulate.Config{Flavour: simulate.VLLM, Models: []string{"bench-up"}, MaxRecorded: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sim.Close() })
	dir := b.TempDir()
	storeYAML := "store:\n  sqlite: bench.db\n"
	if store == "postgres" {
		u, err := url.Parse(os.Getenv(postgres.TestEnv))
		if err != nil {
			b.Fatal(err)
		}
		q := u.Query()
		q.Set("search_path", postgres.NewTestSchema(b))
		u.RawQuery = q.Encode()
		b.Setenv("TG_IDEM_BENCH_PG", u.String())
		storeYAML = "store:\n  postgres_url_env: TG_IDEM_BENCH_PG\n"
	}
	text := fmt.Sprintf(`listen:
  api: 127.0.0.1:0
%shealth:
  interval: "off"
models:
  - id: bench
    kind: chat
    context_length: 32768
    max_output_tokens: 4096
    backends:
      - class: network
        upstream_model: bench-up
        rates: {input: "0.1", output: "0.4"}
        nodes:
          - {name: sim, url: "%s/v1", flavour: vllm}
`, storeYAML, sim.URL())
	path := filepath.Join(dir, "tollgate.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		b.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		b.Fatal(err)
	}
	journalBesideConfig(cfg, path)
	m := &Main{Config: cfg}
	if err := m.Open(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = m.Close(ctx)
	})
	ctx := context.Background()
	acct := tollgate.Account{ID: tollgate.NewID("acct_"), Name: "bench", Balance: tollgate.Dollars(1_000_000), Created: time.Now().UTC()}
	if err := m.Store.CreateAccount(ctx, acct); err != nil {
		b.Fatal(err)
	}
	secret := tollgate.NewKeySecret()
	if err := m.Store.CreateKey(ctx, tollgate.Key{ID: tollgate.NewID("key_"), AccountID: acct.ID, Name: "bench",
		Prefix: tollgate.DisplayPrefix(secret), Created: time.Now().UTC()}, tollgate.HashKey(secret)); err != nil {
		b.Fatal(err)
	}
	return m.APIURL() + "/chat/completions", secret
}
