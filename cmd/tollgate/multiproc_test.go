package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/postgres"
	"github.com/tollgate/tollgate/simulate"
	"github.com/tollgate/tollgate/sqlite"
)

// buildBinary compiles tollgate into a temp dir once per test.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "tollgate")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// procFleet is a set of `tollgate serve` processes on one config.
type procFleet struct {
	t      *testing.T
	bin    string
	config string
	env    []string
}

type proc struct {
	cmd *exec.Cmd
	api string // host:port

	mu       sync.Mutex
	warnings []string // WARN and ERROR log lines after it started serving
}

// logWarnings reports each process's warnings (to explain a failure: a hold
// a sweeper released, a charge beyond what the account could pay).
func logWarnings(t *testing.T, procs []*proc) {
	t.Helper()
	for i, p := range procs {
		p.mu.Lock()
		for _, w := range p.warnings {
			t.Logf("process %d: %s", i, w)
		}
		p.mu.Unlock()
	}
}

// multiprocConfig is a config with short leases so that a dead process's
// hold is swept within seconds.
func multiprocConfig(t *testing.T, store, simURL string) string {
	t.Helper()
	doc := `listen:
  api: 127.0.0.1:0
store:
` + store + `
health:
  interval: "off"
billing:
  lease: 1500ms
  renew: 300ms
  sweep: 200ms
models:
  - id: bill-flat
    kind: chat
    context_length: 32768
    max_output_tokens: 4096
    backends:
      - class: network
        upstream_model: up-vllm
        capabilities: [tools]
        rates: {input: "0", output: "3.000007"}
        nodes:
          - {name: node-flat, url: "` + simURL + `/v1", flavour: vllm}
`
	path := filepath.Join(t.TempDir(), "tollgate.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// start runs one `tollgate serve` and waits for its "serving" log line.
func (f *procFleet) start() *proc {
	f.t.Helper()
	cmd := exec.Command(f.bin, "serve", "--config", f.config, "--log-level", "info")
	cmd.Dir = filepath.Dir(f.config) // PostgreSQL's charge journal: each test its own
	cmd.Env = append(os.Environ(), f.env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		f.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	p := &proc{cmd: cmd}
	f.t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		}
	})
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sent := false
		for sc.Scan() {
			var line struct {
				Msg string `json:"msg"`
				API string `json:"api"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "tollgate serving" && !sent {
				ready <- line.API
				sent = true
			} else if !strings.Contains(sc.Text(), `"level":"INFO"`) {
				if !sent {
					f.t.Logf("serve: %s", sc.Text())
				} else {
					p.mu.Lock()
					p.warnings = append(p.warnings, sc.Text())
					p.mu.Unlock()
				}
			}
		}
		if !sent {
			close(ready)
		}
	}()
	select {
	case api, ok := <-ready:
		if !ok {
			f.t.Fatal("tollgate serve exited before serving")
		}
		p.api = api
	case <-time.After(30 * time.Second):
		f.t.Fatal("tollgate serve did not start within 30s")
	}
	return p
}

// kill9 ends the process at once: no shutdown, no release, no settle.
func (p *proc) kill9(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
}

// fundAccount creates an account with balance and a key, through the store.
func fundAccount(t *testing.T, st tollgate.Store, balance tollgate.Amount) (tollgate.Account, string) {
	t.Helper()
	ctx := context.Background()
	a := tollgate.Account{ID: tollgate.NewID("acct_"), Name: "fleet", Balance: balance, Created: time.Now().UTC()}
	if err := st.CreateAccount(ctx, a); err != nil {
		t.Fatal(err)
	}
	secret := tollgate.NewKeySecret()
	k := tollgate.Key{ID: tollgate.NewID("key_"), AccountID: a.ID, Prefix: tollgate.DisplayPrefix(secret), Created: time.Now().UTC()}
	if err := st.CreateKey(ctx, k, tollgate.HashKey(secret)); err != nil {
		t.Fatal(err)
	}
	return a, secret
}

func postTo(api, key, body string) (int, error) {
	req, _ := http.NewRequest(http.MethodPost, "http://"+api+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

func startFlatSim(t *testing.T) *simulate.Running {
	t.Helper()
	sim, err := simulate.Start(simulate.Config{Flavour: simulate.VLLM, Models: []string{"up-vllm"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	return sim
}

// Three `tollgate serve` processes on one PostgreSQL, 500 concurrent
// requests spread over them, an account that affords exactly 137: exactly
// 137 served, the others 402, the books add up.
func TestBillingPostgresThreeProcesses(t *testing.T) {
	schema := postgres.NewTestSchema(t)
	st := postgres.OpenTestSchema(t, schema)
	sim := startFlatSim(t)
	f := &procFleet{t: t, bin: buildBinary(t),
		config: multiprocConfig(t, "  postgres_url_env: TG_TEST_PG\n", sim.URL()),
		env:    []string{"TG_TEST_PG=" + pgURLWithSchema(t, schema)}}
	procs := []*proc{f.start(), f.start(), f.start()}
	const n, total = 137, 500
	acct, key := fundAccount(t, st, flatHold*n+flatHold-1)
	var served, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range total {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, err := postTo(procs[i%3].api, key, flatBody)
			switch {
			case err != nil:
				t.Errorf("request: %v", err)
			case status == 200:
				served.Add(1)
			case status == 402:
				refused.Add(1)
			default:
				t.Errorf("status %d", status)
			}
		}()
	}
	wg.Wait()
	waitSettled(t, st, acct.ID)
	if served.Load() != n || refused.Load() != total-n {
		t.Errorf("served %d, refused %d; want exactly %d and %d", served.Load(), refused.Load(), n, total-n)
		logWarnings(t, procs)
	}
	b, err := st.Balance(context.Background(), acct.ID)
	if err != nil || b.Balance != flatHold-1 || b.Held != 0 {
		t.Errorf("balance %+v, %v; want %s and nothing held", b, err, flatHold-1)
	}
	if c, sum := countCharges(t, st, acct.ID); c != n || sum != flatHold*n {
		t.Errorf("%d charges summing to %s, want %d and %s", c, sum, n, flatHold*n)
	}
	mustAudit(t, st)
}

func pgURLWithSchema(t *testing.T, schema string) string {
	u := os.Getenv(postgres.TestEnv)
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	return u + sep + "search_path=" + schema
}

// kill -9 of a process in the middle of a stream: its hold outlives it
// until the lease ends, then a restarted process sweeps it; the cut request
// is charged what its process recorded of it in the charge journal (the
// default with either store: at least its first token,
// TestBillingStreamCutByACrashIsCharged), and the books add up.
func TestBillingCrashMidStream(t *testing.T) {
	bin := buildBinary(t)
	for _, storeName := range []string{"sqlite", "postgres"} {
		t.Run(storeName, func(t *testing.T) {
			sim := startFlatSim(t)
			var st interface {
				Store
				Holds(ctx context.Context, accountID string) ([]tollgate.Hold, error)
			}
			f := &procFleet{t: t, bin: bin}
			if storeName == "sqlite" {
				path := filepath.Join(t.TempDir(), "t.db")
				db, err := sqlite.Open(path)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { db.Close() })
				st = db
				f.config = multiprocConfig(t, "  sqlite: "+path+"\n", sim.URL())
			} else {
				schema := postgres.NewTestSchema(t)
				st = postgres.OpenTestSchema(t, schema)
				f.config = multiprocConfig(t, "  postgres_url_env: TG_TEST_PG\n", sim.URL())
				f.env = []string{"TG_TEST_PG=" + pgURLWithSchema(t, schema)}
			}
			opening := tollgate.Dollars(1)
			acct, key := fundAccount(t, st, opening)
			a := f.start()

			// A slow stream through a; read its first chunk, then kill a.
			req, _ := http.NewRequest(http.MethodPost, "http://"+a.api+"/v1/chat/completions", strings.NewReader(
				`{"model":"bill-flat","stream":true,"messages":[{"role":"user","content":"Talk [sim tokens=3000 gap=10ms]"}]}`))
			req.Header.Set("Authorization", "Bearer "+key)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("stream: %v %v", resp, err)
			}
			reqID := resp.Header.Get("X-Request-Id")
			// Read until the second chunk with text: the stream's first
			// progress record (made right after its first token, before the
			// next chunk is read from the backend) is then in the journal.
			br := bufio.NewReader(resp.Body)
			for texts := 0; texts < 2; {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("reading the stream: %v", err)
				}
				if strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`) {
					texts++
				}
			}
			hs, err := st.Holds(context.Background(), acct.ID)
			if err != nil || len(hs) != 1 || hs[0].RequestID != reqID {
				t.Fatalf("holds during the stream: %+v, %v", hs, err)
			}
			a.kill9(t)
			resp.Body.Close()
			// The hold is still there: nobody released it.
			if hs, _ := st.Holds(context.Background(), acct.ID); len(hs) != 1 {
				t.Fatalf("holds right after kill -9: %+v", hs)
			}
			b := f.start()
			deadline := time.Now().Add(20 * time.Second)
			for {
				hs, err := st.Holds(context.Background(), acct.ID)
				if err != nil {
					t.Fatal(err)
				}
				if len(hs) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the dead process's hold was not swept: %+v", hs)
				}
				time.Sleep(50 * time.Millisecond)
			}
			const wantCut = 1 // both stores keep a charge journal by default
			nCut, cut := countCharges(t, st, acct.ID)
			if nCut != wantCut {
				t.Errorf("%d charges for a stream cut by a crash, want %d", nCut, wantCut)
			}
			bal, err := st.Balance(context.Background(), acct.ID)
			if err != nil || bal.Balance != opening-cut || bal.Held != 0 {
				t.Errorf("after the sweep: %+v, %v; want the opening balance less %s and nothing held", bal, err, cut)
			}
			// The restarted process serves and charges once.
			if status, err := postTo(b.api, key, flatBody); err != nil || status != 200 {
				t.Fatalf("after restart: %d %v", status, err)
			}
			waitSettled(t, st, acct.ID)
			if c, sum := countCharges(t, st, acct.ID); c != wantCut+1 || sum != cut+flatHold {
				t.Errorf("%d charges (%s) after one request, want %d (%s)", c, sum, wantCut+1, cut+flatHold)
			}
			r, err := billing.Audit(context.Background(), st, time.Now(), 0)
			if err != nil || !r.OK {
				t.Errorf("audit: %v %v", r.Problems, err)
			}
		})
	}
}

// waitSettled waits until nothing is held on the account: the processes'
// settles, committed just after their responses, are all in.
func waitSettled(t *testing.T, st Store, acct string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := st.Balance(context.Background(), acct)
		if err == nil && b.Held == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still held after 10s: %+v, %v", b, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill -9 of a process after it answered a request and before that
// request's charge was committed (the test holds SQLite's write lock, so the
// charge's batch cannot commit): the charge was in the process's journal
// (docs/billing.md, "The charge journal"), and the next process applies it,
// once, at the cost the client was shown; the books add up.
func TestBillingCrashAfterTheResponse(t *testing.T) {
	bin := buildBinary(t)
	sim := startFlatSim(t)
	st, path := tempSQLite(t)
	f := &procFleet{t: t, bin: bin, config: multiprocConfig(t, "  sqlite: "+path+"\n", sim.URL())}
	opening := flatHold * 1000 // rich enough for a reservation: holds in memory
	acct, key := fundAccount(t, st, opening)
	a := f.start()

	post := func(api string) (cost tollgate.Amount, reqID string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://"+api+"/v1/chat/completions", strings.NewReader(flatBody))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			Usage struct {
				Cost string `json:"cost"`
			} `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != 200 {
			t.Fatalf("status %d, %v", resp.StatusCode, err)
		}
		cost, err = tollgate.ParseAmount(body.Usage.Cost)
		if err != nil || cost <= 0 || resp.Header.Get("X-Tollgate-Cost") != body.Usage.Cost {
			t.Fatalf("usage.cost %q, X-Tollgate-Cost %q: %v", body.Usage.Cost, resp.Header.Get("X-Tollgate-Cost"), err)
		}
		return cost, resp.Header.Get("X-Request-Id")
	}
	// The first request makes the reservation (a commit of its own).
	cost1, id1 := post(a.api)
	ledgerEntry(t, st, id1)

	// Nothing can commit now; the process still answers.
	_, release := holdSQLiteWriter(t, path)
	cost2, id2 := post(a.api)
	a.kill9(t)
	release()
	if _, err := st.LedgerEntry(context.Background(), id2); err == nil {
		t.Fatal("the second charge was committed before the kill: the test proves nothing")
	}

	b := f.start()
	e := ledgerEntry(t, st, id2)
	if e.Amount != -cost2 || e.Charge == nil || e.Charge.Cost != cost2 {
		t.Errorf("the recovered charge: %+v; the client was shown %s", e, cost2)
	}
	// The dead process's reservation is swept after its lease; then the
	// books hold exactly the two charges.
	deadline := time.Now().Add(20 * time.Second)
	for {
		bal, err := st.Balance(context.Background(), acct.ID)
		if err != nil {
			t.Fatal(err)
		}
		if bal.Held == 0 {
			if want := opening - cost1 - cost2; bal.Balance != want {
				t.Errorf("balance %s, want %s", bal.Balance, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still held: %+v", bal)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if c, sum := countCharges(t, st, acct.ID); c != 2 || sum != cost1+cost2 {
		t.Errorf("%d charges (%s), want 2 (%s)", c, sum, cost1+cost2)
	}
	ents, _ := os.ReadDir(path + "-charges")
	if len(ents) != 1 {
		t.Errorf("journals left: %d; want only the running process's", len(ents))
	}
	r, err := billing.Audit(context.Background(), st, time.Now(), 0)
	if err != nil || !r.OK {
		t.Errorf("audit: %v %v", r.Problems, err)
	}
	if t.Failed() {
		logWarnings(t, []*proc{b})
	}
}

// tempSQLite opens a migrated SQLite store in a fresh file, closed at the
// test's end, and returns it with its path (for a process's config).
func tempSQLite(t *testing.T) (*sqlite.DB, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "t.db")
	st, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, path
}

// holdSQLiteWriter takes the write lock of the SQLite file at path from a
// connection of its own, so that nothing else commits until release; raw
// reads the file (closed at the test's end).
func holdSQLiteWriter(t *testing.T, path string) (raw *sql.DB, release func()) {
	t.Helper()
	raw, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	conn, err := raw.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	return raw, func() {
		t.Helper()
		if _, err := conn.ExecContext(context.Background(), "ROLLBACK"); err != nil {
			t.Fatal(err)
		}
	}
}
