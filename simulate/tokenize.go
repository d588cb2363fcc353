package simulate

import (
	"encoding/binary"
	"net/http"

	"github.com/tollgate/tollgate/internal/jsonscan"
)

// tokenize serves vLLM's POST /tokenize (at the root) and SGLang's
// /tokenize and /v1/tokenize with the simulator's tokenizer: 4 bytes a
// token, little-endian. vLLM's chat form ({"messages", "tools", …}) reads
// the tools array then the messages array as sent, as the prefix cache
// does (its BlockStored events carry the same ids), and answers {"count",
// "max_model_len", "tokens", "token_strs": null}; its text form {"prompt"}
// reads the prompt's bytes. SGLang has the text form only ({"prompt": a
// string or a list of them}, answered {"tokens", "count",
// "max_model_len"}): a chat body is a missing-field error. The server's
// refuse, hang, 500 and 503 faults apply as to chat requests.
func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		s.record(r, nil, false)
		s.methodNotAllowed(w, r)
		return
	}
	bp := s.bufs.Get().(*[]byte)
	defer func() {
		if cap(*bp) <= 1<<20 {
			s.bufs.Put(bp)
		}
	}()
	body, err := readAll(r.Body, (*bp)[:0])
	*bp = body
	s.record(r, body, false)
	if err != nil {
		return
	}
	if answered, _ := s.earlyFault(w, r, s.Behaviour().Fault); answered {
		return
	}
	req, perr := parseChat(body)
	var prompts [][]byte
	listed := false
	if perr == nil {
		prompts, listed, perr = tokenizePrompts(body)
	}
	if perr != nil {
		s.parseError(w, body, perr)
		return
	}
	switch {
	case s.flavour == VLLM && req.hasModel && !s.models[req.model]:
		s.writeError(w, &apiError{kind: errUnknownModel, message: req.model, param: "model"})
		return
	case prompts == nil && (s.flavour == SGLang || !req.hasMessages):
		msg := "[{'type': 'missing', 'loc': ('body', 'prompt'), 'msg': 'Field required'}]"
		if s.flavour == VLLM {
			msg = "[{'type': 'missing', 'loc': ('body', 'TokenizeCompletionRequest', 'prompt'), 'msg': 'Field required'}, " +
				"{'type': 'missing', 'loc': ('body', 'TokenizeChatRequest', 'messages'), 'msg': 'Field required'}]"
		}
		s.writeError(w, &apiError{kind: errInvalid, message: msg})
		return
	}
	var b []byte
	if prompts == nil { // vLLM's chat form
		ids := bytesTokenIDs(req.prompt())
		b = appendTokenizeAnswer(make([]byte, 0, 64+11*len(ids)), ids, s.cfg.ContextLength, true)
	} else if !listed {
		b = appendTokenizeAnswer(b, bytesTokenIDs(prompts[0]), s.cfg.ContextLength, s.flavour == VLLM)
	} else { // SGLang's list form: a list of ids and a list of counts
		b = append(b, `{"tokens":[`...)
		for i, p := range prompts {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendIDs(b, bytesTokenIDs(p))
		}
		b = append(b, `],"count":[`...)
		for i, p := range prompts {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendInt(b, len(p)/4)
		}
		b = append(b, `],"max_model_len":`...)
		b = appendInt(b, s.cfg.ContextLength)
		b = append(b, '}')
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

// tokenizePath reports whether path is the flavour's tokenize endpoint.
func (s *Server) tokenizePath(path string) bool {
	switch s.flavour {
	case VLLM:
		return path == "/tokenize"
	case SGLang:
		return path == "/tokenize" || path == "/v1/tokenize"
	}
	return false
}

// tokenizePrompts reads the text form's prompt: nil when absent; listed
// when it is a list of strings (which only SGLang takes).
func tokenizePrompts(body []byte) (prompts [][]byte, listed bool, err error) {
	i := jsonscan.SkipWS(body, 0)
	_, err = jsonscan.EachMember(body, i, func(key []byte, vs int) (int, error) {
		if string(key) != "prompt" {
			return jsonscan.SkipValue(body, vs, 1)
		}
		next, err := jsonscan.SkipValue(body, vs, 1)
		if err != nil {
			return next, err
		}
		switch body[vs] {
		case '"':
			prompts = [][]byte{[]byte(jsonText(body[vs+1 : next-1]))}
			return next, nil
		case '[':
			listed = true
			prompts = [][]byte{}
			_, err := jsonscan.EachElement(body, vs, func(es int) (int, error) {
				end, err := jsonscan.SkipValue(body, es, 1)
				if err == nil && body[es] != '"' {
					return end, &fieldError{"prompt", "prompt must be a string or a list of strings"}
				}
				if err == nil {
					prompts = append(prompts, []byte(jsonText(body[es+1:end-1])))
				}
				return end, err
			})
			return next, err
		}
		return next, &fieldError{"prompt", "prompt must be a string or a list of strings"}
	})
	return prompts, listed, err
}

// bytesTokenIDs is the simulator's tokenizer: 4 bytes a token.
func bytesTokenIDs(p []byte) []uint32 {
	out := make([]uint32, 0, len(p)/4)
	for i := 0; i+4 <= len(p); i += 4 {
		out = append(out, binary.LittleEndian.Uint32(p[i:]))
	}
	return out
}

func appendIDs(b []byte, ids []uint32) []byte {
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendInt(b, int(id))
	}
	return append(b, ']')
}

// appendTokenizeAnswer writes vLLM's answer (count, max_model_len, tokens,
// token_strs) or SGLang's (tokens, count, max_model_len).
func appendTokenizeAnswer(b []byte, ids []uint32, maxLen int, vllm bool) []byte {
	if !vllm {
		b = append(b, `{"tokens":`...)
		b = appendIDs(b, ids)
		b = append(b, `,"count":`...)
		b = appendInt(b, len(ids))
		b = append(b, `,"max_model_len":`...)
		b = appendInt(b, maxLen)
		return append(b, '}')
	}
	b = append(b, `{"count":`...)
	b = appendInt(b, len(ids))
	b = append(b, `,"max_model_len":`...)
	b = appendInt(b, maxLen)
	b = append(b, `,"tokens":`...)
	b = appendIDs(b, ids)
	return append(b, `,"token_strs":null}`...)
}
