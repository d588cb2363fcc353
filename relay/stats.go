package relay

import (
	"github.com/tollgate/tollgate/metrics"
	"github.com/tollgate/tollgate/routing"
)

// NodeStats reports every node of the catalogue in force, for metrics
// (read at scrape time; nothing on the request path).
func (r *Relay) NodeStats() []metrics.NodeStat {
	now := r.now()
	nodes := r.catalog.Load().Nodes()
	out := make([]metrics.NodeStat, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, metrics.NodeStat{
			Name: n.Name, Class: string(n.Class),
			Healthy:       n.Healthy() && !n.Ejected(now),
			Outstanding:   n.Inflight(),
			MaxConcurrent: n.MaxConcurrent,
			Failures:      n.FailedTotal(),
			TakenOut:      n.TakenOut(),
		})
	}
	return out
}

// Unservable lists the models none of whose nodes is in rotation (up by its
// probes and not ejected): readiness reports them.
func (r *Relay) Unservable() []string {
	now := r.now()
	var out []string
	for _, m := range r.catalog.Load().Models {
		ok := false
		for _, b := range m.Backends {
			for _, n := range b.Nodes {
				if n.Healthy() && !n.Ejected(now) {
					ok = true
				}
			}
		}
		if !ok {
			out = append(out, m.ID)
		}
	}
	return out
}

// NodeHealth is a node's state in rotation, for the operator's console.
type NodeHealth = routing.Health

// NodeHealth reports n's state in rotation now.
func (r *Relay) NodeHealth(n *Node) NodeHealth { return n.Health(&r.opts.Health, r.now()) }
