package simulate

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/nodeload"
)

func getMetrics(t *testing.T, url string) (string, string) {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET /metrics: %d %s", resp.StatusCode, b)
	}
	return string(b), resp.Header.Get("Content-Type")
}

// /metrics reports the real queue: requests holding one of the GPU's
// slots run, the others wait, in each server's names, types and labels.
func TestMetricsQueueState(t *testing.T) {
	for _, tc := range []struct {
		flavour       Flavour
		running, wait string // the series' names and labels
		types         []string
	}{
		{VLLM, `vllm:num_requests_running{engine="0",model_name="m"}`, `vllm:num_requests_waiting{engine="0",model_name="m"}`,
			[]string{"# TYPE vllm:kv_cache_usage_perc gauge", "# TYPE vllm:prefix_cache_hits counter", `vllm:prefix_cache_hits_total{engine="0",model_name="m"} `}},
		{SGLang, `sglang:num_running_reqs{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"}`,
			`sglang:num_queue_reqs{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"}`,
			[]string{"# TYPE sglang:num_running_reqs gauge", "# TYPE sglang:token_usage gauge", "sglang:cache_hit_rate{"}},
	} {
		t.Run(string(tc.flavour), func(t *testing.T) {
			// Answers of 100 tokens at 10 a second: held until cancelled.
			_, ts := newTS(t, Config{Flavour: tc.flavour, Behaviour: Behaviour{OutputTokens: 100},
				GPU: GPU{MaxConcurrent: 2, DecodeTokensPerSec: 10, PrefixCacheTokens: 10_000}})
			text, ct := getMetrics(t, ts.URL)
			if ct != "text/plain; version=0.0.4; charset=utf-8" || !strings.Contains(text, "\n"+tc.running+" 0.0\n") ||
				!strings.Contains(text, "\n"+tc.wait+" 0.0\n") {
				t.Fatalf("idle /metrics (%s):\n%s", ct, text)
			}
			for _, s := range tc.types {
				if !strings.Contains(text, s) {
					t.Errorf("missing %q in:\n%s", s, text)
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{}, 3)
			for i := 0; i < 3; i++ {
				go func() {
					defer func() { done <- struct{}{} }()
					resp, err := post(t, ctx, ts.URL, `{"model":"m","messages":`+turns("s", 1)+`}`, nil)
					if err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}()
			}
			waitMetrics(t, ts.URL, tc.running+" 2.0", tc.wait+" 1.0")
			if r, ok := nodeload.Parse([]byte(mustMetrics(t, ts.URL))); !ok || r.Running != 2 || r.Waiting != 1 || r.KVUsage <= 0 {
				t.Fatalf("as tollgate reads it: %+v %v", r, ok)
			}
			cancel()
			for i := 0; i < 3; i++ {
				<-done
			}
			waitMetrics(t, ts.URL, tc.running+" 0.0", tc.wait+" 0.0")
		})
	}
}

func mustMetrics(t *testing.T, url string) string { s, _ := getMetrics(t, url); return s }

func waitMetrics(t *testing.T, url string, lines ...string) {
	t.Helper()
	var text string
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		text = mustMetrics(t, url)
		ok := true
		for _, l := range lines {
			ok = ok && strings.Contains(text, "\n"+l+"\n")
		}
		if ok {
			return
		}
	}
	t.Fatalf("want %q in:\n%s", lines, text)
}

// Servers without a Prometheus endpoint answer /metrics as any unknown path.
func TestMetricsOnlyVLLMAndSGLang(t *testing.T) {
	for _, f := range []Flavour{LlamaCpp, Ollama} {
		_, ts := newTS(t, Config{Flavour: f})
		resp, err := http.Get(ts.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 {
			t.Errorf("%s: /metrics %d, want 404", f, resp.StatusCode)
		}
	}
}
