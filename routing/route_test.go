package routing

import (
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
)

// node, backend and model stand for the relay's Node, Backend and Model:
// what routing is given of them.
type node struct {
	Node
	Name, BaseURL string
	Class         tollgate.BackendClass
}

type backend struct {
	Class        tollgate.BackendClass
	Routing      string
	PrefixMargin int64
	Nodes        []*node
}

func (b *backend) Policy() Policy {
	return Policy{Class: b.Class, Routing: b.Routing, PrefixMargin: b.PrefixMargin}
}

func (b *backend) Members() []*node { return b.Nodes }

type model struct {
	ID       string
	Backends []*backend
}

// picker and prefixRoute are the relay's instances of Picker and Request.
type (
	picker      = Picker[*backend, *node]
	prefixRoute = Request[*backend, *node]
)

func testModel(nodes ...*node) (*model, []*backend) {
	m := &model{ID: "m"}
	net := &backend{Class: tollgate.ClassNetwork}
	fb := &backend{Class: tollgate.ClassFallback}
	for _, n := range nodes {
		if n.Class == tollgate.ClassFallback {
			fb.Nodes = append(fb.Nodes, n)
		} else {
			net.Nodes = append(net.Nodes, n)
		}
	}
	m.Backends = []*backend{net, fb}
	return m, m.Backends
}

func TestRouteLeastOutstandingThenFallback(t *testing.T) {
	a := &node{Name: "a", Class: tollgate.ClassNetwork, Node: Node{MaxConcurrent: 2}}
	b := &node{Name: "b", Class: tollgate.ClassNetwork, Node: Node{MaxConcurrent: 2}}
	f := &node{Name: "f", Class: tollgate.ClassFallback}
	m, able := testModel(a, b, f)
	var p picker
	var got []string
	for i := 0; i < 5; i++ {
		_, n, err := p.Route(m.ID, able, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, n.Name)
	}
	// Four network slots, spread evenly, then the fallback.
	if a.Inflight() != 2 || b.Inflight() != 2 || got[4] != "f" {
		t.Fatalf("picks %v, inflight a=%d b=%d", got, a.Inflight(), b.Inflight())
	}
	a.Release()
	if _, n, _ := p.Route(m.ID, able, nil, nil); n != a {
		t.Fatalf("freed slot on a not used: %s", n.Name)
	}
	f.MaxConcurrent = 1
	if _, _, err := p.Route(m.ID, able, nil, nil); tollgate.ErrorCode(err) != tollgate.CodeBackendUnavailable {
		t.Fatalf("all full: %v", err)
	}
}

func TestRouteNeverExceedsCapacityUnderConcurrency(t *testing.T) {
	a := &node{Name: "a", Class: tollgate.ClassNetwork, Node: Node{MaxConcurrent: 3}}
	b := &node{Name: "b", Class: tollgate.ClassNetwork, Node: Node{MaxConcurrent: 5}}
	m, able := testModel(a, b)
	var p picker
	var wg sync.WaitGroup
	var mu sync.Mutex
	served := 0
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := p.Route(m.ID, able, nil, nil); err == nil {
				mu.Lock()
				served++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if served != 8 || a.Inflight() != 3 || b.Inflight() != 5 {
		t.Fatalf("served %d, inflight a=%d b=%d; want exactly the 8 slots", served, a.Inflight(), b.Inflight())
	}
}

// Probes (and a refused connection) take a node down and bring it back.
func TestProbeHealthThresholdAndBackoff(t *testing.T) {
	n := &node{Name: "a", Class: tollgate.ClassNetwork}
	p := HealthPolicy{FailureThreshold: 3, BackoffMin: time.Second, BackoffMax: 4 * time.Second}
	now := time.Unix(1000, 0)
	n.Unreachable(p, false, now)
	n.Unreachable(p, false, now)
	if !n.Healthy() {
		t.Fatal("down before the threshold")
	}
	n.Unreachable(p, false, now)
	if n.Healthy() || n.ProbeDue(now) || !n.ProbeDue(now.Add(time.Second)) {
		t.Fatal("threshold: want down with a 1s backoff")
	}
	n.ProbeFailed(p, now.Add(time.Second))
	if n.ProbeDue(now.Add(2*time.Second)) || !n.ProbeDue(now.Add(3*time.Second)) {
		t.Fatal("failed probe: want the backoff doubled to 2s")
	}
	for i := 0; i < 5; i++ {
		n.ProbeFailed(p, now)
	}
	if n.ProbeDue(now.Add(3*time.Second)) || !n.ProbeDue(now.Add(4*time.Second)) {
		t.Fatal("backoff not capped at 4s")
	}
	n.Reachable()
	if !n.Healthy() {
		t.Fatal("success did not bring the node back")
	}
	n.Unreachable(p, true, now)
	if n.Healthy() {
		t.Fatal("an immediate failure (connection refused) must take the node down at once")
	}
}
