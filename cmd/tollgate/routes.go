package main

import (
	"net/http"
	"net/http/pprof"

	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/console"
	"github.com/tollgate/tollgate/payments"
	"github.com/tollgate/tollgate/server"
)

// The routes of the three listeners, on ServeMux patterns: "POST /path"
// serves one method (GET serves HEAD too), "/path" any method, "/path/" a
// subtree. A path served with another method is 405 method_not_allowed,
// any other path 404 not_found, both in the error envelope (server.Mux).
// A subtree's handler routes within it and answers its own misses: the
// console's pages are declared in console.New (its payment pages in
// console/payments.go), the operator's in console.NewOperator, the admin
// API's in admin.New (its payment routes in admin/payments.go).

// apiRoutes is every path the api listener serves; pay may be nil
// (payments off). Any other path is 404, the protocol's other endpoints
// (embeddings, completions, responses, ...) included: docs/api.md has no
// fallback to another endpoint.
func apiRoutes(s *server.Server, con *console.Console, pay *payments.Service) *server.Mux {
	m := s.NewMux()
	m.HandleFunc("POST /v1/chat/completions", s.Chat)
	m.HandleFunc("GET /v1/models", s.Models)
	m.HandleFunc("GET /pricing", s.Pricing)
	if pay != nil {
		m.HandleFunc("POST /webhooks/stripe", pay.ServeWebhook) // payments.WebhookPath
	}
	m.Handle("/console/", con)
	m.Handle("GET /favicon.ico", con)
	return m
}

// publicRoutes is every path the public listener serves; pay may be nil
// (payments off).
func publicRoutes(s *server.Server, pay *payments.Service) *server.Mux {
	m := s.NewMux()
	m.HandleFunc("GET /pricing", s.Pricing)
	if pay != nil {
		m.HandleFunc("POST /webhooks/stripe", pay.ServeWebhook) // payments.WebhookPath
	}
	return m
}

// adminListenerRoutes is every path the admin listener serves; metrics may
// be nil (metrics off). pprof needs the admin token, as the admin API does.
func adminListenerRoutes(s *server.Server, api *admin.API, op *console.Operator, metrics http.Handler, token string) *server.Mux {
	m := s.NewMux()
	m.HandleFunc("GET /healthz", s.Healthz)
	m.HandleFunc("GET /readyz", s.Readyz)
	m.Handle("/admin/v1/", api)
	m.Handle("/console/", op)
	m.Handle("GET /favicon.ico", op)
	if metrics != nil {
		m.Handle("/metrics", metrics)
	}
	m.Handle("/debug/pprof/", s.RequireBearer(token, http.HandlerFunc(pprof.Index)))
	m.Handle("/debug/pprof/cmdline", s.RequireBearer(token, http.HandlerFunc(pprof.Cmdline)))
	m.Handle("/debug/pprof/profile", s.RequireBearer(token, http.HandlerFunc(pprof.Profile)))
	m.Handle("/debug/pprof/symbol", s.RequireBearer(token, http.HandlerFunc(pprof.Symbol)))
	m.Handle("/debug/pprof/trace", s.RequireBearer(token, http.HandlerFunc(pprof.Trace)))
	return m
}
