package relay

import (
	"strings"
	"sync/atomic"

	"github.com/tollgate/tollgate"
)

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

// picker chooses nodes by least outstanding requests; ties rotate.
type picker struct{ rr atomic.Uint64 }

// pick returns a backend of class among able and one of its nodes with a
// slot acquired (the caller must release it), or nil if none is free.
// exclude skips a node that already refused a connection for this request.
// pr, when not nil, prefers the node holding the longest prefix (prefix.go).
func (p *picker) pick(able []*Backend, class tollgate.BackendClass, exclude *Node, pr *prefixRoute) (*Backend, *Node) {
	start := int(p.rr.Add(1))
	var now int64 // read once, and only if a node has been ejected
	for attempt := 0; attempt < 4; attempt++ {
		var best *Node
		var bestB *Backend
		bestLoad := int64(-1)
		pr.begin()
		for _, b := range able {
			if b.Class != class {
				continue
			}
			k := len(b.Nodes)
			for i := 0; i < k; i++ {
				n := b.Nodes[(start+i)%k]
				if n == exclude || !n.Healthy() || n.ejectedAt(&now) {
					continue
				}
				load := n.routeLoad() // own count, or the node's own report (load.go)
				if n.MaxConcurrent > 0 && load >= n.MaxConcurrent {
					continue
				}
				if bestLoad < 0 || load < bestLoad {
					best, bestB, bestLoad = n, b, load
				}
				pr.consider(b, n, load)
			}
		}
		if best == nil {
			return nil, nil
		}
		bestB, best = pr.choose(best, bestB, bestLoad)
		if best.tryAcquire() {
			pr.record(bestB, best)
			return bestB, best
		}
		// Lost a race for the last slot: look again.
	}
	return nil, nil
}

// route picks the network when a healthy, not ejected node with free capacity exists,
// else the fallback, else backend_unavailable.
func (p *picker) route(m *Model, able []*Backend, exclude *Node, pr *prefixRoute) (*Backend, *Node, error) {
	if b, n := p.pick(able, tollgate.ClassNetwork, exclude, pr); n != nil {
		return b, n, nil
	}
	if b, n := p.pick(able, tollgate.ClassFallback, exclude, nil); n != nil {
		return b, n, nil
	}
	return nil, nil, &tollgate.Error{
		Code:       tollgate.CodeBackendUnavailable,
		Message:    "no backend of model " + m.ID + " can take the request now; retry shortly",
		RetryAfter: 2,
	}
}
