package main

import (
	"context"

	"github.com/tollgate/tollgate/idempotency"
)

// openIdempotency gives the server its Idempotency-Key keeper on the store
// and starts the purge of expired keys (config `idempotency:`).
func (m *Main) openIdempotency(bgctx context.Context) {
	c := m.Config.Idempotency
	m.Server.Idempotency = idempotency.New(m.Store, idempotency.Options{
		TTL:              c.TTL.D(),
		Lease:            c.Lease.D(),
		MaxResponseBytes: c.MaxResponseBytes,
		Log:              m.Log,
	})
	if every := c.Purge.D(); every > 0 {
		m.background(func() { m.Server.Idempotency.RunPurge(bgctx, every) })
	}
}
