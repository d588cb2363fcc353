// Package search is tollgate's web search: the providers it can ask
// (SearXNG, Brave Search API), the Service that trims, caches and bounds
// their answers, the function tool offered to the model, the text the
// model gets back, and the url_citation annotations found in its answer.
package search

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"unicode/utf8"

	"github.com/tollgate/tollgate"
)

// ContextSize is web_search_options.search_context_size.
type ContextSize string

const (
	Low    ContextSize = "low"
	Medium ContextSize = "medium"
	High   ContextSize = "high"
)

// Figures returns how many results, and how many characters (Unicode code
// points) of each result's text, go back to the model for a context size:
//
//	low     3 results x  300 characters
//	medium  5 results x  800 characters (the default)
//	high   10 results x 2000 characters
//
// A text longer than its figure is cut to figure-1 characters plus "…".
// An unknown size gets medium's figures.
func Figures(s ContextSize) (results, chars int) {
	switch s {
	case Low:
		return 3, 300
	case High:
		return 10, 2000
	default:
		return 5, 800
	}
}

// Location is user_location.approximate: where the user roughly is.
// Country is an upper-case ISO 3166-1 alpha-2 code when set.
type Location struct{ Country, Region, City, Timezone string }

// empty reports whether no field is set.
func (l *Location) empty() bool {
	return l == nil || (l.Country == "" && l.Region == "" && l.City == "" && l.Timezone == "")
}

// String renders the location for the model ("Berlin, BE, DE (time zone
// Europe/Berlin)"), for providers that cannot take it.
func (l *Location) String() string {
	if l.empty() {
		return ""
	}
	var parts []string
	for _, p := range []string{l.City, l.Region, l.Country} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	s := strings.Join(parts, ", ")
	if l.Timezone != "" {
		if s != "" {
			s += " "
		}
		s += "(time zone " + l.Timezone + ")"
	}
	return s
}

// Options is a parsed web_search_options object.
type Options struct {
	Size     ContextSize
	Location *Location // nil when absent or empty
}

// maxLocationField bounds each user_location field (characters): they
// travel in request headers to the provider.
const maxLocationField = 100

// ParseOptions parses the client's raw web_search_options JSON object.
// An absent (or null) search_context_size is Medium. A wrong type or an
// unknown value is a *tollgate.Error with CodeInvalidRequest naming the
// field; user_location must have type "approximate" (OpenAI's shape);
// unknown keys are ignored.
func ParseOptions(raw []byte) (Options, error) {
	opts := Options{Size: Medium}
	const base = "web_search_options"
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil || top == nil {
		return opts, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, base, "%s must be an object", base)
	}
	if v, ok := top["search_context_size"]; ok && !isNull(v) {
		const p = base + ".search_context_size"
		var s string
		if json.Unmarshal(v, &s) != nil {
			return opts, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, p, `%s must be a string: "low", "medium" or "high"`, p)
		}
		switch ContextSize(s) {
		case Low, Medium, High:
			opts.Size = ContextSize(s)
		default:
			return opts, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, p, `%s %q is not "low", "medium" or "high"`, p, s)
		}
	}
	if v, ok := top["user_location"]; ok && !isNull(v) {
		loc, err := parseLocation(v)
		if err != nil {
			return opts, err
		}
		if !loc.empty() {
			opts.Location = loc
		}
	}
	return opts, nil
}

func parseLocation(v json.RawMessage) (*Location, error) {
	const p = "web_search_options.user_location"
	var ul map[string]json.RawMessage
	if json.Unmarshal(v, &ul) != nil || ul == nil {
		return nil, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, p,
			`%s must be an object such as {"type": "approximate", "approximate": {"country": "US"}}`, p)
	}
	var typ string
	if json.Unmarshal(ul["type"], &typ) != nil || typ != "approximate" {
		return nil, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, p+".type", `%s.type must be "approximate"`, p)
	}
	approx, ok := ul["approximate"]
	if !ok || isNull(approx) {
		return nil, nil
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(approx, &fields) != nil || fields == nil {
		return nil, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, p+".approximate", "%s.approximate must be an object", p)
	}
	loc := &Location{}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"country", &loc.Country}, {"region", &loc.Region}, {"city", &loc.City}, {"timezone", &loc.Timezone}} {
		raw, ok := fields[f.name]
		if !ok || isNull(raw) {
			continue
		}
		fp := p + ".approximate." + f.name
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return nil, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, fp, "%s must be a string", fp)
		}
		s = strings.TrimSpace(s)
		if utf8.RuneCountInString(s) > maxLocationField {
			return nil, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, fp, "%s must be at most %d characters", fp, maxLocationField)
		}
		if strings.IndexFunc(s, isControl) >= 0 {
			return nil, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, fp, "%s must not contain control characters", fp)
		}
		*f.dst = s
	}
	if loc.Country != "" {
		if !isAlpha2(loc.Country) {
			return nil, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, p+".approximate.country",
				"%s.approximate.country %q is not a two-letter ISO 3166-1 country code such as \"US\"", p, loc.Country)
		}
		loc.Country = strings.ToUpper(loc.Country)
	}
	if loc.Timezone != "" && !validTimezone(loc.Timezone) {
		return nil, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, p+".approximate.timezone",
			"%s.approximate.timezone %q is not an IANA time zone such as \"America/Los_Angeles\"", p, loc.Timezone)
	}
	return loc, nil
}

func isNull(v json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(v), []byte("null")) }

func isControl(r rune) bool { return r < 0x20 || (r >= 0x7f && r < 0xa0) }

func isAlpha2(s string) bool {
	return len(s) == 2 && isASCIILetter(s[0]) && isASCIILetter(s[1])
}

func isASCIILetter(c byte) bool { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') }

// validTimezone accepts the characters IANA zone names use
// ("America/Argentina/Buenos_Aires", "Etc/GMT+3", "UTC").
func validTimezone(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isASCIILetter(c) && !(c >= '0' && c <= '9') && c != '/' && c != '_' && c != '-' && c != '+' {
			return false
		}
	}
	return true
}

// Query is one search to run.
type Query struct {
	Text     string
	Size     ContextSize
	Location *Location
}

// Result is one search hit. From Service.Search, Content is already cut to
// the size's figure (on a code-point boundary), whitespace collapsed, and
// HTML tags and entities from the provider stripped; Title likewise, and
// it is the URL when the provider gave none.
type Result struct {
	URL, Title, Content string
}

// Provider is one search engine. limit is the number of results wanted;
// a provider may return more (the Service cuts them) or fewer. Providers
// return text as the engine sent it: the Service cleans it.
type Provider interface {
	Name() string
	Search(ctx context.Context, q Query, limit int) ([]Result, error)
}

// locationAware is implemented by providers that pass the user's location
// to the engine.
type locationAware interface{ SupportsLocation() bool }
