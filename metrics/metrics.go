// Package metrics is tollgate's Prometheus instrumentation: one registry,
// the per-request series the server observes after each response, and
// collectors that read nodes, billing and the store at scrape time (so the
// request path pays for none of them). docs/operations.md lists every
// series. Labels are bounded: model ids come from the catalogue (anything
// else is ""), classes, statuses and error codes are closed sets; no
// account, key or request id is ever a label.
package metrics

import (
	"net/http"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tollgate/tollgate"
)

// Namespace prefixes every tollgate series.
const Namespace = "tollgate"

// Build describes the binary for tollgate_build_info.
type Build struct {
	Version, Commit, GoVersion string
}

// ReadBuild returns the running binary's version and commit, from the
// module build info (version) and the VCS stamp (commit) when present.
func ReadBuild(version string) Build {
	b := Build{Version: version, Commit: "unknown", GoVersion: "unknown"}
	if info, ok := debug.ReadBuildInfo(); ok {
		b.GoVersion = info.GoVersion
		if b.Version == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			b.Version = info.Main.Version
		}
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				b.Commit = s.Value
			}
		}
	}
	if b.Version == "" {
		b.Version = "devel"
	}
	return b
}

// Request is what the server knows of one finished request on the API
// listener.
type Request struct {
	Model    string // a catalogue id, or "" (not a chat request, or an unknown model)
	Class    string // network, fallback, or "" (not served)
	Status   int
	Code     string // error.code, "" on success
	Stream   bool
	Duration time.Duration
	TTFT     time.Duration // 0: no first token (non-streamed requests count the whole answer)

	PromptTokens, CompletionTokens, CachedTokens, ReasoningTokens int64
	CostUSD                                                       float64 // approximate: the ledger is exact
	Searches                                                      int64
}

// Metrics holds tollgate's registry and series. Safe for concurrent use.
type Metrics struct {
	Registry *prometheus.Registry

	requests     *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	ttft         *prometheus.HistogramVec
	tokens       *prometheus.CounterVec
	cost         *prometheus.CounterVec
	searches     *prometheus.CounterVec
	inflight     *prometheus.GaugeVec
	authFailures *prometheus.CounterVec
	idempotency  *prometheus.CounterVec
	// Payments (docs/payments.md).
	payments        *prometheus.CounterVec
	webhookRejected *prometheus.CounterVec
	creditLatency   prometheus.Histogram

	// Resolved series by label tuple: a map lookup instead of the vector's
	// hashing of every label on every request.
	mu     sync.RWMutex
	served map[servedKey]*servedSeries
	counts map[countKey]prometheus.Counter

	InflightRequests, InflightStreams prometheus.Gauge
}

type servedKey struct {
	model, class string
	stream       bool
}

type servedSeries struct {
	duration, ttft                      prometheus.Observer
	prompt, completion, cached, reasons prometheus.Counter
	cost, searches                      prometheus.Counter
}

type countKey struct {
	model, class, code string
	status             int
}

// Latency buckets in seconds: from a cached answer to a long stream.
var (
	durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800}
	ttftBuckets     = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60}
)

// New builds the registry with tollgate's series, the Go runtime and process
// collectors and tollgate_build_info.
func New(b Build) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{Registry: reg, served: map[servedKey]*servedSeries{}, counts: map[countKey]prometheus.Counter{}}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "requests_total",
		Help: "Chat completion requests by model, backend class, HTTP status and error code (\"\" on success)."},
		[]string{"model", "class", "status", "code"})
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "request_duration_seconds",
		Help: "Time from the request's arrival to the end of its answer, by model, backend class and stream.", Buckets: durationBuckets},
		[]string{"model", "class", "stream"})
	m.ttft = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "time_to_first_token_seconds",
		Help: "Time from the request's arrival to the first generated token sent to the client (streams), by model and backend class.", Buckets: ttftBuckets},
		[]string{"model", "class"})
	m.tokens = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "tokens_total",
		Help: "Tokens billed, by model, backend class and kind (prompt, completion, cached, reasoning; cached is part of prompt, reasoning of completion)."},
		[]string{"model", "class", "kind"})
	m.cost = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "cost_usd_total",
		Help: "USD charged, by model and backend class. Approximate (a float): the ledger is the exact record."},
		[]string{"model", "class"})
	m.searches = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "web_searches_total",
		Help: "Web searches charged, by model and backend class."},
		[]string{"model", "class"})
	m.inflight = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "requests_in_flight",
		Help: "Chat completion requests being served, by kind (request: non-streamed, stream)."}, []string{"kind"})
	m.authFailures = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "auth_failures_total",
		Help: "Requests refused by authentication, by error code (missing_api_key, invalid_api_key, api_key_revoked, api_key_expired, account_disabled)."},
		[]string{"reason"})
	m.idempotency = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "idempotency_total",
		Help: "Requests with an Idempotency-Key by outcome (replayed, in_flight, reused)."}, []string{"outcome"})
	m.payments = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "payment_events_total",
		Help: "Payment provider events (and operator re-checks) applied, by outcome (credited, already_credited, unknown_account, account_disabled, mismatch, unpaid, failed, debited, reversed, no_change, unmatched, ignored)."},
		[]string{"outcome"})
	m.webhookRejected = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "payment_webhooks_rejected_total",
		Help: "Payment webhook deliveries refused before any change, by reason (signature: forged, stale or for another secret; body)."},
		[]string{"reason"})
	m.creditLatency = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Name: "payment_credit_latency_seconds",
		Help:    "Time from a payment (the provider's event announcing it) to its credit in the ledger.",
		Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 900, 3600, 86400}})
	m.InflightRequests = m.inflight.WithLabelValues("request")
	m.InflightStreams = m.inflight.WithLabelValues("stream")
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "build_info",
		Help: "1, labelled with the running binary's version, commit and Go version."}, []string{"version", "commit", "goversion"})
	info.WithLabelValues(b.Version, b.Commit, b.GoVersion).Set(1)
	reg.MustRegister(m.requests, m.duration, m.ttft, m.tokens, m.cost, m.searches, m.inflight, m.authFailures, m.idempotency, info,
		m.payments, m.webhookRejected, m.creditLatency, StoreCollector{},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the registry in Prometheus's text format (OpenMetrics when asked).
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry, EnableOpenMetrics: true})
}

// ObserveRequest records one finished chat completion request.
func (m *Metrics) ObserveRequest(r *Request) {
	m.count(r)
	if r.Class == "" {
		return // not served: nothing generated, nothing charged
	}
	s := m.series(r.Model, r.Class, r.Stream)
	s.duration.Observe(r.Duration.Seconds())
	if r.TTFT > 0 {
		s.ttft.Observe(r.TTFT.Seconds())
	}
	s.prompt.Add(float64(r.PromptTokens))
	s.completion.Add(float64(r.CompletionTokens))
	if r.CachedTokens > 0 {
		s.cached.Add(float64(r.CachedTokens))
	}
	if r.ReasoningTokens > 0 {
		s.reasons.Add(float64(r.ReasoningTokens))
	}
	if r.CostUSD > 0 {
		s.cost.Add(r.CostUSD)
	}
	if r.Searches > 0 {
		s.searches.Add(float64(r.Searches))
	}
}

func (m *Metrics) count(r *Request) {
	k := countKey{model: r.Model, class: r.Class, code: r.Code, status: r.Status}
	m.mu.RLock()
	c := m.counts[k]
	m.mu.RUnlock()
	if c == nil {
		c = m.requests.WithLabelValues(r.Model, r.Class, strconv.Itoa(r.Status), r.Code)
		m.mu.Lock()
		m.counts[k] = c
		m.mu.Unlock()
	}
	c.Inc()
}

func (m *Metrics) series(model, class string, stream bool) *servedSeries {
	k := servedKey{model, class, stream}
	m.mu.RLock()
	s := m.served[k]
	m.mu.RUnlock()
	if s != nil {
		return s
	}
	s = &servedSeries{
		duration:   m.duration.WithLabelValues(model, class, strconv.FormatBool(stream)),
		ttft:       m.ttft.WithLabelValues(model, class),
		prompt:     m.tokens.WithLabelValues(model, class, "prompt"),
		completion: m.tokens.WithLabelValues(model, class, "completion"),
		cached:     m.tokens.WithLabelValues(model, class, "cached"),
		reasons:    m.tokens.WithLabelValues(model, class, "reasoning"),
		cost:       m.cost.WithLabelValues(model, class),
		searches:   m.searches.WithLabelValues(model, class),
	}
	m.mu.Lock()
	m.served[k] = s
	m.mu.Unlock()
	return s
}

// AuthFailure counts a request refused by authentication.
func (m *Metrics) AuthFailure(code string) { m.authFailures.WithLabelValues(code).Inc() }

// Idempotency counts a keyed request's outcome: replayed, in_flight or reused.
func (m *Metrics) Idempotency(outcome string) { m.idempotency.WithLabelValues(outcome).Inc() }

// PaymentEvent counts a payment event applied, by outcome.
func (m *Metrics) PaymentEvent(outcome tollgate.PaymentOutcome) {
	m.payments.WithLabelValues(string(outcome)).Inc()
}

// WebhookRejected counts a payment webhook delivery refused (signature, body).
func (m *Metrics) WebhookRejected(reason string) { m.webhookRejected.WithLabelValues(reason).Inc() }

// CreditLatency observes the time from a payment to its credit.
func (m *Metrics) CreditLatency(d time.Duration) { m.creditLatency.Observe(d.Seconds()) }
