package simulate

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// The parameters each endpoint has (stripe-go v82's form tags): any other
// is refused with parameter_unknown, as Stripe does. Those the simulator
// does not model are accepted and ignored.
var (
	sessionParams = []string{"adaptive_pricing", "after_expiration", "allow_promotion_codes", "automatic_tax",
		"billing_address_collection", "cancel_url", "client_reference_id", "collected_information",
		"consent_collection", "currency", "customer", "customer_creation", "customer_email", "customer_update",
		"custom_fields", "custom_text", "discounts", "expand", "expires_at", "invoice_creation", "line_items",
		"locale", "metadata", "mode", "optional_items", "origin_context", "payment_intent_data",
		"payment_method_collection", "payment_method_configuration", "payment_method_data",
		"payment_method_options", "payment_method_types", "permissions", "phone_number_collection",
		"redirect_on_completion", "return_url", "saved_payment_method_options", "setup_intent_data",
		"shipping_address_collection", "shipping_options", "submit_type", "subscription_data", "success_url",
		"tax_id_collection", "ui_mode", "wallet_options"}
	intentParams = []string{"amount", "application_fee_amount", "automatic_payment_methods", "capture_method",
		"confirm", "confirmation_method", "confirmation_token", "currency", "customer", "description",
		"error_on_requires_action", "excluded_payment_method_types", "expand", "mandate", "mandate_data",
		"metadata", "off_session", "on_behalf_of", "payment_method", "payment_method_configuration",
		"payment_method_data", "payment_method_options", "payment_method_types", "radar_options",
		"receipt_email", "return_url", "setup_future_usage", "shipping", "statement_descriptor",
		"statement_descriptor_suffix", "transfer_data", "transfer_group", "use_stripe_sdk"}
	refundParams = []string{"amount", "charge", "currency", "customer", "expand", "instructions_email",
		"metadata", "origin", "payment_intent", "reason", "refund_application_fee", "reverse_transfer"}
	customerParams = []string{"address", "balance", "cash_balance", "description", "email", "expand",
		"invoice_prefix", "invoice_settings", "metadata", "name", "next_invoice_sequence", "payment_method",
		"phone", "preferred_locales", "shipping", "source", "tax", "tax_exempt", "tax_id_data", "test_clock",
		"validate"}
)

// asyncMethodTypes are payment methods that settle days later; a session
// that allows one offers "Pay later" on its Checkout page.
var asyncMethodTypes = []string{"us_bank_account", "sepa_debit", "bacs_debit", "au_becs_debit", "acss_debit"}

// Amount bounds for usd, Stripe's: at least 50 cents, at most $999,999.99.
const (
	minAmountUSD = 50
	maxAmount    = 99999999
)

func formatUSD(cents int64) string { return fmt.Sprintf("$%d.%02d", cents/100, cents%100) }

// The API handlers below run with s.mu held (route takes it).

// createSession answers POST /v1/checkout/sessions.
func (s *Stripe) createSession(c *apiCall) apiResult {
	f := c.form
	md, e := f.start(sessionParams)
	if e != nil {
		return fail(e)
	}
	mode := f.str("mode")
	switch mode {
	case "":
		return fail(missingParam("mode"))
	case "payment":
	case "setup", "subscription":
		return fail(invalidRequest("", "mode", "The simulated Stripe imitates Checkout in payment mode only (mode=%s is not simulated).", mode))
	default:
		return fail(invalidRequest("", "mode", "Invalid mode: must be one of payment, setup, or subscription"))
	}
	if ui := f.str("ui_mode"); ui != "" && ui != "hosted" {
		return fail(invalidRequest("", "ui_mode", "The simulated Stripe imitates hosted Checkout only (ui_mode=%s is not simulated).", ui))
	}
	for _, p := range []string{"success_url", "cancel_url"} {
		if f.has(p) && !validURL(f.str(p)) {
			return fail(invalidRequest("url_invalid", p, "Not a valid URL"))
		}
	}
	if len(f.str("client_reference_id")) > 200 {
		return fail(invalidRequest("", "client_reference_id", "Invalid string: %s...; must be at most 200 characters", f.str("client_reference_id")[:20]))
	}
	customer := f.str("customer")
	if customer != "" && f.has("customer_creation") {
		return fail(invalidRequest("parameters_exclusive", "customer_creation", "You may only specify one of these parameters: customer, customer_creation."))
	}
	if customer != "" && f.has("customer_email") {
		return fail(invalidRequest("parameters_exclusive", "customer_email", "You may only specify one of these parameters: customer, customer_email."))
	}
	creation := f.strPtr("customer_creation")
	if creation != nil && *creation != "always" && *creation != "if_required" {
		return fail(invalidRequest("", "customer_creation", "Invalid customer_creation: must be one of always or if_required"))
	}
	if creation == nil && customer == "" {
		creation = strp("if_required")
	}
	sfu := f.str("payment_intent_data[setup_future_usage]")
	if sfu != "" && sfu != "on_session" && sfu != "off_session" {
		return fail(invalidRequest("", "payment_intent_data[setup_future_usage]", "Invalid payment_intent_data[setup_future_usage]: must be one of on_session or off_session"))
	}
	piMD, e := f.metadata("payment_intent_data[metadata]")
	if e != nil {
		return fail(e)
	}
	items, currency, total, e := sessionLineItems(f)
	if e != nil {
		return fail(e)
	}
	if currency == "usd" && total < minAmountUSD {
		return fail(invalidRequest("", "", "The Checkout Session's total amount due must add up to at least $0.50 usd"))
	}
	if total > maxAmount {
		return fail(invalidRequest("amount_too_large", "", "The Checkout Session's total amount due must be no more than $999,999.99 usd"))
	}
	now := time.Now()
	expires := now.Add(s.cfg.SessionLifetime)
	if v, present, e := f.int("expires_at"); e != nil {
		return fail(e)
	} else if present {
		if v < now.Add(30*time.Minute).Unix()-5 || v > now.Add(24*time.Hour).Unix() {
			return fail(invalidRequest("", "expires_at", "The `expires_at` timestamp must be between 30 minutes and 24 hours from Checkout Session creation."))
		}
		expires = time.Unix(v, 0)
	}
	pmTypes := f.list("payment_method_types")
	explicitTypes := len(pmTypes) > 0
	if !explicitTypes {
		pmTypes = []string{"card"}
	}

	cust, e := s.customerRef(customer)
	if e != nil {
		return fail(e)
	}
	id := newID("cs_test")
	sess := &stripeSession{
		ID: id, Object: "checkout.session",
		AmountSubtotal: total, AmountTotal: total,
		CancelURL: f.strPtr("cancel_url"), ClientReferenceID: f.strPtr("client_reference_id"),
		Created: now.Unix(), Currency: currency, Customer: cust, CustomerCreation: creation,
		CustomerEmail: f.strPtr("customer_email"), ExpiresAt: expires.Unix(), Metadata: md, Mode: mode,
		PaymentMethodTypes: pmTypes, PaymentStatus: "unpaid", Status: "open",
		SuccessURL: f.strPtr("success_url"), UIMode: "hosted", URL: strp(c.base + "/c/pay/" + id),
		items: items, setupFutureUsage: sfu, intentMetadata: piMD, explicitPMTypes: explicitTypes,
		expiresAt: expires,
	}
	s.sessions[id] = sess
	// Stripe expires an unpaid session on its own at expires_at.
	s.goBackground(func(ctx context.Context) {
		if sleep(ctx, time.Until(expires)) {
			s.mu.Lock()
			s.expireIfDue(sess)
			s.mu.Unlock()
		}
	})
	return s.expanded(sess, f.list("expand"))
}

// sessionLineItems reads line_items[i][price_data][...] and [quantity].
func sessionLineItems(f stripeForm) (items []stripeLineItem, currency string, total int64, _ *stripeError) {
	for i := 0; ; i++ {
		p := "line_items[" + strconv.Itoa(i) + "]"
		if !f.hasPrefix(p + "[") {
			break
		}
		if f.has(p + "[price]") {
			return nil, "", 0, noSuch("price", p+"[price]", f.str(p+"[price]"))
		}
		pd := p + "[price_data]"
		if !f.hasPrefix(pd + "[") {
			return nil, "", 0, invalidRequest("parameter_missing", p, "You must specify either `price` or `price_data` for each line item.")
		}
		cur := strings.ToLower(f.str(pd + "[currency]"))
		if cur == "" {
			return nil, "", 0, missingParam(pd + "[currency]")
		}
		name := f.str(pd + "[product_data][name]")
		if name == "" && !f.has(pd+"[product]") {
			return nil, "", 0, missingParam(pd + "[product_data][name]")
		}
		if f.has(pd + "[product]") {
			return nil, "", 0, noSuch("product", pd+"[product]", f.str(pd+"[product]"))
		}
		unit, e := f.requiredInt(pd+"[unit_amount]", 0)
		if e != nil {
			return nil, "", 0, e
		}
		qty, e := f.requiredInt(p+"[quantity]", 1)
		if e != nil {
			return nil, "", 0, e
		}
		if currency != "" && cur != currency {
			return nil, "", 0, invalidRequest("", pd+"[currency]", "All line items must have the same currency (%s and %s given).", currency, cur)
		}
		currency = cur
		amount := unit * qty
		total += amount
		items = append(items, stripeLineItem{
			ID: newID("li"), Object: "item", AmountSubtotal: amount, AmountTotal: amount, Currency: cur,
			Description: name, Quantity: qty,
			Price: stripePrice{ID: newID("price"), Object: "price", Active: false, Currency: cur,
				Product: newID("prod"), Type: "one_time", UnitAmount: unit},
		})
	}
	if len(items) == 0 {
		return nil, "", 0, invalidRequest("parameter_missing", "line_items", "line_items is required in payment mode.")
	}
	return items, currency, total, nil
}

func validURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

// expireSession answers POST /v1/checkout/sessions/{id}/expire.
func (s *Stripe) expireSession(c *apiCall, id string) apiResult {
	b := s.batch(c)
	defer b.send()
	sess := s.sessions[id]
	if sess == nil {
		return fail(noSuch("checkout.session", "session", id))
	}
	s.expireIfDue(sess)
	if sess.Status != "open" {
		return fail(invalidRequest("", "", "Only Checkout Sessions with a status in [\"open\"] can be expired. This Checkout Session has a status of \"%s\".", sess.Status))
	}
	s.expire(sess, b)
	return s.expanded(sess, c.form.list("expand"))
}

// expireIfDue expires an open session past its expires_at: at that moment
// (a timer), or when it is looked at first. Called with s.mu held.
func (s *Stripe) expireIfDue(sess *stripeSession) {
	if sess.Status == "open" && !time.Now().Before(sess.expiresAt) {
		b := &eventBatch{s: s}
		s.expire(sess, b)
		b.send()
	}
}

func (s *Stripe) expire(sess *stripeSession, b *eventBatch) {
	sess.Status, sess.URL = "expired", nil
	b.add("checkout.session.expired", sess)
}

// payment is one payment attempt: on the Checkout page or a confirmed
// PaymentIntent.
type payment struct {
	intent     *stripeIntent
	method     *stripeMethod
	card       testCard
	offSession bool
	// async: "" a card, "succeed" or "fail" a bank debit that settles after
	// AsyncDelay.
	async string
}

// attempt charges p.method for p.intent, records the charge and its
// events, and returns the decline when there is one. Called with s.mu held.
func (s *Stripe) attempt(p payment, b *eventBatch, base string) *stripeError {
	pi := p.intent
	now := time.Now().Unix()
	ch := &stripeCharge{
		ID: newID("ch"), Object: "charge", Amount: pi.Amount, Created: now, Currency: pi.Currency,
		Customer: pi.Customer, Metadata: pi.Metadata, PaymentIntent: pi.ID, PaymentMethod: p.method.ID,
		Outcome: stripeOutcome{NetworkStatus: "approved_by_network",
			SellerMessage: "Payment complete.", Type: "authorized"},
		PaymentMethodDetails: stripePaymentMethodDetails{Type: p.method.Type, Card: p.method.Card},
	}
	if p.method.Type == "us_bank_account" {
		ch.PaymentMethodDetails.USBankAccount = map[string]any{"account_holder_type": "individual",
			"account_type": "checking", "bank_name": "STRIPE TEST BANK", "last4": "6789", "routing_number": "110000000"}
	}
	s.charges[ch.ID] = ch
	pi.LatestCharge = ch.ID
	pi.PaymentMethod = p.method.ID

	decline := ""
	if p.async == "" {
		decline = s.nextDecline(p.card, p.offSession)
	}
	if decline != "" {
		e := declineError(decline)
		ch.Status, ch.FailureCode, ch.FailureMessage = "failed", strp(e.Code), strp(e.Message)
		ch.Outcome = stripeOutcome{NetworkStatus: "declined_by_network", Reason: strp(decline),
			SellerMessage: "The bank did not return any further details with this decline.", Type: "issuer_declined"}
		last := *e
		last.PaymentMethod = p.method
		last.Charge = ch.ID
		pi.LastPaymentError = &last
		pi.Status = "requires_payment_method"
		b.add("charge.failed", ch)
		b.add("payment_intent.payment_failed", pi)
		e.Charge, e.PaymentMethod = ch.ID, p.method
		e.RequestLogURL = "https://dashboard.stripe.com/test/logs/" + b.requestIDOr("req_page")
		return e
	}
	if p.async != "" {
		ch.Status, ch.Outcome.SellerMessage = "pending", "Payment pending."
		pi.Status = "processing"
		b.add("payment_intent.processing", pi)
		b.add("charge.pending", ch)
		return nil
	}
	s.succeed(pi, ch, base, b)
	return nil
}

// disputeIfTestCard opens the dispute the dispute test card brings once
// its payment is done (its other events sent first). Called with s.mu held.
func (s *Stripe) disputeIfTestCard(p payment, b *eventBatch) {
	if ch := s.charges[idOf(p.intent.LatestCharge)]; p.card.dispute && ch != nil && ch.Status == "succeeded" {
		s.openDispute(ch, ch.Amount, "fraudulent", b)
	}
}

// succeed marks a charge and its PaymentIntent paid. Called with s.mu held.
func (s *Stripe) succeed(pi *stripeIntent, ch *stripeCharge, base string, b *eventBatch) {
	ch.Status, ch.Paid, ch.Captured, ch.AmountCaptured = "succeeded", true, true, ch.Amount
	ch.BalanceTransaction = strp(newID("txn"))
	ch.ReceiptURL = strp(base + "/receipts/payment/" + ch.ID)
	ch.Outcome.SellerMessage = "Payment complete."
	pi.Status, pi.AmountReceived, pi.LastPaymentError = "succeeded", pi.Amount, nil
	b.add("charge.succeeded", ch)
	b.add("payment_intent.succeeded", pi)
}

// newMethod makes a PaymentMethod for a card (or a test bank account when
// bank is set). Called with s.mu held.
func (s *Stripe) newMethod(c testCard, bank bool) *stripeMethod {
	s.methodSeq++
	pm := &stripeMethod{ID: newID("pm"), Object: "payment_method", Created: time.Now().Unix(),
		Metadata: map[string]string{}, Type: "card", number: c.number, seq: s.methodSeq}
	if bank {
		pm.Type = "us_bank_account"
	} else {
		pm.Card = cardDetails(c)
	}
	s.methods[pm.ID] = pm
	return pm
}

// attach attaches a PaymentMethod to a customer. Called with s.mu held.
func (s *Stripe) attach(pm *stripeMethod, customer string, b *eventBatch) {
	if pm.Customer != nil && *pm.Customer == customer {
		return
	}
	pm.Customer = strp(customer)
	b.add("payment_method.attached", pm)
}

func (s *Stripe) newCustomer(email, name *string, md map[string]string, b *eventBatch) *stripeCustomer {
	if md == nil {
		md = map[string]string{}
	}
	cu := &stripeCustomer{ID: newID("cus"), Object: "customer", Created: time.Now().Unix(), Email: email, Name: name,
		Metadata: md, InvoiceSettings: map[string]any{"custom_fields": nil, "default_payment_method": nil, "footer": nil}}
	s.customers[cu.ID] = cu
	b.add("customer.created", cu)
	return cu
}

// createCustomer answers POST /v1/customers.
func (s *Stripe) createCustomer(c *apiCall) apiResult {
	f := c.form
	md, e := f.start(customerParams)
	if e != nil {
		return fail(e)
	}
	b := s.batch(c)
	defer b.send()
	cu := s.newCustomer(f.strPtr("email"), f.strPtr("name"), md, b)
	cu.Description = f.strPtr("description")
	return s.expanded(cu, f.list("expand"))
}

// createIntent answers POST /v1/payment_intents, confirming the payment
// at once with confirm=true.
func (s *Stripe) createIntent(c *apiCall) apiResult {
	f := c.form
	md, e := f.start(intentParams)
	if e != nil {
		return fail(e)
	}
	amount, e := f.requiredInt("amount", 1)
	if e != nil {
		return fail(e)
	}
	currency := strings.ToLower(f.str("currency"))
	if currency == "" {
		return fail(missingParam("currency"))
	}
	if currency == "usd" && amount < minAmountUSD {
		return fail(invalidRequest("amount_too_small", "amount", "Amount must be at least $0.50 usd"))
	}
	if amount > maxAmount {
		return fail(invalidRequest("amount_too_large", "amount", "Amount must be no more than $999,999.99"))
	}
	confirm, e := f.bool("confirm")
	if e != nil {
		return fail(e)
	}
	offSession := false
	switch f.str("off_session") {
	case "", "false":
	case "true", "one_off", "recurring":
		offSession = true
	default:
		return fail(invalidRequest("", "off_session", "Invalid off_session: must be a boolean, one_off or recurring"))
	}
	if offSession && !confirm {
		return fail(invalidRequest("", "off_session", "You can only pass `off_session` when `confirm` is set to `true`."))
	}
	sfu := f.strPtr("setup_future_usage")
	if sfu != nil && *sfu != "on_session" && *sfu != "off_session" {
		return fail(invalidRequest("", "setup_future_usage", "Invalid setup_future_usage: must be one of on_session or off_session"))
	}
	if sfu != nil && *sfu == "on_session" && offSession {
		return fail(invalidRequest("", "setup_future_usage", "You cannot pass `setup_future_usage=on_session` with `off_session=true`."))
	}
	customer := f.str("customer")
	pmID := f.str("payment_method")

	b := s.batch(c)
	defer b.send()
	cust, e := s.customerRef(customer)
	if e != nil {
		return fail(e)
	}
	var pm *stripeMethod
	if pmID != "" {
		if number, magic := testPaymentMethods[pmID]; magic {
			pm = s.newMethod(lookupCard(number), false)
			if customer != "" {
				pm.Customer = strp(customer)
			}
		} else if pm = s.methods[pmID]; pm == nil {
			return fail(noSuch("PaymentMethod", "payment_method", pmID))
		}
		if pm.Customer != nil && customer != "" && *pm.Customer != customer {
			return fail(invalidRequest("", "payment_method", "The provided PaymentMethod belongs to a different Customer (%s), not to %s.", *pm.Customer, customer))
		}
		if pm.Customer != nil && customer == "" {
			return fail(invalidRequest("", "payment_method", "The provided PaymentMethod is attached to a Customer (%s); pass that Customer in `customer` to use it.", *pm.Customer))
		}
		if pm.used && pm.Customer == nil {
			return fail(invalidRequest("", "payment_method", "The provided PaymentMethod was previously used with a PaymentIntent without Customer attachment, shared with a connected account without Customer attachment, or was detached from a Customer. It may not be used again. To use a PaymentMethod multiple times, you must attach it to a Customer first."))
		}
	}
	if confirm && pm == nil {
		return fail(invalidRequest("payment_intent_unexpected_state", "", "You cannot confirm this PaymentIntent because it's missing a payment method. You can either update the PaymentIntent with a payment method and then confirm it again, or confirm it again directly with a payment method or ConfirmationToken."))
	}
	pi := s.newIntent(amount, currency, cust, md, sfu)
	pi.Description = f.strPtr("description")
	if types := f.list("payment_method_types"); len(types) > 0 {
		pi.PaymentMethodTypes = types
	}
	if pm != nil {
		pi.PaymentMethod = pm.ID
		pi.Status = "requires_confirmation"
	}
	b.add("payment_intent.created", pi)
	if !confirm {
		return s.expanded(pi, f.list("expand"))
	}
	pay := payment{intent: pi, method: pm, card: lookupCard(pm.number), offSession: offSession}
	if err := s.attempt(pay, b, c.base); err != nil {
		err.PaymentIntent = pi
		return fail(err)
	}
	if pm.Customer == nil {
		if sfu != nil && customer != "" {
			s.attach(pm, customer, b)
		} else {
			pm.used = true
		}
	}
	s.disputeIfTestCard(pay, b)
	return s.expanded(pi, f.list("expand"))
}

// customerRef is the customer field of a new object: nil for none, the id
// of a known customer, or an error for an unknown one. Called with s.mu held.
func (s *Stripe) customerRef(id string) (any, *stripeError) {
	if id == "" {
		return nil, nil
	}
	if s.customers[id] == nil {
		return nil, noSuch("customer", "customer", id)
	}
	return id, nil
}

// newIntent makes a PaymentIntent awaiting a payment method. Called with
// s.mu held.
func (s *Stripe) newIntent(amount int64, currency string, cust any, md map[string]string, sfu *string) *stripeIntent {
	id := newID("pi")
	if md == nil {
		md = map[string]string{}
	}
	pi := &stripeIntent{ID: id, Object: "payment_intent", Amount: amount, CaptureMethod: "automatic_async",
		ClientSecret: id + "_secret_" + randomToken(25), ConfirmationMethod: "automatic", Created: time.Now().Unix(),
		Currency: currency, Customer: cust, Metadata: md, PaymentMethodTypes: []string{"card"},
		SetupFutureUsage: sfu, Status: "requires_payment_method"}
	s.intents[id] = pi
	return pi
}

// createRefund answers POST /v1/refunds.
func (s *Stripe) createRefund(c *apiCall) apiResult {
	f := c.form
	md, e := f.start(refundParams)
	if e != nil {
		return fail(e)
	}
	amount, hasAmount, e := f.int("amount")
	if e != nil {
		return fail(e)
	}
	if hasAmount && amount < 1 {
		return fail(invalidRequest("", "amount", "This value must be greater than or equal to 1."))
	}
	reason := f.strPtr("reason")
	if reason != nil && *reason != "duplicate" && *reason != "fraudulent" && *reason != "requested_by_customer" {
		return fail(invalidRequest("", "reason", "Invalid reason: must be one of duplicate, fraudulent, or requested_by_customer"))
	}
	b := s.batch(c)
	defer b.send()
	var ch *stripeCharge
	switch chID, piID := f.str("charge"), f.str("payment_intent"); {
	case chID != "" && piID != "":
		return fail(invalidRequest("parameters_exclusive", "payment_intent", "You may only specify one of these parameters: charge, payment_intent."))
	case chID != "":
		if ch = s.charges[chID]; ch == nil {
			return fail(noSuch("charge", "charge", chID))
		}
	case piID != "":
		pi := s.intents[piID]
		if pi == nil {
			return fail(noSuch("payment_intent", "payment_intent", piID))
		}
		if id, _ := pi.LatestCharge.(string); pi.Status == "succeeded" && id != "" {
			ch = s.charges[id]
		}
		if ch == nil {
			return fail(invalidRequest("", "payment_intent", "This PaymentIntent (%s) does not have a successful charge to refund.", piID))
		}
	default:
		return fail(invalidRequest("parameter_missing", "", "One of the following params should be provided for this request: payment_intent or charge."))
	}
	if ch.Disputed {
		return fail(invalidRequest("charge_disputed", "charge", "Charge %s has been charged back; cannot issue a refund.", ch.ID))
	}
	if ch.Status != "succeeded" {
		return fail(invalidRequest("", "charge", "Charge %s has not succeeded; there is nothing to refund.", ch.ID))
	}
	left := ch.Amount - ch.AmountRefunded
	if left == 0 {
		return fail(invalidRequest("charge_already_refunded", "charge", "Charge %s has already been refunded.", ch.ID))
	}
	if !hasAmount {
		amount = left
	}
	if amount > left {
		return fail(invalidRequest("amount_too_large", "amount", "Refund amount (%s) is greater than unrefunded amount on charge (%s)", formatUSD(amount), formatUSD(left)))
	}
	var piID *string
	if id, _ := ch.PaymentIntent.(string); id != "" {
		piID = strp(id)
	}
	re := &stripeRefund{ID: newID("re"), Object: "refund", Amount: amount, Charge: ch.ID, Created: time.Now().Unix(),
		Currency: ch.Currency, Metadata: md, PaymentIntent: piID, Reason: reason, Status: "succeeded"}
	s.refunds[re.ID] = re
	ch.AmountRefunded += amount
	ch.Refunded = ch.AmountRefunded == ch.Amount
	b.add("refund.created", re)
	b.add("charge.refunded", ch)
	return s.expanded(re, f.list("expand"))
}

// openDispute opens a dispute on a charge, as a card holder's bank does.
// Called with s.mu held.
func (s *Stripe) openDispute(ch *stripeCharge, amount int64, reason string, b *eventBatch) *stripeDispute {
	var piID *string
	if id, _ := ch.PaymentIntent.(string); id != "" {
		piID = strp(id)
	}
	dp := &stripeDispute{ID: newID("dp"), Object: "dispute", Amount: amount, Charge: ch.ID, Created: time.Now().Unix(),
		Currency: ch.Currency, Metadata: map[string]string{}, PaymentIntent: piID, Reason: reason,
		Status: "needs_response"}
	s.disputes[dp.ID] = dp
	ch.Disputed = true
	b.add("charge.dispute.created", dp)
	b.add("charge.dispute.funds_withdrawn", dp)
	return dp
}

// closeDispute ends a dispute won or lost. Called with s.mu held.
func (s *Stripe) closeDispute(dp *stripeDispute, won bool, b *eventBatch) {
	dp.Status = "lost"
	if won {
		dp.Status = "won"
	}
	b.add("charge.dispute.closed", dp)
	if won {
		b.add("charge.dispute.funds_reinstated", dp)
	}
}

// simError answers an error on the /_sim/ endpoints.
func simError(w http.ResponseWriter, status int, msg string) {
	writeStripeJSON(w, status, map[string]any{"error": map[string]string{"type": "invalid_request_error", "message": msg}})
}
