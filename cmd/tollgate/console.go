package main

import (
	"log/slog"
	"net/http"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/console"
	"github.com/tollgate/tollgate/relay"
)

// consoleRoutes are the console's handlers for the api listener; none when
// the store keeps no console records.
func consoleRoutes(rl *relay.Relay, uptime console.UptimeReader, st tollgate.Store, log *slog.Logger) (map[string]http.Handler, error) {
	cs, ok := st.(console.Store)
	if !ok {
		return nil, nil
	}
	c, err := console.New(cs, console.Options{Catalog: rl.Catalog, Uptime: uptime, Log: log})
	if err != nil {
		return nil, err
	}
	return c.Routes(), nil
}
