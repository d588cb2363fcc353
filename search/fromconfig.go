package search

import (
	"net/http"

	"github.com/tollgate/tollgate/config"
)

// FromConfig builds the Service for a validated search section; nil (and
// no error) when search is off. client may be nil.
func FromConfig(c *config.Search, client *http.Client) (*Service, error) {
	if !c.Enabled() {
		return nil, nil
	}
	return New(Config{
		Provider:     c.Provider,
		URL:          c.URL,
		APIKey:       c.APIKey,
		Timeout:      c.Timeout.D(),
		CacheTTL:     c.CacheTTLDuration(),
		CacheEntries: c.CacheEntries,
		Client:       client,
	})
}
