package routing

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/tollgate/tollgate/internal/chainhash"
)

// PrefixBlockBytes is the size of one block of the prompt prefix index: the
// request's messages are cut into blocks of this many bytes (about 64
// tokens at 4 bytes a token, four of vLLM's 16-token cache blocks) and each
// full block is hashed together with the hash of everything before it. A
// smaller block matches closer to where two prompts part but costs more
// entries and more hashing; the last partial block is never indexed.
const PrefixBlockBytes = 256

// prefixEntryBytes is what one indexed block costs in memory: the entry
// (hash, time, two list links: 24 bytes) and its map slot (key, value and
// the map's overhead, about 24 bytes).
const prefixEntryBytes = 48

// Defaults of a prefix-routed backend (config: prefix_index_tokens,
// prefix_ttl).
const (
	DefaultPrefixIndexTokens = 1_000_000 // per node: about 15,600 blocks, 750 KB
	DefaultPrefixTTL         = 10 * time.Minute
)

var prefixSeed = maphash.MakeSeed()

// hashPrefix appends to dst the chained hashes of the full blocks of
// messages, after a start that stands for what the model's template puts
// before them (the model's name, the tool definitions). Block i's hash
// covers blocks 0..i, so two requests share hash i only if they share the
// first (i+1) × PrefixBlockBytes bytes of their messages (barring a 64-bit
// collision, which costs one misrouted request, never a wrong answer).
func hashPrefix(dst []uint64, model string, tools, messages []byte) []uint64 {
	h := maphash.String(prefixSeed, model)
	if len(tools) > 0 {
		h = chainhash.Next(h, maphash.Bytes(prefixSeed, tools))
	}
	for len(messages) >= PrefixBlockBytes {
		h = chainhash.Next(h, maphash.Bytes(prefixSeed, messages[:PrefixBlockBytes]))
		dst = append(dst, h)
		messages = messages[PrefixBlockBytes:]
	}
	return dst
}

// prefixIndex is one node's approximate record of the prompt prefixes sent
// to it recently: a set of chained block hashes with LRU eviction at a
// fixed number of blocks and a time to live. It stands for the node's own
// KV cache, which tollgate cannot see: entries age out about when the
// server's would. Safe for concurrent use.
type prefixIndex struct {
	mu      sync.Mutex
	byHash  map[uint64]int32 // hash -> slot in entries
	entries []prefixEntry
	free    []int32 // slots of expired blocks, for reuse
	head    int32   // most recently used slot, -1 when empty
	tail    int32   // least recently used slot, -1 when empty
	limit   int     // blocks; 0: DefaultPrefixIndexTokens
	ttl     time.Duration
}

type prefixEntry struct {
	hash       uint64
	seen       int64 // unix nanoseconds of the last record
	prev, next int32 // towards head, towards tail; -1 at the ends
}

// configure sets the index's bound in prompt tokens (4 bytes each) and the
// time to live; a smaller bound drops the least recent blocks at the next
// record.
func (x *prefixIndex) configure(tokens int64, ttl time.Duration) {
	if tokens <= 0 {
		tokens = DefaultPrefixIndexTokens
	}
	if ttl <= 0 {
		ttl = DefaultPrefixTTL
	}
	x.mu.Lock()
	x.limit = int(max(1, tokens*4/PrefixBlockBytes))
	x.ttl = ttl
	x.mu.Unlock()
}

func (x *prefixIndex) init() {
	if x.byHash == nil {
		x.byHash = map[uint64]int32{}
		x.head, x.tail = -1, -1
		if x.limit == 0 {
			x.limit = DefaultPrefixIndexTokens * 4 / PrefixBlockBytes
		}
		if x.ttl == 0 {
			x.ttl = DefaultPrefixTTL
		}
	}
}

// match returns how many leading blocks of hashes the index holds
// unexpired at now. Blocks of one prompt are recorded together and the
// deepest are evicted first, so the held blocks of a chain are a prefix of
// it: a binary search finds its end in log2(len) lookups.
func (x *prefixIndex) match(hashes []uint64, now int64) int {
	if len(hashes) == 0 {
		return 0
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(x.byHash) == 0 {
		return 0
	}
	oldest := now - int64(x.ttl)
	has := func(h uint64) bool {
		i, ok := x.byHash[h]
		return ok && x.entries[i].seen >= oldest
	}
	lo, hi := 0, len(hashes) // blocks [0,lo) held; [hi,len) not
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if has(hashes[mid]) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// record notes that a prompt with these block hashes was sent at now. The
// blocks are touched from the deepest to the first, so the first blocks
// (shared by more prompts) are the most recently used and the deepest are
// evicted first, as a server's cache drops a prompt's tail first.
func (x *prefixIndex) record(hashes []uint64, now int64) {
	if len(hashes) == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.init()
	if len(hashes) > x.limit {
		hashes = hashes[:x.limit]
	}
	// Expired blocks at the tail go first: they stand for nothing.
	for x.tail >= 0 && x.entries[x.tail].seen < now-int64(x.ttl) {
		x.free = append(x.free, x.evictTail())
	}
	for len(x.byHash) > x.limit { // the bound was lowered by a reload
		x.free = append(x.free, x.evictTail())
	}
	for k := len(hashes) - 1; k >= 0; k-- {
		h := hashes[k]
		if i, ok := x.byHash[h]; ok {
			x.entries[i].seen = now
			x.moveToFront(i)
			continue
		}
		var i int32
		if len(x.byHash) >= x.limit {
			i = x.evictTail()
		} else if n := len(x.free); n > 0 {
			i, x.free = x.free[n-1], x.free[:n-1]
		} else {
			x.entries = append(x.entries, prefixEntry{})
			i = int32(len(x.entries) - 1)
		}
		x.entries[i] = prefixEntry{hash: h, seen: now, prev: -1, next: -1}
		x.byHash[h] = i
		x.pushFront(i)
	}
}

// evictTail removes the least recently used block and returns its slot.
func (x *prefixIndex) evictTail() int32 {
	i := x.tail
	e := &x.entries[i]
	delete(x.byHash, e.hash)
	x.unlink(i)
	return i
}

func (x *prefixIndex) unlink(i int32) {
	e := &x.entries[i]
	if e.prev >= 0 {
		x.entries[e.prev].next = e.next
	} else {
		x.head = e.next
	}
	if e.next >= 0 {
		x.entries[e.next].prev = e.prev
	} else {
		x.tail = e.prev
	}
	e.prev, e.next = -1, -1
}

func (x *prefixIndex) pushFront(i int32) {
	e := &x.entries[i]
	e.prev, e.next = -1, x.head
	if x.head >= 0 {
		x.entries[x.head].prev = i
	}
	x.head = i
	if x.tail < 0 {
		x.tail = i
	}
}

func (x *prefixIndex) moveToFront(i int32) {
	if x.head == i {
		return
	}
	x.unlink(i)
	x.pushFront(i)
}

// reset forgets everything (the node went down: its server may have
// restarted with an empty cache). The memory is kept for reuse.
func (x *prefixIndex) reset() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(x.byHash) == 0 {
		return
	}
	clear(x.byHash)
	x.entries = x.entries[:0]
	x.free = x.free[:0]
	x.head, x.tail = -1, -1
}

// size returns the blocks held and their memory in bytes (an estimate:
// prefixEntryBytes a block).
func (x *prefixIndex) size() (blocks int, bytes int64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.byHash), int64(len(x.byHash)) * prefixEntryBytes
}
