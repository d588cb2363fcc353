package sqlite

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/billing"
)

// TestWritesAreSynced checks that every kind of write waits for an fdatasync
// of the WAL that began after its commit, that concurrent writes share
// syncs, and that synchronous=NORMAL (the operator's choice) syncs nothing.
func TestWritesAreSynced(t *testing.T) {
	ctx := context.Background()
	db, err := Open(filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if db.wal == nil {
		t.Fatal("the default store does not sync the WAL itself")
	}
	before := db.wal.syncs.Load()
	if err := db.CreateAccount(ctx, tollgate.Account{ID: "acct_s", Name: "s", Balance: 100, Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if db.wal.syncs.Load() == before {
		t.Error("CreateAccount returned without an fdatasync")
	}
	db.wal.mu.Lock()
	committed, synced := db.wal.committed, db.wal.synced
	db.wal.mu.Unlock()
	if synced < committed {
		t.Errorf("after a write: %d commits, %d synced", committed, synced)
	}
	// Many writers at once: every one is synced when it returns, with
	// fewer syncs than writes (they share).
	before = db.wal.syncs.Load()
	var wg sync.WaitGroup
	const n = 64
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db.wal.mu.Lock()
			mine := db.wal.committed + 1 // this write's commit is this one or later
			db.wal.mu.Unlock()
			hour := time.Now().UTC().Truncate(time.Hour)
			if err := db.AddTraffic(ctx, []tollgate.TrafficCount{{Hour: hour, Class: tollgate.ClassNetwork, Requests: 1}}); err != nil {
				t.Error(err)
			}
			db.wal.mu.Lock()
			defer db.wal.mu.Unlock()
			if db.wal.synced < mine {
				t.Errorf("writer %d returned before its commit (≥ %d) was synced (%d)", i, mine, db.wal.synced)
			}
		}()
	}
	wg.Wait()
	if got := db.wal.syncs.Load() - before; got == 0 || got > n {
		t.Errorf("%d writes took %d syncs", n, got)
	}

	normal, err := OpenSynchronous(filepath.Join(t.TempDir(), "n.db"), "normal")
	if err != nil {
		t.Fatal(err)
	}
	defer normal.Close()
	if normal.wal != nil {
		t.Error("synchronous=NORMAL syncs the WAL")
	}
}

// The billing worker pipelines SQLite's syncs through this interface.
var _ billing.Committer = (*DB)(nil)

// TestWALSyncFollowsARecreatedFile: the kept -wal descriptor is checked
// against the path, so a WAL that SQLite deleted and recreated is the one
// synced; a missing WAL has nothing to sync.
func TestWALSyncFollowsARecreatedFile(t *testing.T) {
	dir := t.TempDir()
	w := newWALSync(filepath.Join(dir, "x.db"))
	defer w.close()
	if err := w.sync(); err != nil || w.f != nil {
		t.Fatalf("no WAL yet: %v, file %v", err, w.f)
	}
	if err := os.WriteFile(w.path, []byte("one"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := w.sync(); err != nil || w.f == nil {
		t.Fatalf("first sync: %v, file %v", err, w.f)
	}
	old := w.f
	if err := os.Remove(w.path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(w.path, []byte("two"), 0o644); err != nil {
		t.Fatal(err)
	}
	w.checked = time.Now().Add(-2 * time.Second)
	if err := w.sync(); err != nil {
		t.Fatal(err)
	}
	fi, _ := w.f.Stat()
	pi, _ := os.Stat(w.path)
	if w.f == old || !os.SameFile(fi, pi) {
		t.Error("the sync kept the deleted WAL's descriptor")
	}
}

// TestWALSyncFailureIsSticky: after a failed sync nothing is acknowledged
// again, even when a later sync would succeed (Linux reports a writeback
// error once), and the process is told to stop each time.
func TestWALSyncFailureIsSticky(t *testing.T) {
	var stops int
	orig := syncFailed
	syncFailed = func(string, error) { stops++ }
	defer func() { syncFailed = orig }()
	w := newWALSync(filepath.Join(t.TempDir(), "x.db"))
	defer w.close()
	if err := os.Mkdir(w.path, 0o755); err != nil { // a -wal that cannot be opened for writing
		t.Fatal(err)
	}
	w.done()
	if stops != 1 || w.synced != 0 {
		t.Fatalf("after a failed sync: %d stops, %d synced", stops, w.synced)
	}
	if err := os.Remove(w.path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(w.path, []byte("wal"), 0o644); err != nil {
		t.Fatal(err)
	}
	w.done()
	if stops != 2 || w.synced != 0 {
		t.Errorf("a sync after the failure: %d stops, %d synced; want 2 and nothing acknowledged", stops, w.synced)
	}
}
