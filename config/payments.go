package config

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/tollgate/tollgate"
)

// Payments configures payments by account holders (docs/payments.md).
// Provider "off" (the default) takes no payment and shows no payment UI.
type Payments struct {
	// Provider is stripe or off.
	Provider string `yaml:"provider"`
	// SecretKeyEnv and WebhookSecretEnv name the variables holding the
	// provider's secret API key (sk_...) and the webhook endpoint's
	// signing secret (whsec_...).
	SecretKeyEnv     string `yaml:"secret_key_env"`
	WebhookSecretEnv string `yaml:"webhook_secret_env"`
	SecretKey        string `yaml:"-"`
	WebhookSecret    string `yaml:"-"`
	// APIURL is the provider's API base URL: "" for Stripe's own; a test
	// server (stripe-mock) or tollgate's simulator otherwise.
	APIURL string `yaml:"api_url"`
	// ConsoleURL is the console's address as account holders reach it
	// (https://tollgate.example.com/console/): the hosted payment page
	// sends them back there. Required with a provider.
	ConsoleURL string `yaml:"console_url"`
	// MinUSD and MaxUSD bound one credit, decimal USD strings in whole
	// cents. Default 5 and 1000.
	MinUSD string `yaml:"min"`
	MaxUSD string `yaml:"max"`
	// Fee is added to the credit; default none.
	Fee PaymentFee `yaml:"fee"`
	// AutoTopUp lets account holders save a card for off-session top-ups.
	AutoTopUp bool `yaml:"auto_topup"`

	// Parsed.
	Min, Max tollgate.Amount `yaml:"-"`
}

// PaymentFee is the operator's fee on a credit: Percent of the credit
// (a decimal string, "2.9" for 2.9 %) plus Fixed USD; their sum is rounded
// up to the cent.
type PaymentFee struct {
	PercentStr string          `yaml:"percent"`
	FixedUSD   string          `yaml:"fixed"`
	Percent    tollgate.Amount `yaml:"-"`
	Fixed      tollgate.Amount `yaml:"-"`
}

// Payment providers.
const (
	PaymentsOff    = "off"
	PaymentsStripe = "stripe"
)

// Enabled reports whether a payment provider is configured.
func (p *Payments) Enabled() bool { return p.Provider != PaymentsOff }

func (p *Payments) setDefaults() {
	if p.Provider == "" {
		p.Provider = PaymentsOff
	}
	if p.MinUSD == "" {
		p.MinUSD = "5"
	}
	if p.MaxUSD == "" {
		p.MaxUSD = "1000"
	}
}

func (p *Payments) validate(getenv func(string) string, secrets bool, bad func(key, format string, args ...any)) {
	switch p.Provider {
	case PaymentsOff, PaymentsStripe:
	default:
		bad("payments.provider", "%q is not stripe or off", p.Provider)
		return
	}
	var err error
	if p.Min, err = parseCents(p.MinUSD); err != nil {
		bad("payments.min", "%v", err)
	}
	if p.Max, err = parseCents(p.MaxUSD); err != nil {
		bad("payments.max", "%v", err)
	}
	if p.Min <= 0 || p.Max < p.Min {
		bad("payments.max", "must be at least min (%s), and min above 0", p.MinUSD)
	}
	if p.Fee.PercentStr != "" {
		if p.Fee.Percent, err = tollgate.ParseAmount(p.Fee.PercentStr); err != nil || p.Fee.Percent < 0 || p.Fee.Percent >= tollgate.Dollars(100) {
			bad("payments.fee.percent", "%q: want a percentage from 0 to 100 such as \"2.9\"", p.Fee.PercentStr)
		}
	}
	if p.Fee.FixedUSD != "" {
		if p.Fee.Fixed, err = parseCents(p.Fee.FixedUSD); err != nil {
			bad("payments.fee.fixed", "%v", err)
		}
	}
	if !p.Enabled() {
		return
	}
	for _, s := range []struct {
		key, env string
		dst      *string
	}{
		{"payments.secret_key_env", p.SecretKeyEnv, &p.SecretKey},
		{"payments.webhook_secret_env", p.WebhookSecretEnv, &p.WebhookSecret},
	} {
		if s.env == "" {
			bad(s.key, "required with a provider: the environment variable holding the secret")
			continue
		}
		*s.dst = getenv(s.env)
		if *s.dst == "" && secrets {
			bad(s.key, "environment variable %s is empty or unset", s.env)
		}
	}
	if p.SecretKey != "" && !strings.HasPrefix(p.SecretKey, "sk_") && !strings.HasPrefix(p.SecretKey, "rk_") {
		bad("payments.secret_key_env", "%s does not hold a Stripe secret key (sk_... or rk_...)", p.SecretKeyEnv)
	}
	if p.APIURL != "" {
		if u, err := url.Parse(p.APIURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			bad("payments.api_url", "%q is not an http(s) base URL without credentials", p.APIURL)
		}
	}
	if u, err := url.Parse(p.ConsoleURL); p.ConsoleURL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("payments.console_url", "%q: want the console's address as account holders reach it, e.g. https://tollgate.example.com/console/", p.ConsoleURL)
	}
}

// parseCents parses a non-negative decimal USD string in whole cents.
func parseCents(v string) (tollgate.Amount, error) {
	a, err := tollgate.ParseAmount(v)
	if err != nil {
		return 0, err
	}
	if _, err := a.Cents(); err != nil || a < 0 {
		return 0, fmt.Errorf("%q: want a non-negative amount of USD in whole cents", v)
	}
	return a, nil
}
