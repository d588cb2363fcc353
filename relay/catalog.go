// Package relay carries one chat-completion request on its journey: model
// lookup, capability checks, routing to one backend, the upstream call,
// normalising the answer, and accounting (usage, cost, traffic share).
package relay

import (
	"cmp"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/kvevents"
	"github.com/tollgate/tollgate/openai"
	"github.com/tollgate/tollgate/upstream"
)

// Catalog is the set of models the service sells, built from a CatalogSpec.
// It is immutable once built; a config reload builds a new one.
type Catalog struct {
	Models  []*Model
	byID    map[string]*Model
	Created int64 // unix time shown as `created` in /v1/models
}

// Model is one catalogue entry with its backends.
type Model struct {
	ID              string
	Kind            tollgate.ModelKind
	OwnedBy         string
	ContextLength   int64
	MaxOutputTokens int64
	ImageTokens     int64 // the hold's tokens for one image (config: models[].image_tokens)
	// SearchPrice is charged per web search that ran (config:
	// models[].search_price, else search.price).
	SearchPrice tollgate.Amount
	Backends    []*Backend
	// Caps is the union of the backends' capabilities: what /v1/models lists.
	Caps tollgate.Capabilities
}

// Backend is one way to serve a model: a pool of network nodes or the fallback.
type Backend struct {
	Model         *Model
	Class         tollgate.BackendClass
	UpstreamModel string
	Caps          tollgate.Capabilities
	Prices        tollgate.Prices
	Nodes         []*Node
	// Routing is how a network backend spreads requests over its nodes
	// (RoutingLeastOutstanding, RoutingPrefixCache or RoutingRoundRobin), and
	// PrefixMargin the requests in flight the node with the longest
	// matching prefix may have beyond the least loaded node's (prefix.go).
	Routing      string
	PrefixMargin int64
}

// Node is one upstream server. Its health and load are shared by every
// backend that points at the same URL, so a GPU box serving two models is
// one node with one health state.
type Node struct {
	Name          string
	BaseURL       string // with /v1, without trailing slash
	HealthURL     string
	Key           string
	Flavour       openai.Flavour
	Class         tollgate.BackendClass
	MaxConcurrent int64 // 0: unlimited

	inflight atomic.Int64
	health   nodeHealth
	// Counted since start, for metrics: failed requests and probes, and
	// times the node was taken out of rotation (down or ejected).
	failedTotal, takenOut atomic.Int64
	authOnce              sync.Once
	authHdr               []string
	nameOnce              sync.Once
	nameHdr               []string // X-Tollgate-Node's value, shared by every response
	h1Once                sync.Once
	h1                    atomic.Pointer[upstream.Pool] // the node's client for chat requests (package upstream)
	probeOnce             sync.Once
	probePool             atomic.Pointer[upstream.Pool] // the same client, for its health URL (health.go)
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
	tok                  *kvevents.Tokenizer // a vllm node's /tokenize, for kv's keys (nil: none)
	kvEndpoint, kvReplay string
	kvBlocks             int // the bound of kv's index
}

// Dials is how many connections the node's client has opened for chat
// requests (health probes have their own connections).
func (n *Node) Dials() int64 {
	if p := n.h1.Load(); p != nil {
		return p.Dials()
	}
	return 0
}

// authorization is the node's Authorization header value, built once.
func (n *Node) authorization() []string {
	n.authOnce.Do(func() { n.authHdr = []string{"Bearer " + n.Key} })
	return n.authHdr
}

// nameHeader is the node's name as a header value (never changed in place).
func (n *Node) nameHeader() []string {
	n.nameOnce.Do(func() { n.nameHdr = []string{n.Name} })
	return n.nameHdr
}

// Lookup returns the model with that id.
func (c *Catalog) Lookup(id string) (*Model, bool) {
	m, ok := c.byID[id]
	return m, ok
}

// Nodes returns every distinct node of the catalogue.
func (c *Catalog) Nodes() []*Node {
	seen := map[*Node]bool{}
	var out []*Node
	for _, m := range c.Models {
		for _, b := range m.Backends {
			for _, n := range b.Nodes {
				if !seen[n] {
					seen[n] = true
					out = append(out, n)
				}
			}
		}
	}
	return out
}

// Routing policies of a network backend (BackendSpec.Routing).
const (
	// RoutingLeastOutstanding sends a request to the able node with the
	// fewest requests in flight; "" means the same.
	RoutingLeastOutstanding = "least_outstanding"
	// RoutingPrefixCache prefers the node that was sent the longest prefix
	// of the prompt, within PrefixMargin requests of the least loaded (prefix.go).
	RoutingPrefixCache = "prefix_cache"
	// RoutingRoundRobin takes the able nodes in turn whatever their load.
	RoutingRoundRobin = "round_robin"
)

// CatalogSpec is what a catalogue is built from: checked values, defaults
// applied (cmd/tollgate builds it from the config's models: and search:).
type CatalogSpec struct {
	Models []ModelSpec
	// WebSearch: a search provider is configured, so every backend that
	// can call tools can take part in web search (the model calls
	// tollgate's search function); without one, no backend offers it.
	WebSearch bool
}

// ModelSpec is one model of the catalogue.
type ModelSpec struct {
	ID              string
	Kind            tollgate.ModelKind
	OwnedBy         string
	ContextLength   int64
	MaxOutputTokens int64
	ImageTokens     int64 // 0: DefaultImageTokens
	SearchPrice     tollgate.Amount
	Backends        []BackendSpec
}

// BackendSpec is one backend of a model. A fallback is one node.
type BackendSpec struct {
	Class         tollgate.BackendClass
	UpstreamModel string
	Caps          tollgate.Capabilities
	Prices        tollgate.Prices
	Routing       string // a Routing constant
	PrefixMargin  int64
	// PrefixIndexTokens and PrefixTTL bound each node's prefix index
	// (prefix_cache routing; 0: the defaults).
	PrefixIndexTokens int64
	PrefixTTL         time.Duration
	Nodes             []NodeSpec
}

// NodeSpec is one upstream server.
type NodeSpec struct {
	Name          string
	URL           string // with /v1
	Key           string
	Flavour       openai.Flavour
	MaxConcurrent int64  // 0: unlimited
	HealthURL     string // "": the flavour's
	// KVEvents is the node's KV-cache event socket (tcp://host:port, ""
	// none) and KVEventsReplay its replay socket (prefix.go, kvevents).
	KVEvents, KVEventsReplay string
}

// NewCatalog builds the catalogue. Nodes with the same URL and key are
// shared across models. prev, when not nil, is the catalogue being
// replaced (config reload): its nodes keep their health and in-flight
// counts.
func NewCatalog(spec CatalogSpec, prev *Catalog) *Catalog {
	nodes := map[string]*Node{}
	fresh := map[*Node]bool{} // built here, not yet shared with requests
	if prev != nil {
		for _, n := range prev.Nodes() {
			nodes[string(n.Class)+" "+n.BaseURL+" "+n.Key] = n
		}
	}
	c := &Catalog{byID: map[string]*Model{}, Created: time.Now().Unix()}
	if prev != nil {
		c.Created = prev.Created
	}
	for _, mc := range spec.Models {
		m := &Model{ID: mc.ID, Kind: mc.Kind, OwnedBy: mc.OwnedBy, ContextLength: mc.ContextLength, MaxOutputTokens: mc.MaxOutputTokens,
			ImageTokens: cmp.Or(mc.ImageTokens, DefaultImageTokens), SearchPrice: mc.SearchPrice}
		for i := range mc.Backends {
			bc := &mc.Backends[i]
			b := &Backend{Model: m, Class: bc.Class, UpstreamModel: bc.UpstreamModel, Caps: bc.Caps, Prices: bc.Prices,
				Routing: bc.Routing, PrefixMargin: bc.PrefixMargin}
			// Web search is served by tollgate itself: with a search
			// provider configured, every backend that can call tools can
			// take part (the model calls tollgate's search function).
			if spec.WebSearch && b.Caps.Has(tollgate.CapTools) {
				b.Caps |= tollgate.NewCapabilities(tollgate.CapWebSearch)
			} else {
				b.Caps &^= tollgate.NewCapabilities(tollgate.CapWebSearch)
			}
			for _, nc := range bc.Nodes {
				base := strings.TrimRight(nc.URL, "/")
				key := string(bc.Class) + " " + base + " " + nc.Key
				healthURL := nc.HealthURL
				if healthURL == "" {
					healthURL = defaultHealthURL(base, nc.Flavour)
				}
				n := nodes[key]
				if n != nil && !fresh[n] && (n.MaxConcurrent != nc.MaxConcurrent || n.Flavour != nc.Flavour || n.HealthURL != healthURL ||
					n.kvEndpoint != nc.KVEvents || n.kvReplay != nc.KVEventsReplay) {
					// Requests in flight read the previous node without a lock:
					// changed settings make a new node instead of a write.
					n = nil
				}
				if n == nil {
					n = &Node{Name: nc.Name, BaseURL: base, Key: nc.Key, Flavour: nc.Flavour, Class: bc.Class, routeID: nodeRouteID(base)}
					nodes[key] = n
					fresh[n] = true
				}
				if fresh[n] {
					n.MaxConcurrent = nc.MaxConcurrent
					n.Flavour = nc.Flavour
					n.HealthURL = healthURL
				}
				if b.Routing == RoutingPrefixCache {
					n.prefix.configure(bc.PrefixIndexTokens, bc.PrefixTTL)
					if fresh[n] && nc.KVEvents != "" {
						// The relay subscribes (Relay.startEvents). The index of
						// the node's events is bounded like the prefix index:
						// prefix_index_tokens, 16 tokens a block.
						n.kvEndpoint, n.kvReplay = nc.KVEvents, nc.KVEventsReplay
						n.kvBlocks = int(cmp.Or(bc.PrefixIndexTokens, DefaultPrefixIndexTokens) / kvevents.BlockTokens)
					}
				}
				b.Nodes = append(b.Nodes, n)
			}
			m.Backends = append(m.Backends, b)
			m.Caps |= b.Caps
		}
		c.Models = append(c.Models, m)
		c.byID[m.ID] = m
	}
	return c
}

// nodeRouteID is a node's name in rendezvous hashing: its URL (the same on
// every instance of one configuration).
func nodeRouteID(base string) uint64 { return xxhash.Sum64String(base) }

// defaultHealthURL is each flavour's liveness endpoint. vLLM, SGLang and
// llama.cpp serve /health at the root (llama.cpp answers 503 while loading);
// Ollama answers GET / with "Ollama is running"; hosted APIs get GET /models.
func defaultHealthURL(base string, f openai.Flavour) string {
	root := strings.TrimSuffix(base, "/v1")
	switch f {
	case openai.VLLM, openai.SGLang, openai.LlamaCpp:
		return root + "/health"
	case openai.Ollama:
		return root + "/"
	default:
		return base + "/models"
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

func (n *Node) release() { n.inflight.Add(-1) }

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

// reportReachable records a good probe: the node is up and its probe failures
// reset. Outlier state (ejection, failed requests) is not touched.
func (n *Node) reportReachable() {
	if !n.health.down.Load() && n.health.failures.Load() == 0 {
		return // fast path without the lock
	}
	n.health.mu.Lock()
	n.health.failures.Store(0)
	n.health.backoff = 0
	n.health.down.Store(false)
	n.health.mu.Unlock()
}

// reportUnreachable records a failed probe; immediate (a refused connection,
// probe or request) takes the node down now.
func (n *Node) reportUnreachable(p HealthPolicy, immediate bool, now time.Time) {
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

// probeDue reports whether a down node's backoff has passed (time for a probe).
func (n *Node) probeDue(now time.Time) bool {
	n.health.mu.Lock()
	defer n.health.mu.Unlock()
	return n.health.down.Load() && !now.Before(n.health.downUntil)
}

// probeFailed extends the backoff after a failed probe of a down node.
func (n *Node) probeFailed(p HealthPolicy, now time.Time) {
	n.health.mu.Lock()
	defer n.health.mu.Unlock()
	n.health.backoff = min(max(2*n.health.backoff, p.BackoffMin), p.BackoffMax)
	n.health.downUntil = now.Add(n.health.backoff)
	n.health.down.Store(true)
}

func (n *Node) String() string { return fmt.Sprintf("%s node %s", n.Class, n.Name) }
