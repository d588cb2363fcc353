package nodeload

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"
)

// Options configure a Poller.
type Options struct {
	// Fetch returns the node's /metrics body (an error for a failed
	// request or a status other than 2xx). The body is read before the
	// next Fetch and not kept: Fetch may reuse its buffer.
	Fetch func(ctx context.Context) ([]byte, error)
	// Interval between polls; Timeout bounds each (default: Interval).
	Interval, Timeout time.Duration
	// Stale is how long the last report is used after polls stop
	// succeeding (default 3 intervals, at least 1 s); then Load falls back
	// to this instance's own count.
	Stale time.Duration
	// Own is this instance's requests in flight to the node now.
	Own func() int64
	Log *slog.Logger
}

// Poller keeps a node's reported load fresh. Load never waits: it reads
// the last report.
type Poller struct {
	o      Options
	state  atomic.Pointer[snapshot] // nil: no usable report
	cancel context.CancelFunc
	done   chan struct{}

	polls, failures atomic.Int64
}

// snapshot is one report and this instance's own count when it was asked
// for: requests sent (or ended) since then are the node's load's change
// that this instance knows of before the next report.
type snapshot struct {
	load, own int64
	kv        float64
}

// Stats count a Poller's polls.
type Stats struct {
	Polls, Failures int64 // requests for /metrics, and those that gave no report
	Live            bool  // the last report is in use
	Load            int64 // its load (running + waiting), when Live
	KVUsage         float64
}

// Start polls until Close.
func Start(o Options) *Poller {
	if o.Timeout <= 0 {
		o.Timeout = o.Interval
	}
	if o.Stale <= 0 {
		o.Stale = max(3*o.Interval, time.Second)
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Poller{o: o, cancel: cancel, done: make(chan struct{})}
	go p.run(ctx)
	return p
}

// Close stops polling; Load then falls back to the own count.
func (p *Poller) Close() {
	p.cancel()
	<-p.done
	p.state.Store(nil)
}

// Load returns the node's load as routing should see it: its last report
// plus the change in this instance's own count since it was asked for
// (own is that count now), never below own. live is false, and load is
// own, when there is no fresh report.
func (p *Poller) Load(own int64) (load int64, live bool) {
	s := p.state.Load()
	if s == nil {
		return own, false
	}
	return max(s.load+own-s.own, own), true
}

// Stats returns the counters and the report in use.
func (p *Poller) Stats() Stats {
	st := Stats{Polls: p.polls.Load(), Failures: p.failures.Load(), KVUsage: -1}
	if s := p.state.Load(); s != nil {
		st.Live, st.Load, st.KVUsage = true, s.load, s.kv
	}
	return st
}

func (p *Poller) run(ctx context.Context) {
	defer close(p.done)
	t := time.NewTimer(p.o.Interval)
	defer t.Stop()
	var lastGood time.Time
	warned := false
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
		if p.pollOnce(ctx) {
			lastGood, warned = time.Now(), false
		} else if p.state.Load() != nil && time.Since(lastGood) > p.o.Stale {
			// Stopped answering: a report this old would steer routing by
			// a queue long gone. Each instance's own count is still right.
			p.state.Store(nil)
		}
		if p.state.Load() == nil && !warned && p.failures.Load() > 0 && ctx.Err() == nil {
			p.o.Log.Warn("node load: no usable /metrics; routing it by this instance's own requests in flight")
			warned = true
		}
		// Polls fall on multiples of the interval of the wall clock, so
		// every instance asks a node at about the same moment and routes
		// by the same report: between polls, instances differ only by
		// their own requests since.
		now := time.Now()
		t.Reset(now.Truncate(p.o.Interval).Add(p.o.Interval).Sub(now))
	}
}

// pollOnce asks the node once and stores what it said; false when it gave
// no report.
func (p *Poller) pollOnce(ctx context.Context) bool {
	p.polls.Add(1)
	own := p.o.Own()
	cctx, cancel := context.WithTimeout(ctx, p.o.Timeout)
	body, err := p.o.Fetch(cctx)
	cancel()
	if err != nil {
		p.failures.Add(1)
		return false
	}
	r, ok := Parse(body)
	if !ok {
		p.failures.Add(1)
		return false
	}
	p.state.Store(&snapshot{load: r.Load(), own: own, kv: r.KVUsage})
	return true
}
