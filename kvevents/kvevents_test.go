package kvevents

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// tokensOf reads bytes 4 at a time as the simulator's token ids.
func tokensOf(b []byte) []uint32 {
	out := make([]uint32, 0, len(b)/4)
	for ; len(b) >= 4; b = b[4:] {
		out = append(out, binary.LittleEndian.Uint32(b))
	}
	return out
}

// blockBytes is one 16-token block of the simulator's tokenizer.
const blockBytes = BlockTokens * 4

// promptKeys keys a prompt read by the simulator's tokenizer.
func promptKeys(b []byte) []uint64 { return Keys(nil, tokensOf(b), BlockTokens) }

// storedFor is the BlockStored a node would publish for the full blocks
// of prompt from block `from` on, with node hashes base+i.
func storedFor(prompt []byte, from int, base uint64) Event {
	n := len(prompt) / blockBytes
	e := Event{Kind: BlockStored, BlockSize: BlockTokens, Tokens: tokensOf(prompt[from*blockBytes : n*blockBytes])}
	for i := from; i < n; i++ {
		e.Hashes = append(e.Hashes, base+uint64(i))
	}
	if from > 0 {
		e.Parent, e.HasParent = base+uint64(from-1), true
	}
	return e
}

var prompt = bytes.Repeat([]byte("The quick brown fox jumps over the lazy dog. "), 20) // 900 bytes: 14 blocks

func TestDecodeArrayAndMapForms(t *testing.T) {
	want := Batch{TS: 1.5, Events: []Event{storedFor(prompt[:256], 0, 100), {Kind: BlockRemoved, Hashes: []uint64{100, 101}}, {Kind: AllBlocksCleared}}}
	got, err := DecodeBatch(AppendBatch(nil, want))
	if err != nil {
		t.Fatal(err)
	}
	check := func(got Batch) {
		t.Helper()
		if got.TS != 1.5 || len(got.Events) != 3 {
			t.Fatalf("batch %+v", got)
		}
		s := got.Events[0]
		if s.Kind != BlockStored || len(s.Hashes) != 4 || s.Hashes[3] != 103 || s.HasParent || s.BlockSize != 16 || len(s.Tokens) != 64 || s.Tokens[0] != binary.LittleEndian.Uint32([]byte("The ")) {
			t.Fatalf("stored %+v", s)
		}
		if r := got.Events[1]; r.Kind != BlockRemoved || len(r.Hashes) != 2 || r.Hashes[1] != 101 {
			t.Fatalf("removed %+v", r)
		}
		if got.Events[2].Kind != AllBlocksCleared {
			t.Fatalf("cleared %+v", got.Events[2])
		}
	}
	check(got)

	// The map form (vLLM structs without array_like), with byte-string
	// hashes, a parent, fields in another order and fields not read here.
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.EncodeMapLen(3)
	e.EncodeString("ts")
	e.EncodeFloat64(1.5)
	e.EncodeString("events")
	e.EncodeArrayLen(3)
	e.EncodeMapLen(7)
	e.EncodeString("type")
	e.EncodeString("BlockStored")
	e.EncodeString("block_hashes")
	e.EncodeArrayLen(4)
	for i := 0; i < 4; i++ {
		e.EncodeBytes([]byte{byte(i), 1, 2, 3})
	}
	e.EncodeString("parent_block_hash")
	e.EncodeNil()
	e.EncodeString("token_ids")
	e.EncodeArrayLen(64)
	for _, tk := range tokensOf(prompt[:256]) {
		e.EncodeUint(uint64(tk))
	}
	e.EncodeString("medium")
	e.EncodeString("GPU")
	e.EncodeString("block_size")
	e.EncodeInt(16)
	e.EncodeString("lora_name")
	e.EncodeNil()
	e.EncodeMapLen(3)
	e.EncodeString("type")
	e.EncodeString("BlockRemoved")
	e.EncodeString("block_hashes")
	e.EncodeArrayLen(2)
	e.EncodeInt(100)
	e.EncodeInt(101)
	e.EncodeString("medium")
	e.EncodeString("GPU")
	e.EncodeMapLen(1)
	e.EncodeString("type")
	e.EncodeString("AllBlocksCleared")
	e.EncodeString("data_parallel_rank")
	e.EncodeInt(0)
	got, err = DecodeBatch(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	got.Events[0].Hashes[3] = 103 // byte-string hashes are folded, not kept
	check(got)

	if _, err := DecodeBatch([]byte{0x92, 0xa1, 'x'}); err == nil {
		t.Fatal("a truncated batch decoded")
	}
}

func TestIndexMatchesKeys(t *testing.T) {
	x := NewIndex(1000)
	tools := prompt[:100]
	msgs := prompt[100:]
	keys := promptKeys(append(append([]byte{}, tools...), msgs...))
	if len(keys) != len(prompt)/blockBytes {
		t.Fatalf("%d keys", len(keys))
	}
	// The node stores the first 5 blocks, then the rest chained to them.
	x.Apply([]Event{storedFor(prompt[:5*blockBytes], 0, 1)})
	if got := x.Match(keys); got != 5 {
		t.Fatalf("matched %d, want 5", got)
	}
	x.Apply([]Event{storedFor(prompt, 5, 1)})
	if got := x.Match(keys); got != len(keys) {
		t.Fatalf("matched %d, want %d", got, len(keys))
	}
	// Evicting the tail shortens the match; another prompt matches nothing.
	x.Apply([]Event{{Kind: BlockRemoved, Hashes: []uint64{1 + 13, 1 + 12, 1 + 11}}})
	if got := x.Match(keys); got != 11 {
		t.Fatalf("matched %d after evicting 3, want 11", got)
	}
	if got := x.Match(promptKeys(bytes.Repeat([]byte("x"), 640))); got != 0 {
		t.Fatalf("unrelated prompt matched %d", got)
	}
	// A block whose parent the index never saw cannot be keyed.
	x.Apply([]Event{{Kind: BlockStored, Hashes: []uint64{999}, Parent: 998, HasParent: true, BlockSize: 16, Tokens: tokensOf(prompt[:64])}})
	if b, _ := x.Size(); b != 11 {
		t.Fatalf("%d blocks", b)
	}
	x.Apply([]Event{{Kind: AllBlocksCleared}})
	if got := x.Match(keys); got != 0 {
		t.Fatalf("matched %d after clear", got)
	}
}

func TestIndexIsBounded(t *testing.T) {
	x := NewIndex(100)
	big := bytes.Repeat([]byte("abcdefgh"), 8*1000) // 1000 blocks
	for round := 0; round < 20; round++ {
		x.Apply([]Event{storedFor(big, 0, uint64(round)*10_000)})
		// Removals the index never applies (hashes it no longer holds) do not grow it either.
		x.Apply([]Event{{Kind: BlockRemoved, Hashes: []uint64{uint64(round) * 10_000}}})
	}
	b, bytes := x.Size()
	if b > 100 || bytes > 100*entryBytes {
		t.Fatalf("%d blocks, %d bytes over a bound of 100", b, bytes)
	}
	if len(x.queue)-x.head > 2*100+1000 || len(x.byKey) > 100 {
		t.Fatalf("queue %d, keys %d", len(x.queue)-x.head, len(x.byKey))
	}
}

// proxy forwards TCP connections to target and can cut them all.
type proxy struct {
	ln     net.Listener
	mu     sync.Mutex
	target string
	conns  []net.Conn
	refuse bool
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.refuse {
				p.mu.Unlock()
				c.Close()
				continue
			}
			u, err := net.Dial("tcp", p.target)
			if err != nil {
				p.mu.Unlock()
				c.Close()
				continue
			}
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() { io.Copy(u, c); u.Close() }()
			go func() { io.Copy(c, u); c.Close() }()
		}
	}()
	t.Cleanup(func() { ln.Close(); p.cut(true) })
	return p
}

func (p *proxy) addr() string { return "tcp://" + p.ln.Addr().String() }

// cut closes every connection; refuse keeps new ones out until cut(false).
func (p *proxy) cut(refuse bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns, p.refuse = nil, refuse
}

func (p *proxy) retarget(addr string) {
	p.mu.Lock()
	p.target = addr
	p.mu.Unlock()
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func startPublisher(t *testing.T) *Publisher {
	p, err := Publish(PublisherOptions{Endpoint: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// sendUntilHeard publishes a block of its own until the subscriber holds
// it (a PUB socket drops what it sends before a subscriber has joined).
func sendUntilHeard(t *testing.T, p *Publisher, s *Subscriber, block []byte, hash uint64) {
	t.Helper()
	keys := promptKeys(block)
	waitFor(t, "the subscriber to join", func() bool {
		p.Send(storedFor(block, 0, hash))
		time.Sleep(20 * time.Millisecond)
		return s.index.Match(keys) == 1
	})
}

func TestSubscriberReplaysWhatItMissedAfterAReconnect(t *testing.T) {
	pub := startPublisher(t)
	pubProxy := newProxy(t, pub.PubAddr()[len("tcp://"):])
	s := Subscribe(Options{Endpoint: pubProxy.addr(), Replay: pub.ReplayAddr(), Stale: time.Hour})
	defer s.Close()
	sendUntilHeard(t, pub, s, bytes.Repeat([]byte("j"), 64), 7000)

	// The connection drops; the node stores the prompt meanwhile.
	pubProxy.cut(true)
	time.Sleep(50 * time.Millisecond)
	keys := promptKeys(prompt)
	pub.Send(storedFor(prompt[:5*blockBytes], 0, 1))
	pub.Send(storedFor(prompt, 5, 1))
	time.Sleep(50 * time.Millisecond)
	if got := s.index.Match(keys); got != 0 {
		t.Fatalf("matched %d while cut off", got)
	}
	// It comes back: the next batch shows the gap, and the two missed are replayed.
	pubProxy.cut(false)
	waitFor(t, "the replay", func() bool {
		pub.Send(Event{Kind: BlockRemoved, Hashes: []uint64{424242}})
		time.Sleep(30 * time.Millisecond)
		return s.index.Match(keys) == len(keys)
	})
	// Counted by kind: the two replayed BlockStored, the BlockRemoved that
	// showed the gap.
	if st := s.Stats(); st.Replayed < 2 || st.Lost != 0 || st.Stored < 2 || st.Removed < 1 || st.Cleared != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSubscriberEmptiesTheIndexWhenTheNodeStartsAgain(t *testing.T) {
	pub := startPublisher(t)
	pubProxy := newProxy(t, pub.PubAddr()[len("tcp://"):])
	s := Subscribe(Options{Endpoint: pubProxy.addr(), Stale: time.Hour})
	defer s.Close()
	sendUntilHeard(t, pub, s, bytes.Repeat([]byte("j"), 64), 7000)
	keys := promptKeys(prompt)
	for i := 0; i < 3; i++ {
		pub.Send(storedFor(prompt, 0, 1))
	}
	waitFor(t, "the prompt", func() bool { return s.index.Match(keys) == len(keys) })

	// A new publisher (the node restarted) numbers from 0 again.
	pub2 := startPublisher(t)
	pubProxy.retarget(pub2.PubAddr()[len("tcp://"):])
	pubProxy.cut(false)
	other := bytes.Repeat([]byte("k"), 64)
	sendUntilHeard(t, pub2, s, other, 8000)
	if got := s.index.Match(keys); got != 0 {
		t.Fatalf("the restarted node still holds %d blocks of the prompt", got)
	}
	if st := s.Stats(); st.Restarts != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSubscriberGapWithoutReplayEmptiesAndGoesDeaf(t *testing.T) {
	pub := startPublisher(t)
	pubProxy := newProxy(t, pub.PubAddr()[len("tcp://"):])
	s := Subscribe(Options{Endpoint: pubProxy.addr(), Stale: 300 * time.Millisecond})
	defer s.Close()
	sendUntilHeard(t, pub, s, bytes.Repeat([]byte("j"), 64), 7000)
	pubProxy.cut(true)
	time.Sleep(50 * time.Millisecond)
	pub.Send(storedFor(prompt, 0, 1)) // missed, and no replay socket
	time.Sleep(50 * time.Millisecond)
	pubProxy.cut(false)
	waitFor(t, "the gap", func() bool {
		pub.Send(Event{Kind: BlockRemoved, Hashes: []uint64{424242}})
		time.Sleep(30 * time.Millisecond)
		return s.Stats().Lost == 1
	})
	now := time.Now().UnixNano()
	if _, live := s.Match(nil, now); live {
		t.Fatal("trusted right after a gap it could not fill")
	}
	if _, live := s.Match(nil, now+int64(time.Second)); !live {
		t.Fatal("still not trusted after Stale")
	}
}

func TestSubscriberThatStopsHearingIsNotTrusted(t *testing.T) {
	pub := startPublisher(t)
	s := Subscribe(Options{Endpoint: pub.PubAddr(), Stale: time.Second})
	defer s.Close()
	sendUntilHeard(t, pub, s, bytes.Repeat([]byte("j"), 64), 7000)
	t0 := time.Now().UnixNano()
	if _, live := s.Match(nil, t0); !live {
		t.Fatal("not trusted while heard")
	}
	// A request sent and no event after it: trusted for Stale, then not.
	s.Sent(t0)
	if _, live := s.Match(nil, t0+int64(500*time.Millisecond)); !live {
		t.Fatal("not trusted within Stale")
	}
	if _, live := s.Match(nil, t0+int64(2*time.Second)); live {
		t.Fatal("trusted 2s after a request it never reported")
	}
	// An event brings it back.
	pub.Send(Event{Kind: BlockRemoved, Hashes: []uint64{1}})
	waitFor(t, "the event", func() bool { _, live := s.Match(nil, t0+int64(2*time.Second)); return live })
}

// A node of another block size (vLLM's --block-size 32) is matched by keys
// made in its size, which its events tell; keys of another size miss.
func TestIndexMatchesInTheNodesBlockSize(t *testing.T) {
	x := NewIndex(1000)
	if x.BlockSize() != 0 {
		t.Fatalf("block size %d before any event", x.BlockSize())
	}
	ids := tokensOf(prompt) // 225 ids: 7 blocks of 32
	e := Event{Kind: BlockStored, BlockSize: 32, Tokens: ids[:7*32]}
	for i := 0; i < 7; i++ {
		e.Hashes = append(e.Hashes, uint64(50+i))
	}
	x.Apply([]Event{e})
	if x.BlockSize() != 32 {
		t.Fatalf("block size %d, want 32", x.BlockSize())
	}
	if got := x.Match(Keys(nil, ids, 32)); got != 7 {
		t.Fatalf("matched %d blocks of 32, want 7", got)
	}
	if got := x.Match(Keys(nil, ids, 16)); got != 0 {
		t.Fatalf("keys of 16 matched %d blocks of 32", got)
	}
	if got := len(Keys(nil, ids[:31], 32)); got != 0 {
		t.Fatalf("a partial block was keyed (%d keys)", got)
	}
}

// A node reports the evictions that made room after the blocks it stored
// in the same batch: a full index keeps its oldest blocks through it.
func TestIndexBoundAppliesAfterTheBatch(t *testing.T) {
	x := NewIndex(14)
	x.Apply([]Event{storedFor(prompt, 0, 1)}) // 14 blocks: full
	other := bytes.Repeat([]byte("y"), 4*blockBytes)
	x.Apply([]Event{storedFor(other, 0, 100), {Kind: BlockRemoved, Hashes: []uint64{1 + 13, 1 + 12, 1 + 11, 1 + 10}}})
	keys := promptKeys(prompt)
	if got := x.Match(keys); got != 10 || x.Match(keys[:1]) != 1 {
		t.Fatalf("matched %d of the first prompt (first block: %d), want its first 10 blocks", got, x.Match(keys[:1]))
	}
	if b, _ := x.Size(); b != 14 {
		t.Fatalf("%d blocks, want 14", b)
	}
	if got := x.Match(promptKeys(other)); got != 4 {
		t.Fatalf("matched %d of the second, want 4", got)
	}
}

// BenchmarkKeys100KB is the request path's cost of keying a 100 KB
// prompt's token ids for the nodes' events; BenchmarkIndexMatch100KB the
// match on one node holding half of it among 50 other such prompts.
func BenchmarkKeys100KB(b *testing.B) {
	ids := tokensOf(bytes.Repeat([]byte("the conversation so far, "), 4000))
	buf := make([]uint64, 0, 2048)
	b.ReportAllocs()
	for b.Loop() {
		buf = Keys(buf[:0], ids, BlockTokens)
	}
}

func BenchmarkIndexMatch100KB(b *testing.B) {
	msgs := bytes.Repeat([]byte("the conversation so far, "), 4000)
	x := NewIndex(200_000)
	for i := 0; i < 50; i++ {
		other := append([]byte(fmt.Sprint(i)), msgs...)
		x.Apply([]Event{storedFor(other, 0, uint64(i)<<32)})
	}
	x.Apply([]Event{storedFor(msgs[:len(msgs)/2], 0, 99<<32)})
	keys := promptKeys(msgs)
	b.ReportAllocs()
	for b.Loop() {
		x.Match(keys)
	}
}
