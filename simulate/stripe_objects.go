package simulate

import "time"

// The simulated Stripe's objects, in its JSON shapes (API version
// 2025-08-27.basil): "id" and "object" first, then the fields in
// alphabetical order, null where Stripe sends null. Fields that name another
// object hold its id (a string) or, when expanded, the object itself.

type stripeLineItem struct {
	ID             string      `json:"id"`
	Object         string      `json:"object"` // "item"
	AmountSubtotal int64       `json:"amount_subtotal"`
	AmountTotal    int64       `json:"amount_total"`
	Currency       string      `json:"currency"`
	Description    string      `json:"description"`
	Price          stripePrice `json:"price"`
	Quantity       int64       `json:"quantity"`
}

type stripePrice struct {
	ID         string `json:"id"`
	Object     string `json:"object"` // "price"
	Active     bool   `json:"active"`
	Currency   string `json:"currency"`
	Product    string `json:"product"`
	Type       string `json:"type"` // "one_time"
	UnitAmount int64  `json:"unit_amount"`
}

type stripeCustomerDetails struct {
	Email *string `json:"email"`
	Name  *string `json:"name"`
}

type stripeSession struct {
	ID                 string                 `json:"id"`
	Object             string                 `json:"object"` // "checkout.session"
	AmountSubtotal     int64                  `json:"amount_subtotal"`
	AmountTotal        int64                  `json:"amount_total"`
	CancelURL          *string                `json:"cancel_url"`
	ClientReferenceID  *string                `json:"client_reference_id"`
	Created            int64                  `json:"created"`
	Currency           string                 `json:"currency"`
	Customer           any                    `json:"customer"`
	CustomerCreation   *string                `json:"customer_creation"`
	CustomerDetails    *stripeCustomerDetails `json:"customer_details"`
	CustomerEmail      *string                `json:"customer_email"`
	ExpiresAt          int64                  `json:"expires_at"`
	LineItems          any                    `json:"line_items,omitempty"` // only when expanded
	Livemode           bool                   `json:"livemode"`
	Metadata           map[string]string      `json:"metadata"`
	Mode               string                 `json:"mode"`
	PaymentIntent      any                    `json:"payment_intent"`
	PaymentMethodTypes []string               `json:"payment_method_types"`
	PaymentStatus      string                 `json:"payment_status"`
	Status             string                 `json:"status"`
	SuccessURL         *string                `json:"success_url"`
	UIMode             string                 `json:"ui_mode"`
	URL                *string                `json:"url"`

	// Not sent: what the simulator needs besides.
	items            []stripeLineItem
	setupFutureUsage string
	intentMetadata   map[string]string
	explicitPMTypes  bool
	createdCustomer  string    // made for customer_creation=always, kept across attempts
	expiresAt        time.Time // ExpiresAt, to the nanosecond (SessionLifetime may be short)
}

type stripeIntent struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"` // "payment_intent"
	Amount             int64             `json:"amount"`
	AmountCapturable   int64             `json:"amount_capturable"`
	AmountReceived     int64             `json:"amount_received"`
	CaptureMethod      string            `json:"capture_method"`
	ClientSecret       string            `json:"client_secret"`
	ConfirmationMethod string            `json:"confirmation_method"`
	Created            int64             `json:"created"`
	Currency           string            `json:"currency"`
	Customer           any               `json:"customer"`
	Description        *string           `json:"description"`
	LastPaymentError   *stripeError      `json:"last_payment_error"`
	LatestCharge       any               `json:"latest_charge"`
	Livemode           bool              `json:"livemode"`
	Metadata           map[string]string `json:"metadata"`
	PaymentMethod      any               `json:"payment_method"`
	PaymentMethodTypes []string          `json:"payment_method_types"`
	SetupFutureUsage   *string           `json:"setup_future_usage"`
	Status             string            `json:"status"`
}

type stripeCardDetails struct {
	Brand    string `json:"brand"`
	Country  string `json:"country"`
	ExpMonth int    `json:"exp_month"`
	ExpYear  int    `json:"exp_year"`
	Funding  string `json:"funding"`
	Last4    string `json:"last4"`
}

type stripePaymentMethodDetails struct {
	Card          *stripeCardDetails `json:"card,omitempty"`
	USBankAccount map[string]any     `json:"us_bank_account,omitempty"`
	Type          string             `json:"type"`
}

type stripeOutcome struct {
	NetworkStatus string  `json:"network_status"`
	Reason        *string `json:"reason"`
	SellerMessage string  `json:"seller_message"`
	Type          string  `json:"type"`
}

type stripeCharge struct {
	ID                   string                     `json:"id"`
	Object               string                     `json:"object"` // "charge"
	Amount               int64                      `json:"amount"`
	AmountCaptured       int64                      `json:"amount_captured"`
	AmountRefunded       int64                      `json:"amount_refunded"`
	BalanceTransaction   *string                    `json:"balance_transaction"`
	Captured             bool                       `json:"captured"`
	Created              int64                      `json:"created"`
	Currency             string                     `json:"currency"`
	Customer             any                        `json:"customer"`
	Description          *string                    `json:"description"`
	Disputed             bool                       `json:"disputed"`
	FailureCode          *string                    `json:"failure_code"`
	FailureMessage       *string                    `json:"failure_message"`
	Livemode             bool                       `json:"livemode"`
	Metadata             map[string]string          `json:"metadata"`
	Outcome              stripeOutcome              `json:"outcome"`
	Paid                 bool                       `json:"paid"`
	PaymentIntent        any                        `json:"payment_intent"`
	PaymentMethod        string                     `json:"payment_method"`
	PaymentMethodDetails stripePaymentMethodDetails `json:"payment_method_details"`
	ReceiptURL           *string                    `json:"receipt_url"`
	Refunded             bool                       `json:"refunded"`
	Status               string                     `json:"status"`
}

type stripeRefund struct {
	ID            string            `json:"id"`
	Object        string            `json:"object"` // "refund"
	Amount        int64             `json:"amount"`
	Charge        string            `json:"charge"`
	Created       int64             `json:"created"`
	Currency      string            `json:"currency"`
	Metadata      map[string]string `json:"metadata"`
	PaymentIntent *string           `json:"payment_intent"`
	Reason        *string           `json:"reason"`
	Status        string            `json:"status"`
}

type stripeDispute struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"` // "dispute"
	Amount             int64             `json:"amount"`
	Charge             string            `json:"charge"`
	Created            int64             `json:"created"`
	Currency           string            `json:"currency"`
	IsChargeRefundable bool              `json:"is_charge_refundable"`
	Livemode           bool              `json:"livemode"`
	Metadata           map[string]string `json:"metadata"`
	PaymentIntent      *string           `json:"payment_intent"`
	Reason             string            `json:"reason"`
	Status             string            `json:"status"`
}

type stripeCustomer struct {
	ID              string            `json:"id"`
	Object          string            `json:"object"` // "customer"
	Created         int64             `json:"created"`
	Description     *string           `json:"description"`
	Email           *string           `json:"email"`
	InvoiceSettings map[string]any    `json:"invoice_settings"`
	Livemode        bool              `json:"livemode"`
	Metadata        map[string]string `json:"metadata"`
	Name            *string           `json:"name"`
}

type stripeMethod struct {
	ID       string             `json:"id"`
	Object   string             `json:"object"` // "payment_method"
	Card     *stripeCardDetails `json:"card,omitempty"`
	Created  int64              `json:"created"`
	Customer *string            `json:"customer"`
	Livemode bool               `json:"livemode"`
	Metadata map[string]string  `json:"metadata"`
	Type     string             `json:"type"`

	number string // the test card number it stands for
	seq    int    // creation order, for listing newest first
	// used: charged once without being attached to a customer; Stripe
	// refuses to use such a PaymentMethod again.
	used bool
}

type stripeList struct {
	Object  string `json:"object"` // "list"
	Data    any    `json:"data"`
	HasMore bool   `json:"has_more"`
	URL     string `json:"url"`
}

func strp(s string) *string { return &s }
