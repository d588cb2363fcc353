package nodeload

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// vllmMetrics is the shape of vLLM's /metrics (prometheus_client's text
// format): the client's own series first, labels sorted, floats, counters
// with _total and _created, a label value holding a brace and a quote,
// and two data-parallel engines.
const vllmMetrics = `# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 13524.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B {\"x\"}"} 5.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-8B {\"x\"}"} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B {\"x\"}"} 2.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-8B {\"x\"}"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B {\"x\"}"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-8B {\"x\"}"} 0.25
# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-8B {\"x\"}"} 91234.0
vllm:prefix_cache_queries_created{engine="0",model_name="Qwen/Qwen3-8B {\"x\"}"} 1.764289e+09
`

// sglangMetrics is SGLang's: one series per tensor-parallel rank (the
// same batch twice), two data-parallel ranks, and a timestamp.
const sglangMetrics = `# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 7.0
sglang:num_running_reqs{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 7.0
sglang:num_running_reqs{dp_rank="1",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 3.0 1764289000000
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 4.0
sglang:num_queue_reqs{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 4.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 0.75
`

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		ok         bool
		want       Report
	}{
		{"vllm", vllmMetrics, true, Report{Running: 9, Waiting: 2, KVUsage: 0.375}},
		{"vllm before 0.9", "vllm:num_requests_running{model_name=\"m\"} 1.0\nvllm:num_requests_waiting{model_name=\"m\"} 6.0\nvllm:gpu_cache_usage_perc{model_name=\"m\"} 0.125\n",
			true, Report{Running: 1, Waiting: 6, KVUsage: 0.125}},
		{"sglang", sglangMetrics, true, Report{Running: 10, Waiting: 4, KVUsage: 0.75}},
		{"no labels, no kv", "vllm:num_requests_waiting 3\n", true, Report{Waiting: 3, KVUsage: -1}},
		{"another server", "llamacpp:requests_processing 2\nprocess_open_fds 12.0\n", false, Report{KVUsage: -1}},
		{"garbage", "vllm:num_requests_running{engine=\"0\" 3.0\nvllm:num_requests_waiting NaN\n{}\n", false, Report{KVUsage: -1}},
		{"not counts", "vllm:num_requests_running +Inf\nvllm:num_requests_waiting -2.0\nvllm:num_requests_waiting 4.0\n", true, Report{Waiting: 4, KVUsage: -1}},
		{"empty", "", false, Report{KVUsage: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Parse([]byte(tc.text))
			if ok != tc.ok || got != tc.want {
				t.Fatalf("Parse = %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// node is a model server's /metrics over real HTTP, its load settable.
type node struct {
	srv              *httptest.Server
	running, waiting atomic.Int64
	status           atomic.Int64 // 0: 200
	hits             atomic.Int64
	fail             atomic.Bool // close connections without answering
}

func newNode(t *testing.T) *node {
	n := &node{}
	n.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.hits.Add(1)
		if n.fail.Load() {
			panic(http.ErrAbortHandler)
		}
		if s := n.status.Load(); s != 0 {
			w.WriteHeader(int(s))
			return
		}
		fmt.Fprintf(w, "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} %d.0\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} %d.0\n",
			n.running.Load(), n.waiting.Load())
	}))
	t.Cleanup(n.srv.Close)
	return n
}

func (n *node) fetch(ctx context.Context) ([]byte, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, n.srv.URL+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != 200 {
		err = fmt.Errorf("status %d", resp.StatusCode)
	}
	return b, err
}

// waitFor polls cond for up to 10 s (the poller runs on its own clock).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestPollerLoad(t *testing.T) {
	n := newNode(t)
	n.running.Store(6)
	n.waiting.Store(3)
	var own atomic.Int64
	own.Store(2) // this instance's share of the node's 9
	p := Start(Options{Fetch: n.fetch, Interval: 10 * time.Millisecond, Own: own.Load})
	defer p.Close()
	waitFor(t, "a report", func() bool { _, live := p.Load(own.Load()); return live })
	if l, _ := p.Load(2); l != 9 {
		t.Fatalf("load = %d, want the node's 9", l)
	}
	// Requests this instance sends or ends before the next report move
	// the node's load by as many: the report was taken with own at 2.
	p.Close() // freeze the report
	p = Start(Options{Fetch: n.fetch, Interval: time.Hour, Own: func() int64 { return 2 }})
	defer p.Close()
	waitFor(t, "a report", func() bool { _, live := p.Load(2); return live })
	for own, want := range map[int64]int64{2: 9, 5: 12, 0: 7} {
		if l, live := p.Load(own); l != want || !live {
			t.Errorf("own %d: load %d (live %v), want %d", own, l, live, want)
		}
	}
	// Never below this instance's own count (the node drained in between).
	n.running.Store(0)
	n.waiting.Store(0)
	q := Start(Options{Fetch: n.fetch, Interval: time.Hour, Own: func() int64 { return 4 }})
	defer q.Close()
	waitFor(t, "a report", func() bool { _, live := q.Load(0); return live })
	if l, _ := q.Load(1); l != 1 {
		t.Fatalf("load = %d, want own 1 (report 0 taken at own 4)", l)
	}
}

// A node whose /metrics is absent (404, or no vLLM/SGLang gauges) is never
// live: routing uses the own count.
func TestPollerAbsentMetrics(t *testing.T) {
	for _, status := range []int64{404, 0} {
		n := newNode(t)
		fetch := n.fetch
		if status == 0 {
			fetch = func(ctx context.Context) ([]byte, error) {
				return []byte("# TYPE process_open_fds gauge\nprocess_open_fds 5.0\n"), nil
			}
		}
		n.status.Store(status)
		p := Start(Options{Fetch: fetch, Interval: 5 * time.Millisecond, Own: func() int64 { return 3 }})
		waitFor(t, "failed polls", func() bool { return p.Stats().Failures >= 3 })
		if l, live := p.Load(3); l != 3 || live {
			t.Errorf("status %d: load %d (live %v), want own 3, not live", status, l, live)
		}
		p.Close()
	}
}

// A node that stops answering is trusted for Stale, then the own count is
// used; it is trusted again on its next good report.
func TestPollerStale(t *testing.T) {
	n := newNode(t)
	n.running.Store(8)
	p := Start(Options{Fetch: n.fetch, Interval: 5 * time.Millisecond, Stale: 50 * time.Millisecond, Own: func() int64 { return 1 }})
	defer p.Close()
	waitFor(t, "a report", func() bool { _, live := p.Load(1); return live })
	n.fail.Store(true)
	waitFor(t, "the report to go stale", func() bool { _, live := p.Load(1); return !live })
	if l, _ := p.Load(1); l != 1 {
		t.Fatalf("stale: load %d, want own 1", l)
	}
	if st := p.Stats(); st.Live || st.Failures == 0 {
		t.Fatalf("stats %+v: want failures and not live", st)
	}
	n.fail.Store(false)
	waitFor(t, "a fresh report", func() bool { l, live := p.Load(1); return live && l == 8 })
}

// BenchmarkParse reads a /metrics of vLLM's size: its histograms' buckets
// around the gauges read.
func BenchmarkParse(b *testing.B) {
	var text []byte
	for h := 0; h < 40; h++ {
		text = fmt.Appendf(text, "# HELP vllm:histogram_%d_seconds A histogram.\n# TYPE vllm:histogram_%d_seconds histogram\n", h, h)
		for le := 0; le < 30; le++ {
			text = fmt.Appendf(text, "vllm:histogram_%d_seconds_bucket{engine=\"0\",le=\"%d.0\",model_name=\"Qwen/Qwen3-8B\"} %d.0\n", h, le, le*17)
		}
	}
	text = append(text, vllmMetrics...)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := Parse(text); !ok {
			b.Fatal("no report")
		}
	}
}
