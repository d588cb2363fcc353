package main

import (
	"log/slog"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/console"
	"github.com/tollgate/tollgate/relay"
)

// newConsole is the account holders' console, for the api listener; pay
// serves its payment pages (nil: payments off).
func newConsole(cfg *config.Config, rl *relay.Relay, uptime console.UptimeReader, st Store, pay console.Payments, log *slog.Logger) (*console.Console, error) {
	return console.New(st, console.Options{Catalog: rl.Catalog, Uptime: uptime, TrustedProxies: cfg.Console.Trusted, Log: log, Payments: pay})
}

// newOperator is the operator's console, for the admin listener; pay serves
// its payment pages (nil: payments off).
func newOperator(cfg *config.Config, rl *relay.Relay, uptime console.UptimeReader, st Store, pay console.OperatorPayments, log *slog.Logger) (*console.Operator, error) {
	return console.NewOperator(st, console.OperatorOptions{Token: cfg.AdminToken, Catalog: rl.Catalog, NodeHealth: rl.NodeHealth, Uptime: uptime,
		AuditGrace: auditGrace(cfg), APIBase: consoleBase(cfg.Listen.API), TrustedProxies: cfg.Console.Trusted, Payments: pay, Log: log})
}
