package console

import "net/http"

// routes serves the console's pages on the paths cmd/tollgate/routes.go
// declares for them on the api listener (its TestRoutes checks that this
// list and that one agree).
func routes(c *Console) http.Handler {
	m := http.NewServeMux()
	m.Handle("/console/", c.Page(c.NotFound))
	m.Handle("GET /favicon.ico", c.Page(Favicon))
	m.Handle("GET /console/static/", c.Page(c.Static))
	m.Handle("GET /console/signin", c.Page(c.SigninForm))
	m.Handle("POST /console/signin", c.Page(c.Signin))
	m.Handle("POST /console/signout", c.Page(c.Signout))
	m.Handle("GET /console/invite", c.Page(c.InviteForm))
	m.Handle("POST /console/invite", c.Page(c.AcceptInvite))
	m.Handle("GET /console/{$}", c.SignedIn(c.Overview))
	m.Handle("GET /console/keys", c.SignedIn(c.Keys))
	m.Handle("POST /console/keys", c.SignedIn(c.CreateKey))
	m.Handle("POST /console/keys/{id}/revoke", c.SignedIn(c.RevokeKey))
	m.Handle("GET /console/activity", c.SignedInHeld(c.Activity))
	m.Handle("GET /console/activity.csv", c.SignedInHeld(c.ActivityCSV))
	m.Handle("GET /console/playground", c.SignedIn(c.Playground))
	m.Handle("POST /console/playground/key", c.SignedIn(c.PlaygroundKey))
	if c.o.Payments != nil {
		m.Handle("GET /console/payments", c.SignedInHeld(c.Payments))
		m.Handle("POST /console/payments", c.SignedInHeld(c.Checkout))
		m.Handle("GET /console/payments.csv", c.SignedInHeld(c.PaymentsCSV))
		m.Handle("POST /console/payments/auto-topup", c.SignedIn(c.SetAutoTopUp))
	}
	return m
}
