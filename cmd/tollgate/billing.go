package main

import (
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/config"
)

// billingStore is what the stores offer for billing and the operator's tools.
type billingStore interface {
	billing.Store
	billing.BooksStore
}

// newBiller builds the Biller on the config's store.
func newBiller(cfg *config.Config, st tollgate.Store, log *slog.Logger) (*billing.Biller, error) {
	bs, ok := st.(billing.Store)
	if !ok {
		return nil, fmt.Errorf("billing: the %s store keeps no holds", cfg.Store.Driver)
	}
	workers := cfg.Billing.Workers
	if workers == 0 {
		workers = 1 // SQLite has one writer
		if cfg.Store.Driver == "postgres" {
			workers = 4
		}
	}
	b, err := billing.Open(bs, billing.Options{
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

// books returns the store's operator view, or an error naming the driver.
func books(st tollgate.Store) (billingStore, error) {
	bs, ok := st.(billingStore)
	if !ok {
		return nil, fmt.Errorf("this store keeps no ledger")
	}
	return bs, nil
}

// adminRoutes is the admin API for the admin listener (nil when the store
// keeps no ledger). Without an admin token every request is 401.
// pay serves the payment routes (nil: payments off).
func adminRoutes(cfg *config.Config, st tollgate.Store, pay admin.Payments, log *slog.Logger) map[string]http.Handler {
	as, ok := st.(admin.Store)
	if !ok {
		return nil
	}
	models := make([]string, 0, len(cfg.Models))
	for _, m := range cfg.Models {
		models = append(models, m.ID)
	}
	return admin.New(as, admin.Options{Token: cfg.AdminToken, AuditGrace: auditGrace(cfg), Models: models, Log: log, Payments: pay}).Routes()
}

// auditGrace is how long past its lease a hold may live before the audit
// calls it orphaned: two sweeps and a renewal, so a running sweeper always
// has had its chance.
func auditGrace(cfg *config.Config) time.Duration {
	return 2*cfg.Billing.Sweep.D() + cfg.Billing.Renew.D()
}
