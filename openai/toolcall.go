package openai

import (
	"bytes"
	"encoding/json"
	"errors"
)

// A tool choice a server ignores ("required", or a named function) is
// enforced through the server's structured output instead: the answer is
// constrained to a JSON object {"name": ..., "arguments": {...}} naming one
// of the allowed functions, with that function's parameters as the schema
// of its arguments, and then turned back into a tool call in the reference
// shape (relay/emulate.go).

// ToolCallSchema returns the JSON schema of a call of one of the functions
// the request allows: those of tools (or the legacy functions), or only the
// one tool_choice (or function_call) names. An error when there is none to
// call (no function, or the named one is not among them).
func (r *ChatRequest) ToolCallSchema() ([]byte, error) {
	type fn struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
	}
	var fns []fn
	if raw := r.Field("tools"); raw != nil {
		var tools []struct {
			Type     string `json:"type"`
			Function fn     `json:"function"`
		}
		if err := json.Unmarshal(raw, &tools); err != nil {
			return nil, err
		}
		for _, t := range tools {
			if t.Function.Name != "" && (t.Type == "function" || t.Type == "") {
				fns = append(fns, t.Function)
			}
		}
	} else if raw := r.Field("functions"); raw != nil {
		if err := json.Unmarshal(raw, &fns); err != nil {
			return nil, err
		}
	}
	if r.ToolChoice == ToolChoiceNamed {
		name := r.choiceName()
		var keep []fn
		for _, f := range fns {
			if f.Name == name {
				keep = append(keep, f)
			}
		}
		fns = keep
	}
	if len(fns) == 0 {
		return nil, errors.New("no function to call")
	}
	alts := make([]json.RawMessage, 0, len(fns))
	for _, f := range fns {
		params := f.Parameters
		if len(bytes.TrimSpace(params)) == 0 || string(params) == "null" {
			params = json.RawMessage(`{"type":"object"}`)
		}
		name, _ := json.Marshal([]string{f.Name})
		one := map[string]any{
			"type": "object",
			"properties": map[string]json.RawMessage{
				"name":      json.RawMessage(`{"type":"string","enum":` + string(name) + `}`),
				"arguments": params,
			},
			"required":             []string{"name", "arguments"},
			"additionalProperties": false,
		}
		if f.Description != "" {
			one["description"] = f.Description
		}
		b, err := json.Marshal(one)
		if err != nil {
			return nil, err
		}
		alts = append(alts, b)
	}
	if len(alts) == 1 {
		return alts[0], nil
	}
	return json.Marshal(map[string]any{"anyOf": alts})
}

// choiceName is the function tool_choice or function_call names.
func (r *ChatRequest) choiceName() string {
	var c struct {
		Name     string `json:"name"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	for _, k := range []string{"tool_choice", "function_call"} {
		if raw := r.Field(k); raw != nil && json.Unmarshal(raw, &c) == nil {
			if c.Function.Name != "" {
				return c.Function.Name
			}
			if c.Name != "" {
				return c.Name
			}
		}
	}
	return ""
}

const toolCallInstruction = "Answer with a call of a tool: only a JSON object with the tool's name and its arguments, valid against this JSON schema: "

// ToolCallPromptBytes bounds the bytes the system message asking for a
// call of schema adds to the prompt (its text, JSON-escaped, and framing),
// for the balance hold.
func ToolCallPromptBytes(schema []byte) int64 {
	return int64(len(toolCallInstruction) + 2*len(schema) + 64)
}

// appendToolSystemMessage appends the messages array msgs with a first
// system message asking for the call: the model then knows the tools even
// though they are not offered as tools.
func appendToolSystemMessage(dst, msgs, schema []byte) []byte {
	text := toolCallInstruction + string(schema)
	dst = append(dst, `[{"role":"system","content":`...)
	dst = AppendJSONString(dst, text)
	dst = append(dst, '}')
	rest := bytes.TrimSpace(msgs[1:])
	if len(rest) > 0 && rest[0] != ']' {
		dst = append(dst, ',')
	}
	return append(dst, rest...)
}

// ToolCallFromContent reads an answer constrained by ToolCallSchema: the
// function's name and its arguments as a JSON text. ok is false when the
// content is not such a call (cut short by the output cap, say).
func ToolCallFromContent(content string) (name, arguments string, ok bool) {
	var c struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if json.Unmarshal([]byte(content), &c) != nil || c.Name == "" || len(c.Arguments) == 0 {
		return "", "", false
	}
	args := c.Arguments
	if args[0] == '"' { // arguments given as a JSON text in a string
		var s string
		if json.Unmarshal(args, &s) != nil || !json.Valid([]byte(s)) {
			return "", "", false
		}
		return c.Name, s, true
	}
	var buf bytes.Buffer
	if json.Compact(&buf, args) != nil {
		return "", "", false
	}
	return c.Name, buf.String(), true
}
