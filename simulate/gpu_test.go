package simulate

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// turns renders a conversation's messages after n turns (each user
// message about 1,000 bytes: 250 tokens).
func turns(system string, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `[{"role":"system","content":%q}`, system)
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, `,{"role":"user","content":"q%d %s"}`, i, strings.Repeat("x", 1000))
		if i < n-1 {
			fmt.Fprintf(&b, `,{"role":"assistant","content":"a%d %s"}`, i, strings.Repeat("y", 200))
		}
	}
	b.WriteByte(']')
	return b.String()
}

type usageOut struct {
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		Details      *struct {
			Cached int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Timings *struct {
		CacheN  int `json:"cache_n"`
		PromptN int `json:"prompt_n"`
	} `json:"timings"`
}

func askGPU(t *testing.T, url, messages string) (usageOut, time.Duration) {
	t.Helper()
	start := time.Now()
	resp, err := post(t, context.Background(), url, `{"model":"m","messages":`+messages+`}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := readAllBody(t, resp)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d %v: %s", resp.StatusCode, err, body)
	}
	var u usageOut
	if err := json.Unmarshal([]byte(body), &u); err != nil {
		t.Fatal(err)
	}
	return u, time.Since(start)
}

func cachedOf(u usageOut) int {
	if u.Usage.Details == nil {
		return 0
	}
	return u.Usage.Details.Cached
}

func TestGPUPrefixCacheReportsCachedTokensPerFlavour(t *testing.T) {
	for _, fl := range []Flavour{VLLM, SGLang, LlamaCpp} {
		t.Run(string(fl), func(t *testing.T) {
			s, ts := newTS(t, Config{Flavour: fl, GPU: GPU{PrefixCacheTokens: 100_000}})
			u1, _ := askGPU(t, ts.URL, turns("sys", 1))
			if c := cachedOf(u1); c != 0 {
				t.Fatalf("first turn cached %d", c)
			}
			if fl == VLLM && u1.Usage.Details != nil {
				t.Fatal("vLLM reports prompt_tokens_details without a cache hit (it sends null)")
			}
			u2, _ := askGPU(t, ts.URL, turns("sys", 2))
			c := cachedOf(u2)
			// Turn 1's messages but for the closing bracket are turn 2's
			// first bytes: its full 64-byte blocks are cached.
			want := (len(turns("sys", 1)) - 1) / 64 * 16
			if c != want || c%16 != 0 || c >= u2.Usage.PromptTokens {
				t.Fatalf("turn 2 cached %d of %d, want %d", c, u2.Usage.PromptTokens, want)
			}
			if fl == LlamaCpp && (u2.Timings == nil || u2.Timings.CacheN != c || u2.Timings.PromptN != u2.Usage.PromptTokens-c) {
				t.Fatalf("llama.cpp timings %+v", u2.Timings)
			}
			// The same prompt again: all cached but the last block (the last
			// token is always computed).
			u3, _ := askGPU(t, ts.URL, turns("sys", 2))
			if c3 := cachedOf(u3); c3 <= c || c3 >= u3.Usage.PromptTokens {
				t.Fatalf("a repeated prompt cached %d of %d", c3, u3.Usage.PromptTokens)
			}
			st := s.CacheStats()
			if st.Requests != 3 || st.Hits != 2 || st.CachedTokens != int64(c+cachedOf(u3)) {
				t.Fatalf("stats %+v", st)
			}
			// An explicit cached switch wins over the cache.
			u4, _ := askGPU(t, ts.URL, strings.Replace(turns("sys", 2), `"q1 `, `"q1 [sim cached=5] `, 1))
			if cachedOf(u4) != 5 {
				t.Fatalf("cached switch: %d", cachedOf(u4))
			}
		})
	}
}

func TestGPUPrefixCacheEvictsLRU(t *testing.T) {
	_, ts := newTS(t, Config{GPU: GPU{PrefixCacheTokens: 256}}) // 16 blocks: one prompt
	askGPU(t, ts.URL, turns("a", 1))
	askGPU(t, ts.URL, turns("b", 1))
	u, _ := askGPU(t, ts.URL, turns("a", 1))
	if c := cachedOf(u); c != 0 {
		t.Fatalf("a evicted by b, still cached %d", c)
	}
	u, _ = askGPU(t, ts.URL, turns("a", 1))
	if c := cachedOf(u); c == 0 {
		t.Fatal("a just sent, not cached")
	}
}

func TestGPUPrefillTimeFollowsUncachedTokens(t *testing.T) {
	// 2,500 tokens a second: a 300-token prompt takes about 120ms.
	_, ts := newTS(t, Config{GPU: GPU{PrefixCacheTokens: 100_000, PrefillTokensPerSec: 2500}})
	u1, d1 := askGPU(t, ts.URL, turns("sys", 1))
	if min := time.Duration(float64(u1.Usage.PromptTokens)/2500*float64(time.Second)) - 5*time.Millisecond; d1 < min {
		t.Fatalf("uncached prompt of %d tokens answered in %s, want ≥ %s", u1.Usage.PromptTokens, d1, min)
	}
	u2, d2 := askGPU(t, ts.URL, turns("sys", 1))
	if cachedOf(u2) == 0 || d2 > d1/2 {
		t.Fatalf("cached prompt (%d cached) took %s, the first %s", cachedOf(u2), d2, d1)
	}
}

func TestGPUConcurrencyLimitQueues(t *testing.T) {
	s, ts := newTS(t, Config{Behaviour: Behaviour{OutputTokens: 10}, GPU: GPU{MaxConcurrent: 1, DecodeTokensPerSec: 100}})
	// One answer of 10 tokens at 100/s takes 100ms; two at once take 200ms.
	start := time.Now()
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); askGPU(t, ts.URL, turns("c", 1)) }()
	}
	wg.Wait()
	if d := time.Since(start); d < 195*time.Millisecond {
		t.Fatalf("two requests with one slot took %s, want ≥ 200ms", d)
	}
	if st := s.Stats(); st.Completed != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestGPUOffByDefault(t *testing.T) {
	s, ts := newTS(t, Config{})
	askGPU(t, ts.URL, turns("sys", 1))
	u, _ := askGPU(t, ts.URL, turns("sys", 1))
	if cachedOf(u) != 0 || s.CacheStats() != (CacheStats{}) {
		t.Fatalf("no GPU configured, cached %d", cachedOf(u))
	}
}
