package simulate

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
)

// metricsPath reports whether path is the flavour's Prometheus endpoint:
// vLLM serves /metrics always, SGLang with --enable-metrics (the
// simulator always).
func (s *Server) metricsPath(path string) bool {
	return path == "/metrics" && (s.flavour == VLLM || s.flavour == SGLang)
}

// metrics writes the scheduler's gauges as the imitated server's
// prometheus_client does (docs/simulator.md "Metrics"): HELP and TYPE
// lines, labels sorted by name, every value a Python float ("3.0"),
// counters as <name>_total with a <name>_created twin, and the client's
// own python_* and process_* series first. The figures are the real queue
// state: requests holding one of GPU.MaxConcurrent's slots run, those
// waiting for one wait (with no limit, every request in flight runs).
func (s *Server) metrics(w http.ResponseWriter) {
	running, waiting := s.inFlight.Load(), int64(0)
	kv, queries, hits := 0.0, int64(0), int64(0)
	if g := s.gpu; g != nil {
		if g.slots != nil {
			running, waiting = int64(len(g.slots)), g.waiting.Load()
		}
		g.mu.Lock()
		if g.limit > 0 {
			kv = float64(len(g.blocks)) / float64(g.limit)
		}
		queries, hits = g.promptTokens, g.cachedTokens
		g.mu.Unlock()
	}
	var b strings.Builder
	b.WriteString("# HELP python_gc_objects_collected_total Objects collected during gc\n# TYPE python_gc_objects_collected_total counter\n")
	for gen, n := range []int{13524, 2851, 412} {
		fmt.Fprintf(&b, "python_gc_objects_collected_total{generation=\"%d\"} %s\n", gen, pyFloat(float64(n)))
	}
	b.WriteString("# HELP process_open_fds Number of open file descriptors.\n# TYPE process_open_fds gauge\nprocess_open_fds 57.0\n")
	model := s.cfg.Models[0]
	gauge := func(name, help, labels string, v float64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n%s{%s} %s\n", name, help, name, name, labels, pyFloat(v))
	}
	counter := func(name, help, labels string, v float64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s counter\n%s_total{%s} %s\n%s_created{%s} %s\n",
			name, help, name, name, labels, pyFloat(v), name, labels, pyFloat(float64(s.started)))
	}
	switch s.flavour {
	case VLLM:
		l := `engine="0",model_name="` + escapeLabel(model) + `"`
		gauge("vllm:num_requests_running", "Number of requests in model execution batches.", l, float64(running))
		gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", l, float64(waiting))
		gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", l, kv)
		counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", l, float64(queries))
		counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", l, float64(hits))
	case SGLang:
		l := `engine_type="unified",model_name="` + escapeLabel(model) + `",pp_rank="0",tp_rank="0"`
		rate := 0.0
		if queries > 0 {
			rate = float64(hits) / float64(queries)
		}
		gauge("sglang:num_running_reqs", "The number of running requests.", l, float64(running))
		gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", l, float64(waiting))
		gauge("sglang:token_usage", "The token usage.", l, kv)
		gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", l, rate)
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	io.WriteString(w, b.String())
}

// pyFloat formats v as Python's repr of a float does: "3.0", "0.25",
// "1.7e+09".
func pyFloat(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e16 {
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// escapeLabel escapes a label value as the exposition format wants.
func escapeLabel(v string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(v)
}
