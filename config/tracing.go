package config

import (
	"net/url"
	"strings"
)

// Tracing is the tracing: section: OpenTelemetry traces over OTLP/HTTP,
// off unless an endpoint is set (docs/operations.md, "Traces").
type Tracing struct {
	// Endpoint is the collector's OTLP/HTTP traces URL, such as
	// http://otel-collector:4318/v1/traces. Empty: tracing is off.
	Endpoint string `yaml:"endpoint"`
	// HeadersEnv names a variable holding headers for the collector, as
	// OTEL_EXPORTER_OTLP_HEADERS writes them: "key1=value1,key2=value2"
	// (an API key, say). Headers holds them parsed.
	HeadersEnv string            `yaml:"headers_env"`
	Headers    map[string]string `yaml:"-"`
	// SampleRatio is the share of new traces kept, 0 to 1 (default 1). A
	// request that arrives with a sampled traceparent is always traced.
	SampleRatio *float64 `yaml:"sample_ratio"`
	// ServiceName is service.name on every span (default tollgate).
	ServiceName string `yaml:"service_name"`
}

// Enabled reports whether traces are exported.
func (t *Tracing) Enabled() bool { return t.Endpoint != "" }

// Ratio is SampleRatio with its default.
func (t *Tracing) Ratio() float64 {
	if t.SampleRatio == nil {
		return 1
	}
	return *t.SampleRatio
}

func (t *Tracing) setDefaults() {
	if t.ServiceName == "" {
		t.ServiceName = "tollgate"
	}
}

// validate checks the section; secrets (the headers variable) only for the
// commands that serve (secrets), as for the backends' keys.
func (t *Tracing) validate(getenv func(string) string, secrets bool, bad func(key, format string, args ...any)) {
	if t.Endpoint != "" {
		u, err := url.Parse(t.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("tracing.endpoint", "must be an http(s) URL such as http://otel-collector:4318/v1/traces, not %q", t.Endpoint)
		} else if u.User != nil {
			bad("tracing.endpoint", "must not hold credentials: put them in the variable named by tracing.headers_env")
		}
	}
	if r := t.SampleRatio; r != nil && (*r < 0 || *r > 1) {
		bad("tracing.sample_ratio", "must be between 0 and 1, not %v", *r)
	}
	if t.HeadersEnv != "" {
		v := getenv(t.HeadersEnv)
		if v == "" && t.Endpoint != "" && secrets {
			bad("tracing.headers_env", "the variable %s is not set", t.HeadersEnv)
		}
		t.Headers = map[string]string{}
		for _, kv := range strings.Split(v, ",") {
			if strings.TrimSpace(kv) == "" {
				continue
			}
			k, val, ok := strings.Cut(kv, "=")
			if !ok || strings.TrimSpace(k) == "" {
				bad("tracing.headers_env", "%s must hold key=value pairs separated by commas", t.HeadersEnv)
				break
			}
			if dk, err := url.QueryUnescape(strings.TrimSpace(val)); err == nil {
				val = dk
			}
			t.Headers[strings.TrimSpace(k)] = strings.TrimSpace(val)
		}
	}
}
