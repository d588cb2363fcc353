package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
)

// turnResult is what one request through tollgate reports.
type turnResult struct {
	node   string
	prompt int
	cached int
}

func sendTurn(t *testing.T, g *gpuGateway, body string) turnResult {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, g.main.APIURL()+"/chat/completions", strings.NewReader(strings.Replace(body, `"stream":true,"stream_options":{"include_usage":true},`, "", 1)))
	req.Header.Set("Authorization", "Bearer "+g.secret)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	var out struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
			Details      *struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	r := turnResult{node: resp.Header.Get("X-Tollgate-Node"), prompt: out.Usage.PromptTokens}
	if out.Usage.Details != nil {
		r.cached = out.Usage.Details.Cached
	}
	return r
}

// TestPrefixRoutingThroughTollgate: over real HTTP to simulated GPU nodes
// with prefix caches, a conversation's turns stay on one node and are
// served from its cache; when that node stops answering they move to
// another and stay there.
func TestPrefixRoutingThroughTollgate(t *testing.T) {
	ctx := context.Background()
	g, err := startGPUGateway(ctx, workloadOpts{nodes: 3, tokens: 4, slots: 8, cacheTokens: 100_000, margin: 2}, config.RoutingPrefixCache)
	if err != nil {
		t.Fatal(err)
	}
	defer g.close()
	rng := rand.New(rand.NewPCG(1, 2))
	conv := newConversation("multiturn", rng, 0, 0)
	conv.turns = 8
	var home string
	for i := 0; i < 4 && conv.next(); i++ {
		r := sendTurn(t, g, conv.body())
		if i == 0 {
			home = r.node
			continue
		}
		if r.node != home {
			t.Fatalf("turn %d on %s, the earlier turns on %s", i+1, r.node, home)
		}
		if r.cached == 0 || r.cached*2 < r.prompt {
			t.Fatalf("turn %d: %d of %d prompt tokens cached", i+1, r.cached, r.prompt)
		}
	}
	// The home node refuses connections: the next turn goes elsewhere (a
	// cache miss but for the shared system prompt), and the turns after
	// it stay there.
	var down int
	for i := range g.sims {
		if fmt.Sprint("gpu", i) == home {
			down = i
		}
	}
	if err := g.sims[down].RefuseConnections(true); err != nil {
		t.Fatal(err)
	}
	conv.next()
	moved := sendTurn(t, g, conv.body())
	if moved.node == home || moved.node == "" {
		t.Fatalf("turn 5 on %q with its node down", moved.node)
	}
	for i := 0; i < 2 && conv.next(); i++ {
		if r := sendTurn(t, g, conv.body()); r.node != moved.node || r.cached*2 < r.prompt {
			t.Fatalf("after the move: on %s (moved to %s), %d of %d cached", r.node, moved.node, r.cached, r.prompt)
		}
	}
	st := g.main.Relay.PrefixStats()
	if st.Hits < 5 || st.Requests != 7 || st.IndexBlocks == 0 {
		t.Fatalf("prefix stats %+v", st)
	}
}

// TestPrefixRoutingSpreadsUnrelatedThroughTollgate: prompts that share
// nothing spread over the nodes.
func TestPrefixRoutingSpreadsUnrelatedThroughTollgate(t *testing.T) {
	ctx := context.Background()
	g, err := startGPUGateway(ctx, workloadOpts{nodes: 4, tokens: 4, slots: 8, cacheTokens: 100_000, margin: 2}, config.RoutingPrefixCache)
	if err != nil {
		t.Fatal(err)
	}
	defer g.close()
	rng := rand.New(rand.NewPCG(3, 4))
	per := map[string]int{}
	deadline := time.Now().Add(30 * time.Second)
	const prompts = 100
	for k := 0; k < prompts && time.Now().Before(deadline); k++ {
		c := newConversation("unrelated", rng, 0, k)
		c.next()
		per[sendTurn(t, g, c.body()).node]++
	}
	if len(per) != 4 {
		t.Fatalf("unrelated prompts on %d nodes: %v", len(per), per)
	}
	// One at a time (no load to balance), each prompt goes to its home by
	// rendezvous hashing of the node URLs, whose ports differ run to run:
	// spread as hashing spreads, not in strict turn. 40 of 100 is 3.5
	// standard deviations above the fair 25, so a fair hash passes all but
	// about one run in a thousand, and a pile-up on one node fails.
	for n, c := range per {
		if c > 40 {
			t.Fatalf("node %s took %d of %d unrelated prompts: %v", n, c, prompts, per)
		}
	}
}
