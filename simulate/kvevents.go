package simulate

import (
	"errors"
	"strings"

	"github.com/tollgate/tollgate/kvevents"
)

// PublishKVEvents makes the server's prefix cache publish its changes as
// vLLM does when started with --kv-events-config (publisher zmq): a
// BlockStored for the blocks a prompt added (token ids: the prompt's
// bytes 4 at a time, little-endian, the simulator's tokenizer, as its
// /tokenize answers them), a
// BlockRemoved for the blocks it evicted, AllBlocksCleared when ClearCache
// empties it; numbered batches on a PUB socket at endpoint, and a ROUTER
// socket at replay ("" : none) that replays the last 10,000. Addresses are
// tcp://host:port (port 0 picks one; "*" listens on every interface, as
// vLLM's default tcp://*:5557). Close the publisher to stop.
func (s *Server) PublishKVEvents(endpoint, replay string) (*kvevents.Publisher, error) {
	g := s.gpu
	if g == nil || g.limit == 0 {
		return nil, errors.New("simulate: KV-cache events need a prefix cache (GPU.PrefixCacheTokens)")
	}
	star := func(e string) string { return strings.Replace(e, "tcp://*:", "tcp://0.0.0.0:", 1) }
	p, err := kvevents.Publish(kvevents.PublisherOptions{Endpoint: star(endpoint), Replay: star(replay)})
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	g.events = p
	g.mu.Unlock()
	return p, nil
}

// ClearCache empties the prefix cache, as a restart does (or vLLM's
// /reset_prefix_cache), and publishes AllBlocksCleared.
func (s *Server) ClearCache() {
	g := s.gpu
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	clear(g.blocks)
	g.lru.Init()
	if g.events != nil {
		g.events.Send(kvevents.Event{Kind: kvevents.AllBlocksCleared})
	}
}

// publish sends the events of one prompt's insertion (under g.mu): a
// BlockStored for each run of blocks stored now, chained to the block
// before it, then the evicted blocks.
func (g *gpu) publish(prompt []byte, hashes []uint64, stored []bool, removed []uint64) {
	var events []kvevents.Event
	for i := 0; i < len(hashes); {
		if !stored[i] {
			i++
			continue
		}
		j := i
		for j < len(hashes) && stored[j] {
			j++
		}
		e := kvevents.Event{Kind: kvevents.BlockStored, Hashes: hashes[i:j], BlockSize: CacheBlockTokens,
			Tokens: bytesTokenIDs(prompt[i*cacheBlockBytes : j*cacheBlockBytes])}
		if i > 0 {
			e.Parent, e.HasParent = hashes[i-1], true
		}
		events = append(events, e)
		i = j
	}
	// A block evicted while the prompt's deeper blocks were inserted may
	// have been inserted again (it is the prompt's own): only the blocks
	// absent now are removed, after the stores.
	gone := removed[:0]
	for _, h := range removed {
		if _, ok := g.blocks[h]; !ok {
			gone = append(gone, h)
		}
	}
	if len(gone) > 0 {
		events = append(events, kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: gone})
	}
	if len(events) > 0 {
		g.events.Send(events...)
	}
}
