package idempotency

import (
	"crypto/sha256"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/jsonscan"
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
	// Strings are skipped whole (SkipStringFast finds their end with
	// IndexByte, which is vectorised); whitespace between them is dropped.
	start := 0
	for i := 0; i < len(body); i++ {
		switch body[i] {
		case '"':
			j := jsonscan.SkipStringFast(body, i)
			if j < 0 {
				i = len(body)
				break
			}
			i = j - 1
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
// "stream" is true, skipping the other values by their quotes and brackets
// without decoding them. The last of repeated keys wins, as in the relay's
// parser; a key written with escapes is decoded, so that it cannot hide from
// this look while the relay's parser sees it. A body that is not a JSON
// object gives (nil, false): the relay rejects it, and the key is released.
func inspect(b []byte) (model []byte, stream bool) {
	it := jsonscan.NewTrustedObjIter(b)
	for {
		k, _, v, ok := it.Next()
		if !ok {
			break
		}
		switch string(k) {
		case "model":
			model = v
		case "stream":
			stream = string(v) == "true"
		}
	}
	if it.Err() != nil {
		return nil, false
	}
	return model, stream
}
