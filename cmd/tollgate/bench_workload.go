package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/kvevents"
	"github.com/tollgate/tollgate/routing"
	"github.com/tollgate/tollgate/simulate"
)

// workloadOpts are `tollgate bench --workload`'s settings: conversations
// against simulated GPU nodes (simulate.GPU) through tollgate, once per
// routing policy, each on fresh nodes and a fresh tollgate.
type workloadOpts struct {
	mixes       []string // multiturn, agent, unrelated
	policies    []string // round_robin, least_outstanding, prefix_cache
	nodes       int
	clients     int
	duration    time.Duration
	tokens      int
	slots       int
	cacheTokens int
	prefillRate float64
	decodeRate  float64
	margin      int64
	seed        uint64
	think       time.Duration // mean pause between a conversation's requests
	// instances: with more than 1, each policy runs on one tollgate and
	// then on this many, sharing one store, the clients' requests spread
	// over them in turn (a round-robin load balancer).
	instances      int
	instanceMargin int64  // prefix_margin of the runs on more than one instance
	instanceSlots  int    // max_concurrent of a node on each of several instances (0: slots ÷ instances)
	store          string // sqlite (a file shared by the instances) or postgres (TOLLGATE_TEST_POSTGRES)
	// disrupt happens halfway through each run: "restart" empties node 0's
	// cache (its server restarted), "add" adds the last node (absent until
	// then), "remove" removes it.
	disrupt string
	window  time.Duration // the cached share is also reported per window of this length
	// loadPoll and loadMargin are load_poll and prefix_margin under the
	// "+load" policies.
	loadPoll   time.Duration
	loadMargin int64
	// repeat runs each policy's instance counts this many rounds in turn
	// (1, k, 1, k, ...): on a shared machine one run's tail is noise.
	repeat int
}

// A policy compared is a routing policy, with options as suffixes:
// "+kv", the nodes publish KV-cache events that tollgate reads
// (kv_events, prefix_cache only); "+load", tollgate reads each node's
// load from its /metrics (load_poll), so every instance sees a node's
// whole load: max_concurrent is then the node's, not divided among the
// instances, and prefix_margin is --load-margin on one instance or several.
type benchPolicy struct {
	routing  string
	kv, load bool
}

// parsePolicy parses a --policies item.
func parsePolicy(p string) (benchPolicy, bool) {
	parts := strings.Split(p, "+")
	bp := benchPolicy{routing: parts[0]}
	switch bp.routing {
	case config.RoutingRoundRobin, config.RoutingLeastOutstanding, config.RoutingPrefixCache:
	default:
		return bp, false
	}
	for _, o := range parts[1:] {
		switch {
		case o == "kv" && !bp.kv && bp.routing == config.RoutingPrefixCache:
			bp.kv = true
		case o == "load" && !bp.load:
			bp.load = true
		default:
			return bp, false
		}
	}
	return bp, true
}

// workloadResult is one policy on one mix.
type workloadResult struct {
	mix, policy  string
	instances    int
	round        int // 1-based, of workloadOpts.repeat
	requests     int64
	errors       int64
	elapsed      time.Duration
	ttft         []time.Duration // each request's time to first token; sorted by runWorkloads
	promptTokens int64
	cachedTokens int64
	perNode      []int64 // requests each node served
	prefix       routing.PrefixStats
	windows      []float64 // cached share in each window of the run
	nodeBlocks   int64     // blocks the nodes' caches hold at the end
	// With load_poll: the nodes' subscriptions reporting at the end, of
	// all, and the polls that gave no report.
	loadLive, loadPolled, loadFailures int64
}

func (r *workloadResult) cachedShare() float64 {
	if r.promptTokens == 0 {
		return 0
	}
	return float64(r.cachedTokens) / float64(r.promptTokens)
}

func (r *workloadResult) meanTTFT() time.Duration {
	if len(r.ttft) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range r.ttft {
		sum += d
	}
	return sum / time.Duration(len(r.ttft))
}

// spread is the largest node's share of requests over the fair share
// (1.00: perfectly even).
func (r *workloadResult) spread() float64 {
	var sum, top int64
	for _, n := range r.perNode {
		sum += n
		top = max(top, n)
	}
	if sum == 0 {
		return 0
	}
	return float64(top) / (float64(sum) / float64(len(r.perNode)))
}

func (c *benchCmd) runWorkloads(ctx context.Context, o workloadOpts) error {
	var all []workloadResult
	counts := []int{1}
	if o.instances > 1 {
		counts = append(counts, o.instances)
	}
	for _, mix := range o.mixes {
		for _, pol := range o.policies {
			for round := 1; round <= max(1, o.repeat); round++ {
				for _, k := range counts {
					fmt.Fprintf(c.stderr, "%s, %s, %d instance(s)%s: %s with %d clients on %d nodes...\n", mix, pol, k, roundLabel(o.repeat, round), o.duration, o.clients, o.nodes)
					r, err := runWorkload(ctx, o, mix, pol, k)
					if err != nil {
						return fmt.Errorf("%s, %s, %d instances%s: %w", mix, pol, k, roundLabel(o.repeat, round), err)
					}
					r.round = round
					slices.Sort(r.ttft) // percentiles here and in printPooled read it sorted
					all = append(all, r)
				}
			}
		}
	}
	w := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	roundCol := ""
	if o.repeat > 1 {
		roundCol = "round\t"
	}
	fmt.Fprintln(w, "mix\tpolicy\tinstances\trequests\terrors\treq/s\tprompt tok/s\tcached share\tmean TTFT\tp50 TTFT\tp99 TTFT\tspread (max/fair)\tper node\t"+roundCol)
	for _, r := range all {
		per := make([]string, len(r.perNode))
		for i, n := range r.perNode {
			per[i] = fmt.Sprint(n)
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%.1f\t%.0f\t%.1f%%\t%s\t%s\t%s\t%.2f\t%s\t", r.mix, r.policy, r.instances, r.requests, r.errors,
			float64(r.requests)/r.elapsed.Seconds(), float64(r.promptTokens)/r.elapsed.Seconds(), 100*r.cachedShare(),
			r.meanTTFT().Round(time.Millisecond), pct(r.ttft, 0.5).Round(time.Millisecond), pct(r.ttft, 0.99).Round(time.Millisecond),
			r.spread(), strings.Join(per, "/"))
		if o.repeat > 1 {
			fmt.Fprintf(w, "%d\t", r.round)
		}
		fmt.Fprintln(w)
	}
	w.Flush()
	if o.repeat > 1 {
		c.printPooled(all, o.repeat)
	}
	for _, r := range all {
		if bp, _ := parsePolicy(r.policy); bp.routing != config.RoutingPrefixCache {
			continue
		}
		p := r.prefix
		share := 0.0
		if p.PromptBlocks > 0 {
			share = 100 * float64(p.MatchedBlocks) / float64(p.PromptBlocks)
		}
		fmt.Fprintf(c.stdout, "%s, %s, %d instance(s)%s: %d routed by prefix: %d hits, %d fallbacks to load, %d misses; the index matched %.1f%% of blocks; indexes %d blocks, %d KB\n",
			r.mix, r.policy, r.instances, roundLabel(o.repeat, r.round), p.Requests, p.Hits, p.Fallbacks, p.Misses, share, p.IndexBlocks, p.IndexBytes/1024)
		if p.EventNodes > 0 {
			fmt.Fprintf(c.stdout, "  KV events: %d of %d node subscriptions trusted at the end; %d batches (%d replayed after a gap, %d gaps lost, %d restarts); their indexes %d blocks, %d KB (the nodes hold %d blocks, once per instance: %d); %d prompts tokenized by the nodes' /tokenize, %d calls failed\n",
				p.EventsLive, p.EventNodes, p.EventBatches, p.EventReplayed, p.EventLost, p.EventRestarts, p.EventBlocks, p.EventBytes/1024, r.nodeBlocks, r.nodeBlocks*int64(r.instances), p.Tokenized, p.TokenizeFailed)
		}
		if r.loadPolled > 0 {
			fmt.Fprintf(c.stdout, "  load: %d of %d polled nodes reporting at the end, %d polls without a report\n", r.loadLive, r.loadPolled, r.loadFailures)
		}
	}
	if o.window > 0 {
		fmt.Fprintf(c.stdout, "\ncached share per %s window", o.window)
		if o.disrupt != "" {
			fmt.Fprintf(c.stdout, " (%s at %s)", o.disrupt, o.duration/2)
		}
		fmt.Fprintln(c.stdout, ":")
		for _, r := range all {
			parts := make([]string, len(r.windows))
			for i, v := range r.windows {
				parts[i] = fmt.Sprintf("%.0f%%", 100*v)
			}
			fmt.Fprintf(c.stdout, "  %s, %s, %d instance(s)%s: %s\n", r.mix, r.policy, r.instances, roundLabel(o.repeat, r.round), strings.Join(parts, " "))
		}
	}
	return nil
}

// gpuGateway is tollgate (one or more instances in this process, on one
// store) in front of simulated GPU nodes.
type gpuGateway struct {
	main   *Main   // the first instance
	mains  []*Main // every instance
	sims   []*simulate.Running
	pubs   []*kvevents.Publisher
	secret string // an API key
	dir    string
	policy benchPolicy
	o      workloadOpts
	k      int // instances
}

func (g *gpuGateway) close() {
	for _, m := range g.mains {
		m.Close(context.Background())
	}
	for _, p := range g.pubs {
		p.Close()
	}
	for _, s := range g.sims {
		s.Close()
	}
	os.RemoveAll(g.dir)
}

// startGPUGateway starts o.nodes simulated vLLM nodes with o's GPU
// settings and one tollgate routing model "wl" over them by policy.
func startGPUGateway(ctx context.Context, o workloadOpts, policy string) (*gpuGateway, error) {
	return startGPUFleet(ctx, o, policy, 1)
}

// startGPUFleet starts o.nodes simulated vLLM nodes (publishing KV-cache
// events under a +kv policy) and k tollgate instances on one store.
func startGPUFleet(ctx context.Context, o workloadOpts, policy string, k int) (g *gpuGateway, err error) {
	bp, ok := parsePolicy(policy)
	if !ok {
		return nil, fmt.Errorf("policy %q: unknown", policy)
	}
	g = &gpuGateway{policy: bp, o: o, k: max(k, 1)}
	defer func() {
		if err != nil {
			g.close()
		}
	}()
	for i := 0; i < o.nodes; i++ {
		s, err := simulate.Start(simulate.Config{Flavour: simulate.VLLM, Models: []string{"wl-up"}, MaxRecorded: -1,
			ContextLength: 1 << 20, Behaviour: simulate.Behaviour{OutputTokens: o.tokens},
			GPU: simulate.GPU{PrefixCacheTokens: o.cacheTokens, PrefillTokensPerSec: o.prefillRate,
				DecodeTokensPerSec: o.decodeRate, MaxConcurrent: o.slots}})
		if err != nil {
			return g, err
		}
		g.sims = append(g.sims, s)
		if bp.kv {
			p, err := s.PublishKVEvents("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
			if err != nil {
				return g, err
			}
			g.pubs = append(g.pubs, p)
		}
	}
	if g.dir, err = os.MkdirTemp("", "tollgate-workload-"); err != nil {
		return g, err
	}
	nodes := o.nodes
	if o.disrupt == "add" {
		nodes-- // the last node joins halfway
	}
	path, err := g.writeConfig(nodes)
	if err != nil {
		return g, err
	}
	for i := 0; i < max(k, 1); i++ {
		cfg, err := config.Load(path)
		if err != nil {
			return g, err
		}
		m := &Main{Config: cfg}
		if err := m.Open(ctx); err != nil {
			return g, err
		}
		g.mains = append(g.mains, m)
	}
	g.main = g.mains[0]
	acct := tollgate.Account{ID: tollgate.NewID("acct_"), Name: "bench", Balance: tollgate.Dollars(1_000_000), Created: time.Now().UTC()}
	if err := g.main.Store.CreateAccount(ctx, acct); err != nil {
		return g, err
	}
	g.secret = tollgate.NewKeySecret()
	if err := g.main.Store.CreateKey(ctx, tollgate.Key{ID: tollgate.NewID("key_"), AccountID: acct.ID, Prefix: tollgate.DisplayPrefix(g.secret), Created: time.Now().UTC()}, tollgate.HashKey(g.secret)); err != nil {
		return g, err
	}
	return g, nil
}

// writeConfig writes the instances' config with the first n nodes and
// returns its path.
func (g *gpuGateway) writeConfig(n int) (string, error) {
	o := g.o
	// Each instance counts only its own requests in flight: an operator
	// running k instances gives each 1/k of a node's slots, and a margin
	// of its own (docs/config.md#routing).
	slots, margin := ceilDiv(int64(o.slots), int64(g.k)), o.margin
	if g.k > 1 {
		margin = o.instanceMargin
		if o.instanceSlots > 0 {
			slots = int64(o.instanceSlots)
		}
	}
	// Without +load the nodes' load is not read, events or not.
	loadPoll := "        load_poll: \"off\"\n"
	if g.policy.load {
		// Each instance sees the node's whole load (docs/config.md#routing).
		slots, margin = int64(o.slots), o.loadMargin
		loadPoll = fmt.Sprintf("        load_poll: %s\n", o.loadPoll)
	}
	var nodes strings.Builder
	for i, s := range g.sims[:n] {
		kv := ""
		if g.policy.kv {
			kv = fmt.Sprintf(", kv_events: %q, kv_events_replay: %q", g.pubs[i].PubAddr(), g.pubs[i].ReplayAddr())
		}
		fmt.Fprintf(&nodes, "          - {name: gpu%d, url: \"%s/v1\", flavour: vllm, max_concurrent: %d%s}\n", i, s.URL(), slots, kv)
	}
	store := "store:\n  sqlite: bench.db\n"
	if o.store == "postgres" {
		store = "store:\n  postgres_url_env: TOLLGATE_TEST_POSTGRES\n"
	}
	cfgText := fmt.Sprintf(`listen:
  api: 127.0.0.1:0
%sbilling:
  disabled: true
health:
  interval: "off"
models:
  - id: wl
    kind: chat
    context_length: 1048576
    max_output_tokens: 4096
    backends:
      - class: network
        upstream_model: wl-up
        capabilities: [tools]
        rates: {input: "0.1", output: "0.4"}
        routing: %s
        prefix_margin: %d
        prefix_index_tokens: %d
%s        nodes:
%s`, store, g.policy.routing, margin, o.cacheTokens, loadPoll, nodes.String())
	path := filepath.Join(g.dir, "tollgate.yaml")
	return path, os.WriteFile(path, []byte(cfgText), 0o644)
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// disruptNow does o.disrupt to the fleet.
func (g *gpuGateway) disruptNow() error {
	switch g.o.disrupt {
	case "restart":
		g.sims[0].ClearCache()
		return nil
	case "add", "remove":
		n := g.o.nodes
		if g.o.disrupt == "remove" {
			n--
		}
		path, err := g.writeConfig(n)
		if err != nil {
			return err
		}
		for _, m := range g.mains {
			if err := m.Reload(path); err != nil {
				return err
			}
		}
	}
	return nil
}

// roundLabel names round of repeat in progress lines ("" for one round).
func roundLabel(repeat, round int) string {
	if repeat <= 1 {
		return ""
	}
	return fmt.Sprintf(", round %d of %d", round, repeat)
}

// printPooled reports each mix, policy and instance count over all its
// rounds (requests pooled: one share, one set of percentiles), and for
// several instances in how many rounds their mean and p99 TTFT were no
// worse than one instance's in the same round.
func (c *benchCmd) printPooled(all []workloadResult, repeat int) {
	type key struct {
		mix, policy string
		instances   int
	}
	type roundKey struct {
		mix, policy string
		round       int
	}
	// pool is a mix, policy and instance count over its rounds.
	type pool struct {
		workloadResult
		worst float64 // the largest spread of a round
		// Rounds in which several instances' mean and p99 were no worse
		// than one instance's.
		meanOK, p99OK int
	}
	var order []key
	pooled := map[key]*pool{}
	one := map[roundKey]workloadResult{} // one instance's run of a mix, policy and round
	for _, r := range all {
		if r.instances == 1 {
			one[roundKey{r.mix, r.policy, r.round}] = r
		}
		k := key{r.mix, r.policy, r.instances}
		p := pooled[k]
		if p == nil {
			p = &pool{workloadResult: workloadResult{mix: r.mix, policy: r.policy, instances: r.instances}}
			pooled[k] = p
			order = append(order, k)
		}
		p.requests += r.requests
		p.errors += r.errors
		p.promptTokens += r.promptTokens
		p.cachedTokens += r.cachedTokens
		p.ttft = append(p.ttft, r.ttft...)
		p.worst = max(p.worst, r.spread()) // each round's nodes are new: their counts do not add up
	}
	for _, r := range all {
		o, ok := one[roundKey{r.mix, r.policy, r.round}]
		if r.instances == 1 || !ok {
			continue
		}
		p := pooled[key{r.mix, r.policy, r.instances}]
		if r.meanTTFT() <= o.meanTTFT() {
			p.meanOK++
		}
		if pct(r.ttft, 0.99) <= pct(o.ttft, 0.99) {
			p.p99OK++
		}
	}
	fmt.Fprintf(c.stdout, "\nall %d rounds pooled:\n", repeat)
	w := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "mix\tpolicy\tinstances\trequests\terrors\tcached share\tmean TTFT\tp50 TTFT\tp99 TTFT\tworst round's spread\trounds no worse than one: mean, p99\t")
	for _, k := range order {
		p := pooled[k]
		slices.Sort(p.ttft)
		vs := ""
		if k.instances > 1 {
			vs = fmt.Sprintf("%d/%d, %d/%d", p.meanOK, repeat, p.p99OK, repeat)
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%.1f%%\t%s\t%s\t%s\t%.2f\t%s\t\n", p.mix, p.policy, p.instances, p.requests, p.errors,
			100*p.cachedShare(), p.meanTTFT().Round(time.Millisecond), pct(p.ttft, 0.5).Round(time.Millisecond),
			pct(p.ttft, 0.99).Round(time.Millisecond), p.worst, vs)
	}
	w.Flush()
}

// runWorkload runs one mix under one policy on fresh nodes, through k
// instances.
func runWorkload(ctx context.Context, o workloadOpts, mix, policy string, k int) (workloadResult, error) {
	res := workloadResult{mix: mix, policy: policy, instances: k}
	g, err := startGPUFleet(ctx, o, policy, k)
	if err != nil {
		return res, err
	}
	defer g.close()
	urls := make([]string, len(g.mains))
	for i, m := range g.mains {
		urls[i] = m.APIURL() + "/chat/completions"
	}
	var next atomic.Uint64 // the load balancer's turn
	sims, secret := g.sims, g.secret
	client := newBenchClient()

	var mu sync.Mutex
	start := time.Now()
	deadline := start.Add(o.duration)
	stop := make(chan struct{})
	var bg sync.WaitGroup
	if o.disrupt != "" {
		bg.Add(1)
		go func() {
			defer bg.Done()
			select {
			case <-time.After(o.duration / 2):
				if err := g.disruptNow(); err != nil {
					fmt.Fprintln(os.Stderr, "disrupt:", err)
				}
			case <-stop:
			}
		}()
	}
	if o.window > 0 {
		bg.Add(1)
		go func() {
			defer bg.Done()
			var lastP, lastC int64
			t := time.NewTicker(o.window)
			defer t.Stop()
			for {
				select {
				case <-t.C:
				case <-stop:
					return
				}
				var p, c int64
				for _, s := range sims {
					st := s.CacheStats()
					p += st.PromptTokens
					c += st.CachedTokens
				}
				share := 0.0
				if p > lastP {
					share = float64(c-lastC) / float64(p-lastP)
				}
				mu.Lock()
				res.windows = append(res.windows, share)
				mu.Unlock()
				lastP, lastC = p, c
			}
		}()
	}
	var wg sync.WaitGroup
	for w := 0; w < o.clients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The same seeds under every policy: the same conversations.
			rng := rand.New(rand.NewPCG(o.seed, uint64(w)))
			var ttfts []time.Duration
			var n, errs int64
			for k := 0; time.Now().Before(deadline) && ctx.Err() == nil; k++ {
				conv := newConversation(mix, rng, w, k)
				for conv.next() && time.Now().Before(deadline) {
					if conv.done > 1 && o.think > 0 {
						// The user reading and typing, or the tool running:
						// other conversations' requests reach the nodes meanwhile.
						pause := time.Duration(float64(o.think) * (0.5 + rng.Float64()))
						if time.Now().Add(pause).After(deadline) {
							break
						}
						time.Sleep(pause)
					}
					body := conv.body()
					t0 := time.Now()
					url := urls[int(next.Add(1)%uint64(len(urls)))]
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
					req.Header.Set("Authorization", "Bearer "+secret)
					req.Header.Set("Content-Type", "application/json")
					resp, err := client.Do(req)
					if err != nil {
						errs++
						continue
					}
					first := readAnswer(resp.Body, true, t0, nil)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK || first == 0 {
						errs++
						continue
					}
					n++
					ttfts = append(ttfts, first)
				}
			}
			mu.Lock()
			res.requests += n
			res.errors += errs
			res.ttft = append(res.ttft, ttfts...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(stop)
	bg.Wait()
	res.elapsed = time.Since(start)
	for _, s := range sims {
		st := s.CacheStats()
		res.promptTokens += st.PromptTokens
		res.cachedTokens += st.CachedTokens
		res.perNode = append(res.perNode, st.Requests)
		res.nodeBlocks += int64(st.Blocks)
	}
	for _, m := range g.mains {
		res.prefix.Add(m.Relay.PrefixStats())
		for _, n := range m.Relay.NodeStats() {
			if n.Polled {
				res.loadPolled++
				res.loadFailures += n.PollFailures
				if n.Reported >= 0 {
					res.loadLive++
				}
			}
		}
	}
	return res, nil
}

// conversation is one client's sequence of requests that resend a growing
// history: a chat (multiturn), a tool loop (agent), or one prompt
// (unrelated).
type conversation struct {
	mix   string
	rng   *rand.Rand
	msgs  []string // JSON messages so far
	tools string   // JSON tools array, or ""
	turns int      // requests in this conversation
	done  int
}

// Shared system prompts: conversations pick one of a few, as clients of a
// product share its system prompt.
var (
	chatSystems  = makeSystems("chat", 4, 1200)
	agentSystems = makeSystems("agent", 2, 4000)
	agentTools   = makeTools()
)

func makeSystems(kind string, n, size int) []string {
	out := make([]string, n)
	for i := range out {
		rng := rand.New(rand.NewPCG(uint64(i), 77))
		out[i] = fmt.Sprintf("You are %s assistant %d. ", kind, i) + words(rng, size)
	}
	return out
}

func makeTools() string {
	rng := rand.New(rand.NewPCG(5, 5))
	var b strings.Builder
	b.WriteByte('[')
	for i := 0; i < 6; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"type":"function","function":{"name":"tool_%d","description":%s,"parameters":{"type":"object","properties":{"arg":{"type":"string"}},"required":["arg"]}}}`, i, jsonString(words(rng, 250)))
	}
	b.WriteByte(']')
	return b.String()
}

var vocabulary = strings.Fields(`the a of to and in is it that for on with as was at by an be this from or are but not have which
gateway model token cache node prompt request answer tool result search file data value error time user system
function return string number list map table query index block prefix history turn agent loop step plan check`)

// words returns about size bytes of random words.
func words(rng *rand.Rand, size int) string {
	var b strings.Builder
	for b.Len() < size {
		b.WriteString(vocabulary[rng.IntN(len(vocabulary))])
		b.WriteByte(' ')
	}
	return b.String()
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func msg(role, content string) string {
	return `{"role":"` + role + `","content":` + jsonString(content) + `}`
}

func newConversation(mix string, rng *rand.Rand, worker, k int) *conversation {
	c := &conversation{mix: mix, rng: rng}
	switch mix {
	case "multiturn":
		c.turns = 6 + rng.IntN(15) // 6-20 turns
		c.msgs = append(c.msgs, msg("system", chatSystems[rng.IntN(len(chatSystems))]))
	case "agent":
		c.turns = 6 + rng.IntN(11) // 6-16 steps
		c.tools = agentTools
		c.msgs = append(c.msgs, msg("system", agentSystems[rng.IntN(len(agentSystems))]),
			msg("user", fmt.Sprintf("Task %d.%d: ", worker, k)+words(rng, 400+rng.IntN(800))))
	default: // unrelated
		c.turns = 1
	}
	return c
}

// next extends the history for the next request; false when the
// conversation is over.
func (c *conversation) next() bool {
	if c.done >= c.turns {
		return false
	}
	switch c.mix {
	case "multiturn":
		if c.done > 0 { // the previous answer, as the client keeps it
			c.msgs = append(c.msgs, msg("assistant", words(c.rng, 800+c.rng.IntN(2400))))
		}
		c.msgs = append(c.msgs, msg("user", words(c.rng, 100+c.rng.IntN(1100))))
	case "agent":
		if c.done > 0 { // the model's tool call and its result
			id := fmt.Sprintf("call_%d", c.done)
			c.msgs = append(c.msgs,
				`{"role":"assistant","content":null,"tool_calls":[{"id":"`+id+`","type":"function","function":{"name":"tool_1","arguments":`+jsonString(`{"arg":"`+words(c.rng, 60)+`"}`)+`}}]}`,
				`{"role":"tool","tool_call_id":"`+id+`","content":`+jsonString(words(c.rng, 800+c.rng.IntN(2400)))+`}`)
		}
	default:
		c.msgs = []string{msg("user", fmt.Sprintf("%x ", c.rng.Uint64())+words(c.rng, 1500+c.rng.IntN(4500)))}
	}
	c.done++
	return true
}

func (c *conversation) body() string {
	var b strings.Builder
	b.WriteString(`{"model":"wl","stream":true,"stream_options":{"include_usage":true},"messages":[`)
	b.WriteString(strings.Join(c.msgs, ","))
	b.WriteByte(']')
	if c.tools != "" {
		b.WriteString(`,"tools":`)
		b.WriteString(c.tools)
		b.WriteString(`,"tool_choice":"none"`)
	}
	b.WriteByte('}')
	return b.String()
}
