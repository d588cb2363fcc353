package relay

import (
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/openai"
	"github.com/tollgate/tollgate/routing"
	"github.com/tollgate/tollgate/simulate"
)

// load_poll reads a vLLM or SGLang node's /metrics through the node's own
// client, from the catalogue; other flavours are not polled, and a reload
// that drops the setting makes a new node without a poller.
func TestLoadPollFromTheCatalogue(t *testing.T) {
	var nodes []NodeSpec
	for _, f := range []openai.Flavour{openai.VLLM, openai.SGLang, openai.LlamaCpp} {
		s, err := simulate.Start(simulate.Config{Flavour: simulate.Flavour(f), Models: []string{"m-up"}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		nodes = append(nodes, NodeSpec{Name: string(f), URL: s.URL() + "/v1", Flavour: f})
	}
	spec := func(poll time.Duration) CatalogSpec {
		return CatalogSpec{Models: []ModelSpec{{ID: "m", Backends: []BackendSpec{{Class: tollgate.ClassNetwork, UpstreamModel: "m-up",
			Routing: routing.PrefixCache, LoadPoll: poll, Nodes: nodes}}}}}
	}
	r := &Relay{dialer: &net.Dialer{}, log: slog.New(slog.DiscardHandler), now: time.Now}
	cat := NewCatalog(spec(10*time.Millisecond), nil)
	r.startPolls(cat)
	r.catalog.Store(cat)
	defer r.Close()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got := map[string]int64{}
		for _, st := range r.NodeStats() {
			if st.Polled {
				got[st.Name] = st.Reported
			}
		}
		if len(got) == 2 && got["vllm"] == 0 && got["sglang"] == 0 {
			if _, ok := got["llamacpp"]; ok {
				t.Fatal("a llama.cpp node was polled")
			}
			break
		}
		if time.Now().After(end) {
			t.Fatalf("polled nodes and their reports: %v; want vllm and sglang reporting 0", got)
		}
	}
	// Reloaded without load_poll: new nodes, not polled.
	r.SetCatalog(NewCatalog(spec(0), cat))
	for _, st := range r.NodeStats() {
		if st.Polled {
			t.Fatalf("%s still polled after load_poll was turned off", st.Name)
		}
	}
}

// A server listed by two backends is one node, polled and following events
// when either backend asks for it: a reload of the same config keeps that
// one node for both (one in-flight count), and one that drops the poll and
// the events from both makes a new node for both.
func TestReloadKeepsANodeSharedByBackends(t *testing.T) {
	spec := func(poll time.Duration, events string) CatalogSpec {
		n := NodeSpec{Name: "a", URL: "http://10.0.0.1:8000/v1", Flavour: openai.VLLM}
		withEvents := n
		withEvents.KVEvents = events
		return CatalogSpec{Models: []ModelSpec{
			{ID: "m1", Backends: []BackendSpec{{Class: tollgate.ClassNetwork, UpstreamModel: "u", Routing: routing.PrefixCache,
				LoadPoll: poll, Nodes: []NodeSpec{withEvents}}}},
			{ID: "m2", Backends: []BackendSpec{{Class: tollgate.ClassNetwork, UpstreamModel: "u", Routing: routing.PrefixCache,
				Nodes: []NodeSpec{n}}}},
		}}
	}
	nodes := func(c *Catalog) (*Node, *Node) {
		return c.Models[0].Backends[0].Nodes[0], c.Models[1].Backends[0].Nodes[0]
	}
	first := NewCatalog(spec(100*time.Millisecond, "tcp://10.0.0.1:5557"), nil)
	a1, b1 := nodes(first)
	if a1 != b1 || a1.LoadPoll() != 100*time.Millisecond {
		t.Fatalf("first catalogue: nodes %p and %p, poll %v", a1, b1, a1.LoadPoll())
	}
	again := NewCatalog(spec(100*time.Millisecond, "tcp://10.0.0.1:5557"), first)
	if a2, b2 := nodes(again); a2 != a1 || b2 != a1 {
		t.Errorf("reloaded unchanged: nodes %p and %p, want the shared %p", a2, b2, a1)
	}
	off := NewCatalog(spec(0, ""), again)
	if a3, b3 := nodes(off); a3 != b3 || a3 == a1 || a3.LoadPoll() != 0 {
		t.Errorf("reloaded without poll or events: nodes %p and %p (before %p), poll %v", a3, b3, a1, a3.LoadPoll())
	}
}

// Backends that describe a shared server differently (max_concurrent,
// health URL) share one node with the last backend's settings, and an
// unchanged reload keeps that node: its in-flight count and health stay.
func TestReloadKeepsANodeBackendsDescribeDifferently(t *testing.T) {
	spec := func(lastMax int64) CatalogSpec {
		n := NodeSpec{Name: "a", URL: "http://10.0.0.1:8000/v1", Flavour: openai.VLLM, MaxConcurrent: 4}
		other := n
		other.MaxConcurrent, other.HealthURL = lastMax, "http://10.0.0.1:9000/ready"
		return CatalogSpec{Models: []ModelSpec{
			{ID: "m1", Backends: []BackendSpec{{Class: tollgate.ClassNetwork, UpstreamModel: "u", Nodes: []NodeSpec{n}}}},
			{ID: "m2", Backends: []BackendSpec{{Class: tollgate.ClassNetwork, UpstreamModel: "u", Nodes: []NodeSpec{other}}}},
		}}
	}
	first := NewCatalog(spec(8), nil)
	a1, b1 := first.Models[0].Backends[0].Nodes[0], first.Models[1].Backends[0].Nodes[0]
	if a1 != b1 || a1.MaxConcurrent != 8 || a1.HealthURL != "http://10.0.0.1:9000/ready" {
		t.Fatalf("first catalogue: nodes %p and %p, max_concurrent %d, health %q", a1, b1, a1.MaxConcurrent, a1.HealthURL)
	}
	again := NewCatalog(spec(8), first)
	if a2, b2 := again.Models[0].Backends[0].Nodes[0], again.Models[1].Backends[0].Nodes[0]; a2 != a1 || b2 != a1 {
		t.Errorf("reloaded unchanged: nodes %p and %p, want the kept %p", a2, b2, a1)
	}
	changed := NewCatalog(spec(12), again)
	if a3, b3 := changed.Models[0].Backends[0].Nodes[0], changed.Models[1].Backends[0].Nodes[0]; a3 != b3 || a3 == a1 || a3.MaxConcurrent != 12 {
		t.Errorf("reloaded with max_concurrent 12: nodes %p and %p (before %p), max_concurrent %d", a3, b3, a1, a3.MaxConcurrent)
	}
}
