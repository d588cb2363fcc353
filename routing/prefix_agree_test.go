package routing

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/kvevents"
)

// sharedSystem is a system prompt every conversation of these tests shares.
var sharedSystem = "You are the support assistant of a gateway. " + strings.Repeat("Be brief. ", 90)

// turnOf is conversation c's turn (1-based) over the shared system prompt;
// conversations differ from their first question on.
func turnOf(c, turn int) []byte { return convo(sharedSystem, turn, 300+c) }

// instance is one tollgate instance's routing state: its own nodes (the
// same URLs as every other instance's), picker and counters.
type instance struct {
	nodes []*node
	m     *model
	able  []*backend
	p     picker
	st    prefixCounters
}

func newInstance(k int, maxConc int64) *instance {
	in := &instance{nodes: netNodes(k, maxConc)}
	in.m, in.able = prefixModel(2, in.nodes...)
	return in
}

func (in *instance) route(t *testing.T, msgs []byte) string {
	t.Helper()
	n := routeTurn(t, &in.p, &in.st, in.m, in.able, msgs)
	n.Release()
	return n.BaseURL
}

// Two instances fed the same requests in different orders pick the same
// node for each while the nodes have capacity; conversations sharing a
// system prompt spread over the nodes.
func TestPrefixRoutingAgreesAcrossInstances(t *testing.T) {
	const convs, turns = 60, 6
	type req struct{ c, turn int }
	var order []req
	for turn := 1; turn <= turns; turn++ {
		for c := 0; c < convs; c++ {
			order = append(order, req{c, turn})
		}
	}
	a, b := newInstance(5, 8), newInstance(5, 8)
	picked := map[req]string{}
	for _, r := range order {
		picked[r] = a.route(t, turnOf(r.c, r.turn))
	}
	// b takes them shuffled: a conversation's later turns may come first.
	shuffled := append([]req(nil), order...)
	rand.New(rand.NewPCG(3, 4)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	for _, r := range shuffled {
		if got := b.route(t, turnOf(r.c, r.turn)); got != picked[r] {
			t.Fatalf("conversation %d turn %d: instance b chose %s, a %s", r.c, r.turn, got, picked[r])
		}
	}
	per := map[string]int{}
	for c := 0; c < convs; c++ {
		home := picked[req{c, 1}]
		per[home]++
		for turn := 2; turn <= turns; turn++ {
			if picked[req{c, turn}] != home {
				t.Fatalf("conversation %d moved from %s at turn %d", c, home, turn)
			}
		}
	}
	if len(per) != 5 {
		t.Fatalf("conversations on %d nodes of 5: %v", len(per), per)
	}
	for n, k := range per {
		if k > 2*convs/5 {
			t.Fatalf("%s took %d of %d conversations sharing one system prompt: %v", n, k, convs, per)
		}
	}
}

// A node full on one instance hands its conversations to their next
// choice there; once it has room again, both instances agree again.
func TestPrefixRoutingFullNodeOnOneInstance(t *testing.T) {
	a, b := newInstance(4, 4), newInstance(4, 4)
	home := a.route(t, turnOf(7, 1))
	if got := b.route(t, turnOf(7, 2)); got != home {
		t.Fatalf("b chose %s, a %s", got, home)
	}
	var full *node
	for _, n := range b.nodes {
		if n.BaseURL == home {
			full = n
		}
	}
	full.inflight.Add(4)
	second := b.route(t, turnOf(7, 3))
	if second == home {
		t.Fatal("a full node was chosen")
	}
	full.inflight.Add(-4)
	for turn := 4; turn <= 6; turn++ {
		ga, gb := a.route(t, turnOf(7, turn)), b.route(t, turnOf(7, turn))
		if ga != home || gb != home {
			t.Fatalf("turn %d: a chose %s, b %s, home %s", turn, ga, gb, home)
		}
	}
}

// A node added keeps the conversations where their history is; a node
// removed moves only its own conversations.
func TestPrefixRoutingNodeAddedOrRemoved(t *testing.T) {
	in := newInstance(4, 0)
	homes := map[int]string{}
	for c := 0; c < 40; c++ {
		homes[c] = in.route(t, turnOf(c, 1))
		in.route(t, turnOf(c, 2))
	}
	// Added: a fifth node; the conversations stay where their turns are.
	extra := netNodes(5, 0)[4]
	in.able[0].Nodes = append(in.able[0].Nodes, extra)
	for c := 0; c < 40; c++ {
		if got := in.route(t, turnOf(c, 3)); got != homes[c] {
			t.Fatalf("conversation %d moved to %s after a node was added", c, got)
		}
	}
	// New conversations reach the new node too.
	onExtra := 0
	for c := 100; c < 140; c++ {
		if in.route(t, turnOf(c, 1)) == extra.BaseURL {
			onExtra++
		}
	}
	if onExtra == 0 {
		t.Fatal("no new conversation went to the added node")
	}
	// Removed: the first node; only its conversations move.
	gone := in.able[0].Nodes[0]
	in.able[0].Nodes = in.able[0].Nodes[1:]
	for c := 0; c < 40; c++ {
		got := in.route(t, turnOf(c, 4))
		if homes[c] != gone.BaseURL && got != homes[c] {
			t.Fatalf("conversation %d moved from %s to %s when another node was removed", c, homes[c], got)
		}
		if got == gone.BaseURL {
			t.Fatal("a removed node was chosen")
		}
	}
}

// simBlock is a 16-token block of the simulator's tokenizer, in bytes.
const simBlock = kvevents.BlockTokens * 4

// A node's own events outweigh this instance's index: a conversation its
// home has evicted goes to the node that reports holding it.
func TestPrefixRoutingTrustsTheNodesEvents(t *testing.T) {
	in := newInstance(3, 0)
	pubs := map[string]*kvevents.Publisher{}
	for _, n := range in.nodes {
		pub, err := kvevents.Publish(kvevents.PublisherOptions{Endpoint: "tcp://127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		pubs[n.BaseURL] = pub
		n.kv = kvevents.Subscribe(kvevents.Options{Endpoint: pub.PubAddr(), Stale: 300 * time.Millisecond})
		defer n.kv.Close()
	}
	// stored is the BlockStored a node publishes for the full blocks of a
	// prompt: its token ids are its bytes 4 at a time (the simulator's).
	stored := func(msgs []byte, base uint64) kvevents.Event {
		e := kvevents.Event{Kind: kvevents.BlockStored, BlockSize: kvevents.BlockTokens}
		for i := 0; i+simBlock <= len(msgs); i += simBlock {
			e.Hashes = append(e.Hashes, base+uint64(i))
		}
		e.Tokens = simTokens(msgs[:len(e.Hashes)*simBlock])
		return e
	}
	// held is what the node reports of msgs, once its subscriber has joined.
	held := func(n *node, msgs []byte, want int) {
		t.Helper()
		keys := kvevents.Keys(nil, simTokens(msgs), kvevents.BlockTokens)
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			if b, live := n.kv.Match(keys, time.Now().UnixNano()); live && b == want {
				return
			}
			if want > 0 { // a PUB socket drops what it sends before a subscriber joins
				pubs[n.BaseURL].Send(stored(msgs, 1000))
			} else {
				pubs[n.BaseURL].Send(kvevents.Event{Kind: kvevents.AllBlocksCleared})
			}
		}
		t.Fatalf("%s does not report %d blocks", n.Name, want)
	}
	// Nodes not heard from yet: this instance's index routes (turns 2 and
	// 3 are hits on the home).
	var home *node
	for turn := 1; turn <= 3; turn++ {
		url := in.route(t, turnOf(1, turn))
		for _, n := range in.nodes {
			if n.BaseURL == url {
				home = n
			}
		}
	}
	if in.st.hits.Load() != 2 {
		t.Fatalf("hits %d before any event, want 2", in.st.hits.Load())
	}
	// The home reports it holds nothing (it evicted the conversation);
	// another node reports turn 3 whole.
	other := in.nodes[0]
	if other == home {
		other = in.nodes[1]
	}
	t3 := turnOf(1, 3)
	for _, n := range in.nodes {
		if n != other {
			held(n, t3, 0)
		}
	}
	held(other, t3, len(t3)/simBlock)
	if got := in.route(t, turnOf(1, 4)); got != other.BaseURL {
		t.Fatalf("turn 4 went to %s; the node holding turn 3 by its events is %s (home %s)", got, other.BaseURL, home.BaseURL)
	}
	// The home is sent a request and stays silent past Stale: it is judged
	// by this instance's index again, which says it holds turns 1-3.
	home.kv.Sent(time.Now().UnixNano())
	time.Sleep(400 * time.Millisecond)
	if got := in.route(t, turnOf(1, 5)); got != home.BaseURL {
		t.Fatalf("turn 5 went to %s; with its events silent, the home %s holds turns 1-3 by the index", got, home.BaseURL)
	}
}
