package main

import (
	"net/http"
	"strings"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/console"
	"github.com/tollgate/tollgate/metrics"
	"github.com/tollgate/tollgate/payments"
)

// autoTopUpInterval is how often each instance looks for accounts whose
// free balance fell below their auto top-up threshold.
const autoTopUpInterval = 10 * time.Second

// The metrics observe the payments.
var _ payments.Observer = (*metrics.Metrics)(nil)

// openPayments builds the payment service when config payments: names a
// provider, and mounts its webhook on the listeners that serve /pricing.
func (m *Main) openPayments() error {
	pc := &m.Config.Payments
	if !pc.Enabled() {
		return nil
	}
	p := m.PaymentsProvider
	if p == nil {
		var err error
		if p, err = payments.NewStripe(payments.StripeOptions{SecretKey: pc.SecretKey, WebhookSecret: pc.WebhookSecret, APIURL: pc.APIURL}); err != nil {
			return err
		}
	}
	base := strings.TrimRight(pc.ConsoleURL, "/")
	o := payments.Options{Min: pc.Min, Max: pc.Max, FeePercent: pc.Fee.Percent, FeeFixed: pc.Fee.Fixed, AutoTopUp: pc.AutoTopUp,
		SuccessURL: base + "/payments?payment={PAYMENT_ID}", CancelURL: base + "/payments?payment={PAYMENT_ID}&canceled=1",
		Log: m.Log}
	if m.Metrics != nil {
		o.Observer = m.Metrics
	}
	m.Payments = payments.New(p, m.Store, o)
	m.Server.Webhooks = map[string]func(http.ResponseWriter, *http.Request) error{payments.WebhookPath: m.Payments.ServeWebhook}
	return nil
}

// paymentsView is the payment service with its store: what the admin
// API's and the console's payment routes use.
type paymentsView struct {
	*payments.Service
	tollgate.PaymentStore
}

// paymentsAdmin is what the admin API's payment routes use (nil: payments off).
func (m *Main) paymentsAdmin() admin.Payments {
	if m.Payments == nil {
		return nil
	}
	return paymentsView{m.Payments, m.Store}
}

// paymentsConsole is what the console's payment pages use (nil: payments off).
func (m *Main) paymentsConsole() console.Payments {
	if m.Payments == nil {
		return nil
	}
	return paymentsView{m.Payments, m.Store}
}
