package routing

import (
	"time"

	"github.com/tollgate/tollgate/nodeload"
)

// A node's load as the picker sees it. Each tollgate instance counts only
// the requests it sent, so behind a load balancer each sees a share of a
// node's queue. With load_poll, every instance polls the node's own
// /metrics (its running and waiting requests; off the request path,
// package nodeload, the HTTP side in the relay) at the same instants, and
// routes by that report plus its own requests sent or ended since: the
// same load on every instance, to within a poll. Without a fresh report
// (not polled, /metrics absent or failing, or older than three polls) the
// node's load is this instance's own count.

// SetLoadPoll asks for the node's load to be read every d (0: not read);
// Call it before StartLoadPoll, on a node no request sees yet.
func (n *Node) SetLoadPoll(d time.Duration) { n.pollEvery = d }

// LoadPoll is how often the node's load is to be read (0: never).
func (n *Node) LoadPoll() time.Duration { return n.pollEvery }

// StartLoadPoll starts reading the node's load with o (its Fetch and
// Log; the interval and the own count are the node's), when it is to be
// read and is not read yet. Call it before requests can see the node: they
// read its poller without a lock.
func (n *Node) StartLoadPoll(o nodeload.Options) {
	if n.pollEvery <= 0 || n.poll != nil {
		return
	}
	o.Interval, o.Own = n.pollEvery, n.inflight.Load
	n.poll = nodeload.Start(o)
}

// StopLoadPoll stops reading the node's load.
func (n *Node) StopLoadPoll() {
	if n.poll != nil {
		n.poll.Close()
	}
}

// LoadStats reports the node's polls (ok false: not polled).
func (n *Node) LoadStats() (st nodeload.Stats, ok bool) {
	if n.poll == nil {
		return st, false
	}
	return n.poll.Stats(), true
}

// routeLoad is the node's load for the picker: its reported load when
// polled and fresh, else this instance's requests in flight to it.
func (n *Node) routeLoad() int64 {
	own := n.inflight.Load()
	if p := n.poll; p != nil {
		load, _ := p.Load(own)
		return load
	}
	return own
}
