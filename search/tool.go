package search

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
)

// ToolName is the name of the function tollgate offers the model.
const ToolName = "web_search"

// toolJSON is one element of the request's `tools`: the search function.
const toolJSON = `{"type":"function","function":{"name":"web_search",` +
	`"description":"Search the web for current information: news, recent events, prices, versions, anything that may have changed after your training. ` +
	`Returns numbered results, each with a title, a URL and an excerpt. ` +
	`In your answer, cite every result you use, either as a markdown link to the result's URL, e.g. [Example](https://example.com/page), ` +
	`or by the result's number in square brackets, e.g. [1].",` +
	`"parameters":{"type":"object","properties":{"query":{"type":"string",` +
	`"description":"What to search for: a few keywords, as you would type them into a search engine."}},` +
	`"required":["query"]}}}`

// ToolJSON returns the search function as one element of `tools` (a fresh
// copy each call).
func ToolJSON() []byte { return []byte(toolJSON) }

// LimitReachedMessage is the tool result for a search call past max_searches.
const LimitReachedMessage = "No more searches are allowed for this request. Answer now with the results you already have."

// ErrNoQuery is returned by ParseToolArguments for a call without a query.
var ErrNoQuery = errors.New(`the web_search call has no query: send {"query": "keywords"}`)

// ParseToolArguments reads the query from a tool call's arguments (a JSON
// string as the model wrote it). Models send {"query": "..."}, sometimes
// {"q": "..."}, a JSON string, or plain text: all are accepted. An empty
// query is ErrNoQuery.
func ParseToolArguments(args string) (string, error) {
	t := strings.TrimSpace(args)
	var q string
	switch {
	case t == "":
	case t[0] == '{':
		var obj map[string]json.RawMessage
		if err := json.Unmarshal([]byte(t), &obj); err != nil {
			return "", errors.New(`the web_search arguments are not valid JSON: send {"query": "keywords"}`)
		}
		for _, k := range []string{"query", "q", "search_query"} {
			if v, ok := obj[k]; ok {
				if json.Unmarshal(v, &q) != nil {
					return "", errors.New(`the web_search query must be a string: send {"query": "keywords"}`)
				}
				break
			}
		}
	case t[0] == '"':
		if json.Unmarshal([]byte(t), &q) != nil {
			q = t
		}
	default:
		q = t
	}
	q = strings.Join(strings.Fields(q), " ")
	if q == "" {
		return "", ErrNoQuery
	}
	return q, nil
}

// Source is a result as numbered for the model: numbers run across all the
// searches of one request, starting at 1.
type Source struct {
	Number     int
	URL, Title string
}

// Sources numbers results from first on.
func Sources(results []Result, first int) []Source {
	out := make([]Source, len(results))
	for i, r := range results {
		out[i] = Source{Number: first + i, URL: r.URL, Title: r.Title}
	}
	return out
}

// noText stands for a result without an excerpt, so every result has its
// three lines.
const noText = "(no excerpt)"

// FormatResults renders the tool result for one search, in exactly this
// text format (the simulator parses it; models read it):
//
//	Search results for "QUERY" (cite a result as a markdown link to its URL or as [n]):
//
//	[1] Title
//	URL: https://...
//	Content text on one line
//
//	[2] ...
//
// Numbers start at first. With no results: `No results for "QUERY".`
// The query, titles and texts are put on one line each.
func FormatResults(query string, results []Result, first int) string {
	query = strings.Join(strings.Fields(query), " ")
	if len(results) == 0 {
		return `No results for "` + query + `".`
	}
	var b strings.Builder
	n := 80 + len(query)
	for _, r := range results {
		n += len(r.Title) + len(r.URL) + len(r.Content) + 20
	}
	b.Grow(n)
	b.WriteString(`Search results for "`)
	b.WriteString(query)
	b.WriteString(`" (cite a result as a markdown link to its URL or as [n]):`)
	for i, r := range results {
		b.WriteString("\n\n[")
		b.WriteString(strconv.Itoa(first + i))
		b.WriteString("] ")
		if t := oneLine(r.Title); t != "" {
			b.WriteString(t)
		} else {
			b.WriteString(oneLine(r.URL))
		}
		b.WriteString("\nURL: ")
		b.WriteString(oneLine(r.URL))
		b.WriteByte('\n')
		if c := oneLine(r.Content); c != "" {
			b.WriteString(c)
		} else {
			b.WriteString(noText)
		}
	}
	return b.String()
}

// oneLine collapses line breaks (Service results have none; others may).
func oneLine(s string) string {
	if strings.IndexByte(s, '\n') >= 0 || strings.IndexByte(s, '\r') >= 0 {
		return strings.Join(strings.Fields(s), " ")
	}
	return s
}
