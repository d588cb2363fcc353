package search

import (
	"context"
	"net/http"
	"net/url"
	"strings"
)

// SearXNG asks a SearXNG instance through its JSON API:
// GET {base}/search?q=...&format=json&pageno=1. It answers about 20 results
// a page and has no count parameter; the Service keeps the first ones.
// It takes no location (the Service says so with SupportsLocation), and no
// language is sent: a country does not name a language (CH, BE, CA, IN),
// and the instance's own default is a better guess than a wrong one.
type SearXNG struct {
	base   string // without trailing slash
	client *http.Client
}

// NewSearXNG returns a provider for the instance at base (e.g.
// http://127.0.0.1:8888). client may be nil.
func NewSearXNG(base string, client *http.Client) *SearXNG {
	return &SearXNG{base: strings.TrimRight(base, "/"), client: noRedirects(client)}
}

func (p *SearXNG) Name() string { return "searxng" }

// SupportsLocation is false: SearXNG's API has no parameter for it.
func (p *SearXNG) SupportsLocation() bool { return false }

type searxngAnswer struct {
	Results []struct {
		URL     string `json:"url"`
		Title   string `json:"title"`
		Content string `json:"content"`
	} `json:"results"`
}

func (p *SearXNG) Search(ctx context.Context, q Query, limit int) ([]Result, error) {
	v := url.Values{"q": {q.Text}, "format": {"json"}, "pageno": {"1"}}
	req, err := http.NewRequest(http.MethodGet, p.base+"/search?"+v.Encode(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	var a searxngAnswer
	if err := getJSON(ctx, p.client, req, &a, searxngHint); err != nil {
		return nil, err
	}
	out := make([]Result, 0, min(len(a.Results), limit))
	for _, r := range a.Results {
		out = append(out, Result{URL: r.URL, Title: r.Title, Content: r.Content})
	}
	return out, nil
}

// searxngHint explains SearXNG's 403: its JSON format is off unless the
// instance's settings.yml lists json under search.formats.
func searxngHint(status int) string {
	if status == http.StatusForbidden {
		return "the SearXNG instance does not serve format=json; add json to search.formats in its settings.yml"
	}
	return ""
}
