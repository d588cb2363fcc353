package search

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestToolJSON(t *testing.T) {
	var tool struct {
		Type     string `json:"type"`
		Function struct {
			Name        string `json:"name"`
			Description string `json:"description"`
			Parameters  struct {
				Type       string `json:"type"`
				Properties map[string]struct {
					Type string `json:"type"`
				} `json:"properties"`
				Required []string `json:"required"`
			} `json:"parameters"`
		} `json:"function"`
	}
	if err := json.Unmarshal(ToolJSON(), &tool); err != nil {
		t.Fatal(err)
	}
	f := tool.Function
	if tool.Type != "function" || f.Name != ToolName || f.Parameters.Type != "object" ||
		f.Parameters.Properties["query"].Type != "string" || len(f.Parameters.Required) != 1 || f.Parameters.Required[0] != "query" {
		t.Errorf("tool = %+v", tool)
	}
	for _, want := range []string{"current information", "markdown link", "[1]"} {
		if !strings.Contains(f.Description, want) {
			t.Errorf("description lacks %q: %s", want, f.Description)
		}
	}
	b := ToolJSON()
	b[0] = 'X'
	if ToolJSON()[0] != '{' {
		t.Error("ToolJSON returns shared bytes")
	}
}

func TestParseToolArguments(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{`{"query": "go 1.26 release date"}`, "go 1.26 release date"},
		{`{"q": "weather berlin"}`, "weather berlin"},
		{`{"search_query": "x"}`, "x"},
		{` {"query": "  spaced\n out  ", "num_results": 5} `, "spaced out"},
		{`"a bare json string"`, "a bare json string"},
		{`plain text query`, "plain text query"},
		{`{"query": "日本語 😀"}`, "日本語 😀"},
	} {
		got, err := ParseToolArguments(tc.args)
		if err != nil || got != tc.want {
			t.Errorf("ParseToolArguments(%q) = %q, %v; want %q", tc.args, got, err, tc.want)
		}
	}
	for _, args := range []string{``, `  `, `{}`, `{"query": ""}`, `{"query": "  "}`, `""`, `{"other": "x"}`} {
		if _, err := ParseToolArguments(args); !errors.Is(err, ErrNoQuery) {
			t.Errorf("ParseToolArguments(%q): %v, want ErrNoQuery", args, err)
		}
	}
	for _, args := range []string{`{"query": 5}`, `{"query": "x"`} {
		if q, err := ParseToolArguments(args); err == nil {
			t.Errorf("ParseToolArguments(%q) = %q, want an error", args, q)
		}
	}
}

func TestFormatResults(t *testing.T) {
	res := []Result{
		{URL: "https://go.dev/doc/", Title: "Go docs", Content: "Documentation for Go."},
		{URL: "https://例え.jp/ページ", Title: "", Content: ""},
		{URL: "https://x.example/", Title: "Two\nlines", Content: "a\nb"},
	}
	got := FormatResults("go  docs\n", res, 4)
	want := `Search results for "go docs" (cite a result as a markdown link to its URL or as [n]):

[4] Go docs
URL: https://go.dev/doc/
Documentation for Go.

[5] https://例え.jp/ページ
URL: https://例え.jp/ページ
(no excerpt)

[6] Two lines
URL: https://x.example/
a b`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if got := FormatResults("nothing here", nil, 1); got != `No results for "nothing here".` {
		t.Errorf("no results: %q", got)
	}
	src := Sources(res, 4)
	if len(src) != 3 || src[0] != (Source{Number: 4, URL: "https://go.dev/doc/", Title: "Go docs"}) || src[2].Number != 6 {
		t.Errorf("Sources = %+v", src)
	}
}
