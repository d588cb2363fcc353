package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/syncbuf"
	"github.com/tollgate/tollgate/simulate"
)

func testPolicy() HealthPolicy {
	p := HealthPolicy{FailureThreshold: 3, EjectionBase: time.Second, EjectionMax: 3 * time.Second,
		FailurePercent: 50, Window: 10 * time.Second, MinRequests: 10, MaxEjectedPercent: 50}
	p.setDefaults()
	return p
}

// Consecutive failures eject; a good probe does not end the ejection; the
// k-th ejection lasts k × base up to the cap.
func TestOutlierConsecutiveEjectionAndBackoff(t *testing.T) {
	p := testPolicy()
	a := &Node{Name: "a", Class: tollgate.ClassNetwork}
	b := &Node{Name: "b", Class: tollgate.ClassNetwork}
	_, bs := testModel(a, b)
	now := time.Unix(1000, 0)
	a.requestFailed(&p, bs[0], now)
	a.requestFailed(&p, bs[0], now)
	if a.Ejected(now) {
		t.Fatal("ejected before the threshold")
	}
	a.requestOK(&p, now) // an answer breaks the run
	a.requestFailed(&p, bs[0], now)
	a.requestFailed(&p, bs[0], now)
	if a.Ejected(now) {
		t.Fatal("a success did not reset the consecutive count")
	}
	a.requestFailed(&p, bs[0], now)
	if !a.Ejected(now) || !a.Ejected(now.Add(999*time.Millisecond)) || a.Ejected(now.Add(time.Second)) {
		t.Fatal("first ejection: want exactly 1s")
	}
	a.reportReachable() // a good /health probe
	if !a.Ejected(now) {
		t.Fatal("a good probe ended an ejection")
	}
	if !a.Healthy() {
		t.Fatal("ejection must not mark the node down for its probes")
	}
	// Back at +1s, fails again at once: 2 × base.
	t1 := now.Add(time.Second)
	for i := 0; i < 3; i++ {
		a.requestFailed(&p, bs[0], t1)
	}
	if !a.Ejected(t1.Add(1999*time.Millisecond)) || a.Ejected(t1.Add(2*time.Second)) {
		t.Fatal("second ejection: want 2s")
	}
	t2 := t1.Add(2 * time.Second)
	for k := 0; k < 3; k++ {
		for i := 0; i < 3; i++ {
			a.requestFailed(&p, bs[0], t2)
		}
		if !a.Ejected(t2.Add(2999*time.Millisecond)) || a.Ejected(t2.Add(3*time.Second)) {
			t.Fatalf("ejection %d: want the 3s cap", k+3)
		}
		t2 = t2.Add(3 * time.Second)
	}
	// Serving well for a long time pays the multiplier back: 1s again.
	t3 := t2.Add(time.Hour)
	for i := 0; i < 3; i++ {
		a.requestFailed(&p, bs[0], t3)
	}
	if !a.Ejected(t3) || a.Ejected(t3.Add(time.Second)) {
		t.Fatal("after an hour of service the ejection should be back to the base")
	}
}

// A node failing half its requests, never three in a row, is ejected by the
// window's ratio once the window holds min_requests.
func TestOutlierFailureRatio(t *testing.T) {
	p := testPolicy()
	a := &Node{Name: "a", Class: tollgate.ClassNetwork}
	b := &Node{Name: "b", Class: tollgate.ClassNetwork}
	_, bs := testModel(a, b)
	now := time.Unix(1000, 0)
	for i := 0; i < 4; i++ { // 8 requests, 4 failed: under min_requests
		a.requestFailed(&p, bs[0], now)
		a.requestOK(&p, now)
	}
	if a.Ejected(now) {
		t.Fatal("ejected with fewer than min_requests in the window")
	}
	a.requestOK(&p, now)
	a.requestFailed(&p, bs[0], now) // 10 requests, 5 failed: 50%
	if !a.Ejected(now) {
		t.Fatal("50% failed over min_requests: want ejected")
	}
	// Requests older than the window do not count.
	c := &Node{Name: "c", Class: tollgate.ClassNetwork}
	_, cs := testModel(c, b)
	for i := 0; i < 9; i++ {
		c.requestFailed(&p, cs[0], now)
		c.requestOK(&p, now)
		c.requestOK(&p, now)
		c.requestOK(&p, now)
	}
	later := now.Add(11 * time.Second)
	for i := 0; i < 3; i++ {
		c.requestOK(&p, later)
		c.requestFailed(&p, cs[0], later) // alone these are 50% of 6: under min_requests
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
	nodes := []*Node{{Name: "a"}, {Name: "b"}, {Name: "c"}, {Name: "d"}}
	_, bs := testModel(nodes...)
	for _, n := range nodes {
		for i := 0; i < 3; i++ {
			n.requestFailed(&p, bs[0], now)
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
	var waiting *Node
	for _, n := range nodes {
		if !n.Ejected(now) && n != nodes[0] {
			waiting = n
			break
		}
	}
	waiting.requestFailed(&p, bs[0], later)
	if !waiting.Ejected(later) {
		t.Fatal("a node over the threshold was not ejected once the share allowed it")
	}

	// One node: never ejected. Two nodes, the other down by its probes: not either.
	solo := &Node{Name: "solo"}
	_, ss := testModel(solo)
	x, y := &Node{Name: "x"}, &Node{Name: "y"}
	_, xs := testModel(x, y)
	y.reportUnreachable(p, true, now)
	for i := 0; i < 10; i++ {
		solo.requestFailed(&p, ss[0], now)
		x.requestFailed(&p, xs[0], now)
	}
	if solo.Ejected(now) || x.Ejected(now) {
		t.Fatal("the last node up by its probes was ejected")
	}
}

// Through the relay with simulated vLLM nodes: node a answers /health with
// 200 but fails every chat request with 500. It stops getting traffic while
// its probes keep succeeding, gets it again after the ejection, and when b
// fails too only one of the two is ejected.
func TestOutlierEjectsANodeThatPassesItsProbe(t *testing.T) {
	var aBad, bBad atomic.Bool
	var aChats, aProbes, bChats atomic.Int64
	faulty := func(bad *atomic.Bool, chats, probes *atomic.Int64) http.Handler {
		sim := simulate.New(simulate.Config{Flavour: simulate.VLLM, Models: []string{"up"}})
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/health" {
				if probes != nil {
					probes.Add(1)
				}
			} else {
				chats.Add(1)
				if bad.Load() {
					r.Header.Set("X-Sim-Fault", "500") // this request only: /health stays 200
				}
			}
			sim.ServeHTTP(w, r)
		})
	}
	a := httptest.NewServer(faulty(&aBad, &aChats, &aProbes))
	defer a.Close()
	b := httptest.NewServer(faulty(&bBad, &bChats, nil))
	defer b.Close()
	cat := catalog(netModel("m", "up", 1000, 100, 0, NodeSpec{Name: "a", URL: a.URL + "/v1"}, NodeSpec{Name: "b", URL: b.URL + "/v1"}))
	base := time.Second // long enough that a loaded machine ends no ejection early
	var logged syncbuf.Buffer
	r := New(NewCatalog(cat, nil), Options{Health: HealthPolicy{FailureThreshold: 3, EjectionBase: base,
		EjectionMax: 10 * base, MinRequests: 1000}}, Deps{Log: slog.New(slog.NewTextHandler(&logged, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.RunHealthChecks(ctx, 10*time.Millisecond, time.Second)
	nodeA := r.Catalog().Models[0].Backends[0].Nodes[0]

	// call returns "ok" or the error code the client gets.
	call := func() string {
		w := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		c := &Call{RequestID: "r", Body: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)}
		if err := r.ServeChat(w, req, c); err != nil {
			var te *tollgate.Error
			if !errors.As(err, &te) {
				t.Fatalf("unexpected error %v", err)
			}
			return string(te.Code)
		}
		if w.Code != http.StatusOK {
			return fmt.Sprint(w.Code)
		}
		return "ok"
	}

	aBad.Store(true)
	for i := 0; i < 20; i++ {
		call()
	}
	if got := aChats.Load(); got != 3 {
		t.Fatalf("node a took %d chat requests, want 3 (the failures that eject it)", got)
	}
	if !nodeA.Ejected(time.Now()) {
		t.Fatal("node a not ejected")
	}
	// What the operator's console shows of both.
	if h := r.NodeHealth(nodeA); !h.Up || h.EjectedUntil.IsZero() || time.Until(h.EjectedUntil) > base {
		t.Errorf("node a's health = %+v, want up by its probes and ejected for at most %s", h, base)
	}
	if h := r.NodeHealth(r.Catalog().Models[0].Backends[0].Nodes[1]); !h.Up || !h.EjectedUntil.IsZero() ||
		h.Recent < 17 || h.RecentFailed != 0 || h.RequestsInARow != 0 || h.Window <= 0 {
		t.Errorf("node b's health = %+v, want up, not ejected, its 17 or more answers counted in the window, none failed", h)
	}
	if l := logged.String(); !strings.Contains(l, "node ejected") || !strings.Contains(l, "node=a") || !strings.Contains(l, "ejection_seconds=1 ") {
		t.Fatalf("the ejection was not logged: %s", l)
	}
	probesBefore := aProbes.Load()
	for i := 0; i < 20; i++ {
		if code := call(); code != "ok" {
			t.Fatalf("request %d while a is ejected: %s, want an answer from b", i, code)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if aProbes.Load() == probesBefore {
		t.Fatal("no probe of a ran during the test: the probe could not have reset anything")
	}
	if !nodeA.Ejected(time.Now()) || aChats.Load() != 3 {
		t.Fatalf("good probes brought a back: ejected %v, chats %d", nodeA.Ejected(time.Now()), aChats.Load())
	}

	// The ejection passes: a gets traffic again, fails three times, and is
	// out for twice the base.
	time.Sleep(base)
	for i := 0; i < 20; i++ {
		call()
	}
	if got := aChats.Load(); got != 6 {
		t.Fatalf("after the ejection node a took %d chat requests in all, want 6", got)
	}
	until := time.Unix(0, nodeA.health.outlier.ejectedUntil.Load())
	if left := time.Until(until); left <= base || left > 2*base {
		t.Fatalf("second ejection ends in %s, want longer than the first (%s), at most %s", left, base, 2*base)
	}

	// b fails too: a is ejected, so b (half of two nodes) is not.
	bBad.Store(true)
	before := bChats.Load()
	for i := 0; i < 10; i++ {
		if code := call(); code == "ok" {
			t.Fatal("b's failure reached the client as a success")
		}
	}
	if got := bChats.Load() - before; got != 10 {
		t.Fatalf("b took %d of 10 requests while a is ejected, want all 10 (max 50%% ejected)", got)
	}
	if nodeB := r.Catalog().Models[0].Backends[0].Nodes[1]; nodeB.Ejected(time.Now()) {
		t.Fatal("both nodes of the backend ejected")
	}
}
