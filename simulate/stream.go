package simulate

import (
	"net/http"
	"time"
)

// openRouterComment is OpenRouter's keep-alive while a model is working.
const openRouterComment = ": OPENROUTER PROCESSING\n\n"

func (s *Server) streamHeaders(w http.ResponseWriter, p *plan) {
	h := w.Header()
	switch s.flavour {
	case LlamaCpp:
		h.Set("Server", "llama.cpp")
		h.Set("X-Accel-Buffering", "no")
		h.Set("Content-Type", "text/event-stream")
	case Ollama:
		h.Set("Content-Type", "text/event-stream")
	case OpenRouter:
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Generation-Id", p.id)
	default:
		h.Set("Content-Type", "text/event-stream; charset=utf-8")
	}
	w.WriteHeader(http.StatusOK)
}

// stream writes a streamed answer; false when the client went away first.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, p *plan, beh Behaviour) bool {
	ctx := r.Context()
	rc := http.NewResponseController(w)
	flush := func(b []byte) ([]byte, bool) {
		if len(b) > 0 {
			if _, err := w.Write(b); err != nil {
				return b[:0], false
			}
		}
		return b[:0], rc.Flush() == nil
	}

	bp := s.bufs.Get().(*[]byte)
	b := (*bp)[:0]
	defer func() {
		*bp = b[:0]
		s.bufs.Put(bp)
	}()

	if s.flavour == OpenRouter {
		// OpenRouter answers at once and keeps the connection busy with
		// comments while the model has not produced its first token.
		s.streamHeaders(w, p)
		b = append(b, openRouterComment...)
		var ok bool
		if b, ok = flush(b); !ok {
			return false
		}
		for left := beh.TTFT; left > 0; left -= 500 * time.Millisecond {
			if !sleep(ctx, min(left, 500*time.Millisecond)) {
				return false
			}
			if left > 500*time.Millisecond {
				b = append(b, openRouterComment...)
				if b, ok = flush(b); !ok {
					return false
				}
			}
		}
	} else {
		if !sleep(ctx, beh.TTFT) {
			return false
		}
		s.streamHeaders(w, p)
	}
	s.openStreams.Add(1)
	s.notify()
	defer func() {
		s.openStreams.Add(-1)
		s.notify()
	}()

	usage := p.includeUsage && beh.Fault != FaultNoUsage
	midFault := beh.Fault == FaultStall || beh.Fault == FaultCut || beh.Fault == FaultMalformed || beh.Fault == FaultStreamError
	after := beh.FaultAfter
	if after <= 0 {
		after = 2
	}

	steps := make([][]step, len(p.choices))
	first := make([]bool, len(p.choices))
	maxLen := 0
	for i := range p.choices {
		steps[i] = s.steps(p, &p.choices[i])
		first[i] = true
		maxLen = max(maxLen, len(steps[i]))
	}
	last := len(p.choices) - 1
	sent := 0 // tokens of choice 0 written
	// generated[i] is choice i's completion tokens so far, for continuous usage.
	var generated []int
	if p.continuousUsage {
		generated = make([]int, len(p.choices))
	}
	var ok bool
	for k := 0; k < maxLen; k++ {
		for i := range p.choices {
			if k >= len(steps[i]) {
				continue
			}
			st := steps[i][k]
			final := k == len(steps[i])-1
			if st.token && sent > 0 && beh.TokenGap > 0 && i == 0 {
				if b, ok = flush(b); !ok {
					return false
				}
				if !sleep(ctx, beh.TokenGap) {
					return false
				}
			}
			if i == 0 && midFault && ((st.token && sent >= after) || final) {
				if b, ok = flush(b); !ok {
					return false
				}
				switch beh.Fault {
				case FaultStall:
					<-ctx.Done()
					return false
				case FaultCut:
					abort(w)
					return true
				case FaultStreamError:
					partial := *p
					partial.completion = sent
					partial.reasoning = min(p.reasoning, sent)
					b = s.appendStreamError(b, &partial)
					_, ok = flush(b)
					b = b[:0]
					return ok
				case FaultMalformed:
					b = append(b, `data: {"id":`...)
					b = appendJSONString(b, p.id)
					b = append(b, `,"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"trunc`...)
					b = append(b, "\n\n"...)
					midFault = false
				}
			}
			if st.token && i == 0 {
				sent++
			}
			withUsage := usage && beh.UsageOnLastDelta && final && i == last
			withTimings := s.flavour == LlamaCpp && final && i == last && !usage
			b = s.appendChunkHead(b, p)
			b = s.appendChoice(b, p, &p.choices[i], i, st, first[i], final)
			if generated != nil && !withUsage {
				if st.token {
					generated[i] = min(generated[i]+1, p.choices[i].tokens)
				}
				if final {
					generated[i] = p.choices[i].tokens
				}
				if s.flavour == VLLM || st.kind == stepContent || st.kind == stepReasoning {
					b = s.appendRunningUsage(b, p, generated[i])
					b = append(b, "}\n\n"...)
					first[i] = false
					continue
				}
			}
			b = s.appendChunkTail(b, p, withUsage, withTimings, beh)
			first[i] = false
		}
		if len(b) > 32<<10 {
			if b, ok = flush(b); !ok {
				return false
			}
		}
	}
	if usage && !beh.UsageOnLastDelta {
		b = s.appendChunkHead(b, p)
		b = s.appendChunkTail(b, p, true, s.flavour == LlamaCpp, beh)
	}
	b = append(b, "data: [DONE]\n\n"...)
	b, ok = flush(b)
	return ok && ctx.Err() == nil
}
