package openai

import "testing"

func TestOpeningEnd(t *testing.T) {
	for _, c := range []struct{ msgs, want string }{
		{`[{"role":"system","content":"s"},{"role":"user","content":"q1"},{"role":"assistant","content":"a1"}]`,
			`[{"role":"system","content":"s"},{"role":"user","content":"q1"}`},
		{`[ {"content":"d","role":"developer"} , {"content":"q","role":"user"} ]`, `[ {"content":"d","role":"developer"} , {"content":"q","role":"user"}`},
		{`[{"role":"user","content":"q1"},{"role":"assistant","content":"a1"}]`, `[{"role":"user","content":"q1"}`},
		{`[{"role":"system","content":"only"}]`, `[{"role":"system","content":"only"}]`},
	} {
		if got := OpeningEnd([]byte(c.msgs)); got != len(c.want) || c.msgs[:got] != c.want {
			t.Errorf("OpeningEnd(%s) = %d (%q), want %q", c.msgs, got, c.msgs[:min(got, len(c.msgs))], c.want)
		}
	}
	// A slice of a larger body, as the parser hands it over.
	body := []byte(`{"messages":[{"role":"system","content":"s"},{"role":"user","content":"q"}],"model":"m"}`)
	msgs := body[12:75]
	if got := OpeningEnd(msgs); string(msgs[:got]) != `[{"role":"system","content":"s"},{"role":"user","content":"q"}` {
		t.Errorf("in a body: %q", msgs[:got])
	}
}
