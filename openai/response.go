package openai

import (
	"errors"
	"strconv"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/jsonscan"
)

// Response is a normalised non-streamed upstream answer, ready to be finished
// with the usage tollgate bills (AppendJSON). It owns its bytes: the upstream
// body may be reused once NormalizeResponse returns.
type Response struct {
	idJSON, modelJSON []byte
	created           int64
	choices           []byte // normalised choices array
	rest              []byte // passed-through members, each as ,"key":value
	usage             Usage
	haveUsage         bool
	delivered         int64
}

// NormalizeResponse parses an upstream non-streamed body and returns a
// Response ready to finish. The same rules as StreamNormalizer apply (id,
// model, object "chat.completion", backend fields removed, reasoning_content
// renamed reasoning, type "function" added to tool calls with an id, every
// other field byte for byte), except that tool calls in a message get no
// index. A body that is not a JSON object or has no choices, an "error" key,
// an "object":"error" body or a finish_reason "error" gives a *tollgate.Error
// (upstream_error, or context_length_exceeded when the error says so).
func NormalizeResponse(body []byte, id, model string, fl Flavour) (*Response, error) {
	var n StreamNormalizer // for its scratch space and choice rewriting
	r := &Response{
		idJSON:    appendJSONString(nil, id),
		modelJSON: appendJSONString(nil, model),
	}
	it := jsonscan.NewObjIter(body)
	if it.Err() != nil {
		return nil, garbage(body, "not a JSON object")
	}
	var st chunkState
	var errVal []byte
	objectError := false
	nChoices := 0
	var choicesErr error
	for {
		key, raw, val, ok := it.Next()
		if !ok {
			break
		}
		switch string(key) {
		case "id", "model":
		case "object":
			if jsonscan.StringIs(val, "error") {
				objectError = true
			}
		case "created":
			if v, ok := jsonInt(val); ok && v > 0 && r.created == 0 {
				r.created = v
			}
		case "choices":
			st = chunkState{} // a repeated key: the last one wins
			r.choices, nChoices, choicesErr = n.normChoices(make([]byte, 0, len(val)+64), val, &st)
		case "usage":
			if u, ok := parseUsage(val); ok {
				r.usage, r.haveUsage = u, true
			}
		case "error":
			if !jsonscan.IsNull(val) {
				errVal = val
			}
		case "system_fingerprint", "timings", "provider", "kv_transfer_params", "prompt_token_ids", "prompt_logprobs":
		default:
			r.rest = append(r.rest, ',')
			r.rest = append(r.rest, raw...)
			r.rest = append(r.rest, ':')
			r.rest = append(r.rest, val...)
		}
	}
	if !it.RestOK() {
		return nil, garbage(body, "malformed JSON")
	}
	if errVal != nil {
		return nil, streamFailure(errVal)
	}
	if objectError {
		return nil, streamFailure(body)
	}
	if choicesErr != nil {
		return nil, garbage(body, "malformed choices")
	}
	if st.finishErr {
		return nil, &tollgate.Error{Code: tollgate.CodeUpstreamError,
			Message: "The model server failed while generating the answer."}
	}
	if nChoices == 0 {
		return nil, garbage(body, "no choices")
	}
	if r.created == 0 {
		r.created = time.Now().Unix()
	}
	r.delivered = st.delivered
	if r.haveUsage && fl == LlamaCpp {
		r.usage = ChoicesUsage(r.usage, st.delivered, st.deliveredFirst)
	}
	return r, nil
}

func garbage(body []byte, why string) *tollgate.Error {
	return &tollgate.Error{Code: tollgate.CodeUpstreamError,
		Message: "The model server sent an answer tollgate could not read.",
		Err:     errors.New("upstream response " + why + ": " + clip(string(body), 200))}
}

// Usage returns the usage the server reported, if any.
func (r *Response) Usage() (Usage, bool) { return r.usage, r.haveUsage }

// DeliveredBytes is the decoded size of the answer's text: content,
// reasoning, refusal, tool-call names and arguments, over all choices.
func (r *Response) DeliveredBytes() int64 { return r.delivered }

// FinalUsage returns the server's usage, or an estimate (Estimated set) from
// promptTokens and EstimateTokensN(DeliveredBytes()) when it reported none.
func (r *Response) FinalUsage(promptTokens int64) Usage {
	if r.haveUsage {
		return r.usage
	}
	return Usage{PromptTokens: promptTokens, CompletionTokens: EstimateTokensN(r.delivered), Estimated: true}.Normalize()
}

// Created is the upstream's created, or the time NormalizeResponse ran.
func (r *Response) Created() int64 { return r.created }

// AppendJSON appends the final body:
// {"id","object":"chat.completion","created","model","choices",
// "usage":{... with "cost" when cost != nil}, other upstream fields}.
func (r *Response) AppendJSON(dst []byte, u Usage, cost *tollgate.Amount) []byte {
	dst = append(dst, `{"id":`...)
	dst = append(dst, r.idJSON...)
	dst = append(dst, `,"object":"chat.completion","created":`...)
	dst = strconv.AppendInt(dst, r.created, 10)
	dst = append(dst, `,"model":`...)
	dst = append(dst, r.modelJSON...)
	dst = append(dst, `,"choices":`...)
	dst = append(dst, r.choices...)
	dst = append(dst, `,"usage":`...)
	dst = u.AppendJSON(dst, cost)
	dst = append(dst, r.rest...)
	return append(dst, '}')
}
