package routing

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/nodeload"
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
			fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 0.0\n"+
				"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} %d.0\n", n.waiting.Load())
		}))
		t.Cleanup(n.srv.Close)
		out = append(out, n)
	}
	return out
}

func (n *loadNode) fetch(ctx context.Context) ([]byte, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, n.srv.URL+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// pollingInstance is one tollgate instance's routing over the nodes (the
// same URLs as every other instance's), each node's load polled every
// poll (0: not polled).
type pollingInstance struct {
	nodes []*node
	m     *model
	able  []*backend
	p     picker
	st    prefixCounters
}

func newPollingInstance(t *testing.T, lns []*loadNode, poll time.Duration) *pollingInstance {
	in := &pollingInstance{}
	for i, ln := range lns {
		n := &node{Name: fmt.Sprint("n", i), BaseURL: ln.srv.URL + "/v1", Class: tollgate.ClassNetwork, Node: Node{MaxConcurrent: 16}}
		n.Init(n.BaseURL)
		n.SetLoadPoll(poll)
		n.StartLoadPoll(nodeload.Options{Fetch: ln.fetch})
		t.Cleanup(n.StopLoadPoll)
		in.nodes = append(in.nodes, n)
	}
	in.m, in.able = prefixModel(2, in.nodes...)
	return in
}

func (in *pollingInstance) route(t *testing.T, msgs []byte) string {
	t.Helper()
	n := routeTurn(t, &in.p, &in.st, in.m, in.able, msgs)
	n.Release()
	return n.BaseURL
}

// seen waits until every node's load, as the picker sees it, is want[i].
func (in *pollingInstance) seen(t *testing.T, want []int64) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		ok := true
		for i, n := range in.nodes {
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
	lns := newLoadNodes(t, 4)
	a := newPollingInstance(t, lns, 5*time.Millisecond)
	b := newPollingInstance(t, lns, 5*time.Millisecond)
	blind := newPollingInstance(t, lns, 0)
	const convs = 40
	home := map[int]string{}
	for c := 0; c < convs; c++ {
		home[c] = a.route(t, turnOf(c, 1))
		if got := b.route(t, turnOf(c, 1)); got != home[c] {
			t.Fatalf("conversation %d: b chose %s, a %s", c, got, home[c])
		}
	}
	// Node 0 queues 10 requests from other instances (margin 2).
	busy := lns[0].srv.URL + "/v1"
	lns[0].waiting.Store(10)
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
	// The queue drains: both agree again.
	lns[0].waiting.Store(0)
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
	lns := newLoadNodes(t, 2)
	in := newPollingInstance(t, lns, 5*time.Millisecond)
	lns[0].waiting.Store(16)
	lns[1].waiting.Store(16)
	in.seen(t, []int64{16, 16})
	if _, n, err := in.p.Route(in.m.ID, in.able, nil, nil); err == nil {
		t.Fatalf("routed to %s, a node reporting 16 of 16", n.Name)
	}
	lns[1].srv.Close() // its /metrics fails: stale after 3 polls (1 s)
	in.seen(t, []int64{16, 0})
	_, n, err := in.p.Route(in.m.ID, in.able, nil, nil)
	if err != nil || n.Name != "n1" {
		t.Fatalf("routed to %v (%v), want n1 by the own count", n, err)
	}
	n.Release()
	if st, ok := n.LoadStats(); !ok || st.Live || st.Failures == 0 {
		t.Fatalf("load stats %+v %v: want polled, failing, not live", st, ok)
	}
}
