package server

import (
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate/tracing"
)

// startSpan opens a chat request's span: a SERVER span that continues the
// client's W3C traceparent when it sent one. The relay's spans (hold,
// backend call, searches, settle) are its children.
func (s *Server) startSpan(r *http.Request) (*http.Request, trace.Span) {
	ctx := tracing.Propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := s.Tracer.Start(ctx, "chat", trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		semconv.GenAIOperationNameChat,
		semconv.HTTPRequestMethodKey.String(r.Method),
		semconv.URLPath(r.URL.Path),
	))
	return r.WithContext(ctx), span
}

// endSpan closes the request's span with what the request became: its
// status, error code, model, backend, tokens and cost. Never a key or any
// text of the conversation.
func (s *Server) endSpan(span trace.Span, sw *statusWriter, ri *requestInfo) {
	status := sw.status
	if status == 0 {
		status = http.StatusOK
	}
	span.SetAttributes(semconv.HTTPResponseStatusCode(status), attribute.String("tollgate.request_id", ri.id))
	code := string(ri.code)
	if c := ri.call; c != nil {
		if c.Model != "" {
			span.SetName("chat " + c.Model)
			span.SetAttributes(semconv.GenAIRequestModel(c.Model), attribute.Bool("tollgate.stream", c.Stream))
		}
		if c.Backend != "" {
			span.SetAttributes(
				attribute.String("tollgate.backend.class", string(c.Backend)),
				semconv.GenAIUsageInputTokens(int(c.Usage.PromptTokens)),
				semconv.GenAIUsageOutputTokens(int(c.Usage.CompletionTokens)),
				attribute.String("tollgate.cost_usd", c.Cost.String()),
			)
		}
		if !c.FirstToken.IsZero() {
			span.AddEvent("gen_ai.first_token", trace.WithTimestamp(c.FirstToken))
		}
		if code == "" {
			code = string(c.ErrorCode)
		}
	}
	if code != "" {
		span.SetAttributes(semconv.ErrorTypeKey.String(code))
		span.SetStatus(codes.Error, code)
	}
	span.End()
}
