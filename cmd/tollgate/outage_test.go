package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/syncbuf"
	"github.com/tollgate/tollgate/postgres"
	"github.com/tollgate/tollgate/storefail"
)

// tcpGate forwards a loopback port to a database server and can cut every
// connection and refuse new ones (the database "goes away" for the
// processes behind it: real connection refused and reset errors through
// the real driver), then let connections through again.
type tcpGate struct {
	t      *testing.T
	ln     net.Listener
	target string

	mu    sync.Mutex
	open  bool
	conns map[net.Conn]struct{}
}

func newTCPGate(t *testing.T, target string) *tcpGate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &tcpGate{t: t, ln: ln, target: target, open: true, conns: map[net.Conn]struct{}{}}
	go g.accept()
	t.Cleanup(func() { ln.Close(); g.cut() })
	return g
}

func (g *tcpGate) addr() string { return g.ln.Addr().String() }

func (g *tcpGate) accept() {
	for {
		c, err := g.ln.Accept()
		if err != nil {
			return
		}
		g.mu.Lock()
		if !g.open {
			g.mu.Unlock()
			// Refused as a stopped server refuses: a reset at once.
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", g.target)
		if err != nil {
			g.mu.Unlock()
			c.Close()
			continue
		}
		g.conns[c], g.conns[up] = struct{}{}, struct{}{}
		g.mu.Unlock()
		go g.pipe(c, up)
		go g.pipe(up, c)
	}
}

func (g *tcpGate) pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
}

// cut resets every connection and refuses new ones until restore.
func (g *tcpGate) cut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open = false
	for c := range g.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		c.Close()
		delete(g.conns, c)
	}
}

func (g *tcpGate) restore() {
	g.mu.Lock()
	g.open = true
	g.mu.Unlock()
}

// pgThroughGate points the harness's store at the test's PostgreSQL schema
// through a tcpGate. It skips without TOLLGATE_TEST_POSTGRES.
func pgThroughGate(t *testing.T) (*tcpGate, string) {
	t.Helper()
	schema := postgres.NewTestSchema(t)
	u, err := url.Parse(os.Getenv(postgres.TestEnv))
	if err != nil {
		t.Fatal(err)
	}
	g := newTCPGate(t, u.Host)
	u.Host = g.addr()
	q := u.Query()
	q.Set("search_path", schema)
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	t.Setenv("TG_OUTAGE_TEST_PG", u.String())
	return g, "store:\n  postgres_url_env: TG_OUTAGE_TEST_PG\n"
}

// envelope is an error answer's body.
type envelope struct {
	Error struct {
		Code, Message string
	}
}

// TestStoreOutageAnswered503: while the database cannot be reached, every
// step that needs it (the hold of a non-streamed and of a streamed request,
// an Idempotency-Key's claim, authenticating a key the cache does not
// trust) is answered 503 store_unavailable with Retry-After and the request
// id in the body and the header, and the log line names the store call;
// nothing is answered 500. Once the database is back, requests are served.
func TestStoreOutageAnswered503(t *testing.T) {
	gate, store := pgThroughGate(t)
	logs := &syncbuf.Buffer{}
	h := newHarness(t, harnessOptions{store: store, log: slog.New(slog.NewJSONHandler(logs, nil))})
	// A poor account (free balance below 256 holds) takes a database hold
	// per request: no reservation in memory to serve from.
	_, _, poor := h.newKey(20_000_000_000, nil)
	_, _, fresh := h.newKey(20_000_000_000, nil)
	const chat = `{"model":"flav-vllm","messages":[{"role":"user","content":"hi"}],"max_tokens":8}`
	const stream = `{"model":"flav-vllm","stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":8}`
	bearer := map[string]string{"Authorization": "Bearer " + poor}
	if code, _, body := h.post("/v1/chat/completions", chat, bearer); code != 200 {
		t.Fatalf("before the outage: %d %s", code, body)
	}
	check := func(name, body string, headers map[string]string, op string) {
		t.Helper()
		code, hdr, out := h.post("/v1/chat/completions", body, headers)
		var e envelope
		_ = json.Unmarshal(out, &e)
		id := hdr.Get("X-Request-Id")
		if code != 503 || e.Error.Code != "store_unavailable" || hdr.Get("Retry-After") != "2" {
			t.Errorf("%s during the outage: %d Retry-After %q %s", name, code, hdr.Get("Retry-After"), out)
			return
		}
		if id == "" || !strings.Contains(e.Error.Message, id) {
			t.Errorf("%s: request id %q not in the message %q", name, id, e.Error.Message)
		}
		found := false
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, `"request_id":"`+id+`"`) && strings.Contains(l, `"operation":"`+op+`"`) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: no log line naming %s for %s:\n%s", name, op, id, logs.String())
		}
	}
	gate.cut()
	// The key is in the authentication cache (trusted for 3 polls of 1 s):
	// the hold and the Idempotency-Key's claim meet the outage.
	check("non-streamed", chat, bearer, "billing.hold")
	check("streamed", stream, bearer, "billing.hold")
	check("idempotent", chat, map[string]string{"Authorization": "Bearer " + poor, "Idempotency-Key": "outage-1"}, "idempotency.begin")
	check("a key not in the cache", chat, map[string]string{"Authorization": "Bearer " + fresh}, "auth.key")
	gate.restore()
	deadline := time.Now().Add(15 * time.Second)
	for {
		code, _, body := h.post("/v1/chat/completions", chat, bearer)
		if code == 200 {
			break
		}
		if code != 503 || time.Now().After(deadline) {
			t.Fatalf("after the outage: %d %s", code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if strings.Contains(logs.String(), `"msg":"internal error"`) {
		t.Errorf("an outage was logged as an internal error:\n%s", logs.String())
	}
	// The failed calls are counted by operation (tollgate_store_errors_total).
	got := map[string]int64{}
	for _, c := range storefail.Counts() {
		got[c.Op] = c.Unavailable
	}
	for op, least := range map[string]int64{"billing.hold": 2, "idempotency.begin": 1, "auth.key": 1} {
		if got[op] < least {
			t.Errorf("store errors counted for %s: %d, want at least %d (%v)", op, got[op], least, got)
		}
	}
}
