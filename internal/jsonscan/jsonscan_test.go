package jsonscan

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/go-json-experiment/json/jsontext"
)

var samples = []string{
	`{}`, `[]`, `""`, `0`, `-0.5e+10`, `true`, `false`, `null`, `"a\"b\\"`, `"\u00e9\ud83d\ude00"`,
	`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi \"there\""}],"temperature":0.7}`,
	` { "a" : [ 1 , 2.5 , -3e2 , { "b" : null } ] , "c" : "}" } `,
	`{"a":{"b":{"c":[[[]]]}}}`,
	// Invalid.
	`{`, `[1,]`, `{"a":1,}`, `{"a" 1}`, `{a:1}`, `01`, `1.`, `-`, `1e`, `tru`, `nul`, `"abc`, "\"a\nb\"", `"\x"`, `"\u12g4"`,
	`[1 2]`, `{"a":1 "b":2}`, `{"a"}`, `[`, `]`, `{}}`, `"\`, `+1`, `.5`,
}

// SkipValue accepts exactly what encoding/json calls valid, and every error
// is ErrSyntax.
func TestSkipValueAgreesWithEncodingJSON(t *testing.T) {
	check := func(s string) {
		t.Helper()
		b := []byte(s)
		end, err := SkipValue(b, 0, 0)
		ok := err == nil && SkipWS(b, end) == len(b)
		if ok != json.Valid(b) {
			t.Errorf("%q: SkipValue says valid=%v (end %d, %v), encoding/json %v", s, ok, end, err, json.Valid(b))
		}
		if err != nil && !errors.Is(err, ErrSyntax) {
			t.Errorf("%q: %v is not ErrSyntax", s, err)
		}
	}
	for _, s := range samples {
		check(s)
	}
	// Every sample with one byte changed, dropped or cut short.
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte("{}[]\":,\\ 0123456789.eE+-tfnulrsa\n")
	for _, s := range samples {
		for range 200 {
			b := []byte(s)
			if len(b) == 0 {
				continue
			}
			k := r.IntN(len(b))
			switch r.IntN(3) {
			case 0:
				b[k] = alphabet[r.IntN(len(alphabet))]
			case 1:
				b = append(b[:k:k], b[k+1:]...)
			case 2:
				b = b[:k]
			}
			check(string(b))
			// The fast skips never panic on it, valid or not.
			SkipValueFast(b, 0)
			it := NewTrustedObjIter(b)
			for _, _, _, ok := it.Next(); ok; _, _, _, ok = it.Next() {
			}
			ai := NewTrustedArrIter(b)
			for _, ok := ai.Next(); ok; _, ok = ai.Next() {
			}
		}
	}
}

// Errors are worded as encoding/json words them (the simulator's Ollama
// flavour answers with them), with the offset; input that ends early is
// ErrEnd.
func TestErrors(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"a" 1}`, "invalid character '1' after object key at offset 5"},
		{`{"a":1 "b":2}`, "invalid character '\"' after object key:value pair at offset 7"},
		{`[1 2]`, "invalid character '2' after array element at offset 3"},
		{`{a:1}`, "invalid character 'a' looking for beginning of object key string at offset 1"},
		{`[x]`, "invalid character 'x' looking for beginning of value at offset 1"},
		{`[trxe]`, "invalid character 'x' in literal true (expecting 'u') at offset 3"},
		{`"\x"`, `invalid character 'x' in string escape code at offset 2`},
		{`"\u12g4"`, `invalid character 'g' in \u hexadecimal character escape at offset 5`},
		{"\"a\nb\"", `invalid character '\n' in string literal at offset 2`},
		{`1.x`, "invalid character 'x' after decimal point in numeric literal at offset 2"},
		{`{"a":`, "unexpected end of JSON input"},
		{`[tr`, "unexpected end of JSON input"},
		{`"abc`, "unexpected end of JSON input"},
	} {
		_, err := SkipValue([]byte(c.in), 0, 0)
		if err == nil || err.Error() != c.want {
			t.Errorf("%s: %v, want %q", c.in, err, c.want)
		}
	}
	deep := []byte(strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth))
	if _, err := SkipValue(deep, 0, 0); err != nil {
		t.Errorf("%d levels: %v", MaxDepth, err)
	}
	deeper := []byte(strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1))
	if _, err := SkipValue(deeper, 0, 0); !errors.Is(err, ErrTooDeep) || !errors.Is(err, ErrSyntax) {
		t.Errorf("%d levels: %v, want ErrTooDeep", MaxDepth+1, err)
	}
	_, err := EachMember([]byte(`{"a":1 ]`), 0, func(_ []byte, vs int) (int, error) { return SkipValue([]byte(`{"a":1 ]`), vs, 1) })
	if err == nil || err.Error() != "invalid character ']' after object key:value pair at offset 7" {
		t.Errorf("EachMember: %v", err)
	}
}

// The iterators hand back each member's decoded key, its key as written and
// its raw value; the validating one refuses what the trusted one, which
// only follows quotes and brackets, lets through.
func TestObjIter(t *testing.T) {
	body := []byte(` {"a":1, "b\u0063":{"x":[1,"]"]}, "a":"two" , "e":[]} `)
	var got []string
	it := NewObjIter(body)
	for k, raw, v, ok := it.Next(); ok; k, raw, v, ok = it.Next() {
		got = append(got, string(k)+"|"+string(raw)+"|"+string(v))
	}
	want := []string{`a|"a"|1`, `bc|"b\u0063"|{"x":[1,"]"]}`, `a|"a"|"two"`, `e|"e"|[]`}
	if strings.Join(got, " ") != strings.Join(want, " ") || !it.RestOK() {
		t.Errorf("members %q (rest ok %v), want %q", got, it.RestOK(), want)
	}
	var fields []string
	if err := EachTrustedField(body, func(k, v []byte) error { fields = append(fields, string(k)); return nil }); err != nil || strings.Join(fields, ",") != "a,bc,a,e" {
		t.Errorf("EachTrustedField: %q, %v", fields, err)
	}
	for _, bad := range []string{`{"a":[1,}`, `{"a":tru}`} {
		it := NewObjIter([]byte(bad))
		for _, _, _, ok := it.Next(); ok; _, _, _, ok = it.Next() {
		}
		if it.Err() == nil {
			t.Errorf("%s: the validating iterator took it", bad)
		}
	}
	for _, cut := range []string{`{"a":"x`, `{"a":[1,2`, `{"a`, `{"a":`, `{"a":1`} {
		it := NewTrustedObjIter([]byte(cut))
		for _, _, _, ok := it.Next(); ok; _, _, _, ok = it.Next() {
		}
		if !errors.Is(it.Err(), ErrSyntax) {
			t.Errorf("%s: trusted iterator ended with %v, want ErrSyntax", cut, it.Err())
		}
	}
	var elems []string
	ai := NewArrIter([]byte(`[1, "a", {"b":[2]}, null]`))
	for v, ok := ai.Next(); ok; v, ok = ai.Next() {
		elems = append(elems, string(v))
	}
	if strings.Join(elems, " ") != `1 "a" {"b":[2]} null` || ai.Err() != nil {
		t.Errorf("elements %q, %v", elems, ai.Err())
	}
}

func TestStrings(t *testing.T) {
	for _, c := range []struct {
		val, want string
		ok        bool
		n         int64
	}{
		{`"plain"`, "plain", true, 5},
		{` "a\"b\\c\/d\n" `, "a\"b\\c/d\n", true, 0},
		{`"\u00e9"`, "é", true, 2},
		{`"\ud83d\ude00"`, "😀", true, 4},
		{`12`, "", false, 0},
		{`null`, "", false, 0},
	} {
		s, ok := String([]byte(c.val))
		if s != c.want || ok != c.ok {
			t.Errorf("String(%s) = %q, %v; want %q, %v", c.val, s, ok, c.want, c.ok)
		}
		if c.n != 0 {
			if n := StringLen([]byte(c.val)); n != c.n || int(n) != len(c.want) {
				t.Errorf("StringLen(%s) = %d, want %d", c.val, n, c.n)
			}
		}
	}
	if !StringIs([]byte(` "user" `), "user") || StringIs([]byte(`"users"`), "user") || !IsNull([]byte(" null")) || IsNull([]byte(`"null"`)) {
		t.Error("StringIs or IsNull")
	}
	raw, next, err := ScanString([]byte(`{"k\"ey":1}`), 1)
	if string(raw) != `k\"ey` || next != 8 || err != nil {
		t.Errorf("ScanString = %q, %d, %v", raw, next, err)
	}
	if s, ok := Unquote(raw); s != `k"ey` || !ok {
		t.Errorf("Unquote(%s) = %q, %v", raw, s, ok)
	}
}

// benchBody is a chat request as clients send it: a few scalars and a
// conversation.
func benchBody() []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":"llama-3.1-8b","stream":true,"temperature":0.7,"max_tokens":512,"messages":[`)
	for i := range 20 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"role":"user","content":"Write one short sentence about gateways, with \"quotes\" and a number 12.5e3."}`)
	}
	b.WriteString(`],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"integer"}}}}}]}`)
	return b.Bytes()
}

// BenchmarkWalk is what the request parser does first: walk the top-level
// members of a request, validating each value and keeping it raw. Side by
// side: this package's iterator, and go-json-experiment's jsontext decoder
// (the coming encoding/json/jsontext), which does the same walk.
//
//	go test -run '^$' -bench Walk -benchmem ./internal/jsonscan/
func BenchmarkWalk(b *testing.B) {
	body := benchBody()
	b.Run("jsonscan", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			n := 0
			it := NewObjIter(body)
			for _, _, v, ok := it.Next(); ok; _, _, v, ok = it.Next() {
				n += len(v)
			}
			if !it.RestOK() || n == 0 {
				b.Fatal("bad walk")
			}
		}
	})
	b.Run("jsontext", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		r := bytes.NewReader(body)
		dec := jsontext.NewDecoder(r)
		for b.Loop() {
			r.Reset(body)
			dec.Reset(r)
			n := 0
			if _, err := dec.ReadToken(); err != nil {
				b.Fatal(err)
			}
			for dec.PeekKind() != '}' {
				if _, err := dec.ReadToken(); err != nil {
					b.Fatal(err)
				}
				v, err := dec.ReadValue()
				if err != nil {
					b.Fatal(err)
				}
				n += len(v)
			}
			if _, err := dec.ReadToken(); err != nil || n == 0 {
				b.Fatal("bad walk", err)
			}
		}
	})
}
