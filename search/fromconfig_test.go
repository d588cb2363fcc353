package search

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/config"
)

func TestFromConfig(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		fmt.Fprint(w, `{"results": [{"url": "https://a.example/", "title": "A", "content": "a"}]}`)
	}))
	defer srv.Close()
	parse := func(section string) *config.Config {
		t.Helper()
		doc := `
listen: {api: "127.0.0.1:0"}
store: {sqlite: ":memory:"}
models:
  - {id: m, kind: chat, context_length: 100, max_output_tokens: 10,
     backends: [{class: network, upstream_model: u, capabilities: [tools], rates: {input: "0", output: "0"}, nodes: [{url: "http://10.0.0.1:8000/v1"}]}]}
` + section
		c, err := config.Parse([]byte(doc), ".", func(k string) string { return map[string]string{"BK": "key"}[k] })
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if s, err := FromConfig(&parse("").Search, nil); s != nil || err != nil {
		t.Fatalf("search off: %v, %v; want nil, nil", s, err)
	}
	c := parse(fmt.Sprintf("search: {provider: searxng, url: %q, cache_ttl: \"off\"}\n", srv.URL))
	s, err := FromConfig(&c.Search, nil)
	if err != nil || s.ProviderName() != "searxng" {
		t.Fatalf("searxng: %v, %v", s, err)
	}
	for range 2 {
		if res, err := s.Search(context.Background(), Query{Text: "q"}); err != nil || len(res) != 1 {
			t.Fatalf("search: %v, %v", res, err)
		}
	}
	if calls.Load() != 2 {
		t.Errorf("cache_ttl off: %d provider calls, want 2", calls.Load())
	}
	c = parse("search: {provider: brave, api_key_env: BK}\n")
	if s, err := FromConfig(&c.Search, nil); err != nil || s.ProviderName() != "brave" || !s.SupportsLocation() {
		t.Fatalf("brave: %v, %v", s, err)
	}
}
