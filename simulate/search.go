package simulate

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// SearchFlavour names the real web-search API the simulated provider imitates.
type SearchFlavour string

const (
	SearXNG SearchFlavour = "searxng" // SearXNG's /search?format=json
	Brave   SearchFlavour = "brave"   // the Brave Search API, /res/v1/web/search
)

// ParseSearchFlavour accepts a provider name.
func ParseSearchFlavour(s string) (SearchFlavour, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "searxng", "searx":
		return SearXNG, nil
	case "brave", "brave-search":
		return Brave, nil
	}
	return "", fmt.Errorf("unknown search provider %q (want searxng or brave)", s)
}

// SearchFault is a failure the simulated search provider can inject, for
// every request (SearchConfig.Fault, Search.SetFault) or for one query (a
// query containing "simfault=<name>").
type SearchFault string

const (
	SearchFaultNone    SearchFault = ""
	SearchFault500     SearchFault = "500"     // 500 with the provider's error body
	SearchFault403     SearchFault = "403"     // 403 (SearXNG: as when its JSON format is off)
	SearchFaultSlow    SearchFault = "slow"    // wait SlowDelay, then answer normally
	SearchFaultHang    SearchFault = "hang"    // send nothing until the client gives up
	SearchFaultGarbage SearchFault = "garbage" // 200 with a body that is not JSON
)

// SearchFaults lists every search fault name.
func SearchFaults() []SearchFault {
	return []SearchFault{SearchFault500, SearchFault403, SearchFaultSlow, SearchFaultHang, SearchFaultGarbage}
}

// ParseSearchFault accepts a search fault name ("none" and "" mean no fault).
func ParseSearchFault(s string) (SearchFault, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "" || s == "none" {
		return SearchFaultNone, nil
	}
	for _, f := range SearchFaults() {
		if string(f) == s {
			return f, nil
		}
	}
	return "", fmt.Errorf("unknown search fault %q (want one of 500, 403, slow, hang, garbage)", s)
}

// SearchConfig configures a simulated search provider.
type SearchConfig struct {
	Flavour SearchFlavour // required

	// JSONDisabled imitates a SearXNG whose settings.yml does not list json
	// under search.formats: every format=json request gets 403.
	JSONDisabled bool
	// Token is the Brave subscription token accepted in X-Subscription-Token;
	// empty accepts any non-empty token.
	Token string
	// SlowDelay is how long the slow fault waits (default 3s).
	SlowDelay time.Duration
	// Fault is injected into every request.
	Fault SearchFault
	// MaxRecorded bounds how many requests are kept (default 10000);
	// negative disables recording.
	MaxRecorded int
}

// SearchStats counts search requests.
type SearchStats struct {
	Requests  int64 // received
	InFlight  int64 // being answered now
	Cancelled int64 // the client went away before the answer was written
	Completed int64 // answered (error answers included)
}

// Search is a simulated web-search provider; it is an http.Handler.
type Search struct {
	cfg   SearchConfig
	fault atomic.Pointer[SearchFault]

	requests, inFlight, cancelled, completed atomic.Int64

	changed  signal
	recorded recordLog
}

// NewSearch builds a simulated search provider. It panics on an unknown
// flavour (use ParseSearchFlavour for user input).
func NewSearch(cfg SearchConfig) *Search {
	if _, err := ParseSearchFlavour(string(cfg.Flavour)); err != nil {
		panic("simulate.NewSearch: " + err.Error())
	}
	if cfg.SlowDelay <= 0 {
		cfg.SlowDelay = 3 * time.Second
	}
	if cfg.MaxRecorded == 0 {
		cfg.MaxRecorded = 10000
	}
	s := &Search{cfg: cfg, recorded: recordLog{max: cfg.MaxRecorded}}
	f := cfg.Fault
	s.fault.Store(&f)
	return s
}

// Flavour reports which provider this one imitates.
func (s *Search) Flavour() SearchFlavour { return s.cfg.Flavour }

// SetFault changes the server-wide fault for requests that start after the call.
func (s *Search) SetFault(f SearchFault) { s.fault.Store(&f) }

// Fault returns the server-wide fault.
func (s *Search) Fault() SearchFault { return *s.fault.Load() }

// Stats returns the counters.
func (s *Search) Stats() SearchStats {
	return SearchStats{
		Requests:  s.requests.Load(),
		InFlight:  s.inFlight.Load(),
		Cancelled: s.cancelled.Load(),
		Completed: s.completed.Load(),
	}
}

// Requests returns the requests received, oldest first.
func (s *Search) Requests() []Recorded { return s.recorded.all() }

// LastRequest returns the latest request (its headers carry the X-Loc-*
// location headers a Brave client sent).
func (s *Search) LastRequest() (Recorded, bool) { return s.recorded.last() }

// Reset forgets recorded requests and zeroes the counters but InFlight.
func (s *Search) Reset() {
	s.recorded.reset()
	s.requests.Store(0)
	s.cancelled.Store(0)
	s.completed.Store(0)
	s.notify()
}

// WaitStats waits until cond holds for the counters, or timeout passes.
func (s *Search) WaitStats(timeout time.Duration, cond func(SearchStats) bool) error {
	return waitFor(&s.changed, timeout, s.Stats, cond)
}

// WaitIdle waits until no search request is in flight.
func (s *Search) WaitIdle(timeout time.Duration) error {
	return s.WaitStats(timeout, func(st SearchStats) bool { return st.InFlight == 0 })
}

func (s *Search) notify() { s.changed.notify() }

func (s *Search) record(r *http.Request) {
	if s.cfg.MaxRecorded < 0 {
		return
	}
	s.recorded.add(Recorded{Method: r.Method, Path: r.URL.RequestURI(), Header: r.Header.Clone()})
}

// ServeHTTP routes like the imitated provider.
func (s *Search) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	s.inFlight.Add(1)
	s.notify()
	done := false
	defer func() {
		s.inFlight.Add(-1)
		if done {
			s.completed.Add(1)
		} else {
			s.cancelled.Add(1)
		}
		s.notify()
	}()
	s.record(r)
	if s.cfg.Flavour == Brave {
		done = s.brave(w, r)
	} else {
		done = s.searxng(w, r)
	}
}

// queryFault is the fault a query asks for with "simfault=<name>".
func queryFault(q string) SearchFault {
	i := strings.Index(q, "simfault=")
	if i < 0 {
		return SearchFaultNone
	}
	v := q[i+len("simfault="):]
	if j := strings.IndexAny(v, " \t\n,;]"); j >= 0 {
		v = v[:j]
	}
	f, err := ParseSearchFault(v)
	if err != nil {
		return SearchFaultNone
	}
	return f
}

// preFault applies the waiting faults. It returns the fault left to render
// (500, 403, garbage or none) and false when the client went away.
func (s *Search) preFault(ctx context.Context, q string) (SearchFault, bool) {
	f := queryFault(q)
	if f == SearchFaultNone {
		f = s.Fault()
	}
	switch f {
	case SearchFaultHang:
		<-ctx.Done()
		return f, false
	case SearchFaultSlow:
		if !sleep(ctx, s.cfg.SlowDelay) {
			return f, false
		}
		return SearchFaultNone, true
	}
	return f, true
}

// ---- SearXNG ----

// Werkzeug's default error pages, as flask.abort renders them.
const (
	flask403 = "<!doctype html>\n<html lang=en>\n<title>403 Forbidden</title>\n<h1>Forbidden</h1>\n<p>You don&#39;t have the permission to access the requested resource. It is either read-protected or not readable by the server.</p>\n"
	flask500 = "<!doctype html>\n<html lang=en>\n<title>500 Internal Server Error</title>\n<h1>Internal Server Error</h1>\n<p>The server encountered an internal error and was unable to complete your request. Either the server is overloaded or there is an error in the application.</p>\n"
	flask404 = "<!doctype html>\n<html lang=en>\n<title>404 Not Found</title>\n<h1>Not Found</h1>\n<p>The requested URL was not found on the server. If you entered the URL manually please check your spelling and try again.</p>\n"
)

// searxngPage is SearXNG's fixed page size; it has no count parameter.
const searxngPage = 20

func writeBody(w http.ResponseWriter, status int, ctype string, body []byte) bool {
	h := w.Header()
	h.Set("Content-Type", ctype)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, err := w.Write(body)
	return err == nil
}

func (s *Search) searxng(w http.ResponseWriter, r *http.Request) bool {
	const htmlType = "text/html; charset=utf-8"
	if r.URL.Path != "/search" && r.URL.Path != "/" {
		return writeBody(w, http.StatusNotFound, htmlType, []byte(flask404))
	}
	if r.Method != http.MethodGet && r.Method != http.MethodPost {
		return writeBody(w, http.StatusMethodNotAllowed, htmlType, []byte(flask404))
	}
	r.ParseForm() // GET query and POST form, as SearXNG reads both
	format := r.Form.Get("format")
	switch format {
	case "json", "csv", "rss", "html":
	default:
		format = "html" // SearXNG falls back to html for an unknown format
	}
	q := r.Form.Get("q")
	if format != "html" && s.cfg.JSONDisabled {
		return writeBody(w, http.StatusForbidden, htmlType, []byte(flask403))
	}
	fault, ok := s.preFault(r.Context(), q)
	if !ok {
		return false
	}
	html := format == "html" || format == "csv" || format == "rss"
	switch fault {
	case SearchFault500:
		if html {
			return writeBody(w, http.StatusInternalServerError, htmlType, []byte(flask500))
		}
		// An engine failure caught in webapp.py's search(): index_error.
		return writeBody(w, http.StatusInternalServerError, "application/json", []byte(`{"error": "search error"}`))
	case SearchFault403:
		return writeBody(w, http.StatusForbidden, htmlType, []byte(flask403))
	}
	if html {
		return writeBody(w, http.StatusOK, htmlType, searxngHTML(q))
	}
	if q == "" {
		return writeBody(w, http.StatusBadRequest, "application/json", []byte(`{"error": "No query"}`))
	}
	page := 1
	if n, err := strconv.Atoi(r.Form.Get("pageno")); err == nil && n > 1 {
		page = n
	}
	body := searxngJSON(q, searchResults(q, (page-1)*searxngPage, searxngPage))
	if fault == SearchFaultGarbage {
		body = body[:len(body)/2]
	}
	return writeBody(w, http.StatusOK, "application/json", body)
}

// searxngJSON renders SearXNG's answer the way Python's json.dumps writes
// it: ", " and ": " between items and keys, non-ASCII escaped as \uXXXX
// (surrogate pairs beyond the BMP).
func searxngJSON(q string, rs []searchResult) []byte {
	b := make([]byte, 0, 1024+len(rs)*600)
	b = append(b, `{"query": `...)
	b = appendPyString(b, q)
	b = append(b, `, "number_of_results": 0, "results": [`...)
	for i, res := range rs {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = append(b, `{"url": `...)
		b = appendPyString(b, res.url)
		b = append(b, `, "title": `...)
		b = appendPyString(b, res.title)
		b = append(b, `, "content": `...)
		b = appendPyString(b, res.content)
		b = append(b, `, "publishedDate": `...)
		if res.published != "" {
			b = appendPyString(b, res.published+"T00:00:00")
		} else {
			b = append(b, "null"...)
		}
		b = append(b, `, "thumbnail": "", "engine": `...)
		b = appendPyString(b, res.engines[0])
		b = append(b, `, "template": "default.html", "parsed_url": ["https", `...)
		b = appendPyString(b, res.host)
		b = append(b, ", "...)
		b = appendPyString(b, res.path)
		b = append(b, `, "", "", ""], "img_src": "", "priority": "", "engines": [`...)
		for j, e := range res.engines {
			if j > 0 {
				b = append(b, ", "...)
			}
			b = appendPyString(b, e)
		}
		b = append(b, `], "positions": [`...)
		b = strconv.AppendInt(b, int64(res.rank), 10)
		b = append(b, `], "score": `...)
		b = strconv.AppendFloat(b, res.score, 'f', -1, 64)
		if res.score == float64(int(res.score)) {
			b = append(b, ".0"...) // Python writes floats with a decimal point
		}
		b = append(b, `, "category": "general"}`...)
	}
	b = append(b, `], "answers": [], "corrections": [], "infoboxes": [], "suggestions": [`...)
	if len(rs) > 0 {
		b = appendPyString(b, rs[0].words+" guide")
	}
	b = append(b, `], "unresponsive_engines": [`...)
	if len(rs) == 0 {
		// An empty page usually means engines failed; SearXNG lists them
		// as [name, reason] pairs and still answers 200.
		b = append(b, `["brave", "timeout"]`...)
	}
	return append(b, "]}"...)
}

// appendPyString writes s as Python's json.dumps does with ensure_ascii.
func appendPyString(b []byte, s string) []byte {
	b = append(b, '"')
	for _, r := range s {
		switch {
		case r == '"':
			b = append(b, '\\', '"')
		case r == '\\':
			b = append(b, '\\', '\\')
		case r == '\n':
			b = append(b, '\\', 'n')
		case r == '\r':
			b = append(b, '\\', 'r')
		case r == '\t':
			b = append(b, '\\', 't')
		case r < 0x20 || (r >= 0x7f && r < 0x10000):
			b = appendU4(b, r)
		case r >= 0x10000:
			r -= 0x10000
			b = appendU4(b, 0xd800+(r>>10))
			b = appendU4(b, 0xdc00+(r&0x3ff))
		default:
			b = append(b, byte(r))
		}
	}
	return append(b, '"')
}

func appendU4(b []byte, r rune) []byte {
	return append(b, '\\', 'u', hexDigits[r>>12&0xf], hexDigits[r>>8&0xf], hexDigits[r>>4&0xf], hexDigits[r&0xf])
}

// searxngHTML is a small results page, what SearXNG answers without format=json.
func searxngHTML(q string) []byte {
	var b strings.Builder
	b.WriteString("<!DOCTYPE html>\n<html class=\"no-js\" lang=\"en-EN\">\n<head><meta charset=\"UTF-8\"><title>")
	b.WriteString(htmlEscape(q))
	b.WriteString(" - SearXNG</title></head>\n<body class=\"results_endpoint\">\n<main id=\"main_results\">\n")
	if q != "" {
		for _, r := range searchResults(q, 0, searxngPage) {
			b.WriteString("<article class=\"result result-default category-general\">\n<a href=\"")
			b.WriteString(htmlEscape(r.url))
			b.WriteString("\" class=\"url_header\">")
			b.WriteString(htmlEscape(r.url))
			b.WriteString("</a>\n<h3><a href=\"")
			b.WriteString(htmlEscape(r.url))
			b.WriteString("\">")
			b.WriteString(htmlEscape(r.title))
			b.WriteString("</a></h3>\n<p class=\"content\">")
			b.WriteString(htmlEscape(r.content))
			b.WriteString("</p>\n</article>\n")
		}
	}
	b.WriteString("</main>\n</body>\n</html>\n")
	return []byte(b.String())
}

func htmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;").Replace(s)
}

// ---- Brave ----

const (
	braveMaxCount = 20
	bravePath     = "/res/v1/web/search"
)

func (s *Search) brave(w http.ResponseWriter, r *http.Request) bool {
	if r.URL.Path != bravePath {
		return writeBody(w, http.StatusNotFound, "application/json",
			braveError(http.StatusNotFound, "RESOURCE_NOT_FOUND", "Resource not found.", `{"component":"api"}`))
	}
	tok := r.Header.Get("X-Subscription-Token")
	if tok == "" {
		return writeBody(w, http.StatusUnprocessableEntity, "application/json",
			braveError(http.StatusUnprocessableEntity, "VALIDATION", "Unable to validate request parameter(s)",
				`{"errors":[{"type":"missing","loc":["header","x-subscription-token"],"msg":"Field required","input":null}]}`))
	}
	if s.cfg.Token != "" && tok != s.cfg.Token {
		return writeBody(w, http.StatusUnprocessableEntity, "application/json",
			braveError(http.StatusUnprocessableEntity, "SUBSCRIPTION_TOKEN_INVALID", "The provided subscription token is invalid.", `{"component":"authentication"}`))
	}
	qv := r.URL.Query()
	q := qv.Get("q")
	if q == "" {
		return writeBody(w, http.StatusUnprocessableEntity, "application/json",
			braveError(http.StatusUnprocessableEntity, "VALIDATION", "Unable to validate request parameter(s)",
				`{"errors":[{"type":"missing","loc":["query","q"],"msg":"Field required","input":null}]}`))
	}
	count := braveMaxCount
	if v := qv.Get("count"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > braveMaxCount {
			return writeBody(w, http.StatusUnprocessableEntity, "application/json",
				braveError(http.StatusUnprocessableEntity, "VALIDATION", "Unable to validate request parameter(s)",
					`{"errors":[{"type":"less_than_equal","loc":["query","count"],"msg":"Input should be less than or equal to 20","input":`+
						string(appendJSONString(nil, v))+`,"ctx":{"le":20}}]}`))
		}
		count = n
	}
	offset := 0
	if n, err := strconv.Atoi(qv.Get("offset")); err == nil && n > 0 {
		offset = min(n, 9)
	}
	fault, ok := s.preFault(r.Context(), q)
	if !ok {
		return false
	}
	switch fault {
	case SearchFault500:
		return writeBody(w, http.StatusInternalServerError, "application/json",
			braveError(http.StatusInternalServerError, "INTERNAL_ERROR", "An internal error occurred.", `{"component":"search"}`))
	case SearchFault403:
		return writeBody(w, http.StatusForbidden, "application/json",
			braveError(http.StatusForbidden, "OPTION_NOT_IN_PLAN", "The option is not subscribed in the plan.", `{"component":"subscriptions"}`))
	}
	extra := qv.Get("extra_snippets")
	country := strings.ToLower(qv.Get("country"))
	if country == "" {
		country = "us"
	}
	body := braveJSON(q, country, searchResults(q, offset*count, count), r.Header, extra == "true" || extra == "1")
	if fault == SearchFaultGarbage {
		body = body[:len(body)/2]
	}
	return writeBody(w, http.StatusOK, "application/json", body)
}

// braveError is Brave's error envelope (captured from the live API: one
// "error" object, not the "errors" array its reference shows).
func braveError(status int, code, detail, meta string) []byte {
	b := []byte(`{"type":"ErrorResponse","error":{"id":"`)
	b = appendRand(b, uint64(time.Now().UnixNano()), 8, hexDigits)
	b = append(b, "-9396-4f6e-b84a-"...)
	b = appendRand(b, uint64(status), 12, hexDigits)
	b = append(b, `","status":`...)
	b = appendInt(b, status)
	b = append(b, `,"code":`...)
	b = appendJSONString(b, code)
	b = append(b, `,"detail":`...)
	b = appendJSONString(b, detail)
	b = append(b, `,"meta":`...)
	b = append(b, meta...)
	b = append(b, `},"time":`...)
	b = strconv.AppendInt(b, time.Now().Unix(), 10)
	return append(b, '}')
}

func braveJSON(q, country string, rs []searchResult, h http.Header, extra bool) []byte {
	b := make([]byte, 0, 1024+len(rs)*900)
	b = append(b, `{"query":{"original":`...)
	b = appendJSONString(b, q)
	b = append(b, `,"show_strict_warning":false,"is_navigational":false,"is_news_breaking":false,"spellcheck_off":true,"country":`...)
	b = appendJSONString(b, country)
	b = append(b, `,"bad_results":false,"should_fallback":false,"postal_code":"","city":`...)
	b = appendJSONString(b, h.Get("X-Loc-City"))
	b = append(b, `,"header_country":`...)
	b = appendJSONString(b, h.Get("X-Loc-Country"))
	b = append(b, `,"more_results_available":`...)
	b = strconv.AppendBool(b, len(rs) > 0)
	b = append(b, `,"state":`...)
	b = appendJSONString(b, h.Get("X-Loc-State"))
	b = append(b, `},"mixed":{"type":"mixed","main":[`...)
	for i := range rs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"type":"web","index":`...)
		b = appendInt(b, i)
		b = append(b, `,"all":false}`...)
	}
	b = append(b, `],"top":[],"side":[]},"type":"search"`...)
	if len(rs) == 0 {
		// Brave leaves "web" out when it found nothing.
		return append(b, '}')
	}
	b = append(b, `,"web":{"type":"search","results":[`...)
	for i, r := range rs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"title":`...)
		b = appendJSONString(b, r.title)
		b = append(b, `,"url":`...)
		b = appendJSONString(b, r.url)
		b = append(b, `,"is_source_local":false,"is_source_both":false,"description":`...)
		b = appendJSONString(b, r.description)
		if r.published != "" {
			b = append(b, `,"page_age":`...)
			b = appendJSONString(b, r.published+"T00:00:00")
		}
		b = append(b, `,"profile":{"name":`...)
		b = appendJSONString(b, r.host)
		b = append(b, `,"url":`...)
		b = appendJSONString(b, r.url)
		b = append(b, `,"long_name":`...)
		b = appendJSONString(b, r.host)
		b = append(b, `,"img":"https://imgs.search.brave.com/sim/`...)
		b = append(b, r.host...)
		b = append(b, `.png"},"language":"en","family_friendly":true,"type":"search_result","subtype":"generic","is_live":false,"meta_url":{"scheme":"https","netloc":`...)
		b = appendJSONString(b, r.host)
		b = append(b, `,"hostname":`...)
		b = appendJSONString(b, r.host)
		b = append(b, `,"favicon":"https://imgs.search.brave.com/sim/`...)
		b = append(b, r.host...)
		b = append(b, `.ico","path":`...)
		b = appendJSONString(b, "› "+strings.TrimPrefix(r.path, "/"))
		b = append(b, '}')
		if r.published != "" {
			b = append(b, `,"age":`...)
			b = appendJSONString(b, r.age)
		}
		if extra {
			b = append(b, `,"extra_snippets":[`...)
			for j, sn := range r.snippets {
				if j > 0 {
					b = append(b, ',')
				}
				b = appendJSONString(b, sn)
			}
			b = append(b, ']')
		}
		b = append(b, '}')
	}
	return append(b, `],"family_friendly":true}}`...)
}

// ---- results ----

// searchResult is one deterministic result.
type searchResult struct {
	rank        int // 1-based over all pages
	url         string
	host        string // "<word>.example"
	path        string
	title       string
	content     string
	description string // content with <strong> highlights (Brave)
	snippets    []string
	engines     []string
	score       float64
	published   string // "2025-03-07" or ""
	age         string // Brave's human form of published
	words       string // the query's cleaned words
}

// searchTotal is how many results any query has over all its pages.
const searchTotal = 60

// queryWords is the query without "simfault=" switches, lower-cased ASCII
// words for host names and slugs.
func queryWords(q string) (clean string, ascii []string) {
	var keep []string
	for _, f := range strings.Fields(q) {
		if strings.HasPrefix(f, "simfault=") {
			continue
		}
		keep = append(keep, f)
		var w strings.Builder
		for _, r := range strings.ToLower(f) {
			if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
				w.WriteRune(r)
			}
		}
		if w.Len() > 0 {
			ascii = append(ascii, w.String())
		}
	}
	return strings.Join(keep, " "), ascii
}

// searchResults returns results offset..offset+n of query q: the same query
// always gives the same results. A query containing "noresults" has none.
func searchResults(q string, offset, n int) []searchResult {
	if strings.Contains(strings.ToLower(q), "noresults") {
		return nil
	}
	clean, words := queryWords(q)
	if clean == "" {
		clean = "search"
	}
	short := clean
	if utf8.RuneCountInString(short) > 60 {
		short = string([]rune(short)[:60])
	}
	slugWords := words
	if len(slugWords) > 4 {
		slugWords = slugWords[:4]
	}
	slug := strings.Join(slugWords, "-")
	if slug == "" {
		slug = "result"
	}
	seed := fnv([]byte(clean), 0)
	end := min(offset+n, searchTotal)
	out := make([]searchResult, 0, max(end-offset, 0))
	engines := [...]string{"duckduckgo", "brave", "bing", "wikipedia", "qwant"}
	for i := offset; i < end; i++ {
		h := splitmix(seed + uint64(i))
		host := "sim"
		if len(words) > 0 {
			host = words[i%len(words)]
			if len(host) > 40 {
				host = host[:40]
			}
		}
		host += ".example"
		id := strconv.FormatUint(h&0xffffff, 16)
		path := "/" + slug + "-" + id
		res := searchResult{
			rank:  i + 1,
			url:   "https://" + host + path,
			host:  host,
			path:  path,
			score: float64(int((float64(searchTotal-i)/10)*100)) / 100,
			words: clean,
		}
		switch i % 4 {
		case 0:
			res.title = fmt.Sprintf("%s: a guide, part %d", short, i+1)
		case 1:
			res.title = fmt.Sprintf("Café & résumé notes on %s", short)
		case 2:
			res.title = fmt.Sprintf("東京の%s — 解説 %d", short, i+1)
		default:
			res.title = fmt.Sprintf("%s 🌍 around the world", short)
		}
		res.content = fmt.Sprintf("%s explained: result %d covers the gateway, its tokens and bytes.", short, i+1)
		switch i % 3 {
		case 1:
			res.content += " Naïve café owners say “ça marche”."
		case 2:
			res.content += " 日本語の説明もあります 🎌."
		}
		first := short
		if j := strings.IndexByte(first, ' '); j > 0 {
			first = first[:j]
		}
		res.description = strings.Replace(res.content, first, "<strong>"+first+"</strong>", 1)
		res.snippets = []string{
			fmt.Sprintf("More about %s, from page %d.", short, i+1),
			"A second excerpt: données, 数据 and data.",
		}
		res.engines = []string{engines[h%uint64(len(engines))]}
		if h&1 == 0 {
			res.engines = append(res.engines, engines[(h+1)%uint64(len(engines))])
		}
		if i%3 == 0 {
			day := 1 + int(h>>8%28)
			res.published = fmt.Sprintf("2025-03-%02d", day)
			res.age = fmt.Sprintf("March %d, 2025", day)
		}
		out = append(out, res)
	}
	return out
}
