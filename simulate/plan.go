package simulate

import (
	"encoding/json"
	"sort"
	"strings"
)

// The answer text is made of whole tokens: every piece below is one token.
// Content is N-1 words and a final "."; reasoning is words from a second list.
var contentWords = [...]string{
	"the", "gateway", "answers", "every", "request", "with", "simulated", "text",
	"tokens", "flow", "through", "a", "quiet", "river", "of", "bytes",
	"model", "servers", "stream", "chunks", "and", "usage", "counts", "add",
	"up", "exactly", "while", "clients", "wait", "for", "done", "markers",
	"hello", "world", "simple", "words", "make", "tests", "stable", "again",
	"each", "piece", "is", "one", "token", "in", "this", "tiny",
	"vocabulary", "so", "lengths", "are", "easy", "to", "check", "by",
	"hand", "when", "golden", "files", "change", "nothing", "else", "moves",
}

var reasoningWords = [...]string{
	"hmm", "let", "me", "think", "about", "this", "carefully", "first",
	"the", "user", "wants", "a", "short", "answer", "so", "keep",
	"it", "brief", "and", "check", "the", "tools", "before", "replying",
	"okay", "that", "seems", "right", "now", "write", "it", "down",
}

// piece returns token k of a sequence seeded by seed; the first has no
// leading space.
func piece(words, spacedWords []string, seed uint64, k int) string {
	i := splitmix(seed+uint64(k)) % uint64(len(words))
	if k == 0 {
		return words[i]
	}
	return spacedWords[i]
}

// The word lists with a leading space, built once (read-only afterwards).
var (
	contentSpaced   = withSpace(contentWords[:])
	reasoningSpaced = withSpace(reasoningWords[:])
)

func withSpace(ws []string) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = " " + w
	}
	return out
}

func fnv(b []byte, h uint64) uint64 {
	if h == 0 {
		h = 14695981039346656037
	}
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}

// toolCall is one generated call.
type toolCall struct {
	id   string
	name string
	args string
}

// choicePlan is everything one choice will say.
type choicePlan struct {
	reasoning []string
	content   []string
	tools     []toolCall
	finish    string
	tokens    int // completion tokens of this choice (reasoning included)
	reasonTok int
}

// plan is the whole answer, decided before the first byte is written.
type plan struct {
	id      string
	created int64
	model   string
	prompt  int
	cached  int
	choices []choicePlan

	completion int
	reasoning  int

	stream       bool
	includeUsage bool
	// continuousUsage puts the running usage on chunks: vLLM (with
	// include_usage) on every chunk, SGLang on those with content or
	// reasoning; the other flavours ignore continuous_usage_stats.
	continuousUsage bool
	hideReason      bool // OpenAI: reasoning counted, text not returned
}

// toolTokens is the completion-token cost of a tool call: its arguments at
// 4 bytes a token plus one for the name.
func toolTokens(tc toolCall) int { return ceilDiv(len(tc.args), 4) + 1 }

// contentText joins the pieces.
func joinPieces(ps []string) string {
	switch len(ps) {
	case 0:
		return ""
	case 1:
		return ps[0]
	}
	n := 0
	for _, p := range ps {
		n += len(p)
	}
	var b strings.Builder
	b.Grow(n)
	for _, p := range ps {
		b.WriteString(p)
	}
	return b.String()
}

// applyStop cuts content at the first stop sequence. The piece holding the
// stop still counts as generated (as llama.cpp and Ollama report).
func applyStop(pieces []string, stops []string) ([]string, bool) {
	if len(stops) == 0 {
		return pieces, false
	}
	text := joinPieces(pieces)
	cut := -1
	for _, s := range stops {
		if i := strings.Index(text, s); i >= 0 && (cut < 0 || i < cut) {
			cut = i
		}
	}
	if cut < 0 {
		return pieces, false
	}
	out := make([]string, 0, len(pieces))
	pos := 0
	for _, p := range pieces {
		if pos+len(p) <= cut {
			out = append(out, p)
			pos += len(p)
			continue
		}
		if cut > pos {
			out = append(out, p[:cut-pos])
		} else {
			out = append(out, "") // counted, not shown
		}
		break
	}
	return out, true
}

// toolArgs builds deterministic arguments valid for simple JSON schemas:
// enums take their first value, strings "sim", integers 1, numbers 1.5,
// booleans true, arrays [], objects recurse over required properties (all
// properties when none are required), keys sorted.
func toolArgs(schema json.RawMessage) string {
	var s map[string]any
	if len(schema) == 0 || json.Unmarshal(schema, &s) != nil {
		return "{}"
	}
	var b []byte
	b = appendSchemaValue(b, s, 0)
	if len(b) == 0 || b[0] != '{' {
		return "{}"
	}
	return string(b)
}

func appendSchemaValue(b []byte, s map[string]any, depth int) []byte {
	if depth > 8 {
		return append(b, "null"...)
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		if alts, ok := s[k].([]any); ok && len(alts) > 0 {
			if first, ok := alts[0].(map[string]any); ok {
				return appendSchemaValue(b, first, depth+1)
			}
		}
	}
	if e, ok := s["enum"].([]any); ok && len(e) > 0 {
		v, _ := json.Marshal(e[0])
		return append(b, v...)
	}
	if c, ok := s["const"]; ok {
		v, _ := json.Marshal(c)
		return append(b, v...)
	}
	typ, _ := s["type"].(string)
	if ts, ok := s["type"].([]any); ok && len(ts) > 0 {
		typ, _ = ts[0].(string)
	}
	if typ == "" {
		if _, ok := s["properties"]; ok {
			typ = "object"
		}
	}
	switch typ {
	case "string":
		return append(b, `"sim"`...)
	case "integer":
		return append(b, '1')
	case "number":
		return append(b, "1.5"...)
	case "boolean":
		return append(b, "true"...)
	case "array":
		return append(b, "[]"...)
	case "null":
		return append(b, "null"...)
	case "object":
		props, _ := s["properties"].(map[string]any)
		var keys []string
		if req, ok := s["required"].([]any); ok && len(req) > 0 {
			for _, k := range req {
				if ks, ok := k.(string); ok {
					keys = append(keys, ks)
				}
			}
		} else {
			for k := range props {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			b = append(b, ':')
			sub, _ := props[k].(map[string]any)
			if sub == nil {
				b = append(b, `"sim"`...)
				continue
			}
			b = appendSchemaValue(b, sub, depth+1)
		}
		return append(b, '}')
	}
	return append(b, `"sim"`...)
}

// fragments splits s into streamed pieces of 1, 2, 3, 1, 2, 3... bytes,
// never splitting a UTF-8 sequence.
func fragments(s string) []string {
	var out []string
	size := 1
	for len(s) > 0 {
		n := size
		if n > len(s) {
			n = len(s)
		}
		for n < len(s) && s[n]&0xC0 == 0x80 {
			n++
		}
		out = append(out, s[:n])
		s = s[n:]
		size = size%3 + 1
	}
	return out
}

// echoText is the text an echoing model answers: the last user message's
// (raw, still-escaped JSON) text with its [sim ...] marker taken out and
// the ends trimmed, everything else as sent.
func echoText(raw []byte) string {
	s := jsonText(raw)
	if i := strings.Index(s, "[sim "); i >= 0 {
		if j := strings.IndexByte(s[i:], ']'); j >= 0 {
			s = s[:i] + s[i+j+1:]
		}
	}
	return strings.TrimSpace(s)
}
