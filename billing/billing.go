// Package billing implements tollgate.Biller: prepaid holds before a request
// runs, the charge after it, and the sweeper that frees the holds of dead
// processes (docs/billing.md).
//
// Every operation goes through the store, which checks and changes balances
// in one transaction; the no-overdraft guarantee is the database's, not this
// process's, so it holds across any number of instances. To keep the cost of
// that low, operations are group-committed: while one batch is being written,
// the operations that arrive queue up and go together in the next
// transaction (one fsync for SQLite, one round trip and one commit for
// PostgreSQL). An operation waits for its own batch to commit before it
// returns, so nothing is acknowledged before it is durable.
package billing

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate"
)

// Store is what billing needs from the database (sqlite.DB, postgres.DB).
type Store interface {
	// ApplyBilling applies ops in order in one transaction, filling in
	// their results. An error wrapping tollgate.ErrNotApplied means none
	// was applied; any other may hide a batch committed with its answer
	// lost.
	ApplyBilling(ctx context.Context, ops []*tollgate.BillingOp) error
	// RenewHolds extends to expires the lease of owner's holds created
	// after createdAfter, except those marked ended (EndHolds).
	RenewHolds(ctx context.Context, owner string, expires, createdAfter time.Time) (int64, error)
	// EndHolds marks the hold rows ids as ended at: their request ended
	// but their settle or release could not be written. A marked hold is
	// not renewed and is swept once its mark is old enough; the audit
	// reports it when its mark is older than the audit's grace.
	EndHolds(ctx context.Context, ids []string, at time.Time) (int64, error)
	// SweepHolds releases up to limit holds whose lease ended before now
	// or that were marked ended before endedBefore.
	SweepHolds(ctx context.Context, now, endedBefore time.Time, limit int) ([]tollgate.Hold, error)
}

// Committer is a Store that can report a batch committed before it is
// durable (SQLite, which syncs its WAL itself: sqlite/walsync.go). The
// worker then writes the next batch while the last one is being synced, and
// a batch's callers are answered once durable() returns, never before.
type Committer interface {
	// ApplyBillingCommitted is ApplyBilling without the wait for
	// durability: durable returns once the batch is on disk.
	ApplyBillingCommitted(ctx context.Context, ops []*tollgate.BillingOp) (durable func(), err error)
}

// Options tune a Biller. The zero value is the default.
type Options struct {
	// Lease is how long a hold lives without renewal: how long the hold of
	// a process that died keeps the balance reserved. Default 2m.
	Lease time.Duration
	// Renew is how often this instance extends the leases of its holds.
	// Default Lease/3.
	Renew time.Duration
	// Sweep is how often expired holds are released. Default 30s.
	Sweep time.Duration
	// MaxAge is the longest a request can run (the stream limit plus a
	// margin): a hold older than this is no longer renewed, so a hold that a
	// bug forgot still expires. Default 31m.
	MaxAge time.Duration
	// MaxBatch bounds the operations of one transaction. Default 512.
	MaxBatch int
	// BatchWait is the longest a batch waits for more operations when
	// operations come close together (see worker), counted from the
	// arrival of its oldest operation. Default 2ms; negative: no waiting
	// (each batch is what queued while the last was written).
	BatchWait time.Duration
	// Workers is how many batches may be in flight at once. SQLite has one
	// writer, so 1 (the default) is right for it; PostgreSQL can take a few.
	Workers int
	// AsyncSettle lets a settle whose cost is within its hold (the normal
	// case: the backend was sent the held output cap) return at once with
	// the amount it will charge, which is exact because the hold covers it,
	// and be committed with the next batch. Off by default: a settle
	// returns once its charge is committed. See docs/billing.md,
	// "Asynchronous settles".
	AsyncSettle bool
	// Journal is the directory of the charge journal (docs/billing.md, "The
	// charge journal"); empty: none. With a journal, a settle within its
	// hold returns once its record is in this instance's journal file (a
	// copy into memory the kernel keeps if the process dies), and its
	// commit follows with the next batch; dead instances' journals there
	// are applied by RecoverJournals.
	Journal string
	// NoReserve turns reservations off: every hold and settle is a
	// database operation (docs/billing.md, "Reservations").
	NoReserve bool
	// NoPipeline makes the worker wait for each batch to be durable before
	// it writes the next, even with a Committer store.
	NoPipeline bool
	// ReserveMultiple is the first top-up of a reservation as a multiple of
	// the recent hold size (default 32); it doubles, up to
	// ReserveMaxMultiple (default 1024), while top-ups come within 250 ms.
	ReserveMultiple, ReserveMaxMultiple int
	// ReserveFraction: a top-up takes at most 1/ReserveFraction of the
	// account's free balance (default 8).
	ReserveFraction int
	// ReserveMinHolds: an account reserves only while its free balance is
	// at least this many times the hold (default 256); below, its requests
	// take the per-request path, which is exact across instances.
	ReserveMinHolds int
	// ReserveIdle: a reservation without a new hold for this long gives its
	// unused part back (default 1s). ReserveRecheck: how long an account
	// refused a top-up takes the per-request path before trying again
	// (default 1s; ten times that for a key with limits).
	ReserveIdle, ReserveRecheck time.Duration
	// Instance names this process in the holds it owns. Default random.
	Instance string
	Logger   *slog.Logger
	Now      func() time.Time
}

func (o *Options) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.Lease, 2*time.Minute)
	def(&o.Renew, o.Lease/3)
	def(&o.Sweep, 30*time.Second)
	def(&o.MaxAge, 31*time.Minute)
	if o.MaxBatch <= 0 {
		o.MaxBatch = 512
	}
	if o.BatchWait == 0 {
		o.BatchWait = 2 * time.Millisecond
	}
	if o.Workers <= 0 {
		o.Workers = 1
	}
	if o.ReserveMultiple <= 0 {
		o.ReserveMultiple = 32
	}
	if o.ReserveMaxMultiple < o.ReserveMultiple {
		o.ReserveMaxMultiple = max(1024, o.ReserveMultiple)
	}
	if o.ReserveFraction <= 0 {
		o.ReserveFraction = 8
	}
	if o.ReserveMinHolds <= 0 {
		o.ReserveMinHolds = 256
	}
	def(&o.ReserveIdle, time.Second)
	def(&o.ReserveRecheck, time.Second)
	if o.Instance == "" {
		o.Instance = tollgate.NewID("inst_")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Stats are counters since the Biller started.
type Stats struct {
	Holds, Refused, Settled, Released int64
	// Uncollected counts charges where the backend reported more than the
	// hold and the free balance covered; UncollectedAmount is their sum.
	Uncollected       int64
	UncollectedAmount tollgate.Amount
	Swept             int64
	Batches           int64
	// Ops counts the operations written in batches; Writing is the time
	// spent writing them (the store's transactions, back to back on one
	// writer: Writing over the elapsed time is how busy the writer is),
	// Lingering the time batches waited for more operations.
	Ops                int64
	Writing, Lingering time.Duration
	// Waiting is the time callers spent from handing an operation over to
	// its batch's commit, summed (Waiting / Ops: the average wait).
	Waiting time.Duration
	// Reserves and Returns count reservation top-ups and give-backs;
	// InMemory the holds placed against a reservation (no database write).
	Reserves, Returns, InMemory int64
	// Journaled counts the settles answered once in the journal, before
	// their commit; JournalRecovered the charges applied from dead
	// instances' journals that had not been committed.
	Journaled, JournalRecovered int64
}

// Biller is the tollgate.Biller of a store. Build it with New, run Run in
// the background (lease renewal and sweeping), Close it before the store.
type Biller struct {
	st     Store
	opts   Options
	log    *slog.Logger
	qmu    sync.Mutex
	q      []*pending    // operations waiting for a batch (under qmu)
	last   time.Time     // when the last operation was queued (under qmu)
	closed bool          // Close was called: no more operations (under qmu)
	wake   chan struct{} // one pending wake-up for the workers
	quit   chan struct{}
	acks   chan ackJob // committed batches waiting to be durable (Committer, one worker)
	ackWG  sync.WaitGroup
	wg     sync.WaitGroup
	once   sync.Once

	// live maps this instance's holds to their account and amount: a
	// release is sent in account (lock) order, and a settle within the
	// hold's amount knows its charge before it is written.
	live liveHolds
	// async counts settles handed to the batcher but not yet committed.
	async sync.WaitGroup
	// open counts the holds placed and not yet handed back for a settle or
	// release: the requests in flight whose charge may join the next batch.
	open atomic.Int64
	// committing: the worker is writing a batch (the acker may wait for
	// its commit to share a sync).
	committing atomic.Bool

	holds, refused, settled, released, uncollected, uncollectedAmt, swept, batches atomic.Int64
	ops, writing, lingering, waiting                                               atomic.Int64
	reserves, returns, inMemory                                                    atomic.Int64

	resvMu sync.Mutex
	resvs  map[resvKey]*resv

	// onAnswered is answered as a pending's then, made once: a closure
	// per early-answered settle would be an allocation per request.
	onAnswered func(p *pending)

	jnl                         *journal // nil: no journal
	journaled, journalRecovered atomic.Int64
	// failed holds journaled operations whose batch failed: their records
	// stay in the journal, their money stays held, and RetryJournaled
	// applies them again (at every sweep, and at Close).
	failedMu sync.Mutex
	failed   []*pending
	// endedHolds maps the holds of requests that ended, whose settle or
	// release could not be written, to their account (ended).
	endedMu    sync.Mutex
	endedHolds map[string]string
	// storeFailing: the last store call of the batch writer, the renewals
	// or the sweep could not reach the store (storeAnswered). storeBack
	// is signalled when one reaches it again: Run's catch-up then writes
	// what was kept at once rather than at the next sweep.
	storeFailing atomic.Bool
	storeBack    chan struct{}
	// recoverFails counts failed recoveries of dead instances' journals
	// by path (under failedMu).
	recoverFails map[string]int

	// progress maps the hold of a running request to the journal slot of
	// its provisional record (Progress), plus one; progressing counts its
	// entries, so that a settle of a request that has none (every
	// non-streamed one) pays one atomic load.
	progressMu  sync.Mutex
	progress    map[string]int
	progressing atomic.Int64
}

var _ tollgate.Biller = (*Biller)(nil)

type liveHold struct {
	account string
	amount  tollgate.Amount
	mem     *memHold // placed in memory against a reservation; nil: a holds row
	// open: counted in Biller.open (a request in flight). A hold put back
	// after a failed settle is not: nothing may come for it.
	open bool
}

type pending struct {
	op   tollgate.BillingOp
	err  error
	done chan struct{} // closed when answered, unless then is set
	// then, if set, is called instead (on the goroutine that answers the
	// batch: it must not block): an async settle has nobody waiting, and a
	// goroutine parked per settle cost more CPU than the wait saved.
	then func(p *pending)
	at   time.Time     // when it was queued
	gap  time.Duration // since the operation queued before it
	// background: nobody's request waits for it (an async settle, a
	// reservation's return); it neither makes a batch wait for company nor
	// counts as the operation before the next one.
	background bool
	// async: an async settle or charge, which nobody at all waits for (a
	// reservation's give-back is background but may hold up a request's
	// hold): only batches of these wait for company on their own.
	async bool
	// mem, for a charge of a hold placed in memory: answer accounts for it
	// in the reservation before it wakes the caller (or, for one answered
	// early, answered does). The goroutine that answers a batch then takes each
	// reservation's lock in turn, uncontended; woken together, the batch's
	// callers queued on that lock, each parked until the one before it
	// had been scheduled (BenchmarkBilling's mutex profile).
	mem *memHold
	// slot is the journal slot of its record, plus one (0: not journaled).
	slot int
	// alone: its batch failed, maybe committed with its answer lost, and
	// it was applied again by itself (retryAlone): an operation that is
	// not idempotent (a top-up) may have been applied twice.
	alone bool
}

// ErrClosed is returned by operations after Close.
var ErrClosed = errors.New("billing: closed")

// New starts a Biller on st. If the journal cannot be created, the Biller
// runs without it (settles wait for their commit) and logs why; Open
// reports it instead.
func New(st Store, o Options) *Biller {
	b, err := Open(st, o)
	if err != nil {
		b.log.Error("no charge journal: every settle waits for its commit", "dir", o.Journal, "err", err)
	}
	return b
}

// Open is New, and reports whether the journal (Options.Journal) could be
// created; the Biller is usable either way.
func Open(st Store, o Options) (*Biller, error) {
	o.setDefaults()
	b := &Biller{st: st, opts: o, log: o.Logger, wake: make(chan struct{}, 1), quit: make(chan struct{}), resvs: map[resvKey]*resv{},
		storeBack: make(chan struct{}, 1)}
	var jerr error
	if o.Journal != "" {
		b.jnl, jerr = openJournal(o.Journal, o.Instance)
	}
	b.onAnswered = b.answered
	b.live.init()
	if _, ok := st.(Committer); ok && o.Workers == 1 && !o.NoPipeline {
		b.acks = make(chan ackJob, 64)
		b.ackWG.Add(1)
		go b.acker()
	}
	for range o.Workers {
		b.wg.Add(1)
		go b.worker()
	}
	return b, jerr
}

// Instance is the id this process's holds carry.
func (b *Biller) Instance() string { return b.opts.Instance }

// Close gives back the unused part of this instance's reservations and stops
// the batch workers once the operations already queued are written.
// Operations after Close fail with ErrClosed.
func (b *Biller) Close() {
	b.async.Wait()
	b.ReturnReservations(context.Background(), 0)
	b.once.Do(func() {
		b.qmu.Lock()
		b.closed = true
		b.qmu.Unlock()
		close(b.quit)
	})
	b.wg.Wait()
	b.ackWG.Wait()
	if j := b.jnl; j != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		b.RetryJournaled(ctx) // a last chance for the charges whose commit failed
		cancel()
		left, err := j.close()
		if left > 0 {
			b.log.Error("charges whose commit failed stay in the journal; the next start applies them", "journal", j.path, "charges", left)
		}
		if err != nil {
			b.log.Error("close the charge journal", "journal", j.path, "err", err)
		}
	}
}

// Wait returns once every settle handed over so far is committed (or
// failed), and the unused part of every reservation is given back: the
// books then show only the holds of requests in flight (and of journaled
// charges whose commit failed, kept for RetryJournaled).
func (b *Biller) Wait() {
	b.async.Wait()
	b.ReturnReservations(context.Background(), 0)
}

// Stats returns the counters.
func (b *Biller) Stats() Stats {
	return Stats{Holds: b.holds.Load(), Refused: b.refused.Load(), Settled: b.settled.Load(), Released: b.released.Load(),
		Uncollected: b.uncollected.Load(), UncollectedAmount: tollgate.Amount(b.uncollectedAmt.Load()),
		Swept: b.swept.Load(), Batches: b.batches.Load(), Ops: b.ops.Load(),
		Writing: time.Duration(b.writing.Load()), Lingering: time.Duration(b.lingering.Load()),
		Waiting:  time.Duration(b.waiting.Load()),
		Reserves: b.reserves.Load(), Returns: b.returns.Load(), InMemory: b.inMemory.Load(),
		Journaled: b.journaled.Load(), JournalRecovered: b.journalRecovered.Load()}
}
