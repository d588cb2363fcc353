package routing

import (
	"sync"
	"testing"
	"time"
)

// Probes and requests report a node's health from many goroutines at once:
// every report is counted exactly once (the metrics' failure total, the
// outlier window), the probe state stays consistent (a node is down exactly
// when its failures reached the threshold, its backoff within bounds), and
// the last report decides, whatever raced before it.
func TestNodeHealthReportsConcurrently(t *testing.T) {
	const perG = 200
	now := time.Now()
	run := func(n *node, p HealthPolicy, jobs ...func()) {
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
	n := &node{Name: "n"}
	p := HealthPolicy{FailureThreshold: 1000, BackoffMin: time.Second, BackoffMax: time.Minute}
	p.SetDefaults()
	p.MinRequests = 1000000 // count, never eject: the window and counters are what is exercised
	run(n, p,
		func() { n.Reachable() },
		func() { n.Unreachable(p, false, now) },
		func() { n.RequestOK(&p, now) },
		func() { RequestFailed(n, &p, nil, now) })
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
	n = &node{Name: "m"}
	p = HealthPolicy{FailureThreshold: 1, BackoffMin: time.Second, BackoffMax: 4 * time.Second}
	p.SetDefaults()
	run(n, p,
		func() { n.Reachable() },
		func() { n.Unreachable(p, false, now) },
		func() { n.Unreachable(p, false, now) })
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
	n.Unreachable(p, false, now)
	check("after a last failed probe")
	if n.Healthy() {
		t.Error("a failed probe last: the node is up")
	}
	n.Reachable()
	check("after a last good probe")
	if !n.Healthy() || n.health.failures.Load() != 0 {
		t.Error("a good probe last: the node is not up with a clean count")
	}
}
