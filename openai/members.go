package openai

// Member is one top-level member of a JSON object to set in a body:
// Value is the member's raw JSON, or nil to remove the member.
type Member struct {
	Key   string
	Value []byte
}

// ReplaceMembers appends body (a JSON object, such as AppendUpstreamBody's
// output) to dst with the given members set: a member already in body is
// replaced where it stands (or removed when its Value is nil), the others
// are added at the end. Every other member is kept byte for byte. It reports
// false, appending nothing, if body is not a valid JSON object.
func ReplaceMembers(dst, body []byte, set []Member) ([]byte, bool) {
	fields, err := splitObject(body)
	if err != nil {
		return dst, false
	}
	done := make([]bool, len(set))
	dst = append(dst, '{')
	first := true
	write := func(rawKey []byte, key string, val []byte) {
		if !first {
			dst = append(dst, ',')
		}
		first = false
		if rawKey != nil {
			dst = append(dst, rawKey...)
		} else {
			dst = appendJSONString(dst, key)
		}
		dst = append(dst, ':')
		dst = append(dst, val...)
	}
	for _, f := range fields {
		val := f.val
		for i, m := range set {
			if m.Key == f.key {
				val, done[i] = m.Value, true
				break
			}
		}
		if val != nil {
			write(f.rawKey, f.key, val)
		}
	}
	for i, m := range set {
		if !done[i] && m.Value != nil {
			write(nil, m.Key, m.Value)
		}
	}
	return append(dst, '}'), true
}
