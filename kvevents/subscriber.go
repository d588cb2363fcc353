package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Options configure a Subscriber.
type Options struct {
	// Endpoint is the node's PUB socket (vLLM's kv-events-config
	// "endpoint" as seen from tollgate: tcp://host:5557).
	Endpoint string
	// Replay is its ROUTER socket for missed batches ("replay_endpoint";
	// "": none, and a gap empties the index instead).
	Replay string
	// Topic filters the messages ("" : all).
	Topic string
	// MaxBlocks bounds the index (default 1,000,000 blocks, about 70 MB;
	// set it near the node's KV cache size in blocks).
	MaxBlocks int
	// Stale is how long the node may stay silent after tollgate sent it a
	// request before its word is not trusted (default 10s): a node that
	// stops publishing falls back to the approximate method.
	Stale time.Duration
	Log   *slog.Logger
}

// DefaultMaxBlocks is MaxBlocks' default.
const DefaultMaxBlocks = 1_000_000

// DefaultStale is Stale's default.
const DefaultStale = 10 * time.Second

// Subscriber follows one node's KV-cache events into an Index: it
// connects (and reconnects) to the node's PUB socket, asks the ROUTER
// socket for the batches a sequence gap shows it missed, and empties the
// index when the node's sequence starts again (a restarted node has an
// empty cache) or a gap cannot be replayed. Nothing waits on it: Match
// reads the index as it is.
type Subscriber struct {
	o      Options
	index  *Index
	cancel context.CancelFunc
	done   chan struct{}

	// pending is when tollgate first sent the node a request since its
	// last batch (unix ns; 0: none): past Stale, the node is not heard.
	pending atomic.Int64
	// deafUntil (unix ns): after a gap that could not be replayed, the
	// index is incomplete until then.
	deafUntil atomic.Int64
	// heard: a batch arrived. A node never heard from is not trusted (its
	// index would say it holds nothing).
	heard atomic.Bool

	mu      sync.Mutex
	lastSeq int64 // -1: nothing received yet

	batches, replayed, lost, restarts atomic.Int64
	events                            [AllBlocksCleared + 1]atomic.Int64 // applied, by Kind
}

// Stats count what a Subscriber received.
type Stats struct {
	Batches  int64 // batches applied
	Replayed int64 // of which replayed after a gap
	Lost     int64 // gaps that could not be replayed (the index was emptied)
	Restarts int64 // the node's sequence started again (the index was emptied)
	// Events applied, by kind.
	Stored, Removed, Cleared int64
	Blocks                   int   // blocks held now
	Bytes                    int64 // their memory, an estimate
}

// Subscribe starts following a node's events.
func Subscribe(o Options) *Subscriber {
	if o.MaxBlocks <= 0 {
		o.MaxBlocks = DefaultMaxBlocks
	}
	if o.Stale <= 0 {
		o.Stale = DefaultStale
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Subscriber{o: o, index: NewIndex(o.MaxBlocks), cancel: cancel, done: make(chan struct{}), lastSeq: -1}
	go s.run(ctx)
	return s
}

// Close stops following; the index is kept for Match.
func (s *Subscriber) Close() {
	s.cancel()
	<-s.done
}

// Match returns how many leading blocks of keys the node holds, and
// whether its word can be trusted now (live false: use another method).
func (s *Subscriber) Match(keys []uint64, now int64) (blocks int, live bool) {
	if !s.live(now) {
		return 0, false
	}
	return s.index.Match(keys), true
}

// BlockSize is the node's block size in tokens, as its events say (0:
// no block stored yet): a prompt's keys for Match are made in it (Keys).
func (s *Subscriber) BlockSize() int { return s.index.BlockSize() }

// Live reports whether the node's word can be trusted now (Match's live),
// without touching its index.
func (s *Subscriber) Live(now int64) bool { return s.live(now) }

func (s *Subscriber) live(now int64) bool {
	if !s.heard.Load() {
		return false
	}
	if p := s.pending.Load(); p != 0 && now-p > int64(s.o.Stale) {
		return false
	}
	return now >= s.deafUntil.Load()
}

// Sent notes that a request was sent to the node at now: a node that
// publishes is expected to answer with events.
func (s *Subscriber) Sent(now int64) {
	s.pending.CompareAndSwap(0, now)
}

// Stats returns the counters and the index's size.
func (s *Subscriber) Stats() Stats {
	b, bytes := s.index.Size()
	return Stats{Batches: s.batches.Load(), Replayed: s.replayed.Load(), Lost: s.lost.Load(),
		Restarts: s.restarts.Load(), Stored: s.events[BlockStored].Load(), Removed: s.events[BlockRemoved].Load(),
		Cleared: s.events[AllBlocksCleared].Load(), Blocks: b, Bytes: bytes}
}

func (s *Subscriber) run(ctx context.Context) {
	defer close(s.done)
	sub := zmq4.NewSub(ctx, zmq4.WithAutomaticReconnect(true), zmq4.WithDialerMaxRetries(-1),
		zmq4.WithDialerRetry(500*time.Millisecond), zmq4.WithDialerTimeout(2*time.Second))
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, s.o.Topic); err != nil {
		s.o.Log.Warn("kv events: subscribe", "endpoint", s.o.Endpoint, "error", err)
		return
	}
	if err := sub.Dial(s.o.Endpoint); err != nil {
		if ctx.Err() == nil {
			s.o.Log.Warn("kv events: connect", "endpoint", s.o.Endpoint, "error", err)
		}
		return
	}
	for {
		msg, err := sub.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.o.Log.Warn("kv events: receive", "endpoint", s.o.Endpoint, "error", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(500 * time.Millisecond):
			}
			continue
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			continue
		}
		s.receive(ctx, int64(binary.BigEndian.Uint64(msg.Frames[1])), msg.Frames[2])
	}
}

// receive applies batch seq, first replaying what a gap before it missed.
func (s *Subscriber) receive(ctx context.Context, seq int64, payload []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.lastSeq >= 0 && seq <= s.lastSeq:
		// The node's publisher started again: so did its cache.
		s.restarts.Add(1)
		s.index.Clear()
	case seq > s.lastSeq+1:
		// A gap (or, on joining, the batches before this one): ask for them.
		joining := s.lastSeq < 0
		if !s.replay(ctx, s.lastSeq+1, seq) && !joining {
			s.lost.Add(1)
			s.index.Clear()
			s.deafUntil.Store(time.Now().Add(s.o.Stale).UnixNano())
		}
	}
	s.apply(payload)
	s.lastSeq = seq
}

func (s *Subscriber) apply(payload []byte) {
	b, err := DecodeBatch(payload)
	if err != nil {
		s.o.Log.Warn("kv events: undecodable batch", "endpoint", s.o.Endpoint, "error", err)
		return
	}
	s.index.Apply(b.Events)
	for i := range b.Events {
		if k := b.Events[i].Kind; int(k) < len(s.events) {
			s.events[k].Add(1)
		}
	}
	s.batches.Add(1)
	s.pending.Store(0)
	s.heard.Store(true)
}

var errNoReplay = errors.New("kvevents: no replay endpoint")

// replay asks the node's ROUTER socket for batches from..to-1 and applies
// them; false when some could not be had.
func (s *Subscriber) replay(ctx context.Context, from, to int64) bool {
	got, err := s.fetchReplay(ctx, from, to)
	if err != nil && !errors.Is(err, errNoReplay) {
		s.o.Log.Warn("kv events: replay", "endpoint", s.o.Replay, "from", from, "error", err)
	}
	return got
}

func (s *Subscriber) fetchReplay(ctx context.Context, from, to int64) (bool, error) {
	if s.o.Replay == "" {
		return false, errNoReplay
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	d := zmq4.NewDealer(ctx, zmq4.WithDialerMaxRetries(2), zmq4.WithDialerTimeout(time.Second))
	defer d.Close()
	if err := d.Dial(s.o.Replay); err != nil {
		return false, err
	}
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], uint64(from))
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, start[:])); err != nil {
		return false, err
	}
	next, complete := from, true
	for {
		msg, err := d.Recv()
		if err != nil {
			return false, err
		}
		f := msg.Frames
		if len(f) > 0 && len(f[0]) == 0 {
			f = f[1:] // the empty delimiter
		}
		if len(f) != 2 || len(f[0]) != 8 {
			return false, errFormat
		}
		seq := int64(binary.BigEndian.Uint64(f[0]))
		if seq < 0 { // the end marker
			return complete && next == to, nil
		}
		if seq < next || seq >= to {
			continue
		}
		if seq > next {
			complete = false // the node no longer holds the batches between
		}
		s.apply(f[1])
		s.replayed.Add(1)
		next = seq + 1
	}
}
