package main

import (
	"context"
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/postgres"
	"github.com/tollgate/tollgate/simulate"
)

var (
	billBenchDur  = flag.Duration("billbench.dur", 4*time.Second, "BenchmarkBilling: measuring time per mode")
	billBenchConc = flag.Int("billbench.conc", 32, "BenchmarkBilling: concurrent clients")
	billBenchOnly = flag.String("billbench.only", "", "BenchmarkBilling: run only these modes (comma-separated; off always runs)")
)

type billBenchResult struct {
	mode     string
	rps      float64
	p50, p99 time.Duration
	errors   int64
}

// BenchmarkBilling measures the service over real loopback HTTP with billing
// off, on with SQLite and on with PostgreSQL (when TOLLGATE_TEST_POSTGRES is
// set), in one run, and reports each mode's throughput and latency and the
// ratios to billing off. Non-streamed requests of 16 completion tokens from
// a simulator without delays, so that tollgate's own work dominates.
//
//	TOLLGATE_TEST_POSTGRES=... go test -run '^$' -bench BenchmarkBilling -benchtime 1x ./cmd/tollgate/
func BenchmarkBilling(b *testing.B) {
	sim, err := simulate.Start(simulate.Config{Flavour: simulate.VLLM, Models: []string{"up-vllm"},
		// Keep no request log: a full log shifts 10,000 records on every
		// request, which would slow down whichever mode runs later.
		MaxRecorded: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer sim.Close()
	modes := []struct{ name, store, extra string }{
		{"off", "  sqlite: " + filepath.Join(b.TempDir(), "off.db") + "\n", "billing:\n  disabled: true\n"},
		{"sqlite", "  sqlite: " + filepath.Join(b.TempDir(), "on.db") + "\n", ""},
		{"sqlite-async", "  sqlite: " + filepath.Join(b.TempDir(), "async.db") + "\n", "billing:\n  async_settle: true\n"},
	}
	if os.Getenv(postgres.TestEnv) != "" {
		schema := postgres.NewTestSchema(b)
		u := os.Getenv(postgres.TestEnv)
		sep := "?"
		if strings.Contains(u, "?") {
			sep = "&"
		}
		b.Setenv("TG_BENCH_PG", u+sep+"search_path="+schema)
		modes = append(modes, struct{ name, store, extra string }{"postgres", "  postgres_url_env: TG_BENCH_PG\n", ""})
	}
	if *billBenchOnly != "" {
		modes = slices.DeleteFunc(modes, func(m struct{ name, store, extra string }) bool {
			return m.name != "off" && !slices.Contains(strings.Split(*billBenchOnly, ","), m.name)
		})
	}
	var results []billBenchResult
	for range b.N {
		results = results[:0]
		for _, m := range modes {
			results = append(results, runBillBench(b, m.name, m.store, m.extra, sim.URL()))
		}
	}
	off := results[0].rps
	for _, r := range results {
		b.ReportMetric(r.rps, r.mode+"_req/s")
		b.ReportMetric(float64(r.p50.Microseconds()), r.mode+"_p50_µs")
		b.ReportMetric(float64(r.p99.Microseconds()), r.mode+"_p99_µs")
		if r.mode != "off" {
			b.ReportMetric(r.rps/off, r.mode+"/off")
		}
		b.Logf("%-8s %8.0f req/s  p50 %6s  p99 %6s  errors %d  ratio to off %.2f", r.mode, r.rps,
			r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.errors, r.rps/off)
	}
}

func runBillBench(b *testing.B, mode, store, extra, simURL string) billBenchResult {
	b.Helper()
	doc := `listen:
  api: 127.0.0.1:0
store:
` + store + `health:
  interval: "off"
` + extra + `models:
  - id: bench
    kind: chat
    context_length: 32768
    max_output_tokens: 4096
    backends:
      - class: network
        upstream_model: up-vllm
        capabilities: []
        rates: {input: "0.3", output: "1.2"}
        nodes:
          - {name: sim, url: "` + simURL + `/v1", flavour: vllm}
`
	path := filepath.Join(b.TempDir(), mode+".yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		b.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		b.Fatal(err)
	}
	m := &Main{Config: cfg}
	if err := m.Open(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		m.Close(ctx)
	}()
	acct := tollgate.Account{ID: tollgate.NewID("acct_"), Name: "bench", Balance: tollgate.Dollars(1_000_000), Created: time.Now().UTC()}
	if err := m.Store.CreateAccount(context.Background(), acct); err != nil {
		b.Fatal(err)
	}
	secret := tollgate.NewKeySecret()
	k := tollgate.Key{ID: tollgate.NewID("key_"), AccountID: acct.ID, Prefix: tollgate.DisplayPrefix(secret), Created: time.Now().UTC()}
	if err := m.Store.CreateKey(context.Background(), k, tollgate.HashKey(secret)); err != nil {
		b.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, MaxIdleConns: 1024}}
	url := m.APIURL() + "/chat/completions"
	body := `{"model":"bench","max_tokens":64,"messages":[{"role":"user","content":"Benchmark me. [sim tokens=16]"}]}`
	one := func() (time.Duration, bool) {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Content-Type", "application/json")
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return time.Since(start), resp.StatusCode == 200
	}
	phase := func(d time.Duration, record bool) ([]time.Duration, int64, time.Duration) {
		var mu sync.Mutex
		var lats []time.Duration
		var errs atomic.Int64
		stop := time.Now().Add(d)
		start := time.Now()
		var wg sync.WaitGroup
		for range *billBenchConc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var mine []time.Duration
				for time.Now().Before(stop) {
					lat, ok := one()
					if !ok {
						errs.Add(1)
						continue
					}
					mine = append(mine, lat)
				}
				if record {
					mu.Lock()
					lats = append(lats, mine...)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		return lats, errs.Load(), time.Since(start)
	}
	phase(time.Second, false) // warm-up: connections, caches, JIT of the store's plans
	lats, errs, elapsed := phase(*billBenchDur, true)
	slices.Sort(lats)
	r := billBenchResult{mode: mode, rps: float64(len(lats)) / elapsed.Seconds(), errors: errs}
	if len(lats) > 0 {
		r.p50, r.p99 = lats[len(lats)/2], lats[min(len(lats)-1, len(lats)*99/100)]
	}
	if errs > 0 {
		b.Errorf("%s: %d failed requests", mode, errs)
	}
	if m.Biller != nil {
		st := m.Biller.Stats()
		b.Logf("%s: %d holds (%d in memory against %d reservation top-ups, %d returns), %d settles in %d batches", mode,
			st.Holds, st.InMemory, st.Reserves, st.Returns, st.Settled, st.Batches)
	}
	if bs, err := books(m.Store); err == nil && mode != "off" {
		if c, _ := countChargesB(bs, acct.ID); c < int64(len(lats)) {
			b.Errorf("%s: %d charges for %d served requests", mode, c, len(lats))
		}
	}
	return r
}

func countChargesB(st billingStore, acct string) (int64, error) {
	var n int64
	err := st.Ledger(context.Background(), tollgate.UsageFilter{AccountID: acct}, func(e tollgate.LedgerEntry) error {
		if e.Kind == tollgate.LedgerCharge {
			n++
		}
		return nil
	})
	return n, err
}
