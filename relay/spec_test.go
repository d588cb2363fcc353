package relay

import (
	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/openai"
	"github.com/tollgate/tollgate/routing"
)

// netModel is a chat model on one network backend over nodes, routed as a
// backend without routing keys is (prefix_cache, margin 6), at 0.15 and 0.6
// USD per million tokens; a node without a flavour is vLLM.
func netModel(id, upstream string, contextLength, maxOutput int64, caps tollgate.Capabilities, nodes ...NodeSpec) ModelSpec {
	for i := range nodes {
		if nodes[i].Flavour == "" {
			nodes[i].Flavour = openai.VLLM
		}
	}
	return ModelSpec{ID: id, Kind: tollgate.KindChat, ContextLength: contextLength, MaxOutputTokens: maxOutput,
		Backends: []BackendSpec{{Class: tollgate.ClassNetwork, UpstreamModel: upstream, Caps: caps,
			Prices:  tollgate.Prices{Input: tollgate.MustParseRate("0.15"), Output: tollgate.MustParseRate("0.6")},
			Routing: routing.PrefixCache, PrefixMargin: 6, Nodes: nodes}}}
}

// catalog is the catalogue of models, without web search.
func catalog(models ...ModelSpec) CatalogSpec { return CatalogSpec{Models: models} }
