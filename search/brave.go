package search

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// BraveURL is the Brave Search API's base URL.
const BraveURL = "https://api.search.brave.com"

// braveMaxCount is the most results Brave returns for one call (its count
// parameter's maximum).
const braveMaxCount = 20

// braveMaxQuery is Brave's limit on q: 400 characters and 50 words;
// longer queries are refused, so they are cut here.
const (
	braveMaxQuery = 400
	braveMaxWords = 50
)

// Brave asks the Brave Search API:
// GET {base}/res/v1/web/search?q=...&count=N with the subscription token in
// X-Subscription-Token and the user's approximate location in the
// X-Loc-* headers (and country= when Brave lists the country).
type Brave struct {
	base   string
	key    string
	client *http.Client
}

// NewBrave returns a provider for the Brave Search API at base ("" means
// BraveURL) with the subscription token key. client may be nil.
func NewBrave(base, key string, client *http.Client) *Brave {
	if base == "" {
		base = BraveURL
	}
	return &Brave{base: strings.TrimRight(base, "/"), key: key, client: noRedirects(client)}
}

func (p *Brave) Name() string { return "brave" }

// SupportsLocation is true: the location goes in request headers.
func (p *Brave) SupportsLocation() bool { return true }

type braveAnswer struct {
	Web struct {
		Results []struct {
			URL           string   `json:"url"`
			Title         string   `json:"title"`
			Description   string   `json:"description"`
			ExtraSnippets []string `json:"extra_snippets"`
		} `json:"results"`
	} `json:"web"`
}

func (p *Brave) Search(ctx context.Context, q Query, limit int) ([]Result, error) {
	v := url.Values{
		"q":              {braveQuery(q.Text)},
		"count":          {strconv.Itoa(min(max(limit, 1), braveMaxCount))},
		"extra_snippets": {"true"},
	}
	loc := q.Location
	if loc != nil && braveCountries[loc.Country] {
		v.Set("country", loc.Country)
	}
	req, err := http.NewRequest(http.MethodGet, p.base+"/res/v1/web/search?"+v.Encode(), nil)
	if err != nil {
		return nil, err
	}
	h := req.Header
	h.Set("Accept", "application/json")
	h.Set("X-Subscription-Token", p.key)
	if loc != nil {
		setIf(h, "X-Loc-City", loc.City)
		// X-Loc-State takes a subdivision code of up to 3 characters (the
		// second part of ISO 3166-2, "CA" of US-CA); a longer region is a
		// name, which goes in X-Loc-State-Name.
		if r := loc.Region; r != "" && len(r) <= 3 && isAlnum(r) {
			h.Set("X-Loc-State", strings.ToUpper(r))
		} else {
			setIf(h, "X-Loc-State-Name", r)
		}
		setIf(h, "X-Loc-Country", loc.Country)
		setIf(h, "X-Loc-Timezone", loc.Timezone)
	}
	var a braveAnswer
	if err := getJSON(ctx, p.client, req, &a, nil); err != nil {
		return nil, err
	}
	out := make([]Result, 0, len(a.Web.Results))
	for _, r := range a.Web.Results {
		content := r.Description
		for _, s := range r.ExtraSnippets {
			content += " " + s
		}
		out = append(out, Result{URL: r.URL, Title: r.Title, Content: content})
	}
	return out, nil
}

func setIf(h http.Header, k, v string) {
	if v != "" {
		h.Set(k, v)
	}
}

func isAlnum(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isASCIILetter(s[i]) && !(s[i] >= '0' && s[i] <= '9') {
			return false
		}
	}
	return true
}

// braveQuery cuts q to Brave's limits (400 characters, 50 words) at a word
// boundary.
func braveQuery(q string) string {
	words := strings.Fields(q)
	if len(words) > braveMaxWords {
		words = words[:braveMaxWords]
	}
	out := strings.Join(words, " ")
	for len([]rune(out)) > braveMaxQuery && len(words) > 1 {
		words = words[:len(words)-1]
		out = strings.Join(words, " ")
	}
	if r := []rune(out); len(r) > braveMaxQuery {
		out = string(r[:braveMaxQuery])
	}
	return out
}

// braveCountries are the country codes Brave documents for its country
// parameter; another code would be refused, so it only goes in
// X-Loc-Country.
var braveCountries = map[string]bool{
	"AR": true, "AU": true, "AT": true, "BE": true, "BR": true, "CA": true, "CL": true,
	"DK": true, "FI": true, "FR": true, "DE": true, "HK": true, "IN": true, "ID": true,
	"IT": true, "JP": true, "KR": true, "MY": true, "MX": true, "NL": true, "NZ": true,
	"NO": true, "CN": true, "PL": true, "PT": true, "PH": true, "RU": true, "SA": true,
	"ZA": true, "ES": true, "SE": true, "CH": true, "TW": true, "TR": true, "GB": true,
	"US": true,
}
