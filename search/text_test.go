package search

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCleanText(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"The <strong>Go</strong> language", "The Go language"},
		{"a &amp; b &lt;tag&gt; &#39;q&#39; &quot;x&quot;", `a & b <tag> 'q' "x"`},
		{"  line one\n\n\tline two  ", "line one line two"},
		{"a < b and c > d", "a < b and c > d"},
		{"first<br>second", "first second"},
		{"keep\u0007 out control", "keep out control"},
		{"日本語の<b>テキスト</b>です", "日本語の テキスト です"},
		{"unclosed <b tag", "unclosed <b tag"},
	} {
		if got := cleanText(tc.in); got != tc.want {
			t.Errorf("cleanText(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// Multi-byte text is cut at code points, never inside a UTF-8 sequence.
func TestCutTextCodePoints(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"hello", 5, "hello"},
		{"hello!", 5, "hell…"},
		{"héllo wörld", 7, "héllo…"},
		{"日本語のテキスト", 8, "日本語のテキスト"},
		{"日本語のテキスト", 4, "日本語…"},
		{"👍👍👍👍", 3, "👍👍…"},
		{"a 👍 b", 2, "a…"},
		{"anything", 0, ""},
	} {
		got := cutText(tc.in, tc.n)
		if got != tc.want {
			t.Errorf("cutText(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
		if !utf8.ValidString(got) || utf8.RuneCountInString(got) > tc.n {
			t.Errorf("cutText(%q, %d) = %q: invalid or too long", tc.in, tc.n, got)
		}
	}
	long := strings.Repeat("ü€😀", 1000)
	for n := 1; n < 50; n++ {
		got := cutText(long, n)
		if !utf8.ValidString(got) || utf8.RuneCountInString(got) != n {
			t.Fatalf("cutText(long, %d): %d code points, valid %t", n, utf8.RuneCountInString(got), utf8.ValidString(got))
		}
	}
}
