package routing

import (
	"testing"
	"time"

	"github.com/tollgate/tollgate"
)

func testPolicy() HealthPolicy {
	p := HealthPolicy{FailureThreshold: 3, EjectionBase: time.Second, EjectionMax: 3 * time.Second,
		FailurePercent: 50, Window: 10 * time.Second, MinRequests: 10, MaxEjectedPercent: 50}
	p.SetDefaults()
	return p
}

// Consecutive failures eject; a good probe does not end the ejection; the
// k-th ejection lasts k × base up to the cap.
func TestOutlierConsecutiveEjectionAndBackoff(t *testing.T) {
	p := testPolicy()
	a := &node{Name: "a", Class: tollgate.ClassNetwork}
	b := &node{Name: "b", Class: tollgate.ClassNetwork}
	_, bs := testModel(a, b)
	now := time.Unix(1000, 0)
	RequestFailed(a, &p, bs[0].Nodes, now)
	RequestFailed(a, &p, bs[0].Nodes, now)
	if a.Ejected(now) {
		t.Fatal("ejected before the threshold")
	}
	a.RequestOK(&p, now) // an answer breaks the run
	RequestFailed(a, &p, bs[0].Nodes, now)
	RequestFailed(a, &p, bs[0].Nodes, now)
	if a.Ejected(now) {
		t.Fatal("a success did not reset the consecutive count")
	}
	RequestFailed(a, &p, bs[0].Nodes, now)
	if !a.Ejected(now) || !a.Ejected(now.Add(999*time.Millisecond)) || a.Ejected(now.Add(time.Second)) {
		t.Fatal("first ejection: want exactly 1s")
	}
	a.Reachable() // a good /health probe
	if !a.Ejected(now) {
		t.Fatal("a good probe ended an ejection")
	}
	if !a.Healthy() {
		t.Fatal("ejection must not mark the node down for its probes")
	}
	// Back at +1s, fails again at once: 2 × base.
	t1 := now.Add(time.Second)
	for i := 0; i < 3; i++ {
		RequestFailed(a, &p, bs[0].Nodes, t1)
	}
	if !a.Ejected(t1.Add(1999*time.Millisecond)) || a.Ejected(t1.Add(2*time.Second)) {
		t.Fatal("second ejection: want 2s")
	}
	t2 := t1.Add(2 * time.Second)
	for k := 0; k < 3; k++ {
		for i := 0; i < 3; i++ {
			RequestFailed(a, &p, bs[0].Nodes, t2)
		}
		if !a.Ejected(t2.Add(2999*time.Millisecond)) || a.Ejected(t2.Add(3*time.Second)) {
			t.Fatalf("ejection %d: want the 3s cap", k+3)
		}
		t2 = t2.Add(3 * time.Second)
	}
	// Serving well for a long time pays the multiplier back: 1s again.
	t3 := t2.Add(time.Hour)
	for i := 0; i < 3; i++ {
		RequestFailed(a, &p, bs[0].Nodes, t3)
	}
	if !a.Ejected(t3) || a.Ejected(t3.Add(time.Second)) {
		t.Fatal("after an hour of service the ejection should be back to the base")
	}
}

// A node failing half its requests, never three in a row, is ejected by the
// window's ratio once the window holds min_requests.
func TestOutlierFailureRatio(t *testing.T) {
	p := testPolicy()
	a := &node{Name: "a", Class: tollgate.ClassNetwork}
	b := &node{Name: "b", Class: tollgate.ClassNetwork}
	_, bs := testModel(a, b)
	now := time.Unix(1000, 0)
	for i := 0; i < 4; i++ { // 8 requests, 4 failed: under min_requests
		RequestFailed(a, &p, bs[0].Nodes, now)
		a.RequestOK(&p, now)
	}
	if a.Ejected(now) {
		t.Fatal("ejected with fewer than min_requests in the window")
	}
	a.RequestOK(&p, now)
	RequestFailed(a, &p, bs[0].Nodes, now) // 10 requests, 5 failed: 50%
	if !a.Ejected(now) {
		t.Fatal("50% failed over min_requests: want ejected")
	}
	// Requests older than the window do not count.
	c := &node{Name: "c", Class: tollgate.ClassNetwork}
	_, cs := testModel(c, b)
	for i := 0; i < 9; i++ {
		RequestFailed(c, &p, cs[0].Nodes, now)
		c.RequestOK(&p, now)
		c.RequestOK(&p, now)
		c.RequestOK(&p, now)
	}
	later := now.Add(11 * time.Second)
	for i := 0; i < 3; i++ {
		c.RequestOK(&p, later)
		RequestFailed(c, &p, cs[0].Nodes, later) // alone these are 50% of 6: under min_requests
	}
	if c.Ejected(later) {
		t.Fatal("requests that left the window still counted")
	}
}

// At most max_ejected_percent of a backend's nodes are out at once, and
// never the last node up by its probes.
func TestOutlierMaxEjectedShare(t *testing.T) {
	p := testPolicy()
	now := time.Unix(1000, 0)
	nodes := []*node{{Name: "a"}, {Name: "b"}, {Name: "c"}, {Name: "d"}}
	_, bs := testModel(nodes...)
	for _, n := range nodes {
		for i := 0; i < 3; i++ {
			RequestFailed(n, &p, bs[0].Nodes, now)
		}
	}
	out := 0
	for _, n := range nodes {
		if n.Ejected(now) {
			out++
		}
	}
	if out != 2 {
		t.Fatalf("4 nodes all failing, max 50%%: %d ejected, want 2", out)
	}
	// A node refused at the threshold is ejected by a later failure once a
	// place frees up.
	later := now.Add(500 * time.Millisecond)
	nodes[0].health.outlier.ejectedUntil.Store(0) // a's ejection ends early
	var waiting *node
	for _, n := range nodes {
		if !n.Ejected(now) && n != nodes[0] {
			waiting = n
			break
		}
	}
	RequestFailed(waiting, &p, bs[0].Nodes, later)
	if !waiting.Ejected(later) {
		t.Fatal("a node over the threshold was not ejected once the share allowed it")
	}

	// One node: never ejected. Two nodes, the other down by its probes: not either.
	solo := &node{Name: "solo"}
	_, ss := testModel(solo)
	x, y := &node{Name: "x"}, &node{Name: "y"}
	_, xs := testModel(x, y)
	y.Unreachable(p, true, now)
	for i := 0; i < 10; i++ {
		RequestFailed(solo, &p, ss[0].Nodes, now)
		RequestFailed(x, &p, xs[0].Nodes, now)
	}
	if solo.Ejected(now) || x.Ejected(now) {
		t.Fatal("the last node up by its probes was ejected")
	}
}
