package config

import (
	"net/netip"
	"strings"
	"testing"
)

func TestConsoleTrustedProxies(t *testing.T) {
	doc := `
listen: {api: "127.0.0.1:0"}
store: {sqlite: t.db}
console:
  trusted_proxies: ["10.0.0.0/8", "192.168.1.7", "::1"]
models:
  - id: m
    kind: chat
    context_length: 1000
    max_output_tokens: 100
    backends:
      - class: network
        upstream_model: up
        rates: {input: "0.15", output: "0.6"}
        nodes: [{url: "http://10.0.0.1:8000/v1"}]
`
	c, err := Parse([]byte(doc), t.TempDir(), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.1.7/32"), netip.MustParsePrefix("::1/128")}
	if len(c.Console.Trusted) != 3 || c.Console.Trusted[0] != want[0] || c.Console.Trusted[1] != want[1] || c.Console.Trusted[2] != want[2] {
		t.Errorf("trusted = %v, want %v", c.Console.Trusted, want)
	}
	_, err = Parse([]byte(strings.Replace(doc, `"::1"`, `"proxy.local"`, 1)), t.TempDir(), func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "console.trusted_proxies") {
		t.Errorf("a host name: %v, want an error naming console.trusted_proxies", err)
	}
}
