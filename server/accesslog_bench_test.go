package server

import (
	"bufio"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/openai"
	"github.com/tollgate/tollgate/relay"
)

// BenchmarkAccessLogLine is what one access log line costs the request's
// goroutine: formatting a served chat request's line as JSON and writing it
// to a file, as `tollgate serve` logs at level info. Since session 8 the
// middleware does this after it has flushed the whole response (server/middleware.go).
//
//	go test -run '^$' -bench AccessLogLine -benchmem ./server/
func BenchmarkAccessLogLine(b *testing.B) {
	f, err := os.Create(filepath.Join(b.TempDir(), "access.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	s := &Server{Log: slog.New(slog.NewJSONHandler(f, nil))}
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	sw := &statusWriter{ResponseWriter: httptest.NewRecorder(), status: 200, bytes: 505}
	sw.ri.id = "req_6b954e0e839c1"
	sw.ri.call = &relay.Call{Account: tollgate.Account{ID: "acct_h7BgQWPsnXmHIuLh"}, Key: tollgate.Key{ID: "key_dwlo6KCdp9ktD1Rm"},
		Model: "bench", Backend: tollgate.ClassNetwork, Node: "sim", Usage: openai.Usage{PromptTokens: 25, CompletionTokens: 16},
		Cost: 8_900_000, Outcome: "served"}
	b.Run("slog", func(b *testing.B) {
		for b.Loop() {
			s.logRequest(r, sw, &sw.ri, time.Now(), 372*time.Microsecond)
		}
	})
	// As `tollgate serve` writes JSON logs: straight into a buffered writer.
	b.Run("direct", func(b *testing.B) {
		w := bufio.NewWriterSize(f, 64<<10)
		s.RequestLog = w
		defer func() { s.RequestLog = nil; w.Flush() }()
		for b.Loop() {
			s.logRequest(r, sw, &sw.ri, time.Now(), 372*time.Microsecond)
		}
	})
}
