package openai

// OpeningEnd returns how many bytes of a validated messages array (a
// request's raw "messages" value) make its opening: everything up to the
// end of the first message whose role is neither system nor developer.
// Every later turn of a conversation resends the opening unchanged, and
// conversations that share a system prompt differ in it (their first
// question), so it names the conversation. The whole array when no such
// message exists.
func OpeningEnd(messages []byte) int {
	it := newTrustedArrIter(messages)
	for raw, ok := it.next(); ok; raw, ok = it.next() {
		if raw[0] != '{' {
			continue
		}
		obj := newTrustedObjIter(raw)
		for k, _, val, ok := obj.next(); ok; k, _, val, ok = obj.next() {
			if string(k) != "role" {
				continue
			}
			if !jsonStringIs(val, "system") && !jsonStringIs(val, "developer") {
				// raw is a slice of messages: its end is its offset plus its length.
				return cap(messages) - cap(raw) + len(raw)
			}
			break
		}
	}
	return len(messages)
}
