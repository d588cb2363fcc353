package kvevents

import (
	"encoding/binary"
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/tollgate/tollgate/internal/chainhash"
)

// BlockTokens is vLLM's default block size (16 tokens), by which the
// index is bounded in blocks (prefix_index_tokens ÷ BlockTokens). Blocks of
// any size are matched: a prompt is keyed in the node's own block size.
const BlockTokens = 16

// entryBytes is what one held block costs: two map entries (node hash ->
// key, key -> node hash) and its place in the arrival queue.
const entryBytes = 72

var keySeed = maphash.MakeSeed()

// rootKey stands for the empty prefix.
const rootKey = 0x6B766576656E7473

// Keys appends to dst the chained keys of the full blocks of blockSize
// tokens of a prompt's token ids (as the node's /tokenize gives them, see
// Tokenizer): block i's key is the key a node's BlockStored gets for a
// block holding tokens i×blockSize … (i+1)×blockSize-1 after the same
// ones, so a node holds block i of the prompt exactly when its index has
// key i. The last partial block is never keyed (nodes cache full blocks).
func Keys(dst []uint64, tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	k := uint64(rootKey)
	for len(tokens) >= blockSize {
		k = chainhash.Next(k, tokenKey(tokens[:blockSize]))
		dst = append(dst, k)
		tokens = tokens[blockSize:]
	}
	return dst
}

// tokenKey is a block's hash by its token ids (4 bytes each,
// little-endian); the block's length is in what is hashed, so blocks of
// different sizes never share a key.
func tokenKey(tokens []uint32) uint64 {
	if len(tokens) <= BlockTokens {
		var b [4 * BlockTokens]byte
		for i, t := range tokens {
			binary.LittleEndian.PutUint32(b[4*i:], t)
		}
		return maphash.Bytes(keySeed, b[:4*len(tokens)])
	}
	var buf [256]byte
	var h maphash.Hash
	h.SetSeed(keySeed)
	for len(tokens) > 0 {
		n := min(len(tokens), len(buf)/4)
		for i, t := range tokens[:n] {
			binary.LittleEndian.PutUint32(buf[4*i:], t)
		}
		h.Write(buf[:4*n])
		tokens = tokens[n:]
	}
	return h.Sum64()
}

// Index is one node's blocks as its events tell them: the node's block
// hash and tollgate's key for each (the chain of its token ids), bounded
// to a number of blocks (the oldest stored go first past it: a missed
// BlockRemoved must not grow it for ever). Safe for concurrent use.
type Index struct {
	mu     sync.Mutex
	byHash map[uint64]uint64 // node's hash -> key
	byKey  map[uint64]uint64 // key -> node's hash
	queue  []uint64          // node's hashes in the order stored (some since removed)
	head   int               // queue[head:] is live
	limit  int
	// blockSize is the block size of the last BlockStored (the node's
	// block_size): prompts are keyed in it.
	blockSize atomic.Int32
}

// NewIndex returns an index of at most limit blocks.
func NewIndex(limit int) *Index {
	return &Index{byHash: map[uint64]uint64{}, byKey: map[uint64]uint64{}, limit: max(limit, 1)}
}

// Apply applies a batch's events in order, then the bound: within a batch
// a node may store blocks before it reports the evictions that made room.
func (x *Index) Apply(events []Event) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for i := range events {
		e := &events[i]
		switch e.Kind {
		case BlockStored:
			x.store(e)
		case BlockRemoved:
			for _, h := range e.Hashes {
				x.remove(h)
			}
		case AllBlocksCleared:
			x.clear()
		}
	}
	x.bound()
}

func (x *Index) store(e *Event) {
	prev := uint64(rootKey)
	if e.HasParent {
		k, ok := x.byHash[e.Parent]
		if !ok {
			return // its prefix is unknown here: no key can be chained
		}
		prev = k
	}
	bs := e.BlockSize
	if bs <= 0 || len(e.Tokens) < bs*len(e.Hashes) {
		return
	}
	if int(x.blockSize.Load()) != bs {
		x.blockSize.Store(int32(bs))
	}
	for i, h := range e.Hashes {
		k := chainhash.Next(prev, tokenKey(e.Tokens[i*bs:(i+1)*bs]))
		if old, ok := x.byHash[h]; ok {
			delete(x.byKey, old)
		} else {
			x.queue = append(x.queue, h)
		}
		x.byHash[h] = k
		x.byKey[k] = h
		prev = k
	}
}

// bound drops the oldest stored blocks past the limit, and compacts the
// queue of stored hashes.
func (x *Index) bound() {
	for len(x.byHash) > x.limit && x.head < len(x.queue) {
		h := x.queue[x.head]
		x.head++
		x.remove(h)
	}
	// The queue keeps removed hashes until they reach its head: compact it
	// when it holds twice the bound.
	if len(x.queue)-x.head > 2*x.limit {
		live := x.queue[:0]
		for _, h := range x.queue[x.head:] {
			if _, ok := x.byHash[h]; ok {
				live = append(live, h)
			}
		}
		x.queue, x.head = live, 0
	}
	if x.head > 4096 && x.head > len(x.queue)/2 {
		x.queue = append(x.queue[:0], x.queue[x.head:]...)
		x.head = 0
	}
}

func (x *Index) remove(h uint64) {
	if k, ok := x.byHash[h]; ok {
		delete(x.byHash, h)
		if x.byKey[k] == h {
			delete(x.byKey, k)
		}
	}
}

func (x *Index) clear() {
	clear(x.byHash)
	clear(x.byKey)
	x.queue, x.head = x.queue[:0], 0
}

// Clear forgets every block (a gap in the events that could not be
// replayed, or a publisher that started again).
func (x *Index) Clear() {
	x.mu.Lock()
	x.clear()
	x.mu.Unlock()
}

// BlockSize is the node's block size in tokens, as its last BlockStored
// said (0: none seen yet).
func (x *Index) BlockSize() int { return int(x.blockSize.Load()) }

// Match returns how many leading blocks of keys (Keys) the node
// holds. A node evicts a prompt's deepest blocks first, so the blocks it
// holds of a prompt are a prefix of it: a binary search finds its end.
func (x *Index) Match(keys []uint64) int {
	if len(keys) == 0 {
		return 0
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	lo, hi := 0, len(keys)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if _, ok := x.byKey[keys[mid]]; ok {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// Size returns the blocks held and an estimate of their memory.
func (x *Index) Size() (blocks int, bytes int64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.byHash), int64(len(x.byHash)) * entryBytes
}
