package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/idempotency"
	"github.com/tollgate/tollgate/sqlite"
)

// clock is an injectable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// renewSpy passes calls to a store and reports each renewal.
type renewSpy struct {
	idempotency.Store
	renewed chan error
}

func (s *renewSpy) RenewIdempotency(ctx context.Context, k tollgate.IdempotencyKey, owner string, expires time.Time) error {
	err := s.Store.RenewIdempotency(ctx, k, owner, expires)
	select {
	case s.renewed <- err:
	default:
	}
	return err
}

func openStore(t *testing.T) *sqlite.DB {
	t.Helper()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "t.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

type fixture struct {
	t     *testing.T
	k     *idempotency.Keeper
	clock *clock
	mu    sync.Mutex
	runs  int
}

func newFixture(t *testing.T, st idempotency.Store, o idempotency.Options) *fixture {
	f := &fixture{t: t, clock: &clock{t: t0}}
	o.Now = f.clock.Now
	f.k = idempotency.New(st, o)
	return f
}

const body = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`

// answer is a run that writes a 200 the way the relay does and counts itself.
func (f *fixture) answer(text string) func(http.ResponseWriter) error {
	return func(w http.ResponseWriter) error {
		f.mu.Lock()
		f.runs++
		f.mu.Unlock()
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("X-Tollgate-Backend", "network")
		h.Set("X-Tollgate-Cost", "0.000123")
		h.Set("X-Not-Replayed", "x")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(text))
		return nil
	}
}

func (f *fixture) serve(key, reqBody, id string, run func(http.ResponseWriter) error) (*httptest.ResponseRecorder, idempotency.Outcome, error) {
	w := httptest.NewRecorder()
	w.Header().Set("X-Request-Id", id) // as the middleware does
	out, err := f.k.Serve(context.Background(), w, idempotency.Request{Scope: "acct_1", Key: key, Body: []byte(reqBody), ID: id}, run)
	return w, out, err
}

func (f *fixture) runCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.runs
}

func wantCode(t *testing.T, err error, code tollgate.Code) *tollgate.Error {
	t.Helper()
	var e *tollgate.Error
	if !errors.As(err, &e) || e.Code != code {
		t.Fatalf("error = %v, want %s", err, code)
	}
	return e
}

// A success is replayed byte for byte with the original's headers and id,
// for exactly the TTL; after that the key runs afresh, and the purge removes it.
func TestReplayUntilTTL(t *testing.T) {
	st := openStore(t)
	f := newFixture(t, st, idempotency.Options{TTL: 24 * time.Hour})
	w1, out, err := f.serve("k1", body, "req_1", f.answer(`{"answer":1}`))
	if err != nil || out != idempotency.Ran || w1.Code != 200 || w1.Body.String() != `{"answer":1}` {
		t.Fatalf("first: %v %v %d %q", out, err, w1.Code, w1.Body)
	}
	if w1.Header().Get("Idempotent-Replayed") != "" {
		t.Error("the original response says Idempotent-Replayed")
	}
	f.clock.Set(t0.Add(24*time.Hour - time.Microsecond))
	w2, out, err := f.serve("k1", body, "req_2", f.answer(`{"answer":2}`))
	if err != nil || out != idempotency.Replayed {
		t.Fatalf("second: %v %v", out, err)
	}
	if w2.Code != 200 || w2.Body.String() != w1.Body.String() {
		t.Errorf("replay = %d %q, want 200 %q", w2.Code, w2.Body, w1.Body)
	}
	for _, h := range []string{"Content-Type", "X-Tollgate-Backend", "X-Tollgate-Cost"} {
		if w2.Header().Get(h) != w1.Header().Get(h) {
			t.Errorf("replayed %s = %q, want %q", h, w2.Header().Get(h), w1.Header().Get(h))
		}
	}
	if got := w2.Header().Get("X-Request-Id"); got != "req_1" {
		t.Errorf("replayed X-Request-Id = %q, want the original req_1", got)
	}
	if w2.Header().Get("Idempotent-Replayed") != "true" || w2.Header().Get("X-Not-Replayed") != "" {
		t.Errorf("replay headers = %v", w2.Header())
	}
	if f.runCount() != 1 {
		t.Fatalf("ran %d times before the TTL, want 1", f.runCount())
	}
	// Pretty-printing the same request is the same request.
	pretty := strings.ReplaceAll(strings.ReplaceAll(body, ",", ",\n  "), ":", ": ")
	if _, out, err := f.serve("k1", pretty, "req_3", f.answer("x")); err != nil || out != idempotency.Replayed {
		t.Errorf("whitespace-only difference: %v %v, want a replay", out, err)
	}
	// Expired: runs again.
	f.clock.Set(t0.Add(24 * time.Hour))
	w4, out, err := f.serve("k1", body, "req_4", f.answer(`{"answer":4}`))
	if err != nil || out != idempotency.Ran || w4.Body.String() != `{"answer":4}` || f.runCount() != 2 {
		t.Errorf("after the TTL: %v %v %q, runs %d; want a fresh run", out, err, w4.Body, f.runCount())
	}
	// The purge removes what expired, and only that.
	f.clock.Set(t0.Add(48*time.Hour + time.Second))
	if _, _, err := f.serve("k2", body, "req_5", f.answer("{}")); err != nil {
		t.Fatal(err)
	}
	n, err := f.k.Purge(context.Background())
	if err != nil || n != 1 {
		t.Errorf("Purge = %d, %v; want 1 (k1, expired at t0+48h)", n, err)
	}
}

func TestMismatchIs422(t *testing.T) {
	f := newFixture(t, openStore(t), idempotency.Options{})
	if _, _, err := f.serve("k", body, "req_1", f.answer("{}")); err != nil {
		t.Fatal(err)
	}
	for name, other := range map[string]string{
		"another message": strings.Replace(body, "hi", "ho", 1),
		"another model":   strings.Replace(body, `"m"`, `"m2"`, 1),
		"keys reordered":  `{"messages":[{"role":"user","content":"hi"}],"model":"m"}`,
		"space in string": strings.Replace(body, "hi", "h i", 1),
	} {
		_, out, err := f.serve("k", other, "req_2", f.answer("{}"))
		if out != idempotency.Refused {
			t.Errorf("%s: outcome %v", name, out)
		}
		wantCode(t, err, tollgate.CodeIdempotencyKeyReused)
	}
	if f.runCount() != 1 {
		t.Errorf("runs = %d, want 1", f.runCount())
	}
}

// Any failure releases the key: an error, a non-2xx written status, a panic,
// a response over the size bound. The retry runs afresh.
func TestFailureReleases(t *testing.T) {
	f := newFixture(t, openStore(t), idempotency.Options{MaxResponseBytes: 10})
	cases := map[string]func(http.ResponseWriter) error{
		"error": func(http.ResponseWriter) error {
			return tollgate.Errorf(tollgate.CodeInsufficientBalance, "no money")
		},
		"504": func(http.ResponseWriter) error { return tollgate.Errorf(tollgate.CodeTimeout, "slow") },
		"written 500": func(w http.ResponseWriter) error {
			w.WriteHeader(http.StatusInternalServerError)
			return nil
		},
		"nothing written": func(http.ResponseWriter) error { return nil },
		"too large":       f.answer(`{"answer":"longer than ten bytes"}`),
		"panic":           func(http.ResponseWriter) error { panic("boom") },
	}
	for name, fail := range cases {
		t.Run(name, func(t *testing.T) {
			key := "k-" + name
			func() {
				defer func() { _ = recover() }()
				w, _, _ := f.serve(key, body, "req_a", fail)
				if name == "too large" && w.Body.Len() == 0 {
					t.Error("a too large response was not delivered")
				}
			}()
			before := f.runCount()
			w, out, err := f.serve(key, body, "req_b", f.answer(`{"ok":1}`))
			if err != nil || out != idempotency.Ran || w.Body.String() != `{"ok":1}` || f.runCount() != before+1 {
				t.Fatalf("retry after %s: %v %v %q; want a fresh run", name, out, err, w.Body)
			}
			// And the retry's success is now what is kept.
			w, out, _ = f.serve(key, body, "req_c", f.answer("other"))
			if out != idempotency.Replayed || w.Body.String() != `{"ok":1}` {
				t.Errorf("after the retry: %v %q, want a replay of it", out, w.Body)
			}
		})
	}
}

// While the first runs: 409 with Retry-After. When its instance dies (its
// lease ends), the next request takes the key over; the old owner, if it was
// only slow, can neither store its answer nor free the new owner's claim.
func TestInFlightAndLeaseTakeover(t *testing.T) {
	f := newFixture(t, openStore(t), idempotency.Options{Lease: time.Hour})
	started, finish := make(chan struct{}), make(chan struct{})
	slow := func(w http.ResponseWriter) error {
		close(started)
		<-finish
		return f.answer(`{"slow":1}`)(w)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, _, err := f.serve("k", body, "req_slow", slow); err != nil {
			t.Errorf("slow: %v", err)
		}
	}()
	<-started
	f.clock.Set(t0.Add(20 * time.Second))
	_, _, err := f.serve("k", body, "req_2", f.answer("x"))
	e := wantCode(t, err, tollgate.CodeIdempotencyKeyInFlight)
	if e.RetryAfter < 1 || e.RetryAfter > 30 {
		t.Errorf("Retry-After = %d, want 1..30", e.RetryAfter)
	}
	// The lease ends (as if req_slow's instance had died).
	f.clock.Set(t0.Add(time.Hour))
	w, out, err := f.serve("k", body, "req_3", f.answer(`{"fresh":1}`))
	if err != nil || out != idempotency.Ran || w.Body.String() != `{"fresh":1}` {
		t.Fatalf("after the lease: %v %v %q", out, err, w.Body)
	}
	close(finish)
	wg.Wait()
	w, out, _ = f.serve("k", body, "req_4", f.answer("x"))
	if out != idempotency.Replayed || w.Body.String() != `{"fresh":1}` {
		t.Errorf("replay = %v %q, want req_3's answer", out, w.Body)
	}
}

// A running request renews its lease, so it may outlive one lease.
func TestLeaseRenewedWhileRunning(t *testing.T) {
	spy := &renewSpy{Store: openStore(t), renewed: make(chan error, 1)}
	const lease = 90 * time.Millisecond // renewed every 30ms of real time
	f := newFixture(t, spy, idempotency.Options{Lease: lease})
	started, finish := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _, _ = f.serve("k", body, "req_1", func(w http.ResponseWriter) error {
			close(started)
			<-finish
			return f.answer("{}")(w)
		})
	}()
	<-started
	// An hour passes on the clock; the next renewal extends the lease from there.
	f.clock.Set(t0.Add(time.Hour))
	if err := <-spy.renewed; err != nil {
		t.Fatalf("renew: %v", err)
	}
	f.clock.Set(t0.Add(time.Hour + lease/2))
	_, _, err := f.serve("k", body, "req_2", f.answer("x"))
	wantCode(t, err, tollgate.CodeIdempotencyKeyInFlight)
	close(finish)
	wg.Wait()
}

func TestStreamIgnoresTheKey(t *testing.T) {
	f := newFixture(t, openStore(t), idempotency.Options{})
	stream := `{"model":"m","stream":true,"messages":[]}`
	// Whatever the key holds, even what a non-streamed request would be refused for.
	for i, k := range []string{"k", "k", "", strings.Repeat("a", 256)} {
		_, out, err := f.serve(k, stream, "req", f.answer("data: x\n\n"))
		if err != nil || out != idempotency.Ran || f.runCount() != i+1 {
			t.Fatalf("stream %d (key %q): %v %v, runs %d", i, k, out, err, f.runCount())
		}
	}
	if !idempotency.Streamed([]byte(stream)) || idempotency.Streamed([]byte(body)) {
		t.Error("Streamed does not tell a stream from a non-streamed body")
	}
}

func TestInvalidKey(t *testing.T) {
	f := newFixture(t, openStore(t), idempotency.Options{})
	for _, k := range []string{"", strings.Repeat("a", 256), "tab\there", "nl\n", "é", "\x7f"} {
		_, _, err := f.serve(k, body, "req", f.answer("{}"))
		wantCode(t, err, tollgate.CodeInvalidIdempotencyKey)
	}
	for _, k := range []string{"a", strings.Repeat("~", 255), "8f14e45f-ceea-467f-a0e6-6c3b1e0f2b7a", "with space !\"#"} {
		if err := idempotency.ValidKey(k); err != nil {
			t.Errorf("ValidKey(%q) = %v, want nil", k, err)
		}
	}
	if f.runCount() != 0 {
		t.Errorf("an invalid key ran the request")
	}
}

// A crash between the charge and the stored answer (docs/idempotency.md):
// the first attempt was charged (its ledger row's id is its request id, the
// claim's owner) and its instance stopped before the answer was stored.
// After the lease a retry does not run: idempotency_response_lost, naming
// the original request id, and the same for every later retry. Without the
// ledger check the retry would run and be charged a second time.
func TestChargedThenCrashedDoesNotRunAgain(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	acct := tollgate.Account{ID: "acct_1", Name: "a", Created: t0, Balance: tollgate.Dollars(1)}
	if err := st.CreateAccount(ctx, acct); err != nil {
		t.Fatal(err)
	}
	key := tollgate.Key{ID: "key_1", AccountID: acct.ID, Name: "k", Prefix: "sk-tg-abcd", Created: t0}
	if err := st.CreateKey(ctx, key, tollgate.HashKey(tollgate.NewKeySecret())); err != nil {
		t.Fatal(err)
	}
	charge := func(requestID string) {
		hold := &tollgate.BillingOp{Kind: tollgate.OpHold, Hold: tollgate.Hold{ID: tollgate.NewID("hold_"), RequestID: requestID,
			AccountID: acct.ID, KeyID: key.ID, Model: "m", Class: tollgate.ClassNetwork, Amount: tollgate.MustParseAmount("0.1"),
			Owner: "inst", Created: t0, Expires: t0.Add(time.Hour)}}
		settle := &tollgate.BillingOp{Kind: tollgate.OpSettle, HoldID: hold.Hold.ID, Charge: tollgate.Charge{RequestID: requestID,
			AccountID: acct.ID, KeyID: key.ID, Model: "m", Class: tollgate.ClassNetwork, Cost: tollgate.MustParseAmount("0.01"), Time: t0}}
		if err := st.ApplyBilling(ctx, []*tollgate.BillingOp{hold, settle}); err != nil || hold.Outcome != tollgate.HoldOK {
			t.Errorf("charge: %v, hold outcome %d", err, hold.Outcome)
		}
	}
	f := newFixture(t, st, idempotency.Options{Lease: time.Hour})
	charged, finish := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Charged, then its instance is gone: nothing happens until the
		// retry has been answered (then it is only a slow instance, whose
		// late answer must not be stored over the lost key).
		_, _, _ = f.serve("k", body, "req_first", func(w http.ResponseWriter) error {
			charge("req_first")
			close(charged)
			<-finish
			return f.answer(`{"late":1}`)(w)
		})
	}()
	<-charged
	f.clock.Set(t0.Add(time.Hour))
	for _, id := range []string{"req_retry1", "req_retry2"} {
		_, out, err := f.serve("k", body, id, f.answer(`{"again":1}`))
		e := wantCode(t, err, tollgate.CodeIdempotencyResponseLost)
		if out != idempotency.Refused || !strings.Contains(e.Message, "req_first") {
			t.Errorf("%s: outcome %v, message %q; want refused, naming req_first", id, out, e.Message)
		}
	}
	close(finish)
	wg.Wait()
	_, _, err := f.serve("k", body, "req_retry3", f.answer(`{"again":1}`))
	wantCode(t, err, tollgate.CodeIdempotencyResponseLost)
	if n := f.runCount(); n != 1 {
		t.Errorf("the request ran %d times, want once", n)
	}
	// Forgotten after the TTL (24 h from the retry that found it): the key runs afresh.
	f.clock.Set(t0.Add(25 * time.Hour))
	if _, out, err := f.serve("k", body, "req_later", f.answer(`{"fresh":1}`)); err != nil || out != idempotency.Ran {
		t.Errorf("after the TTL: %v %v", out, err)
	}
}
