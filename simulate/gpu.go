package simulate

import (
	"container/list"
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/kvevents"
)

// GPU makes a simulated server serve like a GPU box (docs/simulator.md
// "GPU timing and prefix cache"): a prefix cache as vLLM's automatic
// prefix caching keeps, a prefill that takes time in proportion to the
// prompt tokens not in the cache and runs one prompt at a time, a decode
// rate, and a limit of requests served at once (more wait their turn).
// The zero value is off: answers take only Behaviour's TTFT and TokenGap.
type GPU struct {
	// PrefixCacheTokens is the prefix cache's capacity in tokens (0: no
	// cache). It holds full blocks of CacheBlockTokens tokens.
	PrefixCacheTokens int
	// PrefillTokensPerSec is the prefill rate of uncached prompt tokens
	// (0: prefill takes no time). Prefills run one after another, as a
	// GPU's compute is shared by the prompts it is reading.
	PrefillTokensPerSec float64
	// DecodeTokensPerSec is each answer's generation rate; it sets the
	// gap between tokens when Behaviour.TokenGap is 0 (0: no gap).
	DecodeTokensPerSec float64
	// MaxConcurrent is how many requests are served at once (vLLM's
	// --max-num-seqs); more wait in arrival order (0: unlimited).
	MaxConcurrent int
}

func (g GPU) on() bool {
	return g.PrefixCacheTokens > 0 || g.PrefillTokensPerSec > 0 || g.DecodeTokensPerSec > 0 || g.MaxConcurrent > 0
}

// CacheBlockTokens is the prefix cache's block: 16 tokens, vLLM's default
// block size. With the simulator's 4 bytes a token, a block is 64 bytes of
// the request's tools array followed by its messages array, as sent (with
// the model's name hashed in before them).
const CacheBlockTokens = 16

const cacheBlockBytes = CacheBlockTokens * 4

// gpu is a server's GPU state.
type gpu struct {
	cfg     GPU
	slots   chan struct{} // nil: unlimited
	prefill sync.Mutex    // one prefill at a time

	mu     sync.Mutex
	blocks map[uint64]*list.Element // of uint64 hashes
	lru    *list.List               // front: most recently used
	limit  int                      // blocks

	hits, lookups, cachedTokens, promptTokens int64

	waiting atomic.Int64 // requests waiting for a slot (metrics.go)

	// events, when set, publishes the cache's changes as vLLM's KV-cache
	// events (kvevents.go); sent under mu, so in the order they happen.
	events *kvevents.Publisher
}

var cacheSeed = maphash.MakeSeed()

func newGPU(cfg GPU) *gpu {
	if !cfg.on() {
		return nil
	}
	g := &gpu{cfg: cfg, blocks: map[uint64]*list.Element{}, lru: list.New(), limit: cfg.PrefixCacheTokens / CacheBlockTokens}
	if cfg.MaxConcurrent > 0 {
		g.slots = make(chan struct{}, cfg.MaxConcurrent)
	}
	return g
}

// CacheStats is what a simulated GPU's prefix cache has served.
type CacheStats struct {
	Requests     int64 // chat requests that reached the GPU
	Hits         int64 // requests with at least one cached block
	PromptTokens int64 // their prompt tokens
	CachedTokens int64 // of which served from the cache
	Blocks       int   // blocks held now
}

// CacheStats reports the prefix cache's counters (zero with GPU off).
func (s *Server) CacheStats() CacheStats {
	g := s.gpu
	if g == nil {
		return CacheStats{}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return CacheStats{Requests: g.lookups, Hits: g.hits, PromptTokens: g.promptTokens, CachedTokens: g.cachedTokens, Blocks: len(g.blocks)}
}

// blockHashes returns the chained hashes of the full 64-byte blocks of
// model's prompt (as chatRequest.prompt renders it).
func blockHashes(model string, prompt []byte) []uint64 {
	h := maphash.String(cacheSeed, model)
	out := make([]uint64, 0, len(prompt)/cacheBlockBytes)
	var prev [8]byte
	for len(prompt) >= cacheBlockBytes {
		var hh maphash.Hash
		hh.SetSeed(cacheSeed)
		for i := range prev {
			prev[i] = byte(h >> (8 * i))
		}
		hh.Write(prev[:])
		hh.Write(prompt[:cacheBlockBytes])
		h = hh.Sum64()
		out = append(out, h)
		prompt = prompt[cacheBlockBytes:]
	}
	return out
}

// prompt is the request's prompt as the simulated template renders it: the
// tools array, then the messages array, as sent.
func (r *chatRequest) prompt() []byte {
	if len(r.toolsRaw) == 0 {
		return r.messagesRaw
	}
	return append(append(make([]byte, 0, len(r.toolsRaw)+len(r.messagesRaw)), r.toolsRaw...), r.messagesRaw...)
}

// lookupAndInsert returns how many tokens of the prompt the cache holds
// and then caches the prompt's full blocks. As in vLLM, the last prompt
// token is always computed, so a prompt all in cache reports one block less.
func (g *gpu) lookupAndInsert(req *chatRequest) int {
	if g.limit == 0 {
		g.mu.Lock()
		g.lookups++
		g.promptTokens += int64(req.promptTokens)
		g.mu.Unlock()
		return 0
	}
	prompt := req.prompt() // rendered once: the events carry its token ids
	hashes := blockHashes(req.model, prompt)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lookups++
	hit := 0
	for hit < len(hashes) {
		if _, ok := g.blocks[hashes[hit]]; !ok {
			break
		}
		hit++
	}
	cached := hit * CacheBlockTokens
	for cached > 0 && cached >= req.promptTokens {
		cached -= CacheBlockTokens
	}
	// Touch the deepest block first, so the first blocks (shared by more
	// prompts) are evicted last.
	var stored []bool // blocks stored now, for the events
	var removed []uint64
	if g.events != nil {
		stored = make([]bool, len(hashes))
	}
	for i := len(hashes) - 1; i >= 0; i-- {
		if e, ok := g.blocks[hashes[i]]; ok {
			g.lru.MoveToFront(e)
			continue
		}
		if len(g.blocks) >= g.limit {
			old := g.lru.Back()
			delete(g.blocks, old.Value.(uint64))
			g.lru.Remove(old)
			if stored != nil {
				removed = append(removed, old.Value.(uint64))
			}
		}
		g.blocks[hashes[i]] = g.lru.PushFront(hashes[i])
		if stored != nil {
			stored[i] = true
		}
	}
	if g.events != nil {
		g.publish(prompt, hashes, stored, removed)
	}
	if cached > 0 {
		g.hits++
	}
	g.promptTokens += int64(req.promptTokens)
	g.cachedTokens += int64(cached)
	return cached
}

// admit waits for a slot and runs the prefill: it sets p.cached from the
// cache (unless the cached switch was given or there is no cache) and the decode gap, and returns the slot's
// release. ok is false when the client went away while waiting.
func (g *gpu) admit(ctx context.Context, req *chatRequest, p *plan, beh *Behaviour, cachedSwitch bool) (release func(), ok bool) {
	release = func() {}
	if g.slots != nil {
		g.waiting.Add(1)
		select {
		case g.slots <- struct{}{}:
			g.waiting.Add(-1)
			release = func() { <-g.slots }
		case <-ctx.Done():
			g.waiting.Add(-1)
			return release, false
		}
	}
	cached := g.lookupAndInsert(req)
	if !cachedSwitch && g.limit > 0 {
		p.cached = min(cached, p.prompt)
	}
	if g.cfg.PrefillTokensPerSec > 0 {
		uncached := p.prompt - p.cached
		d := time.Duration(float64(uncached) / g.cfg.PrefillTokensPerSec * float64(time.Second))
		g.prefill.Lock()
		ok := sleep(ctx, d)
		g.prefill.Unlock()
		if !ok {
			return release, false
		}
	}
	if beh.TokenGap == 0 && g.cfg.DecodeTokensPerSec > 0 {
		beh.TokenGap = time.Duration(float64(time.Second) / g.cfg.DecodeTokensPerSec)
	}
	return release, true
}
