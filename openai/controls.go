package openai

// Control is a request control that some servers accept and then ignore:
// the client would get the opposite of what it asked, with a 200. The relay
// routes a request that needs one to a node whose flavour honours it, or
// serves it itself (relay/controls.go, relay/emulate.go); docs/streams.md
// lists ControlTable.
type Control uint8

const (
	ControlToolChoiceNone     Control = 1 << iota // tool_choice "none": no tool call
	ControlToolChoiceRequired                     // tool_choice "required": at least one tool call
	ControlToolChoiceNamed                        // tool_choice {"type":"function",...}: that function
	ControlN                                      // n > 1: n choices
)

// Controls lists every control, in the order the docs show them.
var Controls = []Control{ControlToolChoiceNone, ControlToolChoiceRequired, ControlToolChoiceNamed, ControlN}

// Name is the control as a client writes it.
func (c Control) Name() string {
	switch c {
	case ControlToolChoiceNone:
		return `tool_choice: "none"`
	case ControlToolChoiceRequired:
		return `tool_choice: "required"`
	case ControlToolChoiceNamed:
		return "tool_choice: {function}"
	case ControlN:
		return "n > 1"
	}
	return "?"
}

// Param is the request field that carries the control.
func (c Control) Param() string {
	if c == ControlN {
		return "n"
	}
	return "tool_choice"
}

// ControlRow is what one flavour's server does with the controls, and the
// evidence for it.
type ControlRow struct {
	Flavour  Flavour
	Honoured Control
	Source   string
}

// ControlTable is the one record of which controls each flavour's server
// honours. A control missing from a row is accepted and ignored by that
// server (checked against the captures in the real-servers set and the
// servers' own docs and issues).
var ControlTable = []ControlRow{
	{VLLM, ControlToolChoiceNone | ControlToolChoiceRequired | ControlToolChoiceNamed | ControlN,
		"vLLM docs (tool calling: named function and required through structured outputs, none)"},
	{SGLang, ControlToolChoiceNone | ControlToolChoiceRequired | ControlToolChoiceNamed | ControlN,
		"SGLang docs (tool calling: tool_choice required and named function)"},
	{LlamaCpp, ControlToolChoiceNone | ControlToolChoiceRequired | ControlN,
		"captures llamacpp/chat/20-22, 25; a named tool_choice object falls back to auto (llama.cpp issue 26535)"},
	{Ollama, 0,
		"captures ollama/chat/20-22, 25: none still calls the tool, n: 2 gives one choice (Ollama issue 8421)"},
	{OpenAI, ControlToolChoiceNone | ControlToolChoiceRequired | ControlToolChoiceNamed | ControlN,
		"the reference API"},
	{OpenRouter, ControlToolChoiceNone | ControlToolChoiceRequired | ControlToolChoiceNamed,
		"OpenRouter passes tool_choice to the provider; n is not in its request schema"},
}

// Honours reports whether f's server honours every control in c.
func (f Flavour) Honours(c Control) bool {
	for i := range ControlTable {
		if ControlTable[i].Flavour == f {
			return ControlTable[i].Honoured&c == c
		}
	}
	return false
}

// ToolChoice is the kind of tool_choice (or legacy function_call) a request gave.
type ToolChoice uint8

const (
	ToolChoiceAuto     ToolChoice = iota // absent, null or "auto"
	ToolChoiceNone                       // "none"
	ToolChoiceRequired                   // "required"
	ToolChoiceNamed                      // an object naming a function
)

// Controls is what the request asks that some servers ignore: a tool choice
// other than auto when it offers tools, and n > 1.
func (r *ChatRequest) Controls() Control {
	var c Control
	if r.hasTools {
		switch r.ToolChoice {
		case ToolChoiceNone:
			c |= ControlToolChoiceNone
		case ToolChoiceRequired:
			c |= ControlToolChoiceRequired
		case ToolChoiceNamed:
			c |= ControlToolChoiceNamed
		}
	}
	if r.N > 1 {
		c |= ControlN
	}
	return c
}

// toolChoiceOf reads a tool_choice or function_call value (already checked
// to be valid JSON).
func toolChoiceOf(v []byte) ToolChoice {
	switch string(v) {
	case `"none"`:
		return ToolChoiceNone
	case `"required"`:
		return ToolChoiceRequired
	}
	if len(v) > 0 && v[0] == '{' {
		return ToolChoiceNamed
	}
	return ToolChoiceAuto
}
