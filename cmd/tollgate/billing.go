package main

import (
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/config"
)

// newBiller builds the Biller on the config's store.
func newBiller(cfg *config.Config, st Store, log *slog.Logger) (*billing.Biller, error) {
	workers := cfg.Billing.Workers
	if workers == 0 {
		workers = 1 // SQLite has one writer
		if cfg.Store.Driver == "postgres" {
			workers = 4
		}
	}
	b, err := billing.Open(st, billing.Options{
		Lease:       cfg.Billing.Lease.D(),
		Renew:       cfg.Billing.Renew.D(),
		Sweep:       cfg.Billing.Sweep.D(),
		MaxAge:      max(cfg.Timeouts.StreamTotal.D(), cfg.Timeouts.NonStream.D()) + time.Minute,
		MaxBatch:    cfg.Billing.MaxBatch,
		BatchWait:   cfg.Billing.BatchWait.D(),
		NoPipeline:  cfg.Billing.NoPipeline,
		Workers:     workers,
		AsyncSettle: cfg.Billing.AsyncSettle,
		Journal:     cfg.Billing.JournalDir,
		Logger:      log,
	})
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("%w (billing.journal: off runs without one)", err)
	}
	return b, nil
}

// adminRoutes is the admin API for the admin listener. Without an admin
// token every request is 401. pay serves the payment routes (nil: payments
// off).
func adminRoutes(cfg *config.Config, st Store, pay admin.Payments, log *slog.Logger) map[string]http.Handler {
	models := make([]string, 0, len(cfg.Models))
	for _, m := range cfg.Models {
		models = append(models, m.ID)
	}
	return admin.New(st, admin.Options{Token: cfg.AdminToken, AuditGrace: auditGrace(cfg), Models: models, Log: log, Payments: pay}).Routes()
}

// auditGrace is how long past its lease a hold may live before the audit
// calls it orphaned: two sweeps and a renewal, so a running sweeper always
// has had its chance.
func auditGrace(cfg *config.Config) time.Duration {
	return 2*cfg.Billing.Sweep.D() + cfg.Billing.Renew.D()
}
