package main

import (
	"net/http"
	"net/http/pprof"

	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/console"
	"github.com/tollgate/tollgate/payments"
	"github.com/tollgate/tollgate/server"
)

// Every path the three listeners serve, on ServeMux patterns: "POST /path"
// serves one method (GET serves HEAD too), "/path" any method, "/path/" a
// subtree, "{id}" one path segment. A path served with another method is
// 405 method_not_allowed, any other path 404 not_found, both in the error
// envelope (server.Mux).
//
// The console's pages, the operator's and the admin API's endpoints are
// declared here one by one, each through the middleware of its package
// (console.Console.Page, SignedIn and SignedInHeld — the pages an account
// that payments disabled may use to pay what it owes —, console.Operator.Page
// and SignedIn, admin.API.Authorized). Each of the three also owns a subtree, whose
// pattern catches what none of its routes serves, a served path asked with
// another method included: the console answers it with its HTML page, the
// admin API with its 404 after the token check.

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

	// The account holder's console (docs/console.md).
	m.Handle("/console/", con.Page(con.NotFound))
	m.Handle("GET /favicon.ico", con.Page(console.Favicon))
	m.Handle("GET /console/static/", con.Page(con.Static))
	m.Handle("GET /console/signin", con.Page(con.SigninForm))
	m.Handle("POST /console/signin", con.Page(con.Signin))
	m.Handle("POST /console/signout", con.Page(con.Signout))
	m.Handle("GET /console/invite", con.Page(con.InviteForm))
	m.Handle("POST /console/invite", con.Page(con.AcceptInvite))
	m.Handle("GET /console/{$}", con.SignedIn(con.Overview))
	m.Handle("GET /console/keys", con.SignedIn(con.Keys))
	m.Handle("POST /console/keys", con.SignedIn(con.CreateKey))
	m.Handle("POST /console/keys/{id}/revoke", con.SignedIn(con.RevokeKey))
	m.Handle("GET /console/activity", con.SignedInHeld(con.Activity))
	m.Handle("GET /console/activity.csv", con.SignedInHeld(con.ActivityCSV))
	m.Handle("GET /console/playground", con.SignedIn(con.Playground))
	m.Handle("POST /console/playground/key", con.SignedIn(con.PlaygroundKey))
	if pay != nil {
		m.Handle("GET /console/payments", con.SignedInHeld(con.Payments))
		m.Handle("POST /console/payments", con.SignedInHeld(con.Checkout))
		m.Handle("GET /console/payments.csv", con.SignedInHeld(con.PaymentsCSV))
		m.Handle("POST /console/payments/auto-topup", con.SignedIn(con.SetAutoTopUp))
	}
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
// be nil (metrics off), pay too (payments off: the admin API's payment
// endpoints say so, the operator's payment pages are not served). pprof
// needs the admin token, as the admin API does.
func adminListenerRoutes(s *server.Server, api *admin.API, op *console.Operator, pay *payments.Service, metrics http.Handler, token string) *server.Mux {
	m := s.NewMux()
	m.HandleFunc("GET /healthz", s.Healthz)
	m.HandleFunc("GET /readyz", s.Readyz)

	// The admin API (docs/admin-api.md).
	m.Handle("/admin/v1/", api.Authorized(api.NotFound))
	m.Handle("GET /admin/v1/accounts", api.Authorized(api.ListAccounts))
	m.Handle("POST /admin/v1/accounts", api.Authorized(api.CreateAccount))
	m.Handle("GET /admin/v1/accounts/{id}", api.Authorized(api.ShowAccount))
	m.Handle("POST /admin/v1/accounts/{id}/disable", api.Authorized(api.Disable))
	m.Handle("POST /admin/v1/accounts/{id}/enable", api.Authorized(api.Enable))
	m.Handle("POST /admin/v1/accounts/{id}/invite", api.Authorized(api.Invite))
	m.Handle("POST /admin/v1/accounts/{id}/credit", api.Authorized(api.Credit))
	m.Handle("POST /admin/v1/accounts/{id}/debit", api.Authorized(api.Debit))
	m.Handle("GET /admin/v1/keys", api.Authorized(api.ListKeys))
	m.Handle("POST /admin/v1/keys", api.Authorized(api.CreateKey))
	m.Handle("POST /admin/v1/keys/{id}/revoke", api.Authorized(api.RevokeKey))
	m.Handle("GET /admin/v1/usage", api.Authorized(api.Usage))
	m.Handle("GET /admin/v1/audit", api.Authorized(api.Audit))
	m.Handle("GET /admin/v1/payments", api.Authorized(api.ListPayments))
	m.Handle("GET /admin/v1/payments/{id}", api.Authorized(api.ShowPayment))
	m.Handle("POST /admin/v1/payments/{id}/recheck", api.Authorized(api.Recheck))
	m.Handle("GET /admin/v1/payment-events", api.Authorized(api.PaymentEvents))
	m.Handle("GET /admin/v1/owed", api.Authorized(api.Owed))
	m.Handle("POST /admin/v1/accounts/{id}/collect-owed", api.Authorized(api.CollectOwed))

	// The operator's console (docs/console.md).
	m.Handle("/console/", op.Page(op.NotFound))
	m.Handle("GET /favicon.ico", op.Page(console.Favicon))
	m.Handle("GET /console/static/", op.Page(op.Static))
	m.Handle("GET /console/signin", op.Page(op.SigninForm))
	m.Handle("POST /console/signin", op.Page(op.Signin))
	m.Handle("POST /console/signout", op.SignedIn(op.Signout))
	m.Handle("GET /console/{$}", op.SignedIn(op.Accounts))
	m.Handle("POST /console/accounts", op.SignedIn(op.CreateAccount))
	m.Handle("GET /console/accounts/{id}", op.SignedIn(op.Account))
	m.Handle("POST /console/accounts/{id}/{action}", op.SignedIn(op.AccountAction))
	m.Handle("GET /console/service", op.SignedIn(op.Service))
	m.Handle("POST /console/service/audit", op.SignedIn(op.RunAudit))
	if pay != nil {
		m.Handle("GET /console/payments", op.SignedIn(op.Payments))
		m.Handle("POST /console/payments/{id}/recheck", op.SignedIn(op.Recheck))
	}

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
