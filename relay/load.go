package relay

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/tollgate/tollgate/nodeload"
	"github.com/tollgate/tollgate/openai"
	"github.com/tollgate/tollgate/upstream"
)

// A node's load as routing sees it. Each tollgate instance counts only
// the requests it sent, so behind a load balancer each sees a share of a
// node's queue and moves conversations off a queueing node later, and
// differently, than another instance. With load_poll, every instance
// polls the node's own /metrics (its running and waiting requests; off
// the request path, package nodeload) and routes by that report plus its
// own requests sent or ended since: the same load on every instance, to
// within a poll. Without a fresh report (not polled, /metrics absent or
// failing, or older than three polls) the node's load is this instance's
// own count, as before.

// routeLoad is the node's load for the picker: its reported load when
// polled and fresh, else this instance's requests in flight to it.
func (n *Node) routeLoad() int64 {
	own := n.inflight.Load()
	if p := n.poll; p != nil {
		load, _ := p.Load(own)
		return load
	}
	return own
}

// pollsLoad reports whether a node of this flavour serves a /metrics that
// nodeload reads (vLLM and SGLang; SGLang with --enable-metrics).
func pollsLoad(f openai.Flavour) bool { return f == openai.VLLM || f == openai.SGLang }

// metricsURL is the node's Prometheus endpoint: /metrics at the server's
// root (the base URL without /v1).
func metricsURL(base string) string { return strings.TrimSuffix(base, "/v1") + "/metrics" }

// startPolls starts polling the load of the catalogue's nodes that want it
// and have no poller yet (before the catalogue is in force: requests read
// Node.poll without a lock).
func (r *Relay) startPolls(c *Catalog) {
	if c == nil {
		return
	}
	for _, n := range c.Nodes() {
		if n.pollEvery <= 0 || n.poll != nil {
			continue
		}
		pool, err := upstream.NewPool(metricsURL(n.BaseURL), r.dialer)
		if err != nil {
			continue
		}
		pool.SetMaxIdle(1)
		head := upstream.Head{Probe: true}
		if n.Key != "" {
			head.Authorization = n.authorization()[0]
		}
		n.poll = nodeload.Start(nodeload.Options{
			Interval: n.pollEvery,
			Own:      n.inflight.Load,
			Log:      r.log.With("node", n.Name),
			Fetch: func(ctx context.Context) ([]byte, error) {
				resp, err := pool.Post(ctx, head, nil)
				if err != nil {
					return nil, err
				}
				defer resp.Body.Close()
				// vLLM's /metrics, histograms included, is a few hundred KB.
				body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
				if err != nil {
					return nil, err
				}
				if resp.StatusCode/100 != 2 {
					return nil, fmt.Errorf("GET %s: status %d", metricsURL(n.BaseURL), resp.StatusCode)
				}
				return body, nil
			},
		})
	}
}
