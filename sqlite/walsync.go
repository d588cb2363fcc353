package sqlite

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// Durability (docs/store.md, "Durability"). SQLite's synchronous=FULL syncs
// the WAL inside every commit, on the single writer's path: each commit
// waits for its own sync, and the next cannot start until it returns. A
// sync costs 60–160 µs of CPU on this kind of virtual disk
// (BenchmarkSync), more than a whole batch's statements.
//
// So the default opens the writer with synchronous=NORMAL (a commit writes
// the WAL but does not sync it) and the store syncs the WAL itself before it
// reports any commit: walSync.wait fdatasyncs the -wal file, once for every
// commit that finished before the sync began (callers that arrive during a
// sync share the next one), and billing writes its next batch meanwhile
// (ApplyBillingCommitted). A write is acknowledged only once its frames are
// on disk, as with FULL; what NORMAL adds on its own (the WAL is synced
// before each checkpoint, and the database file after it) keeps the
// checkpoints safe.
//
// If fdatasync fails, what the kernel kept of the file is unknown; the
// process stops (like PostgreSQL's data_sync_retry=off) rather than go on
// acknowledging writes that may be lost, and nothing is acknowledged after
// the failure. A restart recovers from the WAL.
//
// Readers may see a commit before its sync returns (with SQLite's FULL
// they could not); nothing is acknowledged to its writer before then.
type walSync struct {
	path    string
	f       *os.File  // the -wal file, opened at the first sync (owned by the syncing goroutine)
	checked time.Time // when f was last checked against path

	mu        sync.Mutex
	cond      *sync.Cond
	committed uint64 // commits finished
	synced    uint64 // commits known to be on disk
	syncing   bool
	failed    error // a sync failed: nothing is acknowledged any more
	closed    bool  // the store is closed: no file is opened again

	syncs atomic.Int64 // fdatasync calls, for tests and benchmarks
}

func newWALSync(dbPath string) *walSync {
	w := &walSync{path: dbPath + "-wal"}
	w.cond = sync.NewCond(&w.mu)
	return w
}

// commit records a finished commit and returns its number. Call it after the
// commit returned, from the writer (commits are serial).
func (w *walSync) commit() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.committed++
	return w.committed
}

// wait returns once commit seq is on disk.
func (w *walSync) wait(seq uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.synced < seq {
		if w.failed != nil {
			syncFailed(w.path, w.failed)
			return
		}
		if w.syncing {
			w.cond.Wait()
			continue
		}
		w.syncing = true
		target := w.committed
		w.mu.Unlock()
		err := w.sync()
		w.syncs.Add(1)
		w.mu.Lock()
		w.syncing = false
		if err != nil {
			// Never acknowledge anything again: Linux reports a writeback
			// error to one fdatasync only, so a second attempt could
			// "succeed" over lost pages. The process stops (a panic
			// could be recovered by an HTTP handler and leave it running).
			w.failed = err
		}
		if w.failed != nil {
			w.cond.Broadcast()
			syncFailed(w.path, w.failed)
			return // only when syncFailed is replaced, in tests
		}
		w.synced = max(w.synced, target)
		w.cond.Broadcast()
	}
}

// syncFailed ends the process after a failed WAL sync. Tests replace it.
var syncFailed = func(path string, err error) {
	fmt.Fprintf(os.Stderr, "tollgate: fdatasync of %s failed: %v; committed writes may not be on disk, so tollgate stops (a restart recovers from the WAL)\n", path, err)
	os.Exit(70) // EX_SOFTWARE
}

// done syncs after a commit: commit then wait.
func (w *walSync) done() { w.wait(w.commit()) }

// sync fdatasyncs the -wal file. It is called by one goroutine at a time
// (walSync.syncing), which owns f.
//
// The file stays open: opening and closing it for every sync cost ~90 µs of
// CPU here, more than the fdatasync. SQLite deletes and recreates the -wal
// file only when the last connection to the database closes, which the
// writer connection prevents while the store is open; in case a reconnect
// did it, the open file is checked against the path once a second and
// reopened if it is no longer the WAL (a sync of the old one would not make
// the new one durable). A missing file has nothing to sync: the last
// connection's close checkpointed it into the database and synced that.
func (w *walSync) sync() error {
	now := time.Now()
	if w.f != nil && now.Sub(w.checked) > time.Second {
		w.checked = now
		fi, err1 := w.f.Stat()
		pi, err2 := os.Stat(w.path)
		if err1 != nil || err2 != nil || !os.SameFile(fi, pi) {
			w.f.Close()
			w.f = nil
		}
	}
	if w.f == nil {
		if w.isClosed() {
			return nil
		}
		// Read-write: FlushFileBuffers (Windows) needs write access; nothing
		// is ever written through this descriptor.
		f, err := os.OpenFile(w.path, os.O_RDWR, 0)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		// A new -wal file (each start of the store makes one) must also
		// be findable after a power loss: sync its directory entry, as
		// SQLite's FULL does on a new WAL's first sync.
		if err := syncDir(filepath.Dir(w.path)); err != nil {
			f.Close()
			return err
		}
		w.f, w.checked = f, now
	}
	return datasync(w.f)
}

func (w *walSync) isClosed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closed
}

// close releases the open -wal file; later syncs open none.
func (w *walSync) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	for w.syncing {
		w.cond.Wait()
	}
	if w.f != nil {
		w.f.Close()
		w.f = nil
	}
}

// WALSyncs is how many times this handle has synced the WAL (0 with
// synchronous=NORMAL), for benchmarks and diagnostics.
func (db *DB) WALSyncs() int64 {
	if db.wal == nil {
		return 0
	}
	return db.wal.syncs.Load()
}
