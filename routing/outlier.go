package routing

import (
	"sync"
	"sync/atomic"
	"time"
)

// Outlier detection: real requests, not probes, decide whether a node keeps
// serving. A node is ejected after FailureThreshold consecutive failed
// requests (5xx, 429, timeouts, connection errors, broken answers), or when
// at least FailurePercent of at least MinRequests requests in the last Window
// failed. The k-th ejection lasts k × EjectionBase, capped at EjectionMax;
// every EjectionBase the node then serves without a new ejection takes one
// off k. At most MaxEjectedPercent of a backend's nodes are ejected at once,
// and never the last node of the backend that is up by its probes. A good
// probe changes none of this: a node that answers /health but fails its
// requests stays out until its ejection time passes.

// windowBuckets is how many slices the sliding window is cut into.
const windowBuckets = 10

// outlierState is a node's record of its real requests.
type outlierState struct {
	consecutive  atomic.Int64 // failed requests in a row
	ejectedUntil atomic.Int64 // unix nanoseconds; 0 or past: not ejected
	ejections    int          // k of the next ejection - 1; under nodeHealth.mu
	lastEnd      time.Time    // when the last ejection ended; under nodeHealth.mu
	buckets      [windowBuckets]windowBucket
}

// windowBucket counts one slice of the window; epoch names the slice.
type windowBucket struct {
	epoch  atomic.Int64
	total  atomic.Int64
	failed atomic.Int64
}

// ejectMu makes the share check and the ejection one step, so two nodes of
// a backend failing at the same moment cannot both pass the check. Ejections
// are rare: one lock for the process is enough.
var ejectMu sync.Mutex

// Ejected reports whether outlier detection keeps the node out at now.
func (n *Node) Ejected(now time.Time) bool {
	u := n.health.outlier.ejectedUntil.Load()
	return u != 0 && now.UnixNano() < u
}

// ejectedAt is Ejected for a caller that reads the clock only when needed.
func (n *Node) ejectedAt(now *int64) bool {
	u := n.health.outlier.ejectedUntil.Load()
	if u == 0 {
		return false
	}
	if *now == 0 {
		*now = time.Now().UnixNano()
	}
	return *now < u
}

// record counts one request in the window's current slice.
func (n *Node) record(p *HealthPolicy, now time.Time, failed bool) {
	o := &n.health.outlier
	width := int64(p.Window) / windowBuckets
	if width <= 0 {
		return
	}
	e := now.UnixNano() / width
	b := &o.buckets[e%windowBuckets]
	if b.epoch.Load() != e {
		n.health.mu.Lock()
		if b.epoch.Load() != e {
			b.total.Store(0)
			b.failed.Store(0)
			b.epoch.Store(e)
		}
		n.health.mu.Unlock()
	}
	b.total.Add(1)
	if failed {
		b.failed.Add(1)
	}
}

// windowCounts sums the slices of the window that ends at now.
func (n *Node) windowCounts(p *HealthPolicy, now time.Time) (total, failed int64) {
	width := int64(p.Window) / windowBuckets
	if width <= 0 {
		return 0, 0
	}
	e := now.UnixNano() / width
	for i := range n.health.outlier.buckets {
		b := &n.health.outlier.buckets[i]
		if be := b.epoch.Load(); be > e-windowBuckets && be <= e {
			total += b.total.Load()
			failed += b.failed.Load()
		}
	}
	return total, failed
}

// RequestOK records a real request the node answered (a 4xx is an answer).
func (n *Node) RequestOK(p *HealthPolicy, now time.Time) {
	o := &n.health.outlier
	if o.consecutive.Load() != 0 {
		o.consecutive.Store(0)
	}
	n.record(p, now, false)
}

// RequestFailed records a real request node m failed and ejects it when
// one of the thresholds is crossed and its backend's share allows (peers:
// the nodes of the backend the request went through; nil checks no share).
// It returns the ejection's length when this failure ejected the node, else 0.
func RequestFailed[N Member](m N, p *HealthPolicy, peers []N, now time.Time) time.Duration {
	n := m.State()
	o := &n.health.outlier
	n.failedTotal.Add(1)
	n.record(p, now, true)
	cons := o.consecutive.Add(1)
	if cons < int64(p.FailureThreshold) {
		total, failed := n.windowCounts(p, now)
		if total < int64(max(p.MinRequests, 1)) || failed*100 < int64(p.FailurePercent)*total {
			return 0
		}
	}
	ejectMu.Lock()
	defer ejectMu.Unlock()
	if n.Ejected(now) || (peers != nil && !mayEject(peers, m, p.MaxEjectedPercent, now)) {
		// Not ejected: the counters stay, so the next failure asks again.
		return 0
	}
	n.health.mu.Lock()
	defer n.health.mu.Unlock()
	if o.ejections > 0 && p.EjectionBase > 0 && !o.lastEnd.IsZero() {
		// Time served since the last ejection ended pays ejections back.
		served := int(now.Sub(o.lastEnd) / p.EjectionBase)
		o.ejections = max(o.ejections-served, 0)
	}
	o.ejections++
	d := min(time.Duration(o.ejections)*p.EjectionBase, p.EjectionMax)
	end := now.Add(d)
	o.lastEnd = end
	o.ejectedUntil.Store(end.UnixNano())
	n.takenOut.Add(1)
	// A node back from ejection starts with clean counters.
	o.consecutive.Store(0)
	for i := range o.buckets {
		o.buckets[i].total.Store(0)
		o.buckets[i].failed.Store(0)
	}
	return d
}

// mayEject reports whether ejecting n keeps its backend (nodes) within its
// share: at most pct percent of its nodes ejected, and at least one other
// node up by its probes and not ejected.
func mayEject[N Member](nodes []N, n N, pct int, now time.Time) bool {
	ejected, serving := 0, 0
	for _, m := range nodes {
		if m == n {
			continue
		}
		switch o := m.State(); {
		case o.Ejected(now):
			ejected++
		case o.Healthy():
			serving++
		}
	}
	return serving > 0 && (ejected+1)*100 <= pct*len(nodes)
}

// SetDefaults fills what the config left at zero (config.go has the same defaults).
func (p *HealthPolicy) SetDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&p.BackoffMin, time.Second)
	def(&p.BackoffMax, time.Minute)
	def(&p.Window, 30*time.Second)
	def(&p.EjectionBase, 30*time.Second)
	def(&p.EjectionMax, 5*time.Minute)
	if p.FailureThreshold <= 0 {
		p.FailureThreshold = 3
	}
	if p.FailurePercent <= 0 {
		p.FailurePercent = 50
	}
	if p.MinRequests <= 0 {
		p.MinRequests = 20
	}
	if p.MaxEjectedPercent <= 0 {
		p.MaxEjectedPercent = 50
	}
}
