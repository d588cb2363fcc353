package simulate

import (
	"strconv"
	"unicode/utf8"
)

// Append-based JSON writing: the answers are built by hand into a reused
// buffer, in each server's own key order, without reflection.

const hexDigits = "0123456789abcdef"

func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	b = appendEscaped(b, s)
	return append(b, '"')
}

// appendPieces writes the pieces as one JSON string without joining them.
func appendPieces(b []byte, ps []string) []byte {
	b = append(b, '"')
	for _, p := range ps {
		b = appendEscaped(b, p)
	}
	return append(b, '"')
}

func appendEscaped(b []byte, s string) []byte {
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"':
				b = append(b, '\\', '"')
			case '\\':
				b = append(b, '\\', '\\')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		i += size
	}
	return append(b, s[start:]...)
}

func appendInt(b []byte, n int) []byte { return strconv.AppendInt(b, int64(n), 10) }

func appendFloat(b []byte, f float64) []byte { return strconv.AppendFloat(b, f, 'f', -1, 64) }

// appendKey writes "key": after a comma unless first.
func appendNull(b []byte) []byte { return append(b, "null"...) }

func appendStringOrNull(b []byte, s string, null bool) []byte {
	if null {
		return appendNull(b)
	}
	return appendJSONString(b, s)
}
