package relay

import (
	"sync"
	"sync/atomic"

	"github.com/tollgate/tollgate/metrics"
	"github.com/tollgate/tollgate/openai"
)

// Prefix-cache routing (config: routing: prefix_cache), and round robin
// (routing: round_robin), which needs the same hook in the picker. A model server
// keeps the KV cache of the prompts it has served and skips the prefill of
// a prefix it still holds; a conversation or an agent loop resends its
// whole history each turn, so the node that served the last turn serves
// the next one fastest. Each node has an index of the prompt prefixes
// recently sent to it (prefix_index.go); a request goes to the able node
// with the longest match unless that node has more than the backend's
// prefix_margin requests in flight beyond the least loaded able node, and
// then to the least loaded. The picker (route.go) does the rest as for
// least_outstanding: only healthy nodes below max_concurrent are looked at.

// prefixRoute is one request's prefix routing state, on the caller's stack.
type prefixRoute struct {
	hashes []uint64  // chained block hashes of the request's messages
	buf    *[]uint64 // hashes' pooled buffer
	now    int64
	stats  *prefixCounters

	// The current pick attempt.
	best      *Node
	bestB     *Backend
	bestMatch int
	bestLoad  int64
	margin    int64
	matched   int  // blocks matched on the node chosen
	fellBack  bool // a match existed but its node was too loaded

	retry bool // a refused connection's second pick: not counted again

	// round_robin: the first able node in the picker's rotation.
	roundRobin bool
	first      *Node
	firstB     *Backend
}

// prefixCounters count prefix routing decisions (see PrefixStats).
type prefixCounters struct {
	requests, hits, fallbacks, misses atomic.Int64
	promptBlocks, matchedBlocks       atomic.Int64
}

// PrefixStats describe prefix-cache routing since the relay started.
type PrefixStats struct {
	Requests  int64 // requests routed by prefix_cache with at least one full block
	Hits      int64 // sent to the node holding the longest matching prefix
	Fallbacks int64 // a node held a prefix but was too loaded: least outstanding took it
	Misses    int64 // no able node held any block of the prompt
	// MatchedBlocks / PromptBlocks is the share of the prompts' blocks
	// that the chosen node held (PrefixBlockBytes each).
	PromptBlocks, MatchedBlocks int64
	// The indexes of the catalogue's nodes now: blocks held and their
	// memory (an estimate, 48 bytes a block).
	IndexBlocks int64
	IndexBytes  int64
}

// PrefixStats returns the counters of prefix routing and the index sizes.
func (r *Relay) PrefixStats() PrefixStats {
	c := &r.prefixStats
	s := PrefixStats{Requests: c.requests.Load(), Hits: c.hits.Load(), Fallbacks: c.fallbacks.Load(),
		Misses: c.misses.Load(), PromptBlocks: c.promptBlocks.Load(), MatchedBlocks: c.matchedBlocks.Load()}
	for _, n := range r.Catalog().Nodes() {
		b, bytes := n.prefix.size()
		s.IndexBlocks += int64(b)
		s.IndexBytes += bytes
	}
	return s
}

var prefixBufs = sync.Pool{New: func() any { b := make([]uint64, 0, 512); return &b }}

// startPrefixRoute fills pr for a request to m when one of its network
// backends routes by prefix (and the prompt has a full block) or by round
// robin, and returns it; else nil. The caller calls pr.done after routing.
// Nodes found down lose their index here: a server that went away may come
// back with an empty cache.
func (r *Relay) startPrefixRoute(pr *prefixRoute, m *Model, cr *openai.ChatRequest) *prefixRoute {
	prefix := false
	for _, b := range m.Backends {
		switch b.Routing {
		case RoutingRoundRobin:
			pr.roundRobin = true
		case RoutingPrefixCache:
			prefix = true
			for _, n := range b.Nodes {
				if !n.Healthy() {
					n.prefix.reset()
				}
			}
		}
	}
	if prefix {
		bp := prefixBufs.Get().(*[]uint64)
		if h := hashPrefix((*bp)[:0], m.ID, cr.Field("tools"), cr.Field("messages")); len(h) > 0 {
			pr.hashes, pr.buf = h, bp
			pr.now = r.now().UnixNano()
			pr.stats = &r.prefixStats
		} else {
			prefixBufs.Put(bp)
		}
	}
	if pr.hashes == nil && !pr.roundRobin {
		return nil
	}
	return pr
}

// done returns the hash buffer; pr is not used after it.
func (pr *prefixRoute) done() {
	if pr.buf == nil {
		return
	}
	*pr.buf = pr.hashes[:0] // hashPrefix may have grown it
	prefixBufs.Put(pr.buf)
	pr.buf, pr.hashes = nil, nil
}

// begin starts a pick attempt.
func (pr *prefixRoute) begin() {
	if pr != nil {
		pr.best, pr.bestB, pr.bestMatch, pr.bestLoad = nil, nil, 0, 0
		pr.first, pr.firstB = nil, nil
	}
}

// consider looks at an able node (healthy, below max_concurrent) with load
// requests in flight.
func (pr *prefixRoute) consider(b *Backend, n *Node, load int64) {
	if pr == nil {
		return
	}
	if b.Routing == RoutingRoundRobin {
		if pr.first == nil {
			pr.first, pr.firstB = n, b
		}
		return
	}
	if b.Routing != RoutingPrefixCache || pr.hashes == nil {
		return
	}
	m := n.prefix.match(pr.hashes, pr.now)
	if m == 0 {
		return
	}
	if m > pr.bestMatch || (m == pr.bestMatch && load < pr.bestLoad) {
		pr.best, pr.bestB, pr.bestMatch, pr.bestLoad, pr.margin = n, b, m, load, b.PrefixMargin
	}
}

// choose returns the node to try: round robin's next node; else the one
// with the longest match when its load is within the margin of the least
// loaded node's; else the least loaded (least, of backend leastB, with
// leastLoad in flight).
func (pr *prefixRoute) choose(least *Node, leastB *Backend, leastLoad int64) (*Backend, *Node) {
	if pr == nil || least == nil {
		return leastB, least
	}
	if pr.first != nil {
		return pr.firstB, pr.first
	}
	pr.fellBack = false
	if pr.best != nil && pr.best != least {
		if pr.bestLoad <= leastLoad+pr.margin {
			pr.matched = pr.bestMatch
			return pr.bestB, pr.best
		}
		pr.fellBack = true
	}
	pr.matched = 0
	if pr.best == least {
		pr.matched = pr.bestMatch
	} else if pr.fellBack && leastB.Routing == RoutingPrefixCache {
		pr.matched = least.prefix.match(pr.hashes, pr.now)
	}
	return leastB, least
}

// record notes the prompt on the node that took it and counts the decision.
func (pr *prefixRoute) record(b *Backend, n *Node) {
	if pr == nil || pr.hashes == nil || b.Routing != RoutingPrefixCache {
		return
	}
	n.prefix.record(pr.hashes, pr.now)
	if pr.retry {
		return
	}
	s := pr.stats
	s.requests.Add(1)
	switch {
	case pr.fellBack:
		s.fallbacks.Add(1)
	case pr.matched > 0:
		s.hits.Add(1)
	default:
		s.misses.Add(1)
	}
	s.promptBlocks.Add(int64(len(pr.hashes)))
	s.matchedBlocks.Add(int64(pr.matched))
}

// retryRoute fills pr for the pick of another node after a refused
// connection: the prompt is recorded on the node that takes it instead
// (the refusing node's index is dropped once it is seen down). nil when
// the request was not routed by prefix.
func (x *exchange) retryRoute(pr *prefixRoute) *prefixRoute {
	if x.prefixHashes == nil {
		return nil
	}
	*pr = prefixRoute{hashes: x.prefixHashes, now: x.r.now().UnixNano(), stats: &x.r.prefixStats, retry: true}
	return pr
}

// PrefixMetrics is PrefixStats for the metrics collector (read at scrape
// time; nothing on the request path).
func (r *Relay) PrefixMetrics() metrics.PrefixStat {
	s := r.PrefixStats()
	return metrics.PrefixStat{Hits: s.Hits, Fallbacks: s.Fallbacks, Misses: s.Misses, PromptBlocks: s.PromptBlocks,
		MatchedBlocks: s.MatchedBlocks, IndexBlocks: s.IndexBlocks, IndexBytes: s.IndexBytes}
}
