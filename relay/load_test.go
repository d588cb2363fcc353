package relay

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/openai"
)

// loadNode is a vLLM node's /metrics over real HTTP, its queue settable:
// the load other instances' requests put on it.
type loadNode struct {
	srv     *httptest.Server
	waiting atomic.Int64
}

func newLoadNodes(t *testing.T, k int) []*loadNode {
	var out []*loadNode
	for i := 0; i < k; i++ {
		n := &loadNode{}
		n.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/metrics" {
				http.NotFound(w, r)
				return
			}
			fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=\"m-up\"} 0.0\n"+
				"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m-up\"} %d.0\n", n.waiting.Load())
		}))
		t.Cleanup(n.srv.Close)
		out = append(out, n)
	}
	return out
}

// pollingInstance is a tollgate instance's catalogue over nodes, each
// node's load polled (load_poll) unless poll is 0.
type pollingInstance struct {
	r   *Relay
	cat *Catalog
	m   *Model
	p   picker
	st  prefixCounters
}

func newPollingInstance(t *testing.T, nodes []*loadNode, poll time.Duration) *pollingInstance {
	spec := BackendSpec{Class: tollgate.ClassNetwork, UpstreamModel: "m-up", Routing: RoutingPrefixCache, PrefixMargin: 2, LoadPoll: poll}
	for i, n := range nodes {
		spec.Nodes = append(spec.Nodes, NodeSpec{Name: fmt.Sprint("n", i), URL: n.srv.URL + "/v1", Flavour: openai.VLLM, MaxConcurrent: 16})
	}
	cat := NewCatalog(CatalogSpec{Models: []ModelSpec{{ID: "m", Backends: []BackendSpec{spec}}}}, nil)
	in := &pollingInstance{r: &Relay{dialer: &net.Dialer{}, log: slog.New(slog.DiscardHandler)}, cat: cat}
	in.r.startPolls(cat)
	in.r.catalog.Store(cat)
	t.Cleanup(in.r.Close)
	in.m, _ = cat.Lookup("m")
	return in
}

func (in *pollingInstance) route(t *testing.T, msgs []byte) string {
	t.Helper()
	n := routeTurn(t, &in.p, &in.st, in.m, in.m.Backends, msgs)
	n.release()
	return n.BaseURL
}

// seen waits until every node's poller reports want[i] (its load).
func (in *pollingInstance) seen(t *testing.T, want []int64) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		ok := true
		for i, n := range in.m.Backends[0].Nodes {
			ok = ok && n.routeLoad() == want[i]
		}
		if ok {
			return
		}
	}
	t.Fatalf("the pollers never reported %v", want)
}

// With the nodes' own load polled, two instances fed the same requests in
// different orders pick the same node for each, while a node queues
// requests neither of them sent: both move its conversations to their
// next-ranked node alike, and keep the others at home. An instance
// counting only its own requests sends them to the queueing node.
func TestLoadPollAgreesAcrossInstances(t *testing.T) {
	nodes := newLoadNodes(t, 4)
	a := newPollingInstance(t, nodes, 5*time.Millisecond)
	b := newPollingInstance(t, nodes, 5*time.Millisecond)
	blind := newPollingInstance(t, nodes, 0)
	const convs = 40
	home := map[int]string{}
	for c := 0; c < convs; c++ {
		home[c] = a.route(t, turnOf(c, 1))
		if got := b.route(t, turnOf(c, 1)); got != home[c] {
			t.Fatalf("conversation %d: b chose %s, a %s", c, got, home[c])
		}
	}
	// Node 0 queues 10 requests from other instances (margin 2).
	busy := nodes[0].srv.URL + "/v1"
	nodes[0].waiting.Store(10)
	a.seen(t, []int64{10, 0, 0, 0})
	b.seen(t, []int64{10, 0, 0, 0})
	type req struct{ c, turn int }
	var order []req
	for turn := 2; turn <= 4; turn++ {
		for c := 0; c < convs; c++ {
			order = append(order, req{c, turn})
		}
	}
	picked := map[req]string{}
	for _, r := range order {
		picked[r] = a.route(t, turnOf(r.c, r.turn))
	}
	rand.New(rand.NewPCG(5, 6)).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	moved := 0
	for _, r := range order {
		got := b.route(t, turnOf(r.c, r.turn))
		if got != picked[r] {
			t.Fatalf("conversation %d turn %d: b chose %s, a %s", r.c, r.turn, got, picked[r])
		}
		switch {
		case got == busy:
			t.Fatalf("conversation %d turn %d went to the node queueing 10", r.c, r.turn)
		case home[r.c] == busy:
			moved++
		case got != home[r.c]:
			t.Fatalf("conversation %d turn %d left its home %s for %s", r.c, r.turn, home[r.c], got)
		}
	}
	if moved == 0 {
		t.Fatal("no conversation was homed on the queueing node: the test shows nothing")
	}
	// Without polling, the queue is invisible.
	for c := 0; c < convs; c++ {
		if home[c] == busy {
			if got := blind.route(t, turnOf(c, 2)); got != busy {
				t.Fatalf("an instance counting only its own requests chose %s, want the home %s", got, busy)
			}
			break
		}
	}
	// The queue drains: both send its conversations home again.
	nodes[0].waiting.Store(0)
	a.seen(t, []int64{0, 0, 0, 0})
	b.seen(t, []int64{0, 0, 0, 0})
	for c := 0; c < convs; c++ {
		if home[c] != busy {
			continue
		}
		if ga, gb := a.route(t, turnOf(c, 5)), b.route(t, turnOf(c, 5)); ga != gb {
			t.Fatalf("conversation %d after the queue drained: a chose %s, b %s", c, ga, gb)
		}
	}
}

// A node reporting max_concurrent requests is full for every instance,
// though none of them has a request on it; with no report (its /metrics
// gone), each instance's own count is its load again.
func TestLoadPollFullNode(t *testing.T) {
	nodes := newLoadNodes(t, 2)
	in := newPollingInstance(t, nodes, 5*time.Millisecond)
	nodes[0].waiting.Store(16)
	nodes[1].waiting.Store(16)
	in.seen(t, []int64{16, 16})
	if _, n, err := in.p.route(in.m, in.m.Backends, nil, nil); err == nil {
		t.Fatalf("routed to %s, a node reporting 16 of 16", n.Name)
	}
	nodes[1].srv.Close() // its /metrics fails: stale after 3 polls (1 s)
	in.seen(t, []int64{16, 0})
	_, n, err := in.p.route(in.m, in.m.Backends, nil, nil)
	if err != nil || n.Name != "n1" {
		t.Fatalf("routed to %v (%v), want n1 by the own count", n, err)
	}
	n.release()
}
