package search

import (
	"html"
	"strings"
	"unicode"
	"unicode/utf8"
)

// cleanText turns a provider's snippet into one line of plain text: HTML
// tags removed (Brave marks matches with <strong>), entities decoded
// (&amp; -> &), control characters dropped, runs of whitespace collapsed
// to one space, and the ends trimmed.
func cleanText(s string) string {
	if strings.IndexByte(s, '<') >= 0 {
		s = stripTags(s)
	}
	if strings.IndexByte(s, '&') >= 0 {
		s = html.UnescapeString(s)
	}
	var b strings.Builder
	b.Grow(len(s))
	space := false
	for _, r := range s {
		if unicode.IsSpace(r) {
			space = b.Len() > 0
			continue
		}
		if isControl(r) {
			continue
		}
		if space {
			b.WriteByte(' ')
			space = false
		}
		b.WriteRune(r)
	}
	return b.String()
}

// stripTags removes HTML tags: a '<' followed by a letter, '/', '!' or '?'
// up to the next '>'. A lone '<' ("a < b") is text and stays.
func stripTags(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for {
		i := strings.IndexByte(s, '<')
		if i < 0 || i+1 >= len(s) {
			b.WriteString(s)
			return b.String()
		}
		c := s[i+1]
		if !isASCIILetter(c) && c != '/' && c != '!' && c != '?' {
			b.WriteString(s[:i+1])
			s = s[i+1:]
			continue
		}
		j := strings.IndexByte(s[i:], '>')
		if j < 0 {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:i])
		// A tag separates words as often as not ("a<br>b"): keep a space.
		b.WriteByte(' ')
		s = s[i+j+1:]
	}
}

// cutText returns s if it has at most n code points, else its first n-1
// code points (trailing space removed) and "…": never more than n code
// points, never cut inside a UTF-8 sequence.
func cutText(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if len(s) <= n { // bytes >= code points
		return s
	}
	count := 0
	for i := range s {
		if count == n-1 {
			if utf8.RuneCountInString(s[i:]) == 1 {
				return s // exactly n code points
			}
			return strings.TrimRight(s[:i], " ") + "…"
		}
		count++
	}
	return s
}

// firstRunes returns the first n code points of s (all of it if shorter).
func firstRunes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	count := 0
	for i := range s {
		if count == n {
			return strings.TrimRight(s[:i], " ")
		}
		count++
	}
	return s
}
