package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/storefail"
)

// NodeStat is one model node as a scrape sees it.
type NodeStat struct {
	Name, Class   string
	Healthy       bool
	Outstanding   int64 // requests in flight on the node
	MaxConcurrent int64 // 0: unlimited
	Failures      int64 // failed requests and probes counted against the node, since start
	TakenOut      int64 // times the node was taken out of rotation (probe or outlier), since start
	// Polled: the node's load is read from its /metrics (load_poll);
	// Reported is its last fresh report (running + waiting; -1: none),
	// PollFailures the polls that gave no report.
	Polled       bool
	Reported     int64
	PollFailures int64
}

// NodeSource lists the nodes of the catalogue in force (relay.Relay).
type NodeSource interface {
	NodeStats() []NodeStat
}

// BillingSource reports the biller's counters (billing.Biller).
type BillingSource interface {
	Stats() billing.Stats
}

var (
	nodeLabels  = []string{"node", "class"}
	descNodeUp  = prometheus.NewDesc(Namespace+"_node_up", "1 when the node is in rotation (healthy and not ejected), else 0.", nodeLabels, nil)
	descNodeOut = prometheus.NewDesc(Namespace+"_node_outstanding_requests", "Requests in flight on the node.", nodeLabels, nil)
	descNodeMax = prometheus.NewDesc(Namespace+"_node_max_concurrent", "The node's max_concurrent (0: unlimited).", nodeLabels, nil)
	descNodeErr = prometheus.NewDesc(Namespace+"_node_failures_total", "Failed requests and health probes counted against the node.", nodeLabels, nil)
	descNodeEj  = prometheus.NewDesc(Namespace+"_node_taken_out_total", "Times the node was taken out of rotation (failed probes, failures on real requests).", nodeLabels, nil)
	descNodeRep = prometheus.NewDesc(Namespace+"_node_reported_requests", "Requests the node reports running and waiting on its /metrics (load_poll), while its report is fresh.", nodeLabels, nil)
	descNodePF  = prometheus.NewDesc(Namespace+"_node_load_poll_failures_total", "Polls of the node's /metrics (load_poll) that gave no report.", nodeLabels, nil)
)

// NodeCollector reads the nodes at scrape time.
type NodeCollector struct{ Source NodeSource }

func (c NodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descNodeUp, descNodeOut, descNodeMax, descNodeErr, descNodeEj, descNodeRep, descNodePF} {
		ch <- d
	}
}

// Collect reports each node; nodes that share a name and class (every
// fallback backend is a node named "fallback") are summed into one series,
// up only when all of them are.
func (c NodeCollector) Collect(ch chan<- prometheus.Metric) {
	type key struct{ name, class string }
	merged := map[key]*NodeStat{}
	var order []key
	for _, n := range c.Source.NodeStats() {
		k := key{n.Name, n.Class}
		if m := merged[k]; m != nil {
			m.Healthy = m.Healthy && n.Healthy
			m.Outstanding += n.Outstanding
			m.MaxConcurrent += n.MaxConcurrent
			m.Failures += n.Failures
			m.TakenOut += n.TakenOut
			m.PollFailures += n.PollFailures
			if n.Polled {
				m.Polled = true
				if n.Reported >= 0 {
					m.Reported = max(m.Reported, 0) + n.Reported
				}
			}
			continue
		}
		n := n
		merged[k] = &n
		order = append(order, k)
	}
	for _, k := range order {
		n := merged[k]
		up := 0.0
		if n.Healthy {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(descNodeUp, prometheus.GaugeValue, up, n.Name, n.Class)
		ch <- prometheus.MustNewConstMetric(descNodeOut, prometheus.GaugeValue, float64(n.Outstanding), n.Name, n.Class)
		ch <- prometheus.MustNewConstMetric(descNodeMax, prometheus.GaugeValue, float64(n.MaxConcurrent), n.Name, n.Class)
		ch <- prometheus.MustNewConstMetric(descNodeErr, prometheus.CounterValue, float64(n.Failures), n.Name, n.Class)
		ch <- prometheus.MustNewConstMetric(descNodeEj, prometheus.CounterValue, float64(n.TakenOut), n.Name, n.Class)
		if n.Polled {
			if n.Reported >= 0 {
				ch <- prometheus.MustNewConstMetric(descNodeRep, prometheus.GaugeValue, float64(n.Reported), n.Name, n.Class)
			}
			ch <- prometheus.MustNewConstMetric(descNodePF, prometheus.CounterValue, float64(n.PollFailures), n.Name, n.Class)
		}
	}
}

func billingDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(Namespace+"_billing_"+name, help, nil, nil)
}

var (
	descHolds       = billingDesc("holds_total", "Holds placed (balance reserved before a backend call).")
	descRefused     = billingDesc("holds_refused_total", "Holds refused: insufficient balance, a key's spend or rate limit (requests_total's code says which).")
	descSettled     = billingDesc("settled_total", "Requests charged.")
	descReleased    = billingDesc("released_total", "Holds released without a charge.")
	descSwept       = billingDesc("swept_total", "Holds of dead instances released by the sweeper.")
	descBatches     = billingDesc("batches_total", "Store transactions written by the billing batcher.")
	descOps         = billingDesc("batch_operations_total", "Billing operations written in batches.")
	descWriting     = billingDesc("batch_write_seconds_total", "Time spent writing billing batches to the store (the store's latency; divide by batches_total for the mean).")
	descWaiting     = billingDesc("operation_wait_seconds_total", "Time operations waited from hand-over to their batch's commit, summed (divide by batch_operations_total for the mean settle/hold latency).")
	descUncollected = billingDesc("uncollected_total", "Charges where the backend reported more than the hold and the free balance covered.")
	descUncollAmt   = billingDesc("uncollected_usd_total", "USD that could not be collected (approximate; the ledger's uncollected column is exact).")
	descJournaled   = billingDesc("journaled_total", "Settles answered from the charge journal before their commit.")
)

// BillingCollector reads the biller's counters at scrape time.
type BillingCollector struct{ Source BillingSource }

func (c BillingCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descHolds, descRefused, descSettled, descReleased, descSwept, descBatches, descOps,
		descWriting, descWaiting, descUncollected, descUncollAmt, descJournaled} {
		ch <- d
	}
}

func (c BillingCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.Source.Stats()
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	counter(descHolds, float64(s.Holds))
	counter(descRefused, float64(s.Refused))
	counter(descSettled, float64(s.Settled))
	counter(descReleased, float64(s.Released))
	counter(descSwept, float64(s.Swept))
	counter(descBatches, float64(s.Batches))
	counter(descOps, float64(s.Ops))
	counter(descWriting, s.Writing.Seconds())
	counter(descWaiting, s.Waiting.Seconds())
	counter(descUncollected, float64(s.Uncollected))
	counter(descUncollAmt, float64(s.UncollectedAmount)/1e12) // picodollars to USD, approximately
	counter(descJournaled, float64(s.Journaled))
}

// PrefixStat is prefix-cache routing as a scrape sees it (relay.Relay.PrefixStats).
type PrefixStat struct {
	Hits, Fallbacks, Misses     int64 // requests routed by prefix_cache, by outcome
	PromptBlocks, MatchedBlocks int64 // their prompts' blocks, and those the chosen node held
	IndexBlocks, IndexBytes     int64 // the nodes' prefix indexes now
	// The nodes' KV-cache events (kv_events): events applied by kind;
	// batches applied, of which replayed after a gap; gaps that could not
	// be replayed; restarts of a node's numbering; the nodes publishing,
	// and of those judged by their events now (the rest by the index);
	// the events' indexes now; prompts a node's /tokenize answered for
	// matching them, and calls that failed (those requests used the index).
	EventsStored, EventsRemoved, EventsCleared int64
	EventBatches, EventReplayed                int64
	EventLost, EventRestarts                   int64
	EventNodes, EventsLive                     int
	EventBlocks, EventBytes                    int64
	Tokenized, TokenizeFailed                  int64
}

// PrefixSource reports prefix-cache routing (relay.Relay).
type PrefixSource interface {
	PrefixMetrics() PrefixStat
}

var (
	descPrefixRouted  = prometheus.NewDesc(Namespace+"_prefix_routed_total", "Requests routed by prefix_cache: hit (to the node with the longest matching prefix), fallback (that node too loaded: least outstanding), miss (no node held any block).", []string{"outcome"}, nil)
	descPrefixBlocks  = prometheus.NewDesc(Namespace+"_prefix_blocks_total", "Blocks of those requests' prompts (kind prompt) and those the chosen node held (kind matched): matched / prompt is the matched share.", []string{"kind"}, nil)
	descPrefixIndex   = prometheus.NewDesc(Namespace+"_prefix_index_blocks", "Blocks held by the nodes' prefix indexes now.", nil, nil)
	descPrefixIndexMB = prometheus.NewDesc(Namespace+"_prefix_index_bytes", "Memory of the nodes' prefix indexes now (an estimate).", nil, nil)

	descEvents       = prometheus.NewDesc(Namespace+"_prefix_events_total", "KV-cache events applied from the nodes (kv_events), by kind: block_stored, block_removed, all_blocks_cleared.", []string{"kind"}, nil)
	descEventBatches = prometheus.NewDesc(Namespace+"_prefix_event_batches_total", "Batches of KV-cache events applied (kind received), and of those the ones asked for again after a gap (kind replayed).", []string{"kind"}, nil)
	descEventLost    = prometheus.NewDesc(Namespace+"_prefix_event_gaps_lost_total", "Gaps in a node's KV-cache events that could not be replayed (its view was emptied).", nil, nil)
	descEventRestart = prometheus.NewDesc(Namespace+"_prefix_event_restarts_total", "Times a node's KV-cache event numbering started again (restarted; its view was emptied).", nil, nil)
	descEventNodes   = prometheus.NewDesc(Namespace+"_prefix_event_nodes", "Nodes with kv_events, by what routing judges them by now: events (heard and trusted, their /tokenize asked), or index (not heard yet, silent, after a lost gap, or no /tokenize to match them by).", []string{"judged_by"}, nil)
	descEventIndex   = prometheus.NewDesc(Namespace+"_prefix_event_index_blocks", "Blocks held by the nodes' KV-cache event indexes now.", nil, nil)
	descEventIndexMB = prometheus.NewDesc(Namespace+"_prefix_event_index_bytes", "Memory of the nodes' KV-cache event indexes now (an estimate).", nil, nil)
	descTokenize     = prometheus.NewDesc(Namespace+"_prefix_tokenize_total", "Prompts sent to a node's /tokenize to match them against the KV-cache events, by outcome: answered, or failed (timed out, refused, an error: the request was routed by the index).", []string{"outcome"}, nil)
)

// PrefixCollector reads prefix routing's counters at scrape time.
type PrefixCollector struct{ Source PrefixSource }

func (c PrefixCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPrefixRouted, descPrefixBlocks, descPrefixIndex, descPrefixIndexMB,
		descEvents, descEventBatches, descEventLost, descEventRestart, descEventNodes, descEventIndex, descEventIndexMB, descTokenize} {
		ch <- d
	}
}

func (c PrefixCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.Source.PrefixMetrics()
	ch <- prometheus.MustNewConstMetric(descPrefixRouted, prometheus.CounterValue, float64(s.Hits), "hit")
	ch <- prometheus.MustNewConstMetric(descPrefixRouted, prometheus.CounterValue, float64(s.Fallbacks), "fallback")
	ch <- prometheus.MustNewConstMetric(descPrefixRouted, prometheus.CounterValue, float64(s.Misses), "miss")
	ch <- prometheus.MustNewConstMetric(descPrefixBlocks, prometheus.CounterValue, float64(s.PromptBlocks), "prompt")
	ch <- prometheus.MustNewConstMetric(descPrefixBlocks, prometheus.CounterValue, float64(s.MatchedBlocks), "matched")
	ch <- prometheus.MustNewConstMetric(descPrefixIndex, prometheus.GaugeValue, float64(s.IndexBlocks))
	ch <- prometheus.MustNewConstMetric(descPrefixIndexMB, prometheus.GaugeValue, float64(s.IndexBytes))
	if s.EventNodes == 0 {
		return // no node publishes: no event series
	}
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(descEvents, s.EventsStored, "block_stored")
	counter(descEvents, s.EventsRemoved, "block_removed")
	counter(descEvents, s.EventsCleared, "all_blocks_cleared")
	counter(descEventBatches, s.EventBatches, "received")
	counter(descEventBatches, s.EventReplayed, "replayed")
	counter(descEventLost, s.EventLost)
	counter(descEventRestart, s.EventRestarts)
	ch <- prometheus.MustNewConstMetric(descEventNodes, prometheus.GaugeValue, float64(s.EventsLive), "events")
	ch <- prometheus.MustNewConstMetric(descEventNodes, prometheus.GaugeValue, float64(s.EventNodes-s.EventsLive), "index")
	ch <- prometheus.MustNewConstMetric(descEventIndex, prometheus.GaugeValue, float64(s.EventBlocks))
	ch <- prometheus.MustNewConstMetric(descEventIndexMB, prometheus.GaugeValue, float64(s.EventBytes))
	counter(descTokenize, s.Tokenized, "answered")
	counter(descTokenize, s.TokenizeFailed, "failed")
}

var descStoreErrors = prometheus.NewDesc(Namespace+"_store_errors_total",
	"Failed database calls by operation (auth_key, billing_hold, billing_settle, idempotency_begin, ...) and kind: "+
		"unavailable (the store could not be reached: an outage, answered 503 store_unavailable) or error (anything else).",
	[]string{"operation", "kind"}, nil)

// StoreCollector reports the failed store calls counted by storefail.Wrap.
type StoreCollector struct{}

func (StoreCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descStoreErrors }

func (StoreCollector) Collect(ch chan<- prometheus.Metric) {
	for _, c := range storefail.Counts() {
		ch <- prometheus.MustNewConstMetric(descStoreErrors, prometheus.CounterValue, float64(c.Unavailable), c.Op, "unavailable")
		ch <- prometheus.MustNewConstMetric(descStoreErrors, prometheus.CounterValue, float64(c.Failed-c.Unavailable), c.Op, "error")
	}
}
