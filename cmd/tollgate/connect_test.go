package main

import (
	"bufio"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/syncbuf"
)

// rawRequest sends text on a new connection to addr and reads the answer
// to a request of method.
func rawRequest(t *testing.T, addr, method, text string) (*http.Response, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, text); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method})
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, body
}

// CONNECT (a proxy's tunnel request) gets the error envelope like any path
// that is not served, and OPTIONS * is answered by tollgate (200 with
// Allow); both have a request id and an access-log line.
func TestConnectAndOptionsStar(t *testing.T) {
	logs := &syncbuf.Buffer{}
	h := newHarness(t, harnessOptions{log: slog.New(slog.NewJSONHandler(logs, nil))})
	addr := h.main.Addr("api")
	resp, body := rawRequest(t, addr, http.MethodConnect, "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
	var e envelope
	if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != 404 || e.Error.Code != "not_found" ||
		!strings.Contains(e.Error.Message, "CONNECT example.com:443") {
		t.Errorf("CONNECT: %d %q (%v)", resp.StatusCode, body, err)
	}
	connectID := resp.Header.Get("X-Request-Id")
	resp, body = rawRequest(t, addr, http.MethodOptions, "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp.StatusCode != 200 || len(body) != 0 || !strings.Contains(resp.Header.Get("Allow"), "POST") ||
		!strings.Contains(resp.Header.Get("Allow"), "OPTIONS") {
		t.Errorf("OPTIONS *: %d Allow %q %q", resp.StatusCode, resp.Header.Get("Allow"), body)
	}
	optionsID := resp.Header.Get("X-Request-Id")
	for _, id := range []string{connectID, optionsID} {
		deadline := time.Now().Add(5 * time.Second)
		for id == "" || !strings.Contains(logs.String(), `"request_id":"`+id+`"`) {
			if time.Now().After(deadline) {
				t.Fatalf("no access-log line for request id %q:\n%s", id, logs.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
