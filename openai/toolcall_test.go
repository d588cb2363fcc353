package openai

import (
	"encoding/json"
	"strings"
	"testing"
)

const twoTools = `"tools":[{"type":"function","function":{"name":"a","parameters":{"type":"object","properties":{"x":{"type":"string"}}}}},{"type":"function","function":{"name":"b","description":"B it"}}]`

// The schema of a tool call: one alternative per allowed function, its
// name as an enum and its parameters as the arguments' schema; a named
// choice keeps that function only; nothing to call is an error.
func TestToolCallSchema(t *testing.T) {
	parse := func(extra string) *ChatRequest {
		r, err := ParseChatRequest([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}],` + extra + `}`))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	s, err := parse(twoTools + `,"tool_choice":"required"`).ToolCallSchema()
	if err != nil {
		t.Fatal(err)
	}
	var any struct {
		AnyOf []struct {
			Properties struct {
				Name      struct{ Enum []string }
				Arguments map[string]any
			}
			Required    []string
			Description string
		}
	}
	if err := json.Unmarshal(s, &any); err != nil || len(any.AnyOf) != 2 {
		t.Fatalf("%v: %s", err, s)
	}
	if any.AnyOf[0].Properties.Name.Enum[0] != "a" || any.AnyOf[0].Properties.Arguments["type"] != "object" ||
		any.AnyOf[1].Properties.Name.Enum[0] != "b" || any.AnyOf[1].Description != "B it" ||
		strings.Join(any.AnyOf[0].Required, ",") != "name,arguments" {
		t.Errorf("schema %s", s)
	}
	s, err = parse(twoTools + `,"tool_choice":{"type":"function","function":{"name":"b"}}`).ToolCallSchema()
	if err != nil || strings.Contains(string(s), `"a"`) || !strings.Contains(string(s), `"enum":["b"]`) {
		t.Errorf("named b: %v %s", err, s)
	}
	s, err = parse(`"functions":[{"name":"f"}],"function_call":{"name":"f"}`).ToolCallSchema()
	if err != nil || !strings.Contains(string(s), `"enum":["f"]`) {
		t.Errorf("legacy functions: %v %s", err, s)
	}
	if _, err := parse(twoTools + `,"tool_choice":{"type":"function","function":{"name":"zz"}}`).ToolCallSchema(); err == nil {
		t.Error("a named function that is not among tools gave a schema")
	}
}

func TestToolCallFromContent(t *testing.T) {
	for _, c := range []struct {
		in, name, args string
		ok             bool
	}{
		{`{"name":"a","arguments":{ "x" : "y" }}`, "a", `{"x":"y"}`, true},
		{"{\n \"name\": \"a\", \"arguments\": \"{\\\"x\\\":1}\"}", "a", `{"x":1}`, true},
		{`{"name":"a","arguments":"not json"}`, "", "", false},
		{`{"arguments":{}}`, "", "", false},
		{`{"name":"a","argu`, "", "", false},
		{`Hello`, "", "", false},
	} {
		name, args, ok := ToolCallFromContent(c.in)
		if name != c.name || args != c.args || ok != c.ok {
			t.Errorf("%s: %q %q %v", c.in, name, args, ok)
		}
	}
}

// The upstream body of an emulated call: one choice, not streamed, the
// client's tools and response_format replaced by the call's schema and a
// first system message.
func TestUpstreamBodyForAnEmulatedCall(t *testing.T) {
	r, err := ParseChatRequest([]byte(`{"model":"m","stream":true,"stream_options":{"include_usage":false},"n":3,"messages":[{"role":"user","content":"x"}],` +
		twoTools + `,"tool_choice":"required","parallel_tool_calls":true,"response_format":{"type":"text"}}`))
	if err != nil {
		t.Fatal(err)
	}
	schema, _ := r.ToolCallSchema()
	out := r.AppendUpstreamBody(nil, UpstreamOptions{Model: "up", Flavour: Ollama, OneChoice: true, NonStream: true, ToolCall: schema})
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, k := range []string{"n", "stream", "stream_options", "tools", "tool_choice", "parallel_tool_calls"} {
		if _, ok := doc[k]; ok {
			t.Errorf("%s kept: %s", k, out)
		}
	}
	var rf struct {
		Type       string
		JSONSchema struct {
			Schema json.RawMessage
		} `json:"json_schema"`
	}
	if json.Unmarshal(doc["response_format"], &rf) != nil || rf.Type != "json_schema" || string(rf.JSONSchema.Schema) != string(schema) {
		t.Errorf("response_format %s", doc["response_format"])
	}
	var msgs []struct{ Role, Content string }
	if json.Unmarshal(doc["messages"], &msgs) != nil || len(msgs) != 2 || msgs[0].Role != "system" ||
		!strings.Contains(msgs[0].Content, string(schema)) || msgs[1].Content != "x" {
		t.Errorf("messages %s", doc["messages"])
	}
	if n := int64(len(msgs[0].Content)); n > ToolCallPromptBytes(schema) {
		t.Errorf("the system message (%d bytes) is over its bound %d", n, ToolCallPromptBytes(schema))
	}
}
