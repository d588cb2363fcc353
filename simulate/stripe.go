package simulate

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// StripeAPIVersion is the API version the simulated Stripe answers and puts
// in its events by default: the one stripe-go v82 pins, so that
// webhook.ConstructEvent accepts the events without options.
const StripeAPIVersion = "2025-08-27.basil"

// StripeConfig configures the simulated Stripe (API, hosted Checkout page and
// webhook sender). Every duration has a default; tests shorten them.
type StripeConfig struct {
	// SecretKey is the only API key accepted ("Authorization: Bearer
	// sk_test_..."); empty accepts any sk_test_ or rk_test_ key. A live key
	// (sk_live_...) is always refused: the simulator is test mode only.
	SecretKey string
	// PublicURL is the base of the Checkout page and receipt URLs it hands
	// out (a session's url). Empty: the address the API request came to
	// (its Host header), which is right on loopback.
	PublicURL string

	// WebhookURL is the endpoint events are POSTed to; empty sends none (they
	// are still kept: Events, GET /v1/events/{id}).
	WebhookURL string
	// WebhookSecret signs deliveries (whsec_...). Empty: one is generated;
	// read it with (*Stripe).WebhookSecret.
	WebhookSecret string
	// WebhookEvents are the event types the endpoint is subscribed to, as a
	// Stripe webhook endpoint's enabled_events; empty or "*" means all.
	WebhookEvents []string
	// APIVersion is the webhook endpoint's API version, written in each
	// event's api_version (default StripeAPIVersion).
	APIVersion string
	// WebhookDelay is waited before the first attempt of every delivery
	// (a "delayed webhook").
	WebhookDelay time.Duration
	// WebhookRetryBase is the wait after a failed attempt, doubled after
	// each further failure up to WebhookRetryMax (defaults 2s and 1m; Stripe
	// spreads its retries over hours).
	WebhookRetryBase, WebhookRetryMax time.Duration
	// WebhookAttempts bounds the attempts of one delivery (default 4: the
	// first and three retries, as Stripe makes in test mode; in live mode it
	// keeps trying for three days).
	WebhookAttempts int
	// WebhookTimeout bounds one attempt (default 10s).
	WebhookTimeout time.Duration
	// WebhookClockSkew is subtracted from the time a delivery is signed
	// with (t= in Stripe-Signature), as from a sender whose clock is behind:
	// beyond the endpoint's tolerance (stripe-go's is 5 minutes) the
	// signature is stale and must be refused.
	WebhookClockSkew time.Duration
	// WebhookDuplicates delivers every event this many extra times, each
	// copy at the same moment as the original (the same event id, signed
	// separately): Stripe may deliver an event more than once.
	WebhookDuplicates int

	// Decline makes every payment attempt decline with this decline code
	// ("generic_decline", "insufficient_funds", "authentication_required",
	// ...); empty lets the card decide (see the test cards in
	// docs/simulator.md). (*Stripe).DeclineNext declines one attempt.
	Decline string
	// SessionLifetime is how long a Checkout Session stays open when its
	// creator gives no expires_at (default 24h, Stripe's); at its end the
	// session expires and checkout.session.expired is sent. Tests shorten it.
	SessionLifetime time.Duration
	// AsyncDelay is how long a "Pay later" payment on the Checkout page
	// takes to settle (default 5s).
	AsyncDelay time.Duration
	// MaxRecorded bounds how many API requests are kept (default 10000);
	// negative disables recording.
	MaxRecorded int
}

// Stripe is a stateful imitation of Stripe's API for Checkout Sessions,
// PaymentIntents, refunds and disputes, with a hosted Checkout page and a
// webhook sender that signs events as Stripe does. It is an http.Handler.
type Stripe struct {
	cfg StripeConfig

	mu          sync.Mutex
	sessions    map[string]*stripeSession
	intents     map[string]*stripeIntent
	charges     map[string]*stripeCharge
	refunds     map[string]*stripeRefund
	disputes    map[string]*stripeDispute
	customers   map[string]*stripeCustomer
	methods     map[string]*stripeMethod
	methodSeq   int
	events      map[string]*stripeEvent
	eventOrder  []string
	idem        map[string]*idemEntry
	declineNext []string

	hooks    *webhookSender
	recorded recordLog

	ctx      context.Context // ended by Close: stops deliveries and async settlements
	cancel   context.CancelFunc
	bgMu     sync.Mutex
	bgClosed bool
	bg       sync.WaitGroup
}

// NewStripe builds a simulated Stripe. Call Close when done to stop its
// webhook deliveries.
func NewStripe(cfg StripeConfig) *Stripe {
	if cfg.WebhookSecret == "" {
		cfg.WebhookSecret = "whsec_" + randomToken(32)
	}
	if cfg.APIVersion == "" {
		cfg.APIVersion = StripeAPIVersion
	}
	if cfg.WebhookRetryBase <= 0 {
		cfg.WebhookRetryBase = 2 * time.Second
	}
	if cfg.WebhookRetryMax <= 0 {
		cfg.WebhookRetryMax = time.Minute
	}
	if cfg.WebhookAttempts <= 0 {
		cfg.WebhookAttempts = 4
	}
	if cfg.WebhookTimeout <= 0 {
		cfg.WebhookTimeout = 10 * time.Second
	}
	if cfg.SessionLifetime <= 0 {
		cfg.SessionLifetime = 24 * time.Hour
	}
	if cfg.AsyncDelay <= 0 {
		cfg.AsyncDelay = 5 * time.Second
	}
	if cfg.MaxRecorded == 0 {
		cfg.MaxRecorded = 10000
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Stripe{
		cfg:       cfg,
		sessions:  map[string]*stripeSession{},
		intents:   map[string]*stripeIntent{},
		charges:   map[string]*stripeCharge{},
		refunds:   map[string]*stripeRefund{},
		disputes:  map[string]*stripeDispute{},
		customers: map[string]*stripeCustomer{},
		methods:   map[string]*stripeMethod{},
		events:    map[string]*stripeEvent{},
		idem:      map[string]*idemEntry{},
		recorded:  recordLog{max: cfg.MaxRecorded},
		ctx:       ctx,
		cancel:    cancel,
	}
	s.hooks = newWebhookSender(s, cfg)
	return s
}

// Close stops webhook deliveries and pending settlements and waits for them.
func (s *Stripe) Close() {
	s.bgMu.Lock()
	s.bgClosed = true
	s.bgMu.Unlock()
	s.cancel()
	s.bg.Wait()
}

// WebhookSecret returns the endpoint's signing secret (whsec_...).
func (s *Stripe) WebhookSecret() string { return s.hooks.secret() }

// Requests returns the API requests received (body included), oldest first.
func (s *Stripe) Requests() []Recorded { return s.recorded.all() }

// LastRequest returns the latest API request.
func (s *Stripe) LastRequest() (Recorded, bool) { return s.recorded.last() }

// DeclineNext makes the next payment attempts decline, one per code given,
// whatever the card ("generic_decline", "insufficient_funds",
// "authentication_required", "expired_card", ...).
func (s *Stripe) DeclineNext(declineCodes ...string) {
	s.mu.Lock()
	s.declineNext = append(s.declineNext, declineCodes...)
	s.mu.Unlock()
}

// goBackground runs f in the background; Close cancels its ctx and waits
// for it. After Close it does nothing and returns false.
func (s *Stripe) goBackground(f func(ctx context.Context)) bool {
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	if s.bgClosed {
		return false
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		f(s.ctx)
	}()
	return true
}

// RunningStripe is a simulated Stripe listening on a real port.
type RunningStripe struct {
	*Stripe
	*listener
}

// StartStripe serves a simulated Stripe on 127.0.0.1 on a free port.
func StartStripe(cfg StripeConfig) (*RunningStripe, error) {
	return ListenStripe(cfg, "127.0.0.1:0")
}

// ListenStripe serves a simulated Stripe on addr. Its URL (the API base for
// stripe-go's BackendConfig.URL) is also the base of its Checkout pages
// unless cfg.PublicURL says otherwise.
func ListenStripe(cfg StripeConfig, addr string) (*RunningStripe, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("simulate: listen %s: %w", addr, err)
	}
	if cfg.PublicURL == "" {
		cfg.PublicURL = "http://" + ln.Addr().String()
	}
	s := NewStripe(cfg)
	return &RunningStripe{Stripe: s, listener: newListener(ln, s)}, nil
}

// Close stops the server and the webhook sender.
func (r *RunningStripe) Close() error {
	err := r.listener.Close()
	r.Stripe.Close()
	return err
}

// Shutdown stops accepting, waits for running requests until ctx ends, then
// stops the webhook sender.
func (r *RunningStripe) Shutdown(ctx context.Context) error {
	err := r.listener.Shutdown(ctx)
	r.Stripe.Close()
	return err
}

// randomToken returns n characters of [A-Za-z0-9], as in Stripe's ids.
func randomToken(n int) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// newID returns a Stripe-like id: prefix, "_", 24 characters ("cs_test_"
// ids are longer, as Stripe's are).
func newID(prefix string) string {
	if prefix == "cs_test" {
		return prefix + "_a1" + randomToken(56)
	}
	return prefix + "_" + randomToken(24)
}

// baseURL is where the Checkout pages of a request's objects live.
func (s *Stripe) baseURL(r *http.Request) string {
	if s.cfg.PublicURL != "" {
		return strings.TrimSuffix(s.cfg.PublicURL, "/")
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}
