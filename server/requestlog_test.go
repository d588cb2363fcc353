package server

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/openai"
	"github.com/tollgate/tollgate/relay"
)

// The request line written directly (RequestLog) holds the same fields and
// values as slog's JSON handler writes for it, in valid JSON, whatever the
// strings hold.
func TestRequestLineMatchesSlog(t *testing.T) {
	cached, reasoning := int64(7), int64(3)
	r := httptest.NewRequest("POST", "/v1/chat/completions?x=1", nil)
	r.URL.Path = "/v1/chat/\"odd\\path\n\x01é\xff"
	r.RemoteAddr = "192.0.2.7:5544"
	start := time.Now().Add(-1500 * time.Millisecond)
	sw := &statusWriter{ResponseWriter: httptest.NewRecorder(), status: 200, bytes: 1234}
	sw.Header().Set("Idempotent-Replayed", "true")
	sw.ri = requestInfo{id: "req_abc", code: "", call: &relay.Call{
		Account: tollgate.Account{ID: "acct_1"}, Key: tollgate.Key{Prefix: "sk-tg-AbCd"},
		Model: "tg-chat", Stream: true, Backend: tollgate.ClassNetwork, Node: "gpu-a",
		Usage: openai.Usage{PromptTokens: 10, CompletionTokens: 20, CachedTokens: &cached, ReasoningTokens: &reasoning},
		Cost:  tollgate.MustParseAmount("0.000123456789"), Searches: 2, FirstToken: start.Add(250 * time.Millisecond),
		ErrorCode: tollgate.CodeUpstreamError, Outcome: "failed_mid_stream",
	}}
	var viaSlog, direct bytes.Buffer
	s := &Server{Log: slog.New(slog.NewJSONHandler(&viaSlog, nil))}
	s.logRequest(r, sw, &sw.ri, start, 1500*time.Millisecond)
	s.RequestLog = &direct
	s.logRequest(r, sw, &sw.ri, start, 1500*time.Millisecond)
	var a, b map[string]any
	if err := json.Unmarshal(viaSlog.Bytes(), &a); err != nil {
		t.Fatalf("slog line: %v", err)
	}
	if err := json.Unmarshal(direct.Bytes(), &b); err != nil {
		t.Fatalf("direct line is not JSON: %v\n%s", err, direct.Bytes())
	}
	if _, err := time.Parse(time.RFC3339, b["time"].(string)); err != nil {
		t.Errorf("time %v: %v", b["time"], err)
	}
	delete(a, "time")
	delete(b, "time")
	if len(a) != len(b) || len(a) < 20 {
		t.Fatalf("fields differ: slog %d, direct %d\n%v\n%v", len(a), len(b), a, b)
	}
	for k, v := range a {
		if b[k] != v {
			t.Errorf("%s: slog %#v, direct %#v", k, v, b[k])
		}
	}
	if direct.Bytes()[direct.Len()-1] != '\n' {
		t.Error("the direct line does not end with a newline")
	}
}
