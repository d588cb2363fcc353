package main

import (
	"net/http"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/relay"
	"github.com/tollgate/tollgate/search"
	"github.com/tollgate/tollgate/tracing"
)

// Only this command reads the config: the packages take plain option
// structs, built here from a validated config (its defaults applied).

// catalogSpec is the catalogue the config's models: describe; web search
// takes part when search: names a provider.
func catalogSpec(cfg *config.Config) relay.CatalogSpec {
	spec := relay.CatalogSpec{WebSearch: cfg.Search.Enabled(), Models: make([]relay.ModelSpec, 0, len(cfg.Models))}
	for _, mc := range cfg.Models {
		m := relay.ModelSpec{ID: mc.ID, Kind: mc.Kind, OwnedBy: mc.OwnedBy, ContextLength: mc.ContextLength, MaxOutputTokens: mc.MaxOutputTokens,
			ImageTokens: mc.ImageTokens, SearchPrice: mc.SearchPrice}
		for _, bc := range mc.Backends {
			b := relay.BackendSpec{Class: bc.Class, UpstreamModel: bc.UpstreamModel, Caps: bc.Caps(), Prices: bc.Rates.Prices,
				Routing: bc.Routing, PrefixIndexTokens: bc.PrefixIndexTokens, PrefixTTL: bc.PrefixTTL.D()}
			if bc.PrefixMargin != nil {
				b.PrefixMargin = *bc.PrefixMargin
			}
			if bc.LoadPoll > 0 {
				b.LoadPoll = bc.LoadPoll.D()
			}
			for _, nc := range bc.Nodes {
				b.Nodes = append(b.Nodes, relay.NodeSpec{Name: nc.Name, URL: nc.URL, Key: nc.Key, Flavour: nc.Flavour,
					MaxConcurrent: nc.MaxConcurrent, HealthURL: nc.HealthURL, KVEvents: nc.KVEvents, KVEventsReplay: nc.KVEventsReplay})
			}
			m.Backends = append(m.Backends, b)
		}
		spec.Models = append(spec.Models, m)
	}
	return spec
}

// newSearch is the search service of the config's search: section; nil
// (and no error) when search is off. client may be nil.
func newSearch(c *config.Search, client *http.Client) (*search.Service, error) {
	if !c.Enabled() {
		return nil, nil
	}
	return search.New(search.Config{
		Provider:     c.Provider,
		URL:          c.URL,
		APIKey:       c.APIKey,
		Timeout:      c.Timeout.D(),
		CacheTTL:     c.CacheTTLDuration(),
		CacheEntries: c.CacheEntries,
		Client:       client,
	})
}

// tracingOptions are the config's tracing: section (no endpoint: off).
func tracingOptions(c *config.Tracing) tracing.Options {
	return tracing.Options{Endpoint: c.Endpoint, Headers: c.Headers, SampleRatio: c.Ratio(), ServiceName: c.ServiceName}
}
