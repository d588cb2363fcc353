package routing

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
)

// A node refuses the connection: the request moves to another node of the
// backend, its prompt is recorded there (the conversation's next turn
// follows it), and the decision is counted once.
func TestRetryRecordsThePromptOnTheNodeThatTakesIt(t *testing.T) {
	nodes := netNodes(3, 0)
	m, able := prefixModel(2, nodes...)
	var p picker
	var pr prefixRoute
	_, first, err := p.Route(m.ID, able, nil, p.Start(context.Background(), &pr, m.ID, m.Backends, chatReq(t, convo("retry", 2, 600)), time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	q := pr.Prompt()
	pr.Done()
	for _, n := range nodes {
		if b, _ := n.IndexSize(); (n == first) != (b > 0) {
			t.Fatalf("%s indexes %d blocks; the first pick was %s", n.Name, b, first.Name)
		}
	}

	first.Unreachable(HealthPolicy{FailureThreshold: 3, BackoffMin: time.Minute, BackoffMax: time.Minute}, true, time.Now())
	var rp prefixRoute
	_, second := p.Pick(able, tollgate.ClassNetwork, first, p.Retry(&rp, q, time.Now()))
	first.Release()
	if second == nil || second == first {
		t.Fatalf("retry after a refused connection chose %v", second)
	}
	second.Release()
	if b, _ := second.IndexSize(); b == 0 {
		t.Fatal("the prompt was not recorded on the node that took the retry")
	}
	if s := p.PrefixStats(nodes, time.Now()); s.Requests != 1 {
		t.Fatalf("%d requests counted, want 1: a retry is not a new decision", s.Requests)
	}
	if got := routeTurn(t, &p, &p.prefixStats, m, able, convo("retry", 3, 600)); got != second {
		t.Fatalf("the next turn went to %s, not to %s, which holds the conversation", got.Name, second.Name)
	}

	// A request that was not routed by prefix has nothing to retry with.
	if p.Retry(&rp, Prompt{}, time.Now()) != nil {
		t.Fatal("a retry without a prompt routes by prefix")
	}
}
