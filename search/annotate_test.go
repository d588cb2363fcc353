package search

import (
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf16"
	"unicode/utf8"
)

var testSources = []Source{
	{Number: 1, URL: "https://go.dev/doc/devel/release", Title: "Release History"},
	{Number: 2, URL: "https://en.wikipedia.org/wiki/Go_(programming_language)", Title: "Go (programming language)"},
	{Number: 3, URL: "http://example.com/a/", Title: "Example A"},
	{Number: 4, URL: "https://例え.jp/ページ?x=1", Title: "Japanese page"},
}

type wantAnn struct {
	url  string
	text string // []rune(content)[Start:End]
}

// check verifies every annotation against the content sliced the way
// Python (code points) and JavaScript (UTF-16 code units) slice it.
func check(t *testing.T, content string, got []Annotation, want []wantAnn) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d annotations %+v, want %d %+v\ncontent: %s", len(got), got, len(want), want, content)
	}
	runes := []rune(content)
	units := utf16.Encode(runes)
	for i, a := range got {
		if a.URL != want[i].url {
			t.Errorf("[%d] url %q, want %q", i, a.URL, want[i].url)
		}
		if a.Start < 0 || a.End > len(runes) || a.Start >= a.End {
			t.Fatalf("[%d] bad span %d..%d of %d code points", i, a.Start, a.End, len(runes))
		}
		if s := string(runes[a.Start:a.End]); s != want[i].text {
			t.Errorf("[%d] python slice %q, want %q", i, s, want[i].text)
		}
		u := a.UTF16(content)
		if s := string(utf16.Decode(units[u.Start:u.End])); s != want[i].text {
			t.Errorf("[%d] javascript slice %q (%d..%d), want %q", i, s, u.Start, u.End, want[i].text)
		}
		if i > 0 && got[i-1].Start > a.Start {
			t.Errorf("not ordered by start: %+v", got)
		}
		var title string
		for _, s := range testSources {
			if s.URL == a.URL {
				title = s.Title
			}
		}
		if a.Title != title {
			t.Errorf("[%d] title %q, want %q", i, a.Title, title)
		}
	}
}

func TestAnnotateMarkdownLinks(t *testing.T) {
	c := "Go 1.26 is out 🎉 — see [the release notes](https://go.dev/doc/devel/release#go1.26) and " +
		"[Wikipedia](https://en.wikipedia.org/wiki/Go_(programming_language) \"Go\"). Also [A](<https://example.com/a>)."
	check(t, c, Annotate(c, testSources), []wantAnn{
		{testSources[0].URL, "[the release notes](https://go.dev/doc/devel/release#go1.26)"},
		{testSources[1].URL, `[Wikipedia](https://en.wikipedia.org/wiki/Go_(programming_language) "Go")`},
		{testSources[2].URL, "[A](<https://example.com/a>)"},
	})
}

func TestAnnotateBareURLs(t *testing.T) {
	c := "Quelle : https://go.dev/doc/devel/release. Voir aussi (https://en.wikipedia.org/wiki/Go_(programming_language)), " +
		"HTTPS://EXAMPLE.COM/a; 日本語：https://例え.jp/ページ?x=1。 Fin"
	check(t, c, Annotate(c, testSources), []wantAnn{
		{testSources[0].URL, "https://go.dev/doc/devel/release"},
		{testSources[1].URL, "https://en.wikipedia.org/wiki/Go_(programming_language)"},
		{testSources[2].URL, "HTTPS://EXAMPLE.COM/a"},
		{testSources[3].URL, "https://例え.jp/ページ?x=1"},
	})
}

func TestAnnotateNumberedReferences(t *testing.T) {
	c := "Ünïcödé 👩‍👩‍👧 first [1], then [2, 3] and [4][1]; [9] has no source, nor [0], and [12345] is too long."
	check(t, c, Annotate(c, testSources), []wantAnn{
		{testSources[0].URL, "[1]"},
		{testSources[1].URL, "[2, 3]"},
		{testSources[2].URL, "[2, 3]"},
		{testSources[3].URL, "[4]"},
		{testSources[0].URL, "[1]"},
	})
}

func TestAnnotateIgnoresOtherURLs(t *testing.T) {
	c := "See [elsewhere](https://other.example/x) and https://go.dev/other and https://go.dev/doc/devel/releases " +
		"and [1](https://unknown.example) and xhttps://go.dev/doc/devel/release."
	if got := Annotate(c, testSources); len(got) != 0 {
		t.Errorf("annotations %+v, want none", got)
	}
	if got := Annotate("text [1]", nil); got != nil {
		t.Errorf("no sources: %+v", got)
	}
}

// A URL inside a counted markdown link is not counted again as a bare
// URL, nor is a number that is a link's text.
func TestAnnotateNoDoubleCount(t *testing.T) {
	c := "[https://go.dev/doc/devel/release](https://go.dev/doc/devel/release/) and [1](http://example.com/a) " +
		"and [see [1]](https://example.com/a#top) then https://example.com/a/."
	check(t, c, Annotate(c, testSources), []wantAnn{
		{testSources[0].URL, "[https://go.dev/doc/devel/release](https://go.dev/doc/devel/release/)"},
		{testSources[2].URL, "[1](http://example.com/a)"},
		{testSources[2].URL, "[see [1]](https://example.com/a#top)"},
		{testSources[2].URL, "https://example.com/a/"},
	})
}

// Code is not prose: an index such as xs[1] in code is not a citation.
func TestAnnotateSkipsCode(t *testing.T) {
	c := "Use `xs[1]` here [2].\n```go\nys := xs[1]\nzs := [3]int{}\n```\nSee [1], and\n~~~\n[4]\n~~~\nend"
	check(t, c, Annotate(c, testSources), []wantAnn{
		{testSources[1].URL, "[2]"},
		{testSources[0].URL, "[1]"},
	})
	c = "Cost ``a ` b`` [1], then ``x[3]`` and [4], a lone ` tick [2]"
	check(t, c, Annotate(c, testSources), []wantAnn{
		{testSources[0].URL, "[1]"},
		{testSources[3].URL, "[4]"},
		{testSources[1].URL, "[2]"},
	})
	if spans := codeSpans("```\nnever closed [1]"); len(spans) != 1 || spans[0] != [2]int{0, 20} {
		t.Errorf("unclosed fence: %v", spans)
	}
}

// Emoji (astral, two UTF-16 units) and combining text before a citation:
// the indices differ between code points and UTF-16, both are right.
func TestAnnotateIndicesAfterEmoji(t *testing.T) {
	c := "😀😀😀 café [1]"
	got := Annotate(c, testSources)
	check(t, c, got, []wantAnn{{testSources[0].URL, "[1]"}})
	if got[0].Start != 9 || got[0].End != 12 {
		t.Errorf("code points %d..%d, want 9..12", got[0].Start, got[0].End)
	}
	if u := got[0].UTF16(c); u.Start != 12 || u.End != 15 {
		t.Errorf("utf-16 %d..%d, want 12..15", u.Start, u.End)
	}
}

func TestNormURL(t *testing.T) {
	same := [][2]string{
		{"https://Go.Dev/doc/", "http://go.dev/doc"},
		{"https://go.dev/doc#x", "https://go.dev/doc"},
		{"https://go.dev/?q=1", "https://go.dev?q=1"},
		{"https://go.dev", "https://go.dev/"},
	}
	for _, p := range same {
		if normURL(p[0]) != normURL(p[1]) || normURL(p[0]) == "" {
			t.Errorf("%q and %q differ: %q %q", p[0], p[1], normURL(p[0]), normURL(p[1]))
		}
	}
	for _, p := range [][2]string{{"https://go.dev/Doc", "https://go.dev/doc"}, {"https://go.dev/doc?q=1", "https://go.dev/doc?q=2"}} {
		if normURL(p[0]) == normURL(p[1]) {
			t.Errorf("%q and %q are the same", p[0], p[1])
		}
	}
	for _, u := range []string{"", "ftp://x", "https://", "go.dev"} {
		if normURL(u) != "" {
			t.Errorf("normURL(%q) = %q, want none", u, normURL(u))
		}
	}
}

// Whatever the content, every annotation lies within it, on a span that
// holds a source's URL (forms 1 and 2) or its [n] (form 3), in order.
func FuzzAnnotate(f *testing.F) {
	for _, s := range []string{
		"see [1] and [2, 3]", "[x](https://go.dev/doc/devel/release)", "😀 https://example.com/a/.",
		"[[[[[[", "[1](", "](https://x)", "[a](<https://example.com/a>", "(https://en.wikipedia.org/wiki/Go_(programming_language))",
		"\xff\xfe[1]", "[4][1][2 ,3]", "`a[1]` [2]\n```\n[3]\n```\n[4]", "日本語：https://例え.jp/ページ?x=1。",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, content string) {
		anns := Annotate(content, testSources)
		n := utf8.RuneCountInString(content)
		runes := []rune(content)
		prev := 0
		for _, a := range anns {
			if a.Start < 0 || a.End > n || a.Start >= a.End || a.Start < prev {
				t.Fatalf("bad span %d..%d (content %d code points, previous start %d)", a.Start, a.End, n, prev)
			}
			prev = a.Start
			text := string(runes[a.Start:a.End])
			var src *Source
			for i := range testSources {
				if testSources[i].URL == a.URL {
					src = &testSources[i]
				}
			}
			if src == nil {
				t.Fatalf("annotation of a URL that is no source: %q", a.URL)
			}
			if !containsURL(text, src.URL) && !strings.Contains(text, strconv.Itoa(src.Number)) {
				t.Fatalf("span %q holds neither %s nor [%d]", text, src.URL, src.Number)
			}
			u := a.UTF16(content)
			units := utf16.Encode(runes)
			if u.Start < 0 || u.End > len(units) || string(utf16.Decode(units[u.Start:u.End])) != text {
				t.Fatalf("utf-16 span %d..%d does not hold %q", u.Start, u.End, text)
			}
		}
	})
}

// containsURL reports whether text holds u up to the trivial differences
// Annotate ignores (scheme, case, trailing slash, fragment).
func containsURL(text, u string) bool {
	key := normURL(u)
	if i := strings.IndexByte(key, '?'); i < 0 {
		key = strings.TrimRight(key, "/")
	}
	return strings.Contains(strings.ToLower(text), strings.ToLower(key))
}

func TestAnnotateLinearTime(t *testing.T) {
	for _, s := range []string{
		strings.Repeat("[", 200_000), strings.Repeat("[a](", 50_000), strings.Repeat("https://", 25_000),
		strings.Repeat("[1,", 70_000), strings.Repeat("(https://example.com/a)", 10_000), strings.Repeat("hhhh", 50_000),
		strings.Repeat("`", 200_000), strings.Repeat("` [1]", 40_000), strings.Repeat("``` [1]\n", 25_000), strings.Repeat("``x` [1]", 25_000),
	} {
		start := time.Now()
		Annotate(s, testSources)
		if d := time.Since(start); d > 10*time.Second { // quadratic would take minutes
			t.Errorf("%.12q x %d: %v", s, len(s), d)
		}
	}
}
