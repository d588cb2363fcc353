package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/config"
)

// benchObservability is `tollgate bench --observability`: what metrics and
// the request log cost. Two tollgates in this process serve the same
// simulator with the same config (billing on, each its own SQLite file):
// "bare" with no metrics and its log discarded, "observed" with the
// Prometheus metrics and a JSON request line per request written to a file.
// Saturated phases alternate between them, rounds times, and the ratio of
// their throughputs is printed (the target is ≥ 0.95).
func benchObservability(ctx context.Context, out io.Writer, cfgText, dir string, conc, rounds int, dur, warm time.Duration) error {
	open := func(name string, observed bool) (*Main, target, func(), error) {
		text := strings.Replace(cfgText, "sqlite: bench.db", "sqlite: "+name+".db", 1)
		path := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			return nil, target{}, nil, err
		}
		cfg, err := config.Load(path)
		if err != nil {
			return nil, target{}, nil, err
		}
		m := &Main{Config: cfg, NoMetrics: !observed}
		closeLog := func() {}
		if observed {
			lf, err := os.Create(filepath.Join(dir, name+".log"))
			if err != nil {
				return nil, target{}, nil, err
			}
			// As `tollgate serve` writes it: buffered, flushed every 200 ms.
			lw := newLogWriter(lf, logFlushInterval)
			closeLog = func() { lw.Close(); lf.Close() }
			m.Log = slog.New(slog.NewJSONHandler(lw, nil))
			m.RequestLog = lw // as serve sets it up for JSON logs
		}
		if err := m.Open(ctx); err != nil {
			closeLog()
			return nil, target{}, nil, err
		}
		acct := tollgate.Account{ID: tollgate.NewID("acct_"), Name: name, Balance: tollgate.Dollars(1_000_000), Created: time.Now().UTC()}
		secret := tollgate.NewKeySecret()
		if err := m.Store.CreateAccount(ctx, acct); err == nil {
			err = m.Store.CreateKey(ctx, tollgate.Key{ID: tollgate.NewID("key_"), AccountID: acct.ID, Prefix: tollgate.DisplayPrefix(secret), Created: time.Now().UTC()}, tollgate.HashKey(secret))
		}
		stop := func() { m.Close(context.Background()); closeLog() }
		return m, target{name, m.APIURL() + "/chat/completions", "bench", secret}, stop, nil
	}
	_, bare, stopBare, err := open("bare", false)
	if err != nil {
		return err
	}
	defer stopBare()
	_, observed, stopObserved, err := open("observed", true)
	if err != nil {
		return err
	}
	defer stopObserved()
	client := newBenchClient()
	phase := func(t target, stream bool) float64 {
		body := benchBody(t.Model, stream)
		var n atomic.Int64
		var measuring, stopping atomic.Bool
		var wg sync.WaitGroup
		for range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 32<<10)
				for !stopping.Load() {
					resp, err := client.Do(t.request(ctx, body))
					if err != nil {
						continue
					}
					readAnswer(resp.Body, stream, time.Now(), buf)
					resp.Body.Close()
					if resp.StatusCode == 200 && measuring.Load() {
						n.Add(1)
					}
				}
			}()
		}
		time.Sleep(warm)
		measuring.Store(true)
		start := time.Now()
		time.Sleep(dur)
		measuring.Store(false)
		elapsed := time.Since(start)
		stopping.Store(true)
		wg.Wait()
		return float64(n.Load()) / elapsed.Seconds()
	}
	fmt.Fprintf(out, "tollgate bench --observability: %d clients, %d rounds of %s per build and kind, billing on (SQLite)\n\n", conc, rounds, dur)
	fmt.Fprintf(out, "%-14s %-6s %12s %12s %7s\n", "kind", "round", "bare req/s", "observed", "ratio")
	for _, stream := range []bool{false, true} {
		kind := "non-streamed"
		if stream {
			kind = "streamed"
		}
		var sumB, sumO float64
		var ratios []float64
		for r := range rounds {
			// Alternate which goes first, so that neither always meets the
			// machine in the same state.
			var b, o float64
			if r%2 == 0 {
				b, o = phase(bare, stream), phase(observed, stream)
			} else {
				o, b = phase(observed, stream), phase(bare, stream)
			}
			sumB, sumO = sumB+b, sumO+o
			ratios = append(ratios, o/b)
			fmt.Fprintf(out, "%-14s %-6d %12.0f %12.0f %7.3f\n", kind, r+1, b, o, o/b)
		}
		fmt.Fprintf(out, "%-14s %-6s %12.0f %12.0f %7.3f  (median of rounds %.3f)\n\n", kind, "all", sumB/float64(rounds), sumO/float64(rounds), sumO/sumB, median(ratios, func(f float64) float64 { return f }))
	}
	return nil
}

// median is the median of f over xs (the mean of the middle two for an even count).
func median[T any](xs []T, f func(T) float64) float64 {
	vs := make([]float64, len(xs))
	for i, x := range xs {
		vs[i] = f(x)
	}
	slices.Sort(vs)
	if len(vs) == 0 {
		return 0
	}
	if len(vs)%2 == 1 {
		return vs[len(vs)/2]
	}
	return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
}
