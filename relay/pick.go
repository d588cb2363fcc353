package relay

import (
	"strings"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/metrics"
	"github.com/tollgate/tollgate/routing"
)

// The relay's side of routing (package routing): which backends can serve
// a request (checkCapabilities), a backend and node for it (Relay.picker),
// and what came of it, told back to routing (upstreamOK, upstreamFailed,
// upstreamRefused).

// prefixRoute is one request's routing state (package routing), on the
// caller's stack.
type prefixRoute = routing.Request[*Backend, *Node]

// checkCapabilities applies the capability rules (docs/api.md) before anything runs:
// a capability the model lacks is capability_not_supported naming the field;
// capabilities that exist only on different backends are
// capability_combination_unsupported. It returns the backends able to serve.
func checkCapabilities(m *Model, needs tollgate.Capabilities, param func(tollgate.Capability) string) ([]*Backend, error) {
	if missing := m.Caps.Missing(needs); len(missing) > 0 {
		c := missing[0]
		return nil, &tollgate.Error{
			Code:    tollgate.CodeCapabilityNotSupported,
			Param:   param(c),
			Message: "model " + m.ID + " does not support " + string(c) + " (asked for by " + param(c) + "); GET /v1/models lists what each model supports",
		}
	}
	var able []*Backend
	for _, b := range m.Backends {
		if b.Caps.Covers(needs) {
			able = append(able, b)
		}
	}
	if len(able) == 0 {
		names := make([]string, 0, 4)
		for _, c := range needs.List() {
			names = append(names, string(c))
		}
		return nil, tollgate.Errorf(tollgate.CodeCapabilityCombinationUnsupported,
			"model %s supports each of %s, but no single backend of it supports them together; send them in separate requests",
			m.ID, strings.Join(names, ", "))
	}
	return able, nil
}

// PrefixStats returns the counters of prefix routing and the index sizes of
// the catalogue's nodes.
func (r *Relay) PrefixStats() routing.PrefixStats {
	return r.picker.PrefixStats(r.Catalog().Nodes(), r.now())
}

// PrefixMetrics is PrefixStats for the metrics collector (read at scrape
// time; nothing on the request path).
func (r *Relay) PrefixMetrics() metrics.PrefixStat {
	s := r.PrefixStats()
	return metrics.PrefixStat{Hits: s.Hits, Fallbacks: s.Fallbacks, Misses: s.Misses, PromptBlocks: s.PromptBlocks,
		MatchedBlocks: s.MatchedBlocks, IndexBlocks: s.IndexBlocks, IndexBytes: s.IndexBytes,
		EventsStored: s.EventsStored, EventsRemoved: s.EventsRemoved, EventsCleared: s.EventsCleared,
		EventBatches: s.EventBatches, EventReplayed: s.EventReplayed, EventLost: s.EventLost, EventRestarts: s.EventRestarts,
		EventNodes: s.EventNodes, EventsLive: s.EventsLive, EventBlocks: s.EventBlocks, EventBytes: s.EventBytes,
		Tokenized: s.Tokenized, TokenizeFailed: s.TokenizeFailed}
}

// upstreamOK records that the serving node answered a real request.
func (x *exchange) upstreamOK() { x.node.RequestOK(&x.r.opts.Health, x.r.now()) }

// upstreamFailed records that the serving node failed a real request; an
// ejection is logged, for the operator.
func (x *exchange) upstreamFailed() {
	if d := routing.RequestFailed(x.node, &x.r.opts.Health, x.backend.Nodes, x.r.now()); d > 0 {
		x.r.log.Warn("node ejected: its requests fail", "node", x.node.Name, "model", x.model.ID,
			"ejection_seconds", d.Seconds(), "request_id", x.call.RequestID)
	}
}

// upstreamRefused records that the serving node refused the connection
// (nothing was sent: the node is down at once) and, when retry, moves the
// request to another node of the same backend. It reports whether one took
// it.
func (x *exchange) upstreamRefused(retry bool) bool {
	x.node.Unreachable(x.r.opts.Health, true, x.r.now())
	if !retry {
		return false
	}
	var rp prefixRoute
	_, n := x.r.picker.Pick([]*Backend{x.backend}, x.backend.Class, x.node, x.r.picker.Retry(&rp, x.prompt, x.r.now()))
	if n == nil {
		return false
	}
	x.node.Release()
	x.nodeMu.Lock()
	x.node = n
	x.nodeMu.Unlock()
	return true
}
