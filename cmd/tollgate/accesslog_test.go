package main

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// heldLog is a slog handler that holds every access log line ("request")
// until released, and counts the lines: a response that is sent only after
// its line was made cannot reach the client while the line is held.
type heldLog struct {
	release chan struct{}
	mu      sync.Mutex
	lines   int
}

func (h *heldLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *heldLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *heldLog) WithGroup(string) slog.Handler            { return h }
func (h *heldLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "request" {
		return nil
	}
	select {
	case <-h.release:
	case <-time.After(10 * time.Second):
	}
	h.mu.Lock()
	h.lines++
	h.mu.Unlock()
	return nil
}

// TestAccessLogAfterResponse checks that the access log line is made after
// the client has the response: a whole non-streamed answer, an error
// envelope, and a stream up to its data: [DONE] arrive while the line is
// still held, and each request still gets its line.
func TestAccessLogAfterResponse(t *testing.T) {
	hl := &heldLog{release: make(chan struct{})}
	h := newHarness(t, harnessOptions{log: slog.New(hl)})
	// A connection per request: the next request on a connection is read
	// once the last one's line is written, held here.
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	do := func(body string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, h.main.APIURL()+"/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+h.key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("no response while the log line is held: %v", err)
		}
		return resp
	}
	var bodies []io.Closer
	var once sync.Once
	release := func() { once.Do(func() { close(hl.release) }) }
	defer func() {
		release()
		for _, b := range bodies {
			b.Close()
		}
	}()

	resp := do(`{"model":"flav-vllm","messages":[{"role":"user","content":"hi"}]}`)
	bodies = append(bodies, resp.Body)
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 || !strings.Contains(string(b), `"usage"`) {
		t.Fatalf("answer while its log line is held: status %d, err %v, body %s", resp.StatusCode, err, b)
	}

	resp = do(`{"model":"no-such-model","messages":[{"role":"user","content":"hi"}]}`)
	bodies = append(bodies, resp.Body)
	b, err = io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 404 || !strings.Contains(string(b), `"model_not_found"`) {
		t.Fatalf("error envelope while its log line is held: status %d, err %v, body %s", resp.StatusCode, err, b)
	}

	resp = do(`{"model":"flav-vllm","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	bodies = append(bodies, resp.Body)
	sc := bufio.NewScanner(resp.Body)
	sawDone := false
	for sc.Scan() {
		if sc.Text() == "data: [DONE]" {
			sawDone = true
			break
		}
	}
	if !sawDone {
		t.Fatalf("stream did not reach data: [DONE] while its log line was held: %v", sc.Err())
	}

	release()
	deadline := time.Now().Add(5 * time.Second)
	for {
		hl.mu.Lock()
		n := hl.lines
		hl.mu.Unlock()
		if n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d access log lines for 3 requests", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
