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
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate"
)

// Store is what billing needs from the database (sqlite.DB, postgres.DB).
type Store interface {
	// ApplyBilling applies ops in order in one transaction, filling in
	// their results; an error means none was applied.
	ApplyBilling(ctx context.Context, ops []*tollgate.BillingOp) error
	// RenewHolds extends to expires the lease of owner's holds created after createdAfter.
	RenewHolds(ctx context.Context, owner string, expires, createdAfter time.Time) (int64, error)
	// SweepHolds releases up to limit holds whose lease ended before now.
	SweepHolds(ctx context.Context, now time.Time, limit int) ([]tollgate.Hold, error)
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
	b := &Biller{st: st, opts: o, log: o.Logger, wake: make(chan struct{}, 1), quit: make(chan struct{}), resvs: map[resvKey]*resv{}}
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

// do queues op and waits until its batch is committed. It does not give up
// when the caller's context ends: an operation that may already be written
// must be seen through, or a hold could be placed that nobody releases.
func (b *Biller) do(op tollgate.BillingOp) (tollgate.BillingOp, error) {
	p := &pending{op: op}
	err := b.run(p)
	return p.op, err
}

// doBackground is do for an operation no request waits for (pending.background).
func (b *Biller) doBackground(op tollgate.BillingOp) (tollgate.BillingOp, error) {
	p := &pending{op: op, background: true}
	err := b.run(p)
	return p.op, err
}

// run is do for an operation already in its pending: it queues p, waits
// until its batch is committed and returns p's error (p.op holds the result).
func (b *Biller) run(p *pending) error {
	p.at = time.Now()
	p.done = make(chan struct{})
	if !b.enqueue(p) {
		p.err = ErrClosed
		b.answer(p)
	}
	<-p.done
	b.waiting.Add(int64(time.Since(p.at)))
	return p.err
}

// runAsync queues p and returns at once; then(p) runs when p is done (or at
// once, with ErrClosed, after Close). Close waits for it.
func (b *Biller) runAsync(p *pending, then func(p *pending)) {
	b.async.Add(1)
	p.at, p.then = time.Now(), then
	if !b.enqueue(p) {
		p.err = ErrClosed
		b.answer(p)
	}
}

// enqueue adds p to the queue and wakes a worker; false after Close. The
// queue is a slice under a mutex, not a channel a worker must receive from:
// a caller never parks to hand its operation over, only to wait for the
// commit, even while the worker is busy writing.
func (b *Biller) enqueue(p *pending) bool {
	b.qmu.Lock()
	if b.closed {
		b.qmu.Unlock()
		return false
	}
	b.q = append(b.q, p)
	if p.background {
		p.gap = time.Duration(math.MaxInt64)
	} else {
		p.gap = p.at.Sub(b.last)
		b.last = p.at
	}
	b.qmu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default: // a wake-up is already pending
	}
	return true
}

// take moves operations from the queue to batch, up to limit in all.
func (b *Biller) take(batch []*pending, limit int) []*pending {
	b.qmu.Lock()
	n := min(limit-len(batch), len(b.q))
	batch = append(batch, b.q[:n]...)
	rest := copy(b.q, b.q[n:])
	clear(b.q[rest:])
	b.q = b.q[:rest]
	b.qmu.Unlock()
	if rest > 0 {
		// More than this batch takes: make sure a worker comes back for it.
		select {
		case b.wake <- struct{}{}:
		default:
		}
	}
	return batch
}

// lingerGap: a batch that is waiting for more operations is committed when
// none has arrived for a quarter of BatchWait (the arrivals paused: waiting
// longer only adds latency).
func lingerGap(wait time.Duration) time.Duration { return wait / 4 }

// worker writes batches. Operations that arrive while a batch is being
// written form the next one (group commit). When operations come close
// together, a batch waits for more until BatchWait after its oldest
// operation was queued (so one that queued during the last write waits that
// much less), which makes the batches and the writes they share larger
// under load (a commit and its sync cost as much as many charges' rows),
// but stops waiting as soon as every request in flight is already in the
// batch (nothing else can come soon) or arrivals pause (lingerGap). After Close, the worker writes what is queued and
// returns.
//
// "Close together" (lingers): the last batch held more than one
// operation, or this batch's first one came less than the last batch's
// write time after the operation before it. The second rule keeps batches
// large under load after a batch of one (a pause in arrivals, a slow spell
// of the machine): without it, each batch of one was followed by another,
// as each was written as soon as its first operation came, and the writer
// fell into a run of one-operation commits while a hundred requests were in
// flight. A lone client never waits: its next operation can only come after
// its last one was written, so its gap is always longer than that write.
// Two things keep that true: the rule applies only with a single worker
// (with several, another worker's last write says nothing about this
// client's), and background operations (async settles, reservations'
// returns), which a client does not wait for, neither wait for company nor
// count as the operation before the next one.
func (b *Biller) worker() {
	defer b.wg.Done()
	if b.acks != nil {
		// The acker exists only beside a single worker: when it ends,
		// nothing more can be committed, and the acker finishes the rest.
		defer close(b.acks)
	}
	limit := b.opts.MaxBatch
	batch := make([]*pending, 0, limit)
	lastSize := 0
	var lastWrite time.Duration
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		quitting := false
		select {
		case <-b.wake:
		case <-b.quit:
			quitting = true
		}
		batch = b.take(batch[:0], limit)
		if len(batch) == 0 {
			if quitting {
				return
			}
			continue
		}
		// A batch of background operations only (charges answered early)
		// waits too, up to asyncLinger × BatchWait: nobody waits for it,
		// and without company each would be a commit of its own. It stops
		// as soon as an operation joins that a request waits for and that
		// would not wait on its own (a lone client's).
		lingers := func() bool {
			fg, gap := foreground(batch)
			if fg == 0 {
				return allAsync(batch)
			}
			return lastSize > 1 || (b.opts.Workers == 1 && gap < lastWrite)
		}
		if !quitting && b.opts.BatchWait > 0 && len(batch) < limit && lingers() {
			// The wait counts from the arrival of the batch's oldest
			// operation: one that queued while the last batch was written
			// has already waited that long.
			start := time.Now()
			deadline := b.lingerUntil(batch, start)
			timer.Reset(max(min(lingerGap(b.opts.BatchWait), time.Until(deadline)), 0))
		wait:
			// It stops when no request is in flight (nothing more can come
			// soon), unless nobody waits for the batch: a lone client's
			// charges answered from the journal then share commits too,
			// instead of each making one beside the client's next request.
			for len(batch) < limit && (b.open.Load() > 0 || allAsync(batch)) {
				select {
				case <-b.wake:
					n := len(batch)
					batch = b.take(batch, limit)
					if len(batch) == n {
						continue // a stale wake-up: nothing arrived
					}
					// An operation somebody waits for shortens a
					// batch that lingered for background ones.
					if d := b.lingerUntil(batch, start); d.Before(deadline) {
						deadline = d
					}
					left := time.Until(deadline)
					if left <= 0 || !lingers() {
						break wait
					}
					timer.Reset(min(lingerGap(b.opts.BatchWait), left))
				case <-timer.C:
					break wait
				case <-b.quit:
					break wait
				}
			}
			timer.Stop()
			b.lingering.Add(int64(time.Since(start)))
		}
		fg, _ := foreground(batch)
		b.committing.Store(true)
		write := b.apply(batch)
		b.committing.Store(false)
		if fg > 0 {
			// Only what requests wait for: a lone client's async settles
			// must not make its next hold look like company.
			lastSize, lastWrite = fg, write
		}
		if quitting {
			// Write everything that was queued before Close.
			select {
			case b.wake <- struct{}{}:
			default:
			}
		}
	}
}

// asyncLinger: a batch that nobody waits for (charges answered from the
// journal or with AsyncSettle) waits up to this many BatchWaits for company.
// No response waits for it, and the larger batches cost less a charge
// (BenchmarkBilling, 128 clients: 56 charges a batch at one BatchWait, 121
// at four, 256 at ten; the writer's time a charge 15.0, 14.8 and 13.5 µs);
// four keeps a charge's time outside the database (the power-loss
// exposure, docs/billing.md) near 10 ms.
const asyncLinger = 4

// lingerUntil is when a batch that began to linger at start stops waiting
// for company: BatchWait after its oldest operation that somebody waits
// for, or asyncLinger × BatchWait after start if nobody waits for any.
func (b *Biller) lingerUntil(batch []*pending, start time.Time) time.Time {
	if fg, _ := foreground(batch); fg == 0 {
		return start.Add(asyncLinger * b.opts.BatchWait)
	}
	return oldest(batch).Add(b.opts.BatchWait)
}

// allAsync reports whether every operation of batch is an async settle.
func allAsync(batch []*pending) bool {
	for _, p := range batch {
		if !p.async {
			return false
		}
	}
	return true
}

// oldest is when the first operation of batch a request waits for was
// queued.
func oldest(batch []*pending) time.Time {
	for _, p := range batch {
		if !p.background {
			return p.at
		}
	}
	return time.Now()
}

// foreground counts the operations of batch that a request waits for, and
// returns the gap before the first of them (pending.gap).
func foreground(batch []*pending) (n int, gap time.Duration) {
	gap = time.Duration(math.MaxInt64)
	for _, p := range batch {
		if !p.background {
			if n == 0 {
				gap = p.gap
			}
			n++
		}
	}
	return n, gap
}

// apply writes one batch. If the batch fails as a whole (one bad operation
// aborts a PostgreSQL transaction), each operation is retried alone so that
// only the bad one fails.
//
// It returns how long the store took to write the batch (before any caller
// was answered).
func (b *Biller) apply(batch []*pending) (write time.Duration) {
	b.batches.Add(1)
	b.ops.Add(int64(len(batch)))
	start := time.Now()
	defer func() { b.writing.Add(int64(time.Since(start))) }()
	ops := make([]*tollgate.BillingOp, len(batch))
	expires := b.opts.Now().Add(b.opts.Lease)
	for i, p := range batch {
		ops[i] = &p.op
		// A hold's lease counts from its write, not from its request: one
		// that waited in the queue through a slow spell of the database
		// must not be written with its lease already run out, for a
		// sweeper (of any instance) to release while its request runs.
		if k := p.op.Kind; (k == tollgate.OpHold || k == tollgate.OpReserve) && p.op.Hold.Expires.Before(expires) {
			p.op.Hold.Expires = expires
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	if c, ok := b.st.(Committer); ok && b.acks != nil {
		var durable func()
		durable, err = c.ApplyBillingCommitted(ctx, ops)
		write = time.Since(start)
		if err == nil {
			// The next batch may be written while this one's commit is
			// being made durable; its callers are answered after that.
			// This batch is written: the acker must not wait for it.
			b.committing.Store(false)
			b.acks <- ackJob{batch: slices.Clone(batch), durable: durable}
			return write
		}
	} else {
		err = b.st.ApplyBilling(ctx, ops)
		write = time.Since(start)
	}
	// On an error nothing of the batch was applied; no commit is coming
	// for the acker to wait for.
	b.committing.Store(false)
	if err != nil && len(batch) > 1 {
		b.retryAlone(ctx, batch, ops, err)
		return write
	}
	for _, p := range batch {
		p.err = err
		b.answer(p)
	}
	return write
}

// answer tells p's caller that p is done (p.err set): it wakes the caller
// waiting in run, or runs an async operation's then (runAsync).
func (b *Biller) answer(p *pending) {
	if p.then == nil {
		if p.mem != nil {
			b.accountCharge(p.mem, p, p.err)
		}
		close(p.done)
		return
	}
	defer b.async.Done()
	b.waiting.Add(int64(time.Since(p.at)))
	p.then(p)
}

// retryAlone applies the operations of a failed batch one by one, so that
// only a bad one fails, and answers each caller.
func (b *Biller) retryAlone(ctx context.Context, batch []*pending, ops []*tollgate.BillingOp, err error) {
	b.log.Warn("billing batch failed; retrying its operations one by one", "ops", len(batch), "err", err)
	for i, p := range batch {
		p.err = b.st.ApplyBilling(ctx, ops[i:i+1])
		b.answer(p)
	}
}

// ackJob is a committed batch whose callers are answered once it is durable.
type ackJob struct {
	batch   []*pending
	durable func()
}

// acker answers the callers of committed batches, in order, once each is
// durable (Committer).
//
// A sync costs more than a commit (on the VM measured here, 60–160 µs of
// CPU), so the acker lets the next batch join when it is already being
// written: it waits for that commit (at most BatchWait), then one sync
// covers both (the later durable() returns at once). It does not wait for a
// batch that is still gathering operations: that kept the callers of a
// written batch waiting through the next batch's linger as well, and with
// every client parked the CPU idled (BenchmarkBilling at 128 clients: 1.70
// busy cores of 2 with that wait, 1.84 without). A lone client, however
// many long streams are open, is synced at once: nothing is being written.
func (b *Biller) acker() {
	defer b.ackWG.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var jobs []ackJob
	for job := range b.acks {
		jobs = b.drainAcks(append(jobs[:0], job))
		if b.opts.BatchWait > 0 && b.committing.Load() {
			timer.Reset(b.opts.BatchWait)
			select {
			case next, ok := <-b.acks:
				if ok {
					jobs = b.drainAcks(append(jobs, next))
				}
			case <-timer.C:
			}
			timer.Stop()
		}
		// In order: each batch is answered as soon as it is durable. The
		// first durable() syncs everything committed by then, so the later
		// ones return at once unless they were committed after it began.
		for _, j := range jobs {
			j.durable()
			for _, p := range j.batch {
				b.answer(p)
			}
		}
	}
}

// drainAcks appends to jobs the committed batches already waiting (batches
// committed while the last sync ran): one sync covers them all.
func (b *Biller) drainAcks(jobs []ackJob) []ackJob {
	for {
		select {
		case next, ok := <-b.acks:
			if !ok {
				return jobs
			}
			jobs = append(jobs, next)
		default:
			return jobs
		}
	}
}

// Hold reserves req.Amount on the account, within the key's spend limit and
// rate limits (tollgate.Biller).
func (b *Biller) Hold(ctx context.Context, req tollgate.HoldRequest) (string, error) {
	now := b.opts.Now()
	at := req.Time
	if at.IsZero() {
		at = now
	}
	h := tollgate.Hold{
		ID: tollgate.NewOrderedID("hold_", now), RequestID: req.RequestID, AccountID: req.AccountID, KeyID: req.KeyID,
		Model: req.Model, Class: req.Class, Amount: req.Amount, Tokens: req.TokenBound, Minute: at.Unix() / 60,
		Owner: b.opts.Instance, Created: now, Expires: now.Add(b.opts.Lease),
	}
	if req.Amount < 0 {
		return "", fmt.Errorf("hold for %s: negative amount %s", req.RequestID, req.Amount)
	}
	if !b.opts.NoReserve {
		id, ok, err := b.holdReserved(h)
		if err != nil {
			return "", err
		}
		if ok {
			b.holds.Add(1)
			b.open.Add(1)
			b.inMemory.Add(1)
			return id, nil
		}
	}
	op, err := b.do(tollgate.BillingOp{Kind: tollgate.OpHold, Hold: h})
	if err != nil {
		return "", fmt.Errorf("hold for %s: %w", req.RequestID, err)
	}
	switch op.Outcome {
	case tollgate.HoldOK:
		b.holds.Add(1)
		b.open.Add(1)
		b.live.Store(h.ID, liveHold{account: h.AccountID, amount: h.Amount, open: true})
		return h.ID, nil
	case tollgate.HoldInsufficient:
		b.refused.Add(1)
		return "", &tollgate.Error{Code: tollgate.CodeInsufficientBalance, Message: fmt.Sprintf(
			"this request needs a hold of %s USD and the account has %s USD free; add credit, or lower max_tokens to reserve less",
			req.Amount, max(op.Free, 0))}
	case tollgate.HoldKeyLimit:
		b.refused.Add(1)
		return "", &tollgate.Error{Code: tollgate.CodeKeyLimitReached, Message: fmt.Sprintf(
			"this request needs a hold of %s USD and this API key's spend limit leaves %s USD",
			req.Amount, op.Free)}
	case tollgate.HoldRateLimited:
		b.refused.Add(1)
		wait := int(op.RetryAt.Sub(now).Seconds() + 0.999)
		return "", &tollgate.Error{Code: tollgate.CodeRateLimitExceeded, RetryAfter: max(wait, 1), Message: fmt.Sprintf(
			"this API key's requests-per-minute or tokens-per-minute limit is reached; retry after %d s", max(wait, 1))}
	case tollgate.HoldNoAccount:
		b.refused.Add(1)
		return "", &tollgate.Error{Code: tollgate.CodeInvalidAPIKey, Message: "the API key or its account no longer exists"}
	}
	return "", fmt.Errorf("hold for %s: unknown outcome %d", req.RequestID, op.Outcome)
}

// Settle charges c.Cost and frees the rest of the hold, with the ledger row,
// in one transaction, and returns what was charged. It is idempotent by hold
// id: settling a settled hold returns the first charge and changes nothing.
// When the backend reported more than the hold and the free balance cover,
// the balance goes to zero and no further; the rest is recorded as
// uncollected in the ledger row, logged and counted (docs/billing.md).
func (b *Biller) Settle(ctx context.Context, holdID string, c tollgate.Charge) (tollgate.Amount, error) {
	if b.progressing.Load() != 0 {
		// The settle's own record (or commit) replaces the provisional one
		// once it returns.
		defer b.dropProgress(holdID)
	}
	if c.Cost < 0 {
		return 0, fmt.Errorf("settle %s: negative cost %s", holdID, c.Cost)
	}
	if c.Time.IsZero() {
		c.Time = b.opts.Now()
	}
	lh, ok := b.live.LoadAndDelete(holdID)
	if ok && lh.open {
		b.open.Add(-1)
	}
	if ok && lh.mem != nil {
		return b.chargeReserved(holdID, lh.mem, c)
	}
	p := &pending{op: tollgate.BillingOp{Kind: tollgate.OpSettle, HoldID: holdID, Charge: c}}
	if ok && c.Cost <= lh.amount && b.early(p) {
		// The hold covers the cost, so the charge is the cost whatever else
		// happens on the account (balance − held ≥ 0 always): it is known
		// now and written with the next batch.
		b.runAsync(p, b.onAnswered)
		return c.Cost, nil
	}
	return b.settleDone(p, b.run(p))
}

// early reports whether p, a settle within its hold, may return before its
// commit: with AsyncSettle, or once its record is in the journal. It marks
// p as nobody's wait (pending.background, pending.async).
func (b *Biller) early(p *pending) bool {
	switch {
	case b.jnl != nil:
		i, ok := b.jnl.put(&p.op)
		if !ok {
			return b.opts.AsyncSettle
		}
		p.slot = i + 1
		b.journaled.Add(1)
	case !b.opts.AsyncSettle:
		return false
	}
	p.background, p.async = true, true
	return true
}

// answered finishes a settle answered before its commit (p.mem nil: a
// hold row; else a hold placed in memory against a reservation), once its
// batch is durable or failed. A journaled one that failed is kept for
// RetryJournaled, its money still held (in its hold row, or as pending in
// its reservation); its record stays in the journal.
func (b *Biller) answered(p *pending) {
	if p.err != nil && p.slot > 0 {
		b.keepJournaled(p)
		return
	}
	if _, err := b.finish(p); err != nil {
		b.log.Error("settle failed; its hold stays until its lease ends", "request_id", p.op.Charge.RequestID,
			"hold", p.op.HoldID, "cost", p.op.Charge.Cost.String(), "err", err)
		return
	}
	b.journalDone(p)
}

// finish accounts for a written (or failed, p.err) settle and returns what
// was charged.
func (b *Biller) finish(p *pending) (tollgate.Amount, error) {
	if p.mem != nil {
		return b.finishCharge(p.mem, p, p.err)
	}
	return b.settleDone(p, p.err)
}

// journalDone clears p's journal record: its charge is durable in the
// database. A record whose commit failed stays, for recovery to apply.
func (b *Biller) journalDone(p *pending) {
	if p.slot > 0 && p.err == nil {
		b.jnl.done(p.slot - 1)
	}
}

// settleDone accounts for a written (or failed) settle and returns what was
// charged.
func (b *Biller) settleDone(p *pending, err error) (tollgate.Amount, error) {
	op, c, holdID := &p.op, &p.op.Charge, p.op.HoldID
	if err != nil {
		return 0, fmt.Errorf("settle %s: %w", holdID, err)
	}
	if op.Replayed {
		return op.Charged, nil
	}
	b.settled.Add(1)
	if op.Uncollected > 0 {
		b.uncollected.Add(1)
		b.uncollectedAmt.Add(int64(op.Uncollected))
		b.log.Warn("charge exceeded what the account could pay", "request_id", c.RequestID, "account", c.AccountID,
			"cost", c.Cost.String(), "charged", op.Charged.String(), "uncollected", op.Uncollected.String())
	}
	return op.Charged, nil
}

// Release frees a hold without a charge. Releasing a hold that is gone
// (released, settled or swept) does nothing.
func (b *Biller) Release(ctx context.Context, holdID string) error {
	if b.progressing.Load() != 0 {
		defer b.dropProgress(holdID)
	}
	op := tollgate.BillingOp{Kind: tollgate.OpRelease, HoldID: holdID}
	if lh, ok := b.live.LoadAndDelete(holdID); ok {
		if lh.open {
			b.open.Add(-1)
		}
		if m := lh.mem; m != nil {
			b.releaseReserved(m)
			return nil
		}
		op.Hold.AccountID = lh.account
	}
	op, err := b.do(op)
	if err != nil {
		return fmt.Errorf("release %s: %w", holdID, err)
	}
	if !op.Replayed {
		b.released.Add(1)
	}
	return nil
}

// Progress records what the request holding holdID has delivered so far
// (a stream's tokens, counted locally: c.Estimated) as a provisional charge
// in the charge journal, replacing the request's previous one. If the
// process dies before the request settles, the instance that recovers the
// journal charges it (docs/billing.md, "Streams cut by a crash"); the
// request's Settle or Release replaces it. Without a journal, or for a hold
// this instance does not know, it does nothing. It reports whether the
// record was written.
func (b *Biller) Progress(holdID string, c tollgate.Charge) bool {
	if b.jnl == nil || c.Cost < 0 {
		return false
	}
	lh, ok := b.live.Load(holdID)
	if !ok {
		return false
	}
	if c.Time.IsZero() {
		c.Time = b.opts.Now()
	}
	op := tollgate.BillingOp{Kind: tollgate.OpSettle, HoldID: holdID, Charge: c, Provisional: true}
	if m := lh.mem; m != nil {
		// Applied as a recovered charge: what it costs, up to the hold,
		// comes out of the reservation; the rest of the reservation is
		// released by the sweep.
		m.r.mu.Lock()
		op.Kind, op.Reservation, op.Covered = tollgate.OpCharge, m.r.id, min(c.Cost, m.amount)
		m.r.mu.Unlock()
	}
	i, ok := b.jnl.put(&op)
	if !ok {
		return false
	}
	b.progressMu.Lock()
	if b.progress == nil {
		b.progress = map[string]int{}
	}
	old, had := b.progress[holdID]
	b.progress[holdID] = i + 1
	if !had {
		b.progressing.Add(1)
	}
	b.progressMu.Unlock()
	if had {
		b.jnl.done(old - 1) // the new record is written: the old one may go
	}
	return true
}

// dropProgress clears the provisional record of holdID, if it has one: its
// request has settled (its record is in the journal or its charge
// committed) or released its hold.
func (b *Biller) dropProgress(holdID string) {
	b.progressMu.Lock()
	i, ok := b.progress[holdID]
	if ok {
		delete(b.progress, holdID)
		b.progressing.Add(-1)
	}
	b.progressMu.Unlock()
	if ok {
		b.jnl.done(i - 1)
	}
}

// Run renews this instance's leases and sweeps expired holds (of any
// instance) until ctx ends.
func (b *Biller) Run(ctx context.Context) error {
	// Renewals have a loop of their own: a sweep, or giving back a slice
	// that waits for the billing queue, must never hold up the renewal
	// that keeps this instance's running requests' holds alive.
	renewed := make(chan struct{})
	defer func() { <-renewed }()
	go func() {
		defer close(renewed)
		renew := time.NewTicker(b.opts.Renew)
		defer renew.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-renew.C:
				if err := b.RenewOnce(ctx); err != nil && ctx.Err() == nil {
					b.log.Error("renew hold leases", "err", err)
				}
			}
		}
	}()
	sweep := time.NewTicker(b.opts.Sweep)
	defer sweep.Stop()
	idle := time.NewTicker(b.opts.ReserveIdle / 2)
	defer idle.Stop()
	// Charges a dead process journaled go in before its holds are swept:
	// while its reservation lasts they are paid from it. So while that
	// fails (the database refuses them), holds are not swept, up to
	// maxRecoverSkips sweeps in a row: a journal that can never be applied
	// must not keep every expired hold reserved for ever.
	failures := 0
	sweepAfterRecovery := func() {
		// Bounded: a database that refuses must not keep this loop (its
		// sweeps and the return of idle reservations) for long.
		jctx, cancel := context.WithTimeout(ctx, journalPass)
		defer cancel()
		b.RetryJournaled(jctx)
		if _, err := b.RecoverJournals(jctx); err != nil && ctx.Err() == nil {
			failures++
			b.log.Error("apply dead instances' charge journals", "err", err, "sweep_skipped", failures <= maxRecoverSkips)
			if failures <= maxRecoverSkips {
				return
			}
		} else {
			failures = 0
		}
		b.SweepOnce(ctx)
	}
	sweepAfterRecovery() // holds left by an earlier run of a dead process
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-sweep.C:
			sweepAfterRecovery()
		case <-idle.C:
			b.ReturnReservations(ctx, b.opts.ReserveIdle)
		}
	}
}

// maxRecoverSkips: how many sweeps in a row Run skips while dead
// instances' journals cannot be applied (10 × the 30 s default: 5 minutes).
const maxRecoverSkips = 10

// journalPass bounds one pass of RetryJournaled and RecoverJournals in Run.
const journalPass = 30 * time.Second

// RenewOnce extends the leases of this instance's holds by one Lease.
func (b *Biller) RenewOnce(ctx context.Context) error {
	now := b.opts.Now()
	_, err := b.st.RenewHolds(ctx, b.opts.Instance, now.Add(b.opts.Lease), now.Add(-b.opts.MaxAge))
	return err
}

// SweepOnce releases every hold whose lease has ended and returns how many.
func (b *Biller) SweepOnce(ctx context.Context) int {
	const limit = 500
	n := 0
	for {
		hs, err := b.st.SweepHolds(ctx, b.opts.Now(), limit)
		if err != nil {
			if ctx.Err() == nil {
				b.log.Error("sweep expired holds", "err", err)
			}
			return n
		}
		for _, h := range hs {
			b.log.Warn("released an expired hold", "hold", h.ID, "request_id", h.RequestID, "account", h.AccountID,
				"owner", h.Owner, "amount", h.Amount.String())
		}
		n += len(hs)
		b.swept.Add(int64(len(hs)))
		if len(hs) < limit {
			return n
		}
	}
}
