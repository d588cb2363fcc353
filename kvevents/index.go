package kvevents

import (
	"encoding/binary"
	"hash/maphash"
	"sync"

	"github.com/tollgate/tollgate/internal/chainhash"
)

// BlockTokens is the block size the index matches: vLLM's default of 16
// tokens. Blocks of another size are held but never match a prompt.
const BlockTokens = 16

// BlockBytes is one block of PromptKeys: 16 tokens of 4 bytes.
const BlockBytes = BlockTokens * 4

// entryBytes is what one held block costs: two map entries (node hash ->
// key, key -> node hash) and its place in the arrival queue.
const entryBytes = 72

var keySeed = maphash.MakeSeed()

// rootKey stands for the empty prefix.
const rootKey = 0x6B766576656E7473

// PromptKeys appends to dst the chained keys of the full 64-byte blocks of
// a prompt given as the bytes of its tools then its messages: the key a
// block stored by a node gets when its token ids are those bytes read 4 at
// a time, little-endian (the simulator's tokenizer; a real model's token
// ids are not, so a real vLLM's blocks never match: see docs/config.md).
func PromptKeys(dst []uint64, tools, messages []byte) []uint64 {
	var buf [BlockBytes]byte
	k := uint64(rootKey)
	n := 0 // bytes in buf
	for _, part := range [2][]byte{tools, messages} {
		for len(part) > 0 {
			if n == 0 && len(part) >= BlockBytes {
				k = chainhash.Next(k, maphash.Bytes(keySeed, part[:BlockBytes]))
				dst = append(dst, k)
				part = part[BlockBytes:]
				continue
			}
			c := copy(buf[n:], part)
			n += c
			part = part[c:]
			if n == BlockBytes {
				k = chainhash.Next(k, maphash.Bytes(keySeed, buf[:]))
				dst = append(dst, k)
				n = 0
			}
		}
	}
	return dst
}

// tokenKey is a block's hash by its token ids, as PromptKeys hashes bytes.
func tokenKey(tokens []uint32) uint64 {
	var buf [BlockBytes]byte
	if len(tokens) != BlockTokens {
		var h maphash.Hash
		h.SetSeed(keySeed)
		for _, t := range tokens {
			binary.LittleEndian.PutUint32(buf[:4], t)
			h.Write(buf[:4])
		}
		return h.Sum64() ^ uint64(len(tokens)) // never a 16-token block's hash
	}
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(buf[4*i:], t)
	}
	return maphash.Bytes(keySeed, buf[:])
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

// Match returns how many leading blocks of keys (PromptKeys) the node
// holds. A node evicts a prompt's deepest blocks first, so the blocks it
// holds of a prompt are a prefix of it: a binary search finds its end.
func (x *Index) Match(keys []uint64) int {
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
