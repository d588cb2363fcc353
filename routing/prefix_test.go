package routing

import (
	"context"
	"encoding/binary"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/openai"
)

// prefixModel is a model with one prefix-routed network backend over nodes.
func prefixModel(margin int64, nodes ...*node) (*model, []*backend) {
	m, able := testModel(nodes...)
	able[0].Routing = PrefixCache
	able[0].PrefixMargin = margin
	return m, able
}

func netNodes(k int, maxConc int64) []*node {
	var out []*node
	for i := 0; i < k; i++ {
		base := fmt.Sprintf("http://10.0.0.%d:8000/v1", i+1)
		n := &node{Name: fmt.Sprint("n", i), BaseURL: base, Class: tollgate.ClassNetwork, Node: Node{MaxConcurrent: maxConc}}
		n.Init(base)
		out = append(out, n)
	}
	return out
}

// routeTurn routes one turn of a conversation as ServeChat does.
func routeTurn(t *testing.T, p *picker, stats *prefixCounters, m *model, able []*backend, msgs []byte) *node {
	t.Helper()
	pr := prefixRoute{now: time.Now().UnixNano(), stats: stats}
	pr.hash(m.ID, nil, msgs)
	if hasEvents(able) { // as a node's /tokenize answers: the simulator's tokenizer
		pr.tokens, pr.promptBytes = simTokens(msgs), len(msgs)
	}
	defer pr.Done()
	_, n, err := p.Route(m.ID, able, nil, &pr)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// simTokens reads bytes 4 at a time as token ids (the simulator's tokenizer).
func simTokens(b []byte) []uint32 {
	out := make([]uint32, 0, len(b)/4)
	for ; len(b) >= 4; b = b[4:] {
		out = append(out, binary.LittleEndian.Uint32(b))
	}
	return out
}

func hasEvents(able []*backend) bool {
	for _, b := range able {
		for _, n := range b.Nodes {
			if n.kv != nil {
				return true
			}
		}
	}
	return false
}

// A backend of more nodes than a Request holds in itself: every node is
// some conversation's home, and each conversation stays on it.
func TestPrefixRoutingOverManyNodes(t *testing.T) {
	nodes := netNodes(12, 0)
	m, able := prefixModel(2, nodes...)
	var p picker
	var st prefixCounters
	home := map[int]*node{}
	per := map[*node]int{}
	for turn := 1; turn <= 2; turn++ {
		for c := 0; c < 100; c++ {
			n := routeTurn(t, &p, &st, m, able, convo(fmt.Sprint("conversation ", c), turn, 300))
			n.Release()
			if turn == 1 {
				home[c] = n
				per[n]++
			} else if n != home[c] {
				t.Fatalf("conversation %d turn 2 went to %s, turn 1 to %s", c, n.Name, home[c].Name)
			}
		}
	}
	if len(per) != 12 {
		t.Fatalf("first turns on %d nodes, want all 12: %v", len(per), per)
	}
}

func TestPrefixRoutingKeepsAConversationOnItsNode(t *testing.T) {
	nodes := netNodes(4, 8)
	m, able := prefixModel(2, nodes...)
	var p picker
	var st prefixCounters
	// Forty conversations take turns, each request finishing before the
	// next (no load): every conversation stays where its first turn went.
	home := map[int]*node{}
	for turn := 1; turn <= 5; turn++ {
		for c := 0; c < 40; c++ {
			n := routeTurn(t, &p, &st, m, able, convo(fmt.Sprint("conversation ", c), turn, 300))
			n.Release()
			if turn == 1 {
				home[c] = n
			} else if n != home[c] {
				t.Fatalf("conversation %d turn %d went to %s, its earlier turns to %s", c, turn, n.Name, home[c].Name)
			}
		}
	}
	// The first turns spread over the nodes (nothing shared yet).
	per := map[*node]int{}
	for _, n := range home {
		per[n]++
	}
	if len(per) != 4 {
		t.Fatalf("first turns on %d nodes, want all 4: %v", len(per), per)
	}
	if st.hits.Load() != 160 || st.requests.Load() != 200 || st.fallbacks.Load() != 0 {
		t.Fatalf("hits %d requests %d fallbacks %d", st.hits.Load(), st.requests.Load(), st.fallbacks.Load())
	}
}

func TestPrefixRoutingMovesWhenTheNodeIsLoadedOrDown(t *testing.T) {
	nodes := netNodes(3, 4)
	m, able := prefixModel(2, nodes...)
	var p picker
	var st prefixCounters
	first := routeTurn(t, &p, &st, m, able, convo("c", 1, 500))
	first.Release()

	// Two more in flight than the others: within the margin, still chosen.
	first.inflight.Add(2)
	if n := routeTurn(t, &p, &st, m, able, convo("c", 2, 500)); n != first {
		t.Fatalf("within the margin the turn went to %s, not %s", n.Name, first.Name)
	}
	// Three in flight against 0 elsewhere: beyond the margin of 2, the
	// least loaded node takes it.
	n := routeTurn(t, &p, &st, m, able, convo("c", 3, 500))
	if n == first || st.fallbacks.Load() != 1 {
		t.Fatalf("beyond the margin: went to %s (first %s), fallbacks %d", n.Name, first.Name, st.fallbacks.Load())
	}
	n.Release()
	first.inflight.Add(-3)

	// Full (max_concurrent 4) is never chosen, however long its match.
	d := routeTurn(t, &p, &st, m, able, convo("d", 1, 500))
	d.Release()
	d.inflight.Add(4)
	if n := routeTurn(t, &p, &st, m, able, convo("d", 2, 500)); n == d {
		t.Fatal("a full node was chosen")
	} else {
		n.Release()
	}
	d.inflight.Add(-4)
	// Turn 4 of c goes back to its home: it holds turns 1-2, and every
	// instance, whichever took turn 3, agrees on it.
	if got := routeTurn(t, &p, &st, m, able, convo("c", 4, 500)); got != first {
		t.Fatalf("turn 4 went to %s, not back home to %s", got.Name, first.Name)
	} else {
		got.Release()
	}

	// Down: never chosen, and its index is dropped when seen down.
	first.Unreachable(HealthPolicy{FailureThreshold: 1, BackoffMin: time.Minute, BackoffMax: time.Minute}, true, time.Now())
	n = routeTurn(t, &p, &st, m, able, convo("c", 5, 500))
	if n == first {
		t.Fatal("a down node was chosen")
	}
	n.Release()
	var pr prefixRoute
	if p.Start(context.Background(), &pr, m.ID, m.Backends, chatReq(t, convo("c", 5, 500)), time.Now()) == nil {
		t.Fatal("no prefix route for a long prompt")
	}
	pr.Done()
	if b, _ := first.prefix.size(); b != 0 {
		t.Fatalf("the down node still indexes %d blocks", b)
	}
	// With its home down, the conversation lives on the node that took turn 5.
	if got := routeTurn(t, &p, &st, m, able, convo("c", 6, 500)); got != n {
		t.Fatalf("turn 6 went to %s, turn 5 to %s", got.Name, n.Name)
	}
}

func TestPrefixRoutingSpreadsUnrelatedPrompts(t *testing.T) {
	nodes := netNodes(4, 0)
	m, able := prefixModel(2, nodes...)
	var p picker
	var st prefixCounters
	// 400 unrelated prompts, 16 in flight at a time.
	var inflight []*node
	for i := 0; i < 400; i++ {
		inflight = append(inflight, routeTurn(t, &p, &st, m, able, convo(fmt.Sprint("unrelated ", i), 1, 1000)))
		if len(inflight) == 16 {
			for _, n := range inflight {
				n.Release()
			}
			inflight = inflight[:0]
		}
	}
	per := map[string]int{}
	for _, n := range nodes {
		per[n.Name] = 0
	}
	// Count by the index: each prompt is recorded on the node that took it.
	for _, n := range nodes {
		b, _ := n.prefix.size()
		per[n.Name] = b
	}
	lo, hi := 1<<30, 0
	for _, v := range per {
		lo, hi = min(lo, v), max(hi, v)
	}
	if lo == 0 || float64(hi)/float64(lo) > 1.1 {
		t.Fatalf("blocks per node %v: not even", per)
	}
	if st.misses.Load() != 400 {
		t.Fatalf("misses %d of 400", st.misses.Load())
	}
}

func TestPrefixRoutingOffForLeastOutstanding(t *testing.T) {
	nodes := netNodes(2, 0)
	m, able := testModel(nodes...) // Routing "": least outstanding
	var p picker
	var st prefixCounters
	a := routeTurn(t, &p, &st, m, able, convo("c", 1, 500))
	b := routeTurn(t, &p, &st, m, able, convo("c", 2, 500))
	if a == b || st.requests.Load() != 0 {
		t.Fatalf("least outstanding sent both to %s; counted %d", a.Name, st.requests.Load())
	}
	if n, _ := a.prefix.size(); n != 0 {
		t.Fatal("a least_outstanding backend recorded prefixes")
	}
}

func chatReq(t *testing.T, msgs []byte) *openai.ChatRequest {
	t.Helper()
	cr, err := openai.ParseChatRequest([]byte(`{"model":"m","messages":` + string(msgs) + `}`))
	if err != nil {
		t.Fatal(err)
	}
	return cr
}

func TestRoundRobinIgnoresLoad(t *testing.T) {
	nodes := netNodes(3, 2)
	m, able := testModel(nodes...)
	able[0].Routing = RoundRobin
	var p picker
	count := map[*node]int{}
	for i := 0; i < 6; i++ {
		var pr prefixRoute
		_, n, err := p.Route(m.ID, able, nil, p.Start(context.Background(), &pr, m.ID, m.Backends, chatReq(t, convo("x", 1, 10)), time.Now()))
		if err != nil {
			t.Fatal(err)
		}
		count[n]++
		if i == 0 {
			n.inflight.Add(-1) // the first node is idle again; rotation moves on anyway
		}
	}
	for _, n := range nodes {
		if count[n] != 2 {
			t.Fatalf("round robin counts %v", count)
		}
	}
}

// Add sums every counter of two pickers' stats (a field left out of Add
// is caught: each field of the sum must be the two values added).
func TestPrefixStatsAdd(t *testing.T) {
	var a, b PrefixStats
	av, bv := reflect.ValueOf(&a).Elem(), reflect.ValueOf(&b).Elem()
	for i := 0; i < av.NumField(); i++ {
		av.Field(i).SetInt(int64(i + 1))
		bv.Field(i).SetInt(int64(100 * (i + 1)))
	}
	a.Add(b)
	for i := 0; i < av.NumField(); i++ {
		if got := av.Field(i).Int(); got != int64(101*(i+1)) {
			t.Errorf("%s: %d, want %d", av.Type().Field(i).Name, got, 101*(i+1))
		}
	}
}
