// Package tollgate holds the domain of the tollgate chat-completion service:
// the plain types (catalogue, accounts, keys, money), the closed list of
// error codes, and the small interfaces that the store packages implement.
// It imports nothing of the project; every other package may import it.
package tollgate

import (
	"slices"
	"strings"
)

// Capability is something a model (or one backend of it) can do beyond plain
// text chat. Clients see these names in GET /v1/models.
type Capability string

const (
	CapTools      Capability = "tools"
	CapReasoning  Capability = "reasoning"
	CapImageInput Capability = "image_input"
	CapPDFInput   Capability = "pdf_input"
	CapWebSearch  Capability = "web_search"
)

// AllCapabilities lists every capability in the order they are shown.
var AllCapabilities = []Capability{CapTools, CapReasoning, CapImageInput, CapPDFInput, CapWebSearch}

// Capabilities is a set of capabilities as a bit mask, cheap to compare on the
// hot path.
type Capabilities uint8

func capBit(c Capability) Capabilities {
	switch c {
	case CapTools:
		return 1
	case CapReasoning:
		return 2
	case CapImageInput:
		return 4
	case CapPDFInput:
		return 8
	case CapWebSearch:
		return 16
	}
	return 0
}

// ParseCapability reports whether s names a known capability.
func ParseCapability(s string) (Capability, bool) {
	c := Capability(strings.TrimSpace(s))
	return c, capBit(c) != 0
}

// NewCapabilities builds a set from names; unknown names are ignored (config
// validation rejects them before this is called).
func NewCapabilities(cs ...Capability) Capabilities {
	var s Capabilities
	for _, c := range cs {
		s |= capBit(c)
	}
	return s
}

// Has reports whether c is in the set.
func (s Capabilities) Has(c Capability) bool { return s&capBit(c) != 0 }

// Covers reports whether every capability of need is in s.
func (s Capabilities) Covers(need Capabilities) bool { return s&need == need }

// Union returns s ∪ o.
func (s Capabilities) Union(o Capabilities) Capabilities { return s | o }

// Missing returns the capabilities of need that s lacks, in display order.
func (s Capabilities) Missing(need Capabilities) []Capability {
	var out []Capability
	for _, c := range AllCapabilities {
		if need.Has(c) && !s.Has(c) {
			out = append(out, c)
		}
	}
	return out
}

// List returns the capabilities in display order.
func (s Capabilities) List() []Capability {
	out := make([]Capability, 0, len(AllCapabilities))
	for _, c := range AllCapabilities {
		if s.Has(c) {
			out = append(out, c)
		}
	}
	return out
}

// Strings returns the names in display order (never nil, so JSON shows []).
func (s Capabilities) Strings() []string {
	out := []string{}
	for _, c := range s.List() {
		out = append(out, string(c))
	}
	return out
}

// BackendClass is the class of a backend: the GPU network or the upstream
// fallback provider, named `network` and `fallback` in /pricing.
type BackendClass string

const (
	ClassNetwork  BackendClass = "network"
	ClassFallback BackendClass = "fallback"
)

// ModelKind is the role of a model in the catalogue (docs/api.md: a coder,
// a general chat model, a cheap model).
type ModelKind string

const (
	KindCoder ModelKind = "coder"
	KindChat  ModelKind = "chat"
	KindCheap ModelKind = "cheap"
)

// ValidKind reports whether k is one of the three kinds.
func ValidKind(k ModelKind) bool {
	return slices.Contains([]ModelKind{KindCoder, KindChat, KindCheap}, k)
}
