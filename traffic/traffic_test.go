package traffic

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/postgres"
	"github.com/tollgate/tollgate/sqlite"
)

func openSQLite(t *testing.T) *sqlite.DB {
	t.Helper()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "traffic.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// flakyStore fails AddTraffic and Traffic while fail is set, and counts calls.
type flakyStore struct {
	tollgate.TrafficStore
	fail        atomic.Bool
	adds, reads atomic.Int64
}

func (s *flakyStore) AddTraffic(ctx context.Context, c []tollgate.TrafficCount) error {
	s.adds.Add(1)
	if s.fail.Load() {
		return errors.New("database unreachable")
	}
	return s.TrafficStore.AddTraffic(ctx, c)
}

func (s *flakyStore) Traffic(ctx context.Context, since time.Time) (int64, int64, error) {
	s.reads.Add(1)
	if s.fail.Load() {
		return 0, 0, errors.New("database unreachable")
	}
	return s.TrafficStore.Traffic(ctx, since)
}

func stored(t *testing.T, s tollgate.TrafficStore) (int64, int64) {
	t.Helper()
	n, all, err := s.Traffic(context.Background(), time.Time{})
	if err != nil {
		t.Fatalf("Traffic: %v", err)
	}
	return n, all
}

func addMany(c *Counter, goroutines, each int) {
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if (g+i)%4 == 0 {
					c.Add(tollgate.ClassFallback)
				} else {
					c.Add(tollgate.ClassNetwork)
				}
			}
		}()
	}
	wg.Wait()
}

func TestCounterFlushExact(t *testing.T) {
	db := openSQLite(t)
	c := NewCounter(db, CounterOptions{})
	addMany(c, 50, 1000) // (g+i)%4 == 0 for exactly a quarter: each = 1000 is a multiple of 4
	c.Add("mystery")     // ignored
	if n, f := c.Pending(); n != 37500 || f != 12500 {
		t.Fatalf("Pending = %d, %d; want 37500, 12500", n, f)
	}
	if err := c.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n, all := stored(t, db); n != 37500 || all != 50000 {
		t.Errorf("stored = %d, %d; want 37500, 50000", n, all)
	}
	if n, f := c.Pending(); n != 0 || f != 0 {
		t.Errorf("Pending after Flush = %d, %d; want 0, 0", n, f)
	}
	if err := c.Flush(t.Context()); err != nil { // nothing pending: no-op
		t.Fatal(err)
	}
	if n, all := stored(t, db); n != 37500 || all != 50000 {
		t.Errorf("after an empty flush: stored = %d, %d; want unchanged", n, all)
	}
}

func TestCounterFlushFailureKeepsCounts(t *testing.T) {
	store := &flakyStore{TrafficStore: openSQLite(t)}
	c := NewCounter(store, CounterOptions{})
	for range 3 {
		c.Add(tollgate.ClassNetwork)
	}
	c.Add(tollgate.ClassFallback)
	store.fail.Store(true)
	if err := c.Flush(t.Context()); err == nil {
		t.Fatal("Flush with a failing store: got nil error")
	}
	c.Add(tollgate.ClassNetwork)
	if n, f := c.Pending(); n != 4 || f != 1 {
		t.Fatalf("after a failed flush: Pending = %d, %d; want 4, 1", n, f)
	}
	store.fail.Store(false)
	if err := c.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n, all := stored(t, store); n != 4 || all != 5 {
		t.Errorf("stored = %d, %d; want 4, 5", n, all)
	}
}

func TestCounterBucketsByHour(t *testing.T) {
	db := openSQLite(t)
	c := NewCounter(db, CounterOptions{})
	h := time.Date(2025, 2, 3, 4, 0, 0, 0, time.UTC)
	c.clock = func() time.Time { return h.Add(59 * time.Minute) }
	c.Add(tollgate.ClassNetwork)
	if err := c.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	c.clock = func() time.Time { return h.Add(61 * time.Minute) }
	c.Add(tollgate.ClassFallback)
	if err := c.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	n, all, err := db.Traffic(t.Context(), h.Add(time.Hour))
	if err != nil || n != 0 || all != 1 {
		t.Errorf("Traffic(since next hour) = %d, %d, %v; want 0, 1", n, all, err)
	}
	n, all, err = db.Traffic(t.Context(), h)
	if err != nil || n != 1 || all != 2 {
		t.Errorf("Traffic(since hour) = %d, %d, %v; want 1, 2", n, all, err)
	}
}

// waitFor polls cond until it holds or a generous deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestCounterRun(t *testing.T) {
	db := openSQLite(t)
	c := NewCounter(db, CounterOptions{FlushInterval: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	c.Add(tollgate.ClassNetwork)
	waitFor(t, "a periodic flush", func() bool { n, _ := stored(t, db); return n == 1 })

	// Counts added right before shutdown are written by Run's final flush,
	// even though ctx is already cancelled when it runs.
	addMany(c, 4, 100)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run returned %v, want nil after a good final flush", err)
	}
	if n, all := stored(t, db); n != 301 || all != 401 {
		t.Errorf("after Run returned: stored = %d, %d; want 301, 401", n, all)
	}
	// A late request (finishing during graceful shutdown) is saved by Close.
	c.Add(tollgate.ClassFallback)
	if err := c.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, all := stored(t, db); all != 402 {
		t.Errorf("after Close: all = %d, want 402", all)
	}
}

func TestShareCachesAndWindows(t *testing.T) {
	db := openSQLite(t)
	store := &flakyStore{TrafficStore: db}
	now := time.Date(2025, 5, 10, 12, 30, 0, 0, time.UTC)
	var offset atomic.Int64
	s := NewShare(store, ShareOptions{TTL: 10 * time.Second})
	s.clock = func() time.Time { return now.Add(time.Duration(offset.Load())) }

	if _, _, err := func() (int64, int64, error) {
		store.fail.Store(true)
		defer store.fail.Store(false)
		return s.Uptime(t.Context())
	}(); err == nil {
		t.Fatal("Uptime with a failing store and no earlier value: got nil error")
	}

	err := db.AddTraffic(t.Context(), []tollgate.TrafficCount{
		{Hour: now, Class: tollgate.ClassNetwork, Requests: 9},
		{Hour: now, Class: tollgate.ClassFallback, Requests: 1},
		{Hour: now.Add(-7*24*time.Hour - 30*time.Minute), Class: tollgate.ClassNetwork, Requests: 5},    // the bucket 7 days ago: counted
		{Hour: now.Add(-7*24*time.Hour - 90*time.Minute), Class: tollgate.ClassFallback, Requests: 100}, // one hour older: not
	})
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, wantN, wantAll, wantReads int64) {
		t.Helper()
		n, all, err := s.Uptime(t.Context())
		if err != nil || n != wantN || all != wantAll {
			t.Errorf("%s: Uptime = %d, %d, %v; want %d, %d", what, n, all, err, wantN, wantAll)
		}
		if r := store.reads.Load(); r != wantReads {
			t.Errorf("%s: %d store reads, want %d", what, r, wantReads)
		}
	}
	check("first read", 14, 15, 2)
	if err := db.AddTraffic(t.Context(), []tollgate.TrafficCount{{Hour: now, Class: tollgate.ClassFallback, Requests: 5}}); err != nil {
		t.Fatal(err)
	}
	offset.Store(int64(9 * time.Second))
	check("within TTL (cached)", 14, 15, 2)
	offset.Store(int64(10 * time.Second))
	check("TTL passed", 14, 20, 3)

	offset.Store(int64(time.Minute))
	store.fail.Store(true)
	check("store failing: previous value", 14, 20, 4)
}

// TestTwoCountersOnePostgres: two instances count into one PostgreSQL; the
// buckets add up and both instances' Shares read the sum.
func TestTwoCountersOnePostgres(t *testing.T) {
	schema := postgres.NewTestSchema(t)
	db1, db2 := postgres.OpenTestSchema(t, schema), postgres.OpenTestSchema(t, schema)
	c1 := NewCounter(db1, CounterOptions{FlushInterval: 5 * time.Millisecond})
	c2 := NewCounter(db2, CounterOptions{FlushInterval: 5 * time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for _, c := range []*Counter{c1, c2} {
		wg.Add(1)
		go func() { defer wg.Done(); c.Run(ctx) }()
	}
	// Both add while both flush concurrently into the same bucket rows.
	var adders sync.WaitGroup
	for _, c := range []*Counter{c1, c2} {
		adders.Add(1)
		go func() { defer adders.Done(); addMany(c, 8, 400) }()
	}
	adders.Wait()
	cancel()
	wg.Wait()
	for i, c := range []*Counter{c1, c2} {
		if n, f := c.Pending(); n != 0 || f != 0 {
			t.Errorf("counter %d: %d, %d pending after Run returned", i+1, n, f)
		}
	}
	for i, db := range []*postgres.DB{db1, db2} {
		n, all, err := NewShare(db, ShareOptions{}).Uptime(t.Context())
		if err != nil || n != 4800 || all != 6400 {
			t.Errorf("instance %d: Uptime = %d, %d, %v; want 4800, 6400", i+1, n, all, err)
		}
	}
}
