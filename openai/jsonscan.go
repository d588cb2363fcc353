package openai

import (
	"bytes"
	"encoding/json"
	"errors"
)

// A small validating JSON scanner. The normalisers walk upstream JSON with it
// and copy every value they do not touch byte for byte, so numbers are never
// round-tripped through float64 and no map[string]any is ever built. Every
// value is validated as it is skipped, so the output is valid JSON whenever
// the input was.

var errSyntax = errors.New("invalid JSON")

// MaxDepth is how deeply arrays and objects may nest in a request body
// (the top-level object is level 1). Deeper is refused with its own message
// (errTooDeep): recursion is bounded, and no real request comes near it.
const MaxDepth = 512

// maxDepth is the depth skipValue refuses: values start at depth 1 inside
// the top-level object (level 1), so a container at depth d is level d+1.
const maxDepth = MaxDepth - 1

var errTooDeep = errors.New("JSON nested too deeply")

func isWS(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipWS(b []byte, i int) int {
	for i < len(b) && isWS(b[i]) {
		i++
	}
	return i
}

func trimWS(b []byte) []byte {
	i, j := 0, len(b)
	for i < j && isWS(b[i]) {
		i++
	}
	for j > i && isWS(b[j-1]) {
		j--
	}
	return b[i:j]
}

// skipValue returns the index just after the JSON value starting at b[i]
// (whitespace before it is skipped).
func skipValue(b []byte, i int, depth int) (int, error) {
	i = skipWS(b, i)
	if i >= len(b) {
		return i, errSyntax
	}
	switch c := b[i]; {
	case c == '"':
		return skipString(b, i)
	case c == '{':
		if depth > maxDepth {
			return i, errTooDeep
		}
		i = skipWS(b, i+1)
		if i < len(b) && b[i] == '}' {
			return i + 1, nil
		}
		for {
			i = skipWS(b, i)
			if i >= len(b) || b[i] != '"' {
				return i, errSyntax
			}
			var err error
			if i, err = skipString(b, i); err != nil {
				return i, err
			}
			i = skipWS(b, i)
			if i >= len(b) || b[i] != ':' {
				return i, errSyntax
			}
			if i, err = skipValue(b, i+1, depth+1); err != nil {
				return i, err
			}
			i = skipWS(b, i)
			if i >= len(b) {
				return i, errSyntax
			}
			if b[i] == '}' {
				return i + 1, nil
			}
			if b[i] != ',' {
				return i, errSyntax
			}
			i++
		}
	case c == '[':
		if depth > maxDepth {
			return i, errTooDeep
		}
		i = skipWS(b, i+1)
		if i < len(b) && b[i] == ']' {
			return i + 1, nil
		}
		for {
			var err error
			if i, err = skipValue(b, i, depth+1); err != nil {
				return i, err
			}
			i = skipWS(b, i)
			if i >= len(b) {
				return i, errSyntax
			}
			if b[i] == ']' {
				return i + 1, nil
			}
			if b[i] != ',' {
				return i, errSyntax
			}
			i++
		}
	case c == 't':
		return skipLit(b, i, "true")
	case c == 'f':
		return skipLit(b, i, "false")
	case c == 'n':
		return skipLit(b, i, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		return skipNumber(b, i)
	}
	return i, errSyntax
}

func skipLit(b []byte, i int, lit string) (int, error) {
	if len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit {
		return i + len(lit), nil
	}
	return i, errSyntax
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func skipNumber(b []byte, i int) (int, error) {
	if b[i] == '-' {
		i++
	}
	if i >= len(b) {
		return i, errSyntax
	}
	if b[i] == '0' {
		i++
	} else if isDigit(b[i]) {
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	} else {
		return i, errSyntax
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || !isDigit(b[i]) {
			return i, errSyntax
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return i, errSyntax
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	return i, nil
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// skipString returns the index after the string starting at b[i] == '"'.
func skipString(b []byte, i int) (int, error) {
	i++
	for i < len(b) {
		c := b[i]
		switch {
		case c == '"':
			return i + 1, nil
		case c == '\\':
			if i+1 >= len(b) {
				return i, errSyntax
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+5 >= len(b) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
					return i, errSyntax
				}
				i += 6
			default:
				return i, errSyntax
			}
		case c < 0x20:
			return i, errSyntax
		default:
			i++
		}
	}
	return i, errSyntax
}

// objIter walks the members of one JSON object.
type objIter struct {
	b       []byte
	i       int
	first   bool // a closing '}' is legal at it.i
	done    bool
	trusted bool // obj was already validated: skip values without re-checking them
	err     error
}

// newObjIter starts on obj, which must be a JSON object (whitespace around it allowed).
func newObjIter(obj []byte) objIter {
	i := skipWS(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return objIter{err: errSyntax}
	}
	return objIter{b: obj, i: i + 1, first: true}
}

// newTrustedObjIter is newObjIter for a value that an earlier scan validated
// (a member value returned by an iterator): it skips values much faster.
func newTrustedObjIter(obj []byte) objIter {
	it := newObjIter(obj)
	it.trusted = true
	return it
}

// next returns the next member: key is the decoded name, rawKey the name as
// written (with its quotes), val the raw value. ok is false at the end or on
// a syntax error (then it.err is set).
func (it *objIter) next() (key, rawKey, val []byte, ok bool) {
	if it.err != nil || it.done {
		return nil, nil, nil, false
	}
	b := it.b
	i := skipWS(b, it.i)
	if i >= len(b) {
		it.err = errSyntax
		return nil, nil, nil, false
	}
	if b[i] == '}' {
		if !it.first { // "{...,}"
			it.err = errSyntax
			return nil, nil, nil, false
		}
		it.i = i + 1
		it.done = true
		return nil, nil, nil, false
	}
	if b[i] != '"' {
		it.err = errSyntax
		return nil, nil, nil, false
	}
	ks := i
	var err error
	if it.trusted {
		i = skipStringFast(b, i)
	} else if i, err = skipString(b, i); err != nil {
		it.err = err
		return nil, nil, nil, false
	}
	rawKey = b[ks:i]
	i = skipWS(b, i)
	if i >= len(b) || b[i] != ':' {
		it.err = errSyntax
		return nil, nil, nil, false
	}
	vs := skipWS(b, i+1)
	var ve int
	if it.trusted {
		ve = skipValueFast(b, vs)
	} else if ve, err = skipValue(b, vs, 1); err != nil {
		it.err = err
		return nil, nil, nil, false
	}
	val = b[vs:ve]
	i = skipWS(b, ve)
	if i >= len(b) {
		it.err = errSyntax
		return nil, nil, nil, false
	}
	switch b[i] {
	case ',':
		it.i = i + 1
		it.first = false
	case '}':
		it.i = i
		it.first = true // the closing brace is legal now
	default:
		it.err = errSyntax
		return nil, nil, nil, false
	}
	return keyName(rawKey), rawKey, val, true
}

// restOK reports whether the object ended cleanly with only whitespace after it.
func (it *objIter) restOK() bool {
	return it.err == nil && it.done && skipWS(it.b, it.i) == len(it.b)
}

// keyName returns the decoded key: the bytes inside the quotes, or for the
// rare key written with escapes, its unescaped form.
func keyName(raw []byte) []byte {
	inner := raw[1 : len(raw)-1]
	for _, c := range inner {
		if c == '\\' {
			var s string
			if json.Unmarshal(raw, &s) != nil {
				return inner
			}
			return []byte(s)
		}
	}
	return inner
}

// eachTrustedField is eachField for an already validated object.
func eachTrustedField(obj []byte, fn func(key, val []byte) error) error {
	it := newTrustedObjIter(obj)
	for {
		k, _, v, ok := it.next()
		if !ok {
			return it.err
		}
		if err := fn(k, v); err != nil {
			return err
		}
	}
}

// arrIter walks the elements of one JSON array.
type arrIter struct {
	b       []byte
	i       int
	first   bool
	done    bool
	trusted bool
	err     error
}

func newArrIter(arr []byte) arrIter {
	i := skipWS(arr, 0)
	if i >= len(arr) || arr[i] != '[' {
		return arrIter{err: errSyntax}
	}
	return arrIter{b: arr, i: i + 1, first: true}
}

// newTrustedArrIter is newArrIter for an already validated value.
func newTrustedArrIter(arr []byte) arrIter {
	it := newArrIter(arr)
	it.trusted = true
	return it
}

// skipStringFast returns the index after the string at b[i] == '"', which is
// known to be valid JSON.
func skipStringFast(b []byte, i int) int {
	i++
	for i < len(b) {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			return len(b)
		}
		k := i + j
		bs := 0
		for m := k - 1; m >= i && b[m] == '\\'; m-- {
			bs++
		}
		if bs%2 == 0 {
			return k + 1
		}
		i = k + 1
	}
	return len(b)
}

// skipValueFast returns the index after the value at b[i], known to be valid JSON.
func skipValueFast(b []byte, i int) int {
	i = skipWS(b, i)
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return skipStringFast(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipStringFast(b, i)
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
		return len(b)
	}
	for i < len(b) {
		switch c := b[i]; c {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}

func (it *arrIter) next() (val []byte, ok bool) {
	if it.err != nil || it.done {
		return nil, false
	}
	b := it.b
	i := skipWS(b, it.i)
	if i < len(b) && b[i] == ']' && it.first {
		it.done = true
		it.i = i + 1
		return nil, false
	}
	vs := i
	var ve int
	if it.trusted {
		ve = skipValueFast(b, vs)
	} else {
		var err error
		if ve, err = skipValue(b, vs, 1); err != nil {
			it.err = err
			return nil, false
		}
	}
	i = skipWS(b, ve)
	if i >= len(b) {
		it.err = errSyntax
		return nil, false
	}
	switch b[i] {
	case ',':
		it.i = i + 1
		it.first = false
	case ']':
		it.i = i + 1
		it.done = true
		// return this last element; next call reports the end
		return b[vs:ve], true
	default:
		it.err = errSyntax
		return nil, false
	}
	return b[vs:ve], true
}

// jsonString decodes a JSON string value; ok is false for other types.
func jsonString(val []byte) (string, bool) {
	val = trimWS(val)
	if len(val) < 2 || val[0] != '"' {
		return "", false
	}
	inner := val[1 : len(val)-1]
	plain := true
	for _, c := range inner {
		if c == '\\' {
			plain = false
			break
		}
	}
	if plain {
		return string(inner), true
	}
	var s string
	if json.Unmarshal(val, &s) != nil {
		return "", false
	}
	return s, true
}

// jsonStringIs reports whether val is the JSON string s (s without escapes).
func jsonStringIs(val []byte, s string) bool {
	val = trimWS(val)
	return len(val) == len(s)+2 && val[0] == '"' && string(val[1:len(val)-1]) == s
}

// isNull reports whether val is the literal null.
func isNull(val []byte) bool { return string(trimWS(val)) == "null" }

// stringLen returns the decoded byte length of a JSON string value (0 for
// anything else). \uXXXX escapes count as the UTF-8 length of their code unit.
func stringLen(val []byte) int64 {
	if len(val) < 2 || val[0] != '"' {
		return 0
	}
	var n int64
	inner := val[1 : len(val)-1]
	for i := 0; i < len(inner); i++ {
		if inner[i] != '\\' {
			n++
			continue
		}
		if i+1 < len(inner) && inner[i+1] == 'u' && i+5 < len(inner) {
			var r rune
			for _, h := range inner[i+2 : i+6] {
				r <<= 4
				switch {
				case h >= '0' && h <= '9':
					r |= rune(h - '0')
				case h >= 'a' && h <= 'f':
					r |= rune(h-'a') + 10
				case h >= 'A' && h <= 'F':
					r |= rune(h-'A') + 10
				}
			}
			switch {
			case r < 0x80:
				n++
			case r < 0x800:
				n += 2
			case r >= 0xD800 && r < 0xE000:
				n += 2 // half of a surrogate pair (4 bytes together)
			default:
				n += 3
			}
			i += 5
			continue
		}
		n++
		i++
	}
	return n
}
