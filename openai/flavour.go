// Package openai speaks the chat-completions wire protocol: it parses and
// rewrites client requests, reads and writes server-sent events, and
// normalises what each kind of upstream server sends into the one shape
// tollgate promises its clients.
package openai

// Flavour names the kind of upstream server. Each has its own quirks
// (reasoning field name, where usage goes in a stream, error bodies, ...).
type Flavour string

const (
	VLLM       Flavour = "vllm"
	SGLang     Flavour = "sglang"
	LlamaCpp   Flavour = "llamacpp"
	Ollama     Flavour = "ollama"
	OpenAI     Flavour = "openai"
	OpenRouter Flavour = "openrouter"
)

// Flavours lists every known flavour.
var Flavours = []Flavour{VLLM, SGLang, LlamaCpp, Ollama, OpenAI, OpenRouter}

// Valid reports whether f is a known flavour.
func (f Flavour) Valid() bool {
	for _, k := range Flavours {
		if k == f {
			return true
		}
	}
	return false
}
