package billing

import (
	"context"
	"fmt"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/storefail"
)

// The operations a request makes: Hold before it runs, Progress while it
// streams, Settle or Release when it ends.

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
			return "", storefail.Wrap("billing_reserve", err)
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
		return "", fmt.Errorf("hold for %s: %w", req.RequestID, storefail.Wrap("billing_hold", err))
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
	err := b.run(p)
	if err != nil && ok {
		b.ended(holdID, lh.account)
	}
	return b.settleDone(p, err)
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
		// Answered without a journal record (AsyncSettle): the charge is
		// lost, and the request has ended, so its hold must not stay.
		b.log.Error("settle failed; its hold is released", "request_id", p.op.Charge.RequestID,
			"hold", p.op.HoldID, "cost", p.op.Charge.Cost.String(), "err", err)
		if p.mem == nil {
			b.ended(p.op.HoldID, p.op.Charge.AccountID)
		} else if lh, ok := b.live.LoadAndDelete(p.op.HoldID); ok && lh.mem != nil {
			b.releaseReserved(lh.mem) // finish put it back in flight
		}
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
		return 0, fmt.Errorf("settle %s: %w", holdID, storefail.Wrap("billing_settle", err))
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
	account := op.Hold.AccountID
	op, err := b.do(op)
	if err != nil {
		if account != "" {
			b.ended(holdID, account)
		}
		return fmt.Errorf("release %s: %w", holdID, storefail.Wrap("billing_release", err))
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
