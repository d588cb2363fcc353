package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/postgres"
	"github.com/tollgate/tollgate/simulate"
)

// A crash between the charge and the stored answer (docs/idempotency.md):
// a `tollgate serve` process is killed with kill -9 after a keyed request
// was charged and before its answer was stored; after the key's lease a
// retry of the same request does not run again (410
// idempotency_response_lost, naming the original request id). Then a batch
// of keyed requests is cut by a kill -9 and resent after the lease: no key
// is charged twice. TOLLGATE_IDEM_CRASH_KEYS sets the batch's size
// (scripts/idempotency-crash.sh runs thousands).

// idemCrashBody is answered after a second and a half, so the test can act
// while the request runs.
const idemCrashBody = `{"model":"bill-flat","max_tokens":10,"messages":[{"role":"user","content":"Once. [sim tokens=10 ttft=1500ms]"}]}`

// idemCrashLease is the idempotency lease of the processes under test.
const idemCrashLease = 2 * time.Second

func idemCrashConfig(t *testing.T, store, simURL string) string {
	t.Helper()
	path := multiprocConfig(t, store, simURL)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := fmt.Fprintf(f, "idempotency:\n  lease: %s\n", idemCrashLease); err != nil {
		t.Fatal(err)
	}
	return path
}

// lostAnswer checks a retry's answer: 410 idempotency_response_lost naming
// the original request id, not to be retried.
func lostAnswer(t *testing.T, r idemResponse, original string) {
	t.Helper()
	if r.err != nil || r.status != http.StatusGone || r.code() != "idempotency_response_lost" ||
		!strings.Contains(string(r.body), original) || r.header.Get("X-Should-Retry") != "false" {
		t.Errorf("retry after the crash: %d %s (X-Should-Retry %q), %v; want 410 idempotency_response_lost naming %s",
			r.status, r.body, r.header.Get("X-Should-Retry"), r.err, original)
	}
}

func TestIdempotencyCrashAfterTheChargeSQLite(t *testing.T) {
	bin := buildBinary(t)
	sim := startFlatSim(t)
	st, path := tempSQLite(t)
	f := &procFleet{t: t, bin: bin, config: idemCrashConfig(t, "  sqlite: "+path+"\n", sim.URL())}
	acct, key := fundAccount(t, st, flatHold*100_000)
	a := f.start()

	first := make(chan idemResponse, 1)
	go func() { first <- postIdem(a.api, key, "crash-1", idemCrashBody) }()
	if err := sim.WaitStats(30*time.Second, func(s simulate.Stats) bool { return s.InFlight == 1 }); err != nil {
		t.Fatalf("the request never reached the simulator: %v", err)
	}
	// Claimed and held: from now on nothing commits. The charge goes to the
	// process's charge journal, the answer to the client, and the stored
	// answer waits for the database, where the kill finds it.
	raw, release := holdSQLiteWriter(t, path)
	var r1 idemResponse
	select {
	case r1 = <-first:
	case <-time.After(5 * time.Second):
	}
	a.kill9(t)
	release()
	var original string
	if err := raw.QueryRow(`SELECT owner FROM idempotency_keys WHERE key = 'crash-1' AND status = 0`).Scan(&original); err != nil {
		t.Fatalf("the key is not in flight after the kill (%v): the test proves nothing", err)
	}
	if r1.status == http.StatusOK && r1.header.Get("X-Request-Id") != original {
		t.Errorf("the client was answered by %s, the key is held by %s", r1.header.Get("X-Request-Id"), original)
	}

	b := f.start() // applies the dead process's journal before serving
	if e, err := st.LedgerEntry(context.Background(), original); err != nil || e.Charge == nil {
		t.Fatalf("the first attempt's charge is not in the ledger when the next process serves: %+v, %v", e, err)
	}
	time.Sleep(idemCrashLease + 500*time.Millisecond)
	before := sim.Stats().Requests
	lostAnswer(t, postIdem(b.api, key, "crash-1", idemCrashBody), original)
	lostAnswer(t, postIdem(b.api, key, "crash-1", idemCrashBody), original)
	if n := sim.Stats().Requests - before; n != 0 {
		t.Errorf("the retries called the backend %d times", n)
	}
	if ids := charges(t, st, acct.ID); len(ids) != 1 || ids[0] != original {
		t.Errorf("charges %v, want only %s", ids, original)
	}

	// A batch cut by a kill -9, resent after the lease.
	idemCrashBatch(t, st, f, []*proc{b}, key, acct.ID)
	if t.Failed() {
		logWarnings(t, []*proc{b})
	}
}

func TestIdempotencyCrashAfterTheChargePostgres(t *testing.T) {
	schema := postgres.NewTestSchema(t) // skips without TOLLGATE_TEST_POSTGRES
	st := postgres.OpenTestSchema(t, schema)
	sim := startFlatSim(t)
	f := &procFleet{t: t, bin: buildBinary(t),
		config: idemCrashConfig(t, "  postgres_url_env: TG_TEST_PG\n", sim.URL()),
		env:    []string{"TG_TEST_PG=" + pgURLWithSchema(t, schema)}}
	acct, key := fundAccount(t, st, flatHold*100_000)
	procs := []*proc{f.start(), f.start(), f.start()}

	first := make(chan idemResponse, 1)
	go func() { first <- postIdem(procs[0].api, key, "crash-1", idemCrashBody) }()
	if err := sim.WaitStats(30*time.Second, func(s simulate.Stats) bool { return s.InFlight == 1 }); err != nil {
		t.Fatalf("the request never reached the simulator: %v", err)
	}
	// Claimed: lock its row, so that the charge commits and the answer
	// goes out but the stored answer waits, where the kill finds it.
	ctx := context.Background()
	tx, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var original string
	if err := tx.QueryRow(ctx, `SELECT owner FROM idempotency_keys WHERE scope = $1 AND key = 'crash-1' FOR UPDATE`,
		acct.ID).Scan(&original); err != nil {
		t.Fatal(err)
	}
	var r1 idemResponse
	select {
	case r1 = <-first:
	case <-time.After(5 * time.Second):
	}
	// The charge reaches the ledger soon after the answer (with the charge
	// journal, the default, the answer does not wait for its commit).
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := st.LedgerEntry(ctx, original); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the first attempt was never charged (answer %d %s)", r1.status, r1.body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The stored answer is waiting for the row. A statement the server has
	// received runs on after its client died, so the kill alone would let
	// it commit once the row is free: its session goes with the process, as
	// in a crash before the statement was sent.
	const waiting = `SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND wait_event_type = 'Lock'
		AND query LIKE 'UPDATE idempotency_keys SET status%'`
	var pid int32
	for deadline := time.Now().Add(10 * time.Second); ; {
		if err := st.Pool().QueryRow(ctx, waiting).Scan(&pid); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the answer was never stored: the test proves nothing")
		}
		time.Sleep(20 * time.Millisecond)
	}
	procs[0].kill9(t)
	if _, err := st.Pool().Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var status int
	if err := st.Pool().QueryRow(ctx, `SELECT status FROM idempotency_keys WHERE scope = $1 AND key = 'crash-1'`,
		acct.ID).Scan(&status); err != nil || status != 0 {
		t.Fatalf("after the kill the key has status %d (%v), want 0, in flight: the test proves nothing", status, err)
	}

	time.Sleep(idemCrashLease + 500*time.Millisecond)
	before := sim.Stats().Requests
	lostAnswer(t, postIdem(procs[1].api, key, "crash-1", idemCrashBody), original)
	lostAnswer(t, postIdem(procs[2].api, key, "crash-1", idemCrashBody), original)
	if n := sim.Stats().Requests - before; n != 0 {
		t.Errorf("the retries called the backend %d times", n)
	}
	if ids := charges(t, st, acct.ID); len(ids) != 1 || ids[0] != original {
		t.Errorf("charges %v, want only %s", ids, original)
	}

	procs[0] = f.start()
	idemCrashBatch(t, st, f, procs, key, acct.ID)
	if t.Failed() {
		logWarnings(t, procs)
	}
}

// idemCrashBatch sends TOLLGATE_IDEM_CRASH_KEYS (default 100) keyed requests
// spread over procs, TOLLGATE_IDEM_CRASH_CONC (64) at a time, each answered
// by the backend after TOLLGATE_IDEM_CRASH_TTFT (1s); kills procs[0] with
// kill -9 TOLLGATE_IDEM_CRASH_KILL_AFTER (1.5s) after the first, starts a new
// process in its place, resends every key after the lease until each has
// an answer (200 or 410), and checks that the ledger holds exactly one
// charge per key.
func idemCrashBatch(t *testing.T, st Store, f *procFleet, procs []*proc, apiKey, accountID string) {
	t.Helper()
	charged := len(charges(t, st, accountID))
	env := func(name, def string) string {
		if v := os.Getenv(name); v != "" {
			return v
		}
		return def
	}
	n, err1 := strconv.Atoi(env("TOLLGATE_IDEM_CRASH_KEYS", "100"))
	conc, err2 := strconv.Atoi(env("TOLLGATE_IDEM_CRASH_CONC", "64"))
	ttft, err3 := time.ParseDuration(env("TOLLGATE_IDEM_CRASH_TTFT", "1s"))
	killAfter, err4 := time.ParseDuration(env("TOLLGATE_IDEM_CRASH_KILL_AFTER", "1500ms"))
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || n < 1 || conc < 1 {
		t.Fatalf("TOLLGATE_IDEM_CRASH_*: %v %v %v %v", err1, err2, err3, err4)
	}
	keyOf := func(i int) string { return fmt.Sprintf("batch-%d", i) }
	body := strings.Replace(idemCrashBody, "ttft=1500ms", "ttft="+ttft.String(), 1)
	var firstOK, firstFailed atomic.Int64
	sem := make(chan struct{}, conc)
	var wg sync.WaitGroup
	killed := make(chan struct{})
	go func() {
		time.Sleep(killAfter)
		procs[0].kill9(t)
		close(killed)
	}()
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			r := postIdem(procs[i%len(procs)].api, apiKey, keyOf(i), body)
			if r.err == nil && r.status == http.StatusOK {
				firstOK.Add(1)
			} else {
				firstFailed.Add(1)
			}
		}()
	}
	wg.Wait()
	<-killed
	procs[0] = f.start()
	time.Sleep(idemCrashLease + 500*time.Millisecond)

	// Resend every key until it has an answer.
	var ran, replayed, lost, other atomic.Int64
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			for attempt := 0; ; attempt++ {
				r := postIdem(procs[i%len(procs)].api, apiKey, keyOf(i), body)
				switch {
				case r.err == nil && r.status == http.StatusOK && r.header.Get("Idempotent-Replayed") == "true":
					replayed.Add(1)
				case r.err == nil && r.status == http.StatusOK:
					ran.Add(1)
				case r.err == nil && r.status == http.StatusGone:
					lost.Add(1)
				case attempt < 20 && (r.err != nil || r.status == http.StatusConflict):
					time.Sleep(500 * time.Millisecond) // the lease of a key the dead process held
					continue
				default:
					other.Add(1)
					t.Errorf("resend of %s: %d %s, %v", keyOf(i), r.status, r.body, r.err)
				}
				return
			}
		}()
	}
	wg.Wait()
	// A charge reaches the ledger through the batch writer, after its answer
	// went out: wait (bounded) for every key's charge before counting.
	got := len(charges(t, st, accountID)) - charged
	for wait := time.Now().Add(20 * time.Second); got < n && time.Now().Before(wait); {
		time.Sleep(100 * time.Millisecond)
		got = len(charges(t, st, accountID)) - charged
	}
	t.Logf("%d keys: first send %d answered, %d cut by the kill; resend after the lease: %d ran, %d replayed, "+
		"%d answered idempotency_response_lost, %d other; %d charges for %d keys: %d keys charged twice",
		n, firstOK.Load(), firstFailed.Load(), ran.Load(), replayed.Load(), lost.Load(), other.Load(), got, n, got-n)
	if got != n {
		t.Errorf("%d charges for %d keys, each answered once", got, n)
	}
	// The books add up once the dead process's holds are swept.
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := billing.Audit(context.Background(), st, time.Now(), 0)
		if err == nil && r.OK {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("audit: %v %v", r.Problems, err)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
}
