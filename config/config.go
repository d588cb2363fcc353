// Package config loads and validates tollgate's YAML configuration file.
// Every key is documented in docs/config.md and tollgate.example.yaml.
package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/openai"
)

// Config is the whole configuration, after defaults and validation.
type Config struct {
	Listen   Listen   `yaml:"listen"`
	Store    Store    `yaml:"store"`
	Timeouts Timeouts `yaml:"timeouts"`
	Health   Health   `yaml:"health"`
	Auth     Auth     `yaml:"auth"`
	Traffic  Traffic  `yaml:"traffic"`
	Billing  Billing  `yaml:"billing"`
	// AdminTokenEnv names the environment variable holding the admin API token.
	AdminTokenEnv string  `yaml:"admin_token_env"`
	AdminToken    string  `yaml:"-"`
	Models        []Model `yaml:"models"`

	// Idempotency configures Idempotency-Key (config/idempotency.go).
	Idempotency Idempotency `yaml:"idempotency"`
	Log         Log         `yaml:"log"`
	Tracing     Tracing     `yaml:"tracing"`

	// Search configures web search (config/search.go).
	Search Search `yaml:"search"`

	// Console configures the web console (config/console.go).
	Console Console `yaml:"console"`

	// Payments configures payments by account holders (config/payments.go).
	Payments Payments `yaml:"payments"`

	// Dir is the directory of the config file; relative paths resolve against it.
	Dir string `yaml:"-"`
}

// Listen holds the listeners' addresses. API is required; Public serves
// /pricing without a key; Admin serves /healthz, /readyz, /metrics and the admin API.
type Listen struct {
	API    string `yaml:"api"`
	Public string `yaml:"public"`
	Admin  string `yaml:"admin"`
	// TLS, when set, serves the listeners it names (all by default) over
	// TLS, with HTTP/2 offered by ALPN.
	TLS *ListenTLS `yaml:"tls"`
}

// ListenTLS is a certificate and its key (PEM files, relative to the config
// file), and the listeners that serve TLS with them.
type ListenTLS struct {
	CertFile  string   `yaml:"cert_file"`
	KeyFile   string   `yaml:"key_file"`
	Listeners []string `yaml:"listeners"` // "api", "public", "admin"; default all
}

// Serves reports whether the named listener serves TLS.
func (t *ListenTLS) Serves(listener string) bool {
	if t == nil {
		return false
	}
	if len(t.Listeners) == 0 {
		return true
	}
	for _, l := range t.Listeners {
		if l == listener {
			return true
		}
	}
	return false
}

// Store says where state is kept: SQLite (a file) or PostgreSQL (a URL).
type Store struct {
	Driver string `yaml:"-"` // "sqlite" or "postgres", derived
	// SQLite is the path of the SQLite database file (relative to the config file).
	SQLite string `yaml:"sqlite"`
	// SQLiteSynchronous is "full" (default: a commit survives a power loss) or
	// "normal" (a commit survives a process crash; the last ones may be lost
	// on a power loss; much cheaper per commit).
	SQLiteSynchronous string `yaml:"sqlite_synchronous"`
	// PostgresURLEnv names the environment variable that holds the PostgreSQL URL.
	PostgresURLEnv string `yaml:"postgres_url_env"`
	// Path and URL are the resolved values.
	Path string `yaml:"-"`
	URL  string `yaml:"-"`
}

// Timeouts bound requests (docs/api.md: 5 minutes non-streamed; streams longer).
type Timeouts struct {
	NonStream   Duration `yaml:"non_stream"`   // default 5m
	StreamTotal Duration `yaml:"stream_total"` // default 30m
	StreamIdle  Duration `yaml:"stream_idle"`  // default 5m: backend silent that long ends the stream
	KeepAlive   Duration `yaml:"keep_alive"`   // default 15s: SSE comment while the backend is silent
	Connect     Duration `yaml:"connect"`      // default 10s: dialing a backend
	Shutdown    Duration `yaml:"shutdown"`     // default 30s: graceful shutdown deadline
	// RequestBody is the longest a client may take to send a request body,
	// from the handler's first read to its end (default 60s): a body
	// trickled slower is answered 408 request_timeout.
	RequestBody Duration `yaml:"request_body"`
}

// Health configures active and passive health checks of backend nodes.
type Health struct {
	Interval   Duration `yaml:"interval"`    // default 10s; "off" disables active checks
	Timeout    Duration `yaml:"timeout"`     // default 2s
	BackoffMin Duration `yaml:"backoff_min"` // default 1s
	BackoffMax Duration `yaml:"backoff_max"` // default 60s
	// FailureThreshold is how many consecutive failed probes take a node
	// down, and how many consecutive failed requests eject it. Default 3.
	FailureThreshold int `yaml:"failure_threshold"`

	// Outlier detection on real requests (routing/outlier.go), independent of
	// the probes: a node failing FailurePercent of at least MinRequests
	// requests in Window is ejected too. The k-th ejection lasts
	// k × EjectionBase, at most EjectionMax; at most MaxEjectedPercent of a
	// backend's nodes are ejected at once.
	FailurePercent    int      `yaml:"failure_percent"`     // default 50 (1-100)
	Window            Duration `yaml:"window"`              // default 30s
	MinRequests       int      `yaml:"min_requests"`        // default 20
	EjectionBase      Duration `yaml:"ejection_base"`       // default 30s
	EjectionMax       Duration `yaml:"ejection_max"`        // default 5m
	MaxEjectedPercent int      `yaml:"max_ejected_percent"` // default 50 (1-100)
}

// Auth configures the key cache.
type Auth struct {
	// Poll is how often the auth change counter is read; a revocation takes
	// effect on every instance within this time. Default 1s.
	Poll Duration `yaml:"poll"`
}

// Traffic configures the traffic-share counters behind /pricing.
type Traffic struct {
	Flush Duration `yaml:"flush"` // default 5s: how often counts are written
	// ShareCache is how long /pricing reuses a read of the 7-day share. Default 10s.
	ShareCache Duration `yaml:"share_cache"`
}

// Billing configures holds and their leases (docs/billing.md).
type Billing struct {
	// Disabled turns billing off: nothing is held or charged. For
	// benchmarks and private deployments only.
	Disabled bool `yaml:"disabled"`
	// Lease is how long a hold outlives the process that placed it. Default 2m.
	Lease Duration `yaml:"lease"`
	// Renew is how often a process extends its holds' leases. Default lease/3.
	Renew Duration `yaml:"renew"`
	// Sweep is how often expired holds are released. Default 30s.
	Sweep Duration `yaml:"sweep"`
	// MaxBatch bounds how many holds and settles share one transaction. Default 512.
	MaxBatch int `yaml:"max_batch"`
	// BatchWait is the longest a batch waits for more operations under
	// concurrency (group commit; docs/billing.md). Default 2ms; "off": none.
	BatchWait Duration `yaml:"batch_wait"`
	// NoPipeline: with SQLite, write a batch only once the previous one is
	// durable (default false: the next batch is written while the last is
	// being synced; docs/billing.md).
	NoPipeline bool `yaml:"no_pipeline"`
	// AsyncSettle sends the response before its charge is committed when
	// the hold covers the cost (default false: every response waits for
	// its charge; docs/billing.md, "Asynchronous settles").
	AsyncSettle bool `yaml:"async_settle"`
	// Journal is the directory of the charge journal (docs/billing.md, "The
	// charge journal"): a settle within its hold answers once its charge
	// is there, safe from a crash of the process, and is committed with
	// the next batch. Default with SQLite: the database's path plus
	// "-charges"; with PostgreSQL: DefaultPostgresJournal in the working
	// directory. "off": none (every response waits for its charge's durable
	// commit, and a charge whose write fails is not kept).
	Journal string `yaml:"journal"`
	// JournalDir is the resolved directory ("" for none).
	JournalDir string `yaml:"-"`
	// Workers is how many billing transactions may run at once. Default 1
	// with SQLite (one writer), 4 with PostgreSQL.
	Workers int `yaml:"workers"`
}

// DefaultPostgresJournal is the charge journal's directory with PostgreSQL,
// relative to the working directory: a charge whose write fails while the
// database is away is kept there until it can be written (docs/billing.md).
const DefaultPostgresJournal = "tollgate-charges"

// Model is one catalogue entry.
type Model struct {
	ID              string             `yaml:"id"`
	Kind            tollgate.ModelKind `yaml:"kind"`
	OwnedBy         string             `yaml:"owned_by"`
	ContextLength   int64              `yaml:"context_length"`
	MaxOutputTokens int64              `yaml:"max_output_tokens"`
	// ImageTokens is the most prompt tokens one image can take with this
	// model's backends: a balance hold counts every image as this many.
	// Default 2000; a vision encoder that tiles large images into more
	// (Qwen2.5-VL up to 16,384 at its default max_pixels, Pixtral 4,096)
	// needs its own figure here, or a large image costs more than its hold.
	ImageTokens int64 `yaml:"image_tokens"`
	// SearchPriceUSD overrides search.price for this model (a decimal
	// string of USD per search that ran).
	SearchPriceUSD string `yaml:"search_price"`
	// SearchPrice is the price of one search with this model: the
	// override, else search.price.
	SearchPrice tollgate.Amount `yaml:"-"`
	Backends    []Backend       `yaml:"backends"`
}

// Backend is one way to serve a model.
type Backend struct {
	Class         tollgate.BackendClass `yaml:"class"`
	UpstreamModel string                `yaml:"upstream_model"`
	Capabilities  []tollgate.Capability `yaml:"capabilities"`
	Rates         Rates                 `yaml:"rates"`
	// Nodes of a network backend.
	Nodes []Node `yaml:"nodes"`
	// A fallback backend is a single upstream: these fields describe it.
	URL           string         `yaml:"url"`
	KeyEnv        string         `yaml:"key_env"`
	Flavour       openai.Flavour `yaml:"flavour"`
	MaxConcurrent int64          `yaml:"max_concurrent"`

	// Routing of a network backend over its nodes: RoutingPrefixCache
	// (the default) or RoutingLeastOutstanding (docs/config.md#routing).
	Routing string `yaml:"routing"`
	// PrefixMargin is how many more requests in flight than the least
	// loaded node the node with the longest matching prefix may have and
	// still be chosen (prefix_cache; default DefaultPrefixMargin).
	PrefixMargin *int64 `yaml:"prefix_margin"`
	// PrefixIndexTokens bounds each node's prefix index, in prompt tokens
	// (4 bytes each; default 1,000,000); PrefixTTL forgets a prefix not
	// sent again within it (default 10m).
	PrefixIndexTokens int64    `yaml:"prefix_index_tokens"`
	PrefixTTL         Duration `yaml:"prefix_ttl"`
	// LoadPoll is how often each vllm or sglang node's /metrics is read
	// for its load, which routing then uses instead of this instance's
	// own count (docs/config.md#routing); Off reads none. The default is
	// DefaultLoadPollWithKVEvents when a vllm node has kv_events, else Off.
	LoadPoll Duration `yaml:"load_poll"`
}

// Routing policies of a network backend.
const (
	RoutingPrefixCache      = "prefix_cache"
	RoutingLeastOutstanding = "least_outstanding"
	// RoutingRoundRobin takes the able nodes in turn whatever their load
	// (a baseline for measurements; nodes of equal speed).
	RoutingRoundRobin = "round_robin"
	// DefaultRouting is the policy of a backend that does not name one
	// (docs/decisions.md: measured in docs/performance.md).
	DefaultRouting = RoutingPrefixCache
	// DefaultLoadPoll is load_poll's default (Off: the nodes' /metrics
	// are not read), DefaultLoadPollWithKVEvents its default in a backend
	// where a vllm node publishes KV-cache events: a node that reports what
	// it holds reports its load too, and instances need both to agree
	// (docs/decisions.md). SGLang's events are never matched (no chat
	// /tokenize), and the poll alone splits instances: not on by default.
	// MinLoadPoll is the shortest interval allowed.
	DefaultLoadPoll             = Off
	DefaultLoadPollWithKVEvents = Duration(100 * time.Millisecond)
	MinLoadPoll                 = 50 * time.Millisecond
	// DefaultPrefixMargin is prefix_margin's default, and
	// DefaultLoadPollMargin its default with load_poll: the nodes' reports
	// are up to a poll old, and instances routing by them need room for
	// that (docs/decisions.md).
	DefaultPrefixMargin   = 6
	DefaultLoadPollMargin = 8
)

// Rates are decimal strings in USD per 1M tokens (at most 6 decimals).
type Rates struct {
	Input  string `yaml:"input"`
	Output string `yaml:"output"`
	// Parsed values.
	Prices tollgate.Prices `yaml:"-"`
}

// Node is one GPU server of a network backend.
type Node struct {
	Name    string         `yaml:"name"`
	URL     string         `yaml:"url"` // base URL including /v1, e.g. http://10.0.0.5:8000/v1
	KeyEnv  string         `yaml:"key_env"`
	Flavour openai.Flavour `yaml:"flavour"`
	// MaxConcurrent is how many requests the node takes at once (0: unlimited).
	MaxConcurrent int64 `yaml:"max_concurrent"`
	// HealthURL overrides the flavour's health endpoint.
	HealthURL string `yaml:"health_url"`
	// KVEvents is the node's KV-cache event stream, when it publishes one
	// (vLLM's --kv-events-config endpoint as tollgate reaches it,
	// tcp://host:port), and KVEventsReplay its replay socket
	// (replay_endpoint); docs/config.md#kv-cache-events.
	KVEvents       string `yaml:"kv_events"`
	KVEventsReplay string `yaml:"kv_events_replay"`
	Key            string `yaml:"-"` // resolved from KeyEnv
}

// Duration is a time.Duration written as "5m", "15s", ...
type Duration time.Duration

// Off is the value of a duration written "off" (where a key allows it).
const Off Duration = -1

// UnmarshalYAML parses Go duration syntax, or "off".
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return errors.New(`want a duration such as "30s"`)
	}
	if s == "off" {
		*d = Off
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return fmt.Errorf("%q is not a duration such as \"30s\" or \"5m\"", s)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration in Go syntax.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Load reads, parses and validates the file at path, resolving the
// environment variables it names.
func Load(path string) (*Config, error) { return load(path, true) }

// LoadForStore is Load for commands that only manage the store (accounts,
// keys, migrate, usage): only the store's own variable must be set, not the
// backends' keys nor the admin token.
func LoadForStore(path string) (*Config, error) { return load(path, false) }

func load(path string, backendSecrets bool) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	dir := "."
	if i := strings.LastIndexAny(path, `/\`); i >= 0 {
		dir = path[:i]
	}
	c, err := parse(b, dir, os.Getenv, backendSecrets)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Parse parses and validates a config document. Unknown keys are errors, so
// a typo never silently falls back to a default.
func Parse(b []byte, dir string, getenv func(string) string) (*Config, error) {
	return parse(b, dir, getenv, true)
}

func parse(b []byte, dir string, getenv func(string) string, backendSecrets bool) (*Config, error) {
	var c Config
	d, err := decodeDocument(b, &c)
	if err != nil {
		return nil, err
	}
	c.Dir = dir
	c.setDefaults()
	// Validation runs even when some values did not parse, so that every
	// problem is reported at once; a key whose value did not parse is not
	// reported a second time.
	if err := c.validate(getenv, backendSecrets, d); err != nil {
		return nil, err
	}
	return &c, nil
}

func (c *Config) setDefaults() {
	def := func(d *Duration, v time.Duration) {
		if *d == 0 {
			*d = Duration(v)
		}
	}
	def(&c.Timeouts.NonStream, 5*time.Minute)
	def(&c.Timeouts.StreamTotal, 30*time.Minute)
	def(&c.Timeouts.StreamIdle, 5*time.Minute)
	def(&c.Timeouts.KeepAlive, 15*time.Second)
	def(&c.Timeouts.Connect, 10*time.Second)
	def(&c.Timeouts.Shutdown, 30*time.Second)
	def(&c.Timeouts.RequestBody, 60*time.Second)
	def(&c.Health.Interval, 10*time.Second)
	def(&c.Health.Timeout, 2*time.Second)
	def(&c.Health.BackoffMin, time.Second)
	def(&c.Health.BackoffMax, time.Minute)
	if c.Health.FailureThreshold == 0 {
		c.Health.FailureThreshold = 3
	}
	def(&c.Health.Window, 30*time.Second)
	def(&c.Health.EjectionBase, 30*time.Second)
	def(&c.Health.EjectionMax, 5*time.Minute)
	if c.Health.FailurePercent == 0 {
		c.Health.FailurePercent = 50
	}
	if c.Health.MinRequests == 0 {
		c.Health.MinRequests = 20
	}
	if c.Health.MaxEjectedPercent == 0 {
		c.Health.MaxEjectedPercent = 50
	}
	def(&c.Auth.Poll, time.Second)
	def(&c.Traffic.Flush, 5*time.Second)
	def(&c.Billing.Lease, 2*time.Minute)
	def(&c.Billing.Renew, c.Billing.Lease.D()/3)
	def(&c.Billing.Sweep, 30*time.Second)
	if c.Billing.MaxBatch == 0 {
		c.Billing.MaxBatch = 512
	}
	def(&c.Billing.BatchWait, 2*time.Millisecond)
	def(&c.Traffic.ShareCache, 10*time.Second)
	c.Idempotency.setDefaults()
	c.Search.setDefaults()
	c.Payments.setDefaults()
	c.Log.setDefaults()
	c.Tracing.setDefaults()
	for i := range c.Models {
		if c.Models[i].OwnedBy == "" {
			c.Models[i].OwnedBy = "tollgate"
		}
	}
}

// validate checks everything and names the bad key with why.
func (c *Config) validate(getenv func(string) string, backendSecrets bool, d *decoder) error {
	ps := d.problems
	bad := func(key, format string, args ...any) {
		if d.failed[idLabel.ReplaceAllString(key, "")] {
			return
		}
		ps = append(ps, problem{d.line(key), key, fmt.Sprintf(format, args...)})
	}
	if c.Listen.API == "" {
		bad("listen.api", "required (e.g. 127.0.0.1:8080)")
	}
	if t := c.Listen.TLS; t != nil {
		if t.CertFile == "" || t.KeyFile == "" {
			bad("listen.tls", "needs both cert_file and key_file")
		} else {
			t.CertFile, t.KeyFile = c.resolve(t.CertFile), c.resolve(t.KeyFile)
		}
		for _, l := range t.Listeners {
			if l != "api" && l != "public" && l != "admin" {
				bad("listen.tls.listeners", "%q is not api, public or admin", l)
			}
		}
	}
	switch {
	case c.Store.SQLite != "" && c.Store.PostgresURLEnv != "":
		bad("store", "set either sqlite or postgres_url_env, not both")
	case c.Store.PostgresURLEnv != "":
		c.Store.Driver = "postgres"
		c.Store.URL = getenv(c.Store.PostgresURLEnv)
		if c.Store.URL == "" {
			bad("store.postgres_url_env", "environment variable %s is empty or unset", c.Store.PostgresURLEnv)
		}
	case c.Store.SQLite != "":
		c.Store.Driver = "sqlite"
		switch strings.ToLower(c.Store.SQLiteSynchronous) {
		case "", "full", "normal":
		default:
			bad("store.sqlite_synchronous", "%q is not full or normal", c.Store.SQLiteSynchronous)
		}
		c.Store.Path = c.resolve(c.Store.SQLite)
	default:
		bad("store", "required: sqlite: FILE or postgres_url_env: VAR")
	}
	switch j := c.Billing.Journal; {
	case j == "off":
	case j != "":
		c.Billing.JournalDir = c.resolve(j)
	case c.Store.Driver == "sqlite" && !sqliteInMemory(c.Store.SQLite):
		c.Billing.JournalDir = c.Store.Path + "-charges"
	case c.Store.Driver == "postgres":
		// In the working directory (the state directory of the packaged
		// units: /var/lib/tollgate), not beside a config that is often
		// read-only; instances sharing it recover each other's charges.
		c.Billing.JournalDir = DefaultPostgresJournal
	}
	if c.AdminTokenEnv != "" {
		c.AdminToken = getenv(c.AdminTokenEnv)
		if c.AdminToken == "" && c.Listen.Admin != "" && backendSecrets {
			bad("admin_token_env", "environment variable %s is empty or unset", c.AdminTokenEnv)
		}
	}
	for _, d := range []struct {
		key string
		v   Duration
	}{
		{"timeouts.non_stream", c.Timeouts.NonStream}, {"timeouts.stream_total", c.Timeouts.StreamTotal},
		{"timeouts.stream_idle", c.Timeouts.StreamIdle}, {"timeouts.keep_alive", c.Timeouts.KeepAlive},
		{"timeouts.connect", c.Timeouts.Connect}, {"timeouts.shutdown", c.Timeouts.Shutdown},
		{"timeouts.request_body", c.Timeouts.RequestBody},
		{"health.timeout", c.Health.Timeout}, {"health.backoff_min", c.Health.BackoffMin},
		{"health.backoff_max", c.Health.BackoffMax}, {"auth.poll", c.Auth.Poll},
		{"health.window", c.Health.Window}, {"health.ejection_base", c.Health.EjectionBase},
		{"health.ejection_max", c.Health.EjectionMax},
		{"traffic.flush", c.Traffic.Flush}, {"traffic.share_cache", c.Traffic.ShareCache},
	} {
		if d.v == Off {
			bad(d.key, `"off" is allowed only for health.interval and billing.batch_wait`)
		}
	}
	if c.Billing.BatchWait > Duration(100*time.Millisecond) {
		bad("billing.batch_wait", "at most 100ms: every response under load may wait this long for its charge's commit")
	}
	if c.Timeouts.StreamIdle > c.Timeouts.StreamTotal {
		bad("timeouts.stream_idle", "must not exceed timeouts.stream_total")
	}
	if c.Timeouts.KeepAlive <= 0 {
		bad("timeouts.keep_alive", "must be positive")
	}
	if c.Billing.Renew >= c.Billing.Lease {
		bad("billing.renew", "must be shorter than billing.lease (%s), or holds expire between renewals", c.Billing.Lease.D())
	}
	if c.Billing.MaxBatch < 1 {
		bad("billing.max_batch", "must be at least 1")
	}
	if c.Billing.Workers < 0 {
		bad("billing.workers", "must not be negative")
	}
	if c.Health.BackoffMin > c.Health.BackoffMax {
		bad("health.backoff_min", "must not exceed health.backoff_max")
	}
	if c.Health.EjectionBase > c.Health.EjectionMax {
		bad("health.ejection_base", "must not exceed health.ejection_max")
	}
	if c.Health.FailureThreshold < 1 {
		bad("health.failure_threshold", "must be at least 1")
	}
	if c.Health.FailurePercent < 1 || c.Health.FailurePercent > 100 {
		bad("health.failure_percent", "must be between 1 and 100")
	}
	if c.Health.MaxEjectedPercent < 1 || c.Health.MaxEjectedPercent > 100 {
		bad("health.max_ejected_percent", "must be between 1 and 100")
	}
	if c.Health.MinRequests < 1 {
		bad("health.min_requests", "must be at least 1")
	}
	c.Idempotency.validate(bad)
	c.Search.validate(getenv, backendSecrets, bad)
	c.Log.validate(bad)
	c.Tracing.validate(getenv, backendSecrets, bad)
	c.Console.validate(bad)
	c.Payments.validate(getenv, backendSecrets, bad)
	if len(c.Models) == 0 {
		bad("models", "at least one model is required")
	}
	ids := map[string]bool{}
	for i := range c.Models {
		m := &c.Models[i]
		key := fmt.Sprintf("models[%d]", i)
		if m.ID == "" {
			bad(key+".id", "required")
		} else if ids[m.ID] {
			bad(key+".id", "duplicate model id %q", m.ID)
		}
		ids[m.ID] = true
		if m.ID != "" {
			key = fmt.Sprintf("models[%d] (%s)", i, m.ID)
		}
		if !tollgate.ValidKind(m.Kind) {
			bad(key+".kind", "%q is not one of coder, chat, cheap", m.Kind)
		}
		if m.ContextLength <= 0 {
			bad(key+".context_length", "must be a positive number of tokens")
		}
		if m.MaxOutputTokens <= 0 {
			bad(key+".max_output_tokens", "must be a positive number of tokens")
		} else if m.ContextLength > 0 && m.MaxOutputTokens > m.ContextLength {
			bad(key+".max_output_tokens", "must not exceed context_length")
		}
		if m.ImageTokens < 0 {
			bad(key+".image_tokens", "must not be negative")
		} else if m.ContextLength > 0 && m.ImageTokens > m.ContextLength {
			bad(key+".image_tokens", "must not exceed context_length")
		}
		m.SearchPrice = c.Search.Price
		if m.SearchPriceUSD != "" {
			var err error
			if m.SearchPrice, err = parsePrice(m.SearchPriceUSD); err != nil {
				bad(key+".search_price", "%v", err)
			}
		}
		if len(m.Backends) == 0 {
			bad(key+".backends", "at least one backend is required")
		}
		for j := range m.Backends {
			c.validateBackend(&m.Backends[j], fmt.Sprintf("%s.backends[%d]", key, j), getenv, backendSecrets, bad)
		}
	}
	return joinProblems(ps)
}

func (c *Config) validateBackend(b *Backend, key string, getenv func(string) string, backendSecrets bool, bad func(string, string, ...any)) {
	for _, cp := range b.Capabilities {
		if cp == tollgate.CapWebSearch {
			bad(key+".capabilities", "web_search is not a backend capability: tollgate serves web search itself for backends with tools")
		} else if _, ok := tollgate.ParseCapability(string(cp)); !ok {
			bad(key+".capabilities", "unknown capability %q (known: tools, reasoning, image_input, pdf_input)", cp)
		}
	}
	if b.UpstreamModel == "" {
		bad(key+".upstream_model", "required: the model name the backend knows")
	}
	var err error
	if b.Rates.Prices.Input, err = tollgate.ParseRate(b.Rates.Input); err != nil {
		bad(key+".rates.input", "%v (want a decimal string of USD per 1M tokens, e.g. \"0.15\")", err)
	}
	if b.Rates.Prices.Output, err = tollgate.ParseRate(b.Rates.Output); err != nil {
		bad(key+".rates.output", "%v (want a decimal string of USD per 1M tokens, e.g. \"0.60\")", err)
	}
	checkURL := func(k, u string) {
		p, err := url.Parse(u)
		if u == "" || err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			bad(k, "%q is not an http(s) base URL such as http://10.0.0.5:8000/v1", u)
		}
	}
	resolveKey := func(k, env string) string {
		if env == "" {
			return ""
		}
		v := getenv(env)
		if v == "" && backendSecrets {
			bad(k, "environment variable %s is empty or unset", env)
		}
		return v
	}
	switch b.Class {
	case tollgate.ClassNetwork:
		if len(b.Nodes) == 0 {
			bad(key+".nodes", "a network backend needs at least one node")
		}
		if b.URL != "" || b.KeyEnv != "" || b.Flavour != "" || b.MaxConcurrent != 0 {
			bad(key, "url, key_env, flavour and max_concurrent belong to each node of a network backend")
		}
		names := map[string]bool{}
		for n := range b.Nodes {
			nd := &b.Nodes[n]
			nk := fmt.Sprintf("%s.nodes[%d]", key, n)
			checkURL(nk+".url", nd.URL)
			if nd.Name == "" {
				// Node names reach clients (X-Tollgate-Node): never the address itself.
				sum := sha256.Sum256([]byte(nd.URL))
				nd.Name = "node-" + hex.EncodeToString(sum[:4])
			}
			if nd.HealthURL != "" {
				checkURL(nk+".health_url", nd.HealthURL)
			}
			if names[nd.Name] {
				bad(nk+".name", "duplicate node name %q in this backend", nd.Name)
			}
			names[nd.Name] = true
			if nd.Flavour == "" {
				nd.Flavour = openai.VLLM
			}
			switch nd.Flavour {
			case openai.VLLM, openai.SGLang, openai.LlamaCpp, openai.Ollama, openai.OpenAI:
			default:
				bad(nk+".flavour", "%q is not a node flavour (vllm, sglang, llamacpp, ollama, openai)", nd.Flavour)
			}
			if nd.MaxConcurrent < 0 {
				bad(nk+".max_concurrent", "must not be negative")
			}
			checkKVEvents(bad, nk, nd, b.Routing)
			nd.Key = resolveKey(nk+".key_env", nd.KeyEnv)
		}
		switch b.Routing {
		case "":
			b.Routing = DefaultRouting
		case RoutingPrefixCache, RoutingLeastOutstanding, RoutingRoundRobin:
		default:
			bad(key+".routing", "%q is not a routing policy (prefix_cache, least_outstanding, round_robin)", b.Routing)
		}
		switch {
		case b.LoadPoll == 0:
			b.LoadPoll = DefaultLoadPoll
			for _, nd := range b.Nodes {
				if nd.KVEvents != "" && nd.Flavour == openai.VLLM {
					b.LoadPoll = DefaultLoadPollWithKVEvents
				}
			}
		case b.LoadPoll != Off && b.LoadPoll < Duration(MinLoadPoll):
			bad(key+".load_poll", "want %s or more, or \"off\"", MinLoadPoll)
		}
		if b.PrefixMargin == nil {
			d := int64(DefaultPrefixMargin)
			if b.LoadPoll > 0 {
				d = DefaultLoadPollMargin
			}
			b.PrefixMargin = &d
		} else if *b.PrefixMargin < 0 {
			bad(key+".prefix_margin", "must not be negative")
		}
		if b.PrefixIndexTokens < 0 {
			bad(key+".prefix_index_tokens", "must not be negative")
		}
		if b.PrefixTTL < 0 {
			bad(key+".prefix_ttl", "want a duration such as \"10m\"")
		}

	case tollgate.ClassFallback:
		if len(b.Nodes) != 0 {
			bad(key+".nodes", "a fallback backend is one upstream: use url, key_env and flavour instead of nodes")
		}
		checkURL(key+".url", b.URL)
		if b.Flavour == "" {
			b.Flavour = openai.OpenAI
		}
		if b.Flavour != openai.OpenAI && b.Flavour != openai.OpenRouter {
			bad(key+".flavour", "%q is not a fallback flavour (openai, openrouter)", b.Flavour)
		}
		if b.MaxConcurrent < 0 {
			bad(key+".max_concurrent", "must not be negative")
		}
		if b.Routing != "" || b.PrefixMargin != nil || b.PrefixIndexTokens != 0 || b.PrefixTTL != 0 || b.LoadPoll != 0 {
			bad(key+".routing", "routing, load_poll and the prefix_* keys belong to a network backend (a fallback is one upstream)")
		}
		k := resolveKey(key+".key_env", b.KeyEnv)
		// A fallback is modelled as a one-node pool so routing treats both classes alike.
		b.Nodes = []Node{{Name: "fallback", URL: b.URL, KeyEnv: b.KeyEnv, Key: k, Flavour: b.Flavour, MaxConcurrent: b.MaxConcurrent}}
	default:
		bad(key+".class", "%q is not network or fallback", b.Class)
	}
}

// checkKVEvents checks a node's kv_events keys: ZeroMQ tcp endpoints with
// a host and a port, on a server that publishes such events (vLLM, SGLang),
// behind prefix-cache routing (the only reader).
func checkKVEvents(bad func(string, string, ...any), nk string, nd *Node, routing string) {
	if nd.KVEvents == "" {
		if nd.KVEventsReplay != "" {
			bad(nk+".kv_events_replay", "needs kv_events (the node's event socket)")
		}
		return
	}
	for _, e := range []struct{ key, v string }{{"kv_events", nd.KVEvents}, {"kv_events_replay", nd.KVEventsReplay}} {
		if e.v == "" {
			continue
		}
		host, port, err := net.SplitHostPort(strings.TrimPrefix(e.v, "tcp://"))
		if !strings.HasPrefix(e.v, "tcp://") || err != nil || host == "" || port == "" || host == "*" {
			bad(nk+"."+e.key, "want a ZeroMQ address tollgate connects to, tcp://host:port (got %q)", e.v)
		}
	}
	if nd.Flavour != openai.VLLM && nd.Flavour != openai.SGLang {
		bad(nk+".kv_events", "KV-cache events come from vllm and sglang nodes, not %s", nd.Flavour)
	}
	if routing != "" && routing != RoutingPrefixCache {
		bad(nk+".kv_events", "KV-cache events are read by prefix_cache routing only (this backend routes by %s)", routing)
	}
}

// Caps returns the backend's capability set.
func (b *Backend) Caps() tollgate.Capabilities { return tollgate.NewCapabilities(b.Capabilities...) }

// resolve makes a path relative to the config file's directory (SQLite's
// ":memory:" and "file:" names are left as they are).
func (c *Config) resolve(path string) string {
	if !strings.HasPrefix(path, "/") && !strings.HasPrefix(path, ":") && !strings.HasPrefix(path, "file:") && c.Dir != "" && c.Dir != "." {
		return c.Dir + "/" + path
	}
	return path
}

// sqliteInMemory reports whether an SQLite path names an in-memory database.
func sqliteInMemory(path string) bool {
	return path == ":memory:" || strings.Contains(path, "mode=memory")
}
