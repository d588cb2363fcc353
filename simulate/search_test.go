package simulate

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// searxngAnswer is SearXNG's JSON answer, as a client decodes it.
type searxngAnswer struct {
	Query           string `json:"query"`
	NumberOfResults *int   `json:"number_of_results"`
	Results         []struct {
		URL           string   `json:"url"`
		Title         string   `json:"title"`
		Content       string   `json:"content"`
		Engine        string   `json:"engine"`
		Engines       []string `json:"engines"`
		ParsedURL     []string `json:"parsed_url"`
		Score         float64  `json:"score"`
		Category      string   `json:"category"`
		PublishedDate *string  `json:"publishedDate"`
	} `json:"results"`
	Answers             []any      `json:"answers"`
	Corrections         []any      `json:"corrections"`
	Infoboxes           []any      `json:"infoboxes"`
	Suggestions         []string   `json:"suggestions"`
	UnresponsiveEngines [][]string `json:"unresponsive_engines"`
}

// braveAnswer is Brave's web-search answer, as a client decodes it.
type braveAnswer struct {
	Type  string `json:"type"`
	Query struct {
		Original string `json:"original"`
		City     string `json:"city"`
		Country  string `json:"country"`
	} `json:"query"`
	Web *struct {
		Type    string `json:"type"`
		Results []struct {
			Title         string   `json:"title"`
			URL           string   `json:"url"`
			Description   string   `json:"description"`
			ExtraSnippets []string `json:"extra_snippets"`
			Age           string   `json:"age"`
			PageAge       string   `json:"page_age"`
			Type          string   `json:"type"`
		} `json:"results"`
	} `json:"web"`
}

type braveErr struct {
	Type  string `json:"type"`
	Error struct {
		ID     string          `json:"id"`
		Status int             `json:"status"`
		Code   string          `json:"code"`
		Detail string          `json:"detail"`
		Meta   json.RawMessage `json:"meta"`
	} `json:"error"`
	Time int64 `json:"time"`
}

const testToken = "sim-token"

func startSearch(t *testing.T, cfg SearchConfig) *RunningSearch {
	t.Helper()
	run, err := StartSearch(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run.Close() })
	return run
}

// getSearch sends a search the way each provider's client does.
func getSearch(ctx context.Context, run *RunningSearch, query string, extra url.Values, header map[string]string) (*http.Response, []byte, error) {
	v := url.Values{"q": {query}}
	path := "/search"
	if run.Flavour() == Brave {
		path = bravePath
	} else if extra == nil || extra.Get("format") == "" {
		v.Set("format", "json")
	}
	for k, vs := range extra {
		v[k] = vs
	}
	req, _ := http.NewRequestWithContext(ctx, "GET", run.URL()+path+"?"+v.Encode(), nil)
	if run.Flavour() == Brave {
		req.Header.Set("X-Subscription-Token", testToken)
	}
	for k, val := range header {
		if val == "" {
			req.Header.Del(k)
			continue
		}
		req.Header.Set(k, val)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

func TestSearXNGShape(t *testing.T) {
	run := startSearch(t, SearchConfig{Flavour: SearXNG})
	resp, body, err := getSearch(context.Background(), run, "tollgate gateway", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var a searxngAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		t.Fatalf("decode: %v\n%s", err, body)
	}
	if a.Query != "tollgate gateway" || a.NumberOfResults == nil || len(a.Results) != 20 {
		t.Fatalf("query %q, number_of_results %v, %d results", a.Query, a.NumberOfResults, len(a.Results))
	}
	if a.Answers == nil || a.Corrections == nil || a.Infoboxes == nil || a.UnresponsiveEngines == nil {
		t.Errorf("missing list fields: %s", body[:200])
	}
	multi := 0
	urls := map[string]bool{}
	for i, r := range a.Results {
		u, err := url.Parse(r.URL)
		if err != nil || u.Scheme != "https" || !strings.HasSuffix(u.Host, ".example") {
			t.Errorf("result %d url %q", i, r.URL)
		}
		if urls[r.URL] {
			t.Errorf("result %d repeats url %q", i, r.URL)
		}
		urls[r.URL] = true
		if len(r.ParsedURL) != 6 || r.ParsedURL[0] != "https" || r.ParsedURL[1] != u.Host || r.ParsedURL[2] != u.Path {
			t.Errorf("result %d parsed_url %q for %q", i, r.ParsedURL, r.URL)
		}
		if r.Title == "" || r.Content == "" || r.Engine == "" || len(r.Engines) == 0 || r.Engines[0] != r.Engine || r.Category != "general" || r.Score <= 0 {
			t.Errorf("result %d incomplete: %+v", i, r)
		}
		if len(r.Title) != utf8.RuneCountInString(r.Title) || len(r.Content) != utf8.RuneCountInString(r.Content) {
			multi++
		}
	}
	if multi < 5 {
		t.Errorf("only %d results with multi-byte text", multi)
	}
	// Python's json.dumps: spaces after separators, non-ASCII escaped,
	// emoji as a surrogate pair.
	if !strings.Contains(string(body), `{"query": "tollgate gateway", "number_of_results": 0, "results": [{"url": "https://`) {
		t.Errorf("not json.dumps style: %.120s", body)
	}
	if !strings.Contains(string(body), `\ud83c\udf0d`) || !utf8.ValidString(string(body)) || strings.ContainsRune(string(body), '🌍') {
		t.Error("non-ASCII text not escaped as json.dumps does")
	}
	// Deterministic; page 2 continues.
	_, again, _ := getSearch(context.Background(), run, "tollgate gateway", nil, nil)
	if string(again) != string(body) {
		t.Error("the same query gave a different answer")
	}
	_, page2, _ := getSearch(context.Background(), run, "tollgate gateway", url.Values{"pageno": {"2"}}, nil)
	var a2 searxngAnswer
	if err := json.Unmarshal(page2, &a2); err != nil || len(a2.Results) == 0 || urls[a2.Results[0].URL] {
		t.Errorf("page 2: %v, %d results", err, len(a2.Results))
	}
	// The counters change after the answer is written: wait, do not sleep.
	if err := run.WaitStats(waitLimit, func(st SearchStats) bool {
		return st.Requests == 3 && st.Completed == 3 && st.InFlight == 0
	}); err != nil {
		t.Error(err)
	}
}

func TestSearXNGFormats(t *testing.T) {
	run := startSearch(t, SearchConfig{Flavour: SearXNG})
	resp, body, err := getSearch(context.Background(), run, "café", url.Values{"format": {"html"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") || json.Valid(body) {
		t.Errorf("html: status %d type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	off := startSearch(t, SearchConfig{Flavour: SearXNG, JSONDisabled: true})
	resp, body, _ = getSearch(context.Background(), off, "café", nil, nil)
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "403 Forbidden") {
		t.Errorf("json disabled: status %d %s", resp.StatusCode, body)
	}
	resp, _, _ = getSearch(context.Background(), off, "café", url.Values{"format": {"html"}}, nil)
	if resp.StatusCode != 200 {
		t.Errorf("json disabled, html: status %d", resp.StatusCode)
	}
}

func TestSearchNoResults(t *testing.T) {
	for _, f := range []SearchFlavour{SearXNG, Brave} {
		run := startSearch(t, SearchConfig{Flavour: f})
		resp, body, err := getSearch(context.Background(), run, "noresults please", nil, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %v %v", f, err, resp)
		}
		if f == SearXNG {
			var a searxngAnswer
			if err := json.Unmarshal(body, &a); err != nil || len(a.Results) != 0 || len(a.UnresponsiveEngines) != 1 {
				t.Errorf("searxng: %v %s", err, body)
			}
			continue
		}
		var a braveAnswer
		if err := json.Unmarshal(body, &a); err != nil || a.Type != "search" || a.Web != nil {
			t.Errorf("brave: %v %s", err, body)
		}
	}
}

func TestBraveShape(t *testing.T) {
	run := startSearch(t, SearchConfig{Flavour: Brave, Token: testToken})
	hdr := map[string]string{"X-Loc-Country": "FR", "X-Loc-City": "Paris", "X-Loc-State": "IDF", "X-Loc-Timezone": "Europe/Paris"}
	resp, body, err := getSearch(context.Background(), run, "résumé tips", url.Values{"count": {"5"}, "extra_snippets": {"true"}, "country": {"FR"}}, hdr)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	var a braveAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		t.Fatalf("decode: %v", err)
	}
	if a.Type != "search" || a.Query.Original != "résumé tips" || a.Query.City != "Paris" || a.Query.Country != "fr" || a.Web == nil || a.Web.Type != "search" || len(a.Web.Results) != 5 {
		t.Fatalf("answer: %s", body)
	}
	strong, aged := 0, 0
	for i, r := range a.Web.Results {
		if !strings.HasPrefix(r.URL, "https://") || r.Title == "" || r.Type != "search_result" || len(r.ExtraSnippets) == 0 {
			t.Errorf("result %d: %+v", i, r)
		}
		if strings.Contains(r.Description, "<strong>") && strings.Contains(r.Description, "</strong>") {
			strong++
		}
		if r.Age != "" && r.PageAge != "" {
			aged++
		}
	}
	if strong != 5 || aged == 0 || aged == 5 {
		t.Errorf("%d results with <strong>, %d with an age", strong, aged)
	}
	rec, ok := run.LastRequest()
	if !ok {
		t.Fatal("no request recorded")
	}
	for k, v := range hdr {
		if rec.Header.Get(k) != v {
			t.Errorf("recorded %s = %q, want %q", k, rec.Header.Get(k), v)
		}
	}
	// Without extra_snippets=true there are none; count defaults to 20.
	_, body, _ = getSearch(context.Background(), run, "résumé tips", nil, nil)
	a = braveAnswer{}
	if err := json.Unmarshal(body, &a); err != nil || len(a.Web.Results) != 20 || a.Web.Results[0].ExtraSnippets != nil {
		t.Errorf("default count: %v", err)
	}
}

func TestBraveErrors(t *testing.T) {
	run := startSearch(t, SearchConfig{Flavour: Brave, Token: testToken})
	cases := []struct {
		name   string
		extra  url.Values
		header map[string]string
		code   string
	}{
		{"missing token", nil, map[string]string{"X-Subscription-Token": ""}, "VALIDATION"},
		{"wrong token", nil, map[string]string{"X-Subscription-Token": "nope"}, "SUBSCRIPTION_TOKEN_INVALID"},
		{"count too big", url.Values{"count": {"21"}}, nil, "VALIDATION"},
	}
	for _, c := range cases {
		resp, body, err := getSearch(context.Background(), run, "q", c.extra, c.header)
		if err != nil {
			t.Fatal(err)
		}
		var e braveErr
		if err := json.Unmarshal(body, &e); err != nil {
			t.Fatalf("%s: %v %s", c.name, err, body)
		}
		if resp.StatusCode != 422 || e.Type != "ErrorResponse" || e.Error.Status != 422 || e.Error.Code != c.code || e.Error.Detail == "" || e.Error.ID == "" || e.Time == 0 || len(e.Error.Meta) == 0 {
			t.Errorf("%s: status %d %s", c.name, resp.StatusCode, body)
		}
	}
}

func TestSearchFaults(t *testing.T) {
	for _, f := range []SearchFlavour{SearXNG, Brave} {
		t.Run(string(f), func(t *testing.T) {
			run := startSearch(t, SearchConfig{Flavour: f, SlowDelay: 40 * time.Millisecond})
			for _, c := range []struct {
				fault  string
				status int
			}{{"500", 500}, {"403", 403}} {
				resp, _, err := getSearch(context.Background(), run, "q simfault="+c.fault, nil, nil)
				if err != nil || resp.StatusCode != c.status {
					t.Errorf("simfault=%s: %v %v", c.fault, err, resp)
				}
			}
			if f == SearXNG {
				_, body, _ := getSearch(context.Background(), run, "q simfault=500", nil, nil)
				var e struct{ Error string }
				if json.Unmarshal(body, &e) != nil || e.Error != "search error" {
					t.Errorf("searxng 500 body %s", body)
				}
			}
			resp, body, err := getSearch(context.Background(), run, "q simfault=garbage", nil, nil)
			if err != nil || resp.StatusCode != 200 || json.Valid(body) {
				t.Errorf("garbage: %v %v valid=%v", err, resp, json.Valid(body))
			}
			start := time.Now()
			resp, body, err = getSearch(context.Background(), run, "q simfault=slow", nil, nil)
			if err != nil || resp.StatusCode != 200 || !json.Valid(body) || time.Since(start) < 40*time.Millisecond {
				t.Errorf("slow: %v %v after %v", err, resp, time.Since(start))
			}
			before := run.Stats().Cancelled
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			_, _, err = getSearch(ctx, run, "q simfault=hang", nil, nil)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("hang: %v", err)
			}
			if err := run.WaitStats(waitLimit, func(st SearchStats) bool { return st.Cancelled == before+1 && st.InFlight == 0 }); err != nil {
				t.Error(err)
			}
			// Server-wide.
			run.SetFault(SearchFault500)
			if resp, _, _ := getSearch(context.Background(), run, "q", nil, nil); resp.StatusCode != 500 {
				t.Errorf("SetFault(500): status %d", resp.StatusCode)
			}
			run.SetFault(SearchFaultNone)
			if resp, _, _ := getSearch(context.Background(), run, "q", nil, nil); resp.StatusCode != 200 {
				t.Errorf("fault cleared: status %d", resp.StatusCode)
			}
		})
	}
}

func TestSearchSlowCancelled(t *testing.T) {
	run := startSearch(t, SearchConfig{Flavour: SearXNG, Fault: SearchFaultSlow, SlowDelay: 10 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, _, err := getSearch(ctx, run, "q", nil, nil); err == nil {
		t.Fatal("want the client's timeout")
	}
	if err := run.WaitIdle(waitLimit); err != nil {
		t.Fatal(err)
	}
	if st := run.Stats(); st.Cancelled != 1 || time.Since(start) > 5*time.Second {
		t.Errorf("stats %+v after %v", st, time.Since(start))
	}
}
