package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/openai"
	"github.com/tollgate/tollgate/relay"
	"github.com/tollgate/tollgate/routing"
	"github.com/tollgate/tollgate/search"
	"github.com/tollgate/tollgate/tracing"
)

const fromConfigYAML = `
listen: {api: "127.0.0.1:0"}
store: {sqlite: ":memory:"}
models:
  - {id: m, kind: chat, context_length: 100, max_output_tokens: 10,
     backends: [{class: network, upstream_model: u, capabilities: [tools], rates: {input: "0", output: "0"}, nodes: [{url: "http://10.0.0.1:8000/v1"}]}]}
`

// parseConfig parses fromConfigYAML plus section; the variable BK holds "key".
func parseConfig(t *testing.T, doc string) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(doc), ".", func(k string) string {
		return map[string]string{"BK": "key", "FK": "fallback-key", "TH": "api-key=s3cr%20t, team = ops"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNewSearchFromConfig(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		fmt.Fprint(w, `{"results": [{"url": "https://a.example/", "title": "A", "content": "a"}]}`)
	}))
	defer srv.Close()
	if s, err := newSearch(&parseConfig(t, fromConfigYAML).Search, nil); s != nil || err != nil {
		t.Fatalf("search off: %v, %v; want nil, nil", s, err)
	}
	c := parseConfig(t, fromConfigYAML+fmt.Sprintf("search: {provider: searxng, url: %q, cache_ttl: \"off\"}\n", srv.URL))
	s, err := newSearch(&c.Search, nil)
	if err != nil || s.ProviderName() != "searxng" {
		t.Fatalf("searxng: %v, %v", s, err)
	}
	for range 2 {
		if res, err := s.Search(context.Background(), search.Query{Text: "q"}); err != nil || len(res) != 1 {
			t.Fatalf("search: %v, %v", res, err)
		}
	}
	if calls.Load() != 2 {
		t.Errorf("cache_ttl off: %d provider calls, want 2", calls.Load())
	}
	c = parseConfig(t, fromConfigYAML+"search: {provider: brave, api_key_env: BK}\n")
	if s, err := newSearch(&c.Search, nil); err != nil || s.ProviderName() != "brave" || !s.SupportsLocation() {
		t.Fatalf("brave: %v, %v", s, err)
	}
}

// The catalogue gets the config's values with its defaults applied: prefix
// cache routing with a margin of 6, vLLM nodes named after their URL, a
// fallback as one node with its key, and web search where search is on.
func TestCatalogSpecFromConfig(t *testing.T) {
	for name, pair := range map[string][2]string{
		"prefix_cache":      {config.RoutingPrefixCache, routing.PrefixCache},
		"least_outstanding": {config.RoutingLeastOutstanding, routing.LeastOutstanding},
		"round_robin":       {config.RoutingRoundRobin, routing.RoundRobin},
	} {
		if pair[0] != name || pair[1] != name {
			t.Errorf("routing %s is %q in config and %q in relay", name, pair[0], pair[1])
		}
	}
	doc := `
listen: {api: "127.0.0.1:0"}
store: {sqlite: ":memory:"}
search: {provider: brave, api_key_env: BK, price: "0.004"}
models:
  - id: chat
    kind: chat
    context_length: 1000
    max_output_tokens: 100
    image_tokens: 400
    backends:
      - class: network
        upstream_model: up
        capabilities: [tools, image_input]
        rates: {input: "0.15", output: "0.6"}
        nodes: [{url: "http://10.0.0.1:8000/v1", kv_events: "tcp://10.0.0.1:5557", kv_events_replay: "tcp://10.0.0.1:5558"}, {name: b, url: "http://10.0.0.2:8000/v1/", flavour: ollama, max_concurrent: 4, key_env: BK}]
      - class: fallback
        upstream_model: gpt
        url: "https://api.example/v1"
        key_env: FK
        rates: {input: "2", output: "8"}
  - id: plain
    kind: cheap
    context_length: 1000
    max_output_tokens: 100
    search_price: "0.001"
    backends:
      - class: network
        upstream_model: up
        routing: least_outstanding
        prefix_margin: 2
        prefix_index_tokens: 5000
        prefix_ttl: 1m
        rates: {input: "0", output: "0"}
        nodes: [{name: c, url: "http://10.0.0.3:8000/v1", health_url: "http://10.0.0.3:9000/ready"}]
`
	spec := catalogSpec(parseConfig(t, doc))
	if !spec.WebSearch || len(spec.Models) != 2 {
		t.Fatalf("spec = %+v", spec)
	}
	chat, plain := spec.Models[0], spec.Models[1]
	if chat.ID != "chat" || chat.Kind != tollgate.KindChat || chat.ContextLength != 1000 || chat.MaxOutputTokens != 100 || chat.ImageTokens != 400 ||
		chat.SearchPrice != tollgate.MustParseAmount("0.004") || plain.SearchPrice != tollgate.MustParseAmount("0.001") || len(chat.Backends) != 2 {
		t.Errorf("chat = %+v, plain = %+v", chat, plain)
	}
	net, fb := chat.Backends[0], chat.Backends[1]
	if net.Class != tollgate.ClassNetwork || net.UpstreamModel != "up" || net.Caps != tollgate.NewCapabilities(tollgate.CapTools, tollgate.CapImageInput) ||
		net.Prices != (tollgate.Prices{Input: tollgate.MustParseRate("0.15"), Output: tollgate.MustParseRate("0.6")}) ||
		net.Routing != routing.PrefixCache || len(net.Nodes) != 2 ||
		// a node with kv_events: its load is polled, with load_poll's margin
		net.LoadPoll != 100*time.Millisecond || net.PrefixMargin != 8 {
		t.Errorf("network backend = %+v", net)
	}
	if n := net.Nodes[0]; !strings.HasPrefix(n.Name, "node-") || n.URL != "http://10.0.0.1:8000/v1" || n.Flavour != openai.VLLM || n.Key != "" || n.MaxConcurrent != 0 ||
		n.KVEvents != "tcp://10.0.0.1:5557" || n.KVEventsReplay != "tcp://10.0.0.1:5558" {
		t.Errorf("unnamed node = %+v", n)
	}
	if n := net.Nodes[1]; n.Name != "b" || n.Flavour != openai.Ollama || n.MaxConcurrent != 4 || n.Key != "key" {
		t.Errorf("node b = %+v", n)
	}
	if fb.Class != tollgate.ClassFallback || fb.UpstreamModel != "gpt" || fb.Routing != "" || len(fb.Nodes) != 1 ||
		fb.Nodes[0] != (relay.NodeSpec{Name: "fallback", URL: "https://api.example/v1", Key: "fallback-key", Flavour: openai.OpenAI}) {
		t.Errorf("fallback = %+v", fb)
	}
	pb := plain.Backends[0]
	if pb.Routing != routing.LeastOutstanding || pb.PrefixMargin != 2 || pb.PrefixIndexTokens != 5000 || pb.PrefixTTL != time.Minute ||
		pb.Nodes[0].HealthURL != "http://10.0.0.3:9000/ready" {
		t.Errorf("plain's backend = %+v", pb)
	}

	// Built: web search joins the backends that call tools, only those.
	cat := relay.NewCatalog(spec, nil)
	m, _ := cat.Lookup("chat")
	if !m.Backends[0].Caps.Has(tollgate.CapWebSearch) || m.Backends[1].Caps.Has(tollgate.CapWebSearch) || !m.Caps.Has(tollgate.CapWebSearch) {
		t.Errorf("web search on %v and %v", m.Backends[0].Caps.Strings(), m.Backends[1].Caps.Strings())
	}
	if m.Backends[0].Nodes[1].BaseURL != "http://10.0.0.2:8000/v1" || m.Backends[0].Nodes[1].HealthURL != "http://10.0.0.2:8000/" {
		t.Errorf("node b: base %q, health %q", m.Backends[0].Nodes[1].BaseURL, m.Backends[0].Nodes[1].HealthURL)
	}
	// Search off: no backend offers it.
	off := relay.NewCatalog(catalogSpec(parseConfig(t, fromConfigYAML)), nil)
	if mm, _ := off.Lookup("m"); mm.Caps.Has(tollgate.CapWebSearch) {
		t.Error("web search offered without a search provider")
	}
}

func TestTracingOptionsFromConfig(t *testing.T) {
	o := tracingOptions(&parseConfig(t, fromConfigYAML).Tracing)
	if o.Endpoint != "" {
		t.Fatalf("tracing without an endpoint: %+v", o)
	}
	if p, err := tracing.New(o, "v"); p != nil || err != nil {
		t.Fatalf("tracing off: %v, %v; want nil, nil", p, err)
	}
	c := parseConfig(t, fromConfigYAML+"tracing: {endpoint: \"http://127.0.0.1:1/v1/traces\", headers_env: TH}\n")
	o = tracingOptions(&c.Tracing)
	if o.Endpoint != "http://127.0.0.1:1/v1/traces" || o.SampleRatio != 1 || o.ServiceName != "tollgate" ||
		o.Headers["api-key"] != "s3cr t" || o.Headers["team"] != "ops" || len(o.Headers) != 2 {
		t.Fatalf("tracing options = %+v", o)
	}
	p, err := tracing.New(o, "v")
	if err != nil || p == nil {
		t.Fatalf("tracing on: %v, %v", p, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = p.Shutdown(ctx) // nothing was exported; the collector does not exist
	c = parseConfig(t, fromConfigYAML+"tracing: {endpoint: \"http://127.0.0.1:1/v1/traces\", sample_ratio: 0.25, service_name: gw}\n")
	if o := tracingOptions(&c.Tracing); o.SampleRatio != 0.25 || o.ServiceName != "gw" {
		t.Errorf("tracing options = %+v", o)
	}
}
