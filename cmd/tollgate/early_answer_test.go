package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// trickle opens a connection, sends a chat request's head declaring a body
// of length bytes, then sends the body a byte every gap until it is all
// sent, the connection fails, or the test ends. sent counts the bytes of
// the body written.
func trickle(t *testing.T, addr, key string, length int, gap time.Duration) (conn net.Conn, br *bufio.Reader, sent *atomic.Int64) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", key, length)
	sent = new(atomic.Int64)
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go func() {
		for i := 0; i < length; i++ {
			select {
			case <-stop:
				return
			case <-time.After(gap):
			}
			if _, err := conn.Write([]byte{' '}); err != nil {
				return
			}
			sent.Add(1)
		}
	}()
	return conn, bufio.NewReader(conn), sent
}

// closedBeforeBodyEnds reads the connection to its end (after the answer)
// and checks that the server closed it while the client was still sending.
func closedBeforeBodyEnds(t *testing.T, br *bufio.Reader, sent *atomic.Int64, length int) {
	t.Helper()
	if n, err := br.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("after the answer: read %d bytes, %v; want the connection closed", n, err)
	}
	if s := sent.Load(); s >= int64(length) {
		t.Fatalf("the connection closed only after the whole body (%d bytes) arrived", s)
	}
}

// An answer decided before the body is read (here 401, a bad key) reaches
// a client that trickles its body at once, not when the body ends; the
// connection closes at timeouts.request_body, the body still unfinished.
func TestEarlyAnswerReachesTricklingClient(t *testing.T) {
	h := newHarness(t, harnessOptions{timeouts: "timeouts:\n  request_body: 1s\n"})
	br, sent := trickleRefused(t, h)
	closedBeforeBodyEnds(t, br, sent, refusedLength)
}

const refusedLength = 100000

// trickleRefused trickles a body of refusedLength bytes with a bad key and
// checks that the 401 arrives before the body has.
func trickleRefused(t *testing.T, h *harness) (*bufio.Reader, *atomic.Int64) {
	t.Helper()
	_, br, sent := trickle(t, h.main.Addr("api"), "sk-tg-00000000000000000000000000000000", refusedLength, 20*time.Millisecond)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	expectError(t, resp.StatusCode, b, 401, "invalid_api_key", "")
	if !resp.Close {
		t.Errorf("an early answer without Connection: close: %v", resp.Header)
	}
	if s := sent.Load(); s >= refusedLength {
		t.Fatalf("the answer came after the whole body")
	}
	return br, sent
}

// A body trickled past timeouts.request_body gets its 408 and then the
// connection is closed, while the client is still sending.
func TestRequestBodyTimeoutClosesTheConnection(t *testing.T) {
	h := newHarness(t, harnessOptions{timeouts: "timeouts:\n  request_body: 300ms\n"})
	const length = 1000
	_, br, sent := trickle(t, h.main.Addr("api"), h.key, length, 20*time.Millisecond)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	expectError(t, resp.StatusCode, b, 408, "request_timeout", "")
	closedBeforeBodyEnds(t, br, sent, length)
}

// A client still trickling a refused body does not hold a graceful
// shutdown: Close returns within its deadline, with no error, although
// the body's own timeout is far longer.
func TestShutdownNotHeldByTricklingClient(t *testing.T) {
	h := newHarness(t, harnessOptions{timeouts: "timeouts:\n  request_body: 10m\n"})
	br, sent := trickleRefused(t, h)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	if err := h.main.Close(ctx); err != nil {
		t.Fatalf("shutdown held by a trickling client: %v", err)
	}
	closedBeforeBodyEnds(t, br, sent, refusedLength)
}

// Clients that write their whole body before they read the answer
// (Python's httpx, the official Python SDK's HTTP stack) get 413
// request_too_large for a 9 MiB body, with a declared length and chunked,
// and the service serves the next request. Runs when TOLLGATE_TEST_PYTHON
// is set (.ci/run sets it and installs Debian's python3-httpx).
func TestBodyLimitPythonHTTPX(t *testing.T) {
	if os.Getenv("TOLLGATE_TEST_PYTHON") == "" {
		t.Skip("TOLLGATE_TEST_PYTHON not set (CI sets it; needs Debian's python3-httpx)")
	}
	python := "/usr/bin/python3" // Debian's, where python3-httpx installs
	if _, err := os.Stat(python); err != nil {
		python = "python3"
	}
	h := newHarness(t, harnessOptions{})
	const script = `
import httpx, json, os, sys
url = os.environ["URL"] + "/chat/completions"
hdr = {"Authorization": "Bearer " + os.environ["KEY"], "Content-Type": "application/json"}
head = b'{"model":"flav-vllm","messages":[{"role":"user","content":"hi"}],"x_pad":"'
body = head + b"a" * (9 * 1024 * 1024 - len(head) - 2) + b'"}'
def chunks():
    for i in range(0, len(body), 65536):
        yield body[i:i + 65536]
out = {}
for name, content in (("declared", body), ("chunked", chunks())):
    try:
        with httpx.Client(timeout=30) as c:
            r = c.post(url, headers=hdr, content=content)
            out[name] = {"status": r.status_code, "body": r.json()}
    except Exception as e:
        out[name] = {"error": type(e).__name__ + ": " + str(e)}
with httpx.Client(timeout=30) as c:
    r = c.post(url, headers=hdr, json={"model": "flav-vllm", "messages": [{"role": "user", "content": "hi"}]})
    out["after"] = {"status": r.status_code}
json.dump(out, sys.stdout)
`
	cmd := exec.Command(python, "-c", script)
	cmd.Env = append(os.Environ(), "URL="+h.main.APIURL(), "KEY="+h.key)
	checkBodyLimitClient(t, runClient(t, cmd))
}

// checkBodyLimitClient checks a client script's report: 413
// request_too_large for the declared and the chunked 9 MiB body, then a
// 200.
func checkBodyLimitClient(t *testing.T, out []byte) {
	t.Helper()
	var res map[string]struct {
		Status int    `json:"status"`
		Error  string `json:"error"`
		Body   struct {
			Error struct{ Code string } `json:"error"`
		} `json:"body"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, name := range []string{"declared", "chunked"} {
		r := res[name]
		if r.Status != 413 || r.Body.Error.Code != "request_too_large" {
			t.Errorf("%s 9 MiB body: status %d code %q error %q", name, r.Status, r.Body.Error.Code, r.Error)
		}
	}
	if res["after"].Status != 200 {
		t.Errorf("the request after: %+v", res["after"])
	}
}

// The same with Node's fetch (which reads the answer while it writes).
func TestBodyLimitNodeFetch(t *testing.T) {
	if os.Getenv("TOLLGATE_TEST_NODE") == "" {
		t.Skip("TOLLGATE_TEST_NODE not set (CI sets it; needs node)")
	}
	dir, _ := filepath.Abs("../../tests/node")
	h := newHarness(t, harnessOptions{})
	cmd := exec.Command("node", "bodylimit.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "OPENAI_BASE_URL="+h.main.APIURL(), "OPENAI_API_KEY="+h.key)
	checkBodyLimitClient(t, runClient(t, cmd))
}

// runClient runs a client program and returns its standard output; it
// fails the test with the program's standard error if the program fails.
func runClient(t *testing.T, cmd *exec.Cmd) []byte {
	t.Helper()
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("%s: %v\n%s", cmd.Path, err, ee.Stderr)
		}
		t.Fatal(err)
	}
	return out
}
