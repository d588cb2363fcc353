package routing

import (
	"sync/atomic"

	"github.com/tollgate/tollgate"
)

// Picker chooses nodes by least outstanding requests; ties rotate. It
// counts its prefix routing decisions (prefix.go). B and N are the caller's
// backend and node types (relay.Backend, relay.Node).
type Picker[B Backend[N], N Member] struct {
	rr atomic.Uint64
	// prefixStats count prefix-cache routing decisions (prefix.go).
	prefixStats prefixCounters
}

// Pick returns a backend of class among able and one of its nodes with a
// slot acquired (the caller must Release it), or zero values if none is free.
// exclude skips a node that already refused a connection for this request.
// pr, when not nil, prefers the node holding the longest prefix (prefix.go).
func (p *Picker[B, N]) Pick(able []B, class tollgate.BackendClass, exclude N, pr *Request[B, N]) (B, N) {
	var noB B
	var noN N
	start := int(p.rr.Add(1))
	var now int64 // read once, and only if a node has been ejected
	for attempt := 0; attempt < 4; attempt++ {
		var best N
		var bestB B
		bestLoad := int64(-1)
		pr.begin()
		for _, b := range able {
			pol := b.Policy()
			if pol.Class != class {
				continue
			}
			nodes := b.Members()
			k := len(nodes)
			for i := 0; i < k; i++ {
				n := nodes[(start+i)%k]
				s := n.State()
				if n == exclude || !s.Healthy() || s.ejectedAt(&now) {
					continue
				}
				load := s.inflight.Load()
				if s.MaxConcurrent > 0 && load >= s.MaxConcurrent {
					continue
				}
				if bestLoad < 0 || load < bestLoad {
					best, bestB, bestLoad = n, b, load
				}
				pr.consider(b, &pol, n, load)
			}
		}
		if best == noN {
			return noB, noN
		}
		bestB, best = pr.choose(best, bestB, bestLoad)
		if best.State().tryAcquire() {
			pr.record(bestB, best)
			return bestB, best
		}
		// Lost a race for the last slot: look again.
	}
	return noB, noN
}

// Route picks the network when a healthy, not ejected node with free
// capacity exists, else the fallback, else backend_unavailable (model: the
// model's id, for the message).
func (p *Picker[B, N]) Route(model string, able []B, exclude N, pr *Request[B, N]) (B, N, error) {
	var noN N
	if b, n := p.Pick(able, tollgate.ClassNetwork, exclude, pr); n != noN {
		return b, n, nil
	}
	if b, n := p.Pick(able, tollgate.ClassFallback, exclude, nil); n != noN {
		return b, n, nil
	}
	var noB B
	return noB, noN, &tollgate.Error{
		Code:       tollgate.CodeBackendUnavailable,
		Message:    "no backend of model " + model + " can take the request now; retry shortly",
		RetryAfter: 2,
	}
}
