package openai

import (
	"strconv"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/jsonscan"
)

// Usage is the token count of one request as tollgate bills it and shows it.
type Usage struct {
	PromptTokens, CompletionTokens, TotalTokens int64
	CachedTokens                                *int64 // prompt_tokens_details.cached_tokens, nil when not reported
	ReasoningTokens                             *int64 // completion_tokens_details.reasoning_tokens, nil when not reported
	Estimated                                   bool   // counted locally, not reported by the backend
}

// AppendJSON appends the usage object as tollgate sends it:
//
//	{"prompt_tokens":P,"completion_tokens":C,"total_tokens":T,
//	 "prompt_tokens_details":{"cached_tokens":N},        (only when reported)
//	 "completion_tokens_details":{"reasoning_tokens":N}, (only when reported)
//	 "cost":"0.000123"}                                  (only when cost != nil)
//
// TotalTokens is written as given; Normalize makes it consistent.
func (u Usage) AppendJSON(dst []byte, cost *tollgate.Amount) []byte {
	dst = append(dst, `{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, u.PromptTokens, 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, u.CompletionTokens, 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, u.TotalTokens, 10)
	if u.CachedTokens != nil {
		dst = append(dst, `,"prompt_tokens_details":{"cached_tokens":`...)
		dst = strconv.AppendInt(dst, *u.CachedTokens, 10)
		dst = append(dst, '}')
	}
	if u.ReasoningTokens != nil {
		dst = append(dst, `,"completion_tokens_details":{"reasoning_tokens":`...)
		dst = strconv.AppendInt(dst, *u.ReasoningTokens, 10)
		dst = append(dst, '}')
	}
	if cost != nil {
		dst = append(dst, `,"cost":"`...)
		dst = append(dst, cost.String()...)
		dst = append(dst, '"')
	}
	return append(dst, '}')
}

// Normalize returns u with negative counts raised to 0 and TotalTokens set to
// PromptTokens+CompletionTokens when it is missing (0) or inconsistent.
func (u Usage) Normalize() Usage {
	if u.PromptTokens < 0 {
		u.PromptTokens = 0
	}
	if u.CompletionTokens < 0 {
		u.CompletionTokens = 0
	}
	if u.CachedTokens != nil && *u.CachedTokens < 0 {
		z := int64(0)
		u.CachedTokens = &z
	}
	if u.ReasoningTokens != nil && *u.ReasoningTokens < 0 {
		z := int64(0)
		u.ReasoningTokens = &z
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

// PieceTokens counts one streamed piece of text of l decoded bytes: a piece
// of up to 16 bytes is one token (servers stream one token per delta, and a
// BPE token is rarely longer), a longer one is several tokens sent together
// (Ollama sends a whole tool call in one delta) and counts ceil(l / 4).
func PieceTokens(l int64) int64 {
	switch {
	case l <= 0:
		return 0
	case l <= 16:
		return 1
	}
	return (l + 3) / 4
}

// EstimateTokensN counts the tokens of n bytes of text when the backend
// reported none: ceil(n/4), and at least 1 for non-empty text. Four bytes
// per token is the usual rule of thumb for English with BPE tokenisers; it
// over-counts code and under-counts CJK text slightly. The charge is then
// marked as estimated. It takes a byte count (what StreamNormalizer and
// Response accumulate), not the text itself.
func EstimateTokensN(n int64) int64 {
	if n <= 0 {
		return 0
	}
	return (n + 3) / 4
}

// parseUsage reads an upstream usage object. ok is false when raw is absent,
// null or not an object. Only integer counts are taken; OpenRouter's "cost"
// and "cost_details" and any other extra key are ignored. SGLang's top-level
// "reasoning_tokens" stands in for completion_tokens_details.reasoning_tokens.
func parseUsage(raw []byte) (u Usage, ok bool) {
	raw = jsonscan.TrimWS(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return Usage{}, false
	}
	var sawAny bool
	var topReasoning *int64
	err := jsonscan.EachTrustedField(raw, func(key, val []byte) error {
		switch string(key) {
		case "prompt_tokens":
			u.PromptTokens, _ = jsonInt(val)
			sawAny = true
		case "completion_tokens":
			u.CompletionTokens, _ = jsonInt(val)
			sawAny = true
		case "total_tokens":
			u.TotalTokens, _ = jsonInt(val)
		case "reasoning_tokens":
			if v, ok := jsonInt(val); ok {
				topReasoning = &v
			}
		case "prompt_tokens_details":
			if v, ok := detailInt(val, "cached_tokens"); ok {
				u.CachedTokens = &v
			}
		case "completion_tokens_details":
			if v, ok := detailInt(val, "reasoning_tokens"); ok {
				u.ReasoningTokens = &v
			}
		}
		return nil
	})
	if err != nil || !sawAny {
		return Usage{}, false
	}
	if u.ReasoningTokens == nil && topReasoning != nil {
		u.ReasoningTokens = topReasoning
	}
	return u.Normalize(), true
}

func detailInt(obj []byte, name string) (int64, bool) {
	obj = jsonscan.TrimWS(obj)
	if len(obj) == 0 || obj[0] != '{' {
		return 0, false
	}
	var v int64
	var found bool
	_ = jsonscan.EachTrustedField(obj, func(key, val []byte) error {
		if string(key) == name {
			v, found = jsonInt(val)
		}
		return nil
	})
	return v, found
}

// jsonInt reads a JSON number that holds an integer ("12", also "12.0" and
// "1e3" as some servers print counts as floats). null and other types: false.
func jsonInt(val []byte) (int64, bool) {
	val = jsonscan.TrimWS(val)
	if len(val) == 0 {
		return 0, false
	}
	if v, err := strconv.ParseInt(string(val), 10, 64); err == nil {
		return v, true
	}
	if c := val[0]; c == '-' || (c >= '0' && c <= '9') {
		if f, err := strconv.ParseFloat(string(val), 64); err == nil && f >= -9e18 && f <= 9e18 {
			return int64(f), true
		}
	}
	return 0, false
}

// ChoicesUsage corrects the usage of an answer from a server whose
// completion_tokens count the first choice only (llama.cpp: real-servers
// llamacpp/chat/25_n2, two choices of 4 tokens, 4 reported). The text of the
// other choices (delivered, over all choices, less deliveredFirst, choice
// 0's) is counted at the first one's tokens per byte, rounded up, and the
// usage is marked estimated; with no such text u is returned as it is.
// Without text in choice 0 there is no ratio: the others are counted at
// EstimateTokensN.
func ChoicesUsage(u Usage, delivered, deliveredFirst int64) Usage {
	others := delivered - deliveredFirst
	if others <= 0 {
		return u
	}
	if deliveredFirst > 0 && u.CompletionTokens > 0 {
		u.CompletionTokens += (u.CompletionTokens*others + deliveredFirst - 1) / deliveredFirst
	} else {
		u.CompletionTokens += EstimateTokensN(others)
	}
	u.Estimated = true
	return u.Normalize()
}
