package simulate

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/kvevents"
)

// The simulator's events, read by kvevents' subscriber, say what its cache
// holds in the keys tollgate computes from a request's token ids (its
// /tokenize): stored prompts
// match, evicted ones stop matching, ClearCache empties it.
func TestGPUPublishesKVEvents(t *testing.T) {
	s, ts := newTS(t, Config{GPU: GPU{PrefixCacheTokens: 800}}) // 50 blocks
	pub, err := s.PublishKVEvents("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	sub := kvevents.Subscribe(kvevents.Options{Endpoint: pub.PubAddr(), Replay: pub.ReplayAddr(), Stale: time.Hour})
	defer sub.Close()
	// A prompt is keyed as tollgate keys it: its token ids from the
	// server's /tokenize, in the events' block size.
	tok, err := kvevents.NewTokenizer(kvevents.TokenizerOptions{URL: ts.URL + "/tokenize", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	held := func(msgs string) int {
		ids, err := tok.Tokenize(context.Background(), "m", func(f string) []byte {
			if f == "messages" {
				return []byte(msgs)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := sub.Match(kvevents.Keys(nil, ids, sub.BlockSize()), time.Now().UnixNano())
		return b
	}
	waitHeld := func(msgs string, want func(int) bool, what string) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			if want(held(msgs)) {
				return
			}
		}
		t.Fatalf("%s: the events report %d blocks", what, held(msgs))
	}
	// A PUB socket drops what it sends before the subscriber has joined:
	// prompts until one is heard (the first heard batch makes the
	// subscriber ask the replay socket for those before it).
	for i := 0; sub.Stats().Batches == 0; i++ {
		if i == 200 {
			t.Fatal("no event heard")
		}
		askGPU(t, ts.URL, turns(fmt.Sprint("warm-up ", i), 1))
		time.Sleep(20 * time.Millisecond)
	}
	a := turns("a", 1) // 1,020 bytes: 15 full blocks
	askGPU(t, ts.URL, a)
	waitHeld(a, func(b int) bool { return b == len(a)/64 }, "a stored")
	// A second turn adds blocks chained to the first turn's.
	a2 := turns("a", 2)
	askGPU(t, ts.URL, a2)
	waitHeld(a2, func(b int) bool { return b == len(a2)/64 }, "a's second turn stored")
	// Other prompts push a out of the 50-block cache: its events say so.
	askGPU(t, ts.URL, turns(strings.Repeat("b", 500), 1))
	askGPU(t, ts.URL, turns(strings.Repeat("c", 500), 1))
	waitHeld(a2, func(b int) bool { return b < len(a2)/64 }, "a evicted")
	if st := s.CacheStats(); st.Blocks > 50 {
		t.Fatalf("%d blocks in a 50-block cache", st.Blocks)
	}
	// Emptied, as a restart does.
	c := turns(strings.Repeat("c", 500), 1)
	waitHeld(c, func(b int) bool { return b > 0 }, "c stored")
	s.ClearCache()
	waitHeld(c, func(b int) bool { return b == 0 }, "the cache cleared")
	// The events' index holds exactly what the cache holds, also when a
	// prompt's insertion evicts its own shallow blocks and stores them
	// again: p's 39 blocks, q's 20 push out p's deepest 9, then p2 (p and
	// 6 blocks more) finds p's first 30 at the back of the LRU list and
	// evicts 15 of them to store its deeper blocks, then stores them again.
	user := func(c string) string { return `[{"role":"user","content":"` + c + `"}]` }
	for _, m := range []string{user(strings.Repeat("p", 2500)), user(strings.Repeat("q", 1250)), user(strings.Repeat("p", 2500) + strings.Repeat("r", 400))} {
		askGPU(t, ts.URL, m)
	}
	want := s.CacheStats().Blocks
	for end := time.Now().Add(5 * time.Second); sub.Stats().Blocks != want && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
	}
	if got := sub.Stats().Blocks; got != want {
		t.Fatalf("the events' index holds %d blocks, the cache %d", got, want)
	}
	if _, err := (&Server{}).PublishKVEvents("tcp://127.0.0.1:0", ""); err == nil {
		t.Fatal("events published without a cache")
	}
}
