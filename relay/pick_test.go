package relay

import (
	"testing"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/openai"
)

func TestCapabilityChecks(t *testing.T) {
	m := &Model{ID: "m", Backends: []*Backend{
		{Class: tollgate.ClassNetwork, Caps: tollgate.NewCapabilities(tollgate.CapTools), Nodes: []*Node{{Class: tollgate.ClassNetwork}}},
		{Class: tollgate.ClassFallback, Caps: tollgate.NewCapabilities(tollgate.CapTools, tollgate.CapReasoning), Nodes: []*Node{{Class: tollgate.ClassFallback}}},
	}}
	m.Caps = m.Backends[0].Caps | m.Backends[1].Caps
	param := func(c tollgate.Capability) string { return "field-" + string(c) }
	if _, err := checkCapabilities(m, tollgate.NewCapabilities(tollgate.CapImageInput), param); tollgate.ErrorCode(err) != tollgate.CodeCapabilityNotSupported {
		t.Fatalf("image: %v", err)
	} else if err.(*tollgate.Error).Param != "field-image_input" {
		t.Fatalf("param = %q", err.(*tollgate.Error).Param)
	}
	able, err := checkCapabilities(m, tollgate.NewCapabilities(tollgate.CapTools, tollgate.CapReasoning), param)
	if err != nil || len(able) != 1 || able[0].Class != tollgate.ClassFallback {
		t.Fatalf("tools+reasoning: %v %v", able, err)
	}
	m.Backends[1].Caps = tollgate.NewCapabilities(tollgate.CapReasoning)
	if _, err := checkCapabilities(m, tollgate.NewCapabilities(tollgate.CapTools, tollgate.CapReasoning), param); tollgate.ErrorCode(err) != tollgate.CodeCapabilityCombinationUnsupported {
		t.Fatalf("split capabilities: %v", err)
	}
}

// The hold counts every image as the model's image_tokens (the catalogue
// puts 2,000 there unless the config says), never above the context.
func TestPromptBoundCountsImagesAtTheModelsFigure(t *testing.T) {
	cr, err := openai.ParseChatRequest([]byte(`{"model":"m","messages":[{"role":"user","content":[` +
		`{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"https://x/a.png"}},` +
		`{"type":"image_url","image_url":{"url":"https://x/b.png"}}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if cr.Images != 2 {
		t.Fatalf("images = %d", cr.Images)
	}
	base := cr.PromptBytes + 64
	for _, c := range []struct {
		imageTokens, context, want int64
	}{
		{DefaultImageTokens, 1 << 20, base + 2*DefaultImageTokens},
		{16384, 1 << 20, base + 2*16384},
		{16384, 20000, 20000}, // never above the context
	} {
		m := &Model{ContextLength: c.context, ImageTokens: c.imageTokens}
		if got := promptBound(cr, m); got != c.want {
			t.Errorf("image_tokens %d, context %d: bound %d, want %d", c.imageTokens, c.context, got, c.want)
		}
	}
}
