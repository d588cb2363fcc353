package simulate

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// StripeEvent is an event the simulated Stripe created, as its webhook
// body: Payload is the exact bytes delivered (and signed).
type StripeEvent struct {
	ID      string
	Type    string
	Payload []byte
}

// WebhookDelivery is one delivery attempt of an event to the endpoint.
type WebhookDelivery struct {
	EventID string
	Type    string
	Attempt int // 1 for the first attempt of this copy
	Copy    int // 0 the delivery itself, 1... its duplicates (WebhookDuplicates)
	Status  int // the endpoint's HTTP status; 0 when there was no answer
	Err     string
	At      time.Time
}

// OK reports whether the endpoint accepted the delivery (a 2xx; Stripe
// follows no redirect, so a 3xx is a failure).
func (d WebhookDelivery) OK() bool { return d.Status >= 200 && d.Status < 300 }

// stripeEvent is Stripe's event envelope.
type stripeEvent struct {
	ID              string             `json:"id"`
	Object          string             `json:"object"` // "event"
	APIVersion      string             `json:"api_version"`
	Created         int64              `json:"created"`
	Data            stripeEventData    `json:"data"`
	Livemode        bool               `json:"livemode"`
	PendingWebhooks int                `json:"pending_webhooks"`
	Request         stripeEventRequest `json:"request"`
	Type            string             `json:"type"`

	payload []byte
	wanted  bool // the endpoint is subscribed to it: it is delivered
}

type stripeEventData struct {
	Object json.RawMessage `json:"object"`
}

// stripeEventRequest names the API request that caused the event; both are
// null for what a customer did (paying on the Checkout page) or Stripe did
// on its own (a settlement, a dispute).
type stripeEventRequest struct {
	ID             *string `json:"id"`
	IdempotencyKey *string `json:"idempotency_key"`
}

// eventBatch collects the events one action causes, in order; they are
// created (and kept) at once and delivered by send.
type eventBatch struct {
	s       *Stripe
	request stripeEventRequest
	events  []*stripeEvent
}

// batch starts the events of an API call.
func (s *Stripe) batch(c *apiCall) *eventBatch {
	b := &eventBatch{s: s}
	if c != nil {
		b.request.ID = strp(c.requestID)
		if c.idemKey != "" {
			b.request.IdempotencyKey = strp(c.idemKey)
		}
	}
	return b
}

// requestIDOr is the id of the API request behind the events, or def.
func (b *eventBatch) requestIDOr(def string) string {
	if b.request.ID != nil {
		return *b.request.ID
	}
	return def
}

// add creates an event whose data.object is obj as it is now. Called with
// s.mu held.
func (b *eventBatch) add(typ string, obj any) {
	s := b.s
	raw, err := json.Marshal(obj)
	if err != nil {
		panic("simulate: stripe object not encodable: " + err.Error())
	}
	ev := &stripeEvent{ID: newID("evt"), Object: "event", APIVersion: s.cfg.APIVersion, Created: time.Now().Unix(),
		Data: stripeEventData{Object: raw}, Request: b.request, Type: typ}
	if s.hooks.wants(typ) {
		ev.wanted, ev.PendingWebhooks = true, 1
	}
	ev.payload, err = json.MarshalIndent(ev, "", "  ")
	if err != nil {
		panic(err)
	}
	s.events[ev.ID] = ev
	s.eventOrder = append(s.eventOrder, ev.ID)
	b.events = append(b.events, ev)
}

// current is the event as the API shows it now: as delivered, with
// pending_webhooks brought up to date. Called with s.mu held.
func (ev *stripeEvent) current() json.RawMessage {
	cp := *ev
	out, err := json.MarshalIndent(&cp, "", "  ")
	if err != nil {
		panic(err)
	}
	return out
}

// send hands the batch to the webhook sender. It does not take s.mu.
func (b *eventBatch) send() {
	if len(b.events) > 0 {
		b.s.hooks.dispatch(b.events)
		b.events = nil
	}
}

// Events returns every event created, oldest first.
func (s *Stripe) Events() []StripeEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]StripeEvent, 0, len(s.eventOrder))
	for _, id := range s.eventOrder {
		ev := s.events[id]
		out = append(out, StripeEvent{ID: ev.ID, Type: ev.Type, Payload: ev.payload})
	}
	return out
}

// webhookSender delivers events to one endpoint as Stripe does: signed,
// retried with backoff, maybe delayed, duplicated or held back.
type webhookSender struct {
	s      *Stripe
	cfg    StripeConfig
	client *http.Client

	mu         sync.Mutex
	url        string
	secrets    []string // signing secrets; several during a rotation
	delay      time.Duration
	skew       time.Duration
	duplicates int
	hold       bool
	held       []*stripeEvent
	log        []WebhookDelivery
	changed    signal
}

func newWebhookSender(s *Stripe, cfg StripeConfig) *webhookSender {
	return &webhookSender{
		s: s, cfg: cfg, url: cfg.WebhookURL, secrets: []string{cfg.WebhookSecret},
		delay: cfg.WebhookDelay, skew: cfg.WebhookClockSkew, duplicates: cfg.WebhookDuplicates,
		client: &http.Client{
			Timeout: cfg.WebhookTimeout,
			// Stripe does not follow redirects: a 3xx is a failed delivery.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
}

func (h *webhookSender) secret() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.secrets[len(h.secrets)-1]
}

// wants reports whether the endpoint is subscribed to an event type.
func (h *webhookSender) wants(typ string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.url == "" {
		return false
	}
	if len(h.cfg.WebhookEvents) == 0 {
		return true
	}
	return slices.Contains(h.cfg.WebhookEvents, "*") || slices.Contains(h.cfg.WebhookEvents, typ)
}

// SetWebhook points deliveries at another endpoint URL (empty: none).
func (s *Stripe) SetWebhook(url string) {
	s.hooks.mu.Lock()
	s.hooks.url = url
	s.hooks.mu.Unlock()
}

// RollWebhookSecret starts signing with a new secret. With keepOld, the
// old secrets still sign every delivery too (several v1= in the
// Stripe-Signature header), as while a rolled secret has not expired.
func (s *Stripe) RollWebhookSecret(secret string, keepOld bool) {
	h := s.hooks
	h.mu.Lock()
	defer h.mu.Unlock()
	if keepOld {
		h.secrets = append(h.secrets, secret)
	} else {
		h.secrets = []string{secret}
	}
}

// SetWebhookDelay changes the wait before each delivery's first attempt.
func (s *Stripe) SetWebhookDelay(d time.Duration) {
	s.hooks.mu.Lock()
	s.hooks.delay = d
	s.hooks.mu.Unlock()
}

// SetWebhookClockSkew changes how far behind the signing time is.
func (s *Stripe) SetWebhookClockSkew(d time.Duration) {
	s.hooks.mu.Lock()
	s.hooks.skew = d
	s.hooks.mu.Unlock()
}

// SetWebhookDuplicates changes how many extra copies of each event are
// delivered.
func (s *Stripe) SetWebhookDuplicates(n int) {
	s.hooks.mu.Lock()
	s.hooks.duplicates = n
	s.hooks.mu.Unlock()
}

// HoldWebhooks keeps events from being delivered until ReleaseWebhooks.
func (s *Stripe) HoldWebhooks() {
	s.hooks.mu.Lock()
	s.hooks.hold = true
	s.hooks.mu.Unlock()
}

// ReleaseWebhooks delivers the held events, newest first when reverse is
// set (out of order: a refund before the payment it refunds), one after
// the other, and stops holding. It returns how many there were.
func (s *Stripe) ReleaseWebhooks(reverse bool) int {
	h := s.hooks
	h.mu.Lock()
	evs := h.held
	h.held, h.hold = nil, false
	h.mu.Unlock()
	if reverse {
		slices.Reverse(evs)
	}
	s.goBackground(func(ctx context.Context) { h.deliverAll(ctx, evs) })
	return len(evs)
}

// ResendEvent delivers an event again (as the Dashboard's "Resend" does).
func (s *Stripe) ResendEvent(id string) error {
	s.mu.Lock()
	ev := s.events[id]
	s.mu.Unlock()
	if ev == nil {
		return fmt.Errorf("simulate: no such event %q", id)
	}
	s.goBackground(func(ctx context.Context) { s.hooks.deliverAll(ctx, []*stripeEvent{ev}) })
	return nil
}

// Deliveries returns every delivery attempt so far, in the order they ended.
func (s *Stripe) Deliveries() []WebhookDelivery {
	s.hooks.mu.Lock()
	defer s.hooks.mu.Unlock()
	return slices.Clone(s.hooks.log)
}

// WaitDeliveries waits until cond holds for the deliveries, or timeout
// passes.
func (s *Stripe) WaitDeliveries(timeout time.Duration, cond func([]WebhookDelivery) bool) error {
	return waitFor(&s.hooks.changed, timeout, s.Deliveries, cond)
}

// dispatch delivers a batch in the background, after the delay.
func (h *webhookSender) dispatch(evs []*stripeEvent) {
	var send []*stripeEvent
	for _, ev := range evs {
		if ev.wanted {
			send = append(send, ev)
		}
	}
	if len(send) == 0 {
		return
	}
	h.mu.Lock()
	delay := h.delay
	h.mu.Unlock()
	h.s.goBackground(func(ctx context.Context) {
		if !sleep(ctx, delay) {
			return
		}
		h.mu.Lock()
		if h.hold {
			h.held = append(h.held, send...)
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()
		h.deliverAll(ctx, send)
	})
}

// deliverAll makes the first attempt of each event in order (so that the
// endpoint sees them in that order), with the duplicates at the same time;
// failed ones are retried in the background.
func (h *webhookSender) deliverAll(ctx context.Context, evs []*stripeEvent) {
	h.mu.Lock()
	dups := h.duplicates
	h.mu.Unlock()
	for _, ev := range evs {
		var wg sync.WaitGroup
		for cp := 1; cp <= dups; cp++ {
			wg.Add(1)
			started := h.s.goBackground(func(ctx context.Context) {
				defer wg.Done()
				h.deliver(ctx, ev, cp)
			})
			if !started { // closing
				wg.Done()
			}
		}
		if h.attempt(ctx, ev, 0, 1) {
			wg.Wait()
			continue
		}
		h.s.goBackground(func(ctx context.Context) { h.retry(ctx, ev, 0, 2) })
		wg.Wait()
	}
}

// deliver attempts one copy until it is accepted or out of attempts.
func (h *webhookSender) deliver(ctx context.Context, ev *stripeEvent, cp int) {
	if !h.attempt(ctx, ev, cp, 1) {
		h.retry(ctx, ev, cp, 2)
	}
}

func (h *webhookSender) retry(ctx context.Context, ev *stripeEvent, cp, from int) {
	for n := from; n <= h.cfg.WebhookAttempts; n++ {
		wait := h.cfg.WebhookRetryBase << (n - 2)
		if wait > h.cfg.WebhookRetryMax || wait <= 0 {
			wait = h.cfg.WebhookRetryMax
		}
		if !sleep(ctx, wait) || h.attempt(ctx, ev, cp, n) {
			return
		}
	}
}

// attempt POSTs the event once, signed now, and logs the outcome.
func (h *webhookSender) attempt(ctx context.Context, ev *stripeEvent, cp, n int) bool {
	h.mu.Lock()
	url, secrets, skew := h.url, slices.Clone(h.secrets), h.skew
	h.mu.Unlock()
	d := WebhookDelivery{EventID: ev.ID, Type: ev.Type, Attempt: n, Copy: cp}
	if url == "" {
		return true
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(ev.payload))
	if err != nil {
		d.Err = err.Error()
	} else {
		req.Header.Set("Content-Type", "application/json; charset=utf-8")
		req.Header.Set("User-Agent", "Stripe/1.0 (+https://stripe.com/docs/webhooks)")
		req.Header.Set("Accept", "*/*; q=0.5, application/xml")
		req.Header.Set("Cache-Control", "no-cache")
		req.Header.Set("Stripe-Signature", signatureHeader(time.Now().Add(-skew), ev.payload, secrets))
		resp, err := h.client.Do(req)
		if err != nil {
			d.Err = err.Error()
		} else {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
			resp.Body.Close()
			d.Status = resp.StatusCode
		}
	}
	if ctx.Err() != nil {
		return true // closing: neither log nor retry
	}
	d.At = time.Now()
	if d.OK() {
		// The endpoint has it: the event no longer waits for a webhook.
		h.s.mu.Lock()
		ev.PendingWebhooks = 0
		h.s.mu.Unlock()
	}
	h.mu.Lock()
	h.log = append(h.log, d)
	h.mu.Unlock()
	h.changed.notify()
	return d.OK()
}

// signatureHeader builds Stripe-Signature: t=<unix>, one v1= per secret
// (HMAC-SHA256 of "<t>.<payload>"), and a v0= made with a secret nobody
// has, as Stripe adds in test mode; verifiers must ignore it.
func signatureHeader(t time.Time, payload []byte, secrets []string) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	sign := func(secret string) string {
		m := hmac.New(sha256.New, []byte(secret))
		m.Write([]byte(ts))
		m.Write([]byte("."))
		m.Write(payload)
		return hex.EncodeToString(m.Sum(nil))
	}
	out := "t=" + ts
	for _, s := range secrets {
		out += ",v1=" + sign(s)
	}
	return out + ",v0=" + sign("whsec_test_mode_v0_scheme")
}
