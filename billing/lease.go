package billing

import (
	"context"
	"time"

	"github.com/tollgate/tollgate/storefail"
)

// Leases and the sweeper: this instance renews its holds' leases, and any
// instance releases the holds whose lease has ended (a dead process's).

// Run renews this instance's leases and sweeps expired holds (of any
// instance) until ctx ends.
func (b *Biller) Run(ctx context.Context) error {
	// Renewals have a loop of their own: a sweep, or giving back a slice
	// that waits for the billing queue, must never hold up the renewal
	// that keeps this instance's running requests' holds alive.
	renewed, caught := make(chan struct{}), make(chan struct{})
	defer func() { <-renewed; <-caught }()
	go func() {
		defer close(caught)
		b.catchUp(ctx)
	}()
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
		b.CatchUp(jctx)
		if _, err := b.RecoverJournals(jctx); err != nil && ctx.Err() == nil {
			// An outage of the store is waited out, however long (nor
			// could a sweep run): it does not count towards the skips.
			_, outage := storefail.Op(err)
			if !outage {
				failures++
			}
			skip := outage || failures <= maxRecoverSkips
			b.log.Error("apply dead instances' charge journals", "err", err, "sweep_skipped", skip)
			if skip {
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

// RenewOnce extends the leases of this instance's holds by one Lease, but
// not those of holds whose request ended (marked by CatchUp).
func (b *Biller) RenewOnce(ctx context.Context) error {
	now := b.opts.Now()
	_, err := b.st.RenewHolds(ctx, b.opts.Instance, now.Add(b.opts.Lease), now.Add(-b.opts.MaxAge))
	b.storeAnswered(err)
	return err
}

// SweepOnce releases every hold whose lease has ended, and every hold whose
// request was marked ended more than one Sweep ago (its instance has had
// that long to settle or release it itself), and returns how many.
func (b *Biller) SweepOnce(ctx context.Context) int {
	const limit = 500
	n := 0
	for {
		now := b.opts.Now()
		hs, err := b.st.SweepHolds(ctx, now, now.Add(-b.opts.Sweep), limit)
		b.storeAnswered(err)
		if err != nil {
			if ctx.Err() == nil {
				b.log.Error("sweep expired holds", "err", err)
			}
			return n
		}
		for _, h := range hs {
			if !h.Ended.IsZero() {
				b.log.Warn("released the hold of a request that ended", "hold", h.ID, "request_id", h.RequestID,
					"account", h.AccountID, "owner", h.Owner, "amount", h.Amount.String(), "ended", h.Ended)
				continue
			}
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
