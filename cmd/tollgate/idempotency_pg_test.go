package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/postgres"
	"github.com/tollgate/tollgate/simulate"
)

// instance is one `tollgate serve` process.
type instance struct {
	cmd  *exec.Cmd
	api  string // host:port
	mu   sync.Mutex
	logs bytes.Buffer
	done chan struct{} // closed when the process has exited
}

func (in *instance) log() string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.logs.String()
}

// buildTollgate builds this command into a temp dir.
func buildTollgate(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "tollgate")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// startInstance runs `tollgate serve` and waits for its API address (from
// its "tollgate serving" log line).
func startInstance(t *testing.T, bin, config string, env []string) *instance {
	t.Helper()
	in := &instance{done: make(chan struct{})}
	in.cmd = exec.Command(bin, "serve", "--config", config, "--log-level", "info")
	in.cmd.Dir = filepath.Dir(config) // PostgreSQL's charge journal: each test its own
	in.cmd.Env = append(os.Environ(), env...)
	stderr, err := in.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := in.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		defer close(in.done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			in.mu.Lock()
			in.logs.Write(line)
			in.logs.WriteByte('\n')
			in.mu.Unlock()
			var l struct {
				Msg string `json:"msg"`
				API string `json:"api"`
			}
			if json.Unmarshal(line, &l) == nil && l.Msg == "tollgate serving" {
				addr <- l.API
			}
		}
		_ = in.cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = in.cmd.Process.Kill()
		<-in.done
		if t.Failed() {
			t.Logf("log of instance %s:\n%s", in.api, in.log())
		}
	})
	select {
	case in.api = <-addr:
	case <-in.done:
		t.Fatalf("tollgate serve exited:\n%s", in.log())
	case <-time.After(60 * time.Second):
		t.Fatalf("tollgate serve did not start:\n%s", in.log())
	}
	return in
}

const multiConfig = `listen:
  api: 127.0.0.1:0
store:
  postgres_url_env: TG_IDEM_TEST_PG
health:
  interval: "off"
idempotency:
  lease: 2s
models:
  - id: idem
    kind: chat
    context_length: 32768
    max_output_tokens: 4096
    backends:
      - class: network
        upstream_model: up
        capabilities: [tools]
        rates: {input: "1", output: "2"}
        nodes:
          - {name: sim, url: "%s/v1", flavour: vllm}
`

// Three `tollgate serve` processes on one PostgreSQL: one key runs once
// among them; kill -9 of the one running a key frees it when the lease ends.
func TestIdempotencyAcrossInstancesPostgres(t *testing.T) {
	schema := postgres.NewTestSchema(t) // skips without TOLLGATE_TEST_POSTGRES
	db := postgres.OpenTestSchema(t, schema)
	u, err := url.Parse(os.Getenv(postgres.TestEnv))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()

	ctx := context.Background()
	acct := tollgate.Account{ID: tollgate.NewID("acct_"), Name: "multi", Balance: tollgate.Dollars(100), Created: time.Now().UTC()}
	if err := db.CreateAccount(ctx, acct); err != nil {
		t.Fatal(err)
	}
	secret := tollgate.NewKeySecret()
	if err := db.CreateKey(ctx, tollgate.Key{ID: tollgate.NewID("key_"), AccountID: acct.ID, Name: "k",
		Prefix: tollgate.DisplayPrefix(secret), Created: time.Now().UTC()}, tollgate.HashKey(secret)); err != nil {
		t.Fatal(err)
	}
	sim, err := simulate.Start(simulate.Config{Flavour: simulate.VLLM, Models: []string{"up"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "tollgate.yaml")
	if err := os.WriteFile(cfgPath, fmt.Appendf(nil, multiConfig, sim.URL()), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := buildTollgate(t)
	env := []string{"TG_IDEM_TEST_PG=" + u.String()}
	ins := make([]*instance, 3)
	var wg sync.WaitGroup
	for i := range ins {
		wg.Add(1)
		go func() { defer wg.Done(); ins[i] = startInstance(t, bin, cfgPath, env) }()
	}
	wg.Wait()
	for _, in := range ins {
		if in == nil || in.api == "" {
			t.FailNow()
		}
	}

	// 50 identical requests with one key, spread over the three instances.
	body := `{"model":"idem","messages":[{"role":"user","content":"Once among three. [sim ttft=300ms]"}]}`
	rs := sendConcurrently(50, func(i int) idemResponse { return postIdem(ins[i%3].api, secret, "multi-1", body) })
	orig := checkConcurrent(t, rs)
	if n := sim.Stats().Requests; n != 1 {
		t.Errorf("the simulator saw %d calls, want 1", n)
	}
	for _, in := range ins {
		checkReplay(t, orig, postIdem(in.api, secret, "multi-1", body))
	}
	if r := postIdem(ins[2].api, secret, "multi-1", strings.Replace(body, "three", "four", 1)); r.status != http.StatusUnprocessableEntity {
		t.Errorf("different body on another instance: %d %s, want 422", r.status, r.body)
	}
	if ids := charges(t, db, acct.ID); len(ids) != 1 || ids[0] != orig.header.Get("X-Request-Id") {
		t.Errorf("charges = %v, want one, for %s", ids, orig.header.Get("X-Request-Id"))
	}

	// kill -9 of the instance running a key.
	sim.SetFault(simulate.FaultHang)
	body2 := `{"model":"idem","messages":[{"role":"user","content":"Survive a crash."}]}`
	first := make(chan idemResponse, 1)
	go func() { first <- postIdem(ins[0].api, secret, "multi-2", body2) }()
	if err := sim.WaitStats(30*time.Second, func(s simulate.Stats) bool { return s.InFlight == 1 }); err != nil {
		t.Fatalf("the first request never reached the simulator: %v", err)
	}
	if r := postIdem(ins[1].api, secret, "multi-2", body2); r.status != http.StatusConflict || r.code() != "idempotency_key_in_flight" {
		t.Fatalf("while instance 0 runs it: %d %s, want 409", r.status, r.body)
	}
	if err := ins[0].cmd.Process.Kill(); err != nil { // SIGKILL: no cleanup at all
		t.Fatal(err)
	}
	<-ins[0].done
	if r := <-first; r.err == nil {
		t.Errorf("the killed instance answered: %d %s", r.status, r.body)
	}
	sim.SetFault(simulate.FaultNone)
	before := sim.Stats().Requests
	// Until the lease (2s) ends the key is in flight; the client retries as
	// told by Retry-After, as the official clients do.
	var r idemResponse
	conflicts := 0
	for ; ; conflicts++ {
		r = postIdem(ins[1].api, secret, "multi-2", body2)
		if r.status != http.StatusConflict || conflicts == 30 {
			break
		}
		wait, _ := strconv.Atoi(r.header.Get("Retry-After"))
		time.Sleep(time.Duration(min(wait, 1)) * time.Second)
	}
	t.Logf("after kill -9: %d conflicts, then %d", conflicts, r.status)
	if r.status != 200 || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after the crash: %d %s, want a fresh 200", r.status, r.body)
	}
	if got := sim.Stats().Requests - before; got != 1 {
		t.Errorf("the retry called the simulator %d times, want 1", got)
	}
	checkReplay(t, r, postIdem(ins[2].api, secret, "multi-2", body2))
	// The answer went out once its charge was in the charge journal; the
	// commit follows within a batch.
	ids := charges(t, db, acct.ID)
	for deadline := time.Now().Add(10 * time.Second); len(ids) < 2 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		ids = charges(t, db, acct.ID)
	}
	if len(ids) != 2 || ids[1] != r.header.Get("X-Request-Id") && ids[0] != r.header.Get("X-Request-Id") {
		t.Errorf("charges = %v, want two: multi-1's and the retry's %s", ids, r.header.Get("X-Request-Id"))
	}
}
