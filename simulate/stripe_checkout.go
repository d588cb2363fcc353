package simulate

import (
	"context"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The hosted Checkout page: GET /c/pay/{id} shows the session, POST pays it.

var checkoutPage = template.Must(template.New("checkout").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{.Title}}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font-family:system-ui,sans-serif;background:#f6f9fc;color:#1a1f36;margin:0}
main{max-width:28rem;margin:3rem auto;background:#fff;padding:2rem;border-radius:8px;box-shadow:0 2px 8px #0002}
.test{background:#ffde92;color:#7a4a00;font-size:.8rem;padding:.2rem .5rem;border-radius:4px}
h1{font-size:1.9rem;margin:.6rem 0}
table{width:100%;border-collapse:collapse;margin:1rem 0}td{padding:.3rem 0}td.n{text-align:right}
label{display:block;font-size:.85rem;margin-top:.8rem}input{width:100%;box-sizing:border-box;padding:.5rem;font-size:1rem}
button{width:100%;padding:.7rem;margin-top:.8rem;font-size:1rem;border:0;border-radius:6px;cursor:pointer}
#pay{background:#635bff;color:#fff}#decline{background:#fde8e8;color:#9b1c1c}.later{background:#e8eefc;color:#1a3a8a}
#error{background:#fde8e8;color:#9b1c1c;padding:.6rem;border-radius:4px}
small{color:#697386}
</style></head><body><main>
<p><span class="test">TEST MODE</span> <small>Simulated Stripe Checkout</small></p>
{{if .Back}}<p><a id="cancel" href="{{.Back}}">&larr; Back</a></p>{{end}}
{{if .Message}}<p id="message">{{.Message}}</p>{{end}}
{{if .Open}}
<p>Pay</p><h1 id="amount">{{.Total}}</h1>
<table>{{range .Items}}<tr><td>{{.Description}}{{if gt .Quantity 1}} &times; {{.Quantity}}{{end}}</td><td class="n">{{.Amount}}</td></tr>{{end}}</table>
{{if .Error}}<p id="error" role="alert">{{.Error}}</p>{{end}}
<form method="post" action="/c/pay/{{.ID}}">
<label>Email <input name="email" type="email" value="{{.Email}}"></label>
<label>Card number <input id="card" name="card" value="4242 4242 4242 4242" autocomplete="off"></label>
<label>Expiry and CVC <input name="exp" value="12 / 34"></label>
{{if .SaveNotice}}<p><small>Your card will be saved for future payments to this business.</small></p>{{end}}
<button id="pay" name="action" value="pay">Pay {{.Total}}</button>
<button id="decline" name="action" value="decline">Decline (card 4000 0000 0000 0002)</button>
{{if .Async}}<button id="pay-later" class="later" name="action" value="async">Pay later (bank debit, settles after {{.AsyncDelay}})</button>
<button id="pay-later-fail" class="later" name="action" value="async_fail">Pay later, then fail</button>{{end}}
</form>
<p><small>Test cards: 4242 4242 4242 4242 pays; 4000 0000 0000 0002 declines (generic),
9995 insufficient funds, 0069 expired, 0127 incorrect CVC; 4000 0027 6000 3184 needs authentication
off-session; 4000 0000 0000 0259 is disputed after paying.</small></p>
{{end}}
</main></body></html>
`))

type checkoutView struct {
	Title, ID, Total, Email, Error, Message, Back, AsyncDelay string
	Open, Async, SaveNotice                                   bool
	Items                                                     []checkoutItem
}

type checkoutItem struct {
	Description, Amount string
	Quantity            int64
}

// formatAmount shows minor units as the page does: "$25.00", "12.50 EUR".
func formatAmount(cents int64, currency string) string {
	if currency == "usd" {
		return formatUSD(cents)
	}
	return fmt.Sprintf("%d.%02d %s", cents/100, cents%100, strings.ToUpper(currency))
}

// allowsAsync reports whether the session offers a delayed payment method:
// one listed in payment_method_types, or any when the list was not given
// (dynamic payment methods).
func (sess *stripeSession) allowsAsync() bool {
	if !sess.explicitPMTypes {
		return true
	}
	for _, t := range sess.PaymentMethodTypes {
		if slices.Contains(asyncMethodTypes, t) {
			return true
		}
	}
	return false
}

func (s *Stripe) sessionView(sess *stripeSession) checkoutView {
	v := checkoutView{Title: "Pay " + formatAmount(sess.AmountTotal, sess.Currency), ID: sess.ID,
		Total: formatAmount(sess.AmountTotal, sess.Currency), Open: sess.Status == "open",
		Async: sess.allowsAsync(), SaveNotice: sess.setupFutureUsage != "", Email: "payer@example.com",
		AsyncDelay: s.cfg.AsyncDelay.String()}
	if sess.CustomerEmail != nil {
		v.Email = *sess.CustomerEmail
	}
	if sess.CancelURL != nil && sess.Status == "open" {
		v.Back = *sess.CancelURL
	}
	for _, it := range sess.items {
		v.Items = append(v.Items, checkoutItem{Description: it.Description, Quantity: it.Quantity,
			Amount: formatAmount(it.AmountTotal, it.Currency)})
	}
	switch sess.Status {
	case "complete":
		v.Title, v.Message = "Payment complete", "This Checkout Session is complete: the payment has been made."
		if sess.PaymentStatus == "unpaid" {
			v.Message = "This Checkout Session is complete: the payment is processing."
		}
	case "expired":
		v.Title, v.Message = "Session expired", "This Checkout Session has expired. Return to the merchant to start again."
	}
	return v
}

func renderCheckout(w http.ResponseWriter, status int, v checkoutView) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	checkoutPage.Execute(w, v)
}

func (s *Stripe) serveCheckoutPage(w http.ResponseWriter, r *http.Request, id string) {
	if r.Method != http.MethodGet && r.Method != http.MethodPost {
		w.Header().Set("Allow", "GET, POST")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if r.Method == http.MethodPost {
		s.payOnPage(w, r, id)
		return
	}
	s.mu.Lock()
	sess := s.sessions[id]
	var v checkoutView
	if sess != nil {
		s.expireIfDue(sess)
		v = s.sessionView(sess)
	}
	s.mu.Unlock()
	if sess == nil {
		renderCheckout(w, http.StatusNotFound, checkoutView{Title: "Not found",
			Message: "Something went wrong: the page you were looking for could not be found."})
		return
	}
	renderCheckout(w, http.StatusOK, v)
}

// payOnPage is the customer pressing Pay, Decline or Pay later.
func (s *Stripe) payOnPage(w http.ResponseWriter, r *http.Request, id string) {
	r.ParseForm()
	action := r.PostForm.Get("action")
	card := lookupCard(r.PostForm.Get("card"))
	async := ""
	switch action {
	case "pay", "":
	case "decline":
		card = lookupCard("4000000000000002")
	case "async":
		async = "succeed"
	case "async_fail":
		async = "fail"
	default:
		http.Error(w, "unknown action", http.StatusBadRequest)
		return
	}
	email := strings.TrimSpace(r.PostForm.Get("email"))
	base := s.baseURL(r)

	b := &eventBatch{s: s} // a customer's action: no API request behind the events
	defer b.send()
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.sessions[id]
	if sess == nil {
		renderCheckout(w, http.StatusNotFound, checkoutView{Title: "Not found",
			Message: "Something went wrong: the page you were looking for could not be found."})
		return
	}
	s.expireIfDue(sess)
	if sess.Status != "open" {
		renderCheckout(w, http.StatusConflict, s.sessionView(sess))
		return
	}
	if async != "" && !sess.allowsAsync() {
		http.Error(w, "this session offers no delayed payment method", http.StatusBadRequest)
		return
	}
	customer, _ := sess.Customer.(string)
	if customer == "" && sess.CustomerCreation != nil && *sess.CustomerCreation == "always" {
		if sess.createdCustomer == "" {
			sess.createdCustomer = s.newCustomer(strp(email), nil, nil, b).ID
		}
		customer = sess.createdCustomer
	}
	var cust any
	if customer != "" {
		cust = customer
	}
	pi := s.intents[idOf(sess.PaymentIntent)]
	if pi == nil {
		var sfu *string
		if sess.setupFutureUsage != "" {
			sfu = strp(sess.setupFutureUsage)
		}
		pi = s.newIntent(sess.AmountTotal, sess.Currency, cust, clone(sess.intentMetadata), sfu)
		b.add("payment_intent.created", pi)
		sess.PaymentIntent = pi.ID
	}
	pi.Customer = cust
	pm := s.newMethod(card, async != "")
	pay := payment{intent: pi, method: pm, card: card, async: async}
	if err := s.attempt(pay, b, base); err != nil {
		v := s.sessionView(sess)
		v.Error = err.Message
		renderCheckout(w, http.StatusPaymentRequired, v)
		return
	}
	switch {
	case sess.setupFutureUsage != "" && customer != "":
		s.attach(pm, customer, b)
	case sess.setupFutureUsage == "":
		pm.used = true
	}
	sess.Status, sess.URL, sess.Customer = "complete", nil, cust
	sess.CustomerDetails = &stripeCustomerDetails{Email: strp(email)}
	sess.PaymentStatus = "paid"
	if async != "" {
		sess.PaymentStatus = "unpaid"
		s.goBackground(func(ctx context.Context) { s.settleAsync(ctx, sess.ID, async == "succeed", base) })
	}
	b.add("checkout.session.completed", sess)
	s.disputeIfTestCard(pay, b)
	if sess.SuccessURL == nil {
		renderCheckout(w, http.StatusOK, s.sessionView(sess))
		return
	}
	http.Redirect(w, r, strings.ReplaceAll(*sess.SuccessURL, "{CHECKOUT_SESSION_ID}", sess.ID), http.StatusSeeOther)
}

// settleAsync settles a delayed payment AsyncDelay after the session
// completed, succeeding or failing.
func (s *Stripe) settleAsync(ctx context.Context, sessionID string, succeed bool, base string) {
	if !sleep(ctx, s.cfg.AsyncDelay) {
		return
	}
	b := &eventBatch{s: s}
	defer b.send()
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.sessions[sessionID]
	pi := s.intents[idOf(sess.PaymentIntent)]
	ch := s.charges[idOf(pi.LatestCharge)]
	if succeed {
		s.succeed(pi, ch, base, b)
		sess.PaymentStatus = "paid"
		b.add("checkout.session.async_payment_succeeded", sess)
		return
	}
	e := &stripeError{Type: "card_error", Code: "payment_method_provider_decline",
		DocURL: docURL("payment_method_provider_decline"), Charge: ch.ID,
		Message: "The customer's bank account could not be debited (simulated: Pay later, then fail)."}
	ch.Status, ch.FailureCode, ch.FailureMessage = "failed", strp("debit_not_authorized"), strp(e.Message)
	pi.Status, pi.LastPaymentError = "requires_payment_method", e
	b.add("charge.failed", ch)
	b.add("payment_intent.payment_failed", pi)
	b.add("checkout.session.async_payment_failed", sess)
}

func idOf(v any) string { s, _ := v.(string); return s }

func clone(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

var receiptPage = template.Must(template.New("receipt").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Receipt</title></head>
<body style="font-family:system-ui,sans-serif;max-width:28rem;margin:3rem auto">
<p><small>TEST MODE · Simulated Stripe</small></p>
<h1>Receipt</h1>
<p>Amount paid <strong id="amount">{{.Amount}}</strong></p>
{{if .Refunded}}<p>Refunded <strong id="refunded">{{.Refunded}}</strong></p>{{end}}
<p>Date paid {{.Date}}</p><p>Payment method {{.Method}}</p><p>Charge {{.ID}}</p>
</body></html>
`))

func (s *Stripe) serveReceipt(w http.ResponseWriter, r *http.Request, id string) {
	s.mu.Lock()
	ch := s.charges[id]
	var v struct{ ID, Amount, Refunded, Date, Method string }
	if ch != nil {
		v.ID, v.Amount = ch.ID, formatAmount(ch.Amount, ch.Currency)
		if ch.AmountRefunded > 0 {
			v.Refunded = formatAmount(ch.AmountRefunded, ch.Currency)
		}
		v.Date = time.Unix(ch.Created, 0).UTC().Format("January 2, 2006")
		v.Method = ch.PaymentMethodDetails.Type
		if c := ch.PaymentMethodDetails.Card; c != nil {
			v.Method = c.Brand + " •••• " + c.Last4
		}
	}
	paid := ch != nil && ch.Paid
	s.mu.Unlock()
	if !paid {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	receiptPage.Execute(w, v)
}

// Dispute opens a dispute on a charge ("ch_...") or on a PaymentIntent's
// charge ("pi_..."), for amount (0: the whole charge), with reason (empty:
// "fraudulent"), sending charge.dispute.created. It returns the dispute id.
func (s *Stripe) Dispute(chargeOrIntent string, amount int64, reason string) (string, error) {
	if reason == "" {
		reason = "fraudulent"
	}
	b := &eventBatch{s: s}
	defer b.send()
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := s.charges[chargeOrIntent]
	if pi := s.intents[chargeOrIntent]; pi != nil {
		ch = s.charges[idOf(pi.LatestCharge)]
	}
	if ch == nil || ch.Status != "succeeded" {
		return "", fmt.Errorf("simulate: no successful charge %q to dispute", chargeOrIntent)
	}
	if ch.Disputed {
		return "", fmt.Errorf("simulate: charge %s is already disputed", ch.ID)
	}
	if amount == 0 {
		amount = ch.Amount
	}
	if amount < 0 || amount > ch.Amount {
		return "", fmt.Errorf("simulate: dispute amount %d outside 1..%d", amount, ch.Amount)
	}
	return s.openDispute(ch, amount, reason, b).ID, nil
}

// CloseDispute closes a dispute won or lost, sending charge.dispute.closed.
func (s *Stripe) CloseDispute(id string, won bool) error {
	b := &eventBatch{s: s}
	defer b.send()
	s.mu.Lock()
	defer s.mu.Unlock()
	dp := s.disputes[id]
	if dp == nil {
		return fmt.Errorf("simulate: no such dispute %q", id)
	}
	if dp.Status == "won" || dp.Status == "lost" {
		return fmt.Errorf("simulate: dispute %s is already closed (%s)", id, dp.Status)
	}
	s.closeDispute(dp, won, b)
	return nil
}

// serveSim answers the operator's endpoints (no API key needed):
//
//	POST /_sim/disputes               charge= or payment_intent=, amount=, reason=
//	POST /_sim/disputes/{id}/close    status=won|lost
//	POST /_sim/events/{id}/resend
//	POST /_sim/decline_next           decline_code= (default generic_decline)
func (s *Stripe) serveSim(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		simError(w, http.StatusMethodNotAllowed, "use POST")
		return
	}
	r.ParseForm()
	parts := strings.Split(strings.Trim(strings.TrimPrefix(r.URL.Path, "/_sim/"), "/"), "/")
	switch {
	case len(parts) == 1 && parts[0] == "disputes":
		target := r.Form.Get("charge")
		if target == "" {
			target = r.Form.Get("payment_intent")
		}
		var amount int64
		if a := r.Form.Get("amount"); a != "" {
			var err error
			if amount, err = strconv.ParseInt(a, 10, 64); err != nil {
				simError(w, http.StatusBadRequest, "amount: an integer in cents")
				return
			}
		}
		id, err := s.Dispute(target, amount, r.Form.Get("reason"))
		if err != nil {
			simError(w, http.StatusBadRequest, err.Error())
			return
		}
		s.writeObject(w, id)
	case len(parts) == 3 && parts[0] == "disputes" && parts[2] == "close":
		st := r.Form.Get("status")
		if st != "won" && st != "lost" {
			simError(w, http.StatusBadRequest, "status: won or lost")
			return
		}
		if err := s.CloseDispute(parts[1], st == "won"); err != nil {
			simError(w, http.StatusBadRequest, err.Error())
			return
		}
		s.writeObject(w, parts[1])
	case len(parts) == 3 && parts[0] == "events" && parts[2] == "resend":
		if err := s.ResendEvent(parts[1]); err != nil {
			simError(w, http.StatusNotFound, err.Error())
			return
		}
		writeStripeJSON(w, http.StatusOK, map[string]string{"resent": parts[1]})
	case len(parts) == 1 && parts[0] == "decline_next":
		code := r.Form.Get("decline_code")
		if code == "" {
			code = "generic_decline"
		}
		s.DeclineNext(code)
		writeStripeJSON(w, http.StatusOK, map[string]string{"decline_next": code})
	default:
		simError(w, http.StatusNotFound, "unknown simulator endpoint "+r.URL.Path)
	}
}

func (s *Stripe) writeObject(w http.ResponseWriter, id string) {
	s.mu.Lock()
	m, err := toMap(s.objectByID(id))
	s.mu.Unlock()
	if err != nil {
		panic(err)
	}
	writeStripeJSON(w, http.StatusOK, m)
}
