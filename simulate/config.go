package simulate

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Flavour names the real model server the simulator imitates.
type Flavour string

const (
	VLLM       Flavour = "vllm"       // vLLM's OpenAI-compatible server
	SGLang     Flavour = "sglang"     // SGLang's OpenAI-compatible server
	LlamaCpp   Flavour = "llamacpp"   // llama.cpp's llama-server
	Ollama     Flavour = "ollama"     // Ollama's /v1 endpoints
	OpenAI     Flavour = "openai"     // the OpenAI API
	OpenRouter Flavour = "openrouter" // OpenRouter's API (served under /api/v1 and /v1)
)

// Flavours lists every flavour in documentation order.
func Flavours() []Flavour {
	return []Flavour{VLLM, SGLang, LlamaCpp, Ollama, OpenAI, OpenRouter}
}

// ParseFlavour accepts a flavour name ("llama.cpp" and "llama-cpp" too).
func ParseFlavour(s string) (Flavour, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "vllm":
		return VLLM, nil
	case "sglang":
		return SGLang, nil
	case "llamacpp", "llama.cpp", "llama-cpp", "llama-server":
		return LlamaCpp, nil
	case "ollama":
		return Ollama, nil
	case "openai":
		return OpenAI, nil
	case "openrouter":
		return OpenRouter, nil
	}
	return "", fmt.Errorf("unknown flavour %q (want one of vllm, sglang, llamacpp, ollama, openai, openrouter)", s)
}

// Fault is a failure the simulator can inject, per server or per request.
type Fault string

const (
	FaultNone          Fault = ""
	FaultRefuse        Fault = "refuse"         // per request: close the connection without answering; per running server see Running.RefuseConnections
	Fault500           Fault = "500"            // answer 500 with the flavour's internal-error body
	Fault503           Fault = "503"            // answer 503 with the flavour's overload body
	FaultHang          Fault = "hang"           // send nothing until the client gives up
	FaultStall         Fault = "stall"          // stream FaultAfter tokens, then go silent until the client gives up
	FaultCut           Fault = "cut"            // stream FaultAfter tokens, then close the connection (no terminator)
	FaultMalformed     Fault = "malformed"      // send a body (or, streamed, a chunk after FaultAfter tokens) that is not valid JSON
	FaultNoUsage       Fault = "no_usage"       // leave usage out, even when asked for
	FaultContextLength Fault = "context_length" // answer with the flavour's context-length error
	FaultStreamError   Fault = "stream_error"   // stream FaultAfter tokens, then the flavour's mid-stream error event
)

// Faults lists every fault name accepted by the switches.
func Faults() []Fault {
	return []Fault{FaultRefuse, Fault500, Fault503, FaultHang, FaultStall, FaultCut, FaultMalformed, FaultNoUsage, FaultContextLength, FaultStreamError}
}

// ParseFault accepts a fault name ("none" and "" mean no fault).
func ParseFault(s string) (Fault, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "" || s == "none" {
		return FaultNone, nil
	}
	for _, f := range Faults() {
		if string(f) == s {
			return f, nil
		}
	}
	switch s {
	case "overload":
		return Fault503, nil
	case "internal":
		return Fault500, nil
	case "context":
		return FaultContextLength, nil
	}
	return "", fmt.Errorf("unknown fault %q", s)
}

// Behaviour is how the simulated model answers. A server has one (Config.Behaviour,
// changeable with Server.SetBehaviour); each request can override fields with
// the X-Sim header or a [sim ...] marker in its last user message.
type Behaviour struct {
	TTFT     time.Duration // wait before the first byte of the answer
	TokenGap time.Duration // wait between streamed tokens

	OutputTokens    int  // content tokens of an answer (0: 16)
	ReasoningTokens int  // reasoning tokens when the model reasons (0: 8)
	AlwaysReason    bool // a thinking model: reasons even when not asked to
	NoToolCalls     bool // answer with text even when tools are offered
	// Echo answers with the last user message's text (its [sim ...] marker
	// taken out) instead of made-up words, one token per 1 to 3 bytes: for
	// a client that must show a model's output as text, whatever it holds.
	Echo         bool
	ToolCalls    int // tool calls made when tools are offered (0: 1)
	CachedTokens int // prompt tokens reported as cached (capped at the prompt)

	Fault      Fault // failure to inject
	FaultAfter int   // tokens streamed before stall, cut, malformed and stream_error (0: 2)

	// Web search, when the request offers a function named web_search.
	NoSearch    bool      // answer without searching
	Searches    int       // web_search calls per searching turn (0: 1)
	SearchTurns int       // turns that search before the answer (0: 1)
	SearchFault string    // appended to every query as " simfault=<value>" for the search provider
	Cite        CiteStyle // how the answer cites the results (default markdown)
	CiteForeign bool      // also cite a URL that is not among the results

	// UsageOnLastDelta puts streamed usage on the chunk that carries
	// finish_reason instead of a separate chunk with "choices": [] (a quirk of
	// some OpenAI-compatible servers).
	UsageOnLastDelta bool
}

// Config configures a simulated server. The zero value of every field but
// Flavour is a sensible default.
type Config struct {
	Flavour Flavour  // required
	Models  []string // served model names (default "sim-model")

	// ModelPath is what llama.cpp reports as `model` whatever was asked
	// (default "/models/<first model>.gguf").
	ModelPath string
	// ContextLength is the model's context window in tokens (default 8192).
	ContextLength int
	// ReasoningField overrides the flavour's field name for reasoning text:
	// "reasoning" or "reasoning_content" (vLLM before 0.10 used the latter).
	ReasoningField string

	// Capabilities switched off: the server rejects such requests the way
	// its real counterpart does.
	NoTools     bool
	NoReasoning bool
	NoImages    bool
	NoPDF       bool

	// Prices in USD per million tokens, used for OpenRouter's usage.cost
	// (defaults 1 and 2).
	PromptPrice     float64
	CompletionPrice float64

	// MaxRecorded bounds how many requests are kept for Requests()
	// (default 10000, oldest dropped first); negative disables recording.
	MaxRecorded int

	Behaviour Behaviour

	// GPU adds a GPU's timing and prefix cache (gpu.go); off when zero.
	GPU GPU
}

// override is a per-request change of Behaviour parsed from the switches.
type override struct {
	set bool
	b   Behaviour
	// which fields were given
	ttft, gap, tokens, reasoning, tools, cached, fault, after, usage, echo bool
	search, searches, searchTurns, searchFault, cite, citeForeign          bool
}

func (o *override) apply(b Behaviour) Behaviour {
	if !o.set {
		return b
	}
	if o.ttft {
		b.TTFT = o.b.TTFT
	}
	if o.gap {
		b.TokenGap = o.b.TokenGap
	}
	if o.tokens {
		b.OutputTokens = o.b.OutputTokens
	}
	if o.reasoning {
		b.ReasoningTokens = o.b.ReasoningTokens
		b.AlwaysReason = o.b.ReasoningTokens > 0
	}
	if o.tools {
		b.ToolCalls = o.b.ToolCalls
		b.NoToolCalls = o.b.ToolCalls <= 0
	}
	if o.cached {
		b.CachedTokens = o.b.CachedTokens
	}
	if o.fault {
		b.Fault = o.b.Fault
	}
	if o.after {
		b.FaultAfter = o.b.FaultAfter
	}
	if o.usage {
		b.UsageOnLastDelta = o.b.UsageOnLastDelta
	}
	if o.search {
		b.NoSearch = o.b.NoSearch
	}
	if o.searches {
		b.Searches = o.b.Searches
	}
	if o.searchTurns {
		b.SearchTurns = o.b.SearchTurns
	}
	if o.searchFault {
		b.SearchFault = o.b.SearchFault
	}
	if o.cite {
		b.Cite = o.b.Cite
	}
	if o.citeForeign {
		b.CiteForeign = o.b.CiteForeign
	}
	if o.echo {
		b.Echo = o.b.Echo
	}
	return b
}

// parseSwitches reads "key=value key=value" (spaces or commas between pairs)
// into o. Unknown keys and bad values are reported.
func (o *override) parseSwitches(s string) error {
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == ',' || r == ';' || r == '\t' }) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return fmt.Errorf("switch %q: want key=value", f)
		}
		if err := o.setSwitch(k, v); err != nil {
			return err
		}
	}
	return nil
}

func (o *override) setSwitch(k, v string) error {
	k = strings.ToLower(strings.TrimSpace(k))
	v = strings.TrimSpace(v)
	atoi := func() (int, error) {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("switch %s=%q: want a non-negative integer", k, v)
		}
		return n, nil
	}
	dur := func() (time.Duration, error) {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 {
			return time.Duration(n) * time.Millisecond, nil
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return 0, fmt.Errorf("switch %s=%q: want a duration such as 250ms", k, v)
		}
		return d, nil
	}
	var err error
	switch k {
	case "fault":
		o.b.Fault, err = ParseFault(v)
		o.fault = true
	case "tokens", "output", "output_tokens":
		o.b.OutputTokens, err = atoi()
		o.tokens = true
	case "reasoning", "reasoning_tokens":
		o.b.ReasoningTokens, err = atoi()
		o.reasoning = true
	case "tools", "tool_calls":
		o.b.ToolCalls, err = atoi()
		o.tools = true
	case "cached", "cached_tokens":
		o.b.CachedTokens, err = atoi()
		o.cached = true
	case "after", "fault_after":
		o.b.FaultAfter, err = atoi()
		o.after = true
	case "ttft":
		o.b.TTFT, err = dur()
		o.ttft = true
	case "gap", "token_gap":
		o.b.TokenGap, err = dur()
		o.gap = true
	case "search":
		var n int
		n, err = atoi()
		o.b.NoSearch = n == 0
		o.search = true
	case "searches":
		o.b.Searches, err = atoi()
		o.searches = true
	case "search_turns":
		o.b.SearchTurns, err = atoi()
		o.searchTurns = true
	case "search_fault":
		if v == "none" {
			v = ""
		}
		if _, perr := ParseSearchFault(v); perr != nil {
			return fmt.Errorf("switch search_fault=%q: %v", v, perr)
		}
		o.b.SearchFault = v
		o.searchFault = true
	case "cite":
		o.b.Cite, err = ParseCiteStyle(v)
		o.cite = true
	case "cite_foreign":
		var n int
		n, err = atoi()
		o.b.CiteForeign = n > 0
		o.citeForeign = true
	case "echo":
		var n int
		n, err = atoi()
		o.b.Echo = n > 0
		o.echo = true
	case "usage":
		switch v {
		case "last", "last_delta":
			o.b.UsageOnLastDelta = true
		case "separate", "chunk":
			o.b.UsageOnLastDelta = false
		default:
			return fmt.Errorf("switch usage=%q: want last or separate", v)
		}
		o.usage = true
	default:
		return fmt.Errorf("unknown switch %q", k)
	}
	if err != nil {
		return err
	}
	o.set = true
	return nil
}

// HeaderSwitches is the request header carrying per-request switches, e.g.
// "X-Sim: fault=stall after=5 gap=10ms". Single switches may also come as
// X-Sim-<Key> headers ("X-Sim-Fault: cut").
const HeaderSwitches = "X-Sim"

// fromHeaders fills o from the X-Sim and X-Sim-* headers.
func (o *override) fromHeaders(h http.Header) error {
	for k, vs := range h {
		if len(k) < len(HeaderSwitches) || !strings.EqualFold(k[:len(HeaderSwitches)], HeaderSwitches) {
			continue
		}
		rest := k[len(HeaderSwitches):]
		for _, v := range vs {
			if rest == "" {
				if err := o.parseSwitches(v); err != nil {
					return err
				}
				continue
			}
			if rest[0] != '-' {
				continue
			}
			if err := o.setSwitch(strings.ReplaceAll(rest[1:], "-", "_"), v); err != nil {
				return err
			}
		}
	}
	return nil
}

// fromMarker fills o from a "[sim key=value ...]" marker inside raw (the
// still-escaped JSON text of the last user message).
func (o *override) fromMarker(raw []byte) error {
	i := indexBytes(raw, "[sim ")
	if i < 0 {
		return nil
	}
	rest := raw[i+len("[sim "):]
	j := indexBytes(rest, "]")
	if j < 0 {
		return fmt.Errorf("marker [sim ...] without closing bracket")
	}
	return o.parseSwitches(string(rest[:j]))
}

func indexBytes(b []byte, s string) int {
	n := len(s)
	for i := 0; i+n <= len(b); i++ {
		if b[i] == s[0] && string(b[i:i+n]) == s {
			return i
		}
	}
	return -1
}
