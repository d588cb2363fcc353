package search

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Annotation is one url_citation. Start and End are indices into the
// content in Unicode code points (what Python's str indexing uses); End is
// exclusive.
type Annotation struct {
	URL, Title string
	Start, End int
}

// UTF16 returns the annotation with its indices in UTF-16 code units (what
// JavaScript's String.prototype.slice uses) for the content it was found
// in. The API sends code points; this is for tests and docs.
func (a Annotation) UTF16(content string) Annotation {
	start, end := a.Start, a.End
	i, u := 0, 0
	for _, r := range content {
		if i == start {
			a.Start = u
		}
		if i == end {
			a.End = u
			return a
		}
		i++
		if r >= 0x10000 {
			u += 2
		} else {
			u++
		}
	}
	if i == start {
		a.Start = u
	}
	if i == end {
		a.End = u
	}
	return a
}

// Bounds of what a citation may look like, so a text full of '[' costs
// linear time.
const (
	maxLinkText  = 500
	maxLinkURL   = 2048
	maxRefDigits = 4
)

// Annotate finds the citations of sources in an answer:
//
//  1. a markdown link [text](url) whose url is a source's URL -> the
//     annotation spans the whole link;
//  2. a bare URL of a source (not inside a markdown link; trailing
//     punctuation such as .,;:) stripped) -> it spans the URL;
//  3. a numbered reference [n], [n, m] or [n][m] where n is a source's
//     number -> one annotation per number, spanning its bracket.
//
// URLs match after trivial normalisation (http and https alike, the
// host's case, a trailing slash, a fragment). Other links, and numbers no
// source has, are left alone. The result is ordered by Start; indices are
// code points; titles come from the sources.
func Annotate(content string, sources []Source) []Annotation {
	if len(sources) == 0 || len(content) == 0 {
		return nil
	}
	byURL := make(map[string]*Source, len(sources))
	byNum := make(map[int]*Source, len(sources))
	for i := range sources {
		s := &sources[i]
		if k := normURL(s.URL); k != "" {
			if _, dup := byURL[k]; !dup {
				byURL[k] = s
			}
		}
		if _, dup := byNum[s.Number]; !dup {
			byNum[s.Number] = s
		}
	}
	type span struct {
		src        *Source
		start, end int // bytes
	}
	var found []span
	var links [][2]int // every markdown link's bytes, cited or not
	code := codeSpans(content)

	// Markdown links and numbered references, left to right.
	ci := 0
	for i := 0; i < len(content); {
		j := strings.IndexByte(content[i:], '[')
		if j < 0 {
			break
		}
		i += j
		// Code is not prose: `xs[1]` is an index, not a citation.
		for ci < len(code) && code[ci][1] <= i {
			ci++
		}
		if ci < len(code) && code[ci][0] <= i {
			i = code[ci][1]
			continue
		}
		if end, us, ue, ok := parseLink(content, i); ok {
			links = append(links, [2]int{i, end})
			if s := byURL[normURL(content[us:ue])]; s != nil {
				found = append(found, span{s, i, end})
			}
			i = end
			continue
		}
		if end, nums, ok := parseRefs(content, i); ok {
			for _, n := range nums {
				if s := byNum[n]; s != nil {
					found = append(found, span{s, i, end})
				}
			}
			i = end
			continue
		}
		i++
	}

	// Bare URLs outside the links.
	li := 0
	for i := 0; i < len(content); {
		j := indexURL(content[i:])
		if j < 0 {
			break
		}
		i += j
		for li < len(links) && links[li][1] <= i {
			li++
		}
		if li < len(links) && links[li][0] <= i {
			i = links[li][1]
			continue
		}
		end := urlEnd(content, i)
		if s := byURL[normURL(content[i:end])]; s != nil {
			found = append(found, span{s, i, end})
		}
		i = max(end, i+1)
	}
	if len(found) == 0 {
		return nil
	}
	sort.SliceStable(found, func(a, b int) bool { return found[a].start < found[b].start })

	out := make([]Annotation, len(found))
	pos, idx := 0, 0 // a byte offset and its code-point index
	for k, f := range found {
		idx += utf8.RuneCountInString(content[pos:f.start])
		pos = f.start
		out[k] = Annotation{URL: f.src.URL, Title: f.src.Title, Start: idx, End: idx + utf8.RuneCountInString(content[f.start:f.end])}
	}
	return out
}

// codeSpans returns the byte spans of markdown code, in order: fenced
// blocks (a line starting with ``` or ~~~ up to the same fence, or the
// end) and inline code (a run of backticks up to the same run on the
// same line).
func codeSpans(s string) [][2]int {
	if strings.IndexAny(s, "`~") < 0 {
		return nil
	}
	var spans [][2]int
	lineStart := true
	for i := 0; i < len(s); {
		c := s[i]
		if lineStart {
			k := skipSpaces(s, i)
			if k+3 <= len(s) && (s[k:k+3] == "```" || s[k:k+3] == "~~~") {
				fence := s[k : k+3]
				end := len(s)
				if e := strings.Index(s[k+3:], "\n"+fence); e >= 0 {
					end = k + 3 + e + 1 + len(fence)
				}
				spans = append(spans, [2]int{i, end})
				i = end
				lineStart = false
				continue
			}
		}
		lineStart = c == '\n'
		if c != '`' {
			i++
			continue
		}
		n := 1
		for i+n < len(s) && s[i+n] == '`' {
			n++
		}
		lineEnd := strings.IndexByte(s[i+n:], '\n')
		if lineEnd < 0 {
			lineEnd = len(s) - i - n
		}
		if e := closingRun(s[i+n:i+n+lineEnd], n); e >= 0 {
			end := i + n + e + n
			spans = append(spans, [2]int{i, end})
			i = end
			continue
		}
		i += n
	}
	return spans
}

// closingRun finds a run of exactly n backticks in line.
func closingRun(line string, n int) int {
	for off := 0; off < len(line); {
		j := strings.IndexByte(line[off:], '`')
		if j < 0 {
			return -1
		}
		k := off + j
		m := 1
		for k+m < len(line) && line[k+m] == '`' {
			m++
		}
		if m == n {
			return k
		}
		off = k + m
	}
	return -1
}

// parseLink parses a markdown link [text](url) or [text](url "title") or
// [text](<url>) at s[i] == '['. It returns the byte after the link and the
// url's bounds.
func parseLink(s string, i int) (end, urlStart, urlEnd int, ok bool) {
	depth := 0
	j := i
	for ; j < len(s) && j-i <= maxLinkText; j++ {
		switch s[j] {
		case '\\':
			j++
			continue
		case '\n':
			return 0, 0, 0, false
		case '[':
			depth++
		case ']':
			depth--
		}
		if depth == 0 {
			break
		}
	}
	if depth != 0 || j+1 >= len(s) || s[j+1] != '(' {
		return 0, 0, 0, false
	}
	k := skipSpaces(s, j+2)
	if k < len(s) && s[k] == '<' {
		e := strings.IndexByte(s[k:min(len(s), k+maxLinkURL)], '>')
		if e < 0 {
			return 0, 0, 0, false
		}
		urlStart, urlEnd = k+1, k+e
		k += e + 1
	} else {
		urlStart = k
		paren := 0
	url:
		for ; k < len(s) && k-urlStart <= maxLinkURL; k++ {
			switch c := s[k]; {
			case c == '(':
				paren++
			case c == ')':
				if paren == 0 {
					break url
				}
				paren--
			case c == ' ' || c == '\t' || c == '\n' || c == '\r':
				break url
			}
		}
		urlEnd = k
	}
	k = skipSpaces(s, k)
	if k < len(s) && (s[k] == '"' || s[k] == '\'') { // a title
		q := s[k]
		e := strings.IndexByte(s[k+1:min(len(s), k+1+maxLinkText)], q)
		if e < 0 {
			return 0, 0, 0, false
		}
		k = skipSpaces(s, k+e+2)
	}
	if k >= len(s) || s[k] != ')' || urlEnd <= urlStart {
		return 0, 0, 0, false
	}
	return k + 1, urlStart, urlEnd, true
}

func skipSpaces(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	return i
}

// parseRefs parses [n] or [n, m, ...] at s[i] == '['.
func parseRefs(s string, i int) (end int, nums []int, ok bool) {
	j := i + 1
	for {
		j = skipSpaces(s, j)
		n, d := 0, 0
		for j < len(s) && s[j] >= '0' && s[j] <= '9' && d < maxRefDigits {
			n = n*10 + int(s[j]-'0')
			j++
			d++
		}
		if d == 0 || (j < len(s) && s[j] >= '0' && s[j] <= '9') {
			return 0, nil, false
		}
		nums = append(nums, n)
		j = skipSpaces(s, j)
		if j >= len(s) {
			return 0, nil, false
		}
		switch s[j] {
		case ']':
			return j + 1, nums, true
		case ',':
			j++
		default:
			return 0, nil, false
		}
	}
}

// indexURL finds the next "http://" or "https://" (any case) that does
// not continue a word ("xhttp://"). It looks for "://", which is rare in
// prose, rather than for every 'h'.
func indexURL(s string) int {
	for off := 0; ; {
		j := strings.Index(s[off:], "://")
		if j < 0 {
			return -1
		}
		k := off + j
		for _, scheme := range [...]string{"https", "http"} {
			st := k - len(scheme)
			if st >= 0 && strings.EqualFold(s[st:k], scheme) &&
				(st == 0 || !isASCIILetter(s[st-1]) && !(s[st-1] >= '0' && s[st-1] <= '9')) {
				return st
			}
		}
		off = k + 3
	}
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// urlEnd returns where a bare URL starting at s[i] ends: at white space,
// a character that cannot be in a URL, or punctuation outside ASCII
// ("。", "，"); then trailing punctuation is given back to the sentence,
// and a closing bracket too unless the URL opened it (Wikipedia's
// ..._(band)).
func urlEnd(s string, i int) int {
	e := i
	for e < len(s) {
		r, size := utf8.DecodeRuneInString(s[e:])
		if r < utf8.RuneSelf {
			if r <= ' ' || strings.IndexByte("<>\"`{}|\\^", byte(r)) >= 0 {
				break
			}
		} else if unicode.IsSpace(r) || unicode.IsPunct(r) || unicode.IsSymbol(r) || r == utf8.RuneError {
			break
		}
		e += size
	}
	for e > i {
		c := s[e-1]
		switch {
		case strings.IndexByte(".,;:!?'*_~", c) >= 0:
			e--
			continue
		case c == ')' && strings.Count(s[i:e], "(") < strings.Count(s[i:e], ")"):
			e--
			continue
		case c == ']' && strings.Count(s[i:e], "[") < strings.Count(s[i:e], "]"):
			e--
			continue
		}
		break
	}
	return e
}

// normURL is the key under which URLs are compared: scheme dropped (http
// and https alike), host lower-cased, fragment and trailing slash dropped.
// Not a URL: "".
func normURL(u string) string {
	u = strings.TrimSpace(u)
	switch {
	case hasPrefixFold(u, "https://"):
		u = u[len("https://"):]
	case hasPrefixFold(u, "http://"):
		u = u[len("http://"):]
	default:
		return ""
	}
	if h := strings.IndexByte(u, '#'); h >= 0 {
		u = u[:h]
	}
	host, rest := u, ""
	if k := strings.IndexAny(u, "/?"); k >= 0 {
		host, rest = u[:k], u[k:]
	}
	if host == "" {
		return ""
	}
	path, query, hasQuery := strings.Cut(rest, "?")
	path = strings.TrimRight(path, "/")
	key := strings.ToLower(host) + path
	if hasQuery {
		key += "?" + query
	}
	return key
}
