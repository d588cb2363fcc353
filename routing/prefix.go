package routing

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/tollgate/tollgate/kvevents"
	"github.com/tollgate/tollgate/openai"
)

// Prefix-cache routing (config: routing: prefix_cache), and round robin
// (routing: round_robin), which needs the same hook in the picker. A model
// server keeps the KV cache of the prompts it has served and skips the
// prefill of a prefix it still holds; a conversation or an agent loop
// resends its whole history each turn, so the node that served the last
// turn serves the next one fastest.
//
// The choice must be the same whichever tollgate instance takes the turn,
// without asking the others. So each request has a home: the able node
// ranked first for its conversation by rendezvous hashing (the highest
// mix of the conversation's hash and the node's URL), among the nodes with
// at most the backend's prefix_margin requests in flight beyond the least
// loaded. The conversation's hash covers the model, the tools and the
// messages up to the first question (openai.OpeningEnd): every turn of a
// conversation resends that unchanged, and conversations sharing a system
// prompt differ in it, so they spread. Every instance computes the same
// home from the same request; a node that is full, down or loaded beyond
// the margin hands its conversations to the next in each one's ranking.
//
// Evidence then refines it: how much of the conversation beyond its
// opening a node holds, by the node's own report (its KV-cache events,
// package kvevents) when it publishes them, else by this instance's index
// of the prompts it sent there (prefix_index.go). The home is kept when it
// holds any of it; else the node holding the most (within the margin)
// takes the request, as after a node was added, or a turn overflowed to
// another node; else the home. Instances agree on where a conversation
// went (they chose alike), so their evidence agrees too, if shallower.
// A node that publishes its KV-cache events is judged by them: what it
// holds is then the same on every instance, evictions included.

// Request is one request's prefix routing state, on the caller's stack.
type Request[B Backend[N], N Member] struct {
	hashes []uint64  // chained block hashes of the request's messages
	buf    *[]uint64 // hashes' pooled buffer
	now    int64
	stats  *prefixCounters

	conv    uint64 // the conversation's hash: model, tools, messages to the first question
	opening int    // bytes of messages up to the end of the first question
	tools   int    // bytes of the tools definitions

	// tokens are the prompt's token ids as a node of the model tokenized
	// them (kvevents.Tokenizer), when its nodes publish KV-cache events;
	// keys are them keyed in blocks of keysSize tokens, the nodes' block
	// size (kvevents.Keys); promptBytes the bytes of tools and messages.
	tokens      []uint32
	keys        []uint64
	keysSize    int
	keysBuf     *[]uint64
	promptBytes int

	// The current pick attempt: the able prefix-routed nodes seen.
	// The first 8 are held in the Request itself, the rest in more: a
	// slice of its own array would send the whole Request to the heap.
	arr   [8]prefixCand[B, N]
	ncand int
	more  []prefixCand[B, N]
	// The decision.
	matched  int  // blocks of hashes matched on the node chosen (this instance's index)
	fellBack bool // a node held more of the conversation but was too loaded
	known    bool // the node chosen was known to hold some of the prompt

	retry bool // a refused connection's second pick: not counted again

	// round_robin: the first able node in the picker's rotation.
	roundRobin bool
	first      N
	firstB     B
}

// prefixCand is an able node of a prefix-routed backend.
type prefixCand[B Backend[N], N Member] struct {
	b     B
	n     N
	load  int64
	slack int64  // its backend's prefix_margin
	rank  uint64 // rendezvous score for the conversation
	held  int    // bytes of the messages beyond the opening the node holds (0: none)
	local int    // blocks of hashes this instance's index holds on it
}

// prefixCounters count prefix routing decisions (see PrefixStats).
type prefixCounters struct {
	requests, hits, fallbacks, misses atomic.Int64
	promptBlocks, matchedBlocks       atomic.Int64
}

// PrefixStats describe prefix-cache routing since the picker was made.
type PrefixStats struct {
	Requests int64 // requests routed by prefix_cache with at least one full block
	// Hits were sent to a node known to hold some of the prompt (by its
	// events, or this instance's index).
	Hits int64
	// Fallbacks: only nodes loaded beyond the margin held some of it; the
	// home took the request.
	Fallbacks int64
	// Misses: the node chosen was not known to hold any of the prompt (a
	// conversation's first turn, or one this instance knows nothing of).
	Misses int64
	// MatchedBlocks / PromptBlocks is the share of the prompts' blocks
	// that this instance's index held on the chosen node (PrefixBlockBytes
	// each).
	PromptBlocks, MatchedBlocks int64
	// The indexes of the catalogue's nodes now: blocks held and their
	// memory (an estimate, 48 bytes a block).
	IndexBlocks int64
	IndexBytes  int64
	// EventBlocks and EventBytes: the same for the nodes' KV-cache events
	// (kv_events), and EventsLive how many of those nodes are judged by
	// their events now (heard, and their /tokenize asked).
	EventBlocks, EventBytes int64
	EventsLive, EventNodes  int
	// The nodes' batches: applied, of which replayed after a gap; gaps
	// that could not be replayed; restarts of a node's numbering.
	EventBatches, EventReplayed, EventLost, EventRestarts int64
	// Events applied, by kind.
	EventsStored, EventsRemoved, EventsCleared int64
	// Prompts tokenized by a node's /tokenize for its events, and calls that
	// failed (timed out, refused: those requests used the index).
	Tokenized, TokenizeFailed int64
}

// Add adds o's counts to s: several pickers' (instances') stats together.
func (s *PrefixStats) Add(o PrefixStats) {
	s.Requests += o.Requests
	s.Hits += o.Hits
	s.Fallbacks += o.Fallbacks
	s.Misses += o.Misses
	s.PromptBlocks += o.PromptBlocks
	s.MatchedBlocks += o.MatchedBlocks
	s.IndexBlocks += o.IndexBlocks
	s.IndexBytes += o.IndexBytes
	s.EventBlocks += o.EventBlocks
	s.EventBytes += o.EventBytes
	s.EventsLive += o.EventsLive
	s.EventNodes += o.EventNodes
	s.EventBatches += o.EventBatches
	s.EventReplayed += o.EventReplayed
	s.EventLost += o.EventLost
	s.EventRestarts += o.EventRestarts
	s.EventsStored += o.EventsStored
	s.EventsRemoved += o.EventsRemoved
	s.EventsCleared += o.EventsCleared
	s.Tokenized += o.Tokenized
	s.TokenizeFailed += o.TokenizeFailed
}

// PrefixStats returns the counters of prefix routing and the index sizes
// of nodes (each once) at now.
func (p *Picker[B, N]) PrefixStats(nodes []N, now time.Time) PrefixStats {
	c := &p.prefixStats
	s := PrefixStats{Requests: c.requests.Load(), Hits: c.hits.Load(), Fallbacks: c.fallbacks.Load(),
		Misses: c.misses.Load(), PromptBlocks: c.promptBlocks.Load(), MatchedBlocks: c.matchedBlocks.Load()}
	for _, m := range nodes {
		n := m.State()
		b, bytes := n.prefix.size()
		s.IndexBlocks += int64(b)
		s.IndexBytes += bytes
		if n.kv != nil {
			st := n.kv.Stats()
			s.EventBlocks += int64(st.Blocks)
			s.EventBytes += st.Bytes
			s.EventNodes++
			s.EventBatches += st.Batches
			s.EventReplayed += st.Replayed
			s.EventLost += st.Lost
			s.EventRestarts += st.Restarts
			s.EventsStored += st.Stored
			s.EventsRemoved += st.Removed
			s.EventsCleared += st.Cleared
			// Judged by its events only when its /tokenize gives the
			// prompt's ids to match them by (SGLang's cannot).
			if at := now.UnixNano(); n.kv.Live(at) && n.tok != nil && n.tok.Usable(at) {
				s.EventsLive++
			}
		}
		if n.tok != nil {
			st := n.tok.Stats()
			s.Tokenized += st.Answered
			s.TokenizeFailed += st.Failed
		}
	}
	return s
}

var prefixBufs = sync.Pool{New: func() any { b := make([]uint64, 0, 512); return &b }}

// Start fills pr for a request to model, served by backends, when one of
// them routes by prefix (and the prompt has a full block) or by round
// robin, and returns it; else nil. The caller calls pr.Done after routing.
// Nodes found down lose their index here: a server that went away may come
// back with an empty cache. When nodes publish KV-cache events, a node's
// /tokenize is asked for the prompt's token ids (within ctx).
func (p *Picker[B, N]) Start(ctx context.Context, pr *Request[B, N], model string, backends []B, cr *openai.ChatRequest, now time.Time) *Request[B, N] {
	prefix := false
	tokenizes := false // a healthy node serves /tokenize
	heard := false     // a node's events are trusted now
	at := now.UnixNano()
	for _, b := range backends {
		pol := b.Policy()
		switch pol.Routing {
		case RoundRobin:
			pr.roundRobin = true
		case PrefixCache:
			prefix = true
			for _, m := range b.Members() {
				n := m.State()
				if !n.Healthy() {
					n.prefix.reset()
					continue
				}
				tokenizes = tokenizes || n.tok != nil
				if n.kv != nil && !heard {
					heard = n.kv.Live(at)
				}
			}
		}
	}
	if prefix {
		pr.hash(model, cr.Field("tools"), cr.Field("messages"))
		pr.now = at
		pr.stats = &p.prefixStats
		// The node's own token ids, for its events (kvevents/tokenize.go);
		// on any failure the approximate index routes the request. Not for
		// a conversation's opening alone: no node can hold more of it, so
		// it goes home whatever the events say.
		if pr.hashes != nil && tokenizes && heard && len(cr.Field("messages"))-pr.opening > 8 {
			if tok, tokModel := pr.tokenizer(backends, at); tok != nil {
				if ids, err := tok.Tokenize(ctx, tokModel, cr.Field); err == nil && len(ids) > 0 {
					pr.tokens, pr.promptBytes = ids, len(cr.Field("tools"))+len(cr.Field("messages"))
				}
			}
		}
	}
	if pr.hashes == nil && !pr.roundRobin {
		return nil
	}
	return pr
}

// tokenizer returns the /tokenize client to ask for the conversation's
// prompt, and the model name to ask in: the healthy node not backed off
// ranked first for the conversation (its home, when it can), so the work
// spreads over the nodes with their conversations and a prompt sent again
// finds its ids in that node's cache. nil when none can.
func (pr *Request[B, N]) tokenizer(backends []B, at int64) (*kvevents.Tokenizer, string) {
	var best *Node
	var model string
	var rank uint64
	for _, b := range backends {
		pol := b.Policy()
		if pol.Routing != PrefixCache {
			continue
		}
		for _, m := range b.Members() {
			n := m.State()
			if n.tok == nil || !n.Healthy() || !n.tok.Usable(at) {
				continue
			}
			if r := rendezvous(pr.conv, n.routeID); best == nil || r > rank {
				best, model, rank = n, pol.Model, r
			}
		}
	}
	if best == nil {
		return nil, ""
	}
	return best.tok, model
}

// hash fills the request's block hashes and its conversation's hash.
// Nothing when the messages have no full block.
func (pr *Request[B, N]) hash(model string, tools, msgs []byte) {
	bp := prefixBufs.Get().(*[]uint64)
	h := hashPrefix((*bp)[:0], model, tools, msgs)
	if len(h) == 0 {
		prefixBufs.Put(bp)
		return
	}
	pr.hashes, pr.buf = h, bp
	pr.opening = openai.OpeningEnd(msgs)
	pr.tools = len(tools)
	pr.conv = conversationHash(model, tools, msgs[:pr.opening])
}

// keysIn returns the prompt's keys in blocks of size tokens (made once per
// block size: a backend's nodes have one).
func (pr *Request[B, N]) keysIn(size int) []uint64 {
	if pr.keysSize != size {
		if pr.keysBuf == nil {
			pr.keysBuf = prefixBufs.Get().(*[]uint64)
		}
		pr.keys, pr.keysSize = kvevents.Keys((*pr.keysBuf)[:0], pr.tokens, size), size
		*pr.keysBuf = pr.keys
	}
	return pr.keys
}

// conversationHash names a conversation alike on every instance (a fixed
// hash, not the process's random seed): the model, the tools, and the
// messages' opening.
func conversationHash(model string, tools, opening []byte) uint64 {
	d := xxhash.New()
	d.WriteString(model)
	d.Write([]byte{0})
	d.Write(tools)
	d.Write([]byte{0})
	d.Write(opening)
	return d.Sum64()
}

// rendezvous is a node's score for a conversation: the node with the
// highest score is its home. Removing a node moves only its own
// conversations, each to its second-ranked node.
func rendezvous(conv, node uint64) uint64 {
	x := conv ^ node
	x ^= x >> 30
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 27
	x *= 0x94D049BB133111EB
	x ^= x >> 31
	return x
}

// Done returns the hash buffers; pr is not used after it.
func (pr *Request[B, N]) Done() {
	if pr.keysBuf != nil {
		*pr.keysBuf = (*pr.keysBuf)[:0]
		prefixBufs.Put(pr.keysBuf)
		pr.keysBuf, pr.keys, pr.tokens = nil, nil, nil
	}
	if pr.buf == nil {
		return
	}
	*pr.buf = pr.hashes[:0] // hashPrefix may have grown it
	prefixBufs.Put(pr.buf)
	pr.buf, pr.hashes = nil, nil
}

// begin starts a pick attempt.
func (pr *Request[B, N]) begin() {
	if pr != nil {
		var noB B
		var noN N
		pr.ncand, pr.more = 0, pr.more[:0]
		pr.first, pr.firstB = noN, noB
	}
}

// consider looks at an able node (healthy, below max_concurrent) with load
// requests in flight, of b, whose policy is pol.
func (pr *Request[B, N]) consider(b B, pol *Policy, m N, load int64) {
	if pr == nil {
		return
	}
	if pol.Routing == RoundRobin {
		var noN N
		if pr.first == noN {
			pr.first, pr.firstB = m, b
		}
		return
	}
	if pol.Routing != PrefixCache || pr.hashes == nil {
		return
	}
	n := m.State()
	c := prefixCand[B, N]{b: b, n: m, load: load, slack: pol.PrefixMargin, rank: rendezvous(pr.conv, n.routeID)}
	c.local = n.prefix.match(pr.hashes, pr.now)
	held := c.local * PrefixBlockBytes
	if n.kv != nil && pr.tokens != nil {
		// The node's own word, when it is heard, in its block size: its
		// blocks held, as bytes of the messages (the template's tokens spread
		// evenly; the tools come first). A node heard that stored nothing
		// yet has no block size: it holds none.
		size := n.kv.BlockSize()
		var keys []uint64
		if size > 0 {
			keys = pr.keysIn(size)
		}
		if blocks, live := n.kv.Match(keys, pr.now); live {
			held = blocks*size*pr.promptBytes/len(pr.tokens) - pr.tools
		}
	}
	if held > pr.opening {
		c.held = held
	}
	if pr.ncand < len(pr.arr) {
		pr.arr[pr.ncand] = c
		pr.ncand++
	} else {
		pr.more = append(pr.more, c)
	}
}

// choose returns the node to try: round robin's next node; else, among the
// prefix-routed nodes within their margin of the least loaded, the home
// when it holds some of the conversation, else the node holding the most
// of it, else the home; else the least loaded (least, of backend leastB,
// with leastLoad in flight).

func (pr *Request[B, N]) choose(least N, leastB B, leastLoad int64) (B, N) {
	var noN N
	if pr == nil || least == noN {
		return leastB, least
	}
	if pr.first != noN {
		return pr.firstB, pr.first
	}
	pr.fellBack, pr.known, pr.matched = false, false, 0
	var home, most *prefixCand[B, N]
	for i := range pr.ncand + len(pr.more) {
		c := pr.cand(i)
		if c.load > leastLoad+c.slack {
			if c.held > 0 {
				pr.fellBack = true
			}
			continue
		}
		if home == nil || c.rank > home.rank {
			home = c
		}
		if c.held > 0 && (most == nil || c.held > most.held || (c.held == most.held && c.rank > most.rank)) {
			most = c
		}
	}
	pick := home
	if pick != nil && pick.held == 0 && most != nil {
		pick = most
	}
	if pick == nil {
		return leastB, least
	}
	if most != nil {
		pr.fellBack = false // the conversation's node, or another holding it, was within reach
	}
	pr.matched, pr.known = pick.local, pick.held > 0 || pick.local > 0
	return pick.b, pick.n
}

// cand returns the i-th candidate of the attempt.
func (pr *Request[B, N]) cand(i int) *prefixCand[B, N] {
	if i < pr.ncand {
		return &pr.arr[i]
	}
	return &pr.more[i-pr.ncand]
}

// record notes the prompt on the node that took it and counts the decision.
func (pr *Request[B, N]) record(b B, m N) {
	if pr == nil || pr.hashes == nil || b.Policy().Routing != PrefixCache {
		return
	}
	n := m.State()
	n.prefix.record(pr.hashes, pr.now)
	if n.kv != nil {
		n.kv.Sent(pr.now)
	}
	if pr.retry {
		return
	}
	s := pr.stats
	s.requests.Add(1)
	switch {
	case pr.fellBack:
		s.fallbacks.Add(1)
	case pr.known:
		s.hits.Add(1)
	default:
		s.misses.Add(1)
	}
	s.promptBlocks.Add(int64(len(pr.hashes)))
	s.matchedBlocks.Add(int64(pr.matched))
}

// Prompt is what a request's routing keeps for a retry on another node:
// the prompt's prefix blocks, the conversation's hash and the sizes of its
// opening and tools.
type Prompt struct {
	hashes         []uint64
	conv           uint64
	opening, tools int
}

// Prompt returns what a retry of pr's request needs (valid until pr.Done).
func (pr *Request[B, N]) Prompt() Prompt {
	return Prompt{hashes: pr.hashes, conv: pr.conv, opening: pr.opening, tools: pr.tools}
}

// Retry fills pr for the pick of another node after a refused
// connection: the prompt is recorded on the node that takes it instead
// (the refusing node's index is dropped once it is seen down). nil when
// the request was not routed by prefix.
func (p *Picker[B, N]) Retry(pr *Request[B, N], q Prompt, now time.Time) *Request[B, N] {
	if q.hashes == nil {
		return nil
	}
	*pr = Request[B, N]{hashes: q.hashes, now: now.UnixNano(), stats: &p.prefixStats, retry: true}
	pr.conv, pr.opening, pr.tools = q.conv, q.opening, q.tools
	return pr
}
