package simulate

import "strings"

// renderModels precomputes GET /v1/models in the flavour's shape.
func (s *Server) renderModels() []byte {
	var b []byte
	created := int(s.started)
	ctx := s.cfg.ContextLength
	switch s.flavour {
	case LlamaCpp:
		// llama-server lists its one model file twice: an Ollama-style
		// "models" array and the OpenAI "data" array.
		path := s.cfg.ModelPath
		b = append(b, `{"models":[{"name":`...)
		b = appendJSONString(b, path)
		b = append(b, `,"model":`...)
		b = appendJSONString(b, path)
		b = append(b, `,"modified_at":"","size":"","digest":"","type":"model","description":"","tags":[""],"capabilities":["completion"],"parameters":"","details":{"parent_model":"","format":"gguf","family":"","families":[""],"parameter_size":"","quantization_level":""}}],"object":"list","data":[{"id":`...)
		b = appendJSONString(b, path)
		b = append(b, `,"aliases":[`...)
		b = appendJSONString(b, path)
		b = append(b, `],"tags":[],"object":"model","created":`...)
		b = appendInt(b, created)
		b = append(b, `,"owned_by":"llamacpp","meta":{"vocab_type":true,"n_vocab":32000,"n_ctx":`...)
		b = appendInt(b, ctx)
		b = append(b, `,"n_ctx_train":`...)
		b = appendInt(b, ctx)
		b = append(b, `,"n_embd":4096,"n_params":7000000000,"size":4000000000,"ftype":"Q4_K - Medium"}}]}`...)
		return b
	case OpenRouter:
		b = append(b, `{"data":[`...)
		for i, m := range s.cfg.Models {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"id":`...)
			b = appendJSONString(b, m)
			b = append(b, `,"canonical_slug":`...)
			b = appendJSONString(b, m)
			b = append(b, `,"name":`...)
			b = appendJSONString(b, "Simulated: "+m)
			b = append(b, `,"created":`...)
			b = appendInt(b, created)
			b = append(b, `,"description":"A simulated model.","context_length":`...)
			b = appendInt(b, ctx)
			b = append(b, `,"architecture":{"modality":"text+image->text","input_modalities":[`...)
			b = append(b, s.modalities()...)
			b = append(b, `],"output_modalities":["text"],"tokenizer":"Other","instruct_type":null},"pricing":{"prompt":`...)
			b = appendJSONString(b, perToken6(s.cfg.PromptPrice))
			b = append(b, `,"completion":`...)
			b = appendJSONString(b, perToken6(s.cfg.CompletionPrice))
			b = append(b, `,"request":"0","image":"0"},"top_provider":{"context_length":`...)
			b = appendInt(b, ctx)
			b = append(b, `,"max_completion_tokens":null,"is_moderated":false},"per_request_limits":null,"supported_parameters":[`...)
			b = append(b, s.supportedParameters()...)
			b = append(b, "]}"...)
		}
		return append(b, "]}"...)
	}
	b = append(b, `{"object":"list","data":[`...)
	for i, m := range s.cfg.Models {
		if i > 0 {
			b = append(b, ',')
		}
		if s.flavour == Ollama && !strings.Contains(m, ":") {
			m += ":latest"
		}
		b = append(b, `{"id":`...)
		b = appendJSONString(b, m)
		b = append(b, `,"object":"model","created":`...)
		b = appendInt(b, created)
		switch s.flavour {
		case Ollama:
			b = append(b, `,"owned_by":"library"}`...)
		case OpenAI:
			b = append(b, `,"owned_by":"system"}`...)
		case SGLang:
			b = append(b, `,"owned_by":"sglang","root":`...)
			b = appendJSONString(b, m)
			b = append(b, `,"parent":null,"max_model_len":`...)
			b = appendInt(b, ctx)
			b = append(b, '}')
		default: // vLLM
			b = append(b, `,"owned_by":"vllm","root":`...)
			b = appendJSONString(b, m)
			b = append(b, `,"parent":null,"max_model_len":`...)
			b = appendInt(b, ctx)
			b = append(b, `,"permission":[{"id":"modelperm-`...)
			b = appendRand(b, uint64(i)+1, 32, hexDigits)
			b = append(b, `","object":"model_permission","created":`...)
			b = appendInt(b, created)
			b = append(b, `,"allow_create_engine":false,"allow_sampling":true,"allow_logprobs":true,"allow_search_indices":false,"allow_view":true,"allow_fine_tuning":false,"organization":"*","group":null,"is_blocking":false}]}`...)
		}
	}
	return append(b, "]}"...)
}

func (s *Server) modalities() string {
	m := `"text"`
	if !s.cfg.NoImages {
		m += `,"image"`
	}
	if !s.cfg.NoPDF {
		m += `,"file"`
	}
	return m
}

func (s *Server) supportedParameters() string {
	p := `"max_tokens","temperature","top_p","stop","seed","response_format"`
	if !s.cfg.NoTools {
		p += `,"tools","tool_choice"`
	}
	if !s.cfg.NoReasoning {
		p += `,"reasoning","include_reasoning"`
	}
	return p
}

// perToken6 turns a USD-per-million rate into OpenRouter's per-token decimal
// string.
func perToken6(perMillion float64) string {
	return string(appendFloat(nil, perMillion/1e6))
}
