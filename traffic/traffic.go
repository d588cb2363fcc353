// Package traffic counts served requests by backend class for /pricing's
// network_uptime_7d, without a database write per request: a Counter adds in
// memory (one atomic add) and flushes the sums into the store's hourly
// buckets every few seconds; a Share reads the last seven days back, cached
// briefly. Instances sharing PostgreSQL add into the same buckets (the store's
// upsert is additive), so every instance reports the same share.
package traffic

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate"
)

// CounterOptions tune a Counter. The zero value is the default.
type CounterOptions struct {
	// FlushInterval is how often Run writes the counts. Default 5s.
	FlushInterval time.Duration
	// FinalFlushTimeout bounds the flush Run makes when its context ends. Default 10s.
	FinalFlushTimeout time.Duration
	// Logger receives flush failures. Default slog.Default().
	Logger *slog.Logger
}

// Counter aggregates served requests in memory. Add is safe from any number
// of goroutines and costs one atomic add.
//
// Counts are written into the bucket of the hour in which they are flushed,
// so a request served in the last FlushInterval before an hour ends may land
// in the next hour's bucket: immaterial over a seven-day window.
type Counter struct {
	store tollgate.TrafficStore
	opts  CounterOptions
	clock func() time.Time

	network, fallback atomic.Int64
	flushMu           sync.Mutex // one flush at a time, so Pending is exact after Flush
}

// NewCounter returns a Counter that flushes into store.
func NewCounter(store tollgate.TrafficStore, opts CounterOptions) *Counter {
	if opts.FlushInterval <= 0 {
		opts.FlushInterval = 5 * time.Second
	}
	if opts.FinalFlushTimeout <= 0 {
		opts.FinalFlushTimeout = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Counter{store: store, opts: opts, clock: time.Now}
}

// Add counts one request served by a backend of class. Classes other than
// network and fallback are ignored (there are no others).
func (c *Counter) Add(class tollgate.BackendClass) {
	switch class {
	case tollgate.ClassNetwork:
		c.network.Add(1)
	case tollgate.ClassFallback:
		c.fallback.Add(1)
	}
}

// Pending returns the counts not yet flushed.
func (c *Counter) Pending() (network, fallback int64) {
	return c.network.Load(), c.fallback.Load()
}

// Flush writes the pending counts to the store in one call. If the store
// fails, the counts are put back and go out with the next flush.
func (c *Counter) Flush(ctx context.Context) error {
	c.flushMu.Lock()
	defer c.flushMu.Unlock()
	n, f := c.network.Swap(0), c.fallback.Swap(0)
	if n == 0 && f == 0 {
		return nil
	}
	hour := c.clock().UTC().Truncate(time.Hour)
	err := c.store.AddTraffic(ctx, []tollgate.TrafficCount{
		{Hour: hour, Class: tollgate.ClassNetwork, Requests: n},
		{Hour: hour, Class: tollgate.ClassFallback, Requests: f},
	})
	if err != nil {
		c.network.Add(n)
		c.fallback.Add(f)
		return err
	}
	return nil
}

// Run flushes every FlushInterval until ctx is done, then flushes once more
// (with a fresh context bounded by FinalFlushTimeout) and returns that
// flush's error. Failed flushes are logged and retried on the next tick.
func (c *Counter) Run(ctx context.Context) error {
	t := time.NewTicker(c.opts.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.FinalFlushTimeout)
			defer cancel()
			return c.Flush(fctx)
		case <-t.C:
			if err := c.Flush(ctx); err != nil && ctx.Err() == nil {
				n, f := c.Pending()
				c.opts.Logger.Warn("traffic: flush failed; counts kept for the next flush", "err", err, "network", n, "fallback", f)
			}
		}
	}
}

// Close flushes what remains. Call it after the server has stopped serving
// (requests that finish during a graceful shutdown still Add), so that
// nothing counted is lost.
func (c *Counter) Close(ctx context.Context) error { return c.Flush(ctx) }

// ShareOptions tune a Share. The zero value is the default.
type ShareOptions struct {
	// TTL is how long a read is reused. Default 10s.
	TTL time.Duration
	// Window is how far back traffic counts. Default 7 days (/pricing's network_uptime_7d).
	Window time.Duration
	// Logger receives read failures answered from the previous value. Default slog.Default().
	Logger *slog.Logger
}

// Share reads the traffic share over the last Window, cached for TTL.
type Share struct {
	store tollgate.TrafficStore
	opts  ShareOptions
	clock func() time.Time

	mu             sync.Mutex
	read           time.Time // when network/all were read; zero: never
	networkN, allN int64
}

// NewShare returns a Share reading from store.
func NewShare(store tollgate.TrafficStore, opts ShareOptions) *Share {
	if opts.TTL <= 0 {
		opts.TTL = 10 * time.Second
	}
	if opts.Window <= 0 {
		opts.Window = 7 * 24 * time.Hour
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Share{store: store, opts: opts, clock: time.Now}
}

// Uptime returns the requests served by the network and in all over the
// last Window (from the start of the hour Window ago), reading the store at
// most once per TTL. If a read fails and an earlier value exists, the
// earlier value is returned (and the failure logged): /pricing keeps
// answering through a database hiccup. The share is networkServed/allServed,
// 1 when allServed is 0 (docs/api.md).
func (s *Share) Uptime(ctx context.Context) (networkServed, allServed int64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	if !s.read.IsZero() && now.Sub(s.read) < s.opts.TTL {
		return s.networkN, s.allN, nil
	}
	since := now.Add(-s.opts.Window).UTC().Truncate(time.Hour)
	n, all, err := s.store.Traffic(ctx, since)
	if err != nil {
		if s.read.IsZero() {
			return 0, 0, err
		}
		s.opts.Logger.Warn("traffic: cannot read the traffic share; answering with the previous value", "err", err, "read", s.read)
		return s.networkN, s.allN, nil
	}
	s.read, s.networkN, s.allN = now, n, all
	return n, all, nil
}
