package main

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate"
)

// chatAnswer is a chat answer as a client assembles it, streamed or not.
type chatAnswer struct {
	header  http.Header
	choices map[int]*answerChoice
	usage   struct {
		PromptTokens     int64  `json:"prompt_tokens"`
		CompletionTokens int64  `json:"completion_tokens"`
		TotalTokens      int64  `json:"total_tokens"`
		Cost             string `json:"cost"`
	}
	usageChunks int
}

type answerChoice struct {
	content   string
	finish    string
	toolCalls map[int]*struct{ id, name, args string }
}

// ask posts body (streamed when stream) and assembles the answer.
func (h *harness) ask(body string, stream bool) *chatAnswer {
	h.t.Helper()
	if stream {
		body = strings.Replace(body, "{", `{"stream":true,`, 1)
	}
	resp := h.openChat(body)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		var b strings.Builder
		_, _ = bufio.NewReader(resp.Body).WriteTo(&b)
		h.t.Fatalf("%s: status %d: %s", body, resp.StatusCode, b.String())
	}
	a := &chatAnswer{header: resp.Header, choices: map[int]*answerChoice{}}
	type call struct {
		Index    int    `json:"index"`
		ID       string `json:"id"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	}
	type msg struct {
		Content   *string `json:"content"`
		ToolCalls []call  `json:"tool_calls"`
	}
	type doc struct {
		Choices []struct {
			Index        *int    `json:"index"`
			FinishReason *string `json:"finish_reason"`
			Message      *msg    `json:"message"`
			Delta        *msg    `json:"delta"`
		} `json:"choices"`
		Usage json.RawMessage `json:"usage"`
	}
	add := func(d doc) {
		if len(d.Usage) > 0 && string(d.Usage) != "null" {
			a.usageChunks++
			if err := json.Unmarshal(d.Usage, &a.usage); err != nil {
				h.t.Fatal(err)
			}
		}
		for _, c := range d.Choices {
			if c.Index == nil {
				h.t.Fatalf("a choice without index")
			}
			ch := a.choices[*c.Index]
			if ch == nil {
				ch = &answerChoice{toolCalls: map[int]*struct{ id, name, args string }{}}
				a.choices[*c.Index] = ch
			}
			if c.FinishReason != nil {
				ch.finish = *c.FinishReason
			}
			m := c.Message
			if m == nil {
				m = c.Delta
			}
			if m == nil {
				continue
			}
			if m.Content != nil {
				ch.content += *m.Content
			}
			for k, tc := range m.ToolCalls {
				if stream {
					k = tc.Index
				}
				t := ch.toolCalls[k]
				if t == nil {
					t = &struct{ id, name, args string }{}
					ch.toolCalls[k] = t
				}
				t.id += tc.ID
				t.name += tc.Function.Name
				t.args += tc.Function.Arguments
			}
		}
	}
	if !stream {
		var d doc
		if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
			h.t.Fatal(err)
		}
		add(d)
		return a
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var d doc
		if err := json.Unmarshal([]byte(line), &d); err != nil {
			h.t.Fatalf("bad event %s: %v", line, err)
		}
		add(d)
	}
	return a
}

// n: 2 on a model served by Ollama (which ignores n, as the real one
// does): two choices, usage the sum of two calls, one charge of that
// usage, streamed and not.
func TestNServedWhereTheServerIgnoresIt(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	st := h.books()
	const ask = `{"model":"flav-ollama","messages":[{"role":"user","content":"Say hello. [sim tokens=5]"}]`
	one := h.ask(ask+`}`, false)
	if len(one.choices) != 1 {
		t.Fatalf("n: 1 gave %d choices", len(one.choices))
	}
	oneCost := tollgate.MustParseAmount(one.usage.Cost)
	ledgerEntry(t, st, one.header.Get("X-Request-Id")) // settled
	for _, stream := range []bool{false, true} {
		charges, sum := countCharges(t, st, h.acct.ID)
		a := h.ask(ask+`,"n":2}`, stream)
		if got := a.header.Get("X-Tollgate-Emulated"); got != "n" {
			t.Errorf("stream %v: X-Tollgate-Emulated %q", stream, got)
		}
		if len(a.choices) != 2 || a.choices[0] == nil || a.choices[1] == nil {
			t.Fatalf("stream %v: choices %v, want indexes 0 and 1", stream, a.choices)
		}
		for i, c := range a.choices {
			if c.content == "" || c.finish != "stop" {
				t.Errorf("stream %v: choice %d: %+v", stream, i, c)
			}
		}
		if a.usage.PromptTokens != 2*one.usage.PromptTokens || a.usage.CompletionTokens != 2*one.usage.CompletionTokens ||
			a.usage.TotalTokens != 2*one.usage.TotalTokens {
			t.Errorf("stream %v: usage %+v, want twice %+v", stream, a.usage, one.usage)
		}
		if stream && a.usageChunks != 1 {
			t.Errorf("%d usage chunks", a.usageChunks)
		}
		cost := tollgate.MustParseAmount(a.usage.Cost)
		if want, _ := oneCost.Add(oneCost); cost != want {
			t.Errorf("stream %v: cost %s, want twice %s", stream, cost, oneCost)
		}
		if e := ledgerEntry(t, st, a.header.Get("X-Request-Id")); -e.Amount != cost {
			t.Errorf("stream %v: charged %s, want %s", stream, -e.Amount, cost)
		}
		charges2, sum2 := countCharges(t, st, h.acct.ID)
		if charges2-charges != 1 || sum2-sum != cost {
			t.Errorf("stream %v: %d charges of %s, want one of %s", stream, charges2-charges, sum2-sum, cost)
		}
	}
}

// tool_choice "required" and a named function on servers that ignore them
// (Ollama; a named function on llama.cpp) return a tool call with valid
// JSON arguments, streamed and not; "none" returns none.
func TestToolChoiceEnforcedWhereTheServerIgnoresIt(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	const tools = `"tools":[{"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"zone":{"type":"string"}},"required":["zone"]}}},` +
		`{"type":"function","function":{"name":"get_weather","description":"Get the weather for a city","parameters":{"type":"object","properties":{"city":{"type":"string","enum":["Paris","Oslo"]},"unit":{"type":"string","enum":["c","f"]}},"required":["city","unit"],"additionalProperties":false}}}]`
	for _, c := range []struct{ model, choice, want string }{
		{"flav-ollama", `"required"`, ""},
		{"flav-ollama", `{"type":"function","function":{"name":"get_weather"}}`, "get_weather"},
		{"flav-llamacpp", `{"type":"function","function":{"name":"get_weather"}}`, "get_weather"},
	} {
		for _, stream := range []bool{false, true} {
			a := h.ask(`{"model":"`+c.model+`","messages":[{"role":"user","content":"Weather in Paris?"}],`+tools+`,"tool_choice":`+c.choice+`}`, stream)
			if len(a.choices) != 1 || a.choices[0] == nil {
				t.Fatalf("%s %s stream %v: choices %v", c.model, c.choice, stream, a.choices)
			}
			ch := a.choices[0]
			tc := ch.toolCalls[0]
			if ch.finish != "tool_calls" || len(ch.toolCalls) != 1 || tc == nil || tc.id == "" {
				t.Fatalf("%s %s stream %v: not a tool call: %+v", c.model, c.choice, stream, ch)
			}
			var args map[string]any
			if err := json.Unmarshal([]byte(tc.args), &args); err != nil {
				t.Errorf("%s %s stream %v: arguments %q: %v", c.model, c.choice, stream, tc.args, err)
			}
			if (c.want != "" && tc.name != c.want) || (tc.name != "get_weather" && tc.name != "get_time") {
				t.Errorf("%s %s stream %v: called %q", c.model, c.choice, stream, tc.name)
			}
			if tc.name == "get_weather" && (args["city"] != "Paris" && args["city"] != "Oslo") {
				t.Errorf("arguments %s do not follow the function's parameters", tc.args)
			}
			if got := a.header.Get("X-Tollgate-Emulated"); got != "tool_choice" {
				t.Errorf("%s %s: X-Tollgate-Emulated %q", c.model, c.choice, got)
			}
		}
	}
	a := h.ask(`{"model":"flav-ollama","messages":[{"role":"user","content":"Weather in Paris?"}],`+tools+`,"tool_choice":"none"}`, false)
	if ch := a.choices[0]; ch == nil || len(ch.toolCalls) != 0 || ch.finish == "tool_calls" {
		t.Errorf("tool_choice none: %+v", a.choices)
	}
}

// n: 2 with web search: one search loop, one choice, and the response says
// n was not enforced; the backend is not asked for choices no one sees.
func TestNWithWebSearchIsOneChoice(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, stream := range []bool{false, true} {
		a := h.ask(`{"model":"tg-chat","n":2,"web_search_options":{},"messages":[{"role":"user","content":"latest news"}]}`, stream)
		if len(a.choices) != 1 || a.choices[0] == nil || a.choices[0].content == "" {
			t.Fatalf("stream %v: choices %+v", stream, a.choices)
		}
		if got := a.header.Get("X-Tollgate-Not-Enforced"); got != "n" {
			t.Errorf("stream %v: X-Tollgate-Not-Enforced %q", stream, got)
		}
	}
	calls := 0
	for _, sim := range h.sims {
		for _, r := range sim.Requests() {
			if strings.Contains(string(r.Body), "latest news") {
				calls++
				if strings.Contains(string(r.Body), `"n":`) {
					t.Errorf("a search turn asked the backend for n choices: %s", r.Body)
				}
			}
		}
	}
	if calls == 0 {
		t.Fatal("no backend call seen")
	}
}
