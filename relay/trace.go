package relay

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/openai"
)

// Spans of a request (docs/operations.md, "Traces"): under the server's
// span, one for the hold, one per backend call (a CLIENT span with the
// OpenTelemetry GenAI attributes and a first_token event; its context goes
// to the backend as traceparent), one per web search and one for the settle.
// Without a tracer (Deps.Tracer nil) none is made: these helpers return at
// once and allocate nothing.

// span starts a child span of ctx, or returns nil without a tracer.
func (r *Relay) span(ctx context.Context, name string, kind trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if r.tracer == nil {
		return ctx, nil
	}
	return r.tracer.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
}

// endSpan ends s (nil: nothing), recording err as its status.
func endSpan(s trace.Span, err error) {
	if s == nil {
		return
	}
	if err != nil {
		s.SetStatus(codes.Error, err.Error())
		s.SetAttributes(semconv.ErrorTypeKey.String(string(tollgate.ErrorCode(err))))
	}
	s.End()
}

// startBackendSpan opens the span of one backend call and sets the
// traceparent the call sends. It returns the context for the call.
func (x *exchange) startBackendSpan(ctx context.Context) context.Context {
	if x.r.tracer == nil {
		return ctx
	}
	attrs := []attribute.KeyValue{
		semconv.GenAIOperationNameChat,
		semconv.GenAIProviderNameKey.String(string(x.node.Flavour)),
		semconv.GenAIRequestModel(x.backend.UpstreamModel),
		attribute.String("tollgate.backend.class", string(x.backend.Class)),
		attribute.String("tollgate.node", x.node.Name),
	}
	if x.cr.MaxTokens > 0 {
		attrs = append(attrs, semconv.GenAIRequestMaxTokens(int(x.cr.MaxTokens)))
	}
	ctx, x.backendSpan = x.r.span(ctx, "chat "+x.backend.UpstreamModel, trace.SpanKindClient, attrs...)
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	x.traceparent = carrier["traceparent"]
	return ctx
}

// firstTokenEvent marks the first generated token on the backend span.
func (x *exchange) firstTokenEvent() {
	if x.backendSpan != nil {
		x.backendSpan.AddEvent("gen_ai.first_token")
	}
}

// endBackendSpan closes the backend call's span with its usage.
func (x *exchange) endBackendSpan(u openai.Usage, finish string, err error) {
	s := x.backendSpan
	if s == nil {
		return
	}
	x.backendSpan = nil
	s.SetAttributes(
		semconv.GenAIUsageInputTokens(int(u.PromptTokens)),
		semconv.GenAIUsageOutputTokens(int(u.CompletionTokens)),
		semconv.GenAIResponseModel(x.backend.UpstreamModel),
		semconv.GenAIResponseID(x.completionID()),
	)
	if finish != "" {
		s.SetAttributes(semconv.GenAIResponseFinishReasons(finish))
	}
	endSpan(s, err)
}
