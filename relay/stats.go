package relay

import "github.com/tollgate/tollgate/metrics"

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
			Failures:      n.failedTotal.Load(),
			TakenOut:      n.takenOut.Load(),
		})
	}
	return out
}
