package search

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tollgate/tollgate"
)

// countingProvider answers every query with n results of long multi-byte
// text, counting its calls; block, when set, holds each call until closed.
type countingProvider struct {
	calls    atomic.Int64
	location bool
	block    chan struct{}
	started  chan struct{} // receives once per call, when set
	lastCtx  atomic.Value  // context.Context of the last call
	lastLim  atomic.Int64
}

func (p *countingProvider) Name() string           { return "fake" }
func (p *countingProvider) SupportsLocation() bool { return p.location }

func (p *countingProvider) Search(ctx context.Context, q Query, limit int) ([]Result, error) {
	p.calls.Add(1)
	p.lastCtx.Store(ctx)
	p.lastLim.Store(int64(limit))
	if p.started != nil {
		p.started <- struct{}{}
	}
	if p.block != nil {
		select {
		case <-p.block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	out := make([]Result, 20)
	for i := range out {
		out[i] = Result{
			URL:     fmt.Sprintf("https://example.com/%d?q=%s", i, q.Text),
			Title:   fmt.Sprintf("Résultat %d", i),
			Content: strings.Repeat("naïve 日本語 😀 ", 400), // 4,800 code points, 1-4 bytes each
		}
	}
	return out, nil
}

// Results are cut per context size, at code points.
func TestServiceTrimsPerSize(t *testing.T) {
	p := &countingProvider{}
	s := NewWith(p, Config{})
	for _, size := range []ContextSize{Low, Medium, High} {
		res, err := s.Search(context.Background(), Query{Text: "x", Size: size})
		if err != nil {
			t.Fatal(err)
		}
		n, chars := Figures(size)
		if len(res) != n || int(p.lastLim.Load()) != n {
			t.Errorf("%s: %d results (limit asked %d), want %d", size, len(res), p.lastLim.Load(), n)
		}
		for _, r := range res {
			if !utf8.ValidString(r.Content) || utf8.RuneCountInString(r.Content) != chars || !strings.HasSuffix(r.Content, "…") {
				t.Fatalf("%s: content of %d code points (valid UTF-8 %t), want %d ending in …", size, utf8.RuneCountInString(r.Content), utf8.ValidString(r.Content), chars)
			}
		}
	}
}

func TestServiceCache(t *testing.T) {
	p := &countingProvider{location: true}
	s := NewWith(p, Config{CacheTTL: time.Minute, CacheEntries: 2})
	now := time.Unix(1_000_000, 0)
	s.cache.now = func() time.Time { return now }
	ctx := context.Background()
	search := func(q Query) []Result {
		t.Helper()
		res, err := s.Search(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	calls := func(want int64, what string) {
		t.Helper()
		if got := p.calls.Load(); got != want {
			t.Fatalf("%s: %d provider calls, want %d", what, got, want)
		}
	}
	a := Query{Text: "alpha", Size: Low}
	first := search(a)
	calls(1, "first search")
	first[0].Title = "changed by the caller"
	again := search(Query{Text: " alpha  ", Size: Low})
	calls(1, "same query (whitespace aside)")
	if again[0].Title == "changed by the caller" {
		t.Error("a caller's change reached the cache")
	}
	search(Query{Text: "alpha", Size: High})
	calls(2, "another size")
	berlin := Query{Text: "alpha", Size: Low, Location: &Location{City: "Berlin"}}
	search(berlin)
	calls(3, "a location")
	search(Query{Text: "alpha", Size: Low, Location: &Location{City: "Paris"}})
	calls(4, "another location")

	// Two entries at most: the least recently used went first.
	if s.cache.len() != 2 {
		t.Errorf("cache holds %d entries, want 2", s.cache.len())
	}
	search(Query{Text: "alpha", Size: Low, Location: &Location{City: "Paris"}})
	calls(4, "the newest entry")
	search(a)
	calls(5, "an evicted entry")

	// Expiry.
	now = now.Add(59 * time.Second)
	search(a)
	calls(5, "before the TTL")
	now = now.Add(time.Minute)
	search(a)
	calls(6, "after the TTL")
}

func TestServiceCacheOffAndLocationIgnored(t *testing.T) {
	p := &countingProvider{}
	s := NewWith(p, Config{CacheTTL: -1})
	for range 3 {
		if _, err := s.Search(context.Background(), Query{Text: "q"}); err != nil {
			t.Fatal(err)
		}
	}
	if p.calls.Load() != 3 {
		t.Errorf("cache off: %d calls, want 3", p.calls.Load())
	}
	// A provider without location support: the location is not part of
	// the key (and is not passed on).
	p = &countingProvider{}
	s = NewWith(p, Config{})
	for _, city := range []string{"Berlin", "Paris"} {
		if _, err := s.Search(context.Background(), Query{Text: "q", Location: &Location{City: city}}); err != nil {
			t.Fatal(err)
		}
	}
	if p.calls.Load() != 1 {
		t.Errorf("location-blind provider: %d calls, want 1", p.calls.Load())
	}
}

// Concurrent identical searches share one provider call; a caller that
// leaves gets its context's error without failing the others; the call is
// cancelled when the last caller leaves.
func TestServiceSharedCallsAndCancellation(t *testing.T) {
	p := &countingProvider{block: make(chan struct{}), started: make(chan struct{}, 10)}
	s := NewWith(p, Config{CacheTTL: -1})
	var wg sync.WaitGroup
	errs := make([]error, 4)
	ctxLeaving, leave := context.WithCancel(context.Background())
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			if i == 0 {
				ctx = ctxLeaving
			}
			_, errs[i] = s.Search(ctx, Query{Text: "shared"})
		}()
	}
	<-p.started
	waitWaiters(t, s, "shared", 4)
	leave()
	waitWaiters(t, s, "shared", 3)
	close(p.block)
	wg.Wait()
	if p.calls.Load() != 1 {
		t.Errorf("%d provider calls, want 1", p.calls.Load())
	}
	if !errors.Is(errs[0], context.Canceled) || tollgate.ErrorCode(errs[0]) == tollgate.CodeSearchUnavailable {
		t.Errorf("the leaving caller: %v, want context.Canceled", errs[0])
	}
	for _, err := range errs[1:] {
		if err != nil {
			t.Errorf("a staying caller: %v", err)
		}
	}

	// The only caller leaves: the provider call is cancelled.
	p = &countingProvider{block: make(chan struct{}), started: make(chan struct{}, 1)}
	s = NewWith(p, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { _, err := s.Search(ctx, Query{Text: "alone"}); done <- err }()
	<-p.started
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("error %v, want context.Canceled", err)
	}
	callCtx := p.lastCtx.Load().(context.Context)
	select {
	case <-callCtx.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("the provider call was not cancelled when its only caller left")
	}
	if _, ok := s.cache.get(cacheKey(Query{Text: "alone", Size: Medium})); ok {
		t.Error("a cancelled search was cached")
	}
}

func waitWaiters(t *testing.T, s *Service, text string, n int) {
	t.Helper()
	key := cacheKey(Query{Text: text, Size: Medium})
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		f := s.flights[key]
		got := 0
		if f != nil {
			got = f.waiters
		}
		s.mu.Unlock()
		if got == n {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("never %d callers waiting on %q", n, text)
}

// A client's disconnect reaches the HTTP provider: its request is cancelled.
func TestServiceCancelReachesProvider(t *testing.T) {
	arrived, gone := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-r.Context().Done()
		close(gone)
	}))
	defer srv.Close()
	s, err := New(Config{Provider: "searxng", URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-arrived; cancel() }()
	if _, err := s.Search(ctx, Query{Text: "q"}); !errors.Is(err, context.Canceled) {
		t.Errorf("error %v, want context.Canceled", err)
	}
	select {
	case <-gone:
	case <-time.After(2 * time.Second):
		t.Fatal("the provider's request was not cancelled")
	}
}

// A long query is cut to MaxQueryChars code points, without an ellipsis
// (it goes to a search engine, not to a reader).
func TestServiceCutsLongQueries(t *testing.T) {
	var got string
	p := providerFunc(func(ctx context.Context, q Query, limit int) ([]Result, error) {
		got = q.Text
		return nil, nil
	})
	s := NewWith(p, Config{})
	res, err := s.Search(context.Background(), Query{Text: strings.Repeat("ö", MaxQueryChars+10)})
	if err != nil || len(res) != 0 {
		t.Fatalf("%v, %v", res, err)
	}
	if got != strings.Repeat("ö", MaxQueryChars) {
		t.Errorf("query of %d code points sent: %.20q...", utf8.RuneCountInString(got), got)
	}
}

type providerFunc func(ctx context.Context, q Query, limit int) ([]Result, error)

func (f providerFunc) Name() string { return "func" }
func (f providerFunc) Search(ctx context.Context, q Query, limit int) ([]Result, error) {
	return f(ctx, q, limit)
}

func TestServiceRefusesEmptyQuery(t *testing.T) {
	s := NewWith(&countingProvider{}, Config{})
	_, err := s.Search(context.Background(), Query{Text: " \n "})
	if tollgate.ErrorCode(err) != tollgate.CodeInvalidRequest {
		t.Errorf("error %v, want invalid_request", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Search(ctx, Query{Text: "q"}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
}
