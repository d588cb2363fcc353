// Package relay carries one chat-completion request on its journey: model
// lookup, capability checks, routing to one backend (package routing), the upstream call,
// normalising the answer, and accounting (usage, cost, traffic share).
package relay

import (
	"cmp"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/openai"
	"github.com/tollgate/tollgate/routing"
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
	// (routing.LeastOutstanding, routing.PrefixCache or routing.RoundRobin),
	// and PrefixMargin the requests in flight the node with the longest
	// matching prefix may have beyond the least loaded node's (routing/prefix.go).
	Routing      string
	PrefixMargin int64
}

// Policy is b's routing policy (routing.Backend).
func (b *Backend) Policy() routing.Policy {
	return routing.Policy{Class: b.Class, Routing: b.Routing, PrefixMargin: b.PrefixMargin, Model: b.UpstreamModel}
}

// Members are b's nodes (routing.Backend).
func (b *Backend) Members() []*Node { return b.Nodes }

// Node is one upstream server. Its health and load (the embedded
// routing.Node, with MaxConcurrent) are shared by every backend that points
// at the same URL, so a GPU box serving two models is one node with one
// health state.
type Node struct {
	Name      string
	BaseURL   string // with /v1, without trailing slash
	HealthURL string
	Key       string
	Flavour   openai.Flavour
	Class     tollgate.BackendClass
	routing.Node

	authOnce  sync.Once
	authHdr   []string
	nameOnce  sync.Once
	nameHdr   []string // X-Tollgate-Node's value, shared by every response
	h1Once    sync.Once
	h1        atomic.Pointer[upstream.Pool] // the node's client for chat requests (package upstream)
	probeOnce sync.Once
	probePool atomic.Pointer[upstream.Pool] // the same client, for its health URL (health.go)
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
	Routing       string // routing.LeastOutstanding, routing.PrefixCache or routing.RoundRobin
	PrefixMargin  int64
	// PrefixIndexTokens and PrefixTTL bound each node's prefix index
	// (prefix_cache routing; 0: the defaults).
	PrefixIndexTokens int64
	PrefixTTL         time.Duration
	// LoadPoll is how often each vLLM or SGLang node's /metrics is read
	// for its load (0: not read; load.go).
	LoadPoll time.Duration
	Nodes    []NodeSpec
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
	// none) and KVEventsReplay its replay socket (routing/prefix.go, kvevents).
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
	// What a node listed by several backends is to be, over all of them:
	// polled if any backend polls it, following the last backend's events,
	// with the last backend's max_concurrent, flavour and health URL (as a
	// node built here gets them). A kept node is compared with that, not
	// with one backend's settings, or every reload would replace a node
	// its backends describe differently (its in-flight count, health and
	// index lost).
	type nodeWant struct {
		poll             time.Duration
		events, evReplay string
		maxConcurrent    int64
		flavour          openai.Flavour
		healthURL        string
	}
	want := map[string]nodeWant{}
	for _, mc := range spec.Models {
		for _, bc := range mc.Backends {
			for _, nc := range bc.Nodes {
				base := strings.TrimRight(nc.URL, "/")
				key := string(bc.Class) + " " + base + " " + nc.Key
				w := want[key]
				if pollsLoad(nc.Flavour) {
					w.poll = max(w.poll, bc.LoadPoll)
				}
				if bc.Routing == routing.PrefixCache && nc.KVEvents != "" {
					w.events, w.evReplay = nc.KVEvents, nc.KVEventsReplay
				}
				w.maxConcurrent, w.flavour, w.healthURL = nc.MaxConcurrent, nc.Flavour, cmp.Or(nc.HealthURL, defaultHealthURL(base, nc.Flavour))
				want[key] = w
			}
		}
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
				w := want[key]
				n := nodes[key]
				if n != nil && !fresh[n] && (n.MaxConcurrent != w.maxConcurrent || n.Flavour != w.flavour || n.HealthURL != w.healthURL ||
					!n.sameEvents(w.events, w.evReplay) || n.LoadPoll() != w.poll) {
					// Requests in flight read the previous node without a lock:
					// changed settings make a new node instead of a write.
					n = nil
				}
				if n == nil {
					n = &Node{Name: nc.Name, BaseURL: base, Key: nc.Key, Flavour: nc.Flavour, Class: bc.Class}
					n.Init(base)
					nodes[key] = n
					fresh[n] = true
				}
				if fresh[n] {
					n.MaxConcurrent = w.maxConcurrent
					n.Flavour = w.flavour
					n.HealthURL = w.healthURL
					n.SetLoadPoll(w.poll)
				}
				if b.Routing == routing.PrefixCache {
					n.ConfigurePrefix(bc.PrefixIndexTokens, bc.PrefixTTL)
					if fresh[n] && nc.KVEvents != "" {
						// The relay subscribes (Relay.startEvents). The index of
						// the node's events is bounded like the prefix index:
						// prefix_index_tokens, 16 tokens a block.
						n.SetEvents(nc.KVEvents, nc.KVEventsReplay, bc.PrefixIndexTokens)
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

// sameEvents reports whether n follows the KV-cache events of these sockets.
func (n *Node) sameEvents(endpoint, replay string) bool {
	e, r := n.Events()
	return e == endpoint && r == replay
}

// serverRoot is a model server's root, where it serves /health, /metrics
// and /tokenize: its base URL without /v1.
func serverRoot(base string) string { return strings.TrimSuffix(base, "/v1") }

// defaultHealthURL is each flavour's liveness endpoint. vLLM, SGLang and
// llama.cpp serve /health at the root (llama.cpp answers 503 while loading);
// Ollama answers GET / with "Ollama is running"; hosted APIs get GET /models.
func defaultHealthURL(base string, f openai.Flavour) string {
	root := serverRoot(base)
	switch f {
	case openai.VLLM, openai.SGLang, openai.LlamaCpp:
		return root + "/health"
	case openai.Ollama:
		return root + "/"
	default:
		return base + "/models"
	}
}

func (n *Node) String() string { return fmt.Sprintf("%s node %s", n.Class, n.Name) }
