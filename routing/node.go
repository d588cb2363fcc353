// Package routing chooses the node that serves a request and keeps what the
// choice rests on: each node's requests in flight, its health by probes
// (down, with a backoff) and by its real requests (outlier ejection), the
// prompt prefixes recently sent to it and, when it publishes them, its
// KV-cache events. The relay asks it for a node among a model's backends and
// reports what came of the request; routing knows nothing of HTTP (a node's
// /tokenize, for its events, is asked through package kvevents).
package routing

import (
	"cmp"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/kvevents"
	"github.com/tollgate/tollgate/nodeload"
)

// Routing policies of a network backend (Policy.Routing).
const (
	// LeastOutstanding sends a request to the able node with the fewest
	// requests in flight; "" means the same.
	LeastOutstanding = "least_outstanding"
	// PrefixCache prefers the node that was sent the longest prefix of the
	// prompt, within PrefixMargin requests of the least loaded (prefix.go).
	PrefixCache = "prefix_cache"
	// RoundRobin takes the able nodes in turn whatever their load.
	RoundRobin = "round_robin"
)

// Policy is how a backend spreads requests over its nodes.
type Policy struct {
	Class tollgate.BackendClass
	// Routing is LeastOutstanding, PrefixCache or RoundRobin, and
	// PrefixMargin the requests in flight the node with the longest matching
	// prefix may have beyond the least loaded node's (prefix.go).
	Routing      string
	PrefixMargin int64
	// Model is the name the backend's nodes serve the model by: their
	// /tokenize is asked in it (prefix.go).
	Model string
}

// Backend is a backend as the picker sees it (relay.Backend): its policy
// and its nodes.
type Backend[N Member] interface {
	comparable
	Policy() Policy
	Members() []N
}

// Member is a node as the picker sees it: a type that embeds Node
// (relay.Node) is one.
type Member interface {
	comparable
	State() *Node
}

// Node is one upstream server's routing state. A type embedding it is
// shared by every backend that points at the same server, so a GPU box
// serving two models is one node with one health state.
type Node struct {
	MaxConcurrent int64 // 0: unlimited

	inflight atomic.Int64
	health   nodeHealth
	// Counted since start, for metrics: failed requests and probes, and
	// times the node was taken out of rotation (down or ejected).
	failedTotal, takenOut atomic.Int64
	// prefix records the prompt prefixes recently sent to the node, for
	// prefix-cache routing (prefix.go). It goes with the node: a node the
	// config removes or replaces takes its index with it.
	prefix prefixIndex
	// routeID names the node in rendezvous hashing: a hash of its URL, the
	// same on every instance (prefix.go).
	routeID uint64
	// kv is the node's KV-cache event stream when it publishes one (nil:
	// none); closed when a reload drops the node.
	kv                   *kvevents.Subscriber
	tok                  *kvevents.Tokenizer // the node's /tokenize, for kv's keys (nil: none)
	kvEndpoint, kvReplay string
	kvBlocks             int // the bound of kv's index
	// poll reads the node's own report of its load every pollEvery
	// (load_poll; nil: not polled), for the picker (load.go).
	poll      *nodeload.Poller
	pollEvery time.Duration
}

// State returns n itself: what makes a type embedding Node a Member.
func (n *Node) State() *Node { return n }

// Init names the node by its URL for rendezvous hashing (the same on every
// instance of one configuration).
func (n *Node) Init(url string) { n.routeID = xxhash.Sum64String(url) }

// ConfigurePrefix bounds the node's prefix index (prefix_cache routing;
// 0: the defaults).
func (n *Node) ConfigurePrefix(tokens int64, ttl time.Duration) { n.prefix.configure(tokens, ttl) }

// SetEvents names the node's KV-cache event sockets; its events are
// followed from Subscribe on, in an index bounded like the prefix index
// (tokens, 16 a block; 0: the default).
func (n *Node) SetEvents(endpoint, replay string, tokens int64) {
	n.kvEndpoint, n.kvReplay = endpoint, replay
	n.kvBlocks = int(cmp.Or(tokens, DefaultPrefixIndexTokens) / kvevents.BlockTokens)
}

// Events returns the node's KV-cache event sockets ("": none).
func (n *Node) Events() (endpoint, replay string) { return n.kvEndpoint, n.kvReplay }

// Subscribe starts following the node's KV-cache events, when it publishes
// them and is not followed yet. tokenizeURL, when the node says which token
// ids a chat's prompt is made of (vLLM's /tokenize; "": it does not), is
// asked for a prompt's ids, with the node's key, to match its events by
// (prefix.go). Call it before requests can see the node: they read both
// without a lock.
func (n *Node) Subscribe(log *slog.Logger, tokenizeURL, key string, dialer *net.Dialer) {
	if n.kvEndpoint == "" || n.kv != nil {
		return
	}
	n.kv = kvevents.Subscribe(kvevents.Options{Endpoint: n.kvEndpoint, Replay: n.kvReplay, MaxBlocks: n.kvBlocks, Log: log})
	if tokenizeURL != "" {
		t, err := kvevents.NewTokenizer(kvevents.TokenizerOptions{URL: tokenizeURL, Key: key, Dialer: dialer, Log: log})
		if err != nil {
			log.Warn("kv events: no /tokenize client: the events are not matched", "url", tokenizeURL, "error", err)
			return
		}
		n.tok = t
	}
}

// Unsubscribe stops following the node's KV-cache events.
func (n *Node) Unsubscribe() {
	if n.kv != nil {
		n.kv.Close()
	}
	if n.tok != nil {
		n.tok.Close()
	}
}

// nodeHealth is a node's state. Two things can keep a node out of
// rotation, each on its own evidence:
//   - down: the node is unreachable (failed probes, or a refused connection).
//     It comes back on the first good probe after its backoff.
//   - ejected: real requests fail on it (outlier detection, outlier.go),
//     whatever its probe says. It comes back when the ejection time passes;
//     a good probe neither ends an ejection nor resets its counters.
type nodeHealth struct {
	mu        sync.Mutex
	down      atomic.Bool
	failures  atomic.Int64 // consecutive failed probes; written under mu, read without it by reportReachable's fast path
	backoff   time.Duration
	downUntil time.Time

	outlier outlierState
}

// Healthy reports whether the node is up by its probes (it may still be
// ejected for failing real requests: see Ejected).
func (n *Node) Healthy() bool { return !n.health.down.Load() }

// Failures is the node's count of failures in a row (0 after a success).
func (n *Node) Failures() int64 { return n.health.failures.Load() }

// Inflight is the number of requests the node is serving now.
func (n *Node) Inflight() int64 { return n.inflight.Load() }

// FailedTotal counts the node's failed requests and probes since start.
func (n *Node) FailedTotal() int64 { return n.failedTotal.Load() }

// TakenOut counts the times the node was taken out of rotation (down or
// ejected) since start.
func (n *Node) TakenOut() int64 { return n.takenOut.Load() }

// tryAcquire takes one slot if the node has capacity.
func (n *Node) tryAcquire() bool {
	for {
		cur := n.inflight.Load()
		if n.MaxConcurrent > 0 && cur >= n.MaxConcurrent {
			return false
		}
		if n.inflight.CompareAndSwap(cur, cur+1) {
			return true
		}
	}
}

// Release gives back the slot a pick acquired.
func (n *Node) Release() { n.inflight.Add(-1) }

// HealthPolicy holds the thresholds and backoffs of health checking: the
// probes' (FailureThreshold, BackoffMin, BackoffMax) and outlier detection's
// on real requests (config: health.*, docs/config.md).
type HealthPolicy struct {
	FailureThreshold int // consecutive failed probes, or failed requests, that take a node out
	BackoffMin       time.Duration
	BackoffMax       time.Duration

	FailurePercent    int           // share of failed requests in Window that ejects, 1-100
	Window            time.Duration // the sliding window of FailurePercent
	MinRequests       int           // requests in Window before FailurePercent applies
	EjectionBase      time.Duration // first ejection; the k-th lasts k × EjectionBase
	EjectionMax       time.Duration // cap of one ejection
	MaxEjectedPercent int           // share of a backend's nodes ejected at once, 0-100
}

// Reachable records a good probe: the node is up and its probe failures
// reset. Outlier state (ejection, failed requests) is not touched.
func (n *Node) Reachable() {
	if !n.health.down.Load() && n.health.failures.Load() == 0 {
		return // fast path without the lock
	}
	n.health.mu.Lock()
	n.health.failures.Store(0)
	n.health.backoff = 0
	n.health.down.Store(false)
	n.health.mu.Unlock()
}

// Unreachable records a failed probe; immediate (a refused connection,
// probe or request) takes the node down now.
func (n *Node) Unreachable(p HealthPolicy, immediate bool, now time.Time) {
	n.failedTotal.Add(1)
	n.health.mu.Lock()
	defer n.health.mu.Unlock()
	failures := n.health.failures.Add(1)
	if !immediate && failures < int64(p.FailureThreshold) {
		return
	}
	if n.health.down.Load() {
		return
	}
	if n.health.backoff == 0 {
		n.health.backoff = p.BackoffMin
	} else {
		n.health.backoff = min(2*n.health.backoff, p.BackoffMax)
	}
	n.health.downUntil = now.Add(n.health.backoff)
	n.health.down.Store(true)
	n.takenOut.Add(1)
}

// ProbeDue reports whether a down node's backoff has passed (time for a probe).
func (n *Node) ProbeDue(now time.Time) bool {
	n.health.mu.Lock()
	defer n.health.mu.Unlock()
	return n.health.down.Load() && !now.Before(n.health.downUntil)
}

// ProbeFailed extends the backoff after a failed probe of a down node.
func (n *Node) ProbeFailed(p HealthPolicy, now time.Time) {
	n.health.mu.Lock()
	defer n.health.mu.Unlock()
	n.health.backoff = min(max(2*n.health.backoff, p.BackoffMin), p.BackoffMax)
	n.health.downUntil = now.Add(n.health.backoff)
	n.health.down.Store(true)
}

// Health is a node's state in rotation, for the operator's console.
type Health struct {
	Up           bool      // by its health probes
	EjectedUntil time.Time // outlier detection keeps it out until then; zero: not ejected
	// Failed requests and failed probes in a row (each 0 after a success).
	RequestsInARow, ProbesInARow int64
	// Requests and failed requests in the outlier detection's window, which
	// ends now and lasts Window.
	Recent, RecentFailed int64
	Window               time.Duration
}

// Health reports n's state in rotation at now.
func (n *Node) Health(p *HealthPolicy, now time.Time) Health {
	h := Health{Up: n.Healthy(), RequestsInARow: n.health.outlier.consecutive.Load(), ProbesInARow: n.Failures(),
		Window: p.Window}
	if u := n.health.outlier.ejectedUntil.Load(); u != 0 && now.UnixNano() < u {
		h.EjectedUntil = time.Unix(0, u)
	}
	h.Recent, h.RecentFailed = n.windowCounts(p, now)
	return h
}

// IndexSize returns the blocks the node's prefix index holds and their
// memory in bytes (an estimate).
func (n *Node) IndexSize() (blocks int, bytes int64) { return n.prefix.size() }
