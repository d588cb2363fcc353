package simulate

import (
	"errors"
	"fmt"
)

// A tiny validating JSON scanner. The hot path of the simulator reads a few
// fields of the request body; doing that with encoding/json reflection costs
// more than the whole HTTP exchange, so the request is walked by hand and only
// the rare parts (tool schemas) go through encoding/json.

// syntaxError is a malformed body: offset is where the scanner gave up.
type syntaxError struct {
	offset int
	msg    string
}

func (e *syntaxError) Error() string { return fmt.Sprintf("%s at offset %d", e.msg, e.offset) }

var errEnd = errors.New("unexpected end of JSON input")

func synErr(i int, msg string) error { return &syntaxError{offset: i, msg: msg} }

func skipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// scanString expects b[i] == '"' and returns the raw (still escaped) bytes
// between the quotes and the index after the closing quote.
func scanString(b []byte, i int) (raw []byte, next int, err error) {
	if i >= len(b) || b[i] != '"' {
		return nil, i, synErr(i, "expected string")
	}
	start := i + 1
	for j := start; j < len(b); j++ {
		switch c := b[j]; {
		case c == '\\':
			j++
		case c == '"':
			return b[start:j], j + 1, nil
		case c < 0x20:
			return nil, j, synErr(j, "control character in string")
		}
	}
	return nil, len(b), errEnd
}

// skipValue validates the value starting at b[i] and returns the index after it.
func skipValue(b []byte, i int) (int, error) {
	return skipValueDepth(b, i, 0)
}

func skipValueDepth(b []byte, i, depth int) (int, error) {
	if depth > 200 {
		return i, synErr(i, "nesting too deep")
	}
	i = skipWS(b, i)
	if i >= len(b) {
		return i, errEnd
	}
	switch c := b[i]; {
	case c == '"':
		_, next, err := scanString(b, i)
		return next, err
	case c == '{':
		return eachMember(b, i, func(_ []byte, vs int) (int, error) { return skipValueDepth(b, vs, depth+1) })
	case c == '[':
		return eachElement(b, i, func(vs int) (int, error) { return skipValueDepth(b, vs, depth+1) })
	case c == 't':
		return literal(b, i, "true")
	case c == 'f':
		return literal(b, i, "false")
	case c == 'n':
		return literal(b, i, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		j := i + 1
		for j < len(b) {
			d := b[j]
			if (d >= '0' && d <= '9') || d == '.' || d == 'e' || d == 'E' || d == '+' || d == '-' {
				j++
				continue
			}
			break
		}
		return j, nil
	default:
		return i, synErr(i, fmt.Sprintf("invalid character %q looking for beginning of value", c))
	}
}

func literal(b []byte, i int, lit string) (int, error) {
	if len(b)-i < len(lit) {
		return len(b), errEnd
	}
	if string(b[i:i+len(lit)]) != lit {
		return i, synErr(i, "invalid literal")
	}
	return i + len(lit), nil
}

// eachMember walks the object at b[i]; fn receives the raw key and the index
// where the value starts and must return the index after the value.
func eachMember(b []byte, i int, fn func(key []byte, vs int) (int, error)) (int, error) {
	i = skipWS(b, i)
	if i >= len(b) {
		return i, errEnd
	}
	if b[i] != '{' {
		return i, synErr(i, "expected object")
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, nil
	}
	for {
		i = skipWS(b, i)
		key, next, err := scanString(b, i)
		if err != nil {
			return next, err
		}
		i = skipWS(b, next)
		if i >= len(b) {
			return i, errEnd
		}
		if b[i] != ':' {
			return i, synErr(i, "expected ':' after object key")
		}
		i = skipWS(b, i+1)
		if i >= len(b) {
			return i, errEnd
		}
		if i, err = fn(key, i); err != nil {
			return i, err
		}
		i = skipWS(b, i)
		if i >= len(b) {
			return i, errEnd
		}
		switch b[i] {
		case ',':
			i++
		case '}':
			return i + 1, nil
		default:
			return i, synErr(i, "expected ',' or '}' after object value")
		}
	}
}

// eachElement walks the array at b[i]; fn receives the index where each
// element starts and returns the index after it.
func eachElement(b []byte, i int, fn func(vs int) (int, error)) (int, error) {
	i = skipWS(b, i)
	if i >= len(b) {
		return i, errEnd
	}
	if b[i] != '[' {
		return i, synErr(i, "expected array")
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return i + 1, nil
	}
	for {
		var err error
		i = skipWS(b, i)
		if i >= len(b) {
			return i, errEnd
		}
		if i, err = fn(i); err != nil {
			return i, err
		}
		i = skipWS(b, i)
		if i >= len(b) {
			return i, errEnd
		}
		switch b[i] {
		case ',':
			i++
		case ']':
			return i + 1, nil
		default:
			return i, synErr(i, "expected ',' or ']' after array element")
		}
	}
}

// parseInt reads an integer value at b[i] (a float with a zero fraction is
// accepted, as Python servers do). ok is false for anything else.
func parseInt(b []byte, i int) (v int, next int, ok bool, err error) {
	next, err = skipValue(b, i)
	if err != nil {
		return 0, next, false, err
	}
	raw := b[i:next]
	neg := false
	if len(raw) > 0 && raw[0] == '-' {
		neg = true
		raw = raw[1:]
	}
	if len(raw) == 0 {
		return 0, next, false, nil
	}
	for k, c := range raw {
		if c == '.' {
			for _, d := range raw[k+1:] {
				if d != '0' {
					return 0, next, false, nil
				}
			}
			break
		}
		if c < '0' || c > '9' {
			return 0, next, false, nil
		}
		if v > 1<<40 {
			return 0, next, false, nil
		}
		v = v*10 + int(c-'0')
	}
	if neg {
		v = -v
	}
	return v, next, true, nil
}

// unquote turns the raw bytes of a JSON string into a Go string.
func unquote(raw []byte) string {
	hasEscape := false
	for _, c := range raw {
		if c == '\\' {
			hasEscape = true
			break
		}
	}
	if !hasEscape {
		return string(raw)
	}
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' || i+1 >= len(raw) {
			out = append(out, c)
			continue
		}
		i++
		switch raw[i] {
		case 'n':
			out = append(out, '\n')
		case 't':
			out = append(out, '\t')
		case 'r':
			out = append(out, '\r')
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'u':
			if i+4 < len(raw) {
				var r rune
				for _, h := range raw[i+1 : i+5] {
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
				out = append(out, string(r)...)
				i += 4
			}
		default:
			out = append(out, raw[i])
		}
	}
	return string(out)
}
