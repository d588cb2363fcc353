package metrics

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http/httptest"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/storefail"
)

type nodes []NodeStat

func (n nodes) NodeStats() []NodeStat { return n }

type prefix PrefixStat

func (p prefix) PrefixMetrics() PrefixStat { return PrefixStat(p) }

type bill billing.Stats

func (b bill) Stats() billing.Stats { return billing.Stats(b) }

// scrape returns the registry's text exposition.
func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("scrape: %d", rec.Code)
	}
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

func TestObserveRequest(t *testing.T) {
	m := New(Build{Version: "v1.2.3", Commit: "abc", GoVersion: "go1.26"})
	m.Registry.MustRegister(NodeCollector{nodes{{Name: "gpu-a", Class: "network", Healthy: true, Outstanding: 3, MaxConcurrent: 8, Failures: 2, TakenOut: 1,
		Polled: true, Reported: 9, PollFailures: 4}, {Name: "gpu-b", Class: "network", Healthy: true, Reported: -1},
		{Name: "fallback", Class: "fallback", Healthy: true, Outstanding: 2}, {Name: "fallback", Class: "fallback", Healthy: false, Outstanding: 5}}},
		BillingCollector{bill{Holds: 5, Refused: 1, Batches: 2, Writing: 3 * time.Millisecond, UncollectedAmount: 1_500_000_000_000}},
		PrefixCollector{prefix{Hits: 7, Fallbacks: 2, Misses: 1, PromptBlocks: 100, MatchedBlocks: 60, IndexBlocks: 50, IndexBytes: 2400,
			EventsStored: 40, EventsRemoved: 12, EventsCleared: 1, EventBatches: 30, EventReplayed: 3, EventLost: 1, EventRestarts: 2,
			EventNodes: 3, EventsLive: 2, EventBlocks: 70, EventBytes: 5040, Tokenized: 25, TokenizeFailed: 4}})
	m.ObserveRequest(&Request{Model: "tg-chat", Class: "network", Status: 200, Stream: true, Duration: 2 * time.Second,
		TTFT: 300 * time.Millisecond, PromptTokens: 10, CompletionTokens: 20, CachedTokens: 4, CostUSD: 0.25, Searches: 1})
	m.ObserveRequest(&Request{Model: "tg-chat", Class: "network", Status: 200, Duration: time.Second, PromptTokens: 1, CompletionTokens: 2})
	m.ObserveRequest(&Request{Model: "tg-mini", Status: 402, Code: "insufficient_balance", Duration: time.Millisecond})
	m.AuthFailure("invalid_api_key")
	m.Idempotency("replayed")
	m.InflightStreams.Inc()
	_ = storefail.Wrap("metrics_test.call", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
	_ = storefail.Wrap("metrics_test.call", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET})
	_ = storefail.Wrap("metrics_test.call", errors.New("duplicate key value violates unique constraint"))
	out := scrape(t, m)
	for _, want := range []string{
		`tollgate_requests_total{class="network",code="",model="tg-chat",status="200"} 2`,
		`tollgate_requests_total{class="",code="insufficient_balance",model="tg-mini",status="402"} 1`,
		`tollgate_request_duration_seconds_count{class="network",model="tg-chat",stream="true"} 1`,
		`tollgate_time_to_first_token_seconds_bucket{class="network",model="tg-chat",le="0.5"} 1`,
		`tollgate_tokens_total{class="network",kind="prompt",model="tg-chat"} 11`,
		`tollgate_tokens_total{class="network",kind="cached",model="tg-chat"} 4`,
		`tollgate_cost_usd_total{class="network",model="tg-chat"} 0.25`,
		`tollgate_web_searches_total{class="network",model="tg-chat"} 1`,
		`tollgate_requests_in_flight{kind="stream"} 1`,
		`tollgate_auth_failures_total{reason="invalid_api_key"} 1`,
		`tollgate_idempotency_total{outcome="replayed"} 1`,
		`tollgate_build_info{commit="abc",goversion="go1.26",version="v1.2.3"} 1`,
		`tollgate_node_up{class="network",node="gpu-a"} 1`,
		`tollgate_node_outstanding_requests{class="network",node="gpu-a"} 3`,
		`tollgate_node_taken_out_total{class="network",node="gpu-a"} 1`,
		`tollgate_node_outstanding_requests{class="fallback",node="fallback"} 7`,
		`tollgate_node_up{class="fallback",node="fallback"} 0`,
		`tollgate_billing_holds_refused_total 1`,
		`tollgate_prefix_routed_total{outcome="hit"} 7`,
		`tollgate_prefix_routed_total{outcome="fallback"} 2`,
		`tollgate_prefix_blocks_total{kind="matched"} 60`,
		`tollgate_prefix_index_bytes 2400`,
		`tollgate_node_reported_requests{class="network",node="gpu-a"} 9`,
		`tollgate_node_load_poll_failures_total{class="network",node="gpu-a"} 4`,
		`tollgate_prefix_events_total{kind="block_stored"} 40`,
		`tollgate_prefix_events_total{kind="block_removed"} 12`,
		`tollgate_prefix_events_total{kind="all_blocks_cleared"} 1`,
		`tollgate_prefix_event_batches_total{kind="received"} 30`,
		`tollgate_prefix_event_batches_total{kind="replayed"} 3`,
		`tollgate_prefix_event_gaps_lost_total 1`,
		`tollgate_prefix_event_restarts_total 2`,
		`tollgate_prefix_event_nodes{judged_by="events"} 2`,
		`tollgate_prefix_event_nodes{judged_by="index"} 1`,
		`tollgate_prefix_event_index_bytes 5040`,
		`tollgate_prefix_tokenize_total{outcome="answered"} 25`,
		`tollgate_prefix_tokenize_total{outcome="failed"} 4`,
		`tollgate_billing_batch_write_seconds_total 0.003`,
		`tollgate_billing_uncollected_usd_total 1.5`,
		`tollgate_store_errors_total{kind="unavailable",operation="metrics_test.call"} 2`,
		`tollgate_store_errors_total{kind="error",operation="metrics_test.call"} 1`,
		`go_goroutines `,
		`process_cpu_seconds_total `,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
	if strings.Contains(out, `node="gpu-b"} -1`) || strings.Contains(out, `tollgate_node_load_poll_failures_total{class="network",node="gpu-b"}`) {
		t.Errorf("a node not polled has load poll series")
	}
	if strings.Contains(out, `="acct_`) || strings.Contains(out, `="key_`) || strings.Contains(out, `="req_`) {
		t.Errorf("an account or key reached a label")
	}
	Promtool(t, out)
}

// Promtool runs Prometheus's own `promtool check metrics` on a scrape (when
// TOLLGATE_TEST_PROMTOOL is set, see promtool).
func Promtool(t *testing.T, scrape string) {
	t.Helper()
	path, ok := promtool(t)
	if !ok {
		t.Log("promtool check metrics not run: TOLLGATE_TEST_PROMTOOL is not set")
		return
	}
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = strings.NewReader(scrape)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out.String())
	}
}
