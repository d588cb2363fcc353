package relay

import (
	"bytes"
	"context"
	"fmt"
	"io"

	"github.com/tollgate/tollgate/nodeload"
	"github.com/tollgate/tollgate/openai"
	"github.com/tollgate/tollgate/upstream"
)

// load_poll's HTTP side: each polled node's /metrics is read through the
// same client as its chat requests (package upstream); routing keeps the
// reports (routing/load.go).

// pollsLoad reports whether a node of this flavour serves a /metrics that
// nodeload reads (vLLM and SGLang; SGLang with --enable-metrics).
func pollsLoad(f openai.Flavour) bool { return f == openai.VLLM || f == openai.SGLang }

// startPolls starts polling the load of the catalogue's nodes that want it
// and have no poller yet (before the catalogue is in force: requests read
// the poller without a lock).
func (r *Relay) startPolls(c *Catalog) {
	if c == nil {
		return
	}
	for _, n := range c.Nodes() {
		if _, polled := n.LoadStats(); polled || n.LoadPoll() <= 0 {
			continue
		}
		url := serverRoot(n.BaseURL) + "/metrics" // the node's Prometheus endpoint
		pool, err := upstream.NewPool(url, r.dialer)
		if err != nil {
			continue
		}
		pool.SetMaxIdle(1)
		head := upstream.Head{Probe: true}
		if n.Key != "" {
			head.Authorization = n.authorization()[0]
		}
		var body bytes.Buffer // one node's polls come one at a time: reused
		n.StartLoadPoll(nodeload.Options{
			Log: r.log.With("node", n.Name),
			Fetch: func(ctx context.Context) ([]byte, error) {
				resp, err := pool.Post(ctx, head, nil)
				if err != nil {
					return nil, err
				}
				defer resp.Body.Close()
				// vLLM's /metrics, histograms included, is a few hundred KB.
				body.Reset()
				if _, err := body.ReadFrom(io.LimitReader(resp.Body, 8<<20)); err != nil {
					return nil, err
				}
				if resp.StatusCode/100 != 2 {
					return nil, fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
				}
				return body.Bytes(), nil
			},
		})
	}
}
