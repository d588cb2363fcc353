package simulate

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// discardWriter is a minimal ResponseWriter so that the benchmark measures
// the handler, not the recorder.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(int)             {}
func (w *discardWriter) Flush()                      {}

const benchBody = `{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello."}],"max_tokens":64}`

func benchHandler(b *testing.B, f Flavour, body string) {
	s := New(Config{Flavour: f, Models: []string{"m"}, MaxRecorded: -1})
	w := &discardWriter{h: http.Header{}}
	rd := bytes.NewReader(nil)
	req := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		rd.Reset([]byte(body))
		req.Body = io.NopCloser(rd)
		clear(w.h)
		s.ServeHTTP(w, req)
	}
}

func BenchmarkHandler(b *testing.B) {
	for _, f := range Flavours() {
		b.Run(string(f), func(b *testing.B) { benchHandler(b, f, benchBody) })
	}
}

func BenchmarkHandlerStream(b *testing.B) {
	body := benchBody[:len(benchBody)-1] + `,"stream":true,"stream_options":{"include_usage":true}}`
	for _, f := range []Flavour{VLLM, LlamaCpp} {
		b.Run(string(f), func(b *testing.B) { benchHandler(b, f, body) })
	}
}
