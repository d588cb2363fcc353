package simulate

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strings"
	"testing"
)

const webSearchTool = `{"type":"function","function":{"name":"web_search","description":"Search the web.","parameters":{"type":"object","properties":{"query":{"type":"string"}},"required":["query"]}}}`

// searchFlavours are the flavours every web-search test runs on.
var searchFlavours = []Flavour{VLLM, LlamaCpp, Ollama, SGLang, OpenAI, OpenRouter}

// answerGot is one choice of an answer, streamed or not, put together.
type answerGot struct {
	content string
	deltas  []string // streamed content pieces
	calls   []callGot
	finish  string
	prompt  int
}

type callGot struct {
	id, name, args string
}

type msg map[string]any

func chatJSON(t *testing.T, stream bool, tools string, msgs ...msg) string {
	t.Helper()
	req := map[string]any{"model": "m", "messages": msgs}
	if tools != "" {
		req["tools"] = json.RawMessage(tools)
	}
	if stream {
		req["stream"] = true
		req["stream_options"] = map[string]any{"include_usage": true}
	}
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// ask sends body and puts the first choice together.
func ask(t *testing.T, base, body string, stream bool) answerGot {
	t.Helper()
	resp, err := post(t, context.Background(), base, body, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	type fn struct {
		Name      *string `json:"name"`
		Arguments *string `json:"arguments"`
	}
	type tc struct {
		Index    *int    `json:"index"`
		ID       *string `json:"id"`
		Function fn      `json:"function"`
	}
	type message struct {
		Content   *string `json:"content"`
		ToolCalls []tc    `json:"tool_calls"`
	}
	type chunk struct {
		Choices []struct {
			Message      message `json:"message"`
			Delta        message `json:"delta"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Usage *struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	var got answerGot
	add := func(m message) {
		if m.Content != nil && *m.Content != "" {
			got.content += *m.Content
			got.deltas = append(got.deltas, *m.Content)
		}
		for i, c := range m.ToolCalls {
			idx := i
			if c.Index != nil {
				idx = *c.Index
			}
			for len(got.calls) <= idx {
				got.calls = append(got.calls, callGot{})
			}
			if c.ID != nil && *c.ID != "" {
				got.calls[idx].id = *c.ID
			}
			if c.Function.Name != nil && *c.Function.Name != "" {
				got.calls[idx].name = *c.Function.Name
			}
			if c.Function.Arguments != nil {
				got.calls[idx].args += *c.Function.Arguments
			}
		}
	}
	eat := func(c chunk, streamed bool) {
		if c.Usage != nil {
			got.prompt = c.Usage.PromptTokens
		}
		if len(c.Choices) == 0 {
			return
		}
		ch := c.Choices[0]
		if streamed {
			add(ch.Delta)
		} else {
			add(ch.Message)
		}
		if ch.FinishReason != nil {
			got.finish = *ch.FinishReason
		}
	}
	if !stream {
		var c chunk
		if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
			t.Fatal(err)
		}
		eat(c, false)
		return got
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	done := false
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			done = true
			break
		}
		var c chunk
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("chunk %q: %v", line, err)
		}
		eat(c, true)
	}
	if !done {
		t.Fatal("stream without [DONE]")
	}
	return got
}

// queryOf decodes a web_search call's query.
func queryOf(t *testing.T, c callGot) string {
	t.Helper()
	var a struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal([]byte(c.args), &a); err != nil {
		t.Fatalf("arguments %q: %v", c.args, err)
	}
	return a.Query
}

// resultsText is the tool message tollgate writes for one search, numbers
// starting at first.
func resultsText(query string, first int, rs []searchResult) string {
	if len(rs) == 0 {
		return fmt.Sprintf("No results for %q.", query)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Search results for %q (cite a result as a markdown link to its URL or as [n]):\n", query)
	for i, r := range rs {
		fmt.Fprintf(&b, "\n[%d] %s\nURL: %s\n%s\n", first+i, r.title, r.url, r.content)
	}
	return b.String()
}

func searchCallMsg(calls ...callGot) msg {
	var tcs []any
	for _, c := range calls {
		tcs = append(tcs, map[string]any{"id": c.id, "type": "function", "function": map[string]any{"name": c.name, "arguments": c.args}})
	}
	return msg{"role": "assistant", "content": nil, "tool_calls": tcs}
}

func toolMsg(id, content string) msg {
	return msg{"role": "tool", "tool_call_id": id, "content": content}
}

func TestWebSearchCall(t *testing.T) {
	for _, f := range searchFlavours {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", f, stream), func(t *testing.T) {
				_, ts := newTS(t, Config{Flavour: f})
				q := "Où est le café? [sim searches=3 search_fault=slow]"
				got := ask(t, ts.URL, chatJSON(t, stream, "["+webSearchTool+"]", msg{"role": "user", "content": q}), stream)
				if got.finish != "tool_calls" || len(got.calls) != 3 || got.content != "" {
					t.Fatalf("got %+v", got)
				}
				want := []string{"Où est le café? simfault=slow", "Où est le café? 2 simfault=slow", "Où est le café? 3 simfault=slow"}
				for i, c := range got.calls {
					if c.name != "web_search" || c.id == "" || queryOf(t, c) != want[i] {
						t.Errorf("call %d: %+v, want query %q", i, c, want[i])
					}
				}
			})
		}
	}
}

func TestWebSearchHeaderSwitches(t *testing.T) {
	_, ts := newTS(t, Config{Flavour: LlamaCpp})
	resp, err := post(t, context.Background(), ts.URL, chatJSON(t, false, "["+webSearchTool+"]", msg{"role": "user", "content": "Kyoto"}),
		map[string]string{"X-Sim": "searches=2 search_fault=hang"})
	if err != nil {
		t.Fatal(err)
	}
	var a struct {
		Choices []struct {
			Message struct {
				ToolCalls []struct {
					Function struct{ Arguments string } `json:"function"`
				} `json:"tool_calls"`
			} `json:"message"`
		} `json:"choices"`
	}
	err = json.NewDecoder(resp.Body).Decode(&a)
	resp.Body.Close()
	if err != nil || len(a.Choices) != 1 || len(a.Choices[0].Message.ToolCalls) != 2 ||
		a.Choices[0].Message.ToolCalls[1].Function.Arguments != `{"query":"Kyoto 2 simfault=hang"}` {
		t.Errorf("%v %+v", err, a)
	}
}

// A follow-up question cites its own searches, not the earlier question's.
func TestWebSearchFollowUp(t *testing.T) {
	_, ts := newTS(t, Config{Flavour: VLLM})
	msgs, _ := conversation(t, ts.URL, "Lisbon food", false)
	first := ask(t, ts.URL, chatJSON(t, false, "["+webSearchTool+"]", msgs...), false)
	msgs = append(msgs, msg{"role": "assistant", "content": first.content})
	more, _ := conversation(t, ts.URL, "Porto wine", false)
	msgs = append(msgs, more...)
	got := ask(t, ts.URL, chatJSON(t, false, "["+webSearchTool+"]", msgs...), false)
	if !strings.Contains(got.content, searchResults("Porto wine", 0, 1)[0].url) || strings.Contains(got.content, searchResults("Lisbon food", 0, 1)[0].url) {
		t.Errorf("follow-up cites %q", got.content)
	}
}

func TestWebSearchOff(t *testing.T) {
	_, ts := newTS(t, Config{Flavour: VLLM})
	// search=0 answers directly, even though web_search is the only tool.
	got := ask(t, ts.URL, chatJSON(t, false, "["+webSearchTool+"]", msg{"role": "user", "content": "hi [sim search=0]"}), false)
	if got.finish != "stop" || len(got.calls) != 0 || got.content == "" {
		t.Errorf("search=0: %+v", got)
	}
	// tool_choice none: no search either.
	body := strings.Replace(chatJSON(t, false, "["+webSearchTool+"]", msg{"role": "user", "content": "hi"}), `"model"`, `"tool_choice":"none","model"`, 1)
	if got := ask(t, ts.URL, body, false); len(got.calls) != 0 {
		t.Errorf("tool_choice none: %+v", got)
	}
	// A bad switch value is refused.
	resp, err := post(t, context.Background(), ts.URL, chatJSON(t, false, "["+webSearchTool+"]", msg{"role": "user", "content": "hi [sim cite=footnote]"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("cite=footnote: status %d", resp.StatusCode)
	}
}

func TestWebSearchWithClientTools(t *testing.T) {
	for _, f := range []Flavour{VLLM, LlamaCpp, Ollama} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", f, stream), func(t *testing.T) {
				_, ts := newTS(t, Config{Flavour: f})
				tools := "[" + strings.Trim(weatherTools, "[]") + "," + webSearchTool + "]"
				got := ask(t, ts.URL, chatJSON(t, stream, tools, msg{"role": "user", "content": "Weather in Paris? [sim tools=2]"}), stream)
				if got.finish != "tool_calls" || len(got.calls) != 3 {
					t.Fatalf("got %+v", got)
				}
				if got.calls[0].name != "web_search" || queryOf(t, got.calls[0]) != "Weather in Paris?" {
					t.Errorf("first call %+v", got.calls[0])
				}
				for _, c := range got.calls[1:] {
					if c.name != "get_weather" || c.args != `{"city":"Paris","unit":"c"}` {
						t.Errorf("client call %+v", c)
					}
				}
				// Without tools=N only the search is called.
				got = ask(t, ts.URL, chatJSON(t, stream, tools, msg{"role": "user", "content": "Weather in Paris?"}), stream)
				if len(got.calls) != 1 || got.calls[0].name != "web_search" {
					t.Errorf("without tools=N: %+v", got.calls)
				}
			})
		}
	}
}

// conversation is a question, the model's search call and the provider's
// results fed back in tollgate's text format.
func conversation(t *testing.T, base, question string, stream bool) ([]msg, answerGot) {
	t.Helper()
	user := msg{"role": "user", "content": question}
	got := ask(t, base, chatJSON(t, stream, "["+webSearchTool+"]", user), stream)
	if len(got.calls) == 0 {
		t.Fatalf("no search call: %+v", got)
	}
	msgs := []msg{user, searchCallMsg(got.calls...)}
	n := 1
	for _, c := range got.calls {
		q := queryOf(t, c)
		rs := searchResults(q, 0, 5)
		msgs = append(msgs, toolMsg(c.id, resultsText(q, n, rs)))
		n += len(rs)
	}
	return msgs, got
}

func TestWebSearchMultiTurn(t *testing.T) {
	for _, f := range []Flavour{VLLM, LlamaCpp, Ollama} {
		t.Run(string(f), func(t *testing.T) {
			_, ts := newTS(t, Config{Flavour: f})
			msgs, first := conversation(t, ts.URL, "Tokyo trains [sim search_turns=2 searches=2]", false)
			// Second turn: searches again, queries continue the numbering.
			got := ask(t, ts.URL, chatJSON(t, false, "["+webSearchTool+"]", msgs...), false)
			if len(got.calls) != 2 || queryOf(t, got.calls[0]) != "Tokyo trains 3" || queryOf(t, got.calls[1]) != "Tokyo trains 4" {
				t.Fatalf("second turn: %+v", got)
			}
			if got.prompt <= first.prompt {
				t.Errorf("prompt tokens %d after results, %d before", got.prompt, first.prompt)
			}
			msgs = append(msgs, searchCallMsg(got.calls...))
			for _, c := range got.calls {
				msgs = append(msgs, toolMsg(c.id, resultsText(queryOf(t, c), 11, searchResults(queryOf(t, c), 0, 5))))
			}
			// Third turn: two search turns done, it answers.
			got = ask(t, ts.URL, chatJSON(t, false, "["+webSearchTool+"]", msgs...), false)
			if got.finish != "stop" || len(got.calls) != 0 || !strings.Contains(got.content, "https://") {
				t.Fatalf("third turn: %+v", got)
			}
			// Told that no more searches are allowed, it answers at once.
			msgs, _ = conversation(t, ts.URL, "Tokyo trains [sim search_turns=5]", false)
			last := msgs[len(msgs)-1]
			msgs = append(msgs[:len(msgs)-1], toolMsg(last["tool_call_id"].(string), "No more searches are allowed for this request. Answer now with the results you already have."))
			got = ask(t, ts.URL, chatJSON(t, false, "["+webSearchTool+"]", msgs...), false)
			if got.finish != "stop" || len(got.calls) != 0 || got.content == "" {
				t.Errorf("no more searches: %+v", got)
			}
			// tollgate stops offering web_search: the model answers, citing.
			msgs, _ = conversation(t, ts.URL, "Tokyo trains [sim search_turns=5]", false)
			got = ask(t, ts.URL, chatJSON(t, false, "", msgs...), false)
			if got.finish != "stop" || !strings.Contains(got.content, "https://") {
				t.Errorf("without the tool: %+v", got)
			}
		})
	}
}

func TestWebSearchCiteStyles(t *testing.T) {
	for _, f := range searchFlavours {
		_, ts := newTS(t, Config{Flavour: f})
		for _, style := range []string{"markdown", "url", "number", "all", "none"} {
			for _, stream := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/stream=%v", f, style, stream), func(t *testing.T) {
					msgs, _ := conversation(t, ts.URL, "résumé tips [sim searches=2 cite="+style+"]", stream)
					got := ask(t, ts.URL, chatJSON(t, stream, "["+webSearchTool+"]", msgs...), stream)
					if got.finish != "stop" || len(got.calls) != 0 {
						t.Fatalf("got %+v", got)
					}
					if !strings.HasPrefix(got.content, "Résumé 🌍 東京:") {
						t.Errorf("content %q", got.content)
					}
					r1 := searchResults("résumé tips", 0, 5)
					r2 := searchResults("résumé tips 2", 0, 5)
					md := func(r searchResult) string { return "[" + r.title + "](" + r.url + ")" }
					var want, notWant []string
					switch style {
					case "markdown":
						want = []string{md(r1[0]), md(r1[1]), md(r1[2])}
					case "url":
						want = []string{" " + r1[0].url + ")", " " + r1[1].url + ")"}
						notWant = []string{"](https://"}
					case "number":
						want = []string{" [1])", " [2])", " [3])"}
						notWant = []string{"https://"}
					case "all":
						// Six sources: results 1-5 of the first search, 6 of the second.
						want = []string{md(r1[0]), " " + r1[1].url + ")", " [3])", md(r1[3]), " " + r1[4].url + ")", " [6])"}
						notWant = []string{r2[1].url}
					case "none":
						notWant = []string{"https://", "[1]"}
					}
					for _, w := range want {
						if !strings.Contains(got.content, w) {
							t.Errorf("content lacks %q:\n%s", w, got.content)
						}
					}
					for _, w := range notWant {
						if strings.Contains(got.content, w) {
							t.Errorf("content has %q:\n%s", w, got.content)
						}
					}
					if strings.Contains(got.content, ForeignURL) {
						t.Error("foreign URL cited unasked")
					}
					if stream && style != "none" && style != "number" {
						// No delta holds a whole URL: real tokenizers split it.
						for _, d := range got.deltas {
							if strings.Contains(d, r1[0].url) || strings.Contains(d, r1[1].url) {
								t.Errorf("delta %q holds a whole URL", d)
							}
						}
					}
				})
			}
		}
	}
}

func TestWebSearchAnswerDeterministic(t *testing.T) {
	for _, f := range []Flavour{VLLM, LlamaCpp, Ollama} {
		_, ts := newTS(t, Config{Flavour: f})
		msgs, _ := conversation(t, ts.URL, "Lisbon food [sim cite=all cite_foreign=1]", false)
		plain := ask(t, ts.URL, chatJSON(t, false, "["+webSearchTool+"]", msgs...), false)
		again := ask(t, ts.URL, chatJSON(t, false, "["+webSearchTool+"]", msgs...), false)
		streamed := ask(t, ts.URL, chatJSON(t, true, "["+webSearchTool+"]", msgs...), true)
		if plain.content != again.content || plain.content != streamed.content {
			t.Errorf("%s: answers differ:\n%q\n%q\n%q", f, plain.content, again.content, streamed.content)
		}
		if !strings.Contains(plain.content, "[Elsewhere]("+ForeignURL+")") {
			t.Errorf("%s: no foreign citation: %q", f, plain.content)
		}
		if len(streamed.deltas) < 20 {
			t.Errorf("%s: %d deltas, want token by token", f, len(streamed.deltas))
		}
		// Code points and UTF-16 units differ from bytes.
		if len([]rune(plain.content)) == len(plain.content) {
			t.Errorf("%s: no multi-byte text", f)
		}
	}
}

func TestWebSearchNoResults(t *testing.T) {
	_, ts := newTS(t, Config{Flavour: Ollama})
	user := msg{"role": "user", "content": "noresults here [sim cite_foreign=1]"}
	got := ask(t, ts.URL, chatJSON(t, false, "["+webSearchTool+"]", user), false)
	if len(got.calls) != 1 {
		t.Fatalf("no call: %+v", got)
	}
	q := queryOf(t, got.calls[0])
	msgs := []msg{user, searchCallMsg(got.calls...), toolMsg(got.calls[0].id, resultsText(q, 1, searchResults(q, 0, 5)))}
	got = ask(t, ts.URL, chatJSON(t, false, "["+webSearchTool+"]", msgs...), false)
	if got.finish != "stop" || !strings.Contains(got.content, "nothing was found") || !strings.Contains(got.content, ForeignURL) {
		t.Errorf("got %+v", got)
	}
}

// TestWebSearchWithProvider runs the whole loop against the simulated
// provider: the model's query reaches it, its results go back in tollgate's
// format, and the answer cites URLs the provider gave.
func TestWebSearchWithProvider(t *testing.T) {
	search := startSearch(t, SearchConfig{Flavour: Brave})
	_, ts := newTS(t, Config{Flavour: LlamaCpp})
	user := msg{"role": "user", "content": "best ramen 東京 [sim searches=2]"}
	got := ask(t, ts.URL, chatJSON(t, true, "["+webSearchTool+"]", user), true)
	msgs := []msg{user, searchCallMsg(got.calls...)}
	n := 1
	var urls []string
	for _, c := range got.calls {
		q := queryOf(t, c)
		_, body, err := getSearch(context.Background(), search, q, url.Values{"count": {"3"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		var a braveAnswer
		if err := json.Unmarshal(body, &a); err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		fmt.Fprintf(&b, "Search results for %q (cite a result as a markdown link to its URL or as [n]):\n", q)
		for _, r := range a.Web.Results {
			fmt.Fprintf(&b, "\n[%d] %s\nURL: %s\n%s\n", n, r.Title, r.URL, r.Description)
			urls = append(urls, r.URL)
			n++
		}
		msgs = append(msgs, toolMsg(c.id, b.String()))
	}
	if err := search.WaitStats(waitLimit, func(st SearchStats) bool { return st.Completed == 2 }); err != nil {
		t.Fatal(err)
	}
	got = ask(t, ts.URL, chatJSON(t, true, "["+webSearchTool+"]", msgs...), true)
	cited := 0
	for _, u := range urls {
		if strings.Contains(got.content, u) {
			cited++
		}
	}
	if cited < 2 {
		t.Errorf("%d provider URLs cited in %q", cited, got.content)
	}
}
