package config

import (
	"net/netip"
	"strings"
)

// Console configures the web console (docs/console.md).
type Console struct {
	// TrustedProxies are the addresses or CIDR prefixes of the proxies in
	// front of tollgate whose X-Forwarded-Proto and X-Forwarded-For the
	// console believes (its cookies' Secure flag, its sign-in limits).
	TrustedProxies []string `yaml:"trusted_proxies"`
	// Trusted is TrustedProxies parsed.
	Trusted []netip.Prefix `yaml:"-"`
}

func (c *Console) validate(bad func(key, format string, args ...any)) {
	c.Trusted = c.Trusted[:0]
	for _, s := range c.TrustedProxies {
		s = strings.TrimSpace(s)
		if p, err := netip.ParsePrefix(s); err == nil {
			c.Trusted = append(c.Trusted, p.Masked())
			continue
		}
		if a, err := netip.ParseAddr(s); err == nil {
			c.Trusted = append(c.Trusted, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		bad("console.trusted_proxies", "%q: want an IP address or a CIDR prefix (10.0.0.0/8)", s)
	}
}
