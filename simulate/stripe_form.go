package simulate

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
)

// stripeError is Stripe's error envelope, {"error": {...}}, with its status.
type stripeError struct {
	status        int
	Type          string        `json:"type"`
	Code          string        `json:"code,omitempty"`
	DeclineCode   string        `json:"decline_code,omitempty"`
	DocURL        string        `json:"doc_url,omitempty"`
	Message       string        `json:"message"`
	Param         string        `json:"param,omitempty"`
	Charge        string        `json:"charge,omitempty"`
	PaymentIntent *stripeIntent `json:"payment_intent,omitempty"`
	PaymentMethod *stripeMethod `json:"payment_method,omitempty"`
	RequestLogURL string        `json:"request_log_url,omitempty"`
}

func (e *stripeError) Error() string { return e.Type + ": " + e.Message }

// invalidRequest is a 400 invalid_request_error; code may be empty (Stripe
// leaves it out of some answers).
func invalidRequest(code, param, format string, args ...any) *stripeError {
	e := &stripeError{status: http.StatusBadRequest, Type: "invalid_request_error", Code: code,
		Param: param, Message: fmt.Sprintf(format, args...)}
	if code != "" {
		e.DocURL = docURL(code)
	}
	return e
}

func docURL(code string) string {
	return "https://stripe.com/docs/error-codes/" + strings.ReplaceAll(code, "_", "-")
}

func missingParam(param string) *stripeError {
	return invalidRequest("parameter_missing", param, "Missing required param: %s.", param)
}

// noSuch is Stripe's 404 for an unknown id: "No such checkout.session: 'cs_x'".
func noSuch(kind, param, id string) *stripeError {
	e := invalidRequest("resource_missing", param, "No such %s: '%s'", kind, id)
	e.status = http.StatusNotFound
	return e
}

// stripeForm is a request's parameters in Stripe's form encoding, flat:
// "line_items[0][price_data][unit_amount]" is one key.
type stripeForm struct{ v url.Values }

func (f stripeForm) has(key string) bool { _, ok := f.v[key]; return ok }

func (f stripeForm) str(key string) string { return f.v.Get(key) }

// strPtr is nil when the parameter is absent (Stripe's null).
func (f stripeForm) strPtr(key string) *string {
	if !f.has(key) {
		return nil
	}
	s := f.v.Get(key)
	return &s
}

// int parses an integer parameter; ok is false when it is absent.
func (f stripeForm) int(key string) (n int64, ok bool, err *stripeError) {
	if !f.has(key) {
		return 0, false, nil
	}
	n, perr := strconv.ParseInt(f.v.Get(key), 10, 64)
	if perr != nil {
		return 0, false, invalidRequest("parameter_invalid_integer", key, "Invalid integer: %s", f.v.Get(key))
	}
	return n, true, nil
}

// requiredInt parses an integer parameter that must be present and at
// least min.
func (f stripeForm) requiredInt(key string, min int64) (int64, *stripeError) {
	n, present, e := f.int(key)
	switch {
	case e != nil:
		return 0, e
	case !present:
		return 0, missingParam(key)
	case n < min:
		return 0, invalidRequest("", key, "This value must be greater than or equal to %d.", min)
	}
	return n, nil
}

// bool parses a boolean parameter ("true" or "false").
func (f stripeForm) bool(key string) (bool, *stripeError) {
	switch f.v.Get(key) {
	case "", "false":
		return false, nil
	case "true":
		return true, nil
	}
	return false, invalidRequest("", key, "Invalid boolean: %s", f.v.Get(key))
}

// hasPrefix reports whether any key starts with prefix.
func (f stripeForm) hasPrefix(prefix string) bool {
	for k := range f.v {
		if strings.HasPrefix(k, prefix) {
			return true
		}
	}
	return false
}

// list reads an array parameter sent as key[0], key[1]... or key[].
func (f stripeForm) list(key string) []string {
	out := append([]string(nil), f.v[key+"[]"]...)
	for i := 0; ; i++ {
		k := key + "[" + strconv.Itoa(i) + "]"
		if !f.has(k) {
			break
		}
		out = append(out, f.v.Get(k))
	}
	return out
}

// metadata reads metadata[key]=value pairs under prefix ("metadata" or
// "payment_intent_data[metadata]"), with Stripe's limits: 50 keys, keys up
// to 40 characters, values up to 500.
func (f stripeForm) metadata(prefix string) (map[string]string, *stripeError) {
	md := map[string]string{}
	for k, vs := range f.v {
		if !strings.HasPrefix(k, prefix+"[") || !strings.HasSuffix(k, "]") {
			continue
		}
		key := k[len(prefix)+1 : len(k)-1]
		if len(key) > 40 {
			return nil, invalidRequest("", prefix, "Metadata keys can have up to 40 characters, and `%s` has %d characters.", key, len(key))
		}
		if len(vs[0]) > 500 {
			return nil, invalidRequest("", k, "Metadata values can have up to 500 characters, but you passed in a value that is %d characters.", len(vs[0]))
		}
		if vs[0] != "" {
			md[key] = vs[0]
		}
	}
	if len(md) > 50 {
		return nil, invalidRequest("", prefix, "Metadata can have up to 50 keys, but you passed in %d keys.", len(md))
	}
	return md, nil
}

// unknown refuses a parameter whose name (before its first "[") the endpoint
// does not have, as Stripe does ("Received unknown parameter: x").
func (f stripeForm) unknown(allowed ...string) *stripeError {
	keys := make([]string, 0, len(f.v))
	for k := range f.v {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		root := k
		if i := strings.IndexByte(k, '['); i >= 0 {
			root = k[:i]
		}
		found := false
		for _, a := range allowed {
			if a == root {
				found = true
				break
			}
		}
		if !found {
			return invalidRequest("parameter_unknown", root, "Received unknown parameter: %s", root)
		}
	}
	return nil
}

// start checks a create request's parameter names and reads its metadata.
func (f stripeForm) start(allowed []string) (map[string]string, *stripeError) {
	if e := f.unknown(allowed...); e != nil {
		return nil, e
	}
	return f.metadata("metadata")
}

// canonical is the parameters in a stable order, to compare two requests
// made with one idempotency key.
func (f stripeForm) canonical() string { return f.v.Encode() }

// encodeStripeJSON encodes v as Stripe does: JSON, two-space indented.
func encodeStripeJSON(v any) []byte {
	body, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		panic("simulate: stripe object not encodable: " + err.Error())
	}
	return append(body, '\n')
}

// writeStripeJSON writes an answer: v is an object, or its encoding.
func writeStripeJSON(w http.ResponseWriter, status int, v any) {
	body, isBytes := v.([]byte)
	if !isBytes {
		body = encodeStripeJSON(v)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(body)
}

func errorBody(e *stripeError) any { return map[string]any{"error": e} }
