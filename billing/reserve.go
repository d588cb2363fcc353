package billing

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/storefail"
)

// Reservations (docs/billing.md, "Reservations"): an instance reserves a
// slice of an account's free balance in the database (one write: a holds row
// with no request, owned and renewed like any hold, counted in held), then
// places its requests' holds against that slice in memory. Settles are
// charges against the reservation, group-committed: one ledger row per
// request, one update of the reservation, account and key per batch.
//
// Every number below is guarded by resv.mu. avail = res − inflight − pending
// is what new holds may take: res is the reservation as committed, inflight
// the holds placed in memory, pending what charges and returns sent to the
// store will take from it once committed.
//
// An operation whose answer is lost (the connection dropped during its
// commit) may have been committed or not. res then counts the worse case
// for spending: a failed top-up as not granted, a failed return or charge
// as taken. So res never exceeds what the row holds, and a charge never
// takes more from the row than it has; the row may hold more, and exist
// while exists is false, which uncertain notes. An idle reservation gives
// back everything its row holds and deletes it (OpReturn with ReturnAll),
// whatever res says: then memory and row agree again (res 0, no row).
type resv struct {
	mu       sync.Mutex
	id       string // the reservation row (its hold id)
	account  string
	key      string
	exists   bool // the row exists (create on the next top-up if not)
	res      tollgate.Amount
	inflight tollgate.Amount
	pending  tollgate.Amount
	busy     chan struct{}   // a top-up or return in flight: closed when done
	direct   time.Time       // take the per-request path until then
	lastUse  time.Time       // last hold placed
	lastTop  time.Time       // last top-up
	mult     int64           // the top-up as a multiple of the average hold
	avgHold  tollgate.Amount // moving average of hold sizes
	gone     bool            // swept: detached from the map
	// uncertain: an answer of the store was lost; the row may hold more
	// than res, or exist while exists is false (a top-up then grows it
	// rather than insert it again).
	uncertain bool
}

func (r *resv) avail() tollgate.Amount { return r.res - r.inflight - r.pending }

// idle reports whether nothing is placed against r in memory nor on its way
// to the store: its row may then be given back whole.
func (r *resv) idle() bool { return r.inflight == 0 && r.pending == 0 }

// owesReturn reports whether r has something to give back: an unused part,
// or, idle and uncertain, a row that may hold money nobody counts.
func (r *resv) owesReturn() bool { return r.avail() > 0 || (r.uncertain && r.idle()) }

type resvKey struct{ account, key string }

// memHold is a hold placed in memory against a reservation.
type memHold struct {
	r      *resv
	amount tollgate.Amount
}

func (b *Biller) resvFor(account, key string) *resv {
	k := resvKey{account, key}
	b.resvMu.Lock()
	defer b.resvMu.Unlock()
	r := b.resvs[k]
	if r == nil {
		r = &resv{id: tollgate.NewID("rsv_"), account: account, key: key, mult: int64(b.opts.ReserveMultiple)}
		b.resvs[k] = r
	}
	return r
}

// holdReserved tries to place h in memory against this instance's
// reservation on the account and key. ok false: take the per-request path
// (the account is too poor for slices, or the key has limits); the unused
// part of the reservation has then been given back first, so the
// per-request hold sees all the money this instance is not using.
func (b *Biller) holdReserved(h tollgate.Hold) (id string, ok bool, err error) {
	r := b.resvFor(h.AccountID, h.KeyID)
	for {
		now := b.opts.Now()
		r.mu.Lock()
		if r.gone {
			r.mu.Unlock()
			r = b.resvFor(h.AccountID, h.KeyID)
			continue
		}
		if r.busy != nil {
			c := r.busy
			r.mu.Unlock()
			<-c
			continue
		}
		if now.Before(r.direct) {
			// Per-request path; first give back what is unused.
			if !r.owesReturn() {
				r.mu.Unlock()
				return "", false, nil
			}
			if !b.giveBackLocked(r) { // unlocks
				return "", false, nil // the next try is the idle sweep's
			}
			continue
		}
		if r.avgHold == 0 {
			r.avgHold = h.Amount
		} else {
			r.avgHold += (h.Amount - r.avgHold) / 8
		}
		r.lastUse = now
		if r.avail() >= h.Amount {
			r.inflight += h.Amount
			r.mu.Unlock()
			id := h.ID // made by Hold, in time order
			b.live.Store(id, liveHold{account: h.AccountID, amount: h.Amount, mem: &memHold{r: r, amount: h.Amount}, open: true})
			return id, true, nil
		}
		// Top up: a multiple of the recent hold size, grown when top-ups
		// come often, at most 1/ReserveFraction of the free balance.
		if !r.lastTop.IsZero() && now.Sub(r.lastTop) < 250*time.Millisecond && r.mult < int64(b.opts.ReserveMaxMultiple) {
			r.mult *= 2
		}
		need := h.Amount - r.avail()
		want, ok := mulAmount(r.avgHold, r.mult)
		if !ok || want < need {
			want = need
		}
		minFree, ok := mulAmount(h.Amount, int64(b.opts.ReserveMinHolds))
		if !ok {
			minFree = tollgate.Amount(1<<63 - 1)
		}
		c := make(chan struct{})
		r.busy = c
		// Uncertain, the row may exist though memory has none: grow it if
		// so (a second insert would fail on its id), else Gone says there
		// is none.
		create := !r.exists && !r.uncertain
		r.mu.Unlock()
		p := &pending{op: tollgate.BillingOp{Kind: tollgate.OpReserve, Reservation: r.id, Need: need, MinFree: minFree,
			Fraction: int64(b.opts.ReserveFraction), Create: create, Hold: tollgate.Hold{ID: r.id, AccountID: h.AccountID,
				KeyID: h.KeyID, Owner: b.opts.Instance, Created: now, Expires: now.Add(b.opts.Lease), Amount: want}}}
		err := b.run(p)
		op := &p.op
		r.mu.Lock()
		r.busy = nil
		close(c)
		if maybeApplied(err) || p.alone {
			// It may have been committed (twice, if its batch was and
			// the retry alone too): counted once at most, but noted.
			r.uncertain = true
		}
		if err != nil {
			r.mu.Unlock()
			return "", false, fmt.Errorf("reserve for %s: %w", h.RequestID, err)
		}
		switch {
		case op.Gone && !r.exists:
			// A top-up whose answer was lost had not created the row:
			// nothing is uncertain any more, and the next one creates it.
			r.uncertain = false
		case op.Gone:
			b.detachLocked(r)
		case op.Outcome == tollgate.HoldOK:
			r.exists, r.res, r.lastTop = true, r.res+op.Granted, now
			b.reserves.Add(1)
		case op.Outcome == tollgate.HoldDirect:
			r.direct = now.Add(b.opts.ReserveRecheck * 10)
		default: // too poor for slices, or no account: per-request path
			r.direct = now.Add(b.opts.ReserveRecheck)
		}
		r.mu.Unlock()
	}
}

// giveBackLocked returns r's unused part to the free balance: when r is
// idle, everything its row holds, and the row is deleted, so that a count
// in memory that a lost answer left wrong is put right (resv). It is called
// with r.mu held and returns with it released, once the return is committed
// (true) or failed (false).
func (b *Biller) giveBackLocked(r *resv) bool {
	x, all, counted := r.avail(), r.idle(), r.res
	c := make(chan struct{})
	r.busy = c
	r.pending += x
	r.mu.Unlock()
	op, err := b.doBackground(tollgate.BillingOp{Kind: tollgate.OpReturn, Reservation: r.id, Return: x, ReturnAll: all,
		Hold: tollgate.Hold{AccountID: r.account, KeyID: r.key}})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.busy = nil
	close(c)
	r.pending -= x
	switch {
	case err != nil:
		b.log.Error("return reservation", "reservation", r.id, "amount", x.String(), "all", all, "err", err)
		if maybeApplied(err) {
			// Counted as done (no hold is placed against money the
			// row may no longer hold); the next idle return gives
			// back whatever the row still holds.
			r.uncertain = true
			r.res -= x
			if all {
				r.res, r.exists = 0, false
			}
		}
		return false
	case op.Gone && all && r.uncertain:
		// No row: the top-up that would have created it had not, or an
		// earlier return whose answer was lost had deleted it.
		r.res, r.exists, r.uncertain = 0, false, false
	case op.Gone:
		b.detachLocked(r)
	case all:
		if op.Returned != counted {
			b.log.Warn("an idle reservation's row held other than this instance counted (an answer of the store was lost); all it held was given back",
				"reservation", r.id, "account", r.account, "held", op.Returned.String(), "counted", counted.String())
		}
		r.res, r.exists, r.uncertain = 0, false, false
	default:
		r.res -= x
		if r.res == 0 {
			r.exists = false // the row is deleted when empty
		}
	}
	if !op.Gone {
		if r.mult > int64(b.opts.ReserveMultiple) {
			r.mult /= 2
		}
		b.returns.Add(1)
	}
	return true
}

// detachLocked forgets a reservation that was swept (the process lost the
// database for longer than a lease): its holds in flight are charged from
// the free balance alone; new holds get a new reservation.
func (b *Biller) detachLocked(r *resv) {
	if r.gone {
		return
	}
	r.gone = true
	b.resvMu.Lock()
	if b.resvs[resvKey{r.account, r.key}] == r {
		delete(b.resvs, resvKey{r.account, r.key})
	}
	b.resvMu.Unlock()
	b.log.Warn("a reservation of this instance was swept; its holds in flight are charged from the free balance",
		"reservation", r.id, "account", r.account)
}

// chargeReserved settles a hold placed in memory. A charge within the hold
// returns before its commit with a journal or AsyncSettle (Biller.early).
func (b *Biller) chargeReserved(holdID string, m *memHold, c tollgate.Charge) (tollgate.Amount, error) {
	r := m.r
	r.mu.Lock()
	r.inflight -= m.amount
	a := r.avail() // ≥ m.amount: this hold's money is back in it
	covered := min(c.Cost, max(a, 0))
	var ret tollgate.Amount
	if !r.gone && b.opts.Now().Before(r.direct) {
		ret = a - covered // the account went per-request: give back the rest too
	}
	r.pending += covered + ret
	r.mu.Unlock()
	// One allocation for the operation and its wait (the pending), none for
	// a closure: this runs once per request.
	p := &pending{op: tollgate.BillingOp{Kind: tollgate.OpCharge, HoldID: holdID, Reservation: r.id, Charge: c, Covered: covered, Return: ret}}
	if c.Cost <= m.amount && b.early(p) {
		p.mem = m
		b.runAsync(p, b.onAnswered)
		return c.Cost, nil
	}
	p.mem = m // accounted for by answer, before run returns
	err := b.run(p)
	if err != nil {
		// Nothing was written and the request has ended (its client is
		// told it was not charged): its money goes back to the
		// reservation rather than stay in flight for as long as this
		// instance lives.
		if lh, ok := b.live.LoadAndDelete(holdID); ok && lh.mem != nil {
			b.releaseReserved(lh.mem)
		}
	}
	return b.chargeResult(p, err)
}

// finishCharge accounts for a written (or failed) charge of the in-memory
// hold m in its reservation and returns what was charged.
func (b *Biller) finishCharge(m *memHold, p *pending, err error) (tollgate.Amount, error) {
	b.accountCharge(m, p, err)
	return b.chargeResult(p, err)
}

// accountCharge moves a written charge of the in-memory hold m out of its
// reservation, or puts the hold back in flight if nothing was written.
func (b *Biller) accountCharge(m *memHold, p *pending, err error) {
	r, op := m.r, &p.op
	r.mu.Lock()
	r.pending -= op.Covered + op.Return
	switch {
	case err != nil:
		// Nothing was written, or it may have been with its answer
		// lost: what the charge would take from the row then counts as
		// taken (resv). The hold is back in flight so that a retried
		// settle charges it.
		if maybeApplied(err) {
			r.res -= op.Covered + op.Return
			r.uncertain = true
		}
		r.inflight += m.amount
		b.live.Store(op.HoldID, liveHold{account: r.account, amount: m.amount, mem: m})
	case op.Gone:
		b.detachLocked(r)
	case !op.Replayed:
		r.res -= op.Covered + op.Return
	}
	r.mu.Unlock()
}

// chargeResult is what a settle returns once its charge was accounted for.
func (b *Biller) chargeResult(p *pending, err error) (tollgate.Amount, error) {
	op := &p.op
	if err != nil {
		return 0, fmt.Errorf("settle %s: %w", op.HoldID, storefail.Wrap("billing_settle", err))
	}
	b.settled.Add(1)
	if op.Uncollected > 0 {
		c := &op.Charge
		b.uncollected.Add(1)
		b.uncollectedAmt.Add(int64(op.Uncollected))
		b.log.Warn("charge exceeded what the account could pay", "request_id", c.RequestID, "account", c.AccountID,
			"cost", c.Cost.String(), "charged", op.Charged.String(), "uncollected", op.Uncollected.String())
	}
	return op.Charged, nil
}

// releaseReserved frees a hold placed in memory: no database write.
func (b *Biller) releaseReserved(m *memHold) {
	m.r.mu.Lock()
	m.r.inflight -= m.amount
	m.r.mu.Unlock()
	b.released.Add(1)
}

// ReturnReservations gives back the unused part of this instance's
// reservations: all of it (idle = 0), or of those without a hold for idle.
// Those with nothing in flight give back their whole row (giveBackLocked),
// also when memory counts nothing in it but an answer was lost.
func (b *Biller) ReturnReservations(ctx context.Context, idle time.Duration) int {
	b.resvMu.Lock()
	rs := make([]*resv, 0, len(b.resvs))
	for _, r := range b.resvs {
		rs = append(rs, r)
	}
	b.resvMu.Unlock()
	now, n := b.opts.Now(), 0
	for _, r := range rs {
		r.mu.Lock()
		for r.busy != nil {
			c := r.busy
			r.mu.Unlock()
			<-c
			r.mu.Lock()
		}
		if r.gone || !r.owesReturn() || now.Sub(r.lastUse) < idle {
			r.mu.Unlock()
			continue
		}
		b.giveBackLocked(r)
		n++
	}
	return n
}

// maybeApplied reports whether err may come from a batch that was committed
// with its answer lost: the store does not say it applied nothing.
func maybeApplied(err error) bool {
	return err != nil && !errors.Is(err, tollgate.ErrNotApplied) && !errors.Is(err, ErrClosed)
}

// mulAmount is a × n, or false on overflow.
func mulAmount(a tollgate.Amount, n int64) (tollgate.Amount, bool) {
	if a == 0 || n == 0 {
		return 0, true
	}
	p := int64(a) * n
	if p/n != int64(a) {
		return 0, false
	}
	return tollgate.Amount(p), true
}
