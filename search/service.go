package search

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tollgate/tollgate"
)

// Defaults of Config.
const (
	DefaultTimeout      = 10 * time.Second
	DefaultCacheTTL     = 10 * time.Minute
	DefaultCacheEntries = 10000
)

// MaxQueryChars bounds a query's length (code points); the model's longer
// queries are cut. Search engines match on the first words anyway.
const MaxQueryChars = 400

// Config builds a Service.
type Config struct {
	Provider string // "searxng" | "brave"
	// URL is the SearXNG instance's base URL, or Brave's (default BraveURL;
	// overridable for tests).
	URL    string
	APIKey string // Brave's subscription token
	// Timeout bounds each provider call. Default 10s.
	Timeout time.Duration
	// CacheTTL is how long an answer is reused. 0 means the default (10m);
	// negative disables the cache.
	CacheTTL time.Duration
	// CacheEntries bounds the cache (least recently used answers go first).
	// 0 means the default (10000).
	CacheEntries int
	// Client is the HTTP client for the provider (optional, for tests).
	// Redirects are never followed whatever it says.
	Client *http.Client
}

// Service wraps a provider. It trims results per context size, caches
// answers per (query text, size, location) for a TTL in a bounded LRU,
// bounds each provider call with a timeout, and turns every provider
// failure into *tollgate.Error{Code: CodeSearchUnavailable} whose message
// never holds the provider's URL or key (the cause is in Err, for logs).
//
// Concurrent identical searches (same cache key) share one provider call.
// That call runs on its own context, carrying the first caller's values
// but not its cancellation: a caller that goes away returns its context's
// error at once, and the call is cancelled only when every caller waiting
// for it has gone. So one client's disconnect never fails another's
// search, and a search nobody waits for stops.
//
// A Service is safe for concurrent use.
type Service struct {
	p        Provider
	timeout  time.Duration
	location bool // the provider takes the location

	mu      sync.Mutex
	cache   *lru // nil: no cache
	flights map[string]*flight
}

// flight is one provider call shared by the callers of one key.
type flight struct {
	done    chan struct{}
	res     []Result
	err     error
	waiters int // guarded by Service.mu
	cancel  context.CancelFunc
}

// New builds the Service for a configured provider.
func New(cfg Config) (*Service, error) {
	var p Provider
	switch cfg.Provider {
	case "searxng":
		if cfg.URL == "" {
			return nil, errors.New("search: searxng needs the instance's URL")
		}
		p = NewSearXNG(cfg.URL, cfg.Client)
	case "brave":
		if cfg.APIKey == "" {
			return nil, errors.New("search: brave needs an API key")
		}
		p = NewBrave(cfg.URL, cfg.APIKey, cfg.Client)
	default:
		return nil, fmt.Errorf("search: unknown provider %q (searxng, brave)", cfg.Provider)
	}
	return NewWith(p, cfg), nil
}

// NewWith builds a Service around any provider; cfg's Timeout and cache
// settings apply, its Provider, URL, APIKey and Client are ignored.
func NewWith(p Provider, cfg Config) *Service {
	s := &Service{p: p, timeout: cfg.Timeout, flights: map[string]*flight{}}
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	if la, ok := p.(locationAware); ok {
		s.location = la.SupportsLocation()
	}
	ttl, n := cfg.CacheTTL, cfg.CacheEntries
	if ttl == 0 {
		ttl = DefaultCacheTTL
	}
	if n <= 0 {
		n = DefaultCacheEntries
	}
	if ttl > 0 {
		s.cache = newLRU(n, ttl, time.Now)
	}
	return s
}

// ProviderName is the provider's name ("searxng", "brave").
func (s *Service) ProviderName() string { return s.p.Name() }

// SupportsLocation reports whether the provider takes the user's location.
// When it does not, give the location to the model as context instead.
func (s *Service) SupportsLocation() bool { return s.location }

// Search runs q: at most Figures(q.Size) results, each cleaned and cut.
// The returned slice is the caller's. Errors: the caller's context error
// when ctx ends first; *tollgate.Error with CodeSearchUnavailable when the
// provider fails or times out; CodeInvalidRequest for an empty query.
func (s *Service) Search(ctx context.Context, q Query) ([]Result, error) {
	q.Text = firstRunes(strings.Join(strings.Fields(q.Text), " "), MaxQueryChars)
	if q.Text == "" {
		return nil, tollgate.Errorf(tollgate.CodeInvalidRequest, "a web search needs a query")
	}
	switch q.Size {
	case Low, Medium, High:
	default:
		q.Size = Medium
	}
	if !s.location {
		q.Location = nil // the answer does not depend on it: share the cache entry
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	key := cacheKey(q)

	s.mu.Lock()
	if s.cache != nil {
		if res, ok := s.cache.get(key); ok {
			s.mu.Unlock()
			return slices.Clone(res), nil
		}
	}
	f := s.flights[key]
	if f == nil {
		callCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
		f = &flight{done: make(chan struct{}), cancel: cancel}
		s.flights[key] = f
		go s.run(callCtx, key, q, f)
	}
	f.waiters++
	s.mu.Unlock()

	select {
	case <-f.done:
		if f.err != nil {
			return nil, f.err
		}
		return slices.Clone(f.res), nil
	case <-ctx.Done():
		s.mu.Lock()
		f.waiters--
		if f.waiters == 0 {
			f.cancel()
			if s.flights[key] == f {
				delete(s.flights, key) // a new caller starts afresh
			}
		}
		s.mu.Unlock()
		return nil, ctx.Err()
	}
}

// run makes the provider call of flight f and publishes its outcome.
func (s *Service) run(ctx context.Context, key string, q Query, f *flight) {
	defer f.cancel()
	n, chars := Figures(q.Size)
	raw, err := s.p.Search(ctx, q, n)
	if err != nil {
		f.err = s.failure(ctx, err)
	} else {
		f.res = trim(raw, n, chars)
	}
	s.mu.Lock()
	if s.flights[key] == f {
		delete(s.flights, key)
	}
	if err == nil && s.cache != nil && ctx.Err() == nil {
		s.cache.put(key, f.res)
	}
	s.mu.Unlock()
	close(f.done)
}

// failure turns a provider error into search_unavailable, its message
// free of URLs and keys.
func (s *Service) failure(ctx context.Context, err error) error {
	name := s.p.Name()
	var msg string
	var se *statusError
	var de *decodeError
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		msg = fmt.Sprintf("web search failed: the search provider (%s) did not answer within %s", name, s.timeout)
		err = fmt.Errorf("%w (%w)", context.DeadlineExceeded, err)
	case errors.Is(ctx.Err(), context.Canceled):
		msg = "web search was cancelled"
	case errors.As(err, &se):
		msg = fmt.Sprintf("web search failed: the search provider (%s) answered HTTP %d", name, se.status)
	case errors.As(err, &de):
		msg = fmt.Sprintf("web search failed: the search provider (%s) sent an answer that could not be read", name)
	default:
		msg = fmt.Sprintf("web search failed: the search provider (%s) could not be reached", name)
	}
	return &tollgate.Error{Code: tollgate.CodeSearchUnavailable, Message: msg, Err: fmt.Errorf("%s: %w", name, err)}
}

// trim cleans the provider's results: results without an http(s) URL
// dropped (a javascript: link must not become a citation), duplicates
// (the same URL up to scheme, host case, trailing slash, fragment) dropped, at most n kept, titles and texts cleaned and cut to
// chars code points (a title to 200), a missing title replaced by the URL.
func trim(raw []Result, n, chars int) []Result {
	out := make([]Result, 0, min(len(raw), n))
	seen := make(map[string]bool, n)
	for _, r := range raw {
		if len(out) == n {
			break
		}
		u := strings.TrimSpace(r.URL)
		k := normURL(u)
		if k == "" || seen[k] {
			continue // no http(s) URL, or one already listed (up to what Annotate ignores)
		}
		seen[k] = true
		title := cutText(cleanText(r.Title), maxTitle)
		if title == "" {
			title = u
		}
		out = append(out, Result{URL: u, Title: title, Content: cutText(cleanText(r.Content), chars)})
	}
	return out
}

// maxTitle bounds a result's title (code points).
const maxTitle = 200

func cacheKey(q Query) string {
	var b strings.Builder
	b.Grow(len(q.Text) + 16)
	b.WriteString(string(q.Size))
	b.WriteByte(0)
	b.WriteString(q.Text)
	if l := q.Location; l != nil {
		for _, f := range []string{l.Country, l.Region, l.City, l.Timezone} {
			b.WriteByte(0)
			b.WriteString(f)
		}
	}
	return b.String()
}

// lru is a bounded cache whose entries expire ttl after they were stored.
// Not safe for concurrent use: the Service holds its lock.
type lru struct {
	max   int
	ttl   time.Duration
	now   func() time.Time
	order *list.List // front: most recently used; values *lruEntry
	items map[string]*list.Element
}

type lruEntry struct {
	key     string
	res     []Result
	expires time.Time
}

func newLRU(max int, ttl time.Duration, now func() time.Time) *lru {
	return &lru{max: max, ttl: ttl, now: now, order: list.New(), items: map[string]*list.Element{}}
}

func (c *lru) get(key string) ([]Result, bool) {
	el, ok := c.items[key]
	if !ok {
		return nil, false
	}
	e := el.Value.(*lruEntry)
	if !c.now().Before(e.expires) {
		c.order.Remove(el)
		delete(c.items, key)
		return nil, false
	}
	c.order.MoveToFront(el)
	return e.res, true
}

func (c *lru) put(key string, res []Result) {
	exp := c.now().Add(c.ttl)
	if el, ok := c.items[key]; ok {
		e := el.Value.(*lruEntry)
		e.res, e.expires = res, exp
		c.order.MoveToFront(el)
		return
	}
	for c.order.Len() >= c.max {
		old := c.order.Back()
		c.order.Remove(old)
		delete(c.items, old.Value.(*lruEntry).key)
	}
	c.items[key] = c.order.PushFront(&lruEntry{key: key, res: res, expires: exp})
}

func (c *lru) len() int { return c.order.Len() }
