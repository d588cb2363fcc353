package billing

import (
	"context"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/storefail"
)

// Holds of requests that ended (docs/billing.md, "No hold stranded"). A
// settle or a release deletes its hold row in the statement that writes it,
// so a hold row outlives its request only when that write failed: the store
// was away, or refused it. The instance keeps such holds (ended, and the
// journaled charges RetryJournaled keeps) and, as soon as the store answers
// again, marks their rows ended (Store.EndHolds), so that its renewals skip
// them and the audit sees them, then writes their charges or releases them.
// A marked hold its instance still cannot settle or release is released by
// any instance's sweep one sweep interval after its mark.

// ended notes the hold row of a request that has ended but whose settle or
// release could not be written (the store was away, and the charge was not
// kept in the journal: the client was told it was not charged). CatchUp
// marks it ended in the store and releases it.
func (b *Biller) ended(holdID, account string) {
	b.endedMu.Lock()
	if b.endedHolds == nil {
		b.endedHolds = map[string]string{}
	}
	b.endedHolds[holdID] = account
	b.endedMu.Unlock()
}

// ReleaseEnded releases the holds noted by ended and returns how many it
// released. It stops at the first that cannot reach the store; those left
// wait for the next call.
func (b *Biller) ReleaseEnded(ctx context.Context) int {
	b.endedMu.Lock()
	hs := b.endedHolds
	b.endedHolds = nil
	b.endedMu.Unlock()
	n, away := 0, false
	for id, account := range hs {
		if away || ctx.Err() != nil {
			b.ended(id, account)
			continue
		}
		op, err := b.doBackground(tollgate.BillingOp{Kind: tollgate.OpRelease, HoldID: id, Hold: tollgate.Hold{AccountID: account}})
		if err != nil {
			away = storefail.Unavailable(err)
			b.ended(id, account)
			continue
		}
		if !op.Replayed {
			b.released.Add(1)
		}
		n++
	}
	return n
}

// keptHolds returns the hold rows of requests that ended and that this
// instance still has to settle (journaled charges whose commit failed) or
// release (ended).
func (b *Biller) keptHolds() []string {
	var ids []string
	b.endedMu.Lock()
	for id := range b.endedHolds {
		ids = append(ids, id)
	}
	b.endedMu.Unlock()
	b.failedMu.Lock()
	for _, p := range b.failed {
		if p.mem == nil && p.op.Kind == tollgate.OpSettle {
			ids = append(ids, p.op.HoldID)
		}
	}
	b.failedMu.Unlock()
	return ids
}

// kept reports whether this instance keeps anything the store has not
// taken yet: journaled charges whose commit failed, or ended holds.
func (b *Biller) kept() bool {
	b.endedMu.Lock()
	n := len(b.endedHolds)
	b.endedMu.Unlock()
	b.failedMu.Lock()
	n += len(b.failed)
	b.failedMu.Unlock()
	return n > 0
}

// CatchUp writes what this instance kept while the store was away or
// refused it: it marks the hold rows of the requests that ended as ended
// (one statement), then applies the kept charges (RetryJournaled) and
// releases the ended holds (ReleaseEnded). It returns how many charges and
// releases went in, and false if something is still kept.
func (b *Biller) CatchUp(ctx context.Context) (int, bool) {
	if ids := b.keptHolds(); len(ids) > 0 {
		_, err := b.st.EndHolds(ctx, ids, b.opts.Now())
		b.storeAnswered(err)
		if err != nil {
			if ctx.Err() == nil {
				b.log.Error("mark the holds of ended requests", "holds", len(ids), "err", storefail.Wrap("billing_end_holds", err))
			}
			return 0, false
		}
	}
	n := b.RetryJournaled(ctx)
	n += b.ReleaseEnded(ctx)
	return n, !b.kept()
}

// storeAnswered notes whether a store call of the batch writer, the
// renewals or the sweep reached the store (err nil, or an error that is
// the store's answer) and signals storeBack when one does after one that
// could not.
func (b *Biller) storeAnswered(err error) {
	if storefail.Unavailable(err) {
		b.storeFailing.Store(true)
		return
	}
	if b.storeFailing.Load() && b.storeFailing.Swap(false) {
		select {
		case b.storeBack <- struct{}{}:
		default:
		}
	}
}

// catchUpEvery is how often Run's catch-up tries again while it keeps
// something and the store cannot be reached: one statement that fails at
// once (a refused connection), so the kept charges go in within about a
// second of the store's return even on an instance that serves nothing.
// When the store answers but refuses them, it tries again every sweep.
const catchUpEvery = time.Second

// catchUp runs CatchUp whenever the store answers again after failing
// (storeBack) and, while something is kept, every catchUpEvery (every
// sweep when the store answered), until ctx ends. When the store is back
// it also applies dead instances' journals (an instance killed during the
// outage): those charges too go in at once, not at the next sweep.
func (b *Biller) catchUp(ctx context.Context) {
	timer := time.NewTimer(catchUpEvery)
	defer timer.Stop()
	var lastBack time.Time
	for {
		back := false
		select {
		case <-ctx.Done():
			return
		case <-b.storeBack:
			back, lastBack = true, time.Now()
		case <-timer.C:
		}
		next := catchUpEvery
		failing := b.storeFailing.Load()
		if back || failing || b.kept() {
			pass, cancel := context.WithTimeout(ctx, journalPass)
			n, done := b.CatchUp(pass)
			switch {
			case done:
			case n > 0:
				next = 0 // progress: the rest may go in now
			case b.storeFailing.Load() && time.Since(lastBack) < 2*time.Second:
				// The store answered a moment ago: this failure is
				// likely a connection the outage broke, which the
				// driver drops; the next try takes another.
				next = catchUpEvery / 10
			case !b.storeFailing.Load():
				next = b.opts.Sweep // the store answers, and refuses them
			}
			if back || failing {
				// A dead instance's journal (one killed during the
				// outage) goes in now too; while the store is away,
				// one call per journal finds out (and, once one
				// succeeds, signals storeBack).
				if _, err := b.RecoverJournals(pass); err != nil && ctx.Err() == nil {
					if _, outage := storefail.Op(err); !outage {
						b.log.Error("apply dead instances' charge journals", "err", err)
					}
				}
			}
			cancel()
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(next)
	}
}
