package openai

import "github.com/tollgate/tollgate/internal/jsonscan"

// OpeningEnd returns how many bytes of a validated messages array (a
// request's raw "messages" value) make its opening: everything up to the
// end of the first message whose role is neither system nor developer.
// Every later turn of a conversation resends the opening unchanged, and
// conversations that share a system prompt differ in it (their first
// question), so it names the conversation. The whole array when no such
// message exists.
func OpeningEnd(messages []byte) int {
	it := jsonscan.NewTrustedArrIter(messages)
	for raw, ok := it.Next(); ok; raw, ok = it.Next() {
		if raw[0] != '{' {
			continue
		}
		obj := jsonscan.NewTrustedObjIter(raw)
		for k, _, val, ok := obj.Next(); ok; k, _, val, ok = obj.Next() {
			if string(k) != "role" {
				continue
			}
			if !jsonscan.StringIs(val, "system") && !jsonscan.StringIs(val, "developer") {
				// raw is a slice of messages: its end is its offset plus its length.
				return cap(messages) - cap(raw) + len(raw)
			}
			break
		}
	}
	return len(messages)
}
