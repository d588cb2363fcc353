package server

import (
	"net/http"
	"strconv"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/relay"
)

// Models is GET /v1/models: the reference list shape (object, data[] with id,
// object, created, owned_by) plus what clients need before they send images,
// files, tools or reasoning: capabilities, limits, and each backend's
// capabilities and rates (a combination only some backends offer shows here).
// No key needed, as on OpenRouter.
func (s *Server) Models(w http.ResponseWriter, r *http.Request) error {
	cat := s.Relay.Catalog()
	out := make([]byte, 0, 2048)
	out = append(out, `{"object":"list","data":[`...)
	for i, m := range cat.Models {
		if i > 0 {
			out = append(out, ',')
		}
		out = appendModel(out, m, cat.Created)
	}
	out = append(out, "]}\n"...)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(out)))
	if r.Method != http.MethodHead {
		_, _ = w.Write(out)
	}
	return nil
}

func appendModel(out []byte, m *relay.Model, created int64) []byte {
	out = append(out, `{"id":`...)
	out = strconv.AppendQuote(out, m.ID)
	out = append(out, `,"object":"model","created":`...)
	out = strconv.AppendInt(out, created, 10)
	out = append(out, `,"owned_by":`...)
	out = strconv.AppendQuote(out, m.OwnedBy)
	out = append(out, `,"kind":`...)
	out = strconv.AppendQuote(out, string(m.Kind))
	out = append(out, `,"capabilities":`...)
	out = appendCaps(out, m.Caps)
	out = append(out, `,"context_length":`...)
	out = strconv.AppendInt(out, m.ContextLength, 10)
	out = append(out, `,"max_output_tokens":`...)
	out = strconv.AppendInt(out, m.MaxOutputTokens, 10)
	out = append(out, `,"pricing":{"unit":"per_1m_tokens","currency":"USD"`...)
	for _, class := range []tollgate.BackendClass{tollgate.ClassNetwork, tollgate.ClassFallback} {
		if b := firstOfClass(m, class); b != nil {
			out = append(out, `,"`...)
			out = append(out, class...)
			out = append(out, `":`...)
			out = appendPrices(out, b.Prices)
		}
	}
	if m.Caps.Has(tollgate.CapWebSearch) {
		// USD per web search that ran (docs/api.md "Web search").
		out = append(out, `,"web_search":"`...)
		out = append(out, m.SearchPrice.String()...)
		out = append(out, '"')
	}
	out = append(out, `},"backends":[`...)
	for i, b := range m.Backends {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"class":"`...)
		out = append(out, b.Class...)
		out = append(out, `","capabilities":`...)
		out = appendCaps(out, b.Caps)
		out = append(out, `,"pricing":`...)
		out = appendPrices(out, b.Prices)
		out = append(out, '}')
	}
	return append(out, "]}"...)
}

func firstOfClass(m *relay.Model, c tollgate.BackendClass) *relay.Backend {
	for _, b := range m.Backends {
		if b.Class == c {
			return b
		}
	}
	return nil
}

func appendCaps(out []byte, c tollgate.Capabilities) []byte {
	out = append(out, '[')
	for i, name := range c.List() {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, '"')
		out = append(out, name...)
		out = append(out, '"')
	}
	return append(out, ']')
}

func appendPrices(out []byte, p tollgate.Prices) []byte {
	out = append(out, `{"input":"`...)
	out = append(out, p.Input.String()...)
	out = append(out, `","output":"`...)
	out = append(out, p.Output.String()...)
	return append(out, `"}`...)
}
