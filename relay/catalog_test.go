package relay

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/upstream"
)

// A config reload (SIGHUP) runs while requests use the nodes: building the
// new catalogue must not write to a node that requests are reading.
func TestReloadDoesNotWriteNodesInUse(t *testing.T) {
	spec := func(maxc int64) CatalogSpec {
		return catalog(netModel("m", "up", 1000, 100, 0, NodeSpec{Name: "n", URL: "http://10.0.0.1:8000/v1", MaxConcurrent: maxc}))
	}
	same, changed := spec(4), spec(8)
	cat := NewCatalog(same, nil)
	if got := cat.Models[0].ImageTokens; got != DefaultImageTokens {
		t.Fatalf("image_tokens of a model that does not set it: %d, want %d", got, DefaultImageTokens)
	}
	n := cat.Models[0].Backends[0].Nodes[0]
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 200; i++ {
			if n.tryAcquire() {
				_ = n.Flavour
				_ = n.HealthURL
				n.release()
			}
		}
	}()
	for i := 0; i < 50; i++ {
		NewCatalog(same, cat)
		NewCatalog(changed, cat)
	}
	wg.Wait()
	if got := NewCatalog(changed, cat).Models[0].Backends[0].Nodes[0].MaxConcurrent; got != 8 {
		t.Fatalf("reloaded max_concurrent = %d, want 8", got)
	}
	if NewCatalog(same, cat).Models[0].Backends[0].Nodes[0] != n {
		t.Fatal("a reload with the same settings must keep the node (health, in-flight count)")
	}
}

// Probes and requests report a node's health from many goroutines at once:
// every report is counted exactly once (the metrics' failure total, the
// outlier window), the probe state stays consistent (a node is down exactly
// when its failures reached the threshold, its backoff within bounds), and
// the last report decides, whatever raced before it.
func TestNodeHealthReportsConcurrently(t *testing.T) {
	const perG = 200
	now := time.Now()
	run := func(n *Node, p HealthPolicy, jobs ...func()) {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for _, job := range jobs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for i := 0; i < perG; i++ {
					job()
				}
			}()
		}
		close(start)
		wg.Wait()
	}

	// A threshold never reached: nothing takes the node down, and every
	// report is counted.
	n := &Node{Name: "n"}
	p := HealthPolicy{FailureThreshold: 1000, BackoffMin: time.Second, BackoffMax: time.Minute}
	p.setDefaults()
	p.MinRequests = 1000000 // count, never eject: the window and counters are what is exercised
	run(n, p,
		func() { n.reportReachable() },
		func() { n.reportUnreachable(p, false, now) },
		func() { n.requestOK(&p, now) },
		func() { n.requestFailed(&p, nil, now) })
	if total, failed := n.windowCounts(&p, now); total != 2*perG || failed != perG {
		t.Fatalf("window: %d requests, %d failed; want %d, %d", total, failed, 2*perG, perG)
	}
	if got := n.failedTotal.Load(); got != 2*perG {
		t.Errorf("failed total = %d, want %d (every failed probe and request once)", got, 2*perG)
	}
	if !n.Healthy() || n.takenOut.Load() != 0 || n.Ejected(now) {
		t.Errorf("below every threshold the node was taken out: healthy %t, taken out %d, ejected %t", n.Healthy(), n.takenOut.Load(), n.Ejected(now))
	}

	// A threshold of 1: failed and good probes race. Whatever the order,
	// the state is one a sequence of reports could leave.
	n = &Node{Name: "m"}
	p = HealthPolicy{FailureThreshold: 1, BackoffMin: time.Second, BackoffMax: 4 * time.Second}
	p.setDefaults()
	run(n, p,
		func() { n.reportReachable() },
		func() { n.reportUnreachable(p, false, now) },
		func() { n.reportUnreachable(p, false, now) })
	check := func(when string) {
		t.Helper()
		n.health.mu.Lock()
		down, failures, backoff := n.health.down.Load(), n.health.failures.Load(), n.health.backoff
		n.health.mu.Unlock()
		switch {
		case down && (failures < 1 || backoff < p.BackoffMin || backoff > p.BackoffMax):
			t.Errorf("%s: down with %d failures and backoff %v", when, failures, backoff)
		case !down && failures >= 1:
			t.Errorf("%s: up with %d failures at threshold 1", when, failures)
		}
	}
	check("after the race")
	if got := n.failedTotal.Load(); got != 2*perG {
		t.Errorf("failed total = %d, want %d", got, 2*perG)
	}
	if n.takenOut.Load() < 1 {
		t.Errorf("failed probes at threshold 1 never took the node down")
	}
	n.reportUnreachable(p, false, now)
	check("after a last failed probe")
	if n.Healthy() {
		t.Error("a failed probe last: the node is up")
	}
	n.reportReachable()
	check("after a last good probe")
	if !n.Healthy() || n.health.failures.Load() != 0 {
		t.Error("a good probe last: the node is not up with a clean count")
	}
}

// Swapping the catalogue closes the idle connections of nodes it dropped:
// the next request on the dropped node's client has to dial again.
func TestSetCatalogClosesDroppedNodesIdleConnections(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{}`)
	}))
	defer srv.Close()
	old := &Catalog{byID: map[string]*Model{}}
	n := &Node{Name: "a", BaseURL: srv.URL + "/v1", Class: "network"}
	old.Models = []*Model{{ID: "m", Backends: []*Backend{{Class: "network", Nodes: []*Node{n}}}}}
	r := New(old, Options{}, Deps{})
	p := r.h1For(n)
	post := func() {
		t.Helper()
		resp, err := p.Post(context.Background(), upstream.Head{RequestID: "x"}, []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	post()
	post()
	if d := p.Dials(); d != 1 {
		t.Fatalf("%d dials for two requests in turn, want 1: the idle connection is reused", d)
	}
	r.SetCatalog(&Catalog{byID: map[string]*Model{}})
	post()
	if d := p.Dials(); d != 2 {
		t.Fatalf("%d dials after the node was dropped, want 2: its idle connection was closed", d)
	}
}
