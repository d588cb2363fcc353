package simulate

// Rendering of answers, non-streamed and streamed, in each flavour's shape.
// Key orders and field sets follow the captures in testdata/real (llama.cpp,
// Ollama) and the servers' sources and docs (see docs/simulator.md).

const llamaFingerprint = "b0-unknown"

// ---- usage ----

func (s *Server) appendUsage(b []byte, p *plan) []byte {
	total := p.prompt + p.completion
	switch s.flavour {
	case LlamaCpp:
		b = append(b, `{"completion_tokens":`...)
		b = appendInt(b, p.completion)
		b = append(b, `,"prompt_tokens":`...)
		b = appendInt(b, p.prompt)
		b = append(b, `,"total_tokens":`...)
		b = appendInt(b, total)
		b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
		b = appendInt(b, p.cached)
		return append(b, "}}"...)
	case Ollama:
		b = append(b, `{"prompt_tokens":`...)
		b = appendInt(b, p.prompt)
		b = append(b, `,"completion_tokens":`...)
		b = appendInt(b, p.completion)
		b = append(b, `,"total_tokens":`...)
		b = appendInt(b, total)
		return append(b, '}')
	case VLLM, SGLang:
		b = append(b, `{"prompt_tokens":`...)
		b = appendInt(b, p.prompt)
		b = append(b, `,"total_tokens":`...)
		b = appendInt(b, total)
		b = append(b, `,"completion_tokens":`...)
		b = appendInt(b, p.completion)
		b = append(b, `,"prompt_tokens_details":`...)
		if p.cached > 0 {
			b = append(b, `{"cached_tokens":`...)
			b = appendInt(b, p.cached)
			b = append(b, '}')
		} else {
			b = appendNull(b)
		}
		if s.flavour == SGLang {
			b = append(b, `,"reasoning_tokens":`...)
			b = appendInt(b, p.reasoning)
		}
		return append(b, '}')
	case OpenAI:
		b = append(b, `{"prompt_tokens":`...)
		b = appendInt(b, p.prompt)
		b = append(b, `,"completion_tokens":`...)
		b = appendInt(b, p.completion)
		b = append(b, `,"total_tokens":`...)
		b = appendInt(b, total)
		b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
		b = appendInt(b, p.cached)
		b = append(b, `,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":`...)
		b = appendInt(b, p.reasoning)
		return append(b, `,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}`...)
	default: // OpenRouter
		b = append(b, `{"prompt_tokens":`...)
		b = appendInt(b, p.prompt)
		b = append(b, `,"completion_tokens":`...)
		b = appendInt(b, p.completion)
		b = append(b, `,"total_tokens":`...)
		b = appendInt(b, total)
		b = append(b, `,"cost":`...)
		b = appendFloat(b, s.cost(p.prompt, p.completion))
		b = append(b, `,"is_byok":false,"prompt_tokens_details":{"cached_tokens":`...)
		b = appendInt(b, p.cached)
		b = append(b, `,"audio_tokens":0},"cost_details":{"upstream_inference_cost":null},"completion_tokens_details":{"reasoning_tokens":`...)
		b = appendInt(b, p.reasoning)
		return append(b, `,"image_tokens":0}}`...)
	}
}

// appendStreamUsage is the usage of a streamed answer: vLLM dumps its final
// usage chunk with exclude_none, so a null prompt_tokens_details is left out.
func (s *Server) appendStreamUsage(b []byte, p *plan) []byte {
	if s.flavour != VLLM || p.cached > 0 {
		return s.appendUsage(b, p)
	}
	b = append(b, `{"prompt_tokens":`...)
	b = appendInt(b, p.prompt)
	b = append(b, `,"total_tokens":`...)
	b = appendInt(b, p.prompt+p.completion)
	b = append(b, `,"completion_tokens":`...)
	b = appendInt(b, p.completion)
	return append(b, '}')
}

// appendRunningUsage closes a chunk's choices with the usage so far of
// stream_options.continuous_usage_stats: vLLM's UsageInfo(prompt,
// completion, total) dumped with exclude_unset; SGLang's
// calculate_token_usage dumped whole. The chunk's closing brace is the
// caller's.
func (s *Server) appendRunningUsage(b []byte, p *plan, completion int) []byte {
	b = append(b, `],"usage":{"prompt_tokens":`...)
	b = appendInt(b, p.prompt)
	b = append(b, `,"total_tokens":`...)
	b = appendInt(b, p.prompt+completion)
	b = append(b, `,"completion_tokens":`...)
	b = appendInt(b, completion)
	if s.flavour == SGLang {
		b = append(b, `,"prompt_tokens_details":null,"reasoning_tokens":0`...)
	}
	return append(b, '}')
}

// cost is OpenRouter's usage.cost in USD (a JSON number there).
func (s *Server) cost(prompt, completion int) float64 {
	return (float64(prompt)*s.cfg.PromptPrice + float64(completion)*s.cfg.CompletionPrice) / 1e6
}

// appendTimings is llama.cpp's per-answer speed report, derived from the
// configured delays so that it is deterministic.
func (s *Server) appendTimings(b []byte, p *plan, beh Behaviour) []byte {
	promptN := p.prompt - p.cached
	promptMS := float64(beh.TTFT.Microseconds()) / 1000
	if promptMS == 0 {
		promptMS = float64(promptN) * 0.125
	}
	predMS := float64(beh.TokenGap.Microseconds()) / 1000 * float64(p.completion)
	if predMS == 0 {
		predMS = float64(p.completion) * 0.5
	}
	b = append(b, `{"cache_n":`...)
	b = appendInt(b, p.cached)
	b = append(b, `,"prompt_n":`...)
	b = appendInt(b, promptN)
	b = append(b, `,"prompt_ms":`...)
	b = appendFloat(b, promptMS)
	b = append(b, `,"prompt_per_token_ms":`...)
	b = appendFloat(b, perToken(promptMS, promptN))
	b = append(b, `,"prompt_per_second":`...)
	b = appendFloat(b, perSecond(promptMS, promptN))
	b = append(b, `,"predicted_n":`...)
	b = appendInt(b, p.completion)
	b = append(b, `,"predicted_ms":`...)
	b = appendFloat(b, predMS)
	b = append(b, `,"predicted_per_token_ms":`...)
	b = appendFloat(b, perToken(predMS, p.completion))
	b = append(b, `,"predicted_per_second":`...)
	b = appendFloat(b, perSecond(predMS, p.completion))
	return append(b, '}')
}

func perToken(ms float64, n int) float64 {
	if n == 0 {
		return 0
	}
	return ms / float64(n)
}

func perSecond(ms float64, n int) float64 {
	if ms == 0 {
		return 0
	}
	return float64(n) * 1000 / ms
}

// ---- non-streamed ----

func (s *Server) appendToolCallsWhole(b []byte, tcs []toolCall) []byte {
	b = append(b, '[')
	for i, tc := range tcs {
		if i > 0 {
			b = append(b, ',')
		}
		switch s.flavour {
		case LlamaCpp:
			b = append(b, `{"type":"function","function":{"name":`...)
			b = appendJSONString(b, tc.name)
			b = append(b, `,"arguments":`...)
			b = appendJSONString(b, tc.args)
			b = append(b, `},"id":`...)
			b = appendJSONString(b, tc.id)
			b = append(b, '}')
		case Ollama:
			b = append(b, `{"id":`...)
			b = appendJSONString(b, tc.id)
			b = append(b, `,"index":`...)
			b = appendInt(b, i)
			b = append(b, `,"type":"function","function":{"name":`...)
			b = appendJSONString(b, tc.name)
			b = append(b, `,"arguments":`...)
			b = appendJSONString(b, tc.args)
			b = append(b, "}}"...)
		default:
			b = append(b, `{"id":`...)
			b = appendJSONString(b, tc.id)
			b = append(b, `,"type":"function","function":{"name":`...)
			b = appendJSONString(b, tc.name)
			b = append(b, `,"arguments":`...)
			b = appendJSONString(b, tc.args)
			b = append(b, "}}"...)
		}
	}
	return append(b, ']')
}

func (s *Server) appendMessage(b []byte, p *plan, c *choicePlan) []byte {
	hasReason := len(c.reasoning) > 0 && !p.hideReason
	hasTools := len(c.tools) > 0
	b = append(b, `{"role":"assistant","content":`...)
	switch s.flavour {
	case LlamaCpp, Ollama:
		b = appendPieces(b, c.content)
		if hasReason {
			b = append(b, ',', '"')
			b = append(b, s.reasoningKey...)
			b = append(b, '"', ':')
			b = appendPieces(b, c.reasoning)
		}
		if hasTools {
			b = append(b, `,"tool_calls":`...)
			b = s.appendToolCallsWhole(b, c.tools)
		}
		return append(b, '}')
	case VLLM:
		if hasTools && len(c.content) == 0 {
			b = appendNull(b)
		} else {
			b = appendPieces(b, c.content)
		}
		b = append(b, `,"refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":`...)
		if hasTools {
			b = s.appendToolCallsWhole(b, c.tools)
		} else {
			b = append(b, "[]"...)
		}
		b = append(b, ',', '"')
		b = append(b, s.reasoningKey...)
		b = append(b, '"', ':')
		if hasReason {
			b = appendPieces(b, c.reasoning)
		} else {
			b = appendNull(b)
		}
		return append(b, '}')
	case SGLang:
		if hasTools && len(c.content) == 0 {
			b = appendNull(b)
		} else {
			b = appendPieces(b, c.content)
		}
		b = append(b, ',', '"')
		b = append(b, s.reasoningKey...)
		b = append(b, '"', ':')
		if hasReason {
			b = appendPieces(b, c.reasoning)
		} else {
			b = appendNull(b)
		}
		b = append(b, `,"tool_calls":`...)
		if hasTools {
			b = s.appendToolCallsWhole(b, c.tools)
		} else {
			b = appendNull(b)
		}
		return append(b, '}')
	case OpenAI:
		if hasTools && len(c.content) == 0 {
			b = appendNull(b)
		} else {
			b = appendPieces(b, c.content)
		}
		b = append(b, `,"refusal":null,"annotations":[]`...)
		if hasTools {
			b = append(b, `,"tool_calls":`...)
			b = s.appendToolCallsWhole(b, c.tools)
		}
		return append(b, '}')
	default: // OpenRouter
		b = appendPieces(b, c.content)
		b = append(b, `,"refusal":null,"reasoning":`...)
		if hasReason {
			b = appendPieces(b, c.reasoning)
		} else {
			b = appendNull(b)
		}
		if hasTools {
			b = append(b, `,"tool_calls":`...)
			b = s.appendToolCallsWhole(b, c.tools)
		}
		return append(b, '}')
	}
}

func (s *Server) appendCompletion(b []byte, p *plan, beh Behaviour) []byte {
	withUsage := beh.Fault != FaultNoUsage
	choices := func(b []byte) []byte {
		b = append(b, '[')
		for i := range p.choices {
			c := &p.choices[i]
			if i > 0 {
				b = append(b, ',')
			}
			switch s.flavour {
			case LlamaCpp:
				b = append(b, `{"finish_reason":`...)
				b = appendJSONString(b, c.finish)
				b = append(b, `,"index":`...)
				b = appendInt(b, i)
				b = append(b, `,"message":`...)
				b = s.appendMessage(b, p, c)
				b = append(b, '}')
			case Ollama:
				b = append(b, `{"index":`...)
				b = appendInt(b, i)
				b = append(b, `,"message":`...)
				b = s.appendMessage(b, p, c)
				b = append(b, `,"finish_reason":`...)
				b = appendJSONString(b, c.finish)
				b = append(b, '}')
			case OpenRouter:
				b = append(b, `{"logprobs":null,"finish_reason":`...)
				b = appendJSONString(b, c.finish)
				b = append(b, `,"native_finish_reason":`...)
				b = appendJSONString(b, c.finish)
				b = append(b, `,"index":`...)
				b = appendInt(b, i)
				b = append(b, `,"message":`...)
				b = s.appendMessage(b, p, c)
				b = append(b, '}')
			default:
				b = append(b, `{"index":`...)
				b = appendInt(b, i)
				b = append(b, `,"message":`...)
				b = s.appendMessage(b, p, c)
				b = append(b, `,"logprobs":null,"finish_reason":`...)
				b = appendJSONString(b, c.finish)
				switch s.flavour {
				case VLLM:
					b = append(b, `,"stop_reason":null`...)
				case SGLang:
					b = append(b, `,"matched_stop":null`...)
				}
				b = append(b, '}')
			}
		}
		return append(b, ']')
	}
	switch s.flavour {
	case LlamaCpp:
		b = append(b, `{"choices":`...)
		b = choices(b)
		b = append(b, `,"created":`...)
		b = appendInt(b, int(p.created))
		b = append(b, `,"model":`...)
		b = appendJSONString(b, p.model)
		b = append(b, `,"system_fingerprint":"`+llamaFingerprint+`","object":"chat.completion"`...)
		if withUsage {
			b = append(b, `,"usage":`...)
			b = s.appendUsage(b, p)
		}
		b = append(b, `,"id":`...)
		b = appendJSONString(b, p.id)
		b = append(b, `,"timings":`...)
		b = s.appendTimings(b, p, beh)
		return append(b, '}')
	case OpenRouter:
		b = append(b, `{"id":`...)
		b = appendJSONString(b, p.id)
		b = append(b, `,"provider":"Simulated","model":`...)
		b = appendJSONString(b, p.model)
		b = append(b, `,"object":"chat.completion","created":`...)
		b = appendInt(b, int(p.created))
		b = append(b, `,"choices":`...)
		b = choices(b)
		if withUsage {
			b = append(b, `,"usage":`...)
			b = s.appendUsage(b, p)
		}
		return append(b, '}')
	}
	b = append(b, `{"id":`...)
	b = appendJSONString(b, p.id)
	b = append(b, `,"object":"chat.completion","created":`...)
	b = appendInt(b, int(p.created))
	b = append(b, `,"model":`...)
	b = appendJSONString(b, p.model)
	if s.flavour == Ollama {
		b = append(b, `,"system_fingerprint":"fp_ollama"`...)
	}
	b = append(b, `,"choices":`...)
	b = choices(b)
	switch s.flavour {
	case VLLM:
		b = append(b, `,"service_tier":null,"system_fingerprint":null`...)
	}
	if withUsage {
		b = append(b, `,"usage":`...)
		b = s.appendUsage(b, p)
	}
	switch s.flavour {
	case VLLM:
		b = append(b, `,"prompt_logprobs":null,"kv_transfer_params":null`...)
	case OpenAI:
		b = append(b, `,"service_tier":"default","system_fingerprint":"fp_simulated"`...)
	}
	return append(b, '}')
}

// ---- streamed ----

// stepKind is what one streamed delta carries.
type stepKind uint8

const (
	stepRole stepKind = iota
	stepReasoning
	stepContent
	stepToolStart // id, name and (llama.cpp) the first argument piece
	stepToolArgs
	stepToolWhole // Ollama: the whole call in one delta
	stepFinish
)

type step struct {
	kind  stepKind
	text  string // content, reasoning or argument piece
	tool  int    // index of the tool call
	token bool   // counts as a generated token (for gaps and fault_after)
}

// steps lays out the deltas of one choice in the flavour's order.
func (s *Server) steps(p *plan, c *choicePlan) []step {
	out := make([]step, 0, 2+len(c.reasoning)+len(c.content)+4*len(c.tools))
	switch s.flavour {
	case LlamaCpp, VLLM, SGLang, OpenAI:
		out = append(out, step{kind: stepRole})
	}
	if !p.hideReason {
		for _, r := range c.reasoning {
			out = append(out, step{kind: stepReasoning, text: r, token: true})
		}
	}
	for _, t := range c.content {
		if t == "" {
			continue
		}
		out = append(out, step{kind: stepContent, text: t, token: true})
	}
	for i, tc := range c.tools {
		if s.flavour == Ollama {
			out = append(out, step{kind: stepToolWhole, tool: i, token: true})
			continue
		}
		frags := fragments(tc.args)
		if s.flavour == LlamaCpp && len(frags) > 0 {
			out = append(out, step{kind: stepToolStart, tool: i, text: frags[0], token: true})
			frags = frags[1:]
		} else {
			out = append(out, step{kind: stepToolStart, tool: i, token: true})
		}
		for _, f := range frags {
			out = append(out, step{kind: stepToolArgs, tool: i, text: f, token: true})
		}
	}
	// vLLM sends finish_reason on the chunk of the last generated token;
	// the others send a separate chunk with an empty delta.
	if s.flavour == VLLM && len(out) > 1 {
		return out
	}
	return append(out, step{kind: stepFinish})
}

// appendChunkHead writes `data: {...` up to and including `"choices":[`.
func (s *Server) appendChunkHead(b []byte, p *plan) []byte {
	b = append(b, "data: "...)
	switch s.flavour {
	case LlamaCpp:
		return append(b, `{"choices":[`...)
	case OpenRouter:
		b = append(b, `{"id":`...)
		b = appendJSONString(b, p.id)
		b = append(b, `,"provider":"Simulated","model":`...)
		b = appendJSONString(b, p.model)
		b = append(b, `,"object":"chat.completion.chunk","created":`...)
		b = appendInt(b, int(p.created))
		return append(b, `,"choices":[`...)
	}
	b = append(b, `{"id":`...)
	b = appendJSONString(b, p.id)
	b = append(b, `,"object":"chat.completion.chunk","created":`...)
	b = appendInt(b, int(p.created))
	b = append(b, `,"model":`...)
	b = appendJSONString(b, p.model)
	switch s.flavour {
	case Ollama:
		b = append(b, `,"system_fingerprint":"fp_ollama"`...)
	case OpenAI:
		b = append(b, `,"service_tier":"default","system_fingerprint":"fp_simulated"`...)
	}
	return append(b, `,"choices":[`...)
}

// appendChunkTail closes the choices array and the chunk; usage and timings
// are added when given.
func (s *Server) appendChunkTail(b []byte, p *plan, usage, timings bool, beh Behaviour) []byte {
	b = append(b, ']')
	if s.flavour == LlamaCpp {
		b = append(b, `,"created":`...)
		b = appendInt(b, int(p.created))
		b = append(b, `,"id":`...)
		b = appendJSONString(b, p.id)
		b = append(b, `,"model":`...)
		b = appendJSONString(b, p.model)
		b = append(b, `,"system_fingerprint":"`+llamaFingerprint+`","object":"chat.completion.chunk"`...)
	}
	if usage {
		b = append(b, `,"usage":`...)
		b = s.appendStreamUsage(b, p)
	} else if (s.flavour == OpenAI && p.includeUsage) || s.flavour == SGLang {
		// OpenAI puts "usage": null on every chunk when usage was asked for;
		// SGLang dumps the field unconditionally.
		b = append(b, `,"usage":null`...)
	}
	if timings {
		b = append(b, `,"timings":`...)
		b = s.appendTimings(b, p, beh)
	}
	return append(b, "}\n\n"...)
}

// appendChoice writes one choice of a chunk holding delta d.
func (s *Server) appendChoice(b []byte, p *plan, c *choicePlan, idx int, st step, first, final bool) []byte {
	finish := ""
	if final {
		finish = c.finish
	}
	switch s.flavour {
	case LlamaCpp:
		b = append(b, `{"finish_reason":`...)
		b = appendStringOrNull(b, finish, finish == "")
		b = append(b, `,"index":`...)
		b = appendInt(b, idx)
		b = append(b, `,"delta":`...)
		b = s.appendDelta(b, c, st, first)
		return append(b, '}')
	case Ollama:
		b = append(b, `{"index":`...)
		b = appendInt(b, idx)
		b = append(b, `,"delta":`...)
		b = s.appendDelta(b, c, st, first)
		b = append(b, `,"finish_reason":`...)
		b = appendStringOrNull(b, finish, finish == "")
		return append(b, '}')
	case OpenRouter:
		b = append(b, `{"index":`...)
		b = appendInt(b, idx)
		b = append(b, `,"delta":`...)
		b = s.appendDelta(b, c, st, first)
		b = append(b, `,"finish_reason":`...)
		b = appendStringOrNull(b, finish, finish == "")
		b = append(b, `,"native_finish_reason":`...)
		b = appendStringOrNull(b, finish, finish == "")
		return append(b, `,"logprobs":null}`...)
	}
	b = append(b, `{"index":`...)
	b = appendInt(b, idx)
	b = append(b, `,"delta":`...)
	b = s.appendDelta(b, c, st, first)
	b = append(b, `,"logprobs":null,"finish_reason":`...)
	b = appendStringOrNull(b, finish, finish == "")
	switch {
	case s.flavour == VLLM && finish != "":
		b = append(b, `,"stop_reason":null`...)
	case s.flavour == SGLang:
		// SGLang dumps every field of the choice, matched_stop included.
		b = append(b, `,"matched_stop":null`...)
	}
	return append(b, '}')
}

// appendDelta writes the delta object of st. first is true for the first
// delta of a choice that has not carried the role yet (Ollama puts the role
// on its first delta; OpenRouter on every one).
func (s *Server) appendDelta(b []byte, c *choicePlan, st step, first bool) []byte {
	if s.flavour == SGLang {
		return s.appendDeltaSGLang(b, c, st)
	}
	role := (s.flavour == Ollama && first) || s.flavour == OpenRouter
	if st.kind == stepRole {
		switch s.flavour {
		case LlamaCpp:
			return append(b, `{"role":"assistant","content":null}`...)
		case OpenAI:
			return append(b, `{"role":"assistant","content":"","refusal":null}`...)
		default:
			return append(b, `{"role":"assistant","content":""}`...)
		}
	}
	if st.kind == stepFinish {
		if s.flavour == OpenRouter {
			return append(b, `{"role":"assistant","content":""}`...)
		}
		return append(b, "{}"...)
	}
	b = append(b, '{')
	if role {
		b = append(b, `"role":"assistant",`...)
	}
	switch st.kind {
	case stepContent:
		b = append(b, `"content":`...)
		b = appendJSONString(b, st.text)
	case stepReasoning:
		if role {
			b = append(b, `"content":"",`...)
		}
		b = append(b, '"')
		b = append(b, s.reasoningKey...)
		b = append(b, '"', ':')
		b = appendJSONString(b, st.text)
	case stepToolWhole:
		tc := c.tools[st.tool]
		b = append(b, `"content":"","tool_calls":[{"id":`...)
		b = appendJSONString(b, tc.id)
		b = append(b, `,"index":`...)
		b = appendInt(b, st.tool)
		b = append(b, `,"type":"function","function":{"name":`...)
		b = appendJSONString(b, tc.name)
		b = append(b, `,"arguments":`...)
		b = appendJSONString(b, tc.args)
		b = append(b, "}}]"...)
	case stepToolStart:
		tc := c.tools[st.tool]
		if role {
			b = append(b, `"content":"",`...)
		}
		if s.flavour == VLLM {
			// DeltaToolCall's field order, dumped with exclude_unset:
			// the name alone, arguments follow in later deltas.
			b = append(b, `"tool_calls":[{"id":`...)
			b = appendJSONString(b, tc.id)
			b = append(b, `,"type":"function","index":`...)
			b = appendInt(b, st.tool)
			b = append(b, `,"function":{"name":`...)
			b = appendJSONString(b, tc.name)
			return append(b, "}}]}"...)
		}
		b = append(b, `"tool_calls":[{"index":`...)
		b = appendInt(b, st.tool)
		b = append(b, `,"id":`...)
		b = appendJSONString(b, tc.id)
		b = append(b, `,"type":"function","function":{"name":`...)
		b = appendJSONString(b, tc.name)
		switch s.flavour {
		case LlamaCpp:
			b = append(b, `,"arguments":`...)
			b = appendJSONString(b, st.text)
		case VLLM:
			// vLLM's first tool delta carries the name only.
		default:
			b = append(b, `,"arguments":""`...)
		}
		b = append(b, "}}]"...)
	case stepToolArgs:
		if role {
			b = append(b, `"content":"",`...)
		}
		b = append(b, `"tool_calls":[{"index":`...)
		b = appendInt(b, st.tool)
		b = append(b, `,"function":{"arguments":`...)
		b = appendJSONString(b, st.text)
		b = append(b, "}}]"...)
	}
	return append(b, '}')
}

// appendDeltaSGLang writes SGLang's DeltaMessage: model_dump_json without
// exclusions, so role, content, reasoning_content and tool_calls are always
// there, null when unset; tool-call pieces after the first carry a null id
// and name (serving_chat.py _process_tool_call_stream).
func (s *Server) appendDeltaSGLang(b []byte, c *choicePlan, st step) []byte {
	b = append(b, `{"role":`...)
	if st.kind == stepRole {
		b = append(b, `"assistant","content":""`...)
	} else {
		b = append(b, `null,"content":`...)
		if st.kind == stepContent {
			b = appendJSONString(b, st.text)
		} else {
			b = appendNull(b)
		}
	}
	b = append(b, ',', '"')
	b = append(b, s.reasoningKey...)
	b = append(b, '"', ':')
	if st.kind == stepReasoning {
		b = appendJSONString(b, st.text)
	} else {
		b = appendNull(b)
	}
	b = append(b, `,"tool_calls":`...)
	switch st.kind {
	case stepToolStart:
		tc := c.tools[st.tool]
		b = append(b, `[{"id":`...)
		b = appendJSONString(b, tc.id)
		b = append(b, `,"index":`...)
		b = appendInt(b, st.tool)
		b = append(b, `,"type":"function","function":{"name":`...)
		b = appendJSONString(b, tc.name)
		b = append(b, `,"arguments":""}}]`...)
	case stepToolArgs:
		b = append(b, `[{"id":null,"index":`...)
		b = appendInt(b, st.tool)
		b = append(b, `,"type":"function","function":{"name":null,"arguments":`...)
		b = appendJSONString(b, st.text)
		b = append(b, "}}]"...)
	default:
		b = appendNull(b)
	}
	return append(b, '}')
}
