package relay

import (
	"context"
	"io"
	"net/http"
	"sync"
	"time"
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
		if !n.Healthy() && !n.probeDue(now) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok := r.probe(ctx, n, timeout)
			switch {
			case ok:
				n.reportReachable()
			case n.Healthy():
				n.reportUnreachable(r.opts.Health, false, r.now())
			default:
				n.probeFailed(r.opts.Health, r.now())
			}
		}()
	}
	wg.Wait()
}

func (r *Relay) probe(ctx context.Context, n *Node, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.HealthURL, nil)
	if err != nil {
		return false
	}
	if n.Key != "" {
		req.Header.Set("Authorization", "Bearer "+n.Key)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	// llama.cpp answers 503 while its model loads: not ready is not healthy.
	return resp.StatusCode/100 == 2
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
			if !n.Healthy() && n.probeDue(now) {
				n.reportReachable()
			}
		}
	}
}
