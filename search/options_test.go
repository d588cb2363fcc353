package search

import (
	"errors"
	"strings"
	"testing"

	"github.com/tollgate/tollgate"
)

func TestParseOptions(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want Options
	}{
		{`{}`, Options{Size: Medium}},
		{`{"search_context_size": null, "user_location": null, "extra": [1]}`, Options{Size: Medium}},
		{`{"search_context_size": "low"}`, Options{Size: Low}},
		{`{"search_context_size": "high"}`, Options{Size: High}},
		{`{"user_location": {"type": "approximate"}}`, Options{Size: Medium}},
		{`{"user_location": {"type": "approximate", "approximate": {}}}`, Options{Size: Medium}},
		{`{"user_location": {"type": "approximate", "approximate": {"country": "gb", "region": " England ", "city": "London", "timezone": "Europe/London"}}}`,
			Options{Size: Medium, Location: &Location{Country: "GB", Region: "England", City: "London", Timezone: "Europe/London"}}},
		{`{"search_context_size": "medium", "user_location": {"type": "approximate", "approximate": {"city": "Zürich", "country": null}}}`,
			Options{Size: Medium, Location: &Location{City: "Zürich"}}},
	} {
		got, err := ParseOptions([]byte(tc.raw))
		if err != nil {
			t.Errorf("%s: %v", tc.raw, err)
			continue
		}
		if got.Size != tc.want.Size || (got.Location == nil) != (tc.want.Location == nil) ||
			(got.Location != nil && *got.Location != *tc.want.Location) {
			t.Errorf("%s: got %+v (location %+v), want %+v (location %+v)", tc.raw, got, got.Location, tc.want, tc.want.Location)
		}
	}
}

func TestParseOptionsErrors(t *testing.T) {
	for _, tc := range []struct{ raw, param string }{
		{`[]`, "web_search_options"},
		{`{"search_context_size": "huge"}`, "web_search_options.search_context_size"},
		{`{"search_context_size": 3}`, "web_search_options.search_context_size"},
		{`{"search_context_size": "LOW"}`, "web_search_options.search_context_size"},
		{`{"user_location": "Berlin"}`, "web_search_options.user_location"},
		{`{"user_location": {"approximate": {"city": "Berlin"}}}`, "web_search_options.user_location.type"},
		{`{"user_location": {"type": "exact", "approximate": {"city": "Berlin"}}}`, "web_search_options.user_location.type"},
		{`{"user_location": {"type": "approximate", "approximate": "Berlin"}}`, "web_search_options.user_location.approximate"},
		{`{"user_location": {"type": "approximate", "approximate": {"city": 5}}}`, "web_search_options.user_location.approximate.city"},
		{`{"user_location": {"type": "approximate", "approximate": {"region": true}}}`, "web_search_options.user_location.approximate.region"},
		{`{"user_location": {"type": "approximate", "approximate": {"country": "Germany"}}}`, "web_search_options.user_location.approximate.country"},
		{`{"user_location": {"type": "approximate", "approximate": {"country": "D1"}}}`, "web_search_options.user_location.approximate.country"},
		{`{"user_location": {"type": "approximate", "approximate": {"timezone": "Europe/Berlin; rm"}}}`, "web_search_options.user_location.approximate.timezone"},
		{`{"user_location": {"type": "approximate", "approximate": {"city": "a\nX-Injected: 1"}}}`, "web_search_options.user_location.approximate.city"},
		{`{"user_location": {"type": "approximate", "approximate": {"city": "` + strings.Repeat("é", 101) + `"}}}`, "web_search_options.user_location.approximate.city"},
	} {
		_, err := ParseOptions([]byte(tc.raw))
		var e *tollgate.Error
		if !errors.As(err, &e) || e.Code != tollgate.CodeInvalidRequest || e.Param != tc.param {
			t.Errorf("%.80s: error %v, want invalid_request with param %s", tc.raw, err, tc.param)
		}
	}
}

func TestFigures(t *testing.T) {
	for _, tc := range []struct {
		s        ContextSize
		n, chars int
	}{{Low, 3, 300}, {Medium, 5, 800}, {High, 10, 2000}, {"", 5, 800}} {
		if n, c := Figures(tc.s); n != tc.n || c != tc.chars {
			t.Errorf("Figures(%q) = %d, %d; want %d, %d", tc.s, n, c, tc.n, tc.chars)
		}
	}
}

func TestLocationString(t *testing.T) {
	l := &Location{Country: "DE", Region: "BE", City: "Berlin", Timezone: "Europe/Berlin"}
	if got := l.String(); got != "Berlin, BE, DE (time zone Europe/Berlin)" {
		t.Errorf("String() = %q", got)
	}
	if got := (&Location{Timezone: "UTC"}).String(); got != "(time zone UTC)" {
		t.Errorf("String() = %q", got)
	}
}
