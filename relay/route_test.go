package relay

import (
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/openai"

	"github.com/tollgate/tollgate"
)

func testModel(nodes ...*Node) (*Model, []*Backend) {
	m := &Model{ID: "m"}
	net := &Backend{Model: m, Class: tollgate.ClassNetwork, Caps: tollgate.NewCapabilities(tollgate.CapTools)}
	fb := &Backend{Model: m, Class: tollgate.ClassFallback, Caps: tollgate.NewCapabilities(tollgate.CapTools, tollgate.CapReasoning)}
	for _, n := range nodes {
		if n.Class == tollgate.ClassFallback {
			fb.Nodes = append(fb.Nodes, n)
		} else {
			net.Nodes = append(net.Nodes, n)
		}
	}
	m.Backends = []*Backend{net, fb}
	m.Caps = net.Caps | fb.Caps
	return m, m.Backends
}

func TestRouteLeastOutstandingThenFallback(t *testing.T) {
	a := &Node{Name: "a", Class: tollgate.ClassNetwork, MaxConcurrent: 2}
	b := &Node{Name: "b", Class: tollgate.ClassNetwork, MaxConcurrent: 2}
	f := &Node{Name: "f", Class: tollgate.ClassFallback}
	m, able := testModel(a, b, f)
	var p picker
	var got []string
	for i := 0; i < 5; i++ {
		_, n, err := p.route(m, able, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, n.Name)
	}
	// Four network slots, spread evenly, then the fallback.
	if a.Inflight() != 2 || b.Inflight() != 2 || got[4] != "f" {
		t.Fatalf("picks %v, inflight a=%d b=%d", got, a.Inflight(), b.Inflight())
	}
	a.release()
	if _, n, _ := p.route(m, able, nil, nil); n != a {
		t.Fatalf("freed slot on a not used: %s", n.Name)
	}
	f.MaxConcurrent = 1
	if _, _, err := p.route(m, able, nil, nil); tollgate.ErrorCode(err) != tollgate.CodeBackendUnavailable {
		t.Fatalf("all full: %v", err)
	}
}

func TestRouteNeverExceedsCapacityUnderConcurrency(t *testing.T) {
	a := &Node{Name: "a", Class: tollgate.ClassNetwork, MaxConcurrent: 3}
	b := &Node{Name: "b", Class: tollgate.ClassNetwork, MaxConcurrent: 5}
	m, able := testModel(a, b)
	var p picker
	var wg sync.WaitGroup
	var mu sync.Mutex
	served := 0
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := p.route(m, able, nil, nil); err == nil {
				mu.Lock()
				served++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if served != 8 || a.Inflight() != 3 || b.Inflight() != 5 {
		t.Fatalf("served %d, inflight a=%d b=%d; want exactly the 8 slots", served, a.Inflight(), b.Inflight())
	}
}

func TestCapabilityChecks(t *testing.T) {
	m, _ := testModel(&Node{Class: tollgate.ClassNetwork}, &Node{Class: tollgate.ClassFallback})
	param := func(c tollgate.Capability) string { return "field-" + string(c) }
	if _, err := checkCapabilities(m, tollgate.NewCapabilities(tollgate.CapImageInput), param); tollgate.ErrorCode(err) != tollgate.CodeCapabilityNotSupported {
		t.Fatalf("image: %v", err)
	} else if err.(*tollgate.Error).Param != "field-image_input" {
		t.Fatalf("param = %q", err.(*tollgate.Error).Param)
	}
	able, err := checkCapabilities(m, tollgate.NewCapabilities(tollgate.CapTools, tollgate.CapReasoning), param)
	if err != nil || len(able) != 1 || able[0].Class != tollgate.ClassFallback {
		t.Fatalf("tools+reasoning: %v %v", able, err)
	}
	m.Backends[1].Caps = tollgate.NewCapabilities(tollgate.CapReasoning)
	if _, err := checkCapabilities(m, tollgate.NewCapabilities(tollgate.CapTools, tollgate.CapReasoning), param); tollgate.ErrorCode(err) != tollgate.CodeCapabilityCombinationUnsupported {
		t.Fatalf("split capabilities: %v", err)
	}
}

// Probes (and a refused connection) take a node down and bring it back.
func TestProbeHealthThresholdAndBackoff(t *testing.T) {
	n := &Node{Name: "a", Class: tollgate.ClassNetwork}
	p := HealthPolicy{FailureThreshold: 3, BackoffMin: time.Second, BackoffMax: 4 * time.Second}
	now := time.Unix(1000, 0)
	n.reportUnreachable(p, false, now)
	n.reportUnreachable(p, false, now)
	if !n.Healthy() {
		t.Fatal("down before the threshold")
	}
	n.reportUnreachable(p, false, now)
	if n.Healthy() || n.probeDue(now) || !n.probeDue(now.Add(time.Second)) {
		t.Fatal("threshold: want down with a 1s backoff")
	}
	n.probeFailed(p, now.Add(time.Second))
	if n.probeDue(now.Add(2*time.Second)) || !n.probeDue(now.Add(3*time.Second)) {
		t.Fatal("failed probe: want the backoff doubled to 2s")
	}
	for i := 0; i < 5; i++ {
		n.probeFailed(p, now)
	}
	if n.probeDue(now.Add(3*time.Second)) || !n.probeDue(now.Add(4*time.Second)) {
		t.Fatal("backoff not capped at 4s")
	}
	n.reportReachable()
	if !n.Healthy() {
		t.Fatal("success did not bring the node back")
	}
	n.reportUnreachable(p, true, now)
	if n.Healthy() {
		t.Fatal("an immediate failure (connection refused) must take the node down at once")
	}
}

// The hold counts every image as the model's image_tokens (the catalogue
// puts 2,000 there unless the config says), never above the context.
func TestPromptBoundCountsImagesAtTheModelsFigure(t *testing.T) {
	cr, err := openai.ParseChatRequest([]byte(`{"model":"m","messages":[{"role":"user","content":[` +
		`{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"https://x/a.png"}},` +
		`{"type":"image_url","image_url":{"url":"https://x/b.png"}}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if cr.Images != 2 {
		t.Fatalf("images = %d", cr.Images)
	}
	base := cr.PromptBytes + 64
	for _, c := range []struct {
		imageTokens, context, want int64
	}{
		{DefaultImageTokens, 1 << 20, base + 2*DefaultImageTokens},
		{16384, 1 << 20, base + 2*16384},
		{16384, 20000, 20000}, // never above the context
	} {
		m := &Model{ContextLength: c.context, ImageTokens: c.imageTokens}
		if got := promptBound(cr, m); got != c.want {
			t.Errorf("image_tokens %d, context %d: bound %d, want %d", c.imageTokens, c.context, got, c.want)
		}
	}
}
