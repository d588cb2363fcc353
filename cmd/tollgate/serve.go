package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/auth"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/httpd"
	"github.com/tollgate/tollgate/relay"
	"github.com/tollgate/tollgate/server"
	"github.com/tollgate/tollgate/traffic"
)

// Main is the running service: store, authenticator, traffic counter, relay
// and the HTTP listeners. `tollgate serve`, `tollgate demo` and the
// end-to-end tests all run this same struct (tests on port 0).
type Main struct {
	Config *config.Config
	Log    *slog.Logger

	Store   tollgate.Store
	Auth    *auth.Authenticator
	Traffic *traffic.Counter
	Share   *traffic.Share
	Relay   *relay.Relay
	Biller  *billing.Biller // nil when billing.disabled
	Server  *server.Server

	servers []*httpd.Server
	addrs   map[string]string // listener name -> actual address
	cancel  context.CancelFunc
	bg      sync.WaitGroup

	closeOnce sync.Once
}

// Open starts everything: the store (migrated), background loops, and the
// listeners. Addresses ending in :0 get a free port; see Addr.
func (m *Main) Open(ctx context.Context) error {
	cfg := m.Config
	if m.Log == nil {
		m.Log = slog.New(slog.DiscardHandler)
	}
	st, err := openStore(ctx, cfg.Store)
	if err != nil {
		return err
	}
	m.Store = st
	bgctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel

	m.Auth = auth.New(st, auth.Options{PollInterval: cfg.Auth.Poll.D(), Logger: m.Log})
	m.Traffic = traffic.NewCounter(st, traffic.CounterOptions{FlushInterval: cfg.Traffic.Flush.D(), Logger: m.Log})
	m.Share = traffic.NewShare(st, traffic.ShareOptions{TTL: cfg.Traffic.ShareCache.D(), Logger: m.Log})
	cat := relay.NewCatalog(cfg, nil)
	deps := relay.Deps{Traffic: m.Traffic, Log: m.Log}
	if !cfg.Billing.Disabled {
		if m.Biller, err = newBiller(cfg, st, m.Log); err != nil {
			st.Close()
			return err
		}
		deps.Biller = m.Biller
		// Charges that a dead run journaled go into the ledger before the
		// first request is served: an Idempotency-Key retry of a request
		// whose instance died must find its charge (docs/idempotency.md).
		// If this fails, Run tries again at each sweep.
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		if _, err := m.Biller.RecoverJournals(rctx); err != nil {
			m.Log.Error("apply dead instances' charge journals before serving", "err", err)
		}
		rcancel()
	}
	m.Relay = relay.New(cat, relay.Options{
		NonStreamTimeout: cfg.Timeouts.NonStream.D(),
		StreamTotal:      cfg.Timeouts.StreamTotal.D(),
		StreamIdle:       cfg.Timeouts.StreamIdle.D(),
		KeepAlive:        cfg.Timeouts.KeepAlive.D(),
		ConnectTimeout:   cfg.Timeouts.Connect.D(),
		Health: relay.HealthPolicy{
			FailureThreshold: cfg.Health.FailureThreshold,
			BackoffMin:       cfg.Health.BackoffMin.D(),
			BackoffMax:       cfg.Health.BackoffMax.D(),
		},
	}, deps)
	m.Server = server.New(m.Relay, m.Auth, m.Share, m.Log)
	m.Server.Ready = func(ctx context.Context) error {
		_, err := st.AuthVersion(ctx)
		return err
	}
	if err := m.openIdempotency(bgctx); err != nil {
		m.Close(ctx)
		return err
	}

	m.background(func() { _ = m.Auth.Run(bgctx) })
	m.background(func() { _ = m.Traffic.Run(bgctx) })
	if m.Biller != nil {
		m.background(func() { _ = m.Biller.Run(bgctx) })
	}
	m.background(func() { m.Relay.RunHealthChecks(bgctx, max(cfg.Health.Interval.D(), 0), cfg.Health.Timeout.D()) })

	m.addrs = map[string]string{}
	listen := func(name, addr string, h http.Handler) error {
		if addr == "" {
			return nil
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen %s on %s: %w", name, addr, err)
		}
		m.addrs[name] = ln.Addr().String()
		// httpd, not net/http's server: no goroutine per request
		// (httpd's package comment, docs/performance.md).
		srv := &httpd.Server{
			Handler:           h,
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       120 * time.Second,
			// No write timeout: streams run for up to timeouts.stream_total
			// and set their own deadline (relay/stream.go).
			Log:       m.Log.With("listener", name),
			ErrorBody: server.HTTPErrorBody,
			RequestID: m.Server.NewRequestID,
		}
		m.servers = append(m.servers, srv)
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, httpd.ErrServerClosed) {
				m.Log.Error("listener stopped", "listener", name, "err", err)
			}
		}()
		return nil
	}
	if err := listen("api", cfg.Listen.API, m.Server.APIHandler()); err != nil {
		m.Close(ctx)
		return err
	}
	if err := listen("public", cfg.Listen.Public, m.Server.PublicHandler()); err != nil {
		m.Close(ctx)
		return err
	}
	if err := listen("admin", cfg.Listen.Admin, m.Server.AdminHandler(adminRoutes(cfg, st, m.Log))); err != nil {
		m.Close(ctx)
		return err
	}
	return nil
}

func (m *Main) background(f func()) {
	m.bg.Add(1)
	go func() {
		defer m.bg.Done()
		f()
	}()
}

// Addr returns the actual address of a listener ("api", "public", "admin").
func (m *Main) Addr(name string) string { return m.addrs[name] }

// APIURL is the base URL clients use, with /v1.
func (m *Main) APIURL() string { return "http://" + m.addrs["api"] + "/v1" }

// closeDrain is how long requests cut at the shutdown deadline get to end
// and settle (their connections are closed; a closed connection cancels the
// backend call at once) before the biller and the store close.
const closeDrain = 5 * time.Second

// Close shuts down gracefully: every listener stops accepting at once,
// running requests get until ctx's deadline to finish, then traffic counts
// are flushed and the store closed. Requests still running at the deadline
// have their connections closed and get closeDrain to charge what they
// generated. Later calls do nothing and return nil.
func (m *Main) Close(ctx context.Context) error {
	var err error
	m.closeOnce.Do(func() { err = m.close(ctx) })
	return err
}

func (m *Main) close(ctx context.Context) error {
	// Each Shutdown closes its listeners first, then waits: all of them at
	// once, so the public and admin listeners do not go on accepting while
	// the API listener's streams finish.
	shut := make([]error, len(m.servers))
	var wg sync.WaitGroup
	for i, s := range m.servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			shut[i] = s.Shutdown(ctx)
		}()
	}
	wg.Wait()
	var errs []error
	drain, cancelDrain := context.WithTimeout(context.Background(), closeDrain)
	defer cancelDrain()
	for i, s := range m.servers {
		if shut[i] != nil {
			errs = append(errs, shut[i])
			_ = s.Close()
			// The closed connections' requests end and settle; the biller
			// must still be open for their charges.
			_ = s.Shutdown(drain)
		}
	}
	if m.cancel != nil {
		m.cancel()
	}
	m.bg.Wait()
	if m.Biller != nil {
		m.Biller.Close()
	}
	if m.Traffic != nil {
		fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := m.Traffic.Flush(fctx); err != nil {
			errs = append(errs, fmt.Errorf("flush traffic: %w", err))
		}
		cancel()
	}
	if m.Store != nil {
		if err := m.Store.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// serveCmd is `tollgate serve`.
type serveCmd struct {
	stdout, stderr io.Writer
}

func (c *serveCmd) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	configPath := fs.String("config", defaultConfigPath(), "config file (env TOLLGATE_CONFIG)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	fs.Usage = func() {
		fmt.Fprintln(c.stderr, "Usage: tollgate serve [--config FILE]")
		fmt.Fprintln(c.stderr, "\nRuns the service until SIGINT or SIGTERM, then drains running requests.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return flagErr(err)
	}
	log, err := newLogger(c.stderr, *logLevel)
	if err != nil {
		return usageError{err.Error()}
	}
	cfg, err := config.Load(*configPath)
	if err != nil {
		return err
	}
	m := &Main{Config: cfg, Log: log}
	if err := m.Open(ctx); err != nil {
		return err
	}
	journal := cfg.Billing.JournalDir
	if journal == "" || cfg.Billing.Disabled {
		journal = "off"
	}
	log.Info("tollgate serving", "api", m.Addr("api"), "public", m.Addr("public"), "admin", m.Addr("admin"), "models", len(cfg.Models),
		"store", describeStore(cfg.Store), "charge_journal", journal)
	return m.waitAndClose(ctx, *configPath)
}

// waitAndClose runs until ctx ends, reloading the catalogue on SIGHUP.
func (m *Main) waitAndClose(ctx context.Context, configPath string) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-hup:
			if err := m.Reload(configPath); err != nil {
				m.Log.Error("reload failed; keeping the running config", "err", err)
			} else {
				m.Log.Info("config reloaded", "models", len(m.Config.Models))
			}
			continue
		case <-ctx.Done():
		}
		break
	}
	m.Log.Info("shutting down", "deadline", m.Config.Timeouts.Shutdown.D())
	sctx, cancel := context.WithTimeout(context.Background(), m.Config.Timeouts.Shutdown.D())
	defer cancel()
	return m.Close(sctx)
}

// Reload re-reads the config and swaps the catalogue (models, backends,
// nodes, rates). Running streams keep the catalogue they started with.
// Listeners and the store are not changed by a reload.
func (m *Main) Reload(path string) error {
	cfg, err := config.Load(path)
	if err != nil {
		return err
	}
	m.Relay.SetCatalog(relay.NewCatalog(cfg, m.Relay.Catalog()))
	m.Config.Models = cfg.Models
	return nil
}

func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})), nil
}

func defaultConfigPath() string {
	if p := os.Getenv("TOLLGATE_CONFIG"); p != "" {
		return p
	}
	return "tollgate.yaml"
}
