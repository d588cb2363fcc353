package config

import (
	"fmt"
	"net/url"
	"time"

	"github.com/tollgate/tollgate"
)

// Search configures web search (docs/config.md, "search"). Provider "off"
// (the default) refuses web_search_options with 400.
type Search struct {
	// Provider is searxng, brave or off.
	Provider string `yaml:"provider"`
	// URL is the SearXNG instance's base URL (required for searxng), or
	// the Brave Search API's (default https://api.search.brave.com).
	URL string `yaml:"url"`
	// APIKeyEnv names the variable holding Brave's subscription token.
	APIKeyEnv string `yaml:"api_key_env"`
	APIKey    string `yaml:"-"`
	// Timeout bounds each provider call. Default 10s.
	Timeout Duration `yaml:"timeout"`
	// MaxSearches is how many searches one request may run. Default 5, 1..20.
	MaxSearches int `yaml:"max_searches"`
	// CacheTTL is how long an answer is reused. Default 10m; "off": no cache.
	CacheTTL Duration `yaml:"cache_ttl"`
	// CacheEntries bounds the cache. Default 10000.
	CacheEntries int `yaml:"cache_entries"`
	// PriceUSD is the price of one search that ran, a decimal string of
	// USD with at most 12 decimals. Default "0".
	PriceUSD string `yaml:"price"`
	// Price is PriceUSD parsed.
	Price tollgate.Amount `yaml:"-"`
}

// Search providers.
const (
	SearchOff     = "off"
	SearchSearXNG = "searxng"
	SearchBrave   = "brave"
)

const (
	defaultMaxSearches  = 5
	maxMaxSearches      = 20
	maxSearchTimeout    = 2 * time.Minute
	maxCacheEntries     = 1_000_000
	defaultBraveBaseURL = "https://api.search.brave.com"
)

// Enabled reports whether a search provider is configured.
func (s *Search) Enabled() bool { return s.Provider != SearchOff }

func (s *Search) setDefaults() {
	if s.Provider == "" {
		s.Provider = SearchOff
	}
	if s.Timeout == 0 {
		s.Timeout = Duration(10 * time.Second)
	}
	if s.MaxSearches == 0 {
		s.MaxSearches = defaultMaxSearches
	}
	if s.CacheTTL == 0 {
		s.CacheTTL = Duration(10 * time.Minute)
	}
	if s.CacheEntries == 0 {
		s.CacheEntries = 10000
	}
	if s.PriceUSD == "" {
		s.PriceUSD = "0"
	}
	if s.Provider == SearchBrave && s.URL == "" {
		s.URL = defaultBraveBaseURL
	}
}

func (s *Search) validate(getenv func(string) string, secrets bool, bad func(key, format string, args ...any)) {
	switch s.Provider {
	case SearchOff, SearchSearXNG, SearchBrave:
	default:
		bad("search.provider", "%q is not searxng, brave or off", s.Provider)
	}
	if s.Enabled() {
		p, err := url.Parse(s.URL)
		if s.URL == "" || err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			bad("search.url", "%q is not an http(s) base URL such as http://127.0.0.1:8888", s.URL)
		} else if p.User != nil {
			bad("search.url", "must not hold credentials: secrets come from environment variables")
		}
	}
	switch {
	case s.Provider == SearchBrave && s.APIKeyEnv == "":
		bad("search.api_key_env", "required with brave: the variable holding the subscription token")
	case s.Provider == SearchBrave:
		s.APIKey = getenv(s.APIKeyEnv)
		if s.APIKey == "" && secrets {
			bad("search.api_key_env", "environment variable %s is empty or unset", s.APIKeyEnv)
		}
	case s.APIKeyEnv != "":
		bad("search.api_key_env", "only brave takes an API key")
	}
	if s.Timeout == Off || s.Timeout <= 0 || s.Timeout.D() > maxSearchTimeout {
		bad("search.timeout", "must be a duration between 1ms and %s", maxSearchTimeout)
	}
	if s.MaxSearches < 1 || s.MaxSearches > maxMaxSearches {
		bad("search.max_searches", "must be between 1 and %d", maxMaxSearches)
	}
	if s.CacheEntries < 1 || s.CacheEntries > maxCacheEntries {
		bad("search.cache_entries", "must be between 1 and %d", maxCacheEntries)
	}
	var err error
	if s.Price, err = parsePrice(s.PriceUSD); err != nil {
		bad("search.price", "%v", err)
	}
}

// parsePrice parses a price per search: a non-negative decimal string of
// USD with at most 12 decimals.
func parsePrice(v string) (tollgate.Amount, error) {
	a, err := tollgate.ParseAmount(v)
	if err != nil {
		return 0, fmt.Errorf("%v (want a decimal string of USD per search, e.g. \"0.005\")", err)
	}
	if a < 0 {
		return 0, fmt.Errorf("%q must not be negative", v)
	}
	return a, nil
}

// CacheTTLDuration is the cache TTL as search.Config takes it: negative
// when the cache is off.
func (s *Search) CacheTTLDuration() time.Duration {
	if s.CacheTTL == Off {
		return -1
	}
	return s.CacheTTL.D()
}
