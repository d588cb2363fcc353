package billing

import (
	"context"
	"math"
	"slices"
	"time"

	"github.com/tollgate/tollgate"
)

// The batch writer: operations queue, a worker gathers them into one
// transaction (group commit), and each caller is answered once its batch is
// committed.

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
		b.storeAnswered(err)
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
		b.storeAnswered(err)
	}
	// On an error no commit is coming for the acker to wait for (a
	// Committer's failed batch was rolled back; another store's may have
	// been committed with its answer lost: retryAlone).
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
// only a bad one fails, and answers each caller. The batch may have been
// committed with its answer lost, unless the store says it applied
// nothing (tollgate.ErrNotApplied): then a reservation's return, which a
// second application would take twice from its row, is not applied again
// but fails with the batch (its reservation counts it as taken and gives
// back the rest when idle, billing/reserve.go); the others are idempotent
// (settles, charges and releases check for an earlier one: a charge against
// a reservation found so is the batch's, paidBefore; a hold's insert fails
// on its id) or count as uncertain (a top-up, pending.alone).
func (b *Biller) retryAlone(ctx context.Context, batch []*pending, ops []*tollgate.BillingOp, err error) {
	b.log.Warn("billing batch failed; retrying its operations one by one", "ops", len(batch), "err", err)
	for i, p := range batch {
		p.alone = maybeApplied(err)
		if p.op.Kind == tollgate.OpReturn && p.alone {
			p.err = err
		} else {
			p.err = b.st.ApplyBilling(ctx, ops[i:i+1])
			b.storeAnswered(p.err)
			if p.err == nil && p.alone {
				paidBefore(p)
			}
		}
		b.answer(p)
	}
}

// paidBefore accounts for p, applied again after its batch failed, as
// written when it is a charge against a reservation: if the store replayed
// it, the batch had committed it after all (its answer was lost), so the
// reservation row already paid it.
func paidBefore(p *pending) {
	if p.mem != nil {
		p.op.Replayed = false
	}
}
