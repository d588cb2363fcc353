// Package tracing exports OpenTelemetry traces over OTLP/HTTP when an
// endpoint is set (the config's tracing.endpoint). The server and the relay make the
// spans through the OpenTelemetry API; with tracing off they get no tracer
// and make none, so a request pays nothing for it.
package tracing

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
)

// Propagator reads and writes W3C trace context (traceparent, tracestate):
// a client's trace is continued, and passed on to the backend.
var Propagator = propagation.TraceContext{}

// Provider is the tracer provider of a running tollgate.
type Provider struct {
	tp *sdktrace.TracerProvider
}

// Options say where spans go and which are kept.
type Options struct {
	// Endpoint is the collector's OTLP/HTTP traces URL; empty: tracing off.
	Endpoint string
	// Headers go with every export (an API key, say).
	Headers map[string]string
	// SampleRatio is the share of new traces kept, 0 to 1. A request that
	// arrives with a sampled traceparent is always traced.
	SampleRatio float64
	// ServiceName is service.name on every span.
	ServiceName string
}

// New builds the exporter and provider; nil (and no error) when o has no
// endpoint.
func New(o Options, version string) (*Provider, error) {
	if o.Endpoint == "" {
		return nil, nil
	}
	opts := []otlptracehttp.Option{otlptracehttp.WithEndpointURL(o.Endpoint)}
	if len(o.Headers) > 0 {
		opts = append(opts, otlptracehttp.WithHeaders(o.Headers))
	}
	exp, err := otlptracehttp.New(context.Background(), opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	return NewWithExporter(exp, o.SampleRatio, o.ServiceName, version), nil
}

// NewWithExporter builds a provider around any exporter (tests use the
// SDK's in-memory one).
func NewWithExporter(exp sdktrace.SpanExporter, ratio float64, service, version string) *Provider {
	res := resource.NewWithAttributes(semconv.SchemaURL,
		semconv.ServiceName(service), semconv.ServiceVersion(version))
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
	)
	return &Provider{tp: tp}
}

// Tracer is tollgate's tracer.
func (p *Provider) Tracer() trace.Tracer {
	return p.tp.Tracer("github.com/tollgate/tollgate")
}

// Shutdown flushes the spans still queued and stops the exporter.
func (p *Provider) Shutdown(ctx context.Context) error { return p.tp.Shutdown(ctx) }

// ForceFlush exports every span ended so far (tests).
func (p *Provider) ForceFlush(ctx context.Context) error { return p.tp.ForceFlush(ctx) }
