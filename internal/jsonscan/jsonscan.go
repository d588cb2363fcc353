// Package jsonscan is tollgate's one JSON scanner: it walks JSON bytes in
// place, validating as it skips, and hands back raw values, so that numbers
// are never round-tripped through float64 and no map[string]any is built.
// The request parser, the response and stream normalisers (openai), the
// simulator (simulate) and the idempotency check (idempotency) read JSON
// with it; encoding/json decodes only the rare parts (escaped strings, tool
// schemas).
//
// Values an earlier scan validated are skipped again by the Trusted
// iterators, which look for quotes and brackets only; they are safe on any
// input (an unterminated value ends the iteration with ErrSyntax).
package jsonscan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// ErrSyntax is malformed JSON; every error of the scanner is one
// (errors.Is). A *SyntaxError says where and why.
var ErrSyntax = errors.New("invalid JSON")

// ErrEnd is JSON that ends before its value does.
var ErrEnd error = endError{}

type endError struct{}

func (endError) Error() string        { return "unexpected end of JSON input" }
func (endError) Is(target error) bool { return target == ErrSyntax }

// ErrTooDeep is JSON nested deeper than MaxDepth.
var ErrTooDeep error = tooDeepError{}

type tooDeepError struct{}

func (tooDeepError) Error() string        { return "JSON nested too deeply" }
func (tooDeepError) Is(target error) bool { return target == ErrSyntax }

// SyntaxError is malformed JSON: Offset is where the scan stopped, Msg what
// it found there, worded as Go's encoding/json words it.
type SyntaxError struct {
	Offset int
	Msg    string
}

func (e *SyntaxError) Error() string        { return fmt.Sprintf("%s at offset %d", e.Msg, e.Offset) }
func (e *SyntaxError) Is(target error) bool { return target == ErrSyntax }

// syntaxErr is the error at b[i]: ErrEnd past the end, else msg.
func syntaxErr(b []byte, i int, msg string) error {
	if i >= len(b) {
		return ErrEnd
	}
	return &SyntaxError{Offset: i, Msg: msg}
}

// MaxDepth is how deeply arrays and objects may nest (a top-level object is
// level 1). Deeper is refused with ErrTooDeep: recursion is bounded, and no
// real request comes near it.
const MaxDepth = 512

// maxDepth is the depth SkipValue refuses: values start at depth 1 inside
// the top-level object (level 1), so a container at depth d is level d+1.
const maxDepth = MaxDepth - 1

func isWS(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func SkipWS(b []byte, i int) int {
	for i < len(b) && isWS(b[i]) {
		i++
	}
	return i
}

func TrimWS(b []byte) []byte {
	i, j := 0, len(b)
	for i < j && isWS(b[i]) {
		i++
	}
	for j > i && isWS(b[j-1]) {
		j--
	}
	return b[i:j]
}

// SkipValue returns the index just after the JSON value starting at b[i]
// (whitespace before it is skipped), which it validates. depth is the
// value's nesting level: 1 for a member of a top-level object, 0 for a
// top-level value.
func SkipValue(b []byte, i int, depth int) (int, error) {
	i = SkipWS(b, i)
	if i >= len(b) {
		return i, ErrEnd
	}
	switch c := b[i]; {
	case c == '"':
		return SkipString(b, i)
	case c == '{':
		if depth > maxDepth {
			return i, ErrTooDeep
		}
		i = SkipWS(b, i+1)
		if i < len(b) && b[i] == '}' {
			return i + 1, nil
		}
		for {
			i = SkipWS(b, i)
			if i >= len(b) || b[i] != '"' {
				return i, InvalidChar(b, i, "looking for beginning of object key string")
			}
			var err error
			if i, err = SkipString(b, i); err != nil {
				return i, err
			}
			i = SkipWS(b, i)
			if i >= len(b) || b[i] != ':' {
				return i, InvalidChar(b, i, "after object key")
			}
			if i, err = SkipValue(b, i+1, depth+1); err != nil {
				return i, err
			}
			i = SkipWS(b, i)
			if i >= len(b) {
				return i, ErrEnd
			}
			if b[i] == '}' {
				return i + 1, nil
			}
			if b[i] != ',' {
				return i, InvalidChar(b, i, "after object key:value pair")
			}
			i++
		}
	case c == '[':
		if depth > maxDepth {
			return i, ErrTooDeep
		}
		i = SkipWS(b, i+1)
		if i < len(b) && b[i] == ']' {
			return i + 1, nil
		}
		for {
			var err error
			if i, err = SkipValue(b, i, depth+1); err != nil {
				return i, err
			}
			i = SkipWS(b, i)
			if i >= len(b) {
				return i, ErrEnd
			}
			if b[i] == ']' {
				return i + 1, nil
			}
			if b[i] != ',' {
				return i, InvalidChar(b, i, "after array element")
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
	return i, InvalidChar(b, i, "looking for beginning of value")
}

// InvalidChar is encoding/json's "invalid character 'x' <context>" for
// b[i] (ErrEnd past the end).
func InvalidChar(b []byte, i int, context string) error {
	if i >= len(b) {
		return ErrEnd
	}
	return &SyntaxError{Offset: i, Msg: fmt.Sprintf("invalid character %q %s", b[i], context)}
}

func skipLit(b []byte, i int, lit string) (int, error) {
	if len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit {
		return i + len(lit), nil
	}
	return i, litErr(b, i, lit)
}

// litErr is the error of a literal that is not lit, at the first byte that
// differs.
func litErr(b []byte, i int, lit string) error {
	for k := 0; k < len(lit); k++ {
		if i+k >= len(b) {
			return ErrEnd
		}
		if b[i+k] != lit[k] {
			return InvalidChar(b, i+k, fmt.Sprintf("in literal %s (expecting %q)", lit, lit[k]))
		}
	}
	return ErrSyntax
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func skipNumber(b []byte, i int) (int, error) {
	if b[i] == '-' {
		i++
	}
	if i >= len(b) {
		return i, ErrEnd
	}
	if b[i] == '0' {
		i++
	} else if isDigit(b[i]) {
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	} else {
		return i, InvalidChar(b, i, "in numeric literal")
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || !isDigit(b[i]) {
			return i, InvalidChar(b, i, "after decimal point in numeric literal")
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
			return i, InvalidChar(b, i, "in exponent of numeric literal")
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

// SkipString returns the index after the string starting at b[i] == '"',
// which it validates (escapes, no control characters).
func SkipString(b []byte, i int) (int, error) {
	i++
	for i < len(b) {
		c := b[i]
		switch {
		case c == '"':
			return i + 1, nil
		case c == '\\':
			if i+1 >= len(b) {
				return i, ErrEnd
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+5 >= len(b) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
					return i, escapeErr(b, i)
				}
				i += 6
			default:
				return i, escapeErr(b, i)
			}
		case c < 0x20:
			return i, InvalidChar(b, i, "in string literal")
		default:
			i++
		}
	}
	return i, ErrEnd
}

// escapeErr is the error of the bad escape at b[i] == '\\'.
func escapeErr(b []byte, i int) error {
	if b[i+1] != 'u' {
		return InvalidChar(b, i+1, "in string escape code")
	}
	for k := i + 2; k < i+6; k++ {
		if k >= len(b) {
			return ErrEnd
		}
		if !isHex(b[k]) {
			return InvalidChar(b, k, "in \\u hexadecimal character escape")
		}
	}
	return ErrSyntax
}

// ScanString returns the raw (still escaped) bytes between the quotes of the
// string at b[i], and the index after it.
func ScanString(b []byte, i int) (raw []byte, next int, err error) {
	if i >= len(b) || b[i] != '"' {
		return nil, i, syntaxErr(b, i, "expected string")
	}
	if next, err = SkipString(b, i); err != nil {
		return nil, next, err
	}
	return b[i+1 : next-1], next, nil
}

// cursor is where an iterator is in its object or array.
type cursor struct {
	b       []byte
	i       int
	first   bool // the closing bracket is legal at i
	done    bool
	trusted bool // skip values by their quotes and brackets, without validating them
	err     error
}

// Err is why the iteration stopped early: nil at the value's end.
func (c *cursor) Err() error { return c.err }

// open starts a cursor inside the container b holds (whitespace around it
// allowed), which must begin with bracket.
func open(b []byte, bracket byte, trusted bool) cursor {
	i := SkipWS(b, 0)
	if i >= len(b) || b[i] != bracket {
		return cursor{err: ErrSyntax}
	}
	return cursor{b: b, i: i + 1, first: true, trusted: trusted}
}

// ObjIter walks the members of one JSON object.
type ObjIter struct{ cursor }

// NewObjIter starts on obj, which must be a JSON object (whitespace around it allowed).
func NewObjIter(obj []byte) ObjIter { return ObjIter{open(obj, '{', false)} }

// NewTrustedObjIter is NewObjIter for a value that an earlier scan validated
// (a member value returned by an iterator): it skips values much faster,
// by their quotes and brackets. On other input it does not validate, and
// stops with ErrSyntax where a value does not end.
func NewTrustedObjIter(obj []byte) ObjIter { return ObjIter{open(obj, '{', true)} }

// Next returns the next member: key is the decoded name, rawKey the name as
// written (with its quotes), val the raw value. ok is false at the end or on
// a syntax error (then it.err is set).
func (it *ObjIter) Next() (key, rawKey, val []byte, ok bool) {
	if it.err != nil || it.done {
		return nil, nil, nil, false
	}
	b := it.b
	i := SkipWS(b, it.i)
	if i >= len(b) {
		it.err = ErrSyntax
		return nil, nil, nil, false
	}
	if b[i] == '}' {
		if !it.first { // "{...,}"
			it.err = ErrSyntax
			return nil, nil, nil, false
		}
		it.i = i + 1
		it.done = true
		return nil, nil, nil, false
	}
	if b[i] != '"' {
		it.err = ErrSyntax
		return nil, nil, nil, false
	}
	ks := i
	var err error
	if it.trusted {
		if i = SkipStringFast(b, i); i < 0 {
			it.err = ErrEnd
			return nil, nil, nil, false
		}
	} else if i, err = SkipString(b, i); err != nil {
		it.err = err
		return nil, nil, nil, false
	}
	rawKey = b[ks:i]
	i = SkipWS(b, i)
	if i >= len(b) || b[i] != ':' {
		it.err = ErrSyntax
		return nil, nil, nil, false
	}
	vs := SkipWS(b, i+1)
	var ve int
	if it.trusted {
		if ve = SkipValueFast(b, vs); ve < 0 {
			it.err = ErrSyntax
			return nil, nil, nil, false
		}
	} else if ve, err = SkipValue(b, vs, 1); err != nil {
		it.err = err
		return nil, nil, nil, false
	}
	val = b[vs:ve]
	i = SkipWS(b, ve)
	if i >= len(b) {
		it.err = ErrSyntax
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
		it.err = ErrSyntax
		return nil, nil, nil, false
	}
	return KeyName(rawKey), rawKey, val, true
}

// RestOK reports whether the object ended cleanly with only whitespace after it.
func (it *ObjIter) RestOK() bool {
	return it.err == nil && it.done && SkipWS(it.b, it.i) == len(it.b)
}

// KeyName returns the decoded key: the bytes inside the quotes, or for the
// rare key written with escapes, its unescaped form.
func KeyName(raw []byte) []byte {
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

// EachTrustedField calls fn with each member of obj, an already validated
// object.
func EachTrustedField(obj []byte, fn func(key, val []byte) error) error {
	it := NewTrustedObjIter(obj)
	for {
		k, _, v, ok := it.Next()
		if !ok {
			return it.Err()
		}
		if err := fn(k, v); err != nil {
			return err
		}
	}
}

// ArrIter walks the elements of one JSON array.
type ArrIter struct{ cursor }

// NewArrIter starts on arr, which must be a JSON array (whitespace around it allowed).
func NewArrIter(arr []byte) ArrIter { return ArrIter{open(arr, '[', false)} }

// NewTrustedArrIter is NewArrIter for an already validated value (as
// NewTrustedObjIter).
func NewTrustedArrIter(arr []byte) ArrIter { return ArrIter{open(arr, '[', true)} }

// SkipStringFast returns the index after the string at b[i] == '"': after
// the first quote not escaped by an odd run of backslashes, or -1 if there
// is none. It does not validate the string.
func SkipStringFast(b []byte, i int) int {
	i++
	for i < len(b) {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			return -1
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
	return -1
}

// SkipValueFast returns the index after the value at b[i] (whitespace
// before it is skipped), by its quotes and brackets, or -1 where the value
// does not end (an unterminated string, array or object, or none at all).
// It does not validate the value: it is for values an earlier scan
// validated, and for a quick look at a body that will be validated later.
func SkipValueFast(b []byte, i int) int {
	i = SkipWS(b, i)
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return SkipStringFast(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				if i = SkipStringFast(b, i); i < 0 {
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
	return i
}

// Next returns the next element; ok is false at the end or on a syntax
// error (then Err says which).
func (it *ArrIter) Next() (val []byte, ok bool) {
	if it.err != nil || it.done {
		return nil, false
	}
	b := it.b
	i := SkipWS(b, it.i)
	if i < len(b) && b[i] == ']' && it.first {
		it.done = true
		it.i = i + 1
		return nil, false
	}
	vs := i
	var ve int
	if it.trusted {
		if ve = SkipValueFast(b, vs); ve < 0 {
			it.err = ErrSyntax
			return nil, false
		}
	} else {
		var err error
		if ve, err = SkipValue(b, vs, 1); err != nil {
			it.err = err
			return nil, false
		}
	}
	i = SkipWS(b, ve)
	if i >= len(b) {
		it.err = ErrSyntax
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
		it.err = ErrSyntax
		return nil, false
	}
	return b[vs:ve], true
}

// String decodes a JSON string value; ok is false for other types.
func String(val []byte) (string, bool) {
	val = TrimWS(val)
	if len(val) < 2 || val[0] != '"' {
		return "", false
	}
	return Unquote(val[1 : len(val)-1])
}

// Unquote decodes the bytes between a JSON string's quotes (as ScanString
// returns them); ok is false if an escape in them is not JSON's.
func Unquote(raw []byte) (string, bool) {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw), true
	}
	var s string
	if json.Unmarshal(append(append([]byte{'"'}, raw...), '"'), &s) != nil {
		return "", false
	}
	return s, true
}

// EachMember walks the object at b[i] (whitespace before it is skipped),
// validating it: fn gets each raw key (still escaped, without its quotes)
// and the index where its value starts, and returns the index after the
// value. It returns the index after the object.
func EachMember(b []byte, i int, fn func(key []byte, vs int) (int, error)) (int, error) {
	i = SkipWS(b, i)
	if i >= len(b) || b[i] != '{' {
		return i, syntaxErr(b, i, "expected object")
	}
	i = SkipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, nil
	}
	for {
		i = SkipWS(b, i)
		if i >= len(b) || b[i] != '"' {
			return i, InvalidChar(b, i, "looking for beginning of object key string")
		}
		key, next, err := ScanString(b, i)
		if err != nil {
			return next, err
		}
		i = SkipWS(b, next)
		if i >= len(b) || b[i] != ':' {
			return i, InvalidChar(b, i, "after object key")
		}
		i = SkipWS(b, i+1)
		if i >= len(b) {
			return i, ErrEnd
		}
		if i, err = fn(key, i); err != nil {
			return i, err
		}
		i = SkipWS(b, i)
		if i >= len(b) {
			return i, ErrEnd
		}
		switch b[i] {
		case ',':
			i++
		case '}':
			return i + 1, nil
		default:
			return i, InvalidChar(b, i, "after object key:value pair")
		}
	}
}

// EachElement walks the array at b[i] (whitespace before it is skipped),
// validating it: fn gets the index where each element starts and returns
// the index after it. It returns the index after the array.
func EachElement(b []byte, i int, fn func(vs int) (int, error)) (int, error) {
	i = SkipWS(b, i)
	if i >= len(b) || b[i] != '[' {
		return i, syntaxErr(b, i, "expected array")
	}
	i = SkipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return i + 1, nil
	}
	for {
		var err error
		i = SkipWS(b, i)
		if i >= len(b) {
			return i, ErrEnd
		}
		if i, err = fn(i); err != nil {
			return i, err
		}
		i = SkipWS(b, i)
		if i >= len(b) {
			return i, ErrEnd
		}
		switch b[i] {
		case ',':
			i++
		case ']':
			return i + 1, nil
		default:
			return i, InvalidChar(b, i, "after array element")
		}
	}
}

// StringIs reports whether val is the JSON string s (s without escapes).
func StringIs(val []byte, s string) bool {
	val = TrimWS(val)
	return len(val) == len(s)+2 && val[0] == '"' && string(val[1:len(val)-1]) == s
}

// IsNull reports whether val is the literal null.
func IsNull(val []byte) bool { return string(TrimWS(val)) == "null" }

// StringLen returns the decoded byte length of a JSON string value (0 for
// anything else). \uXXXX escapes count as the UTF-8 length of their code unit.
func StringLen(val []byte) int64 {
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
