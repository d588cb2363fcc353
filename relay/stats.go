package relay

import (
	"time"

	"github.com/tollgate/tollgate/metrics"
)

// NodeStats reports every node of the catalogue in force, for metrics
// (read at scrape time; nothing on the request path).
func (r *Relay) NodeStats() []metrics.NodeStat {
	now := r.now()
	nodes := r.catalog.Load().Nodes()
	out := make([]metrics.NodeStat, 0, len(nodes))
	for _, n := range nodes {
		st := metrics.NodeStat{
			Name: n.Name, Class: string(n.Class),
			Healthy:       n.Healthy() && !n.Ejected(now),
			Outstanding:   n.Inflight(),
			MaxConcurrent: n.MaxConcurrent,
			Failures:      n.failedTotal.Load(),
			TakenOut:      n.takenOut.Load(),
			Reported:      -1,
		}
		if n.poll != nil {
			ps := n.poll.Stats()
			st.Polled, st.PollFailures = true, ps.Failures
			if ps.Live {
				st.Reported = ps.Load
			}
		}
		out = append(out, st)
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
type NodeHealth struct {
	Up           bool      // by its health probes
	EjectedUntil time.Time // outlier detection keeps it out until then; zero: not ejected
	// Failed requests and failed probes in a row (each 0 after a success).
	RequestsInARow, ProbesInARow int64
	// Requests and failed requests in the outlier detection's window, which
	// ends now and lasts Window.
	Recent, RecentFailed int64
	Window               time.Duration
}

// NodeHealth reports n's state in rotation now.
func (r *Relay) NodeHealth(n *Node) NodeHealth {
	now := r.now()
	h := NodeHealth{Up: n.Healthy(), RequestsInARow: n.health.outlier.consecutive.Load(), ProbesInARow: n.Failures(),
		Window: r.opts.Health.Window}
	if u := n.health.outlier.ejectedUntil.Load(); u != 0 && now.UnixNano() < u {
		h.EjectedUntil = time.Unix(0, u)
	}
	h.Recent, h.RecentFailed = n.windowCounts(&r.opts.Health, now)
	return h
}
