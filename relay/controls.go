package relay

import (
	"github.com/tollgate/tollgate/openai"
)

// honouring narrows able to the nodes whose server honours the controls the
// request needs (openai.ControlTable): tool_choice "required" or a named
// function, and n > 1. A server that ignores them answers 200 with the
// opposite of what was asked, so such a request goes to a node that
// honours them; what no node of the model honours is returned as emulate,
// for tollgate to serve itself (emulate.go): n as n calls, a tool choice
// through the server's structured output. A control is never refused.
// tool_choice "none" needs no routing: the upstream body offers no tools to
// a server that ignores it (openai.ChatRequest.AppendUpstreamBody).
func honouring(able []*Backend, cr *openai.ChatRequest) (out []*Backend, emulate openai.Control) {
	must := cr.Controls() &^ openai.ControlToolChoiceNone
	if must == 0 {
		return able, 0
	}
	// Every control honoured by a node; else the tool choice honoured and
	// n emulated (n costs calls, not fidelity); else n honoured and the
	// tool choice emulated; else both emulated, on any node.
	for _, keep := range []openai.Control{must, must &^ openai.ControlN, must & openai.ControlN, 0} {
		if keep == 0 {
			return able, must
		}
		if out = withControls(able, keep); len(out) > 0 {
			return out, must &^ keep
		}
	}
	return able, must
}

// withControls is able narrowed to the nodes whose server honours every
// control in c.
func withControls(able []*Backend, c openai.Control) []*Backend {
	var out []*Backend
	for _, b := range able {
		keep := 0
		for _, n := range b.Nodes {
			if n.Flavour.Honours(c) {
				keep++
			}
		}
		switch {
		case keep == len(b.Nodes):
			out = append(out, b)
		case keep > 0:
			// A copy of the backend with only those nodes: its prices, class
			// and health stay the backend's (nodes are shared, not copied).
			nb := *b
			nb.Nodes = make([]*Node, 0, keep)
			for _, n := range b.Nodes {
				if n.Flavour.Honours(c) {
					nb.Nodes = append(nb.Nodes, n)
				}
			}
			out = append(out, &nb)
		}
	}
	return out
}
