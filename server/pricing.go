package server

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/relay"
)

// pricingCache keeps the last /pricing body; it is rebuilt only when the
// catalogue or the traffic counts change (the counts are themselves read at
// most once per traffic.share_cache).
type pricingCache struct {
	mu             sync.Mutex
	body           []byte
	etag           string
	catalog        *relay.Catalog
	network, total int64
}

// Pricing is GET /pricing (docs/api.md, "GET /pricing"): rates as
// decimal strings per 1M tokens, the blend by the last 7 days' traffic share
// rounded half-even to 6 decimals, Cache-Control and an ETag (304 on match).
func (s *Server) Pricing(w http.ResponseWriter, r *http.Request) error {
	body, etag, err := s.pricingBody(r)
	if err != nil {
		return err
	}
	h := w.Header()
	h.Set("Cache-Control", "public, max-age=60")
	h.Set("ETag", etag)
	if match := r.Header.Get("If-None-Match"); match != "" && etagMatches(match, etag) {
		w.WriteHeader(http.StatusNotModified)
		return nil
	}
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
	return nil
}

func etagMatches(header, etag string) bool {
	for _, part := range strings.Split(header, ",") {
		p := strings.TrimSpace(part)
		if p == "*" || p == etag || strings.TrimPrefix(p, "W/") == etag {
			return true
		}
	}
	return false
}

func (s *Server) pricingBody(r *http.Request) ([]byte, string, error) {
	cat := s.Relay.Catalog()
	c := &s.pricing
	c.mu.Lock()
	defer c.mu.Unlock()
	var network, total int64
	if s.Uptime != nil {
		var err error
		network, total, err = s.Uptime.Uptime(r.Context())
		if err != nil {
			if c.body != nil { // a stale price list beats an error
				s.Log.Warn("pricing: traffic share unavailable, serving the last list", "err", err)
				return c.body, c.etag, nil
			}
			return nil, "", &tollgate.Error{Code: tollgate.CodeInternal, Message: "pricing is unavailable right now", Err: err}
		}
	}
	if c.body != nil && c.catalog == cat && c.network == network && c.total == total {
		return c.body, c.etag, nil
	}
	body := BuildPricing(cat, network, total)
	sum := sha256.Sum256(body)
	c.body, c.etag, c.catalog, c.network, c.total = body, `"`+hex.EncodeToString(sum[:12])+`"`, cat, network, total
	return c.body, c.etag, nil
}

// BuildPricing renders the pricing document for a catalogue and the traffic
// served over the last 7 days. A model without a fallback backend shows
// "fallback": null and its average is the network rate (and the reverse).
func BuildPricing(cat *relay.Catalog, networkServed, allServed int64) []byte {
	out := make([]byte, 0, 1024)
	out = append(out, `{"object":"pricing","currency":"USD","unit":"per_1m_tokens","data":[`...)
	for i, m := range cat.Models {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"id":`...)
		out = strconv.AppendQuote(out, m.ID)
		nb, fb := firstOfClass(m, tollgate.ClassNetwork), firstOfClass(m, tollgate.ClassFallback)
		out = append(out, `,"network":`...)
		out = appendOptionalPrices(out, nb)
		out = append(out, `,"fallback":`...)
		out = appendOptionalPrices(out, fb)
		var avg tollgate.Prices
		switch {
		case nb != nil && fb != nil:
			avg.Input = tollgate.BlendRates(nb.Prices.Input, fb.Prices.Input, networkServed, allServed)
			avg.Output = tollgate.BlendRates(nb.Prices.Output, fb.Prices.Output, networkServed, allServed)
		case nb != nil:
			avg = nb.Prices
		case fb != nil:
			avg = fb.Prices
		}
		out = append(out, `,"average":`...)
		out = appendPrices(out, avg)
		if m.Caps.Has(tollgate.CapWebSearch) {
			// An extra field: USD per web search that ran, not per 1M tokens.
			out = append(out, `,"web_search":"`...)
			out = append(out, m.SearchPrice.String()...)
			out = append(out, '"')
		}
		out = append(out, '}')
	}
	out = append(out, `],"network_uptime_7d":`...)
	if allServed <= 0 {
		out = append(out, '1')
	} else {
		out = strconv.AppendFloat(out, float64(networkServed)/float64(allServed), 'f', -1, 64)
	}
	return append(out, "}\n"...)
}

func appendOptionalPrices(out []byte, b *relay.Backend) []byte {
	if b == nil {
		return append(out, "null"...)
	}
	return appendPrices(out, b.Prices)
}
