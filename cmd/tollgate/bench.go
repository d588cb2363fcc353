package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/simulate"
)

// benchCmd is `tollgate bench`: one run that measures a simulated model
// server directly and through tollgate (auth on), non-streamed and streamed,
// and prints throughput, latency percentiles, time to first token, the
// ratios, and the allocations tollgate adds per request. Everything runs in
// this process on loopback: the load generator, the simulator and tollgate
// share the machine's cores, as they would on one box.
type benchCmd struct {
	stdout, stderr io.Writer
}

type benchResult struct {
	name      string
	requests  int64
	errors    int64
	elapsed   time.Duration
	lat       []time.Duration // per request: whole answer
	ttft      []time.Duration // streams: first content chunk
	allocs    uint64
	bytesHeap uint64
	// usage is the process's CPU time and thread sleeps (voluntary context
	// switches: a thread blocked and had to be woken) over the measured
	// window, load generator and simulator included.
	usage procUsage
}

// target is one of the things a phase measures (fields exported: the paired
// client's process receives it as JSON).
type target struct{ Name, URL, Model, Key string }

// procUsage is what getrusage says of the whole process.
type procUsage struct {
	cpu    time.Duration
	sleeps int64
}

func (u procUsage) sub(v procUsage) procUsage {
	return procUsage{cpu: u.cpu - v.cpu, sleeps: u.sleeps - v.sleeps}
}

func (r benchResult) rps() float64 { return float64(r.requests) / r.elapsed.Seconds() }

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[min(len(d)-1, int(float64(len(d))*p))]
}

func (c *benchCmd) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	dur := fs.Duration("duration", 5*time.Second, "measuring time of each phase")
	warm := fs.Duration("warmup", time.Second, "warm-up time of each phase (not measured)")
	conc := fs.Int("concurrency", 32, "concurrent clients for the throughput phases")
	modConc := fs.Int("moderate", 4, "concurrent clients for the latency phases (moderate load)")
	rate := fs.Int("rate", 1000, "requests a second of the fixed-rate (open-loop) phases; 0 skips them")
	pairedOn := fs.Bool("paired", true, "also measure the added latency paired: one client alternating direct, bare proxy, tollgate and a TCP relay request by request (closed loop, and open loop at --rate)")
	clientProc := fs.Bool("client-process", false, "run the paired phases' client in a process of its own (the default runs it in this process, sharing Go's scheduler with tollgate)")
	only := fs.String("only", "", "run only the phases whose name contains this text (e.g. \"streamed, 1000/s\")")
	tokens := fs.Int("tokens", 16, "completion tokens per answer")
	tokenGap := fs.Duration("token-gap", 0, "the simulator's wait between streamed tokens (0: the whole answer in one burst; a real model's is 5-50ms)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	memProfile := fs.String("memprofile", "", "write an allocation profile of the whole run to this file")
	billingOn := fs.Bool("billing", true, "bill requests (holds, settles, ledger); false measures the serving core alone")
	sqliteSync := fs.String("sqlite-synchronous", "full", "with --store sqlite: full or normal (store.sqlite_synchronous)")
	storeKind := fs.String("store", "sqlite", "tollgate's store: sqlite, or postgres (URL from TOLLGATE_TEST_POSTGRES)")
	observability := fs.Bool("observability", false, "measure only what metrics and the request log cost: throughput with both on against both off, alternating, --rounds times")
	obsRounds := fs.Int("rounds", 6, "with --observability: rounds per kind of request")
	accessLog := fs.String("access-log", "", "write tollgate's log (a JSON line per request, as 'tollgate serve' logs at level info) to this file; the default discards it")
	workload := fs.String("workload", "", "instead of the serving phases: conversations through tollgate to simulated GPU nodes with prefix caches, once per routing policy; a comma list of multiturn, agent, unrelated, or all")
	policies := fs.String("policies", "round_robin,least_outstanding,prefix_cache", "--workload: the routing policies compared; +kv: prefix_cache with the nodes publishing KV-cache events, read through kv_events; +load: tollgate reads each node's load from its /metrics (load_poll), max_concurrent undivided and --load-margin on every instance (prefix_cache+kv+load)")
	wlLoadPoll := fs.Duration("load-poll", 100*time.Millisecond, "--workload: load_poll of the +load policies")
	wlLoadMargin := fs.Int64("load-margin", config.DefaultLoadPollMargin, "--workload: prefix_margin of the +load policies, on one instance or several")
	wlNodes := fs.Int("nodes", 4, "--workload: simulated GPU nodes")
	wlSlots := fs.Int("node-slots", 16, "--workload: requests a node serves at once (its max_concurrent and the simulator's limit)")
	wlCache := fs.Int("cache-tokens", 100_000, "--workload: each node's prefix cache, in tokens")
	wlPrefill := fs.Float64("prefill-tokens-per-sec", 20_000, "--workload: each node's prefill rate of uncached prompt tokens")
	wlDecode := fs.Float64("decode-tokens-per-sec", 100, "--workload: each answer's generation rate")
	wlMargin := fs.Int64("prefix-margin", config.DefaultPrefixMargin, "--workload: prefix_margin of the prefix_cache policy")
	wlThink := fs.Duration("think", 500*time.Millisecond, "--workload: mean pause between a conversation's requests (the user typing, the tool running), uniform over 0.5-1.5 times it")
	wlSeed := fs.Uint64("seed", 1, "--workload: seed of the generated conversations (the same under every policy)")
	wlInstances := fs.Int("instances", 1, "--workload: also run each policy on this many tollgate instances sharing one store (--store), the requests spread over them in turn, next to one instance")
	wlInstSlots := fs.Int("instance-slots", 0, "--workload: max_concurrent of each node on each of --instances (0: --node-slots ÷ --instances, rounded up)")
	wlInstMargin := fs.Int64("instance-margin", -1, "--workload: prefix_margin of the runs on --instances (-1: --prefix-margin); each instance counts only its own requests in flight")
	wlDisrupt := fs.String("disrupt", "", "--workload: halfway through each run, restart (empty node 0's cache), add (the last node joins) or remove (the last node leaves)")
	wlWindow := fs.Duration("window", 0, "--workload: also report the cached share per window of this length (e.g. 5s)")
	wlRepeat := fs.Int("repeat", 1, "--workload: run each policy this many rounds (one instance, then --instances, in turn) and also report the rounds pooled")
	fs.Usage = func() {
		fmt.Fprintln(c.stderr, "Usage: tollgate bench [--duration 5s] [--concurrency 32] [--moderate 4]")
		fmt.Fprintln(c.stderr, "       tollgate bench --workload all [--duration 20s] [--concurrency 32] [--nodes 4]")
		fmt.Fprintln(c.stderr, "\nMeasures tollgate against a direct simulator on loopback and prints the ratios.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return flagErr(err)
	}
	if *workload != "" {
		mixes := strings.Split(*workload, ",")
		if *workload == "all" {
			mixes = []string{"multiturn", "agent", "unrelated"}
		}
		for _, m := range mixes {
			if m != "multiturn" && m != "agent" && m != "unrelated" {
				return usageError{fmt.Sprintf("--workload %q: want multiturn, agent, unrelated or all", m)}
			}
		}
		pols := strings.Split(*policies, ",")
		for _, p := range pols {
			if _, ok := parsePolicy(p); !ok {
				return usageError{fmt.Sprintf("--policies %q: want round_robin, least_outstanding or prefix_cache, optionally with +kv (prefix_cache) and +load", p)}
			}
		}
		switch *wlDisrupt {
		case "", "restart", "add", "remove":
		default:
			return usageError{fmt.Sprintf("--disrupt %q: want restart, add or remove", *wlDisrupt)}
		}
		if *wlDisrupt != "" && *wlNodes < 2 {
			return usageError{"--disrupt needs --nodes 2 or more"}
		}
		storeSet := false
		fs.Visit(func(f *flag.Flag) { storeSet = storeSet || f.Name == "store" })
		if !storeSet && os.Getenv("TOLLGATE_TEST_POSTGRES") != "" {
			*storeKind = "postgres" // the instances share PostgreSQL when it is there
		}
		if *storeKind != "sqlite" && *storeKind != "postgres" {
			return usageError{fmt.Sprintf("--store %q: want sqlite or postgres", *storeKind)}
		}
		if *wlInstMargin < 0 {
			*wlInstMargin = *wlMargin
		}
		return c.runWorkloads(ctx, workloadOpts{mixes: mixes, policies: pols, nodes: max(1, *wlNodes), clients: max(1, *conc),
			duration: *dur, tokens: *tokens, slots: *wlSlots, cacheTokens: *wlCache, prefillRate: *wlPrefill,
			decodeRate: *wlDecode, margin: *wlMargin, seed: *wlSeed, think: *wlThink,
			instances: *wlInstances, instanceMargin: *wlInstMargin, instanceSlots: *wlInstSlots,
			store: *storeKind, disrupt: *wlDisrupt, window: *wlWindow, loadPoll: *wlLoadPoll, loadMargin: *wlLoadMargin,
			repeat: max(1, *wlRepeat)})
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if *memProfile != "" {
		runtime.MemProfileRate = 512
		defer func() {
			if f, err := os.Create(*memProfile); err == nil {
				_ = pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
			}
		}()
	}
	sim, err := simulate.Start(simulate.Config{Flavour: simulate.VLLM, Models: []string{"bench-up"}, MaxRecorded: -1,
		ContextLength: 1 << 20, Behaviour: simulate.Behaviour{OutputTokens: *tokens, TokenGap: *tokenGap}})
	if err != nil {
		return err
	}
	defer sim.Close()
	dir, err := os.MkdirTemp("", "tollgate-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	storeYAML := "store:\n  sqlite: bench.db\n  sqlite_synchronous: " + *sqliteSync + "\n"
	if *storeKind == "postgres" {
		storeYAML = "store:\n  postgres_url_env: TOLLGATE_TEST_POSTGRES\n"
	}
	if !*billingOn {
		storeYAML += "billing:\n  disabled: true\n"
	}
	cfgText := fmt.Sprintf(`listen:
  api: 127.0.0.1:0
%shealth:
  interval: "off"
traffic:
  flush: 1s
models:
  - id: bench
    kind: chat
    context_length: 1048576
    max_output_tokens: 4096
    backends:
      - class: network
        upstream_model: bench-up
        capabilities: [tools, reasoning]
        rates: {input: "0.1", output: "0.4"}
        nodes:
          - {name: sim, url: "%s/v1", flavour: vllm}
`, storeYAML, sim.URL())
	if *observability {
		return benchObservability(ctx, c.stdout, cfgText, dir, *conc, *obsRounds, *dur, *warm)
	}
	path := filepath.Join(dir, "tollgate.yaml")
	if err := os.WriteFile(path, []byte(cfgText), 0o644); err != nil {
		return err
	}
	cfg, err := config.Load(path)
	if err != nil {
		return err
	}
	m := &Main{Config: cfg}
	if *accessLog != "" {
		lf, err := os.OpenFile(*accessLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		defer lf.Close()
		m.Log = slog.New(slog.NewJSONHandler(lf, nil))
	}
	if err := m.Open(ctx); err != nil {
		return err
	}
	defer m.Close(context.Background())
	acct := tollgate.Account{ID: tollgate.NewID("acct_"), Name: "bench", Balance: tollgate.Dollars(1_000_000), Created: time.Now().UTC()}
	if err := m.Store.CreateAccount(ctx, acct); err != nil {
		return err
	}
	secret := tollgate.NewKeySecret()
	if err := m.Store.CreateKey(ctx, tollgate.Key{ID: tollgate.NewID("key_"), AccountID: acct.ID, Prefix: tollgate.DisplayPrefix(secret), Created: time.Now().UTC()}, tollgate.HashKey(secret)); err != nil {
		return err
	}

	// A bare reverse proxy to the same simulator: the cost of a second
	// loopback hop alone, so tollgate's own work can be told from the hop's.
	simURL, _ := url.Parse(sim.URL())
	rp := httputil.NewSingleHostReverseProxy(simURL)
	rp.FlushInterval = -1
	rp.Transport = &http.Transport{MaxIdleConnsPerHost: 4096, MaxIdleConns: 4096, DisableCompression: true}
	proxyLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	proxySrv := &http.Server{Handler: rp}
	go proxySrv.Serve(proxyLn)
	defer proxySrv.Close()

	// A TCP relay (bytes copied both ways, no HTTP): what the hop alone costs,
	// for the paired phases.
	relayLn, err := startTCPRelay(simURL.Host)
	if err != nil {
		return err
	}
	defer relayLn.Close()

	direct := target{"direct", sim.URL() + "/v1/chat/completions", "bench-up", ""}
	relayed := target{"TCP relay", "http://" + relayLn.Addr().String() + "/v1/chat/completions", "bench-up", ""}
	proxied := target{"bare proxy", "http://" + proxyLn.Addr().String() + "/v1/chat/completions", "bench-up", ""}
	through := target{"tollgate", m.APIURL() + "/chat/completions", "bench", secret}
	client := newBenchClient()

	run := func(t target, stream bool, workers int) benchResult {
		b := benchBody(t.Model, stream)
		res := benchResult{name: t.Name}
		var measuring atomic.Bool
		var stopFlag atomic.Bool
		var mu sync.Mutex
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var lat, ttft []time.Duration
				var n, errs int64
				buf := make([]byte, 32<<10)
				for !stopFlag.Load() {
					start := time.Now()
					resp, err := client.Do(t.request(ctx, b))
					var first time.Duration
					ok := err == nil && resp.StatusCode == 200
					if err == nil {
						first = readAnswer(resp.Body, stream, start, buf)
						resp.Body.Close()
					}
					if !measuring.Load() {
						continue
					}
					if !ok {
						errs++
						continue
					}
					n++
					lat = append(lat, time.Since(start))
					if stream {
						ttft = append(ttft, first)
					}
				}
				mu.Lock()
				res.requests += n
				res.errors += errs
				res.lat = append(res.lat, lat...)
				res.ttft = append(res.ttft, ttft...)
				mu.Unlock()
			}()
		}
		time.Sleep(*warm)
		runtime.GC()
		var ms0, ms1 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		u0 := readUsage()
		measuring.Store(true)
		t0 := time.Now()
		time.Sleep(*dur)
		measuring.Store(false)
		res.elapsed = time.Since(t0)
		res.usage = readUsage().sub(u0)
		runtime.ReadMemStats(&ms1)
		stopFlag.Store(true)
		wg.Wait()
		res.allocs = ms1.Mallocs - ms0.Mallocs
		res.bytesHeap = ms1.TotalAlloc - ms0.TotalAlloc
		slices.Sort(res.lat)
		slices.Sort(res.ttft)
		return res
	}

	// runRate sends requests at a fixed rate, whatever the answers' pace
	// (open loop): latency at a moderate load that leaves the cores mostly idle.
	runRate := func(t target, stream bool, perSec int) benchResult {
		b := benchBody(t.Model, stream)
		res := benchResult{name: t.Name}
		var mu sync.Mutex
		var wg sync.WaitGroup
		sem := make(chan struct{}, 256)
		interval := time.Second / time.Duration(perSec)
		fire := func(measure bool) {
			defer wg.Done()
			defer func() { <-sem }()
			start := time.Now()
			resp, err := client.Do(t.request(ctx, b))
			var first time.Duration
			ok := err == nil && resp.StatusCode == 200
			if err == nil {
				first = readAnswer(resp.Body, stream, start, nil)
				resp.Body.Close()
			}
			if !measure {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if !ok {
				res.errors++
				return
			}
			res.requests++
			res.lat = append(res.lat, time.Since(start))
			if stream {
				res.ttft = append(res.ttft, first)
			}
		}
		t0 := time.Now()
		warmEnd := t0.Add(*warm)
		end := warmEnd.Add(*dur)
		var ms0, ms1 runtime.MemStats
		var u0 procUsage
		memTimer := time.AfterFunc(*warm, func() { runtime.ReadMemStats(&ms0); u0 = readUsage() })
		for i := 0; ; i++ {
			at := t0.Add(time.Duration(i) * interval)
			if at.After(end) {
				break
			}
			time.Sleep(time.Until(at))
			sem <- struct{}{}
			wg.Add(1)
			go fire(at.After(warmEnd))
		}
		runtime.ReadMemStats(&ms1)
		memTimer.Stop()
		res.usage = readUsage().sub(u0)
		wg.Wait()
		res.elapsed = *dur
		// Requests still running at the end are not counted; their allocations
		// mostly are: a slight over-count, the same for every target.
		res.allocs = ms1.Mallocs - ms0.Mallocs
		slices.Sort(res.lat)
		slices.Sort(res.ttft)
		return res
	}

	type pair struct {
		label                  string
		stream                 bool
		workers                int
		direct, proxy, through benchResult
	}
	pairs := []*pair{}
	if *rate > 0 {
		pairs = append(pairs,
			&pair{label: fmt.Sprintf("non-streamed, %d/s", *rate), stream: false, workers: -*rate},
			&pair{label: fmt.Sprintf("streamed, %d/s", *rate), stream: true, workers: -*rate})
	}
	pairs = append(pairs, []*pair{
		{label: "non-streamed, saturated", stream: false, workers: *conc},
		{label: "non-streamed, moderate", stream: false, workers: *modConc},
		{label: "non-streamed, one client", stream: false, workers: 1},
		{label: "streamed, saturated", stream: true, workers: *conc},
		{label: "streamed, moderate", stream: true, workers: *modConc},
		{label: "streamed, one client", stream: true, workers: 1},
	}...)
	fmt.Fprintf(c.stdout, "tollgate bench: %d CPUs, GOMAXPROCS %d, %s per phase, %d completion tokens, store %s (synchronous %s), billing %v\n\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), *dur, *tokens, *storeKind, *sqliteSync, *billingOn)
	if *only != "" {
		kept := pairs[:0]
		for _, p := range pairs {
			if strings.Contains(p.label, *only) {
				kept = append(kept, p)
			}
		}
		pairs = kept
	}
	for _, p := range pairs {
		if p.workers < 0 { // fixed rate
			p.direct = runRate(direct, p.stream, -p.workers)
			p.proxy = runRate(proxied, p.stream, -p.workers)
			p.through = runRate(through, p.stream, -p.workers)
			continue
		}
		p.direct = run(direct, p.stream, p.workers)
		p.proxy = run(proxied, p.stream, p.workers)
		p.through = run(through, p.stream, p.workers)
	}
	var paired []pairedResult
	if *pairedOn {
		targets := [4]target{direct, proxied, through, relayed}
		for _, stream := range []bool{false, true} {
			label := "non-streamed"
			if stream {
				label = "streamed"
			}
			if *only != "" && !strings.Contains(label+", paired", *only) {
				continue
			}
			phases := []int{0}
			if *rate > 0 {
				phases = append(phases, *rate)
			}
			for _, r := range phases {
				name := label + ", paired, one client"
				if r > 0 {
					name = fmt.Sprintf("%s, paired, %d/s", label, r)
				}
				if !*clientProc {
					paired = append(paired, runPaired(ctx, client, targets, name, stream, r, *warm, *dur))
					continue
				}
				res, err := runPairedProcess(ctx, c.stderr, targets, name, stream, r, *warm, *dur)
				if err != nil {
					return err
				}
				paired = append(paired, res)
			}
		}
	}
	if m.Biller != nil {
		st := m.Biller.Stats()
		fmt.Fprintf(c.stdout, "billing: %d holds (%d in memory, %d reservation top-ups), %d settled, %d released, %d batches (%.1f operations a batch)\n",
			st.Holds, st.InMemory, st.Reserves, st.Settled, st.Released, st.Batches, float64(st.Ops)/float64(max(st.Batches, 1)))
		syncs := m.Store.WALSyncs()
		fmt.Fprintf(c.stdout, "billing writer: %s writing, %s waiting for company; callers waited %s on average for a durable commit; %d WAL syncs\n\n",
			st.Writing.Round(time.Millisecond), st.Lingering.Round(time.Millisecond),
			(st.Waiting / time.Duration(max(st.Ops, 1))).Round(time.Microsecond), syncs)
	}
	tw := tabwriter.NewWriter(c.stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	if len(pairs) == 0 {
		tw = tabwriter.NewWriter(io.Discard, 2, 4, 2, ' ', 0)
	}
	fmt.Fprintln(tw, "phase\tconc\ttarget\treq/s\tp50\tp99\tttft p50\terrors\tallocs/req\tcpu/req\tsleeps/req\t")
	for _, p := range pairs {
		for _, r := range []benchResult{p.direct, p.proxy, p.through} {
			ttft := "-"
			if p.stream {
				ttft = pct(r.ttft, 0.5).Round(time.Microsecond).String()
			}
			conc := fmt.Sprint(p.workers)
			if p.workers < 0 {
				conc = "open"
			}
			n := max(r.requests, 1)
			fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f\t%s\t%s\t%s\t%d\t%.0f\t%s\t%.1f\t\n", p.label, conc, r.name, r.rps(),
				pct(r.lat, 0.5).Round(time.Microsecond), pct(r.lat, 0.99).Round(time.Microsecond), ttft, r.errors,
				float64(r.allocs)/float64(n), (r.usage.cpu / time.Duration(n)).Round(time.Microsecond), float64(r.usage.sleeps)/float64(n))
		}
	}
	tw.Flush()
	fmt.Fprintln(c.stdout)
	for _, p := range pairs {
		d, x, t := p.direct, p.proxy, p.through
		per := func(r benchResult) float64 { return float64(r.allocs) / float64(max(r.requests, 1)) }
		if p.workers < 0 {
			fmt.Fprintf(c.stdout, "%s (open loop)\n", p.label)
		} else {
			fmt.Fprintf(c.stdout, "%s (%d clients)\n", p.label, p.workers)
		}
		fmt.Fprintf(c.stdout, "  vs direct:     throughput ratio %.2f   p50 added %s   p99 added %s   allocs added/req %.0f\n",
			t.rps()/d.rps(), (pct(t.lat, 0.5) - pct(d.lat, 0.5)).Round(time.Microsecond),
			(pct(t.lat, 0.99) - pct(d.lat, 0.99)).Round(time.Microsecond), per(t)-per(d))
		fmt.Fprintf(c.stdout, "  vs bare proxy: throughput ratio %.2f   p50 added %s   p99 added %s   allocs added/req %.0f\n",
			t.rps()/x.rps(), (pct(t.lat, 0.5) - pct(x.lat, 0.5)).Round(time.Microsecond),
			(pct(t.lat, 0.99) - pct(x.lat, 0.99)).Round(time.Microsecond), per(t)-per(x))
		if p.stream {
			fmt.Fprintf(c.stdout, "  ttft added:    vs direct %s   vs bare proxy %s\n",
				(pct(t.ttft, 0.5) - pct(d.ttft, 0.5)).Round(time.Microsecond), (pct(t.ttft, 0.5) - pct(x.ttft, 0.5)).Round(time.Microsecond))
		}
	}
	for _, r := range paired {
		r.print(c.stdout)
	}
	return nil
}

// request is a POST of body to the target, with its key.
func (t target) request(ctx context.Context, body []byte) *http.Request {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, t.URL, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if t.Key != "" {
		req.Header.Set("Authorization", "Bearer "+t.Key)
	}
	return req
}

// benchBody is the request every phase sends.
func benchBody(model string, stream bool) []byte {
	return []byte(`{"model":"` + model + `","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Write one short sentence about gateways."}],"temperature":0.7,"stream":` + fmt.Sprint(stream) + `}`)
}

// readAnswer reads an answer to its end and returns, for a stream, how long
// after start its first chunk with content arrived (0 otherwise). buf, when
// given, is the line buffer.
func readAnswer(body io.Reader, stream bool, start time.Time, buf []byte) time.Duration {
	if !stream {
		_, _ = io.Copy(io.Discard, body)
		return 0
	}
	var first time.Duration
	sc := bufio.NewScanner(body)
	if buf != nil {
		sc.Buffer(buf, len(buf))
	}
	for sc.Scan() {
		if line := sc.Bytes(); first == 0 && bytes.Contains(line, []byte(`"content":"`)) && !bytes.Contains(line, []byte(`"content":""`)) {
			first = time.Since(start)
		}
	}
	return first
}

// pairedResult is a paired phase: the targets measured in turn by the
// same client, request by request, so that every target sees the machine in
// the same state; "added" is the median of the per-round differences.
type pairedResult struct {
	Label    string
	Lat      [4][]time.Duration // direct, bare proxy, tollgate, TCP relay
	TTFT     [4][]time.Duration
	AddedT   []time.Duration // tollgate − direct, per round
	AddedP   []time.Duration // bare proxy − direct, per round
	AddedR   []time.Duration // TCP relay − direct, per round
	AddedTT  []time.Duration // streams: tollgate's time to first content − direct's
	Errors   int
	Rounds   int
	OpenRate int
	// ClientProcess: the client ran in a process of its own.
	ClientProcess bool
}

// runPaired measures the targets in rounds: each round sends one request to
// each, in an order that rotates, and records the differences. rate 0: back
// to back (one request in flight); else one request every 1/rate (open
// loop, each round spread over as many ticks as there are targets).
func runPaired(ctx context.Context, client *http.Client, targets [4]target,
	label string, stream bool, rate int, warm, dur time.Duration) pairedResult {
	res := pairedResult{Label: label, OpenRate: rate}
	var bodies [4][]byte // each target's request, built once
	for i, t := range targets {
		bodies[i] = benchBody(t.Model, stream)
	}
	once := func(i int) (lat, ttft time.Duration, ok bool) {
		req := targets[i].request(ctx, bodies[i])
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, 0, false
		}
		defer resp.Body.Close()
		ttft = readAnswer(resp.Body, stream, start, nil)
		return time.Since(start), ttft, resp.StatusCode == 200
	}
	var interval time.Duration
	if rate > 0 {
		interval = time.Second / time.Duration(rate)
	}
	start := time.Now()
	measureFrom, end := start.Add(warm), start.Add(warm+dur)
	tick := start
	for round := 0; time.Now().Before(end); round++ {
		var lat, ttft [4]time.Duration
		ok := true
		for k := range len(targets) {
			i := (round + k) % len(targets)
			if interval > 0 {
				tick = tick.Add(interval)
				time.Sleep(time.Until(tick))
			}
			l, f, good := once(i)
			lat[i], ttft[i], ok = l, f, ok && good
		}
		if time.Now().Before(measureFrom) {
			continue
		}
		if !ok {
			res.Errors++
			continue
		}
		res.Rounds++
		for i := range len(targets) {
			res.Lat[i] = append(res.Lat[i], lat[i])
			res.TTFT[i] = append(res.TTFT[i], ttft[i])
		}
		res.AddedT = append(res.AddedT, lat[2]-lat[0])
		res.AddedP = append(res.AddedP, lat[1]-lat[0])
		res.AddedR = append(res.AddedR, lat[3]-lat[0])
		if stream {
			res.AddedTT = append(res.AddedTT, ttft[2]-ttft[0])
		}
	}
	for i := range len(targets) {
		slices.Sort(res.Lat[i])
		slices.Sort(res.TTFT[i])
	}
	slices.Sort(res.AddedT)
	slices.Sort(res.AddedP)
	slices.Sort(res.AddedR)
	slices.Sort(res.AddedTT)
	return res
}

func (r pairedResult) print(w io.Writer) {
	how := "back to back"
	if r.OpenRate > 0 {
		how = fmt.Sprintf("one request every %s", time.Second/time.Duration(r.OpenRate))
	}
	where := "client in this process"
	if r.ClientProcess {
		where = "client in its own process"
	}
	fmt.Fprintf(w, "%s (%d rounds of direct, bare proxy, tollgate, TCP relay in turn, %s, %s; %d failed rounds)\n", r.Label, r.Rounds, how, where, r.Errors)
	fmt.Fprintf(w, "  p50: direct %s   bare proxy %s   tollgate %s   TCP relay %s\n", pct(r.Lat[0], 0.5).Round(time.Microsecond),
		pct(r.Lat[1], 0.5).Round(time.Microsecond), pct(r.Lat[2], 0.5).Round(time.Microsecond), pct(r.Lat[3], 0.5).Round(time.Microsecond))
	fmt.Fprintf(w, "  added, median of the rounds' differences: tollgate %s   bare proxy %s   TCP relay %s\n",
		pct(r.AddedT, 0.5).Round(time.Microsecond), pct(r.AddedP, 0.5).Round(time.Microsecond), pct(r.AddedR, 0.5).Round(time.Microsecond))
	if len(r.AddedTT) > 0 {
		fmt.Fprintf(w, "  time to first content added: tollgate %s (p50 direct %s, tollgate %s)\n", pct(r.AddedTT, 0.5).Round(time.Microsecond),
			pct(r.TTFT[0], 0.5).Round(time.Microsecond), pct(r.TTFT[2], 0.5).Round(time.Microsecond))
	}
}

// startTCPRelay listens on loopback and copies bytes between each accepted
// connection and a new connection to upstream (host:port), both ways: a
// second hop with no HTTP work, the floor under any proxy's added latency.
func startTCPRelay(upstream string) (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				u, err := net.Dial("tcp", upstream)
				if err != nil {
					c.Close()
					return
				}
				go func() {
					_, _ = io.Copy(u, c)
					u.Close()
				}()
				_, _ = io.Copy(c, u)
				c.Close()
			}()
		}
	}()
	return ln, nil
}
