package idempotency

import (
	"bytes"
	"testing"
)

func TestInspect(t *testing.T) {
	for _, tc := range []struct {
		body   string
		model  string
		stream bool
	}{
		{`{"model":"m","stream":true}`, `"m"`, true},
		{` { "stream" : true , "model" : "m" } `, `"m"`, true},
		{`{"model":"m","stream":false}`, `"m"`, false},
		{`{"model":"m","stream":null}`, `"m"`, false},
		{`{"model":"m"}`, `"m"`, false},
		// Only the top level counts.
		{`{"messages":[{"role":"user","content":"\"stream\":true"}],"x":{"stream":true},"model":"m"}`, `"m"`, false},
		{`{"metadata":{"model":"n"},"model":"m","tools":[{"a":"}]"}],"stream":true}`, `"m"`, true},
		// The last of repeated keys wins, as in the relay's parser.
		{`{"stream":true,"stream":false,"model":"a","model":"b"}`, `"b"`, false},
		// An escaped key is still the key.
		{`{"str\u0065am":true,"model":"m"}`, `"m"`, true},
		{`{"model":"m","stream":"true"}`, `"m"`, false},
		{`[1]`, ``, false},
		{`{"model":"m","stream":tr`, ``, false},
		{``, ``, false},
	} {
		m, s := inspect([]byte(tc.body))
		if string(m) != tc.model || s != tc.stream {
			t.Errorf("inspect(%s) = %s, %v; want %s, %v", tc.body, m, s, tc.model, tc.stream)
		}
	}
}

func TestFingerprint(t *testing.T) {
	a := Fingerprint([]byte(`"m"`), []byte(`{"model":"m","messages":[{"content":"a b"}]}`))
	same := Fingerprint([]byte(`"m"`), []byte("{\n  \"model\": \"m\",\r\n\t\"messages\": [ {\"content\": \"a b\"} ]\n}\n"))
	if !bytes.Equal(a, same) || len(a) != 32 {
		t.Errorf("whitespace outside strings changed the fingerprint")
	}
	for _, other := range [][2]string{
		{`"m"`, `{"model":"m","messages":[{"content":"a  b"}]}`},     // whitespace inside a string counts
		{`"m"`, `{"model":"m","messages":[{"content":"a\u0020b"}]}`}, // so does an escape
		{`"n"`, `{"model":"m","messages":[{"content":"a b"}]}`},      // and the model
		{`"m"`, `{"messages":[{"content":"a b"}],"model":"m"}`},      // and the order of keys
	} {
		if bytes.Equal(a, Fingerprint([]byte(other[0]), []byte(other[1]))) {
			t.Errorf("%s %s has the same fingerprint", other[0], other[1])
		}
	}
	// An escaped quote does not end a string: the space after it is inside.
	x := Fingerprint(nil, []byte(`{"a":"\" b"}`))
	y := Fingerprint(nil, []byte(`{"a":"\"b"}`))
	if bytes.Equal(x, y) {
		t.Error("a space after an escaped quote was dropped")
	}
}

func BenchmarkFingerprint(b *testing.B) {
	body := bytes.Repeat([]byte(`{"role":"user","content":"Hello there, how are you today?"},`), 1000)
	body = append(append([]byte(`{"model":"m","messages":[`), body[:len(body)-1]...), "]}"...)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		m, _ := inspect(body)
		Fingerprint(m, body)
	}
}
