package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tollgate/tollgate/auth"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/metrics"
	"github.com/tollgate/tollgate/payments"
	"github.com/tollgate/tollgate/relay"
	"github.com/tollgate/tollgate/routing"
	"github.com/tollgate/tollgate/server"
	"github.com/tollgate/tollgate/tracing"
	"github.com/tollgate/tollgate/traffic"
)

// Main is the running service: store, authenticator, traffic counter, relay
// and the HTTP listeners. `tollgate serve`, `tollgate demo` and the
// end-to-end tests all run this same struct (tests on port 0).
type Main struct {
	Config *config.Config
	Log    *slog.Logger

	Store   Store
	Auth    *auth.Authenticator
	Traffic *traffic.Counter
	Share   *traffic.Share
	Relay   *relay.Relay
	Biller  *billing.Biller // nil when billing.disabled
	// Payments takes account holders' payments (nil: config payments off).
	Payments *payments.Service
	// PaymentsProvider replaces the provider config payments: builds (a
	// test's); nil: built from the config.
	PaymentsProvider payments.Provider
	Server           *server.Server
	Metrics          *metrics.Metrics
	// Tracing exports spans (nil: tracing off). A test may set it before
	// Open, with an in-memory exporter.
	Tracing *tracing.Provider
	// NoMetrics leaves the Prometheus metrics out (the benchmark's baseline).
	NoMetrics bool
	// RequestLog takes the request lines as JSON written directly
	// (configLogger's; nil: they go through Log).
	RequestLog io.Writer

	servers  []*http.Server
	names    []string          // each server's listener name
	inflight atomic.Int64      // handlers running, on every listener
	addrs    map[string]string // listener name -> actual address
	cancel   context.CancelFunc
	bg       sync.WaitGroup

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
	cat := relay.NewCatalog(catalogSpec(cfg), nil)
	deps := relay.Deps{Traffic: m.Traffic, Log: m.Log}
	if !m.NoMetrics {
		m.Metrics = metrics.New(buildInfo())
		deps.Streams = m.Metrics.InflightStreams
	}
	if m.Tracing == nil {
		if m.Tracing, err = tracing.New(tracingOptions(&cfg.Tracing), buildInfo().Version); err != nil {
			st.Close()
			return err
		}
	}
	if m.Tracing != nil {
		deps.Tracer = m.Tracing.Tracer()
	}
	if svc, err := newSearch(&cfg.Search, nil); err != nil {
		st.Close()
		return err
	} else if svc != nil {
		deps.Search = svc
	}
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
		MaxSearches:      cfg.Search.MaxSearches,
		Health: routing.HealthPolicy{
			FailureThreshold:  cfg.Health.FailureThreshold,
			BackoffMin:        cfg.Health.BackoffMin.D(),
			BackoffMax:        cfg.Health.BackoffMax.D(),
			FailurePercent:    cfg.Health.FailurePercent,
			Window:            cfg.Health.Window.D(),
			MinRequests:       cfg.Health.MinRequests,
			EjectionBase:      cfg.Health.EjectionBase.D(),
			EjectionMax:       cfg.Health.EjectionMax.D(),
			MaxEjectedPercent: cfg.Health.MaxEjectedPercent,
		},
	}, deps)
	m.Server = server.New(m.Relay, m.Auth, m.Share, m.Log)
	m.Server.Metrics = m.Metrics
	m.Server.RequestLog = m.RequestLog
	m.Server.Tracer = deps.Tracer
	m.Server.Version, m.Server.Commit = buildInfo().Version, buildInfo().Commit
	m.Server.Ready = func(ctx context.Context) error {
		_, err := st.AuthVersion(ctx)
		return err
	}
	if err := m.openPayments(); err != nil {
		m.Close(ctx)
		return err
	}
	if m.Payments != nil && cfg.Payments.AutoTopUp {
		m.background(func() { m.Payments.RunAutoTopUps(bgctx, autoTopUpInterval) })
	}
	con, err := newConsole(cfg, m.Relay, m.Share, st, m.paymentsConsole(), m.Log)
	if err != nil {
		m.Close(ctx)
		return err
	}
	m.openIdempotency(bgctx)

	m.background(func() { _ = m.Auth.Run(bgctx) })
	m.background(func() { _ = m.Traffic.Run(bgctx) })
	if m.Biller != nil {
		m.background(func() { _ = m.Biller.Run(bgctx) })
	}
	m.background(func() { m.Relay.RunHealthChecks(bgctx, max(cfg.Health.Interval.D(), 0), cfg.Health.Timeout.D()) })

	m.addrs = map[string]string{}
	m.Server.BodyTimeout = cfg.Timeouts.RequestBody.D()
	var cert []tls.Certificate
	if t := cfg.Listen.TLS; t != nil {
		c, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			m.Close(ctx)
			return fmt.Errorf("listen.tls: %w", err)
		}
		cert = []tls.Certificate{c}
	}
	listen := func(name, addr string, h http.Handler) error {
		if addr == "" {
			return nil
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen %s on %s: %w", name, addr, err)
		}
		m.addrs[name] = ln.Addr().String()
		srv := &http.Server{
			Handler:           m.counted(h),
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       120 * time.Second,
			MaxHeaderBytes:    1 << 20,
			// No write timeout: streams run for up to timeouts.stream_total
			// and set their own deadline (relay/stream.go); the request
			// body's read deadline is the middleware's (server/middleware.go).
			ErrorLog:  slog.NewLogLogger(m.Log.With("listener", name).Handler(), slog.LevelWarn),
			Protocols: new(http.Protocols),
			// OPTIONS * goes through the middleware (request id, access
			// log) to the routes' answer (server/server.go).
			DisableGeneralOptionsHandler: true,
		}
		srv.Protocols.SetHTTP1(true)
		tlsOn := cfg.Listen.TLS.Serves(name)
		if tlsOn {
			srv.Protocols.SetHTTP2(true)
			srv.TLSConfig = &tls.Config{Certificates: cert, MinVersion: tls.VersionTLS12}
		} else {
			ln = server.EnvelopeListener(ln, m.Server.NewRequestID)
		}
		if name == "api" {
			// h2c (HTTP/2 with prior knowledge) for clients and proxies
			// that multiplex streams over plain TCP.
			srv.Protocols.SetUnencryptedHTTP2(true)
		}
		m.servers = append(m.servers, srv)
		m.names = append(m.names, name)
		go func() {
			var err error
			if tlsOn {
				err = srv.ServeTLS(ln, "", "")
			} else {
				err = srv.Serve(ln)
			}
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				m.Log.Error("listener stopped", "listener", name, "err", err)
			}
		}()
		return nil
	}
	if err := listen("api", cfg.Listen.API, m.Server.Handler(apiRoutes(m.Server, con, m.Payments))); err != nil {
		m.Close(ctx)
		return err
	}
	if err := listen("public", cfg.Listen.Public, m.Server.Handler(publicRoutes(m.Server, m.Payments))); err != nil {
		m.Close(ctx)
		return err
	}
	op, err := newOperator(cfg, m.Relay, m.Share, st, m.paymentsAdmin(), m.Log)
	if err != nil {
		m.Close(ctx)
		return err
	}
	var metricsHandler http.Handler
	if m.Metrics != nil {
		m.Metrics.Registry.MustRegister(metrics.NodeCollector{Source: m.Relay}, metrics.PrefixCollector{Source: m.Relay})
		if m.Biller != nil {
			m.Metrics.Registry.MustRegister(metrics.BillingCollector{Source: m.Biller})
		}
		metricsHandler = m.Metrics.Handler()
	}
	admin := adminListenerRoutes(m.Server, newAdminAPI(cfg, st, m.paymentsAdmin(), m.Log), op, m.Payments, metricsHandler, cfg.AdminToken)
	if err := listen("admin", cfg.Listen.Admin, m.Server.Handler(admin)); err != nil {
		m.Close(ctx)
		return err
	}
	return nil
}

// counted keeps m.inflight, so that Close can wait for the handlers of
// connections it closed (http.Server.Close forgets them at once).
func (m *Main) counted(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.inflight.Add(1)
		defer m.inflight.Add(-1)
		h.ServeHTTP(w, r)
	})
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

// Close shuts down gracefully: /readyz turns 503, the api and public
// listeners stop accepting at once (the admin listener answers until they
// are drained), running requests get until ctx's deadline to finish, then traffic counts
// are flushed and the store closed. Requests still running at the deadline
// have their connections closed and get closeDrain to charge what they
// generated. Later calls do nothing and return nil.
func (m *Main) Close(ctx context.Context) error {
	var err error
	m.closeOnce.Do(func() { err = m.close(ctx) })
	return err
}

func (m *Main) close(ctx context.Context) error {
	// From now on /readyz answers 503: the load balancer stops sending.
	if m.Server != nil {
		m.Server.SetDraining()
	}
	// Each Shutdown closes its listener first, then waits. The api and
	// public listeners stop accepting at once and drain together; the admin
	// listener goes on answering (/readyz's 503, a last /metrics scrape)
	// until they are done, then stops too.
	shut := make([]error, len(m.servers))
	var wg sync.WaitGroup
	admin := -1
	for i, s := range m.servers {
		if m.names[i] == "admin" {
			admin = i
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			shut[i] = s.Shutdown(ctx)
		}()
	}
	wg.Wait()
	if admin >= 0 {
		shut[admin] = m.servers[admin].Shutdown(ctx)
	}
	var errs []error
	drain, cancelDrain := context.WithTimeout(context.Background(), closeDrain)
	defer cancelDrain()
	cut := false
	for i, s := range m.servers {
		if shut[i] != nil {
			errs = append(errs, shut[i])
			_ = s.Close()
			cut = true
		}
	}
	// The closed connections' requests end and settle; the biller must
	// still be open for their charges.
	for cut && m.inflight.Load() > 0 && drain.Err() == nil {
		select {
		case <-drain.Done():
		case <-time.After(10 * time.Millisecond):
		}
	}
	if m.cancel != nil {
		m.cancel()
	}
	m.bg.Wait()
	if m.Relay != nil {
		m.Relay.Close()
	}
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
	if m.Tracing != nil {
		tctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := m.Tracing.Shutdown(tctx); err != nil {
			m.Log.Warn("flush traces", "err", err)
		}
		cancel()
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
	var configFile string
	configFlag(fs, &configFile)
	logLevel := fs.String("log-level", "", "debug, info, warn or error (overrides log.level of the config; default info)")
	fs.Usage = func() {
		fmt.Fprintln(c.stderr, "Usage: tollgate serve [--config FILE] [--log-level LEVEL]")
		fmt.Fprintln(c.stderr, "\nRuns the service until SIGINT or SIGTERM, then drains running requests.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return flagErr(err)
	}
	if *logLevel != "" {
		if _, err := newLogger(c.stderr, *logLevel); err != nil {
			return usageError{err.Error()}
		}
	}
	path := configPath(configFile)
	cfg, err := loadConfig(path, false)
	if err != nil {
		return err
	}
	if *logLevel != "" {
		cfg.Log.Level = *logLevel
	}
	log, lines, closeLog, err := configLogger(cfg, c.stderr, c.stdout)
	if err != nil {
		return err
	}
	defer closeLog()
	m := &Main{Config: cfg, Log: log, RequestLog: lines}
	if err := m.Open(ctx); err != nil {
		return err
	}
	journal := cfg.Billing.JournalDir
	if journal == "" || cfg.Billing.Disabled {
		journal = "off"
	}
	log.Info("tollgate serving", "api", m.Addr("api"), "public", m.Addr("public"), "admin", m.Addr("admin"), "models", len(cfg.Models),
		"store", describeStore(cfg.Store), "charge_journal", journal)
	return m.waitAndClose(ctx, path)
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
	m.Log.Info("shutting down", "deadline_seconds", m.Config.Timeouts.Shutdown.D().Seconds())
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
	m.Relay.SetCatalog(relay.NewCatalog(catalogSpec(cfg), m.Relay.Catalog()))
	m.Config.Models = cfg.Models
	return nil
}

func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	return newFormatLogger(w, level, "json")
}

func newFormatLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: l}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return slog.New(slog.NewJSONHandler(w, opts)), nil
}

// logFlushInterval is how often buffered log lines are written out.
const logFlushInterval = 200 * time.Millisecond

// configLogger builds the logger the config's log: section asks for, its
// lines buffered (logWriter). With JSON at level info or below it also
// returns the writer request lines go to directly (server.RequestLog). The
// returned func writes out the rest and closes a log file.
func configLogger(cfg *config.Config, stderr, stdout io.Writer) (*slog.Logger, io.Writer, func(), error) {
	w, done := stderr, func() {}
	switch out := cfg.Log.Output; out {
	case "stderr", "":
	case "stdout":
		w = stdout
	default:
		if !filepath.IsAbs(out) {
			out = filepath.Join(cfg.Dir, out)
		}
		f, err := os.OpenFile(out, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("log.output: %w", err)
		}
		w, done = f, func() { f.Close() }
	}
	lw := newLogWriter(w, logFlushInterval)
	closeAll := func() { lw.Close(); done() }
	log, err := newFormatLogger(lw, cfg.Log.Level, cfg.Log.Format)
	if err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	var lines io.Writer
	if cfg.Log.Format == "json" && log.Enabled(context.Background(), slog.LevelInfo) {
		lines = lw
	}
	return log, lines, closeAll, nil
}

func defaultConfigPath() string {
	if p := os.Getenv("TOLLGATE_CONFIG"); p != "" {
		return p
	}
	return "tollgate.yaml"
}
