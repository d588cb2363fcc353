package simulate

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/tollgate/tollgate/internal/jsonscan"
)

// The model's side of web search. When a request offers a function named
// web_search the simulated model searches first: it calls web_search with
// the question as the query, then, once the results come back as tool
// messages in the text format tollgate writes, answers citing them. The
// answer mixes ASCII with accents, CJK and an emoji so that byte, code-point
// and UTF-16 offsets all differ, and a URL streams over several deltas.

// webSearchName is the function tollgate offers for its searches.
const webSearchName = "web_search"

// The first words of the tool results tollgate writes.
const (
	searchResultsPrefix = "Search results for"
	noResultsPrefix     = "No results for"
	noMorePrefix        = "No more searches are allowed"
)

// CiteStyle is how the simulated model cites search results.
type CiteStyle string

const (
	CiteMarkdown CiteStyle = "markdown" // [Title](https://...)
	CiteURL      CiteStyle = "url"      // a bare https://...
	CiteNumber   CiteStyle = "number"   // [n], the number the result was given
	CiteAll      CiteStyle = "all"      // markdown, url, number, markdown... one source each
	CiteNone     CiteStyle = "none"     // no citations at all
)

// ParseCiteStyle accepts a cite style ("" means markdown).
func ParseCiteStyle(s string) (CiteStyle, error) {
	switch CiteStyle(strings.ToLower(strings.TrimSpace(s))) {
	case "", CiteMarkdown, "link":
		return CiteMarkdown, nil
	case CiteURL, "bare":
		return CiteURL, nil
	case CiteNumber, "numbered", "n":
		return CiteNumber, nil
	case CiteAll, "mixed":
		return CiteAll, nil
	case CiteNone:
		return CiteNone, nil
	}
	return "", fmt.Errorf("switch cite=%q: want markdown, url, number, all or none", s)
}

// ForeignURL is the address the model cites with cite_foreign=1: it is
// never among the search results, so tollgate must not annotate it.
const ForeignURL = "https://unlisted.example/not-from-the-search"

// noteToolResult records a tool message's raw text when it came from
// tollgate's search.
func (r *chatRequest) noteToolResult(raw []byte) {
	switch {
	case hasPrefix(raw, searchResultsPrefix):
		r.searchTexts = append(r.searchTexts, raw)
		r.searchSeen = true
	case hasPrefix(raw, noResultsPrefix):
		r.searchSeen = true
	case hasPrefix(raw, noMorePrefix):
		r.searchSeen, r.noMore = true, true
	}
}

func hasPrefix(b []byte, p string) bool { return len(b) >= len(p) && string(b[:len(p)]) == p }

type searchMode uint8

const (
	searchOff    searchMode = iota // answer as without web search
	searchCall                     // call web_search
	searchAnswer                   // answer citing the results
)

// webSearch is what the model does about web search in one request.
type webSearch struct {
	offered bool // the request offers web_search
	mode    searchMode
	queries []string // searchCall: one query per call

	// searchAnswer
	sources []source
	cite    CiteStyle
	foreign bool
}

// source is one numbered result read back from a tool message.
type source struct {
	n     int
	title string
	url   string
}

// searchPlan decides between searching, citing and neither. The model
// searches in SearchTurns turns (counted as its assistant messages with
// web_search calls since the last user message) unless told no more
// searches are allowed; after a search it answers citing what it got.
func (s *Server) searchPlan(req *chatRequest, beh Behaviour) webSearch {
	var ws webSearch
	if req.toolsRaw != nil && indexBytes(req.toolsRaw, `"`+webSearchName+`"`) >= 0 {
		for _, t := range req.tools() {
			if t.Function.Name == webSearchName {
				ws.offered = true
				break
			}
		}
	}
	canSearch := ws.offered && !beh.NoSearch && !s.cfg.NoTools &&
		(req.toolChoice != "none" || s.flavour == Ollama)
	turns := max(beh.SearchTurns, 1)
	switch {
	case canSearch && !req.noMore && req.searchDone < turns:
		ws.mode = searchCall
		ws.queries = searchQueries(req, beh)
	case req.searchDone > 0 || req.searchSeen:
		ws.mode = searchAnswer
		// The results of this question's searches; those of earlier
		// questions only when it got none.
		ws.sources = parseSources(req.searchTexts[req.searchFrom:])
		if len(ws.sources) == 0 {
			ws.sources = parseSources(req.searchTexts)
		}
		ws.cite = beh.Cite
		if ws.cite == "" {
			ws.cite = CiteMarkdown
		}
		ws.foreign = beh.CiteForeign
	}
	return ws
}

// withoutWebSearch leaves tollgate's function out of the client's tools.
func withoutWebSearch(ts []toolDef, offered bool) []toolDef {
	if !offered {
		return ts
	}
	out := ts[:0:0]
	for _, t := range ts {
		if t.Function.Name != webSearchName {
			out = append(out, t)
		}
	}
	return out
}

// searchQueries builds this turn's queries: the last user message without
// its [sim ...] marker; the k-th search of the conversation's question gets
// " k" appended (k >= 2), and search_fault=X adds " simfault=X".
func searchQueries(req *chatRequest, beh Behaviour) []string {
	base := stripMarker(jsonText(req.lastUser))
	if base == "" {
		base = "search"
	}
	n := max(beh.Searches, 1)
	out := make([]string, n)
	for k := range out {
		q := base
		if idx := req.searchDone*n + k + 1; idx > 1 {
			q += " " + strconv.Itoa(idx)
		}
		if beh.SearchFault != "" {
			q += " simfault=" + beh.SearchFault
		}
		out[k] = q
	}
	return out
}

// stripMarker removes a "[sim ...]" marker and tidies the spaces around it.
func stripMarker(s string) string {
	if i := strings.Index(s, "[sim "); i >= 0 {
		if j := strings.IndexByte(s[i:], ']'); j >= 0 {
			s = s[:i] + " " + s[i+j+1:]
		}
	}
	return strings.Join(strings.Fields(s), " ")
}

// jsonText decodes raw JSON string contents (surrogate pairs included).
func jsonText(raw []byte) string {
	if s, ok := jsonscan.Unquote(raw); ok {
		return s
	}
	return string(raw)
}

// searchArgs is the web_search call's arguments.
func searchArgs(q string) string {
	b := append([]byte(`{"query":`), appendJSONString(nil, q)...)
	return string(append(b, '}'))
}

// parseSources reads the "[n] Title" / "URL: ..." lines of the search tool
// results, first appearance of each number kept.
func parseSources(texts [][]byte) []source {
	var out []source
	seen := map[int]bool{}
	for _, raw := range texts {
		lines := strings.Split(jsonText(raw), "\n")
		for i := 0; i+1 < len(lines); i++ {
			l := lines[i]
			if len(l) < 4 || l[0] != '[' {
				continue
			}
			end := strings.IndexByte(l, ']')
			if end < 2 || end+1 >= len(l) || l[end+1] != ' ' {
				continue
			}
			n, err := strconv.Atoi(l[1:end])
			if err != nil || seen[n] {
				continue
			}
			u, ok := strings.CutPrefix(lines[i+1], "URL: ")
			if !ok || u == "" {
				continue
			}
			seen[n] = true
			out = append(out, source{n: n, title: strings.TrimSpace(l[end+2:]), url: strings.TrimSpace(u)})
			i++
		}
	}
	return out
}

// citeCount is how many sources one answer cites: three for one style, six
// for "all" so that every style appears twice when there are enough.
func citeCount(style CiteStyle) int {
	if style == CiteAll {
		return 6
	}
	return 3
}

// answer lays out the cited answer as tokens. Every piece is one token; a
// URL is several (scheme, host labels, path segments), as real tokenizers
// split it, so a streamed URL arrives over several deltas.
func (ws *webSearch) answer(seed uint64) []string {
	out := []string{"Résumé", " 🌍", " 東京:"}
	words := func(k int) {
		for i := 0; i < k; i++ {
			out = append(out, piece(contentWords[:], contentSpaced, seed, len(out)+1))
		}
	}
	if len(ws.sources) == 0 {
		out = append(out, " nothing", " was", " found", ",", " so", " this", " answer", " relies", " on", " what", " the", " model", " knows")
		if ws.foreign && ws.cite != CiteNone {
			out = append(out, ",", " see")
			out = ws.appendCite(out, source{title: "Elsewhere", url: ForeignURL}, CiteURL)
		}
		return append(out, ".")
	}
	cited := ws.sources[:min(len(ws.sources), citeCount(ws.cite))]
	for j, src := range cited {
		words(3)
		if ws.cite != CiteNone {
			style := ws.cite
			if style == CiteAll {
				style = [...]CiteStyle{CiteMarkdown, CiteURL, CiteNumber}[j%3]
			}
			out = append(out, " (see")
			out = ws.appendCite(out, src, style)
			out = append(out, ")")
		}
		if j < len(cited)-1 {
			out = append(out, ";")
		}
	}
	if ws.foreign && ws.cite != CiteNone {
		style := ws.cite
		if style == CiteNumber || style == CiteAll {
			style = CiteMarkdown // a foreign page has no number
		}
		out = append(out, ";", " compare")
		out = ws.appendCite(out, source{title: "Elsewhere", url: ForeignURL}, style)
	}
	words(2)
	return append(out, ".")
}

// appendCite writes one citation in style, preceded by a space.
func (ws *webSearch) appendCite(out []string, src source, style CiteStyle) []string {
	switch style {
	case CiteNumber:
		return append(out, " ["+strconv.Itoa(src.n)+"]")
	case CiteURL:
		out = append(out, " ")
		return append(out, urlPieces(src.url)...)
	}
	title := strings.Fields(src.title)
	if len(title) == 0 {
		title = []string{"source"}
	}
	out = append(out, " ["+title[0])
	for _, w := range title[1:] {
		out = append(out, " "+w)
	}
	out = append(out, "](")
	out = append(out, urlPieces(src.url)...)
	return append(out, ")")
}

// urlPieces splits a URL into tokens: the scheme with "://", then pieces
// ending at each '.', '/' or '-'.
func urlPieces(u string) []string {
	var out []string
	if i := strings.Index(u, "://"); i >= 0 {
		out = append(out, u[:i+3])
		u = u[i+3:]
	}
	start := 0
	for i := 0; i < len(u); i++ {
		switch u[i] {
		case '.', '/', '-':
			out = append(out, u[start:i+1])
			start = i + 1
		}
	}
	if start < len(u) {
		out = append(out, u[start:])
	}
	return out
}
