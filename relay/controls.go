package relay

import (
	"strings"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/openai"
)

// honouring narrows able to the nodes whose server honours the controls the
// request needs (openai.ControlTable): tool_choice "required" or a named
// function, and n > 1. A server that ignores them answers 200 with the
// opposite of what was asked, so such a request goes to a node that
// enforces them or is refused with parameter_not_supported. tool_choice
// "none" needs no routing: the upstream body offers no tools to a server
// that ignores it (openai.ChatRequest.AppendUpstreamBody).
func honouring(m *Model, able []*Backend, cr *openai.ChatRequest) ([]*Backend, error) {
	must := cr.Controls() &^ openai.ControlToolChoiceNone
	if must == 0 {
		return able, nil
	}
	var out []*Backend
	for _, b := range able {
		keep := 0
		for _, n := range b.Nodes {
			if n.Flavour.Honours(must) {
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
				if n.Flavour.Honours(must) {
					nb.Nodes = append(nb.Nodes, n)
				}
			}
			out = append(out, &nb)
		}
	}
	if len(out) > 0 {
		return out, nil
	}
	// Name the first control no node can honour (or the first asked, when
	// only the combination fails).
	c := must
	for _, k := range openai.Controls {
		if must&k == 0 {
			continue
		}
		any := false
		for _, b := range able {
			for _, n := range b.Nodes {
				any = any || n.Flavour.Honours(k)
			}
		}
		if !any {
			c = k
			break
		}
	}
	if c == must {
		for _, k := range openai.Controls {
			if must&k != 0 {
				c = k
				break
			}
		}
	}
	return nil, &tollgate.Error{Code: tollgate.CodeParameterNotSupported, Param: c.Param(),
		Message: "model " + m.ID + " cannot honour " + c.Name() + ": the servers behind it (" + flavoursOf(able) +
			") would ignore it and answer as if it were not set; " + hint(c)}
}

func hint(c openai.Control) string {
	if c == openai.ControlN {
		return "send n separate requests"
	}
	return `use tool_choice "auto", or another model`
}

// flavoursOf lists the distinct flavours of the backends' nodes.
func flavoursOf(bs []*Backend) string {
	var names []string
	seen := map[openai.Flavour]bool{}
	for _, b := range bs {
		for _, n := range b.Nodes {
			if !seen[n.Flavour] {
				seen[n.Flavour] = true
				names = append(names, string(n.Flavour))
			}
		}
	}
	return strings.Join(names, ", ")
}
