package billing_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/sqlite"
)

func setup(t *testing.T, o billing.Options, balance tollgate.Amount) (*sqlite.DB, *billing.Biller, tollgate.Account, tollgate.Key) {
	t.Helper()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "b.db"))
	if err != nil {
		t.Fatal(err)
	}
	b := billing.New(db, o)
	t.Cleanup(func() { b.Close(); db.Close() })
	a := tollgate.Account{ID: tollgate.NewID("acct_"), Name: "b", Balance: balance, Created: time.Now()}
	if err := db.CreateAccount(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	k := tollgate.Key{ID: tollgate.NewID("key_"), AccountID: a.ID, Prefix: "sk-tg-xxxx", Created: time.Now()}
	if err := db.CreateKey(context.Background(), k, tollgate.HashKey(tollgate.NewKeySecret())); err != nil {
		t.Fatal(err)
	}
	return db, b, a, k
}

func hold(t *testing.T, b *billing.Biller, a tollgate.Account, k tollgate.Key, amt tollgate.Amount) (string, error) {
	t.Helper()
	return b.Hold(context.Background(), tollgate.HoldRequest{RequestID: tollgate.NewID("req_"), AccountID: a.ID, KeyID: k.ID,
		Model: "m", Class: tollgate.ClassNetwork, Amount: amt, TokenBound: 100})
}

func charge(a tollgate.Account, k tollgate.Key, cost tollgate.Amount) tollgate.Charge {
	return tollgate.Charge{RequestID: tollgate.NewID("req_"), AccountID: a.ID, KeyID: k.ID, Model: "m",
		Class: tollgate.ClassNetwork, PromptTokens: 1, CompletionTokens: 1, Cost: cost}
}

// Concurrent holds through the batcher: exactly what the balance affords,
// and the refusals carry both amounts.
func TestBillerConcurrentHolds(t *testing.T) {
	db, b, a, k := setup(t, billing.Options{}, tollgate.MustParseAmount("1"))
	var mu sync.Mutex
	ok, refused := 0, 0
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := hold(t, b, a, k, tollgate.MustParseAmount("0.1"))
			mu.Lock()
			defer mu.Unlock()
			switch tollgate.ErrorCode(err) {
			case tollgate.CodeInternal:
				if err != nil {
					t.Errorf("hold: %v", err)
				}
				ok++
			case tollgate.CodeInsufficientBalance:
				refused++
			default:
				t.Errorf("hold: %v", err)
			}
		}()
	}
	wg.Wait()
	if ok != 10 || refused != 54 {
		t.Errorf("%d placed, %d refused; want 10 and 54", ok, refused)
	}
	bal, _ := db.Balance(context.Background(), a.ID)
	if bal.Held != tollgate.MustParseAmount("1") || bal.Free != 0 {
		t.Errorf("balance %+v", bal)
	}
	if st := b.Stats(); st.Holds != 10 || st.Refused != 54 {
		t.Errorf("stats %+v", st)
	}
}

// With AsyncSettle a settle within its hold returns the cost at once and is
// committed by Wait/Close; a settle above its hold waits and is capped.
func TestBillerAsyncSettle(t *testing.T) {
	db, b, a, k := setup(t, billing.Options{AsyncSettle: true}, tollgate.MustParseAmount("1"))
	ctx := context.Background()
	id, err := hold(t, b, a, k, tollgate.MustParseAmount("0.5"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.Settle(ctx, id, charge(a, k, tollgate.MustParseAmount("0.2")))
	if err != nil || got != tollgate.MustParseAmount("0.2") {
		t.Fatalf("async settle = %s, %v", got, err)
	}
	b.Wait()
	bal, _ := db.Balance(ctx, a.ID)
	if bal.Balance != tollgate.MustParseAmount("0.8") || bal.Held != 0 {
		t.Errorf("after Wait: %+v", bal)
	}
	// A retried settle of the same hold returns the first charge.
	if again, err := b.Settle(ctx, id, charge(a, k, tollgate.MustParseAmount("0.3"))); err != nil || again != tollgate.MustParseAmount("0.2") {
		t.Errorf("retried settle = %s, %v; want the first charge 0.2", again, err)
	}
	id2, err := hold(t, b, a, k, tollgate.MustParseAmount("0.1"))
	if err != nil {
		t.Fatal(err)
	}
	got, err = b.Settle(ctx, id2, charge(a, k, tollgate.MustParseAmount("5")))
	if err != nil || got != tollgate.MustParseAmount("0.8") {
		t.Errorf("settle above the hold = %s, %v; want the whole balance 0.8", got, err)
	}
	if st := b.Stats(); st.Uncollected != 1 || st.UncollectedAmount != tollgate.MustParseAmount("4.2") {
		t.Errorf("uncollected stats = %+v", st)
	}
	r, err := billing.Audit(ctx, db, time.Now(), time.Minute)
	if err != nil || !r.OK {
		t.Errorf("audit: %v %v", r.Problems, err)
	}
}

// Release is idempotent, and a hold of a dead instance is swept.
func TestBillerReleaseAndSweep(t *testing.T) {
	now := time.Now()
	clock := func() time.Time { return now }
	db, b, a, k := setup(t, billing.Options{Lease: time.Minute, Now: clock}, tollgate.MustParseAmount("1"))
	ctx := context.Background()
	id, err := hold(t, b, a, k, tollgate.MustParseAmount("0.4"))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, id); err != nil {
		t.Errorf("second release: %v", err)
	}
	if _, err := hold(t, b, a, k, tollgate.MustParseAmount("0.3")); err != nil {
		t.Fatal(err)
	}
	if n := b.SweepOnce(ctx); n != 0 {
		t.Errorf("swept %d live holds", n)
	}
	now = now.Add(2 * time.Minute) // the lease ran out without a renewal
	if n := b.SweepOnce(ctx); n != 1 {
		t.Errorf("swept %d holds, want the expired one", n)
	}
	bal, _ := db.Balance(ctx, a.ID)
	if bal.Balance != tollgate.MustParseAmount("1") || bal.Held != 0 {
		t.Errorf("after sweep: %+v", bal)
	}
}

// Reservations: holds placed in memory against a slice of the balance
// still serve exactly what the account affords, concurrently; the settles
// are charged one ledger row each; the unused slice goes back when idle and
// on Wait/Close.
func TestBillerReservationExactlyN(t *testing.T) {
	for _, async := range []bool{false, true} {
		t.Run(fmt.Sprintf("async_settle=%v", async), func(t *testing.T) { reservationExactlyN(t, async) })
	}
}

// reservationExactlyN: with async settles, each charge is answered by a
// callback on the billing goroutines, not a goroutine of its own; Wait must
// still see every one written.
func reservationExactlyN(t *testing.T, async bool) {
	const n = 300
	h := tollgate.MustParseAmount("0.001")
	db, b, a, k := setup(t, billing.Options{ReserveMinHolds: 1, ReserveMultiple: 8, ReserveIdle: 50 * time.Millisecond, AsyncSettle: async}, h*n+h-1)
	ctx := context.Background()
	var mu sync.Mutex
	served, refused := 0, 0
	var wg sync.WaitGroup
	for range 2 * n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := hold(t, b, a, k, h)
			if err != nil {
				if tollgate.ErrorCode(err) != tollgate.CodeInsufficientBalance {
					t.Errorf("hold: %v", err)
				}
				mu.Lock()
				refused++
				mu.Unlock()
				return
			}
			got, err := b.Settle(ctx, id, charge(a, k, h))
			if err != nil || got != h {
				t.Errorf("settle: %s, %v", got, err)
			}
			mu.Lock()
			served++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if served != n || refused != n {
		t.Errorf("served %d refused %d, want %d and %d", served, refused, n, n)
	}
	st := b.Stats()
	if st.InMemory == 0 || st.Reserves == 0 {
		t.Errorf("no hold was placed against a reservation: %+v", st)
	}
	b.Wait()
	bal, _ := db.Balance(ctx, a.ID)
	if bal.Balance != h-1 || bal.Held != 0 {
		t.Errorf("balance %s held %s, want %s and 0", bal.Balance, bal.Held, h-1)
	}
	if st := b.Stats(); st.Settled != n {
		t.Errorf("%d settles counted after Wait, want %d", st.Settled, n)
	}
	rows := 0
	if err := db.Ledger(ctx, tollgate.UsageFilter{AccountID: a.ID}, func(e tollgate.LedgerEntry) error {
		if e.Kind == tollgate.LedgerCharge {
			rows++
		}
		return nil
	}); err != nil || rows != n {
		t.Errorf("%d charge rows (%v), want %d", rows, err, n)
	}
	if r, err := billing.Audit(ctx, db, time.Now(), 0); err != nil || !r.OK {
		t.Errorf("audit: %v %v", r.Problems, err)
	}
}

func TestBillerReservationIdleAndClose(t *testing.T) {
	db, b, a, k := setup(t, billing.Options{ReserveIdle: 50 * time.Millisecond}, tollgate.MustParseAmount("100"))
	ctx := context.Background()
	run, stop := context.WithCancel(ctx)
	defer stop()
	go b.Run(run)
	id, err := hold(t, b, a, k, tollgate.MustParseAmount("0.01"))
	if err != nil {
		t.Fatal(err)
	}
	bal, _ := db.Balance(ctx, a.ID)
	if bal.Held <= tollgate.MustParseAmount("0.01") {
		t.Errorf("held %s: want a reservation larger than the hold", bal.Held)
	}
	hs, _ := db.Holds(ctx, a.ID)
	if len(hs) != 1 || hs[0].RequestID != "" || hs[0].Owner != b.Instance() {
		t.Errorf("holds %+v: want one reservation row of this instance", hs)
	}
	if got, err := b.Settle(ctx, id, charge(a, k, tollgate.MustParseAmount("0.004"))); err != nil || got != tollgate.MustParseAmount("0.004") {
		t.Fatalf("settle: %s %v", got, err)
	}
	// Idle: the reservation goes back by itself.
	deadline := time.Now().Add(5 * time.Second)
	for {
		bal, _ = db.Balance(ctx, a.ID)
		if bal.Held == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the idle reservation was not returned: %+v", bal)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if bal.Balance != tollgate.MustParseAmount("99.996") {
		t.Errorf("balance %s", bal.Balance)
	}
	if hs, _ := db.Holds(ctx, a.ID); len(hs) != 0 {
		t.Errorf("holds after return: %+v", hs)
	}
	// Close gives back a reservation in use a moment ago.
	if _, err := hold(t, b, a, k, tollgate.MustParseAmount("0.01")); err != nil {
		t.Fatal(err)
	}
	b2 := b
	id2, err := hold(t, b2, a, k, tollgate.MustParseAmount("0.01"))
	if err != nil {
		t.Fatal(err)
	}
	_ = b.Release(ctx, id2)
	// One hold is still in flight: Close returns all but it.
	b.Close()
	bal, _ = db.Balance(ctx, a.ID)
	if bal.Held != tollgate.MustParseAmount("0.01") {
		t.Errorf("after Close with one hold in flight: held %s, want 0.01", bal.Held)
	}
}

// gatedStore is a billing.Committer over a real store whose batches become
// durable only when the test says so.
type gatedStore struct {
	*sqlite.DB
	mu        sync.Mutex
	committed int           // batches committed
	gates     []chan bool   // one per batch: closed = durable
	calls     chan struct{} // a batch was committed
}

func (g *gatedStore) ApplyBillingCommitted(ctx context.Context, ops []*tollgate.BillingOp) (func(), error) {
	durable, err := g.DB.ApplyBillingCommitted(ctx, ops)
	if err != nil {
		return nil, err
	}
	gate := make(chan bool)
	g.mu.Lock()
	g.committed++
	g.gates = append(g.gates, gate)
	g.mu.Unlock()
	g.calls <- struct{}{}
	return func() { <-gate; durable() }, nil
}

// TestCommittedBatchesAnswerOnlyWhenDurable: with a Committer store, a
// caller is answered only once its batch is durable, and the next batch is
// written meanwhile.
func TestCommittedBatchesAnswerOnlyWhenDurable(t *testing.T) {
	db, a, k := storeWithAccount(t)
	g := &gatedStore{DB: db, calls: make(chan struct{}, 16)}
	b := billing.New(g, billing.Options{NoReserve: true, BatchWait: -1})
	defer b.Close()

	type result struct {
		id  string
		err error
	}
	first, second := make(chan result, 1), make(chan result, 1)
	go func() { id, err := hold(t, b, a, k, tollgate.MustParseAmount("1")); first <- result{id, err} }()
	<-g.calls // the first batch is committed, not yet durable
	go func() { id, err := hold(t, b, a, k, tollgate.MustParseAmount("2")); second <- result{id, err} }()
	select {
	case <-g.calls: // the worker wrote the second batch while the first waits
	case <-time.After(10 * time.Second):
		t.Fatal("the second batch was not written while the first waited to be durable")
	}
	select {
	case r := <-first:
		t.Fatalf("the first hold returned (%v) before its batch was durable", r)
	case r := <-second:
		t.Fatalf("the second hold returned (%v) before its batch was durable", r)
	case <-time.After(50 * time.Millisecond):
	}
	g.mu.Lock()
	gates := g.gates
	g.mu.Unlock()
	close(gates[0])
	if r := <-first; r.err != nil || r.id == "" {
		t.Fatalf("first hold after durable: %+v", r)
	}
	select {
	case r := <-second:
		t.Fatalf("the second hold returned (%v) before its batch was durable", r)
	case <-time.After(50 * time.Millisecond):
	}
	close(gates[1])
	if r := <-second; r.err != nil || r.id == "" {
		t.Fatalf("second hold after durable: %+v", r)
	}
	if bal, _ := db.Balance(context.Background(), a.ID); bal.Held != tollgate.MustParseAmount("3") {
		t.Errorf("held = %s, want 3", bal.Held)
	}
}

// TestLoneClientDoesNotWaitForCompany: a client whose operations come one at
// a time is never held back to share a commit or a sync, even while other
// requests (long streams) hold money. No batch waits for company at all
// (Stats.Lingering, which no scheduling delay can move, stays 0).
func TestLoneClientDoesNotWaitForCompany(t *testing.T) {
	_, b, a, k := setup(t, billing.Options{NoReserve: true, BatchWait: 2 * time.Second}, tollgate.Dollars(10))
	before := b.Stats().Lingering
	loneClient(t, b, a, k)
	if d := b.Stats().Lingering - before; d != 0 {
		t.Errorf("10 operations one at a time waited %s for company (batch_wait 2s)", d)
	}
}

// storeWithAccount opens a store with an account of 10 USD and a key.
// storeWithAccount is a store for the tests of batching, which time their
// operations: its commits are not synced (synchronous=NORMAL), so that a
// slow fsync while other tests write (CI runs packages side by side) does
// not stretch a write the test counts as 200 ms.
func storeWithAccount(t *testing.T) (*sqlite.DB, tollgate.Account, tollgate.Key) {
	t.Helper()
	db, err := sqlite.OpenSynchronous(filepath.Join(t.TempDir(), "s.db"), "normal")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	a := tollgate.Account{ID: tollgate.NewID("acct_"), Name: "s", Balance: tollgate.Dollars(10), Created: time.Now()}
	k := tollgate.Key{ID: tollgate.NewID("key_"), AccountID: a.ID, Prefix: "sk-tg-ssss", Created: time.Now()}
	if err := db.CreateAccount(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateKey(context.Background(), k, tollgate.HashKey(tollgate.NewKeySecret())); err != nil {
		t.Fatal(err)
	}
	return db, a, k
}

// slowStore is a store whose every write takes at least d (and that cannot
// report a commit before it is durable: no pipeline).
type slowStore struct {
	db *sqlite.DB
	d  time.Duration
}

func (s slowStore) ApplyBilling(ctx context.Context, ops []*tollgate.BillingOp) error {
	time.Sleep(s.d)
	return s.db.ApplyBilling(ctx, ops)
}

func (s slowStore) RenewHolds(ctx context.Context, owner string, expires, createdAfter time.Time) (int64, error) {
	return s.db.RenewHolds(ctx, owner, expires, createdAfter)
}

func (s slowStore) EndHolds(ctx context.Context, ids []string, at time.Time) (int64, error) {
	return s.db.EndHolds(ctx, ids, at)
}

func (s slowStore) SweepHolds(ctx context.Context, now, endedBefore time.Time, limit int) ([]tollgate.Hold, error) {
	return s.db.SweepHolds(ctx, now, endedBefore, limit)
}

// heldStore is a slowStore that, once watching (writes before are not
// slowed), records the size of every batch written, reports each write as
// it begins and ends, and holds the first write until release is closed:
// the test decides when that write ends instead of racing a sleep.
type heldStore struct {
	slowStore
	watching atomic.Bool // the holds' own writes go by before
	release  chan struct{}
	begun    chan int // the size of each batch as its write begins
	written  chan int // the size of each batch once it is written

	mu    sync.Mutex
	sizes []int
}

func (s *heldStore) ApplyBilling(ctx context.Context, ops []*tollgate.BillingOp) error {
	if !s.watching.Load() {
		return s.db.ApplyBilling(ctx, ops)
	}
	s.mu.Lock()
	s.sizes = append(s.sizes, len(ops))
	first := len(s.sizes) == 1
	s.mu.Unlock()
	s.begun <- len(ops)
	if first {
		<-s.release
	}
	err := s.slowStore.ApplyBilling(ctx, ops)
	s.written <- len(ops)
	return err
}

func (s *heldStore) batchSizes() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int(nil), s.sizes...)
}

// TestBatchOfOneStillLingers: after a batch of one operation, the next batch
// still waits for company when its first operation came sooner after the
// one before than a write takes (operations are coming faster than single
// commits could keep up with). Under load the writer used to fall into a run
// of one-operation commits this way (BenchmarkBilling: hundreds of them,
// with a hundred requests in flight).
//
// Settle A is written alone; settle B begins while A's write is held open,
// and that write then takes 300 ms more, so B came sooner after A than A's
// write took by those 300 ms whatever the scheduler did before B queued.
// B is alone in the next batch, which must wait (open holds remain): no
// write may begin before settle C comes, and C joins B. Two batches for
// three settles, [1 2], where writing B at once made three. Each step waits
// for the event it needs (A's write begun, B's settle begun, A's write
// ended), not for a fixed time; C comes 50 ms after A's write ended, and B's
// batch may wait a quarter of the 4 s BatchWait for it.
func TestBatchOfOneStillLingers(t *testing.T) {
	db, a, k := storeWithAccount(t)
	st := &heldStore{slowStore: slowStore{db: db, d: 300 * time.Millisecond},
		release: make(chan struct{}), begun: make(chan int, 8), written: make(chan int, 8)}
	// settling reports the first clock reading after it is armed: B's
	// settle reads the clock (its charge's time) just before it queues.
	// Nothing else reads it meanwhile: the worker is held in A's write.
	var armed atomic.Bool
	settling := make(chan struct{})
	var once sync.Once
	now := func() time.Time {
		if armed.Load() {
			once.Do(func() { close(settling) })
		}
		return time.Now()
	}
	b := billing.New(st, billing.Options{NoReserve: true, BatchWait: 4 * time.Second, Now: now})
	defer b.Close()
	var ids [3]string
	for i := range ids {
		var err error
		if ids[i], err = hold(t, b, a, k, tollgate.MustParseAmount("0.1")); err != nil {
			t.Fatal(err)
		}
	}
	before := b.Stats().Batches
	st.watching.Store(true)
	var wg sync.WaitGroup
	settle := func(id string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := b.Settle(context.Background(), id, charge(a, k, tollgate.MustParseAmount("0.01"))); err != nil {
				t.Error(err)
			}
		}()
	}
	const long = 30 * time.Second // only a broken biller takes this long
	recv := func(ch <-chan int, what string) int {
		t.Helper()
		select {
		case n := <-ch:
			return n
		case <-time.After(long):
			t.Fatalf("%s did not happen within %v (batches %v)", what, long, st.batchSizes())
			return 0
		}
	}

	settle(ids[0])
	if n := recv(st.begun, "A's write"); n != 1 {
		t.Fatalf("the first batch holds %d operations, want A alone", n)
	}
	armed.Store(true)
	settle(ids[1])
	select {
	case <-settling:
	case <-time.After(long):
		t.Fatal("B's settle did not begin")
	}
	close(st.release)
	recv(st.written, "the end of A's write")
	// B's batch must be waiting now: a write that begins before C is
	// queued is B written alone.
	select {
	case n := <-st.begun:
		t.Fatalf("a batch of %d was written as soon as A's write ended, without waiting for company (batches %v)", n, st.batchSizes())
	case <-time.After(50 * time.Millisecond):
	}
	settle(ids[2])
	wg.Wait()
	if got := st.batchSizes(); len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Errorf("three settles were written in batches %v, want [1 2] (A alone, then B waiting for C)", got)
	}
	if n := b.Stats().Batches - before; n != 2 {
		t.Errorf("three settles took %d batches, want 2", n)
	}
}

// TestAsyncSettlesShareBatches: settles that nobody waits for (AsyncSettle)
// wait for company like any batch while requests are in flight, instead of
// each being written at once (with them, async settles measured at half the
// throughput of synchronous ones, batches of 2). Ten async settles come 10
// ms apart while another request is in flight; writes take 50 ms. The wait
// is 4 s, so the batch closes only after a pause in arrivals of 1 s (a
// quarter of it): only a stall of the test of that long, not a loaded
// machine's usual delays, could split the ten.
func TestAsyncSettlesShareBatches(t *testing.T) {
	db, a, k := storeWithAccount(t)
	b := billing.New(slowStore{db: db, d: 50 * time.Millisecond}, billing.Options{NoReserve: true, AsyncSettle: true, BatchWait: 4 * time.Second})
	defer b.Close()
	ids := make([]string, 11) // the last stays in flight
	for i := range ids {
		var err error
		if ids[i], err = hold(t, b, a, k, tollgate.MustParseAmount("0.1")); err != nil {
			t.Fatal(err)
		}
	}
	before := b.Stats().Batches
	for _, id := range ids[:10] {
		if _, err := b.Settle(context.Background(), id, charge(a, k, tollgate.MustParseAmount("0.01"))); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.Wait()
	if n := b.Stats().Batches - before; n > 1 {
		t.Errorf("ten async settles took %d batches, want 1", n)
	}
	if _, err := b.Settle(context.Background(), ids[10], charge(a, k, tollgate.MustParseAmount("0.01"))); err != nil {
		t.Fatal(err)
	}
}

// TestLoneClientWithReservations: with reservations (the default), a hold
// that makes the reservation give money back waits for that give-back; a
// batch of it alone must not wait for company while a long request (an open
// hold) is in flight. BatchWait is 2 s, so one such wait would show.
func TestLoneClientWithReservations(t *testing.T) {
	_, b, a, k := setup(t, billing.Options{BatchWait: 2 * time.Second}, tollgate.Dollars(1000))
	defer b.Close()
	if _, err := hold(t, b, a, k, tollgate.MustParseAmount("0.01")); err != nil { // stays open
		t.Fatal(err)
	}
	before := b.Stats()
	for _, amt := range []string{"0.01", "5", "0.01", "20"} {
		id, err := hold(t, b, a, k, tollgate.MustParseAmount(amt))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Settle(context.Background(), id, charge(a, k, tollgate.MustParseAmount("0.001"))); err != nil {
			t.Fatal(err)
		}
	}
	// Stats.Lingering grows only when a batch waits for company: nothing
	// of a loaded machine's timing can move it.
	after := b.Stats()
	if after.Batches == before.Batches {
		t.Fatal("four holds and settles wrote no batch")
	}
	if after.Lingering != before.Lingering {
		t.Errorf("four holds and settles one at a time waited %v for company", after.Lingering-before.Lingering)
	}
}

// slowCommitter is slowStore that reports commits before they are durable
// (billing.Committer, the SQLite store's pipeline).
type slowCommitter struct{ slowStore }

func (s slowCommitter) ApplyBillingCommitted(ctx context.Context, ops []*tollgate.BillingOp) (func(), error) {
	time.Sleep(s.d)
	return s.db.ApplyBillingCommitted(ctx, ops)
}

// TestCommittedBatchDoesNotWaitForAGatheringOne: a committed batch is synced
// and answered without waiting for the next batch while that one is still
// gathering operations (it would keep its callers through the next batch's
// whole wait; under load every client ended up parked and the CPU idle).
//
// Writes take 50 ms. Settle X is written alone (0–50 ms); settle Y comes at
// 10 ms and then waits for company (another hold is in flight) for a
// quarter of the 8 s batch wait, 2 s. X must be answered before that wait
// ends: within 1.5 s, a bound no loaded machine's delays come near and one
// that waiting for Y's batch could not meet.
func TestCommittedBatchDoesNotWaitForAGatheringOne(t *testing.T) {
	db, a, k := storeWithAccount(t)
	var err error
	b := billing.New(slowCommitter{slowStore{db: db, d: 50 * time.Millisecond}}, billing.Options{NoReserve: true, BatchWait: 8 * time.Second})
	defer b.Close()
	var ids [3]string
	for i := range ids {
		if ids[i], err = hold(t, b, a, k, tollgate.MustParseAmount("0.1")); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(10 * time.Millisecond)
		if _, err := b.Settle(context.Background(), ids[1], charge(a, k, tollgate.MustParseAmount("0.01"))); err != nil {
			t.Error(err)
		}
	}()
	start := time.Now()
	if _, err := b.Settle(context.Background(), ids[0], charge(a, k, tollgate.MustParseAmount("0.01"))); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d >= 1500*time.Millisecond {
		t.Errorf("settle X answered after %s: it waited for the next batch's company (its write took 50 ms)", d)
	}
	wg.Wait()
	if err := b.Release(context.Background(), ids[2]); err != nil {
		t.Fatal(err)
	}
}

// TestLoneClientDoesNotWaitWithAsyncOrSeveralWorkers: the lone-client
// guarantee with async settles (a client's next hold comes microseconds after
// its settle was queued) and with several workers (another worker's slow
// write says nothing about this client's pace). BatchWait is 8 s: a batch
// that waited for company would wait at least 2 s (a quarter of it, with no
// arrival), so 10 operations within 1.5 s waited for none, however loaded
// the machine. (With async settles a batch of them alone does wait, until the
// client's next hold joins it, so Stats.Lingering is not 0 here.)
func TestLoneClientDoesNotWaitWithAsyncOrSeveralWorkers(t *testing.T) {
	for _, c := range []struct {
		name string
		o    billing.Options
		slow time.Duration // the store's first write takes this long
	}{
		{"async settles", billing.Options{NoReserve: true, AsyncSettle: true, BatchWait: 8 * time.Second}, 0},
		{"four workers", billing.Options{NoReserve: true, Workers: 4, BatchWait: 8 * time.Second}, 200 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			db, a, k := storeWithAccount(t)
			b := billing.New(&firstSlowStore{slowStore: slowStore{db: db, d: c.slow}}, c.o)
			defer b.Close()
			if d := loneClient(t, b, a, k); d >= 1500*time.Millisecond {
				t.Errorf("10 operations one at a time took %s: something waited for company (batch_wait 8s)", d)
			}
		})
	}
}

// firstSlowStore is slowStore whose delay applies to the first write only.
type firstSlowStore struct {
	slowStore
	once sync.Once
}

func (s *firstSlowStore) ApplyBilling(ctx context.Context, ops []*tollgate.BillingOp) error {
	d := time.Duration(0)
	s.once.Do(func() { d = s.d })
	time.Sleep(d)
	return s.db.ApplyBilling(ctx, ops)
}

// loneClient opens one hold that stays open (a long stream), then runs five
// hold-and-settle cycles one at a time, and returns how long they took.
func loneClient(t *testing.T, b *billing.Biller, a tollgate.Account, k tollgate.Key) time.Duration {
	t.Helper()
	if _, err := hold(t, b, a, k, tollgate.MustParseAmount("1")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for range 5 {
		id, err := hold(t, b, a, k, tollgate.MustParseAmount("0.1"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Settle(context.Background(), id, charge(a, k, tollgate.MustParseAmount("0.01"))); err != nil {
			t.Fatal(err)
		}
	}
	return time.Since(start)
}

// stallingStore stalls its first batch until the test releases it: the
// database in a slow spell, with operations queueing behind the write.
type stallingStore struct {
	*sqlite.DB
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (s *stallingStore) ApplyBillingCommitted(ctx context.Context, ops []*tollgate.BillingOp) (func(), error) {
	s.once.Do(func() {
		close(s.entered)
		<-s.release
	})
	return s.DB.ApplyBillingCommitted(ctx, ops)
}

// TestHoldLeaseStartsWhenWritten: a hold that waited in the queue for longer
// than a lease is written with a whole lease ahead of it, so that no sweeper
// releases the hold of a request that is running (before, its lease counted
// from the request and it was written already expired).
func TestHoldLeaseStartsWhenWritten(t *testing.T) {
	db, a, k := storeWithAccount(t)
	var mu sync.Mutex
	now, calls := time.Now(), 0
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		calls++
		return now
	}
	called := func() int {
		mu.Lock()
		defer mu.Unlock()
		return calls
	}
	s := &stallingStore{DB: db, entered: make(chan struct{}), release: make(chan struct{})}
	b := billing.New(s, billing.Options{NoReserve: true, BatchWait: -1, Lease: time.Minute, Now: clock})
	defer b.Close()
	ctx := context.Background()

	first := make(chan error, 1)
	go func() { _, err := hold(t, b, a, k, tollgate.MustParseAmount("1")); first <- err }()
	<-s.entered // the worker is writing the first batch, and stays there
	before := called()
	second := make(chan error, 1)
	go func() { _, err := hold(t, b, a, k, tollgate.MustParseAmount("2")); second <- err }()
	for deadline := time.Now().Add(10 * time.Second); called() == before; {
		if time.Now().After(deadline) {
			t.Fatal("the second hold never read the clock")
		}
		time.Sleep(time.Millisecond)
	}
	// The second hold is queued behind the stalled write; the write takes
	// longer than a lease.
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	close(s.release)
	if err := <-first; err != nil {
		t.Fatalf("first hold: %v", err)
	}
	if err := <-second; err != nil {
		t.Fatalf("second hold: %v", err)
	}
	// The first hold's lease began before its (stalled) write and ran out;
	// the second's began when it was written and is running.
	if n := b.SweepOnce(ctx); n != 1 {
		t.Errorf("swept %d holds, want 1 (the first, whose lease ran out; not the second, written a moment ago)", n)
	}
	if bal, _ := db.Balance(ctx, a.ID); bal.Held != tollgate.MustParseAmount("2") {
		t.Errorf("held = %s after the sweep, want the second hold's 2", bal.Held)
	}
}

// stuckSweepStore is a store whose sweep never finishes (a slow spell of the
// database) and which counts lease renewals.
type stuckSweepStore struct {
	*sqlite.DB
	renewals atomic.Int64
	stuck    chan struct{}
}

func (s *stuckSweepStore) SweepHolds(ctx context.Context, now, endedBefore time.Time, limit int) ([]tollgate.Hold, error) {
	select {
	case <-s.stuck:
	case <-ctx.Done():
	}
	return nil, ctx.Err()
}

func (s *stuckSweepStore) RenewHolds(ctx context.Context, owner string, expires, createdAfter time.Time) (int64, error) {
	s.renewals.Add(1)
	return s.DB.RenewHolds(ctx, owner, expires, createdAfter)
}

// TestRenewalsDoNotWaitForTheSweep: the leases of this instance's holds are
// renewed on time even while a sweep is stuck.
func TestRenewalsDoNotWaitForTheSweep(t *testing.T) {
	db, _, _ := storeWithAccount(t)
	s := &stuckSweepStore{DB: db, stuck: make(chan struct{})}
	defer close(s.stuck)
	b := billing.New(s, billing.Options{Lease: time.Second, Renew: 10 * time.Millisecond, Sweep: 10 * time.Millisecond})
	defer b.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	for deadline := time.Now().Add(10 * time.Second); s.renewals.Load() < 3; {
		if time.Now().After(deadline) {
			t.Fatalf("%d renewals in 10 s while a sweep was stuck, want them every 10 ms", s.renewals.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run returned %v, want context.Canceled", err)
	}
}
