package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/openai"
	"github.com/tollgate/tollgate/routing"
	"github.com/tollgate/tollgate/storefail"
	"github.com/tollgate/tollgate/upstream"
)

// Options bound a request's time (docs/streams.md; docs/api.md, "Limits").
type Options struct {
	NonStreamTimeout time.Duration // 504 after this; default 5m
	StreamTotal      time.Duration // a stream ends with an error event after this; default 30m
	StreamIdle       time.Duration // backend silent this long ends the stream; default 5m
	KeepAlive        time.Duration // SSE comment while the backend is silent; default 15s
	ConnectTimeout   time.Duration // dialing a backend; default 10s
	Health           routing.HealthPolicy
	// MaxUpstreamBody bounds a non-streamed upstream answer; default 64 MiB.
	MaxUpstreamBody int64
	// MaxSearches bounds the web searches of one request; default 5.
	MaxSearches int
}

func (o *Options) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.NonStreamTimeout, 5*time.Minute)
	def(&o.StreamTotal, 30*time.Minute)
	def(&o.StreamIdle, 5*time.Minute)
	def(&o.KeepAlive, 15*time.Second)
	def(&o.ConnectTimeout, 10*time.Second)
	o.Health.SetDefaults()
	if o.MaxUpstreamBody <= 0 {
		o.MaxUpstreamBody = 64 << 20
	}
	if o.MaxSearches <= 0 {
		o.MaxSearches = DefaultMaxSearches
	}
}

// TrafficCounter counts served requests per backend class (traffic.Counter).
type TrafficCounter interface {
	Add(class tollgate.BackendClass)
}

// Deps are the relay's collaborators; any may be nil.
type Deps struct {
	Traffic TrafficCounter  // counts served requests per class
	Biller  tollgate.Biller // holds and settles money; nil: billing off
	Log     *slog.Logger
	// Search runs web searches; nil: web search is off and
	// web_search_options is refused.
	Search Searcher
	// Streams counts the streams in flight (a metrics gauge); may be nil.
	Streams Gauge
	// Tracer makes the request's spans (trace.go); nil: no tracing.
	Tracer trace.Tracer
}

// Gauge is a number that goes up and down (prometheus.Gauge).
type Gauge interface {
	Inc()
	Dec()
}

// Relay serves chat completions. It is safe for concurrent use; the catalogue
// can be swapped at run time (config reload) without disturbing requests in flight.
type Relay struct {
	catalog atomic.Pointer[Catalog]
	dialer  *net.Dialer
	// picker chooses a request's backend and node and counts its prefix
	// routing decisions (package routing).
	picker  routing.Picker[*Backend, *Node]
	opts    Options
	traffic TrafficCounter
	biller  tollgate.Biller
	search  Searcher
	streams Gauge
	tracer  trace.Tracer
	log     *slog.Logger
	now     func() time.Time
	bufs    sync.Pool
}

// New builds a relay.
func New(cat *Catalog, opts Options, deps Deps) *Relay {
	opts.setDefaults()
	log := deps.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	dialer := &net.Dialer{Timeout: opts.ConnectTimeout, KeepAlive: 30 * time.Second}
	r := &Relay{
		dialer:  dialer,
		opts:    opts,
		traffic: deps.Traffic,
		biller:  deps.Biller,
		search:  deps.Search,
		streams: deps.Streams,
		tracer:  deps.Tracer,
		log:     log,
		now:     time.Now,
	}
	r.bufs.New = func() any { b := make([]byte, 0, 4096); return &b }
	r.startEvents(cat)
	r.startPolls(cat)
	r.catalog.Store(cat)
	return r
}

// startEvents subscribes to the KV-cache events of the catalogue's nodes
// that publish them and have no subscriber yet (before the catalogue is in
// force: requests read a node's subscriber without a lock).
func (r *Relay) startEvents(c *Catalog) {
	if c == nil {
		return
	}
	for _, n := range c.Nodes() {
		// The events name blocks by token ids: vLLM's /tokenize gives a
		// chat's (SGLang's takes plain text only, not a chat).
		tokenize := ""
		if n.Flavour == openai.VLLM {
			tokenize = serverRoot(n.BaseURL) + "/tokenize"
		}
		n.Subscribe(r.log.With("node", n.Name), tokenize, n.Key, r.dialer)
	}
}

// Close stops following the nodes' KV-cache events.
func (r *Relay) Close() {
	if c := r.catalog.Load(); c != nil {
		for _, n := range c.Nodes() {
			n.Unsubscribe()
			n.StopLoadPoll()
		}
	}
}

// h1For returns the node's client (package upstream), made on first use; nil
// only for a node URL it cannot serve (the config allows none).
func (r *Relay) h1For(n *Node) *upstream.Pool {
	n.h1Once.Do(func() {
		if p, err := upstream.NewPool(n.BaseURL+"/chat/completions", r.dialer); err == nil {
			n.h1.Store(p)
		}
	})
	return n.h1.Load()
}

// Catalog returns the catalogue in force.
func (r *Relay) Catalog() *Catalog { return r.catalog.Load() }

// SetCatalog swaps the catalogue (config reload). Requests in flight keep theirs.
func (r *Relay) SetCatalog(c *Catalog) {
	r.startEvents(c)
	r.startPolls(c)
	old := r.catalog.Swap(c)
	if old == nil {
		return
	}
	kept := map[*Node]bool{}
	for _, n := range c.Nodes() {
		kept[n] = true
	}
	// Nodes the new catalogue dropped or replaced: close their idle
	// connections (requests still using them finish on theirs).
	for _, n := range old.Nodes() {
		if kept[n] {
			continue
		}
		if p := n.h1.Load(); p != nil {
			p.CloseIdle()
		}
		if p := n.probePool.Load(); p != nil {
			p.CloseIdle()
		}
		n.Unsubscribe()
		n.StopLoadPoll()
	}
}

// Call is one client request as the HTTP layer hands it over.
type Call struct {
	RequestID string // tollgate's request id; the completion id is "chatcmpl-" + this
	Key       tollgate.Key
	Account   tollgate.Account
	Body      []byte

	// Filled in by the relay for the access log.
	Model        string
	Backend      tollgate.BackendClass
	Node         string
	Usage        openai.Usage
	Cost         tollgate.Amount
	Outcome      string // served, failed, disconnected, ...
	UpstreamTime time.Duration
	Stream       bool          // the client asked for a stream
	FirstToken   time.Time     // when the first generated token was sent (streams)
	ErrorCode    tollgate.Code // a failure delivered inside a stream
	Searches     int64         // web searches charged
}

// ServeChat handles POST /v1/chat/completions for an authenticated call. It
// returns an error only when nothing has been written to w yet; the HTTP
// layer turns it into the error envelope. Once a stream has started, errors
// are delivered inside the stream.
func (r *Relay) ServeChat(w http.ResponseWriter, req *http.Request, call *Call) error {
	cr, err := openai.ParseChatRequest(call.Body)
	if err != nil {
		return err
	}
	cat := r.catalog.Load()
	m, ok := cat.Lookup(cr.Model)
	if !ok {
		return &tollgate.Error{Code: tollgate.CodeModelNotFound, Param: "model",
			Message: fmt.Sprintf("the model %q does not exist; GET /v1/models lists the catalogue", cr.Model)}
	}
	call.Model = m.ID
	if !call.Key.AllowsModel(m.ID) {
		return &tollgate.Error{Code: tollgate.CodeModelNotAllowed, Param: "model",
			Message: fmt.Sprintf("this API key may not use model %q", m.ID)}
	}
	if cr.MaxTokens > m.MaxOutputTokens {
		return tollgate.ParamErrorf(tollgate.CodeInvalidRequest, maxTokensParam(cr),
			"%s is too large: %d; model %s produces at most %d tokens", maxTokensParam(cr), cr.MaxTokens, m.ID, m.MaxOutputTokens)
	}
	needs := cr.Needs
	webSearch := needs.Has(tollgate.CapWebSearch)
	if webSearch && r.search == nil {
		// Web search is served by tollgate itself (docs/api.md): without a
		// search provider no model can take it.
		return &tollgate.Error{Code: tollgate.CodeCapabilityNotSupported, Param: "web_search_options",
			Message: "web search is not enabled on this service (no search provider is configured)"}
	}
	able, err := checkCapabilities(m, needs, cr.Param)
	if err != nil {
		return err
	}
	able, emulate := honouring(able, cr)
	var pr prefixRoute
	b, node, err := r.picker.Route(m.ID, able, nil, r.picker.Start(req.Context(), &pr, m.ID, m.Backends, cr, r.now()))
	defer pr.Done()
	if err != nil {
		return err
	}
	call.Stream = cr.Stream
	if cr.Stream && r.streams != nil {
		r.streams.Inc()
		defer r.streams.Dec()
	}
	if webSearch {
		// One search loop makes one answer, whose tool calls are the
		// model's: n and a tool choice no node honours are not enforced
		// (docs/decisions.md).
		ne := emulate
		if cr.N > 1 {
			ne |= openai.ControlN
		}
		if ne != 0 {
			w.Header().Set(notEnforcedHeader, controlParams(ne))
		}
		return r.serveSearch(w, req, call, cr, m, b, node)
	}
	outCap := cr.MaxTokens
	if outCap == 0 {
		outCap = m.MaxOutputTokens
	}
	var toolCall []byte
	if emulate&toolControls != 0 {
		if toolCall, err = cr.ToolCallSchema(); err != nil {
			// No function to constrain the answer to: forwarded as asked.
			w.Header().Set(notEnforcedHeader, "tool_choice")
			emulate &^= toolControls
		}
	}
	// A stream for n choices whose tool choice (if any) needs no enforcing
	// is n live streams (emulate_stream.go); other emulated answers are
	// made whole first (emulate.go).
	liveN := cr.Stream && emulate == openai.ControlN
	bufp := r.bufs.Get().(*[]byte)
	defer r.bufs.Put(bufp)
	body := cr.AppendUpstreamBody((*bufp)[:0], openai.UpstreamOptions{Model: b.UpstreamModel, Flavour: node.Flavour, MaxTokens: outCap,
		OneChoice: emulate&openai.ControlN != 0, NonStream: emulate != 0 && !liveN, ToolCall: toolCall})
	*bufp = body

	x := &exchange{r: r, call: call, cr: cr, model: m, backend: b, node: node, body: body,
		promptEstimate: promptEstimate(cr, m), spanCtx: req.Context(), prompt: pr.Prompt()}
	defer func() { x.node.Release() }()
	if r.biller != nil {
		promptBound := promptBound(cr, m)
		if toolCall != nil {
			promptBound = min(promptBound+openai.ToolCallPromptBytes(toolCall), m.ContextLength)
		}
		if emulate&openai.ControlN != 0 {
			promptBound *= cr.N // each of the n calls reads the prompt
		}
		amount, err := holdAmount(b.Prices, promptBound, outCap*cr.N)
		if err != nil {
			return tollgate.ParamErrorf(tollgate.CodeInvalidRequest, maxTokensParam(cr), "the request's cost bound is out of range")
		}
		_, hs := r.span(req.Context(), "hold", trace.SpanKindInternal)
		x.holdID, err = r.biller.Hold(req.Context(), tollgate.HoldRequest{
			RequestID: call.RequestID, AccountID: call.Account.ID, KeyID: call.Key.ID, Model: m.ID,
			Class: b.Class, Amount: amount, TokenBound: promptBound + outCap*cr.N, Time: r.now(),
		})
		endSpan(hs, err)
		if err != nil {
			return err
		}
		defer x.releaseUnsettled()
	}
	switch {
	case liveN:
		return x.streamN(w, req, int(cr.N))
	case emulate != 0:
		return x.emulated(w, req, emulate)
	}
	if cr.Stream {
		return x.stream(w, req)
	}
	return x.nonStream(w, req)
}

func maxTokensParam(cr *openai.ChatRequest) string {
	if cr.Field("max_completion_tokens") != nil && string(cr.Field("max_completion_tokens")) != "null" {
		return "max_completion_tokens"
	}
	return "max_tokens"
}

// promptEstimate counts the prompt locally, for a backend that reports no
// usage: the byte estimate of the messages and tools, plus a documented
// allowance per image (765 tokens, a 512x512 tile in OpenAI's accounting)
// and per document (1,500 tokens), never above the context length.
func promptEstimate(cr *openai.ChatRequest, m *Model) int64 {
	n := openai.EstimateTokensN(cr.PromptBytes) + cr.Images*765 + cr.Files*1500
	return min(n, m.ContextLength)
}

// promptBound is an upper bound of the prompt's tokens for the hold: every
// byte of the messages and tools as a token (a BPE token covers at least one
// byte), 16 template tokens per message part, the model's ImageTokens per
// image, and any document makes the bound the whole context. Never above the
// context length.
func promptBound(cr *openai.ChatRequest, m *Model) int64 {
	if cr.Files > 0 {
		return m.ContextLength
	}
	n := cr.PromptBytes + 64 + cr.Images*m.ImageTokens
	return min(n, m.ContextLength)
}

// DefaultImageTokens is the hold's tokens for one image when the model's
// config does not say (models[].image_tokens; NewCatalog applies it). Vision encoders that tile a large image
// into more (Qwen2.5-VL: up to 16,384 at its default max_pixels; Pixtral:
// about 4,096 for 1024×1024) need the model's own figure.
const DefaultImageTokens = 2000

// holdAmount is promptBound x input + output cap x output.
func holdAmount(p tollgate.Prices, promptBound, outputCap int64) (tollgate.Amount, error) {
	return p.Cost(promptBound, outputCap)
}

var (
	jsonContentType = []string{"application/json"}
)

// exchange is one request's trip to one backend.
type exchange struct {
	r              *Relay
	call           *Call
	cr             *openai.ChatRequest
	model          *Model
	backend        *Backend
	node           *Node
	body           []byte
	promptEstimate int64
	holdID         string
	settled        bool
	// Tracing (trace.go): the request's span context (the parent of the
	// hold and settle spans), the backend call's span and its traceparent.
	spanCtx     context.Context
	backendSpan trace.Span
	traceparent string
	// prompt is what prefix routing needs for a retry on another node.
	prompt routing.Prompt
	// nodeMu guards writes of node (send's retry after a refused
	// connection) against setServedHeaders on the stream watchdog's timer.
	nodeMu sync.Mutex
}

// settle charges the request (or releases the hold when it cost nothing) and
// returns the amount charged, which is what the client is shown. If the
// charge could be neither written nor kept for later (the store cannot be
// reached and the charge journal could not take it), it returns the error
// the client gets instead of a cost (chargeLost): a cost is shown only when
// it is, or will be, in the ledger.
func (x *exchange) settle(u openai.Usage, cost tollgate.Amount) (tollgate.Amount, error) {
	if x.r.biller == nil || x.holdID == "" {
		return cost, nil
	}
	x.settled = true
	// Not the request's context: the client may be gone, and the charge
	// must still be written (the Biller sees every operation through).
	ctx := context.Background()
	if x.r.tracer != nil {
		var ss trace.Span
		_, ss = x.r.span(trace.ContextWithSpanContext(ctx, trace.SpanContextFromContext(x.spanCtx)), "settle", trace.SpanKindInternal)
		defer endSpan(ss, nil)
	}
	if u.PromptTokens == 0 && u.CompletionTokens == 0 && x.call.Searches == 0 {
		if err := x.r.biller.Release(ctx, x.holdID); err != nil {
			x.r.log.Error("release hold", "request_id", x.call.RequestID, "err", err)
		}
		return 0, nil
	}
	charged, err := x.r.biller.Settle(ctx, x.holdID, x.charge(u, x.call.Searches, cost))
	if err != nil {
		// The hold stays until the Biller lets it go (docs/billing.md), so
		// the balance stays covered meanwhile.
		x.r.log.Error("settle failed", "request_id", x.call.RequestID, "account", x.call.Account.ID, "cost", cost.String(), "err", err)
		return 0, chargeLost(err)
	}
	return charged, nil
}

// chargeLost is the answer of a request whose charge could not be written:
// 503 store_unavailable when the store could not be reached, else a bug.
func chargeLost(err error) *tollgate.Error {
	e := &tollgate.Error{Code: tollgate.CodeInternal, Err: err,
		Message: "this request's charge could not be recorded; it was not charged"}
	if _, ok := storefail.Op(err); ok {
		e.Code, e.RetryAfter = tollgate.CodeStoreUnavailable, storefail.RetryAfter
		e.Message = "this request's charge could not be recorded (the service's database cannot be reached); it was not charged"
	}
	return e
}

// charge is the request's charge for usage u and searches web searches
// (their fee included in cost): what its settle writes, and what a running
// stream records as its charge so far (recordProgress).
func (x *exchange) charge(u openai.Usage, searches int64, cost tollgate.Amount) tollgate.Charge {
	c := tollgate.Charge{
		RequestID: x.call.RequestID, AccountID: x.call.Account.ID, KeyID: x.call.Key.ID, Model: x.model.ID,
		Class: x.backend.Class, Node: x.node.Name, PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens,
		Prices: x.backend.Prices, Cost: cost, Estimated: u.Estimated, Time: x.r.now(),
	}
	if searches > 0 {
		c.Searches, c.SearchPrice = searches, x.model.SearchPrice
	}
	if u.CachedTokens != nil {
		c.CachedTokens = *u.CachedTokens
	}
	if u.ReasoningTokens != nil {
		c.ReasoningTokens = *u.ReasoningTokens
	}
	return c
}

// releaseUnsettled frees the hold of a request that ended without a charge.
func (x *exchange) releaseUnsettled() {
	if x.settled || x.holdID == "" {
		return
	}
	x.settled = true
	if err := x.r.biller.Release(context.Background(), x.holdID); err != nil {
		x.r.log.Error("release hold", "request_id", x.call.RequestID, "err", err)
	}
}

func (x *exchange) completionID() string { return "chatcmpl-" + x.call.RequestID }

// send posts the body to the node. A node that refuses the connection
// (nothing was sent) is marked down and, within the network, another node of
// the same backend is tried: that is not failover, the request never reached
// a model. Anything else is final.
func (x *exchange) send(ctx context.Context) (*http.Response, error) {
	for attempt := 0; ; attempt++ {
		start := x.r.now()
		h1 := x.r.h1For(x.node)
		if h1 == nil {
			return nil, fmt.Errorf("node %s: URL %q is not http or https", x.node.Name, x.node.BaseURL)
		}
		head := upstream.Head{RequestID: x.call.RequestID, Traceparent: x.traceparent}
		if x.node.Key != "" {
			head.Authorization = x.node.authorization()[0]
		}
		resp, err := h1.Post(ctx, head, x.body)
		x.call.UpstreamTime = x.r.now().Sub(start)
		if err == nil {
			return resp, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			if x.upstreamRefused(x.backend.Class == tollgate.ClassNetwork && attempt < 3) {
				continue
			}
			// Nothing reached a model: no node could take the request.
			return nil, &tollgate.Error{Code: tollgate.CodeBackendUnavailable, RetryAfter: 2, Err: err,
				Message: "no backend of model " + x.model.ID + " can take the request now; retry shortly"}
		} else {
			x.upstreamFailed()
		}
		return nil, err
	}
}

func (x *exchange) noteServed() {
	x.call.Backend = x.backend.Class
	x.call.Node = x.node.Name
	if x.r.traffic != nil {
		x.r.traffic.Add(x.backend.Class)
	}
}

func (x *exchange) setServedHeaders(h http.Header) {
	x.nodeMu.Lock() // the stream watchdog may commit headers while send retries on another node
	node := x.node
	x.nodeMu.Unlock()
	// Shared values, set without canonicalising: the keys are canonical.
	h["X-Tollgate-Backend"] = classHeader(x.backend.Class)
	h["X-Tollgate-Node"] = node.nameHeader()
}

var (
	networkHeader  = []string{string(tollgate.ClassNetwork)}
	fallbackHeader = []string{string(tollgate.ClassFallback)}
)

func classHeader(c tollgate.BackendClass) []string {
	switch c {
	case tollgate.ClassNetwork:
		return networkHeader
	case tollgate.ClassFallback:
		return fallbackHeader
	}
	return []string{string(c)}
}

// classifyStatus turns an upstream non-2xx answer into the client's error and
// feeds passive health checks (5xx and 429 count against the node).
func (x *exchange) classifyStatus(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
		x.upstreamFailed()
	} else {
		x.upstreamOK() // a 4xx is the node answering
	}
	e := openai.ClassifyUpstreamError(x.node.Flavour, resp.StatusCode, body)
	// What the backend answered, so that an operator can fix, say, a wrong
	// upstream_model from the log alone.
	x.r.log.Warn("upstream error", "request_id", x.call.RequestID, "node", x.node.Name,
		"upstream_model", x.backend.UpstreamModel, "status", resp.StatusCode, "code", e.Code,
		"upstream_message", openai.LogReason(body))
	return e
}

// cost prices a usage at the serving backend's rates, plus the fee of
// searches web searches (search requests; 0 for the others).
func (x *exchange) cost(u openai.Usage, searches int64) (tollgate.Amount, error) {
	c, err := x.backend.Prices.Cost(u.PromptTokens, u.CompletionTokens)
	if err != nil || searches == 0 {
		return c, err
	}
	fee, err := tollgate.SearchFee(searches, x.model.SearchPrice)
	if err != nil {
		return 0, err
	}
	return c.Add(fee)
}

func (x *exchange) nonStream(w http.ResponseWriter, req *http.Request) (err error) {
	ctx, cancel := context.WithTimeout(req.Context(), x.r.opts.NonStreamTimeout)
	defer cancel()
	if x.r.tracer != nil {
		ctx = x.startBackendSpan(ctx)
		defer func() { x.endBackendSpan(x.call.Usage, "", err) }()
	}
	resp, err := x.send(ctx)
	if err != nil {
		return x.transportError(ctx, req, err)
	}
	nr, err := x.readAnswer(resp)
	if err != nil {
		return x.transportError(ctx, req, err)
	}
	u := nr.FinalUsage(x.promptEstimate)
	cost, err := x.served(u)
	if err != nil {
		return err
	}
	bufp := x.r.bufs.Get().(*[]byte)
	defer x.r.bufs.Put(bufp)
	out := nr.AppendJSON((*bufp)[:0], u, &cost)
	*bufp = out
	x.writeAnswer(w, out, u, cost)
	return nil
}

// served records a non-streamed answer with usage u as served: the node
// answered, the request is charged, and the access log told. It returns
// the amount charged.
func (x *exchange) served(u openai.Usage) (tollgate.Amount, error) {
	x.upstreamOK()
	cost, err := x.cost(u, 0)
	if err != nil {
		return 0, fmt.Errorf("price request: %w", err)
	}
	cost, err = x.settle(u, cost)
	if err != nil {
		x.call.Outcome = "failed"
		return 0, err
	}
	x.call.Usage, x.call.Cost, x.call.Outcome = u, cost, "served"
	x.noteServed()
	return cost, nil
}

// readAnswer reads a non-streamed upstream answer: the client's error for
// a non-2xx one, the normalised answer otherwise. It closes resp's body.
// A failure counts against the node (passive health).
func (x *exchange) readAnswer(resp *http.Response) (*openai.Response, error) {
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, x.classifyStatus(resp)
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, x.r.opts.MaxUpstreamBody))
	if err != nil {
		x.upstreamFailed()
		return nil, err
	}
	nr, err := openai.NormalizeResponse(raw, x.completionID(), x.model.ID, x.node.Flavour)
	if err != nil {
		x.upstreamFailed()
	}
	return nr, err
}

// writeAnswer writes a non-streamed 200: out, the final body, with the
// served request's headers.
func (x *exchange) writeAnswer(w http.ResponseWriter, out []byte, u openai.Usage, cost tollgate.Amount) {
	h := w.Header()
	h["Content-Type"] = jsonContentType // shared, never changed in place
	h.Set("Content-Length", strconv.Itoa(len(out)))
	x.setServedHeaders(h)
	h.Set("X-Tollgate-Cost", cost.String())
	if u.Estimated {
		h.Set("X-Tollgate-Usage-Estimated", "true")
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
}

// transportError maps a failed upstream exchange: our deadline is 504
// timeout, a client that went away gets nothing, anything else is 502.
func (x *exchange) transportError(ctx context.Context, req *http.Request, err error) error {
	var te *tollgate.Error
	if errors.As(err, &te) {
		return te
	}
	if req.Context().Err() != nil {
		x.call.Outcome = "disconnected"
		return &tollgate.Error{Code: tollgate.CodeUpstreamError, Message: "client closed the request", Err: err}
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		x.upstreamFailed()
		return &tollgate.Error{Code: tollgate.CodeTimeout, Err: err,
			Message: fmt.Sprintf("the model produced no answer within %s; the request was cancelled and not charged", x.r.opts.NonStreamTimeout)}
	}
	return &tollgate.Error{Code: tollgate.CodeUpstreamError, Err: err,
		Message: "the backend serving model " + x.model.ID + " failed before answering; nothing was charged"}
}
