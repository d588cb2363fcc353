package console

import "net/http"

// operatorRoutes serves the operator's pages on the paths
// cmd/tollgate/routes.go declares for them on the admin listener (its
// TestRoutes checks that this list and that one agree).
func operatorRoutes(op *Operator) http.Handler {
	m := http.NewServeMux()
	m.Handle("/console/", op.Page(op.NotFound))
	m.Handle("GET /favicon.ico", op.Page(Favicon))
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
	if op.o.Payments != nil {
		m.Handle("GET /console/payments", op.SignedIn(op.Payments))
		m.Handle("POST /console/payments/{id}/recheck", op.SignedIn(op.Recheck))
	}
	return m
}
