package relay

import (
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/openai"
	"github.com/tollgate/tollgate/routing"
	"github.com/tollgate/tollgate/simulate"
)

// load_poll reads a vLLM or SGLang node's /metrics through the node's own
// client, from the catalogue; other flavours are not polled, and a reload
// that drops the setting makes a new node without a poller.
func TestLoadPollFromTheCatalogue(t *testing.T) {
	var nodes []NodeSpec
	for _, f := range []openai.Flavour{openai.VLLM, openai.SGLang, openai.LlamaCpp} {
		s, err := simulate.Start(simulate.Config{Flavour: simulate.Flavour(f), Models: []string{"m-up"}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		nodes = append(nodes, NodeSpec{Name: string(f), URL: s.URL() + "/v1", Flavour: f})
	}
	spec := func(poll time.Duration) CatalogSpec {
		return CatalogSpec{Models: []ModelSpec{{ID: "m", Backends: []BackendSpec{{Class: tollgate.ClassNetwork, UpstreamModel: "m-up",
			Routing: routing.PrefixCache, LoadPoll: poll, Nodes: nodes}}}}}
	}
	r := &Relay{dialer: &net.Dialer{}, log: slog.New(slog.DiscardHandler), now: time.Now}
	cat := NewCatalog(spec(10*time.Millisecond), nil)
	r.startPolls(cat)
	r.catalog.Store(cat)
	defer r.Close()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got := map[string]int64{}
		for _, st := range r.NodeStats() {
			if st.Polled {
				got[st.Name] = st.Reported
			}
		}
		if len(got) == 2 && got["vllm"] == 0 && got["sglang"] == 0 {
			if _, ok := got["llamacpp"]; ok {
				t.Fatal("a llama.cpp node was polled")
			}
			break
		}
		if time.Now().After(end) {
			t.Fatalf("polled nodes and their reports: %v; want vllm and sglang reporting 0", got)
		}
	}
	// Reloaded without load_poll: new nodes, not polled.
	r.SetCatalog(NewCatalog(spec(0), cat))
	for _, st := range r.NodeStats() {
		if st.Polled {
			t.Fatalf("%s still polled after load_poll was turned off", st.Name)
		}
	}
}
