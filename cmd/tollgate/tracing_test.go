package main

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate/tracing"
)

// Spans of a non-streamed and a streamed request, with the in-memory
// exporter of the OpenTelemetry SDK: one SERVER span continuing the client's
// traceparent, children for auth, hold, the backend call (a CLIENT span with
// the GenAI attributes; the stream's with a first_token event) and settle;
// the traceparent reaches the backend; no span holds the key or the prompt.
func TestTracesOfAStreamedAndANonStreamedRequest(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := tracing.NewWithExporter(exp, 1, "tollgate", "test")
	h := newHarness(t, harnessOptions{tracing: tp})
	const prompt = "the secret prompt 91c2"
	const clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	for _, stream := range []string{"false", "true"} {
		st, _, _ := h.post("/v1/chat/completions", `{"model":"flav-vllm","stream":`+stream+`,"messages":[{"role":"user","content":"`+prompt+`"}]}`,
			map[string]string{"Traceparent": "00-" + clientTrace + "-00f067aa0ba902b7-01"})
		if st != 200 {
			t.Fatalf("stream=%s: %d", stream, st)
		}
		last, _ := h.sim("vllm").LastRequest()
		if tp := last.Header.Get("Traceparent"); !strings.HasPrefix(tp, "00-"+clientTrace+"-") {
			t.Fatalf("stream=%s: the backend got traceparent %q, not the client's trace", stream, tp)
		}
	}
	if err := tp.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := exp.GetSpans()
	attr := func(s tracetest.SpanStub, k string) (attribute.Value, bool) {
		for _, a := range s.Attributes {
			if string(a.Key) == k {
				return a.Value, true
			}
		}
		return attribute.Value{}, false
	}
	roots := 0
	for _, s := range spans {
		if s.SpanContext.TraceID().String() != clientTrace {
			t.Errorf("span %q is not in the client's trace", s.Name)
		}
		for _, a := range s.Attributes {
			if strings.Contains(a.Value.Emit(), prompt) || strings.Contains(a.Value.Emit(), h.key) {
				t.Errorf("span %q attribute %s holds the prompt or the key", s.Name, a.Key)
			}
		}
		if s.Name != "chat flav-vllm" {
			continue
		}
		roots++
		if s.SpanKind != trace.SpanKindServer {
			t.Errorf("the request span's kind is %v", s.SpanKind)
		}
		if v, _ := attr(s, "gen_ai.request.model"); v.AsString() != "flav-vllm" {
			t.Errorf("gen_ai.request.model = %q", v.AsString())
		}
		if v, ok := attr(s, "gen_ai.usage.output_tokens"); !ok || v.AsInt64() <= 0 {
			t.Errorf("gen_ai.usage.output_tokens missing on the request span")
		}
		children := map[string]tracetest.SpanStub{}
		for _, c := range spans {
			if c.Parent.SpanID() == s.SpanContext.SpanID() {
				children[c.Name] = c
			}
		}
		for _, want := range []string{"auth", "hold", "chat up-vllm", "settle"} {
			if _, ok := children[want]; !ok {
				t.Errorf("the request span has no %q child (children: %v)", want, keys(children))
			}
		}
		call := children["chat up-vllm"]
		if call.SpanKind != trace.SpanKindClient {
			t.Errorf("the backend call's kind is %v", call.SpanKind)
		}
		for _, k := range []string{"gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "gen_ai.response.id"} {
			if _, ok := attr(call, k); !ok {
				t.Errorf("the backend call's span lacks %s", k)
			}
		}
		if v, _ := attr(s, "tollgate.stream"); v.AsBool() {
			found := false
			for _, e := range call.Events {
				found = found || e.Name == "gen_ai.first_token"
			}
			if !found {
				t.Error("the streamed backend call has no gen_ai.first_token event")
			}
		}
	}
	if roots != 2 {
		t.Fatalf("%d request spans, want 2 (of %d spans)", roots, len(spans))
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
