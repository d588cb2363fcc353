package admin

import "net/http"

// routes serves the admin API's endpoints on the paths
// cmd/tollgate/routes.go declares for them on the admin listener (its
// TestRoutes checks that this list and that one agree).
func routes(a *API) http.Handler {
	m := http.NewServeMux()
	m.Handle("/admin/v1/", a.Authorized(a.NotFound))
	m.Handle("GET /admin/v1/accounts", a.Authorized(a.ListAccounts))
	m.Handle("POST /admin/v1/accounts", a.Authorized(a.CreateAccount))
	m.Handle("GET /admin/v1/accounts/{id}", a.Authorized(a.ShowAccount))
	m.Handle("POST /admin/v1/accounts/{id}/disable", a.Authorized(a.Disable))
	m.Handle("POST /admin/v1/accounts/{id}/enable", a.Authorized(a.Enable))
	m.Handle("POST /admin/v1/accounts/{id}/invite", a.Authorized(a.Invite))
	m.Handle("POST /admin/v1/accounts/{id}/credit", a.Authorized(a.Credit))
	m.Handle("POST /admin/v1/accounts/{id}/debit", a.Authorized(a.Debit))
	m.Handle("GET /admin/v1/keys", a.Authorized(a.ListKeys))
	m.Handle("POST /admin/v1/keys", a.Authorized(a.CreateKey))
	m.Handle("POST /admin/v1/keys/{id}/revoke", a.Authorized(a.RevokeKey))
	m.Handle("GET /admin/v1/usage", a.Authorized(a.Usage))
	m.Handle("GET /admin/v1/audit", a.Authorized(a.Audit))
	m.Handle("GET /admin/v1/payments", a.Authorized(a.ListPayments))
	m.Handle("GET /admin/v1/payments/{id}", a.Authorized(a.ShowPayment))
	m.Handle("POST /admin/v1/payments/{id}/recheck", a.Authorized(a.Recheck))
	m.Handle("GET /admin/v1/payment-events", a.Authorized(a.PaymentEvents))
	m.Handle("GET /admin/v1/owed", a.Authorized(a.Owed))
	m.Handle("POST /admin/v1/accounts/{id}/collect-owed", a.Authorized(a.CollectOwed))
	return m
}
