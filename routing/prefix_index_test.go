package routing

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/openai"
)

// convo renders a conversation of turns user/assistant pairs the way a
// client resends it: each turn's messages start with the previous turn's.
func convo(system string, turns int, size int) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, `[{"role":"system","content":%q}`, system)
	for i := 0; i < turns; i++ {
		fmt.Fprintf(&b, `,{"role":"user","content":"question %d %s"}`, i, bytes.Repeat([]byte("q"), size))
		if i < turns-1 {
			fmt.Fprintf(&b, `,{"role":"assistant","content":"answer %d %s"}`, i, bytes.Repeat([]byte("a"), size))
		}
	}
	b.WriteByte(']')
	return b.Bytes()
}

func TestHashPrefixChainsBlocks(t *testing.T) {
	t1 := convo("be brief", 1, 600)
	t2 := convo("be brief", 2, 600)
	h1 := hashPrefix(nil, "m", nil, t1)
	h2 := hashPrefix(nil, "m", nil, t2)
	if len(h1) != len(t1)/PrefixBlockBytes || len(h2) != len(t2)/PrefixBlockBytes {
		t.Fatalf("blocks %d/%d for %d/%d bytes", len(h1), len(h2), len(t1), len(t2))
	}
	// The second turn starts with the first turn's bytes but for its last
	// byte (the closing bracket): the full blocks before it are shared.
	shared := (len(t1) - 1) / PrefixBlockBytes
	for i := 0; i < shared; i++ {
		if h1[i] != h2[i] {
			t.Fatalf("block %d differs between turns", i)
		}
	}
	if other := hashPrefix(nil, "m2", nil, t1); other[0] == h1[0] {
		t.Fatal("another model's prompt has the same hash")
	}
	if tools := hashPrefix(nil, "m", []byte(`[{"type":"function"}]`), t1); tools[0] == h1[0] {
		t.Fatal("other tools give the same hash")
	}
	// A change in the first block changes every hash after it.
	t1b := bytes.Replace(t1, []byte("brief"), []byte("BRIEF"), 1)
	for i, h := range hashPrefix(nil, "m", nil, t1b) {
		if h == h1[i] {
			t.Fatalf("block %d equal after the first block changed", i)
		}
	}
}

func TestPrefixIndexMatch(t *testing.T) {
	var x prefixIndex
	now := time.Now().UnixNano()
	turn1 := hashPrefix(nil, "m", nil, convo("sys", 1, 2000))
	turn3 := hashPrefix(nil, "m", nil, convo("sys", 3, 2000))
	if got := x.match(turn3, now); got != 0 {
		t.Fatalf("empty index matched %d", got)
	}
	x.record(turn1, now)
	got := x.match(turn3, now)
	if got != len(turn1)-1 && got != len(turn1) {
		t.Fatalf("turn 3 matched %d blocks, want turn 1's %d (or one less)", got, len(turn1))
	}
	if got := x.match(turn1, now); got != len(turn1) {
		t.Fatalf("the same prompt matched %d of %d", got, len(turn1))
	}
	other := hashPrefix(nil, "m", nil, convo("another system prompt", 3, 2000))
	if got := x.match(other, now); got != 0 {
		t.Fatalf("an unrelated prompt matched %d", got)
	}
}

func TestPrefixIndexEvictsLeastRecentDeepestFirst(t *testing.T) {
	var x prefixIndex
	x.configure(10*PrefixBlockBytes/4, time.Hour) // 10 blocks
	now := time.Now().UnixNano()
	a := hashPrefix(nil, "m", nil, convo("a", 1, 6*PrefixBlockBytes))
	b := hashPrefix(nil, "m", nil, convo("b", 1, 6*PrefixBlockBytes))
	if len(a) < 6 || len(b) < 6 {
		t.Fatalf("blocks %d, %d", len(a), len(b))
	}
	a, b = a[:6], b[:6]
	x.record(a, now)
	x.record(b, now+1)
	// 12 blocks into 10: a's two deepest went, its first four stay.
	if got := x.match(a, now+2); got != 4 {
		t.Fatalf("a matches %d blocks after eviction, want 4", got)
	}
	if got := x.match(b, now+2); got != 6 {
		t.Fatalf("b matches %d, want 6", got)
	}
	if blocks, bytes := x.size(); blocks != 10 || bytes != 10*prefixEntryBytes {
		t.Fatalf("size %d blocks %d bytes", blocks, bytes)
	}
	// Touching a makes b the least recent.
	x.record(a[:4], now+3)
	x.record(a, now+4)
	if got := x.match(b, now+5); got != 4 {
		t.Fatalf("b matches %d after a was used again, want 4", got)
	}
}

func TestPrefixIndexTTL(t *testing.T) {
	var x prefixIndex
	x.configure(0, time.Minute)
	now := time.Now().UnixNano()
	h := hashPrefix(nil, "m", nil, convo("s", 2, 1000))
	x.record(h, now)
	if got := x.match(h, now+int64(59*time.Second)); got != len(h) {
		t.Fatalf("matched %d before the TTL", got)
	}
	if got := x.match(h, now+int64(61*time.Second)); got != 0 {
		t.Fatalf("matched %d after the TTL", got)
	}
	// A later record drops the expired blocks and reuses their slots.
	other := hashPrefix(nil, "m", nil, convo("t", 2, 1000))
	x.record(other, now+int64(2*time.Minute))
	if blocks, _ := x.size(); blocks != len(other) {
		t.Fatalf("%d blocks held, want only the new prompt's %d", blocks, len(other))
	}
	if len(x.entries) > len(h) {
		t.Fatalf("%d slots for %d blocks: expired slots not reused", len(x.entries), len(other))
	}
}

func TestPrefixIndexMemoryBound(t *testing.T) {
	var x prefixIndex
	const blocks = 1000
	x.configure(blocks*PrefixBlockBytes/4, time.Hour)
	now := time.Now().UnixNano()
	for i := 0; i < 200; i++ {
		x.record(hashPrefix(nil, "m", nil, convo(fmt.Sprint("system ", i), 4, 1000)), now+int64(i))
	}
	n, bytes := x.size()
	if n != blocks || len(x.entries) != blocks || bytes != blocks*prefixEntryBytes {
		t.Fatalf("held %d blocks in %d slots (%d bytes), bound %d", n, len(x.entries), bytes, blocks)
	}
	// The list and the map agree.
	seen := 0
	for i := x.head; i >= 0; i = x.entries[i].next {
		if x.byHash[x.entries[i].hash] != i {
			t.Fatalf("slot %d not in the map", i)
		}
		seen++
	}
	if seen != n {
		t.Fatalf("list holds %d, map %d", seen, n)
	}
	// A lowered bound applies at the next record.
	x.configure(100*PrefixBlockBytes/4, time.Hour)
	x.record(hashPrefix(nil, "m", nil, convo("last", 1, 300)), now+1000)
	if n, _ := x.size(); n != 100 {
		t.Fatalf("%d blocks after lowering the bound to 100", n)
	}
	x.reset()
	if n, _ := x.size(); n != 0 || x.match(hashPrefix(nil, "m", nil, convo("last", 1, 300)), now+1000) != 0 {
		t.Fatalf("%d blocks after reset", n)
	}
}

// BenchmarkPrefixHash100KB is the request path's cost of prefix routing
// for a 100 KB conversation: hashing it, and the lookup on 4 nodes that
// hold it (after a record of it).
func BenchmarkPrefixHash100KB(b *testing.B) {
	msgs := convo("you are a helpful assistant", 40, 1270)
	if len(msgs) < 100_000 || len(msgs) > 105_000 {
		b.Fatalf("conversation of %d bytes", len(msgs))
	}
	buf := make([]uint64, 0, 512)
	b.SetBytes(int64(len(msgs)))
	b.ReportAllocs()
	for b.Loop() {
		buf = hashPrefix(buf[:0], "model", nil, msgs)
	}
}

func BenchmarkPrefixLookup100KB4Nodes(b *testing.B) {
	msgs := convo("you are a helpful assistant", 40, 1270)
	h := hashPrefix(nil, "model", nil, msgs)
	nodes := make([]prefixIndex, 4)
	now := time.Now().UnixNano()
	for i := range nodes {
		for j := 0; j < 50; j++ { // other conversations
			nodes[i].record(hashPrefix(nil, "model", nil, convo(fmt.Sprint(i, j), 40, 1270)), now)
		}
	}
	nodes[2].record(h[:len(h)/2], now)
	b.ReportAllocs()
	for b.Loop() {
		for i := range nodes {
			nodes[i].match(h, now)
		}
	}
}

func BenchmarkPrefixRecord100KB(b *testing.B) {
	msgs := convo("you are a helpful assistant", 40, 1270)
	h := hashPrefix(nil, "model", nil, msgs)
	var x prefixIndex
	now := time.Now().UnixNano()
	x.record(h, now)
	b.ReportAllocs()
	for b.Loop() {
		now++
		x.record(h, now)
	}
}

// BenchmarkPrefixRoute100KB is the whole of prefix routing on the request
// path for a 100 KB conversation over 4 nodes (hash, lookups, record);
// BenchmarkParse100KB is what tollgate does with the same body anyway
// (parse it and write the upstream body), for scale.
func BenchmarkPrefixRoute100KB(b *testing.B) {
	msgs := convo("you are a helpful assistant", 40, 1270)
	cr, err := openai.ParseChatRequest([]byte(`{"model":"m","messages":` + string(msgs) + `}`))
	if err != nil {
		b.Fatal(err)
	}
	nodes := netNodes(4, 0)
	m, able := prefixModel(4, nodes...)
	var p picker
	b.ReportAllocs()
	for b.Loop() {
		var pr prefixRoute
		_, n, _ := p.Route(m.ID, able, nil, p.Start(context.Background(), &pr, m.ID, m.Backends, cr, time.Now()))
		pr.Done()
		n.Release()
	}
}

func BenchmarkParse100KB(b *testing.B) {
	body := []byte(`{"model":"m","messages":` + string(convo("you are a helpful assistant", 40, 1270)) + `}`)
	buf := make([]byte, 0, 128<<10)
	b.ReportAllocs()
	for b.Loop() {
		cr, err := openai.ParseChatRequest(body)
		if err != nil {
			b.Fatal(err)
		}
		buf = cr.AppendUpstreamBody(buf[:0], openai.UpstreamOptions{Model: "up", Flavour: openai.VLLM, MaxTokens: 100})
	}
}
