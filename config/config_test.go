package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
)

const minimal = `
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
        capabilities: [tools]
        rates: {input: "0.15", output: "0.6"}
        nodes: [{url: "http://10.0.0.1:8000/v1", key_env: NODE_KEY}]
      - class: fallback
        upstream_model: up2
        url: https://openrouter.example/api/v1
        key_env: OR_KEY
        flavour: openrouter
        rates: {input: "1", output: "2.000001"}
`

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseMinimalWithDefaults(t *testing.T) {
	c, err := Parse([]byte(minimal), "/etc/tollgate", env(map[string]string{"NODE_KEY": "n", "OR_KEY": "o"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Store.Driver != "sqlite" || c.Store.Path != "/etc/tollgate/data/t.db" {
		t.Errorf("store = %+v", c.Store)
	}
	if c.Timeouts.NonStream.D() != 5*time.Minute || c.Timeouts.StreamTotal.D() != 30*time.Minute || c.Health.Interval.D() != 10*time.Second {
		t.Errorf("defaults: %+v %+v", c.Timeouts, c.Health)
	}
	b := c.Models[0].Backends
	if b[0].Nodes[0].Key != "n" || b[0].Nodes[0].Flavour != "vllm" || !strings.HasPrefix(b[0].Nodes[0].Name, "node-") {
		t.Errorf("node = %+v", b[0].Nodes[0])
	}
	if strings.Contains(b[0].Nodes[0].Name, "10.0.0.1") {
		t.Errorf("default node name leaks the address: %s", b[0].Nodes[0].Name)
	}
	if len(b[1].Nodes) != 1 || b[1].Nodes[0].Key != "o" || b[1].Nodes[0].Flavour != "openrouter" {
		t.Errorf("fallback node = %+v", b[1].Nodes)
	}
	if b[1].Rates.Prices.Output != tollgate.MustParseRate("2.000001") {
		t.Errorf("rate = %s", b[1].Rates.Prices.Output)
	}
}

func TestValidationNamesTheKey(t *testing.T) {
	cases := []struct{ edit, want string }{
		{`kind: poet`, `models[0] (m).kind: "poet" is not one of coder, chat, cheap`},
		{`input: "0.1234567"`, `models[0] (m).backends[0].rates.input`},
		{`capabilities: [tools, web_search]`, `web_search is not a backend capability`},
		{`capabilities: [tools, telepathy]`, `unknown capability "telepathy"`},
		{`max_output_tokens: 5000`, `max_output_tokens: must not exceed context_length`},
		{"max_output_tokens: 100\n    image_tokens: 1001", `models[0] (m).image_tokens: must not exceed context_length`},
		{"max_output_tokens: 100\n    image_tokens: -1", `models[0] (m).image_tokens: must not be negative`},
		{`flavour: vllm`, `backends[1].flavour: "vllm" is not a fallback flavour`},
		{`url: "10.0.0.1:8000"`, `nodes[0].url`},
		{`store: {sqlite: data/t.db, postgres_url_env: PG}`, `store: set either sqlite or postgres_url_env`},
		{`listen: {apii: "127.0.0.1:0"}`, `listen.apii: unknown key (did you mean api?)`},
	}
	for _, c := range cases {
		old := strings.SplitN(c.edit, ":", 2)[0]
		text := replaceFirst(minimal, old, c.edit)
		if text == minimal {
			t.Fatalf("%s: the edit changed nothing", c.edit)
		}
		_, err := Parse([]byte(text), ".", env(map[string]string{"NODE_KEY": "n", "OR_KEY": "o", "PG": "postgres://x"}))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to contain %q", c.edit, err, c.want)
		}
	}
}

// replaceFirst replaces the first line whose trimmed text starts with key+":"
// (or is a flow map entry for it) with edit.
func replaceFirst(doc, key, edit string) string {
	lines := strings.Split(doc, "\n")
	for i, line := range lines {
		t := strings.TrimSpace(line)
		t = strings.TrimPrefix(t, "- ")
		if strings.HasPrefix(t, key+":") {
			lines[i] = strings.Replace(line, t, edit, 1)
			return strings.Join(lines, "\n")
		}
		if j := strings.Index(line, key+": "); j >= 0 && strings.Contains(line, "{") {
			// inside a flow map such as rates: {input: "0.15", ...}
			end := strings.IndexAny(line[j:], ",}")
			lines[i] = line[:j] + edit + line[j+end:]
			return strings.Join(lines, "\n")
		}
	}
	return doc
}

func TestSecretsAndStoreOnlyLoading(t *testing.T) {
	_, err := Parse([]byte(minimal), ".", env(nil))
	if err == nil || !strings.Contains(err.Error(), "NODE_KEY is empty or unset") || !strings.Contains(err.Error(), "OR_KEY is empty or unset") {
		t.Fatalf("missing secrets: %v", err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "t.yaml")
	if err := os.WriteFile(path, []byte(minimal), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil {
		t.Fatal("Load accepted a config whose backend keys are unset")
	}
	c, err := LoadForStore(path)
	if err != nil {
		t.Fatalf("LoadForStore needs no backend secrets: %v", err)
	}
	withAdmin := minimal + "admin_token_env: ADMIN_TOKEN\n"
	if err := os.WriteFile(path, []byte(strings.Replace(withAdmin, `listen: {api: "127.0.0.1:0"}`, `listen: {api: "127.0.0.1:0", admin: "127.0.0.1:0"}`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadForStore(path); err != nil {
		t.Fatalf("LoadForStore needs no admin token: %v", err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "ADMIN_TOKEN") {
		t.Fatalf("Load without the admin token: %v", err)
	}
	if c.Store.Path != filepath.Join(dir, "data/t.db") {
		t.Errorf("store path = %s", c.Store.Path)
	}
}

func TestOffOnlyForHealthInterval(t *testing.T) {
	e := env(map[string]string{"NODE_KEY": "n", "OR_KEY": "o"})
	c, err := Parse([]byte(minimal+"health: {interval: \"off\"}\n"), ".", e)
	if err != nil || c.Health.Interval != Off {
		t.Fatalf("interval off: %v %v", c, err)
	}
	if _, err := Parse([]byte(minimal+"timeouts: {non_stream: \"off\"}\n"), ".", e); err == nil || !strings.Contains(err.Error(), "timeouts.non_stream") {
		t.Fatalf("non_stream off accepted: %v", err)
	}
	if _, err := Parse([]byte(minimal+"timeouts: {non_stream: \"soon\"}\n"), ".", e); err == nil {
		t.Fatal("bad duration accepted")
	}
}

func TestBillingBatchWait(t *testing.T) {
	e := env(map[string]string{"NODE_KEY": "n", "OR_KEY": "o"})
	c, err := Parse([]byte(minimal), ".", e)
	if err != nil || c.Billing.BatchWait.D() != 2*time.Millisecond || c.Billing.NoPipeline {
		t.Fatalf("defaults: batch_wait %v, no_pipeline %t, %v", c.Billing.BatchWait.D(), c.Billing.NoPipeline, err)
	}
	c, err = Parse([]byte(minimal+"billing: {batch_wait: \"off\", no_pipeline: true}\n"), ".", e)
	if err != nil || c.Billing.BatchWait != Off || !c.Billing.NoPipeline {
		t.Fatalf("batch_wait off: %v %v", c.Billing.BatchWait, err)
	}
	if _, err := Parse([]byte(minimal+"billing: {batch_wait: 150ms}\n"), ".", e); err == nil || !strings.Contains(err.Error(), "billing.batch_wait") {
		t.Fatalf("batch_wait 150ms: %v, want an error naming billing.batch_wait", err)
	}
}

func TestExampleConfigIsValid(t *testing.T) {
	b, err := os.ReadFile("../tollgate.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse(b, ".", func(string) string { return "x" })
	if err != nil {
		t.Fatalf("tollgate.example.yaml: %v", err)
	}
	if c.Search.Provider != "searxng" || c.Models[0].SearchPrice != tollgate.MustParseAmount("0.001") || c.Models[1].SearchPrice != 0 {
		t.Errorf("search %+v, search prices %d %d", c.Search, c.Models[0].SearchPrice, c.Models[1].SearchPrice)
	}
}

// The charge journal: beside an SQLite file by default, in the working
// directory with PostgreSQL, none for an in-memory database or "off", or a path of
// the operator's.
func TestBillingJournalDir(t *testing.T) {
	e := env(map[string]string{"NODE_KEY": "n", "OR_KEY": "o", "PG": "postgres://x"})
	for _, tc := range []struct{ doc, want string }{
		{minimal, "/etc/tg/data/t.db-charges"},
		{minimal + "billing: {journal: \"off\"}\n", ""},
		{minimal + "billing: {journal: spool/charges}\n", "/etc/tg/spool/charges"},
		{minimal + "billing: {journal: /var/lib/tg}\n", "/var/lib/tg"},
		{strings.Replace(minimal, "store: {sqlite: data/t.db}", `store: {sqlite: ":memory:"}`, 1), ""},
		{strings.Replace(minimal, "store: {sqlite: data/t.db}", "store: {postgres_url_env: PG}", 1), "tollgate-charges"},
		{strings.Replace(minimal, "store: {sqlite: data/t.db}", "store: {postgres_url_env: PG}", 1) + "billing: {journal: \"off\"}\n", ""},
		{strings.Replace(minimal, "store: {sqlite: data/t.db}", "store: {postgres_url_env: PG}", 1) + "billing: {journal: j}\n", "/etc/tg/j"},
	} {
		c, err := Parse([]byte(tc.doc), "/etc/tg", e)
		if err != nil {
			t.Fatal(err)
		}
		if c.Billing.JournalDir != tc.want {
			t.Errorf("journal dir %q, want %q, for\n%s", c.Billing.JournalDir, tc.want, tc.doc[len(minimal)-1:])
		}
	}
}

func TestSearchDefaultsOff(t *testing.T) {
	c, err := Parse([]byte(minimal), ".", env(map[string]string{"NODE_KEY": "n", "OR_KEY": "o"}))
	if err != nil {
		t.Fatal(err)
	}
	s := c.Search
	if s.Enabled() || s.Provider != "off" || s.Timeout.D() != 10*time.Second || s.MaxSearches != 5 ||
		s.CacheTTL.D() != 10*time.Minute || s.CacheEntries != 10000 || s.Price != 0 {
		t.Errorf("defaults: %+v", s)
	}
	if c.Models[0].SearchPrice != 0 {
		t.Errorf("model search price %d, want 0", c.Models[0].SearchPrice)
	}
}

func TestSearchParsedAndPricesResolved(t *testing.T) {
	doc := strings.Replace(minimal, "    max_output_tokens: 100\n", "    max_output_tokens: 100\n    search_price: \"0.000000000001\"\n", 1) +
		`  - id: other
    kind: cheap
    context_length: 1000
    max_output_tokens: 100
    backends:
      - class: network
        upstream_model: up
        rates: {input: "0", output: "0"}
        nodes: [{url: "http://10.0.0.2:8000/v1"}]
search:
  provider: brave
  api_key_env: BRAVE_API_KEY
  timeout: 3s
  max_searches: 20
  cache_ttl: "off"
  cache_entries: 7
  price: 0.005
`
	c, err := Parse([]byte(doc), ".", env(map[string]string{"NODE_KEY": "n", "OR_KEY": "o", "BRAVE_API_KEY": "bk"}))
	if err != nil {
		t.Fatal(err)
	}
	s := c.Search
	if !s.Enabled() || s.Provider != "brave" || s.URL != "https://api.search.brave.com" || s.APIKey != "bk" ||
		s.Timeout.D() != 3*time.Second || s.MaxSearches != 20 || s.CacheTTL != Off || s.CacheTTLDuration() >= 0 || s.CacheEntries != 7 {
		t.Errorf("search = %+v", s)
	}
	if want := tollgate.MustParseAmount("0.005"); s.Price != want || c.Models[1].SearchPrice != want {
		t.Errorf("price %d, other model's %d, want %d", s.Price, c.Models[1].SearchPrice, want)
	}
	if c.Models[0].SearchPrice != 1 {
		t.Errorf("overridden search price %d, want 1 picodollar", c.Models[0].SearchPrice)
	}
}

func TestSearchValidationNamesTheKey(t *testing.T) {
	e := env(map[string]string{"NODE_KEY": "n", "OR_KEY": "o", "BRAVE_API_KEY": "bk"})
	for _, tc := range []struct{ section, want string }{
		{`{provider: google}`, `search.provider: "google" is not searxng, brave or off`},
		{`{provider: searxng}`, `search.url: "" is not an http(s) base URL`},
		{`{provider: searxng, url: "127.0.0.1:8888"}`, `search.url`},
		{`{provider: searxng, url: "http://u:p@127.0.0.1:8888"}`, `search.url: must not hold credentials`},
		{`{provider: searxng, url: "http://127.0.0.1:8888", api_key_env: BRAVE_API_KEY}`, `search.api_key_env: only brave`},
		{`{provider: brave}`, `search.api_key_env: required with brave`},
		{`{provider: brave, api_key_env: NOPE}`, `search.api_key_env: environment variable NOPE is empty or unset`},
		{`{provider: searxng, url: "http://127.0.0.1:8888", timeout: "off"}`, `search.timeout`},
		{`{provider: searxng, url: "http://127.0.0.1:8888", timeout: 3m}`, `search.timeout`},
		{`{max_searches: 21}`, `search.max_searches: must be between 1 and 20`},
		{`{max_searches: -1}`, `search.max_searches`},
		{`{cache_entries: -5}`, `search.cache_entries`},
		{`{price: "-0.01"}`, `search.price: "-0.01" must not be negative`},
		{`{price: "0.0000000000001"}`, `search.price: money: "0.0000000000001" has more than 12 decimals`},
		{`{price: "five"}`, `search.price`},
		{`{provder: brave}`, `search.provder: unknown key (did you mean provider?)`},
	} {
		_, err := Parse([]byte(minimal+"search: "+tc.section+"\n"), ".", e)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("search: %s: error %v, want it to contain %q", tc.section, err, tc.want)
		}
	}
	doc := strings.Replace(minimal, "    max_output_tokens: 100\n", "    max_output_tokens: 100\n    search_price: \"1e-3\"\n", 1)
	if _, err := Parse([]byte(doc), ".", e); err == nil || !strings.Contains(err.Error(), "models[0] (m).search_price") {
		t.Errorf("bad search_price: %v", err)
	}
	// The store commands do not need the provider's key.
	if _, err := parse([]byte(minimal+"search: {provider: brave, api_key_env: NOPE}\n"), ".", e, false); err != nil {
		t.Errorf("store-only load needs the search key: %v", err)
	}
}

// The outlier-detection settings of health: defaults, and the ranges refused.
func TestHealthOutlierSettings(t *testing.T) {
	e := env(map[string]string{"NODE_KEY": "n", "OR_KEY": "o"})
	c, err := Parse([]byte(minimal), ".", e)
	if err != nil {
		t.Fatal(err)
	}
	h := c.Health
	if h.FailurePercent != 50 || h.Window.D() != 30*time.Second || h.MinRequests != 20 ||
		h.EjectionBase.D() != 30*time.Second || h.EjectionMax.D() != 5*time.Minute || h.MaxEjectedPercent != 50 {
		t.Fatalf("defaults: %+v", h)
	}
	for _, bad := range []struct{ yaml, key string }{
		{"health: {failure_percent: 101}\n", "health.failure_percent"},
		{"health: {max_ejected_percent: -1}\n", "health.max_ejected_percent"},
		{"health: {min_requests: -5}\n", "health.min_requests"},
		{"health: {ejection_base: 10m, ejection_max: 1m}\n", "health.ejection_base"},
		{"health: {window: \"off\"}\n", "health.window"},
		{"health: {failure_threshold: -1}\n", "health.failure_threshold"},
	} {
		if _, err := Parse([]byte(minimal+bad.yaml), ".", e); err == nil || !strings.Contains(err.Error(), bad.key) {
			t.Errorf("%q: %v, want an error naming %s", bad.yaml, err, bad.key)
		}
	}
}

// The compose deployment's config (deploy/tollgate.yaml) is valid: PostgreSQL,
// an admin listener for Prometheus, SearXNG.
func TestDeployConfigIsValid(t *testing.T) {
	b, err := os.ReadFile("../deploy/tollgate.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse(b, ".", func(string) string { return "x" })
	if err != nil {
		t.Fatalf("deploy/tollgate.yaml: %v", err)
	}
	if c.Store.Driver != "postgres" || c.Listen.Admin == "" || c.Search.Provider != "searxng" {
		t.Errorf("store %q, admin %q, search %q", c.Store.Driver, c.Listen.Admin, c.Search.Provider)
	}
}

// listen.tls: both files, resolved against the config's directory; only
// known listener names; timeouts.request_body defaults to 60s.
func TestListenTLSAndRequestBody(t *testing.T) {
	e := env(map[string]string{"NODE_KEY": "n", "OR_KEY": "o"})
	withTLS := func(tls string) string {
		return strings.Replace(minimal, `listen: {api: "127.0.0.1:0"}`, `listen: {api: "127.0.0.1:0", tls: `+tls+`}`, 1)
	}
	c, err := Parse([]byte(withTLS(`{cert_file: tls/c.pem, key_file: /k.pem, listeners: [api]}`)), "/etc/tg", e)
	if err != nil {
		t.Fatal(err)
	}
	if tl := c.Listen.TLS; tl.CertFile != "/etc/tg/tls/c.pem" || tl.KeyFile != "/k.pem" || !tl.Serves("api") || tl.Serves("admin") {
		t.Errorf("tls %+v", tl)
	}
	if c.Timeouts.RequestBody.D() != 60*time.Second {
		t.Errorf("request_body default %v", c.Timeouts.RequestBody.D())
	}
	c, _ = Parse([]byte(withTLS(`{cert_file: c, key_file: k}`)), ".", e)
	if !c.Listen.TLS.Serves("admin") || !c.Listen.TLS.Serves("public") {
		t.Error("listen.tls without listeners does not serve every listener")
	}
	var none *ListenTLS
	if none.Serves("api") {
		t.Error("no listen.tls serves TLS")
	}
	for doc, key := range map[string]string{
		withTLS(`{cert_file: c}`):                              "listen.tls",
		withTLS(`{cert_file: c, key_file: k, listeners: [x]}`): "listen.tls.listeners",
		minimal + "timeouts: {request_body: \"off\"}\n":        "timeouts.request_body",
	} {
		if _, err := Parse([]byte(doc), ".", e); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s: %v, want an error naming %s", doc[:60], err, key)
		}
	}
}

func TestRoutingDefaultsAndValidation(t *testing.T) {
	e := env(map[string]string{"NODE_KEY": "n", "OR_KEY": "o"})
	c, err := Parse([]byte(minimal), ".", e)
	if err != nil {
		t.Fatal(err)
	}
	b := c.Models[0].Backends[0]
	if b.Routing != DefaultRouting || b.PrefixMargin == nil || *b.PrefixMargin != DefaultPrefixMargin {
		t.Fatalf("routing %q margin %v", b.Routing, b.PrefixMargin)
	}
	text := strings.Replace(minimal, "        capabilities: [tools]\n",
		"        capabilities: [tools]\n        routing: least_outstanding\n        prefix_margin: 0\n        prefix_index_tokens: 5000\n        prefix_ttl: 1m\n", 1)
	if c, err = Parse([]byte(text), ".", e); err != nil {
		t.Fatal(err)
	}
	b = c.Models[0].Backends[0]
	if b.Routing != RoutingLeastOutstanding || *b.PrefixMargin != 0 || b.PrefixIndexTokens != 5000 || b.PrefixTTL.D() != time.Minute {
		t.Fatalf("parsed %+v", b)
	}
	for _, c := range []struct{ add, want string }{
		{"routing: sticky", `backends[0].routing: "sticky" is not a routing policy`},
		{"prefix_margin: -1", `backends[0].prefix_margin: must not be negative`},
		{"prefix_index_tokens: -5", `backends[0].prefix_index_tokens: must not be negative`},
		{"load_poll: 10ms", `backends[0].load_poll: want 50ms or more, or "off"`},
		{"load_poll: soon", `backends[0].load_poll: "soon" is not a duration`},
	} {
		text := strings.Replace(minimal, "        capabilities: [tools]\n", "        capabilities: [tools]\n        "+c.add+"\n", 1)
		if _, err := Parse([]byte(text), ".", e); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.add, err, c.want)
		}
	}
	// load_poll: off by default; on, prefix_margin's default is its own.
	if b.LoadPoll != Off {
		t.Fatalf("load_poll %v by default, want off", b.LoadPoll)
	}
	for _, lp := range []struct {
		add    string
		poll   time.Duration
		margin int64
	}{
		{"load_poll: 100ms", 100 * time.Millisecond, DefaultLoadPollMargin},
		{"load_poll: 100ms\n        prefix_margin: 5", 100 * time.Millisecond, 5},
		{"load_poll: \"off\"", -1, DefaultPrefixMargin},
	} {
		text := strings.Replace(minimal, "        capabilities: [tools]\n", "        capabilities: [tools]\n        "+lp.add+"\n", 1)
		c, err := Parse([]byte(text), ".", e)
		if err != nil {
			t.Fatalf("%s: %v", lp.add, err)
		}
		if b := c.Models[0].Backends[0]; b.LoadPoll.D() != lp.poll || *b.PrefixMargin != lp.margin {
			t.Errorf("%s: load_poll %v, prefix_margin %d; want %v, %d", lp.add, b.LoadPoll.D(), *b.PrefixMargin, lp.poll, lp.margin)
		}
	}
	text = strings.Replace(minimal, "        flavour: openrouter\n", "        flavour: openrouter\n        load_poll: 1s\n", 1)
	if _, err := Parse([]byte(text), ".", e); err == nil || !strings.Contains(err.Error(), "backends[1].routing") {
		t.Errorf("load_poll on a fallback: %v", err)
	}
	text = strings.Replace(minimal, "        flavour: openrouter\n", "        flavour: openrouter\n        routing: prefix_cache\n", 1)
	if _, err := Parse([]byte(text), ".", e); err == nil || !strings.Contains(err.Error(), "backends[1].routing") {
		t.Errorf("routing on a fallback: %v", err)
	}
}

func TestKVEventsValidation(t *testing.T) {
	e := env(map[string]string{"NODE_KEY": "n", "OR_KEY": "o"})
	node := `nodes: [{url: "http://10.0.0.1:8000/v1", key_env: NODE_KEY}]`
	with := func(extra, routing string) string {
		text := strings.Replace(minimal, node, `nodes: [{url: "http://10.0.0.1:8000/v1", key_env: NODE_KEY, `+extra+`}]`, 1)
		if routing != "" {
			text = strings.Replace(text, "        capabilities: [tools]\n", "        capabilities: [tools]\n        routing: "+routing+"\n", 1)
		}
		return text
	}
	c, err := Parse([]byte(with(`kv_events: "tcp://10.0.0.1:5557", kv_events_replay: "tcp://10.0.0.1:5558"`, "")), ".", e)
	if err != nil {
		t.Fatal(err)
	}
	if n := c.Models[0].Backends[0].Nodes[0]; n.KVEvents != "tcp://10.0.0.1:5557" || n.KVEventsReplay != "tcp://10.0.0.1:5558" {
		t.Fatalf("parsed %+v", n)
	}
	// A backend with a node publishing events polls its nodes' load by
	// default, with load_poll's margin; "off" still turns it off.
	if b := c.Models[0].Backends[0]; b.LoadPoll != DefaultLoadPollWithKVEvents || b.LoadPoll.D() != 100*time.Millisecond || *b.PrefixMargin != DefaultLoadPollMargin {
		t.Errorf("with kv_events: load_poll %v, prefix_margin %d", b.LoadPoll.D(), *b.PrefixMargin)
	}
	off := strings.Replace(with(`kv_events: "tcp://10.0.0.1:5557"`, ""), "        capabilities: [tools]\n", "        capabilities: [tools]\n        load_poll: \"off\"\n", 1)
	if c, err := Parse([]byte(off), ".", e); err != nil {
		t.Fatal(err)
	} else if b := c.Models[0].Backends[0]; b.LoadPoll != Off || *b.PrefixMargin != DefaultPrefixMargin {
		t.Errorf("kv_events with load_poll off: load_poll %v, prefix_margin %d", b.LoadPoll.D(), *b.PrefixMargin)
	}
	// SGLang nodes' events are followed, never matched: no poll by default.
	if c, err := Parse([]byte(with(`kv_events: "tcp://10.0.0.1:5557", flavour: sglang`, "")), ".", e); err != nil {
		t.Fatal(err)
	} else if b := c.Models[0].Backends[0]; b.LoadPoll != Off || *b.PrefixMargin != DefaultPrefixMargin {
		t.Errorf("sglang with kv_events: load_poll %v, prefix_margin %d", b.LoadPoll.D(), *b.PrefixMargin)
	}
	for _, c := range []struct{ extra, routing, want string }{
		{`kv_events: "10.0.0.1:5557"`, "", "nodes[0].kv_events: want a ZeroMQ address"},
		{`kv_events: "tcp://*:5557"`, "", "nodes[0].kv_events: want a ZeroMQ address"},
		{`kv_events: "tcp://10.0.0.1:5557", kv_events_replay: "tcp://10.0.0.1"`, "", "nodes[0].kv_events_replay: want a ZeroMQ address"},
		{`kv_events_replay: "tcp://10.0.0.1:5558"`, "", "nodes[0].kv_events_replay: needs kv_events"},
		{`kv_events: "tcp://10.0.0.1:5557", flavour: llamacpp`, "", "come from vllm and sglang nodes"},
		{`kv_events: "tcp://10.0.0.1:5557"`, "least_outstanding", "read by prefix_cache routing only"},
	} {
		if _, err := Parse([]byte(with(c.extra, c.routing)), ".", e); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.extra, err, c.want)
		}
	}
}
