package config

import (
	"fmt"
	"strings"
	"testing"
)

// parseErr parses doc with every secret set and returns its error's lines.
func parseErr(t *testing.T, doc string) []string {
	t.Helper()
	_, err := Parse([]byte(doc), ".", func(string) string { return "x" })
	if err == nil {
		t.Fatalf("no error for:\n%s", doc)
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) > 1 {
		if want := fmt.Sprintf("%d problems:", len(lines)-1); lines[0] != want {
			t.Errorf("first line %q, want %q", lines[0], want)
		}
		lines = lines[1:]
		for i := range lines {
			lines[i] = strings.TrimPrefix(lines[i], "  ")
		}
	}
	return lines
}

// TestEveryProblemAtOnce: a value that does not parse (a duration) hides
// neither another that does not parse (a number) nor a validation error
// elsewhere (a rate); each is reported with its key path and its line.
func TestEveryProblemAtOnce(t *testing.T) {
	doc := strings.Replace(minimal, `rates: {input: "0.15", output: "0.6"}`, `rates: {input: "0.1234567", output: "0.6"}`, 1)
	doc = strings.Replace(doc, "context_length: 1000", "context_length: lots", 1)
	doc += "timeouts:\n  connect: 10 seconds\n"
	got := parseErr(t, doc)
	want := []string{
		`line 7: models[0].context_length: "lots" is not a whole number`,
		`line 13: models[0] (m).backends[0].rates.input: money: "0.1234567" has more than 6 decimals`,
		`line 22: timeouts.connect: "10 seconds" is not a duration such as "30s" or "5m"`,
	}
	if len(got) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("problem %d = %q, want it to start with %q", i, got[i], want[i])
		}
	}
	// context_length did not parse: "must be a positive number" would be a
	// second, misleading report of the same line.
	for _, l := range got {
		if strings.Contains(l, "positive number of tokens") {
			t.Errorf("a value that did not parse is reported again by validation: %s", l)
		}
	}
}

func TestUnknownKeySuggestsTheNearest(t *testing.T) {
	cases := []struct{ old, edit, want string }{
		// a missing letter, at the node level
		{`nodes: [{url: "http://10.0.0.1:8000/v1", key_env: NODE_KEY}]`,
			`nodes: [{url: "http://10.0.0.1:8000/v1", key_env: NODE_KEY, max_concurent: 4}]`,
			`line 14: models[0].backends[0].nodes[0].max_concurent: unknown key (did you mean max_concurrent?)`},
		// two letters swapped
		{`kind: chat`, "kind: chat\n    contxet_length: 5", `line 7: models[0].contxet_length: unknown key (did you mean context_length?)`},
		// a shared prefix farther than two edits
		{`store: {sqlite: data/t.db}`, `store: {sqlite: data/t.db, sqlite_sync: full}`, `line 3: store.sqlite_sync: unknown key (did you mean sqlite_synchronous?)`},
		// nothing near: the valid keys are listed
		{`listen: {api: "127.0.0.1:0"}`, `listen: {api: "127.0.0.1:0", port: 80}`, `line 2: listen.port: unknown key (valid here: admin, api, public, tls)`},
	}
	for _, c := range cases {
		doc := strings.Replace(minimal, c.old, c.edit, 1)
		if doc == minimal {
			t.Fatalf("edit %q changed nothing", c.edit)
		}
		got := parseErr(t, doc)
		if len(got) != 1 || got[0] != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.edit, got, c.want)
		}
	}
}

func TestRepeatedKeyAndMissingKeyLines(t *testing.T) {
	got := parseErr(t, minimal+"store: {sqlite: other.db}\n")
	if len(got) != 1 || got[0] != "line 21: store: key given twice (first on line 3)" {
		t.Errorf("repeated key: %q", got)
	}
	// A required key that is absent is reported at the mapping that lacks it.
	got = parseErr(t, strings.Replace(minimal, "        upstream_model: up\n", "", 1))
	if len(got) != 1 || !strings.HasPrefix(got[0], "line 10: models[0] (m).backends[0].upstream_model: required") {
		t.Errorf("missing key: %q", got)
	}
	// A mapping where a list belongs.
	got = parseErr(t, strings.Replace(minimal, `capabilities: [tools]`, `capabilities: {tools: true}`, 1))
	if len(got) != 1 || !strings.HasPrefix(got[0], "line 12: models[0].backends[0].capabilities: want a list") {
		t.Errorf("mapping for a list: %q", got)
	}
}

func TestEditDistance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		d    int
	}{{"", "", 0}, {"abc", "abc", 0}, {"max_concurent", "max_concurrent", 1}, {"ab", "ba", 1}, {"kitten", "sitting", 3}, {"", "abc", 3}} {
		if got := editDistance(c.a, c.b); got != c.d {
			t.Errorf("editDistance(%q, %q) = %d, want %d", c.a, c.b, got, c.d)
		}
	}
}
