package main

import (
	"log/slog"
	"net/http"

	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/console"
	"github.com/tollgate/tollgate/relay"
)

// consoleRoutes are the console's handlers for the api listener.
func consoleRoutes(cfg *config.Config, rl *relay.Relay, uptime console.UptimeReader, st Store, pay console.Payments, log *slog.Logger) (map[string]http.Handler, error) {
	c, err := console.New(st, console.Options{Catalog: rl.Catalog, Uptime: uptime, TrustedProxies: cfg.Console.Trusted, Log: log, Payments: pay})
	if err != nil {
		return nil, err
	}
	return c.Routes(), nil
}

// operatorRoutes are the operator's console for the admin listener.
func operatorRoutes(cfg *config.Config, rl *relay.Relay, uptime console.UptimeReader, st Store, pay console.OperatorPayments, log *slog.Logger) (map[string]http.Handler, error) {
	op, err := console.NewOperator(st, console.OperatorOptions{Token: cfg.AdminToken, Catalog: rl.Catalog, NodeHealth: rl.NodeHealth, Uptime: uptime,
		AuditGrace: auditGrace(cfg), APIBase: consoleBase(cfg.Listen.API), TrustedProxies: cfg.Console.Trusted, Payments: pay, Log: log})
	if err != nil {
		return nil, err
	}
	return op.Routes(), nil
}

// adminListenerRoutes are the admin API and the operator's console.
func adminListenerRoutes(cfg *config.Config, rl *relay.Relay, uptime console.UptimeReader, st Store, pay admin.Payments, log *slog.Logger) (map[string]http.Handler, error) {
	routes := map[string]http.Handler{}
	for p, h := range adminRoutes(cfg, st, pay, log) {
		routes[p] = h
	}
	op, err := operatorRoutes(cfg, rl, uptime, st, pay, log) // nil stays nil: payments off
	for p, h := range op {
		routes[p] = h
	}
	return routes, err
}
