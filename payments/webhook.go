package payments

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/tollgate/tollgate"
)

// WebhookPath is where the provider delivers its events (on every
// listener that serves /pricing).
const WebhookPath = "/webhooks/stripe"

// MaxWebhookBody bounds a delivery's body; Stripe's events are far smaller.
const MaxWebhookBody = 1 << 20

// ServeWebhook handles one delivery: it verifies the raw body against the
// signature header, applies the event and answers 200 with its outcome.
// A delivery that does not verify is 400 invalid_request and changes
// nothing. An event whose payment is not known yet (a refund before the
// payment's own event) is 409 conflict, so that the provider delivers it
// again; a store failure is 500 internal_error, likewise retried. Events
// that cannot be credited (mismatch, unknown account, unpaid) are 200:
// retrying them cannot help, and they are recorded for the operator.
func (s *Service) ServeWebhook(w http.ResponseWriter, r *http.Request) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxWebhookBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			s.rejected("body")
			return tollgate.Errorf(tollgate.CodeRequestTooLarge, "the webhook body exceeds %d bytes", MaxWebhookBody)
		}
		s.rejected("body")
		return tollgate.Errorf(tollgate.CodeInvalidRequest, "the webhook body could not be read")
	}
	ev, err := s.p.ParseWebhook(body, r.Header.Get("Stripe-Signature"))
	if err != nil {
		reason := "body"
		if errors.Is(err, ErrBadSignature) {
			reason = "signature"
		}
		s.rejected(reason)
		s.log.Warn("payments: webhook refused", "reason", reason, "err", err)
		return &tollgate.Error{Code: tollgate.CodeInvalidRequest, Message: "the webhook does not verify: " + err.Error(), Err: err}
	}
	rec, err := s.Apply(r.Context(), ev)
	if errors.Is(err, errRetry) {
		return &tollgate.Error{Code: tollgate.CodeConflict, Message: "event " + ev.ID + ": " + err.Error(), RetryAfter: 60}
	}
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(struct {
		Received bool                    `json:"received"`
		Event    string                  `json:"event"`
		Outcome  tollgate.PaymentOutcome `json:"outcome"`
	}{true, rec.ID, rec.Outcome})
}

func (s *Service) rejected(reason string) {
	if s.o.Observer != nil {
		s.o.Observer.WebhookRejected(reason)
	}
}
