package relay

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
)

const reloadYAML = `
listen: {api: "127.0.0.1:0"}
store: {sqlite: data/t.db}
models:
  - id: m
    kind: chat
    context_length: 1000
    max_output_tokens: 100
    backends:
      - class: network
        upstream_model: up
        rates: {input: "0.15", output: "0.6"}
        nodes: [{url: "http://10.0.0.1:8000/v1", max_concurrent: MAXC}]
`

// A config reload (SIGHUP) runs while requests use the nodes: building the
// new catalogue must not write to a node that requests are reading.
func TestReloadDoesNotWriteNodesInUse(t *testing.T) {
	parse := func(maxc string) *config.Config {
		cfg, err := config.Parse([]byte(strings.ReplaceAll(reloadYAML, "MAXC", maxc)), ".", func(string) string { return "" })
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	same, changed := parse("4"), parse("8")
	cat := NewCatalog(same, nil)
	if got := cat.Models[0].ImageTokens; got != DefaultImageTokens {
		t.Fatalf("image_tokens of a model that does not set it: %d, want %d", got, DefaultImageTokens)
	}
	n := cat.Models[0].Backends[0].Nodes[0]
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 200; i++ {
			if n.tryAcquire() {
				_ = n.Flavour
				_ = n.HealthURL
				n.release()
			}
		}
	}()
	for i := 0; i < 50; i++ {
		NewCatalog(same, cat)
		NewCatalog(changed, cat)
	}
	wg.Wait()
	if got := NewCatalog(changed, cat).Models[0].Backends[0].Nodes[0].MaxConcurrent; got != 8 {
		t.Fatalf("reloaded max_concurrent = %d, want 8", got)
	}
	if NewCatalog(same, cat).Models[0].Backends[0].Nodes[0] != n {
		t.Fatal("a reload with the same settings must keep the node (health, in-flight count)")
	}
}

// Requests on one node succeed and fail while probes report on it: the
// health and outlier bookkeeping is shared by them (run with -race).
func TestNodeHealthReportsConcurrently(t *testing.T) {
	n := &Node{Name: "n"}
	p := HealthPolicy{FailureThreshold: 1000, BackoffMin: time.Second, BackoffMax: time.Minute}
	p.setDefaults()
	p.MinRequests = 1000000 // count, never eject: the window and counters are what is exercised
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				switch g {
				case 0:
					n.reportReachable()
				case 1:
					n.reportUnreachable(p, false, time.Now())
				case 2:
					n.requestOK(&p, time.Now())
				default:
					n.requestFailed(&p, nil, time.Now())
				}
			}
		}()
	}
	wg.Wait()
	if total, failed := n.windowCounts(&p, time.Now()); total != 400 || failed != 200 {
		t.Fatalf("window: %d requests, %d failed; want 400, 200", total, failed)
	}
}
