package simulate

import (
	"net/http"
	"strings"
)

// A test card: what paying with it does, as on Stripe's testing page.
type testCard struct {
	number  string
	brand   string
	decline string // decline code; empty succeeds
	// offSessionDecline declines only off-session payments (a card that
	// needs 3D Secure every time: the Checkout page authenticates it, a
	// saved-card charge cannot).
	offSessionDecline string
	dispute           bool // a successful charge is disputed at once (fraudulent)
}

var testCards = []testCard{
	{number: "4242424242424242", brand: "visa"},
	{number: "5555555555554444", brand: "mastercard"},
	{number: "4000000000000002", brand: "visa", decline: "generic_decline"},
	{number: "4000000000009995", brand: "visa", decline: "insufficient_funds"},
	{number: "4000000000009987", brand: "visa", decline: "lost_card"},
	{number: "4000000000009979", brand: "visa", decline: "stolen_card"},
	{number: "4000000000000069", brand: "visa", decline: "expired_card"},
	{number: "4000000000000127", brand: "visa", decline: "incorrect_cvc"},
	{number: "4000000000000119", brand: "visa", decline: "processing_error"},
	{number: "4000002760003184", brand: "visa", offSessionDecline: "authentication_required"},
	{number: "4000000000000259", brand: "visa", dispute: true},
}

// testPaymentMethods are the ready-made PaymentMethod ids Stripe accepts in
// test mode (payment_method=pm_card_visa), each standing for a test card.
var testPaymentMethods = map[string]string{
	"pm_card_visa":                            "4242424242424242",
	"pm_card_mastercard":                      "5555555555554444",
	"pm_card_chargeDeclined":                  "4000000000000002",
	"pm_card_chargeDeclinedInsufficientFunds": "4000000000009995",
	"pm_card_chargeDeclinedLostCard":          "4000000000009987",
	"pm_card_chargeDeclinedStolenCard":        "4000000000009979",
	"pm_card_chargeDeclinedExpiredCard":       "4000000000000069",
	"pm_card_chargeDeclinedIncorrectCvc":      "4000000000000127",
	"pm_card_chargeDeclinedProcessingError":   "4000000000000119",
	"pm_card_authenticationRequired":          "4000002760003184",
	"pm_card_createDispute":                   "4000000000000259",
}

// lookupCard finds a test card by number (spaces ignored); other numbers
// pay like 4242 4242 4242 4242 but keep their last four digits.
func lookupCard(number string) testCard {
	number = strings.Join(strings.Fields(number), "")
	for _, c := range testCards {
		if c.number == number {
			return c
		}
	}
	if len(number) < 4 {
		number = "4242424242424242"
	}
	return testCard{number: number, brand: "visa"}
}

func cardDetails(c testCard) *stripeCardDetails {
	return &stripeCardDetails{Brand: c.brand, Country: "US", ExpMonth: 12, ExpYear: 2034,
		Funding: "credit", Last4: c.number[len(c.number)-4:]}
}

// declineError is the 402 card_error Stripe answers for a decline code.
func declineError(declineCode string) *stripeError {
	e := &stripeError{status: http.StatusPaymentRequired, Type: "card_error", Code: "card_declined",
		DeclineCode: declineCode, Message: "Your card was declined."}
	switch declineCode {
	case "insufficient_funds":
		e.Message = "Your card has insufficient funds."
	case "expired_card":
		e.Code, e.Message, e.Param = "expired_card", "Your card has expired.", "exp_month"
	case "incorrect_cvc":
		e.Code, e.Message, e.Param = "incorrect_cvc", "Your card's security code is incorrect.", "cvc"
	case "processing_error":
		e.Code, e.Message = "processing_error", "An error occurred while processing your card. Try again in a little bit."
	case "authentication_required":
		e.Code, e.Message = "authentication_required", "Your card was declined. This transaction requires authentication."
	}
	e.DocURL = docURL(e.Code)
	return e
}

// nextDecline says whether this payment attempt declines, and with what
// decline code: DeclineNext's queue first, then Config.Decline, then the
// card. Called with s.mu held.
func (s *Stripe) nextDecline(c testCard, offSession bool) string {
	if len(s.declineNext) > 0 {
		d := s.declineNext[0]
		s.declineNext = s.declineNext[1:]
		return d
	}
	if s.cfg.Decline != "" {
		return s.cfg.Decline
	}
	if offSession && c.offSessionDecline != "" {
		return c.offSessionDecline
	}
	return c.decline
}
