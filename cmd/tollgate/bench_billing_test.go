package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/postgres"
	"github.com/tollgate/tollgate/simulate"
)

var (
	billBenchDur  = flag.Duration("billbench.dur", time.Second, "BenchmarkBilling: measuring time per mode and round")
	billBenchConc = flag.String("billbench.conc", "128", "BenchmarkBilling: concurrent clients; a comma-separated list measures each mode at each count and reports its capacity (the best of them)")
	billBenchOnly = flag.String("billbench.only", "", "BenchmarkBilling: run only these modes (comma-separated; off always runs unless no-off is named, e.g. to profile one mode alone)")
	billBenchStrm = flag.Bool("billbench.stream", false, "BenchmarkBilling: streamed requests (the client reads each stream to its end)")
	billBenchRnds = flag.Int("billbench.rounds", 8, "BenchmarkBilling: rounds; each measures every mode once, and the medians are reported")
)

type billBenchResult struct {
	mode     string
	conc     int
	rps      float64
	p50, p99 time.Duration
	errors   int64
	// cpu is the process's CPU time (user + system) per served request,
	// load generator and simulator included; busy is the CPU time over the
	// wall time (2.0 = both cores of this machine all the time).
	cpu  time.Duration
	busy float64
	// runq is the mean time a goroutine waited to run once runnable
	// (runtime/metrics /sched/latencies), over the whole process.
	runq time.Duration
}

// BenchmarkBilling measures the service over real loopback HTTP with billing
// off, on with SQLite and on with PostgreSQL (when TOLLGATE_TEST_POSTGRES is
// set), in one run, and reports each mode's throughput and latency and the
// ratios to billing off. Non-streamed requests of 16 completion tokens from
// a simulator without delays, so that tollgate's own work dominates
// (-billbench.stream: the same requests streamed).
// -billbench.conc sets the closed-loop clients (128 by default; at 32 the
// billing modes are bound by each response's wait for its commit). A list
// (128,192,256) measures every mode at each count and also reports each
// mode's capacity: its best throughput of the counts, round by round, and
// the capacity ratios. -billbench.rounds sets how many times the
// modes alternate, -billbench.dur how long each measures per round,
// -billbench.only picks modes (also the optional sqlite-normal,
// sqlite-nowait, sqlite-nopipe, sqlite-wait1ms, sqlite-wait4ms). Every
// mode's service is started (and warmed up) first and they all stay up; the
// rounds then measure them in turn, one short slice each, so that the VM's
// slow spells (whole runs here move by ±10%) fall on every mode alike. Run
// with -test.v, or the testing package cuts the per-round lines.
//
//	TOLLGATE_TEST_POSTGRES=... go test -run '^$' -bench BenchmarkBilling -benchtime 1x -v ./cmd/tollgate/
func BenchmarkBilling(b *testing.B) {
	sim, err := simulate.Start(simulate.Config{Flavour: simulate.VLLM, Models: []string{"up-vllm"},
		// Keep no request log: a full log shifts 10,000 records on every
		// request, which would slow down whichever mode runs later.
		MaxRecorded: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer sim.Close()
	type mode struct {
		name, store, extra string
		optional           bool // runs only when -billbench.only names it
	}
	sqliteAt := func(file string) string { return "  sqlite: " + filepath.Join(b.TempDir(), file) + "\n" }
	modes := []mode{
		{name: "off", store: sqliteAt("off.db"), extra: "billing:\n  disabled: true\n"},
		{name: "sqlite", store: sqliteAt("on.db")},
		{name: "sqlite-durable", store: sqliteAt("durable.db"), extra: "billing:\n  journal: \"off\"\n"},
		{name: "sqlite-async", store: sqliteAt("async.db"), extra: "billing:\n  journal: \"off\"\n  async_settle: true\n", optional: true},
		{name: "sqlite-shmjournal", store: sqliteAt("shm.db"), extra: "billing:\n  journal: " + filepath.Join(shmDir(b), "charges") + "\n", optional: true},
		{name: "sqlite-normal", store: sqliteAt("normal.db") + "  sqlite_synchronous: normal\n", optional: true},
		{name: "sqlite-nowait", store: sqliteAt("nowait.db"), extra: "billing:\n  batch_wait: \"off\"\n", optional: true},
		{name: "sqlite-nopipe", store: sqliteAt("nopipe.db"), extra: "billing:\n  no_pipeline: true\n", optional: true},
		{name: "sqlite-wait1ms", store: sqliteAt("w1.db"), extra: "billing:\n  batch_wait: 1ms\n", optional: true},
		{name: "sqlite-wait4ms", store: sqliteAt("w4.db"), extra: "billing:\n  batch_wait: 4ms\n", optional: true},
	}
	if os.Getenv(postgres.TestEnv) != "" {
		schema := postgres.NewTestSchema(b)
		u := os.Getenv(postgres.TestEnv)
		sep := "?"
		if strings.Contains(u, "?") {
			sep = "&"
		}
		b.Setenv("TG_BENCH_PG", u+sep+"search_path="+schema)
		modes = append(modes, mode{name: "postgres", store: "  postgres_url_env: TG_BENCH_PG\n"},
			mode{name: "postgres-durable", store: "  postgres_url_env: TG_BENCH_PG\n", extra: "billing:\n  journal: \"off\"\n"})
	}
	only := strings.Split(*billBenchOnly, ",")
	modes = slices.DeleteFunc(modes, func(m mode) bool {
		if m.name == "off" {
			return *billBenchOnly != "" && !slices.Contains(only, "off") && slices.Contains(only, "no-off")
		}
		if *billBenchOnly != "" {
			return !slices.Contains(only, m.name)
		}
		return m.optional
	})
	// Rounds alternate the modes (off, sqlite, ..., off, sqlite, ...) so
	// that a slow spell of this shared VM hits every mode alike; each
	// figure reported is the median over the rounds, and each ratio the
	// median of the rounds' own ratios (a mode against off in the same
	// round, a few seconds apart).
	concs, err := parseConcs(*billBenchConc)
	if err != nil {
		b.Fatal(err)
	}
	rounds := max(*billBenchRnds, 1)
	// byMode[i][c] holds mode i's results at concs[c], one per round.
	byMode := make([][][]billBenchResult, len(modes))
	for i := range byMode {
		byMode[i] = make([][]billBenchResult, len(concs))
	}
	for range b.N {
		benches := make([]*billBench, len(modes))
		for i, m := range modes {
			benches[i] = startBillBench(b, m.name, m.store, m.extra, sim.URL(), slices.Max(concs))
		}
		for range rounds {
			for c, conc := range concs {
				for i, bb := range benches {
					byMode[i][c] = append(byMode[i][c], bb.slice(b, conc, *billBenchDur))
				}
			}
		}
		for _, bb := range benches {
			bb.finish(b)
		}
	}
	for c := range concs {
		for i := range modes {
			reportBillBench(b, byMode[i][c], byMode[0][c], i > 0, len(concs) > 1)
		}
	}
	if len(concs) > 1 {
		// Capacity: a mode's throughput at its best client count, round by
		// round. A mode whose responses wait for a commit needs more clients
		// in flight to keep the cores busy than one that does not; comparing
		// each at its best compares what the service can serve, not how one
		// client count happens to suit it.
		capacity := func(i, round int) (float64, int) {
			best, at := 0.0, 0
			for c := range concs {
				if r := byMode[i][c][round]; r.rps > best {
					best, at = r.rps, r.conc
				}
			}
			return best, at
		}
		for i, m := range modes {
			var caps, ratios []float64
			var line strings.Builder
			for round := range len(byMode[i][0]) {
				rps, at := capacity(i, round)
				off, _ := capacity(0, round)
				caps, ratios = append(caps, rps), append(ratios, rps/off)
				fmt.Fprintf(&line, " %.0f@%d", rps, at)
			}
			ratio := median(ratios, func(x float64) float64 { return x })
			b.Logf("capacity: %-12s %8.0f req/s (rounds:%s)  ratio to off %.2f (%.2f–%.2f)", m.name,
				median(caps, func(x float64) float64 { return x }), line.String(), ratio, slices.Min(ratios), slices.Max(ratios))
			if i > 0 {
				b.ReportMetric(ratio, m.name+"_capacity/off")
			}
		}
	}
}

// parseConcs reads -billbench.conc: client counts, comma-separated.
func parseConcs(s string) ([]int, error) {
	var concs []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-billbench.conc %q: want client counts like 128 or 128,192,256", s)
		}
		concs = append(concs, n)
	}
	return concs, nil
}

// reportBillBench logs one mode's rounds at one client count and their
// medians against off's rounds at the same count (off is mode 0, unless
// no-off: vsOff is false for mode 0 itself); the metrics it reports carry
// the count in their names when several were measured.
func reportBillBench(b *testing.B, rs, off []billBenchResult, vsOff, several bool) {
	if len(rs) == 0 {
		return
	}
	mode, conc := rs[0].mode, rs[0].conc
	name := mode
	if several {
		name = mode + "@" + strconv.Itoa(conc)
	}
	var ratios []float64
	for j, r := range rs {
		ratios = append(ratios, r.rps/off[j].rps)
		b.Logf("round %d: %-12s %4d clients %8.0f req/s  p50 %6s  p99 %6s  cpu %4dµs/req  busy %.2f cores  run queue %4dµs  ratio to off %.2f", j+1, mode, conc, r.rps,
			r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.cpu.Microseconds(), r.busy, r.runq.Microseconds(), r.rps/off[j].rps)
	}
	rps := median(rs, func(r billBenchResult) float64 { return r.rps })
	p50 := median(rs, func(r billBenchResult) float64 { return float64(r.p50) })
	p99 := median(rs, func(r billBenchResult) float64 { return float64(r.p99) })
	cpu := median(rs, func(r billBenchResult) float64 { return float64(r.cpu) })
	busy := median(rs, func(r billBenchResult) float64 { return r.busy })
	runq := median(rs, func(r billBenchResult) float64 { return float64(r.runq) })
	ratio := median(ratios, func(x float64) float64 { return x })
	b.ReportMetric(rps, name+"_req/s")
	b.ReportMetric(float64(time.Duration(p50).Microseconds()), name+"_p50_µs")
	b.ReportMetric(float64(time.Duration(p99).Microseconds()), name+"_p99_µs")
	b.ReportMetric(float64(time.Duration(cpu).Microseconds()), name+"_cpu_µs/req")
	if vsOff {
		b.ReportMetric(ratio, name+"/off")
	}
	b.Logf("median of %d: %-12s %4d clients %8.0f req/s  p50 %6s  p99 %6s  cpu %4dµs/req  busy %.2f cores  run queue %4dµs  ratio to off %.2f (%.2f–%.2f)", len(rs), mode, conc, rps,
		time.Duration(p50).Round(time.Microsecond), time.Duration(p99).Round(time.Microsecond), time.Duration(cpu).Microseconds(),
		busy, time.Duration(runq).Microseconds(), ratio, slices.Min(ratios), slices.Max(ratios))
}

// schedLatencies reads the process's histogram of how long goroutines
// waited to run once runnable.
func schedLatencies() *metrics.Float64Histogram {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil
	}
	return s[0].Value.Float64Histogram()
}

// meanSince is the mean of the observations added to the histogram between
// a and b (bucket midpoints; the open-ended buckets count at their finite
// bound).
func meanSince(a, b *metrics.Float64Histogram) time.Duration {
	if a == nil || b == nil || len(a.Counts) != len(b.Counts) {
		return 0
	}
	var n, sum float64
	for i := range b.Counts {
		c := float64(b.Counts[i] - a.Counts[i])
		lo, hi := b.Buckets[i], b.Buckets[i+1]
		switch {
		case math.IsInf(lo, -1):
			lo = hi
		case math.IsInf(hi, 1):
			hi = lo
		}
		n += c
		sum += c * (lo + hi) / 2
	}
	if n == 0 {
		return 0
	}
	return time.Duration(sum / n * float64(time.Second))
}

// billBench is one mode's running service and its closed-loop client.
type billBench struct {
	mode   string
	m      *Main
	acct   string
	one    func() (time.Duration, bool)
	served int64
	st0    billing.Stats
	syncs0 int64
	labels pprof.LabelSet // billbench=<mode>, on every goroutine of the mode
	sent   atomic.Int64   // requests sent, warm-up included (a labelled profile's denominator)
}

// startBillBench starts mode's service and warms it up with warmConc clients.
func startBillBench(b *testing.B, mode, store, extra, simURL string, warmConc int) *billBench {
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
	journalBesideConfig(cfg, path)
	m := &Main{Config: cfg}
	// Every goroutine of this mode's service (listeners, connections, the
	// billing workers) and of its clients carries the profiler label
	// billbench=<mode>: a CPU profile of a run of several modes splits by
	// mode with -tagfocus, each measured in the same minutes of the VM.
	labels := pprof.Labels("billbench", mode)
	var openErr error
	pprof.Do(context.Background(), labels, func(ctx context.Context) { openErr = m.Open(ctx) })
	if err := openErr; err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		m.Close(ctx)
	})
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
	body := `{"model":"bench","max_tokens":64,"stream":` + strconv.FormatBool(*billBenchStrm) +
		`,"messages":[{"role":"user","content":"Benchmark me. [sim tokens=16]"}]}`
	bb := &billBench{mode: mode, m: m, acct: acct.ID, labels: labels}
	bb.one = func() (time.Duration, bool) {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Content-Type", "application/json")
		start := time.Now()
		bb.sent.Add(1)
		resp, err := client.Do(req)
		if err != nil {
			return 0, false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return time.Since(start), resp.StatusCode == 200
	}
	bb.phase(warmConc, time.Second) // warm-up: connections, caches, the store's plans
	if m.Biller != nil {
		bb.st0 = m.Biller.Stats()
	}
	bb.syncs0 = bb.syncs()
	return bb
}

func (bb *billBench) syncs() int64 { return bb.m.Store.WALSyncs() }

// phase runs the closed-loop clients for d and returns the latencies of the
// requests served, the failures and the time it took.
func (bb *billBench) phase(conc int, d time.Duration) ([]time.Duration, int64, time.Duration) {
	var mu sync.Mutex
	var lats []time.Duration
	var errs atomic.Int64
	stop := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), bb.labels))
			var mine []time.Duration
			for time.Now().Before(stop) {
				lat, ok := bb.one()
				if !ok {
					errs.Add(1)
					continue
				}
				mine = append(mine, lat)
			}
			mu.Lock()
			lats = append(lats, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return lats, errs.Load(), time.Since(start)
}

// slice measures the mode for d.
func (bb *billBench) slice(b *testing.B, conc int, d time.Duration) billBenchResult {
	cpu0, q0 := processCPU(), schedLatencies()
	lats, errs, elapsed := bb.phase(conc, d)
	cpu, runq := processCPU()-cpu0, meanSince(q0, schedLatencies())
	bb.served += int64(len(lats))
	slices.Sort(lats)
	r := billBenchResult{mode: bb.mode, conc: conc, rps: float64(len(lats)) / elapsed.Seconds(), errors: errs,
		busy: cpu.Seconds() / elapsed.Seconds(), runq: runq}
	if len(lats) > 0 {
		r.cpu = cpu / time.Duration(len(lats))
		r.p50, r.p99 = lats[len(lats)/2], lats[min(len(lats)-1, len(lats)*99/100)]
	}
	if errs > 0 {
		b.Errorf("%s: %d failed requests", bb.mode, errs)
	}
	return r
}

// finish reports the writer's figures over all of the mode's slices and
// checks that every served request was charged.
func (bb *billBench) finish(b *testing.B) {
	b.Logf("%s: %d requests sent in all, warm-up included (the CPU profile's billbench=%s label covers them)", bb.mode, bb.sent.Load(), bb.mode)
	if bb.m.Biller != nil {
		st := bb.m.Biller.Stats()
		ops, batches := st.Ops-bb.st0.Ops, st.Batches-bb.st0.Batches
		b.Logf("%s: %d holds (%d in memory), %d reservation top-ups; %d operations in %d batches (%.1f a batch); each waited %s on average; %d WAL syncs",
			bb.mode, st.Holds-bb.st0.Holds, st.InMemory-bb.st0.InMemory, st.Reserves-bb.st0.Reserves, ops, batches, float64(ops)/float64(max(batches, 1)),
			((st.Waiting - bb.st0.Waiting) / time.Duration(max(ops, 1))).Round(time.Microsecond), bb.syncs()-bb.syncs0)
		if j := st.Journaled - bb.st0.Journaled; j > 0 {
			b.Logf("%s: %d settles answered from the journal before their commit", bb.mode, j)
		}
		b.Logf("%s: a batch lingered %s and was written in %s on average", bb.mode,
			((st.Lingering - bb.st0.Lingering) / time.Duration(max(batches, 1))).Round(time.Microsecond),
			((st.Writing - bb.st0.Writing) / time.Duration(max(batches, 1))).Round(time.Microsecond))
	}
	if bs := bb.m.Store; bb.mode != "off" {
		if c, _ := countChargesB(bs, bb.acct); c < bb.served {
			b.Errorf("%s: %d charges for %d served requests", bb.mode, c, bb.served)
		}
	}
}

// processCPU is the CPU time this process has used (user + system).
func processCPU() time.Duration { return readUsage().cpu }

func countChargesB(st Store, acct string) (int64, error) {
	var n int64
	err := st.Ledger(context.Background(), tollgate.UsageFilter{AccountID: acct}, func(e tollgate.LedgerEntry) error {
		if e.Kind == tollgate.LedgerCharge {
			n++
		}
		return nil
	})
	return n, err
}

// shmDir is a directory in memory (tmpfs) for the sqlite-shmjournal mode: a
// journal there is never written back to disk.
func shmDir(b *testing.B) string {
	dir, err := os.MkdirTemp("/dev/shm", "tollgate-bench-")
	if err != nil {
		return b.TempDir()
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
