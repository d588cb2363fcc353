package search

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
)

// searxngAnswerJSON is a SearXNG page as its JSON API sends it (fields the
// provider does not read included), with a duplicate, an empty URL and an
// untitled result.
const searxngAnswerJSON = `{"query": "go release", "number_of_results": 0, "results": [
 {"url": "https://go.dev/doc/devel/release", "title": "Release History - The Go Programming Language",
  "content": "Go 1.26 &amp; later:\n  the <b>release</b> notes.", "engine": "duckduckgo", "engines": ["duckduckgo", "brave"],
  "parsed_url": ["https", "go.dev", "/doc/devel/release", "", "", ""], "score": 4.5, "category": "general", "publishedDate": null},
 {"url": "https://go.dev/doc/devel/release", "title": "duplicate", "content": "dup", "engine": "google", "score": 1},
 {"url": "", "title": "no url", "content": "dropped"},
 {"url": "javascript:alert(1)", "title": "not http", "content": "dropped"},
 {"url": "http://go.dev/doc/devel/release/#top", "title": "the same page", "content": "dropped"},
 {"url": "https://ja.example.org/go", "title": "", "content": "日本語の説明文です。", "engine": "bing", "score": 0.5},
 {"url": "https://c.example/", "title": "C", "content": "c"},
 {"url": "https://d.example/", "title": "D", "content": "d"},
 {"url": "https://e.example/", "title": "E", "content": "e"},
 {"url": "https://f.example/", "title": "F", "content": "f"}
], "answers": [], "corrections": [], "infoboxes": [], "suggestions": ["go"], "unresponsive_engines": []}`

func fakeSearXNG(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func TestSearXNGRequestAndParsing(t *testing.T) {
	var got http.Header
	var query string
	srv := fakeSearXNG(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/search" {
			http.NotFound(w, r)
			return
		}
		got, query = r.Header.Clone(), r.URL.RawQuery
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, searxngAnswerJSON)
	})
	s, err := New(Config{Provider: "searxng", URL: srv.URL + "/"})
	if err != nil {
		t.Fatal(err)
	}
	if s.ProviderName() != "searxng" || s.SupportsLocation() {
		t.Errorf("name %q, location %t", s.ProviderName(), s.SupportsLocation())
	}
	res, err := s.Search(context.Background(), Query{Text: "  go   release ", Size: Low, Location: &Location{Country: "DE"}})
	if err != nil {
		t.Fatal(err)
	}
	if query != "format=json&pageno=1&q=go+release" {
		t.Errorf("query string %q", query)
	}
	if got.Get("User-Agent") != "tollgate" {
		t.Errorf("User-Agent %q", got.Get("User-Agent"))
	}
	want := []Result{
		{URL: "https://go.dev/doc/devel/release", Title: "Release History - The Go Programming Language", Content: "Go 1.26 & later: the release notes."},
		{URL: "https://ja.example.org/go", Title: "https://ja.example.org/go", Content: "日本語の説明文です。"},
		{URL: "https://c.example/", Title: "C", Content: "c"},
	}
	if fmt.Sprint(res) != fmt.Sprint(want) {
		t.Errorf("results\n got %q\nwant %q", res, want)
	}
}

// braveAnswerJSON is a Brave web search answer: <strong> marks in the
// descriptions, extra snippets, fields the provider does not read.
const braveAnswerJSON = `{"type": "search", "query": {"original": "q", "more_results_available": true},
 "web": {"type": "search", "family_friendly": true, "results": [
  {"title": "Brave <strong>Search</strong> API", "url": "https://brave.com/search/api/", "is_source_local": false,
   "description": "Power your <strong>agents</strong> with the web.", "extra_snippets": ["Over 30 billion pages.", "Updated daily."],
   "page_age": "2025-01-15", "profile": {"name": "Brave"}},
  {"title": "", "url": "https://example.com/x", "description": "Straße &amp; Café"}
 ]}, "locations": {"results": []}, "rich": null}`

func TestBraveRequestAndParsing(t *testing.T) {
	var got *http.Request
	srv := fakeSearXNG(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/res/v1/web/search" {
			http.NotFound(w, r)
			return
		}
		got = r.Clone(context.Background())
		fmt.Fprint(w, braveAnswerJSON)
	})
	s, err := New(Config{Provider: "brave", URL: srv.URL, APIKey: "secret-key"})
	if err != nil {
		t.Fatal(err)
	}
	if s.ProviderName() != "brave" || !s.SupportsLocation() {
		t.Errorf("name %q, location %t", s.ProviderName(), s.SupportsLocation())
	}
	loc := &Location{Country: "US", Region: "CA", City: "San Francisco", Timezone: "America/Los_Angeles"}
	res, err := s.Search(context.Background(), Query{Text: "brave api", Size: High, Location: loc})
	if err != nil {
		t.Fatal(err)
	}
	q := got.URL.Query()
	if q.Get("q") != "brave api" || q.Get("count") != "10" || q.Get("country") != "US" {
		t.Errorf("query %v", q)
	}
	for k, v := range map[string]string{
		"Accept": "application/json", "X-Subscription-Token": "secret-key", "User-Agent": "tollgate",
		"X-Loc-City": "San Francisco", "X-Loc-State": "CA", "X-Loc-Country": "US", "X-Loc-Timezone": "America/Los_Angeles",
	} {
		if got.Header.Get(k) != v {
			t.Errorf("header %s = %q, want %q", k, got.Header.Get(k), v)
		}
	}
	want := []Result{
		{URL: "https://brave.com/search/api/", Title: "Brave Search API", Content: "Power your agents with the web. Over 30 billion pages. Updated daily."},
		{URL: "https://example.com/x", Title: "https://example.com/x", Content: "Straße & Café"},
	}
	if fmt.Sprint(res) != fmt.Sprint(want) {
		t.Errorf("results\n got %q\nwant %q", res, want)
	}

	// A region name goes in X-Loc-State-Name; a country Brave does not
	// list for its country parameter goes in the header only.
	if _, err := s.Search(context.Background(), Query{Text: "x", Size: Low, Location: &Location{Country: "SG", Region: "Central Region", City: "Singapore"}}); err != nil {
		t.Fatal(err)
	}
	if got.URL.Query().Has("country") || got.Header.Get("X-Loc-Country") != "SG" || got.Header.Get("X-Loc-State-Name") != "Central Region" ||
		got.Header.Get("X-Loc-State") != "" || got.URL.Query().Get("count") != "3" {
		t.Errorf("query %v, headers %v", got.URL.Query(), got.Header)
	}
	// No location: no X-Loc headers.
	if _, err := s.Search(context.Background(), Query{Text: "y"}); err != nil {
		t.Fatal(err)
	}
	for k := range got.Header {
		if strings.HasPrefix(k, "X-Loc") {
			t.Errorf("header %s sent without a location", k)
		}
	}
}

func TestBraveQueryLimits(t *testing.T) {
	long := strings.Repeat("word ", 60)
	if got := braveQuery(long); len(strings.Fields(got)) != 50 {
		t.Errorf("%d words", len(strings.Fields(got)))
	}
	long = strings.Repeat("ü", 300) + " " + strings.Repeat("é", 300)
	if got := braveQuery(long); got != strings.Repeat("ü", 300) {
		t.Errorf("cut at %d characters", len([]rune(got)))
	}
	if got := braveQuery(strings.Repeat("x", 500)); len(got) != 400 {
		t.Errorf("one long word cut at %d", len(got))
	}
}

// Every provider failure is search_unavailable, with a message that names
// neither the provider's URL nor its key.
func TestProviderFailures(t *testing.T) {
	var delay atomic.Int64
	handlers := map[string]http.HandlerFunc{
		"403":     func(w http.ResponseWriter, r *http.Request) { http.Error(w, "Forbidden", http.StatusForbidden) },
		"500":     func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", http.StatusInternalServerError) },
		"garbage": func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"results": [{"url": 5`) },
		"html":    func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `<html>not json</html>`) },
		"redirect": func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "http://elsewhere.example/", http.StatusFound)
		},
		"huge": func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, `{"results": [{"url": "https://a", "content": "`+strings.Repeat("x", maxBody)+`"}]}`)
		},
		"slow": func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-time.After(time.Duration(delay.Load())):
			case <-r.Context().Done():
			}
			fmt.Fprint(w, `{"results": []}`)
		},
	}
	delay.Store(int64(5 * time.Second))
	for _, provider := range []string{"searxng", "brave"} {
		for name, h := range handlers {
			srv := fakeSearXNG(t, h)
			timeout := 10 * time.Second // the 4 MiB answer takes a while under -race
			if name == "slow" {
				timeout = 200 * time.Millisecond
			}
			s, err := New(Config{Provider: provider, URL: srv.URL, APIKey: "sk-SECRET", Timeout: timeout})
			if err != nil {
				t.Fatal(err)
			}
			_, err = s.Search(context.Background(), Query{Text: "q"})
			var e *tollgate.Error
			if !errors.As(err, &e) || e.Code != tollgate.CodeSearchUnavailable {
				t.Errorf("%s %s: error %v, want search_unavailable", provider, name, err)
				continue
			}
			host := strings.TrimPrefix(srv.URL, "http://")
			if strings.Contains(e.Message, host) || strings.Contains(e.Message, "SECRET") || strings.Contains(e.Error(), "SECRET") {
				t.Errorf("%s %s: the error leaks the URL or key: %q", provider, name, e.Error())
			}
			if !strings.Contains(e.Message, provider) || e.Err == nil {
				t.Errorf("%s %s: message %q, cause %v", provider, name, e.Message, e.Err)
			}
			switch name {
			case "403":
				if !strings.Contains(e.Message, "HTTP 403") {
					t.Errorf("%s 403: %q", provider, e.Message)
				}
				if provider == "searxng" && !strings.Contains(e.Err.Error(), "search.formats") {
					t.Errorf("searxng 403: the cause does not explain the JSON format: %v", e.Err)
				}
			case "500":
				if !strings.Contains(e.Message, "HTTP 500") {
					t.Errorf("%s 500: %q", provider, e.Message)
				}
			case "redirect":
				if !strings.Contains(e.Message, "HTTP 302") {
					t.Errorf("%s redirect followed or misreported: %q", provider, e.Message)
				}
			case "garbage", "html", "huge":
				if !strings.Contains(e.Message, "could not be read") {
					t.Errorf("%s %s: %q", provider, name, e.Message)
				}
			case "slow":
				if !strings.Contains(e.Message, "did not answer within 200ms") || !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("%s slow: %q", provider, e.Error())
				}
			}
		}
	}
	// An unreachable provider.
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close()
	s, _ := New(Config{Provider: "searxng", URL: srv.URL})
	_, err := s.Search(context.Background(), Query{Text: "q"})
	var e *tollgate.Error
	if !errors.As(err, &e) || e.Code != tollgate.CodeSearchUnavailable || !strings.Contains(e.Message, "could not be reached") ||
		strings.Contains(e.Message, strings.TrimPrefix(srv.URL, "http://")) {
		t.Errorf("unreachable: %v", err)
	}
}

func TestNewRefusesIncompleteConfig(t *testing.T) {
	for _, cfg := range []Config{{Provider: "searxng"}, {Provider: "brave"}, {Provider: "bing", URL: "http://x"}} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}
