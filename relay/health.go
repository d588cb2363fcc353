package relay

import (
	"context"
	"io"
	"sync"
	"time"

	"github.com/tollgate/tollgate/upstream"
)

// RunHealthChecks probes every node each interval until ctx ends: an up node
// that fails a probe counts a failure (the threshold takes it down); a down
// node whose backoff has passed comes back on its first good probe, else its
// backoff doubles up to the maximum. With interval 0 there are no active
// probes and a down node comes back when its backoff passes (passive only).
func (r *Relay) RunHealthChecks(ctx context.Context, interval, timeout time.Duration) {
	if interval <= 0 {
		r.runPassiveRecovery(ctx)
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		r.ProbeAll(ctx, timeout)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ProbeAll probes every node once, in parallel, and waits for the answers.
func (r *Relay) ProbeAll(ctx context.Context, timeout time.Duration) {
	var wg sync.WaitGroup
	now := r.now()
	for _, n := range r.Catalog().Nodes() {
		if !n.Healthy() && !n.ProbeDue(now) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok := r.probe(ctx, n, timeout)
			switch {
			case ok:
				n.Reachable()
			case n.Healthy():
				n.Unreachable(r.opts.Health, false, r.now())
			default:
				n.ProbeFailed(r.opts.Health, r.now())
			}
		}()
	}
	wg.Wait()
}

func (r *Relay) probe(ctx context.Context, n *Node, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	p := r.probeFor(n)
	if p == nil {
		return false
	}
	head := upstream.Head{Probe: true}
	if n.Key != "" {
		head.Authorization = n.authorization()[0]
	}
	// The same client as the chat requests (package upstream): one HTTP stack
	// to the nodes. Reading the answer to its end returns the connection.
	resp, err := p.Post(ctx, head, nil)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	// llama.cpp answers 503 while its model loads: not ready is not healthy.
	return resp.StatusCode/100 == 2
}

// probeFor returns the client of the node's health URL, made on first use
// (nil for a URL it cannot serve).
func (r *Relay) probeFor(n *Node) *upstream.Pool {
	n.probeOnce.Do(func() {
		if p, err := upstream.NewPool(n.HealthURL, r.dialer); err == nil {
			p.SetMaxIdle(2)
			n.probePool.Store(p)
		}
	})
	return n.probePool.Load()
}

// runPassiveRecovery brings down nodes back when their backoff passes.
func (r *Relay) runPassiveRecovery(ctx context.Context) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := r.now()
		for _, n := range r.Catalog().Nodes() {
			if !n.Healthy() && n.ProbeDue(now) {
				n.Reachable()
			}
		}
	}
}
