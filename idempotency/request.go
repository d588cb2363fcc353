package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"

	"github.com/tollgate/tollgate"
)

// MaxKeyBytes is the longest Idempotency-Key accepted (docs/idempotency.md).
const MaxKeyBytes = 255

// ValidKey checks an Idempotency-Key value: 1 to 255 bytes of printable
// ASCII (0x20 to 0x7e). Anything else is 400 invalid_idempotency_key.
func ValidKey(v string) error {
	if v == "" || len(v) > MaxKeyBytes {
		return tollgate.Errorf(tollgate.CodeInvalidIdempotencyKey,
			"Idempotency-Key must be 1 to %d printable ASCII characters; got %d bytes", MaxKeyBytes, len(v))
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c > 0x7e {
			return tollgate.Errorf(tollgate.CodeInvalidIdempotencyKey,
				"Idempotency-Key must be printable ASCII; byte %d is 0x%02x", i, c)
		}
	}
	return nil
}

// Fingerprint identifies a request for the same-key-different-request check:
// SHA-256 over the model (the raw JSON value of the top-level "model") and
// the canonical body. The canonical body is the body's bytes with the JSON
// whitespace outside strings removed: a client that resends the same
// request, pretty-printed or not, matches; one that changes anything else (a
// value, a key's order, a number's spelling, an escape) does not.
// docs/idempotency.md says the same to clients.
func Fingerprint(model, body []byte) []byte {
	h := sha256.New()
	h.Write([]byte("tollgate idempotency v1\n"))
	h.Write(model)
	h.Write([]byte{'\n'})
	// Strings are skipped whole (closingQuote finds their end with
	// IndexByte, which is vectorised); whitespace between them is dropped.
	start := 0
	for i := 0; i < len(body); i++ {
		switch body[i] {
		case '"':
			j := closingQuote(body, i+1)
			if j < 0 {
				i = len(body)
				break
			}
			i = j
		case ' ', '\t', '\n', '\r':
			if start < i {
				h.Write(body[start:i])
			}
			start = i + 1
		}
	}
	if start < len(body) {
		h.Write(body[start:])
	}
	return h.Sum(nil)
}

// inspect finds the top-level "model" (its raw JSON value) and whether
// "stream" is true, without decoding anything else. The last of repeated
// keys wins, as in the relay's parser. A body that is not a JSON object gives
// (nil, false): the relay rejects it, and the key is released.
func inspect(b []byte) (model []byte, stream bool) {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	i++
	for {
		i = skipWS(b, i)
		if i >= len(b) || b[i] == '}' {
			return model, stream
		}
		if b[i] == ',' {
			i++
			continue
		}
		if b[i] != '"' {
			return nil, false
		}
		ks := i
		i = skipString(b, i)
		if i < 0 {
			return nil, false
		}
		key := b[ks:i]
		i = skipWS(b, i)
		if i >= len(b) || b[i] != ':' {
			return nil, false
		}
		i = skipWS(b, i+1)
		vs := i
		i = skipValue(b, i)
		if i < 0 {
			return nil, false
		}
		switch keyName(key) {
		case "model":
			model = b[vs:i]
		case "stream":
			stream = string(b[vs:i]) == "true"
		}
	}
}

// keyName returns the key if it is "model" or "stream", else "". A key
// written with escapes (rare) is decoded so that it cannot hide from us
// while the relay's parser sees it.
func keyName(quoted []byte) string {
	switch string(quoted) {
	case `"model"`:
		return "model"
	case `"stream"`:
		return "stream"
	}
	for _, c := range quoted {
		if c == '\\' {
			var s string
			if json.Unmarshal(quoted, &s) == nil && (s == "model" || s == "stream") {
				return s
			}
			break
		}
	}
	return ""
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i] == '"', or -1.
func skipString(b []byte, i int) int {
	j := closingQuote(b, i+1)
	if j < 0 {
		return -1
	}
	return j + 1
}

// closingQuote returns the index of the quote that ends the string whose
// contents start at b[i], or -1: the first '"' not escaped by an odd run of
// backslashes.
func closingQuote(b []byte, i int) int {
	for {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			return -1
		}
		j += i
		n := 0
		for k := j - 1; k >= i && b[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return j
		}
		i = j + 1
	}
}

// skipValue returns the index after the JSON value starting at b[i], or -1.
// Objects and arrays are skipped by bracket depth; their contents are not
// validated (the relay's parser does that).
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				if i < 0 {
					return -1
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return -1
	}
	start := i
	for i < len(b) {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			if i == start {
				return -1
			}
			return i
		}
		i++
	}
	return -1 // a scalar cannot end the body: the object's '}' is missing
}
