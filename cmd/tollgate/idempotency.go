package main

import (
	"context"
	"fmt"

	"github.com/tollgate/tollgate/idempotency"
	"github.com/tollgate/tollgate/postgres"
	"github.com/tollgate/tollgate/sqlite"
)

// Both stores keep Idempotency-Keys.
var (
	_ idempotency.Store = (*sqlite.DB)(nil)
	_ idempotency.Store = (*postgres.DB)(nil)
)

// openIdempotency gives the server its Idempotency-Key keeper on the store
// and starts the purge of expired keys (config `idempotency:`).
func (m *Main) openIdempotency(bgctx context.Context) error {
	st, ok := m.Store.(idempotency.Store)
	if !ok {
		return fmt.Errorf("store %T does not keep Idempotency-Keys", m.Store)
	}
	c := m.Config.Idempotency
	m.Server.Idempotency = idempotency.New(st, idempotency.Options{
		TTL:              c.TTL.D(),
		Lease:            c.Lease.D(),
		MaxResponseBytes: c.MaxResponseBytes,
		Log:              m.Log,
	})
	if every := c.Purge.D(); every > 0 {
		m.background(func() { m.Server.Idempotency.RunPurge(bgctx, every) })
	}
	return nil
}
