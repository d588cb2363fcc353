package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
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

// pgThroughGate makes a PostgreSQL schema for the test and a tcpGate in
// front of the test's server, and returns the gate, the schema and a URL of
// the schema through the gate. It skips without TOLLGATE_TEST_POSTGRES.
func pgThroughGate(t *testing.T) (*tcpGate, string, string) {
	t.Helper()
	schema := postgres.NewTestSchema(t)
	u, err := url.Parse(pgURLWithSchema(t, schema))
	if err != nil {
		t.Fatal(err)
	}
	g := newTCPGate(t, u.Host)
	u.Host = g.addr()
	q := u.Query()
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	return g, schema, u.String()
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
	gate, _, gated := pgThroughGate(t)
	t.Setenv("TG_OUTAGE_TEST_PG", gated)
	store := "store:\n  postgres_url_env: TG_OUTAGE_TEST_PG\n"
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
	check("non-streamed", chat, bearer, "billing_hold")
	check("streamed", stream, bearer, "billing_hold")
	check("idempotent", chat, map[string]string{"Authorization": "Bearer " + poor, "Idempotency-Key": "outage-1"}, "idempotency_begin")
	check("a key not in the cache", chat, map[string]string{"Authorization": "Bearer " + fresh}, "auth_key")
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
	for op, least := range map[string]int64{"billing_hold": 2, "idempotency_begin": 1, "auth_key": 1} {
		if got[op] < least {
			t.Errorf("store errors counted for %s: %d, want at least %d (%v)", op, got[op], least, got)
		}
	}
}

// outcome is what one client saw of one request.
type outcome struct {
	kind   string // "plain", "stream", "idempotent"
	status int
	id     string // X-Request-Id
	code   string // error.code, of the answer or of the stream's error event
	cost   string // usage.cost shown ("" if none)
	err    error  // transport error (an instance killed under the request)
	start  time.Time
	end    time.Time
}

// callFleet sends one request of kind to api and reads the whole answer.
func callFleet(client *http.Client, api, key, kind string, n int) (o outcome) {
	body := flatBody
	if kind == "stream" {
		body = strings.Replace(flatBody, `"max_tokens"`, `"stream":true,"max_tokens"`, 1)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+api+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	if kind == "idempotent" {
		req.Header.Set("Idempotency-Key", fmt.Sprintf("outage-%d-%d", n, time.Now().UnixNano()))
	}
	o = outcome{kind: kind, start: time.Now()}
	defer func() { o.end = time.Now() }()
	resp, err := client.Do(req)
	if err != nil {
		o.err = err
		return o
	}
	defer resp.Body.Close()
	o.status, o.id = resp.StatusCode, resp.Header.Get("X-Request-Id")
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		o.err = err
		return o
	}
	var msg usageOrError
	parse := func(b []byte) {
		msg.Usage, msg.Error = nil, nil
		if json.Unmarshal(b, &msg) != nil {
			return
		}
		if msg.Usage != nil && msg.Usage.Cost != "" {
			o.cost = msg.Usage.Cost
		}
		if msg.Error != nil {
			o.code = msg.Error.Code
		}
	}
	if kind == "stream" && resp.StatusCode == 200 {
		for _, l := range strings.Split(string(raw), "\n") {
			if d, ok := strings.CutPrefix(l, "data: "); ok && d != "[DONE]" {
				parse([]byte(d))
			}
		}
	} else {
		parse(raw)
	}
	return o
}

// fleetLoad runs clients against the fleet's live instances until stop,
// a mix of non-streamed, streamed and idempotent requests. so far returns
// the outcomes so far; wait waits for the clients and returns every one.
func fleetLoad(procs func() []*proc, key string, clients int, stop <-chan struct{}) (so func() []outcome, wait func() []outcome) {
	var mu sync.Mutex
	var all []outcome
	var wg sync.WaitGroup
	kinds := []string{"plain", "stream", "idempotent"}
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Timeout: 30 * time.Second}
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				ps := procs()
				o := callFleet(client, ps[(c+n)%len(ps)].api, key, kinds[(c+n)%3], c*100000+n)
				mu.Lock()
				all = append(all, o)
				mu.Unlock()
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	so = func() []outcome { mu.Lock(); defer mu.Unlock(); return slices.Clone(all) }
	return so, func() []outcome { wg.Wait(); return all }
}

// TestOutageLosesNoCharge: three `tollgate serve` processes on one
// PostgreSQL under a mixed load, their sweep an hour apart; the database
// goes away (every connection reset, new ones refused) for 3 s, and one
// instance is killed with kill -9 while it is away. Then, per request id:
// every cost a client saw before the database came back is in the ledger
// within 10 s of its return (written by the instances' catch-up: no sweep
// runs), every cost a client saw is in it once, to the picodollar; nothing
// was answered 500; a refusal is 503 store_unavailable; no live instance
// keeps a hold; the audit is clean.
func TestOutageLosesNoCharge(t *testing.T) {
	gate, schema, gated := pgThroughGate(t)
	outageScenario(t, schema, gated, "1h", func(kill func()) (down, restored time.Time) {
		gate.cut()
		down = time.Now()
		time.Sleep(time.Second)
		kill()
		time.Sleep(2 * time.Second)
		gate.restore()
		return down, time.Now()
	})
}

// outageScenario runs three `tollgate serve` processes on the PostgreSQL
// schema at dsn under a mixed load, lets outage take the database away (and
// kill one instance with kill -9 while it is away), then checks, per
// request id, every cost shown against the ledger, the answers, the holds
// and the audit. outage returns when the database went away for the last
// time and when it came back.
//
// sweep is billing.sweep. At an hour, what the instances kept during the
// outage (charges in their journals, holds of requests that ended) reaches
// the database as soon as it is back only by the instances' own catch-up,
// not by a sweep (which would take up to billing.sweep, 30 s by default).
func outageScenario(t *testing.T, schema, dsn, sweep string, outage func(kill func()) (down, restored time.Time)) {
	st := postgres.OpenTestSchema(t, schema)
	sim := startFlatSim(t)
	config := multiprocConfig(t, "  postgres_url_env: TG_TEST_PG\n", sim.URL())
	editConfig(t, config, "  sweep: 200ms\n", "  sweep: "+sweep+"\n")
	f := &procFleet{t: t, bin: buildBinary(t), config: config, env: []string{"TG_TEST_PG=" + dsn}}
	var live struct {
		sync.Mutex
		procs []*proc
	}
	live.procs = []*proc{f.start(), f.start(), f.start()}
	procs := func() []*proc { live.Lock(); defer live.Unlock(); return live.procs }
	opening := tollgate.Dollars(1000)
	acct, key := fundAccount(t, st, opening)

	stop := make(chan struct{})
	soFar, wait := fleetLoad(procs, key, 9, stop)
	start := time.Now()
	time.Sleep(1500 * time.Millisecond)
	down, restored := outage(func() {
		live.Lock()
		killed := live.procs[2]
		live.procs = live.procs[:2]
		live.Unlock()
		killed.kill9(t)
	})
	// The costs shown before the database came back, some of them kept
	// by the instances (the killed one's in its journal): all in the
	// ledger within 10 s of its return.
	kept := map[string]tollgate.Amount{}
	for _, o := range soFar() {
		if o.status == 200 && o.cost != "" && o.end.Before(restored) {
			kept[o.id] = tollgate.MustParseAmount(o.cost)
		}
	}
	var late []string
	for {
		charged := map[string]tollgate.Amount{}
		err := st.Ledger(context.Background(), tollgate.UsageFilter{AccountID: acct.ID, Since: start.Add(-time.Minute)},
			func(e tollgate.LedgerEntry) error {
				if e.Kind == tollgate.LedgerCharge {
					charged[e.ID] = -e.Amount
				}
				return nil
			})
		late = late[:0]
		for id, cost := range kept {
			if got, ok := charged[id]; !ok || got != cost {
				late = append(late, id)
			}
		}
		if err == nil && len(late) == 0 {
			t.Logf("the %d costs shown before the database came back are all in the ledger %.2f s after it did", len(kept),
				time.Since(restored).Seconds())
			break
		}
		if time.Since(restored) > 10*time.Second {
			logWarnings(t, procs())
			t.Fatalf("%d of the %d costs shown before the database came back are not in the ledger 10 s after it did "+
				"(the next sweep is an hour away): %v (%v)", len(late), len(kept), late[:min(5, len(late))], err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Until(restored.Add(1500 * time.Millisecond)))
	close(stop)
	all := wait()

	var served, refused, cut, servedDown int
	var pending tollgate.Amount // shown while the database was away
	firstBack := time.Time{}    // the first answer served after it came back
	shown := map[string]tollgate.Amount{}
	for _, o := range all {
		if o.status == 200 && o.cost != "" {
			if o.end.After(down) && o.end.Before(restored) {
				servedDown++
				pending += tollgate.MustParseAmount(o.cost)
			}
			if o.start.After(restored) && (firstBack.IsZero() || o.end.Before(firstBack)) {
				firstBack = o.end
			}
		}
		switch {
		case o.err != nil:
			cut++ // the killed instance's requests: no answer, no cost shown
		case o.status == 200:
			served++
			if o.code != "" && o.cost != "" {
				t.Errorf("%s %s: a cost %s shown with error %s", o.kind, o.id, o.cost, o.code)
			}
			if o.cost != "" {
				shown[o.id] = tollgate.MustParseAmount(o.cost)
			} else if o.code == "" {
				t.Errorf("%s %s: 200 without a cost", o.kind, o.id)
			}
		case o.status == 503 && o.code == "store_unavailable":
			refused++
		default:
			t.Errorf("%s %s: %d %s", o.kind, o.id, o.status, o.code)
		}
	}
	t.Logf("%d requests: %d served, %d refused 503 store_unavailable, %d cut by the kill; "+
		"%d served while the database was away, charging %s USD then pending; first answer served %.2f s after it came back",
		len(all), served, refused, cut, servedDown, pending, firstBack.Sub(restored).Seconds())
	if refused == 0 || servedDown == 0 || firstBack.IsZero() {
		t.Errorf("the load did not meet the outage (%d refused, %d served during it) or was not served after it (%v)", refused, servedDown, firstBack)
	}

	// Every cost shown is charged once, to the picodollar, soon after the
	// database is back (the live instances write what they kept as soon
	// as it answers; the killed one's journal is applied by another).
	var missing []string
	deadline := time.Now().Add(20 * time.Second)
	for {
		missing = missing[:0]
		for id, cost := range shown {
			e, err := st.LedgerEntry(context.Background(), id)
			if err != nil {
				missing = append(missing, id)
				continue
			}
			if e.Amount != -cost {
				t.Fatalf("%s: ledger %s, shown %s", id, e.Amount, cost)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(missing) > 0 {
		logWarnings(t, procs())
		t.Fatalf("%d of %d costs shown are not in the ledger 20 s after the database came back: %v", len(missing), len(shown), missing[:min(5, len(missing))])
	}
	t.Logf("every cost shown in the ledger %.1f s after the database came back", time.Since(restored).Seconds())
	// The live instances keep nothing held: no hold of a request that
	// ended (those they could not settle or release during the outage
	// included), and their reservations go back when idle (a reservation
	// emptied by its charges may stay, holding nothing). What holds money
	// 10 s after the load is the killed instance's, its lease run out.
	deadline = time.Now().Add(10 * time.Second)
	for {
		hs, err := st.Holds(context.Background(), acct.ID)
		var left []tollgate.Hold
		for _, h := range hs {
			if !h.Ended.IsZero() || (h.Amount > 0 && h.Expires.After(time.Now())) {
				left = append(left, h)
			}
		}
		if err == nil && len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			logWarnings(t, procs())
			t.Fatalf("10 s after the load, held by live instances or marked ended: %+v %v", left, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A new instance sweeps the killed one's at its start (a reservation
	// its journal's charges emptied included); then nothing is held.
	p := f.start()
	deadline = time.Now().Add(15 * time.Second)
	for {
		b, err := st.Balance(context.Background(), acct.ID)
		hs, herr := st.Holds(context.Background(), acct.ID)
		expired := 0
		for _, h := range hs {
			if h.Expires.Before(time.Now()) {
				expired++
			}
		}
		if err == nil && herr == nil && b.Held == 0 && expired == 0 {
			break
		}
		if time.Now().After(deadline) {
			logWarnings(t, procs())
			t.Fatalf("still held 15 s after a new instance started: %+v %+v %v %v", b, hs, err, herr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	n, sum := countCharges(t, st, acct.ID)
	if n < len(shown) {
		t.Errorf("%d charges for %d costs shown", n, len(shown))
	}
	b, _ := st.Balance(context.Background(), acct.ID)
	if b.Balance != opening-sum {
		t.Errorf("balance %s, want %s less the charges %s", b.Balance, opening, sum)
	}
	mustAudit(t, st)
	// The new instance serves and charges once.
	if status, err := postTo(p.api, key, flatBody); err != nil || status != 200 {
		t.Fatalf("a new instance after the outage: %d %v", status, err)
	}
}
