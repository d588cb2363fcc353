package simulate

import "github.com/tollgate/tollgate/internal/jsonscan"

// parseInt reads an integer value at b[i] (a float with a zero fraction is
// accepted, as Python servers do). ok is false for anything else.
func parseInt(b []byte, i int) (v int, next int, ok bool, err error) {
	next, err = jsonscan.SkipValue(b, i, 1)
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
