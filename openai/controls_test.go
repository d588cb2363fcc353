package openai

import (
	"os"
	"strings"
	"testing"
)

// controlTableMarkdown renders ControlTable as docs/streams.md shows it.
func controlTableMarkdown() string {
	var b strings.Builder
	b.WriteString("| flavour |")
	for _, c := range Controls {
		b.WriteString(" `" + c.Name() + "` |")
	}
	b.WriteString(" source |\n|---|")
	for range Controls {
		b.WriteString("---|")
	}
	b.WriteString("---|\n")
	for _, row := range ControlTable {
		b.WriteString("| `" + string(row.Flavour) + "` |")
		for _, c := range Controls {
			if row.Honoured&c != 0 {
				b.WriteString(" honoured |")
			} else {
				b.WriteString(" **ignored** |")
			}
		}
		b.WriteString(" " + row.Source + " |\n")
	}
	return b.String()
}

// docs/streams.md lists the same table the relay routes by.
func TestControlTableIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/streams.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := controlTableMarkdown(); !strings.Contains(string(doc), want) {
		t.Fatalf("docs/streams.md does not hold the controls table as ControlTable has it; paste:\n%s", want)
	}
	for _, f := range Flavours {
		found := false
		for _, row := range ControlTable {
			found = found || row.Flavour == f
		}
		if !found {
			t.Errorf("flavour %s has no row in ControlTable", f)
		}
	}
}

func TestRequestControls(t *testing.T) {
	tools := `"tools":[{"type":"function","function":{"name":"f"}}]`
	for _, c := range []struct {
		body string
		want Control
	}{
		{`{"model":"m","messages":[{"role":"user","content":"x"}],` + tools + `}`, 0},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],` + tools + `,"tool_choice":"auto"}`, 0},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],` + tools + `,"tool_choice":"none"}`, ControlToolChoiceNone},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"required"}`, 0}, // no tools offered: nothing to enforce
		{`{"model":"m","messages":[{"role":"user","content":"x"}],` + tools + `,"tool_choice":"required","n":2}`, ControlToolChoiceRequired | ControlN},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],` + tools + `,"tool_choice":{"type":"function","function":{"name":"f"}}}`, ControlToolChoiceNamed},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"functions":[{"name":"f"}],"function_call":{"name":"f"}}`, ControlToolChoiceNamed},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"n":1}`, 0},
	} {
		r, err := ParseChatRequest([]byte(c.body))
		if err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		if got := r.Controls(); got != c.want {
			t.Errorf("%s: controls %b, want %b", c.body, got, c.want)
		}
	}
	if Ollama.Honours(ControlN) || !VLLM.Honours(ControlN|ControlToolChoiceNamed) || LlamaCpp.Honours(ControlToolChoiceNamed) || !LlamaCpp.Honours(ControlN) {
		t.Fatal("ControlTable disagrees with the captures")
	}
}
