package simulate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Recorded is one request as the simulator received it.
type Recorded struct {
	Method string
	Path   string // path and query
	Header http.Header
	Body   []byte
}

// Stats counts chat-completion requests (other paths are not counted).
type Stats struct {
	Requests    int64 // received
	InFlight    int64 // being answered now
	OpenStreams int64 // streamed answers being written now
	Cancelled   int64 // the client went away before the answer was complete
	Completed   int64 // answered to the end (error answers included)
}

// Server is a simulated model server; it is an http.Handler.
type Server struct {
	cfg          Config
	flavour      Flavour
	reasoningKey string
	models       map[string]bool
	modelList    []byte
	started      int64

	beh   atomic.Pointer[Behaviour]
	idSeq atomic.Uint64

	requests, inFlight, openStreams, cancelled, completed atomic.Int64

	changed  signal    // wakes WaitStats when a counter changes
	recorded recordLog // chat requests
	all      recordLog // every request

	bufs sync.Pool
	gpu  *gpu // nil: no GPU timing or prefix cache
}

// New builds a simulated server. It panics on an unknown flavour (a
// programming error; use ParseFlavour for user input).
func New(cfg Config) *Server {
	if _, err := ParseFlavour(string(cfg.Flavour)); err != nil {
		panic("simulate.New: " + err.Error())
	}
	if len(cfg.Models) == 0 {
		cfg.Models = []string{"sim-model"}
	}
	if cfg.ContextLength <= 0 {
		cfg.ContextLength = 8192
	}
	if cfg.ModelPath == "" {
		cfg.ModelPath = "/models/" + cfg.Models[0] + ".gguf"
	}
	if cfg.PromptPrice == 0 && cfg.CompletionPrice == 0 {
		cfg.PromptPrice, cfg.CompletionPrice = 1, 2
	}
	if cfg.MaxRecorded == 0 {
		cfg.MaxRecorded = 10000
	}
	s := &Server{cfg: cfg, flavour: cfg.Flavour, started: time.Now().Unix(),
		recorded: recordLog{max: cfg.MaxRecorded}, all: recordLog{max: cfg.MaxRecorded}}
	s.reasoningKey = cfg.ReasoningField
	if s.reasoningKey == "" {
		switch cfg.Flavour {
		case LlamaCpp, SGLang:
			s.reasoningKey = "reasoning_content"
		default:
			s.reasoningKey = "reasoning"
		}
	}
	s.models = make(map[string]bool)
	for _, m := range cfg.Models {
		s.models[m] = true
		if cfg.Flavour == Ollama && !strings.Contains(m, ":") {
			s.models[m+":latest"] = true
		}
	}
	s.modelList = s.renderModels()
	b := cfg.Behaviour
	s.beh.Store(&b)
	s.bufs.New = func() any { b := make([]byte, 0, 4096); return &b }
	s.gpu = newGPU(cfg.GPU)
	return s
}

// Flavour reports which server this one imitates.
func (s *Server) Flavour() Flavour { return s.flavour }

// Behaviour returns the server's current behaviour.
func (s *Server) Behaviour() Behaviour { return *s.beh.Load() }

// SetBehaviour replaces the server's behaviour for requests that start after
// the call (safe while serving).
func (s *Server) SetBehaviour(b Behaviour) { s.beh.Store(&b) }

// SetFault changes only the server-wide fault.
func (s *Server) SetFault(f Fault) {
	b := s.Behaviour()
	b.Fault = f
	s.SetBehaviour(b)
}

// Stats returns the counters.
func (s *Server) Stats() Stats {
	return Stats{
		Requests:    s.requests.Load(),
		InFlight:    s.inFlight.Load(),
		OpenStreams: s.openStreams.Load(),
		Cancelled:   s.cancelled.Load(),
		Completed:   s.completed.Load(),
	}
}

// Requests returns the chat-completion requests received, oldest first.
func (s *Server) Requests() []Recorded { return s.recorded.all() }

// AllRequests returns every request received (health checks and model lists
// included), oldest first.
func (s *Server) AllRequests() []Recorded { return s.all.all() }

// LastRequest returns the latest chat-completion request.
func (s *Server) LastRequest() (Recorded, bool) { return s.recorded.last() }

// Reset forgets recorded requests and zeroes the counters (requests in flight
// still decrement InFlight and OpenStreams when they end).
func (s *Server) Reset() {
	s.recorded.reset()
	s.all.reset()
	s.requests.Store(0)
	s.cancelled.Store(0)
	s.completed.Store(0)
	s.notify()
}

// WaitStats waits until cond holds for the counters, or timeout passes.
func (s *Server) WaitStats(timeout time.Duration, cond func(Stats) bool) error {
	return waitFor(&s.changed, timeout, s.Stats, cond)
}

// WaitIdle waits until no chat-completion request is in flight.
func (s *Server) WaitIdle(timeout time.Duration) error {
	return s.WaitStats(timeout, func(st Stats) bool { return st.InFlight == 0 && st.OpenStreams == 0 })
}

func (s *Server) notify() { s.changed.notify() }

func (s *Server) record(r *http.Request, body []byte, chat bool) {
	if s.cfg.MaxRecorded < 0 {
		return
	}
	rec := Recorded{Method: r.Method, Path: r.URL.RequestURI(), Header: r.Header.Clone()}
	if body != nil {
		rec.Body = bytes.Clone(body)
	}
	if chat {
		s.recorded.add(rec)
	}
	s.all.add(rec)
}

// ServeHTTP routes like the imitated server.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if s.flavour == OpenRouter && strings.HasPrefix(path, "/api/v1/") {
		path = path[len("/api"):]
	}
	if s.flavour == LlamaCpp && (path == "/chat/completions" || path == "/models") {
		path = "/v1" + path
	}
	switch path {
	case "/v1/chat/completions":
		if r.Method != http.MethodPost {
			s.record(r, nil, false)
			s.methodNotAllowed(w, r)
			return
		}
		s.chat(w, r)
		return
	}
	if s.tokenizePath(path) {
		s.tokenize(w, r)
		return
	}
	s.record(r, nil, false)
	switch {
	case path == "/v1/models" && r.Method == http.MethodGet:
		w.Header().Set("Content-Type", s.jsonType())
		w.Write(s.modelList)
	case s.metricsPath(path) && r.Method == http.MethodGet:
		s.metrics(w)
	case s.healthPath(path):
		// vLLM and SGLang declare their health routes with FastAPI's
		// @get, which answers HEAD 405; llama.cpp's HTTP library serves
		// HEAD with the GET handler (the body is dropped).
		switch {
		case r.Method == http.MethodGet, r.Method == http.MethodHead && s.flavour == LlamaCpp:
			s.health(w)
		case s.flavour == LlamaCpp:
			s.notFound(w, r)
		default:
			w.Header().Set("Allow", "GET")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusMethodNotAllowed)
			io.WriteString(w, `{"detail":"Method Not Allowed"}`)
		}
	case s.flavour == Ollama && (path == "/" || path == "/api/version"):
		// Ollama registers HEAD and GET for both (server/routes.go); any
		// other method is gin's 405 naming them, HEAD first as registered.
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "HEAD, GET")
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusMethodNotAllowed)
			io.WriteString(w, "405 method not allowed")
			return
		}
		if path == "/" {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			io.WriteString(w, "Ollama is running")
			return
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		io.WriteString(w, `{"version":"0.0.0"}`)
	default:
		s.notFound(w, r)
	}
}

// healthPath reports whether path is one of the flavour's health
// endpoints: vLLM's /health; SGLang's /health and /health_generate (the
// same handler); llama.cpp's /health and /v1/health.
func (s *Server) healthPath(path string) bool {
	switch s.flavour {
	case VLLM:
		return path == "/health"
	case SGLang:
		return path == "/health" || path == "/health_generate"
	case LlamaCpp:
		return path == "/health" || path == "/v1/health"
	}
	return false
}

func (s *Server) jsonType() string {
	if s.flavour == LlamaCpp {
		return "application/json; charset=utf-8"
	}
	return "application/json"
}

func (s *Server) health(w http.ResponseWriter) {
	switch f := s.Behaviour().Fault; {
	case s.flavour == LlamaCpp && f == Fault503:
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`)
	case f == Fault503:
		w.WriteHeader(http.StatusServiceUnavailable)
	case f == Fault500:
		w.WriteHeader(http.StatusInternalServerError)
	case s.flavour == LlamaCpp:
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		io.WriteString(w, `{"status":"ok"}`)
	default:
		w.WriteHeader(http.StatusOK)
	}
}

func (s *Server) notFound(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	switch s.flavour {
	case LlamaCpp:
		h.Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"error":{"message":"File Not Found","type":"not_found_error","code":404}}`)
	case Ollama:
		h.Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, "404 page not found")
	case VLLM, SGLang:
		h.Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"detail":"Not Found"}`)
	case OpenAI:
		h.Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		b := s.appendOpenAIError(nil, "Invalid URL ("+r.Method+" "+r.URL.Path+")", "invalid_request_error", "", "")
		w.Write(b)
	default:
		h.Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"error":{"message":"Not Found","code":404}}`)
	}
}

func (s *Server) methodNotAllowed(w http.ResponseWriter, r *http.Request) {
	switch s.flavour {
	case Ollama:
		w.Header().Set("Allow", "POST")
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusMethodNotAllowed)
		io.WriteString(w, "405 method not allowed")
	case VLLM, SGLang:
		w.Header().Set("Allow", "POST")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusMethodNotAllowed)
		io.WriteString(w, `{"detail":"Method Not Allowed"}`)
	default: // llama.cpp, OpenAI, OpenRouter answer as for an unknown path
		s.notFound(w, r)
	}
}

// ---- chat completions ----

func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	s.inFlight.Add(1)
	s.notify()
	done := false
	defer func() {
		s.inFlight.Add(-1)
		if done {
			s.completed.Add(1)
		} else {
			s.cancelled.Add(1)
		}
		s.notify()
	}()

	bp := s.bufs.Get().(*[]byte)
	defer func() {
		if cap(*bp) <= 1<<20 {
			s.bufs.Put(bp)
		}
	}()
	body, err := readAll(r.Body, (*bp)[:0])
	*bp = body
	if err != nil {
		return // client went away while sending
	}
	s.record(r, body, true)

	beh := s.Behaviour()
	var ov override
	if err := ov.fromHeaders(r.Header); err != nil {
		s.writeError(w, &apiError{kind: errInvalid, message: "simulate: " + err.Error()})
		done = true
		return
	}
	beh = ov.apply(beh)

	// Faults that happen before the request is even read.
	if answered, completed := s.earlyFault(w, r, beh.Fault); answered {
		done = completed
		return
	}

	req, perr := parseChat(body)
	if perr != nil {
		s.parseError(w, body, perr)
		done = true
		return
	}
	// The marker in the last user message overrides the headers.
	var mov override
	if err := mov.fromMarker(req.lastUser); err != nil {
		s.writeError(w, &apiError{kind: errInvalid, message: "simulate: " + err.Error()})
		done = true
		return
	}
	if mov.set {
		beh = mov.apply(beh)
		if answered, completed := s.earlyFault(w, r, beh.Fault); answered {
			done = completed
			return
		}
	}

	if apiErr := s.validate(req, beh); apiErr != nil {
		s.writeError(w, apiErr)
		done = true
		return
	}
	// tools=N given with the request also asks for client tool calls in a
	// turn that searches.
	clientCalls := 0
	if ov.tools || mov.tools {
		clientCalls = beh.ToolCalls
	}
	p := s.plan(req, beh, clientCalls)
	if s.gpu != nil {
		release, ok := s.gpu.admit(r.Context(), req, p, &beh, ov.cached || mov.cached)
		defer release()
		if !ok {
			return
		}
	}
	if req.stream {
		done = s.stream(w, r, p, beh)
		return
	}
	done = s.complete(w, r, p, beh)
}

// earlyFault answers the faults that need nothing of the request (refuse,
// hang, 500, 503); answered is false for the others, completed false for a
// hang (the client gave up).
func (s *Server) earlyFault(w http.ResponseWriter, r *http.Request, f Fault) (answered, completed bool) {
	switch f {
	case FaultRefuse:
		abort(w)
	case FaultHang:
		<-r.Context().Done()
		return true, false
	case Fault500:
		s.writeError(w, &apiError{kind: errInternal})
	case Fault503:
		s.writeError(w, &apiError{kind: errOverload})
	default:
		return false, false
	}
	return true, true
}

// parseError answers a body parseChat refused: a field of the wrong type
// or a body that is not JSON.
func (s *Server) parseError(w http.ResponseWriter, body []byte, err error) {
	var fe *fieldError
	if errors.As(err, &fe) {
		s.writeError(w, &apiError{kind: errInvalid, message: fe.msg, param: fe.param})
	} else {
		s.writeError(w, &apiError{kind: errMalformed, message: malformedDetail(s.flavour, body, err)})
	}
}

// validate applies the flavour's checks, in the order the real server does.
func (s *Server) validate(req *chatRequest, beh Behaviour) *apiError {
	if !req.hasMessages {
		return &apiError{kind: errNoMessages, param: "messages"}
	}
	if req.nMessages == 0 && s.flavour != LlamaCpp {
		return &apiError{kind: errEmptyMessages, param: "messages"}
	}
	switch s.flavour {
	case LlamaCpp, SGLang:
		// llama.cpp answers whatever model was named; SGLang serves one model
		// and does not check the name.
	case VLLM:
		if req.hasModel && !s.models[req.model] {
			return &apiError{kind: errUnknownModel, message: req.model, param: "model"}
		}
	default:
		if !s.models[req.model] {
			return &apiError{kind: errUnknownModel, message: req.model, param: "model"}
		}
	}
	if beh.Fault == FaultContextLength || req.promptTokens > s.cfg.ContextLength ||
		(s.flavour == VLLM && req.promptTokens >= s.cfg.ContextLength) {
		prompt := req.promptTokens
		if prompt <= s.cfg.ContextLength {
			prompt = s.cfg.ContextLength + 1
		}
		return &apiError{kind: errContext, prompt: prompt, param: "messages"}
	}
	if s.cfg.NoImages && req.images > 0 {
		return &apiError{kind: errCapability, capName: "image", message: req.model, param: "messages"}
	}
	if s.cfg.NoPDF && req.files > 0 {
		return &apiError{kind: errCapability, capName: "file", message: req.model, param: "messages"}
	}
	if s.cfg.NoTools && req.toolsRaw != nil && req.toolChoice != "none" {
		return &apiError{kind: errCapability, capName: "tools", message: req.model, param: "tools"}
	}
	if s.cfg.NoReasoning && req.reasoningAsked && s.flavour == OpenAI {
		return &apiError{kind: errCapability, capName: "reasoning", message: req.model, param: "reasoning_effort"}
	}
	return nil
}

// plan decides the whole answer.
func (s *Server) plan(req *chatRequest, beh Behaviour, clientCalls int) *plan {
	p := &plan{created: time.Now().Unix(), prompt: req.promptTokens, stream: req.stream}
	p.id = s.newID()
	p.model = req.model
	switch {
	case s.flavour == LlamaCpp:
		p.model = s.cfg.ModelPath
	case p.model == "":
		p.model = s.cfg.Models[0]
	}
	p.includeUsage = req.includeUsage || s.flavour == OpenRouter
	switch s.flavour {
	case VLLM: // should_include_usage: only with include_usage
		p.continuousUsage = req.continuousUsage && req.includeUsage
	case SGLang: // serving_chat: continuous_usage_stats alone suffices
		p.continuousUsage = req.continuousUsage
	}
	p.hideReason = s.flavour == OpenAI || (s.flavour == OpenRouter && req.reasoningExclude)
	p.cached = min(beh.CachedTokens, p.prompt)

	// Output cap: Ollama reads max_tokens only; the others prefer
	// max_completion_tokens. 0 is treated as 1 (llama.cpp and Ollama do).
	limit := req.maxTokens
	if s.flavour != Ollama && req.maxCompletion >= 0 {
		limit = req.maxCompletion
	}
	if limit == 0 {
		limit = 1
	}
	n := req.n
	if n < 1 || s.flavour == Ollama {
		n = 1
	}
	n = min(n, 16)

	outTokens := beh.OutputTokens
	if outTokens <= 0 {
		outTokens = 16
	}
	reasonTokens := 0
	reason := !s.cfg.NoReasoning && !req.reasoningOff && (beh.AlwaysReason || req.reasoningAsked)
	if s.flavour == Ollama {
		// Ollama ignores the reasoning controls (real-servers README; capture
		// thinking/59: think false, still reasoning): a thinking model
		// reasons, another does not, whatever the request says.
		reason = !s.cfg.NoReasoning && beh.AlwaysReason
	}
	if reason {
		reasonTokens = beh.ReasoningTokens
		if reasonTokens <= 0 {
			reasonTokens = 8
		}
	}
	var tools []toolDef
	wantTools := req.toolsRaw != nil && !s.cfg.NoTools && !beh.NoToolCalls &&
		(req.toolChoice != "none" || s.flavour == Ollama)
	ws := s.searchPlan(req, beh)
	if wantTools {
		tools = withoutWebSearch(req.tools(), ws.offered)
		if req.toolChoice == "function" && req.toolChoiceName != "" && s.flavour != LlamaCpp && s.flavour != Ollama {
			for _, t := range tools {
				if t.Function.Name == req.toolChoiceName {
					tools = []toolDef{t}
					break
				}
			}
		}
	}
	nCalls := beh.ToolCalls
	if nCalls <= 0 {
		nCalls = 1
	}

	seed := fnv(req.lastUser, fnv([]byte(req.model), 0))
	p.choices = make([]choicePlan, n)
	for i := range p.choices {
		c := &p.choices[i]
		cs := seed + uint64(i)*7919
		budget := -1
		if limit > 0 {
			budget = limit
		}
		take := func(want int) int {
			if budget < 0 {
				return want
			}
			got := min(want, budget)
			budget -= got
			return got
		}
		r := take(reasonTokens)
		c.reasoning = make([]string, 0, r)
		for k := 0; k < r; k++ {
			c.reasoning = append(c.reasoning, piece(reasoningWords[:], reasoningSpaced, cs, k))
		}
		c.reasonTok = r
		c.tokens = r
		c.finish = "stop"
		if r < reasonTokens {
			c.finish = "length"
			continue
		}
		if ws.mode == searchCall {
			for _, q := range ws.queries {
				tc := toolCall{id: s.newToolID(), name: webSearchName, args: searchArgs(q)}
				c.tools = append(c.tools, tc)
				c.tokens += toolTokens(tc)
			}
			for k := 0; k < clientCalls && len(tools) > 0; k++ {
				t := tools[k%len(tools)]
				tc := toolCall{id: s.newToolID(), name: t.Function.Name, args: toolArgs(t.Function.Parameters)}
				c.tools = append(c.tools, tc)
				c.tokens += toolTokens(tc)
			}
			c.finish = "tool_calls"
			continue
		}
		if ws.mode == searchAnswer {
			want := ws.answer(cs)
			got := take(len(want))
			c.content = want[:got]
			c.tokens += got
			if got < len(want) {
				c.finish = "length"
			}
			if stopped := false; len(req.stop) > 0 {
				c.content, stopped = applyStop(c.content, req.stop)
				if stopped {
					c.tokens = r + len(c.content)
					c.finish = "stop"
				}
			}
			continue
		}
		if len(tools) > 0 {
			for k := 0; k < nCalls; k++ {
				t := tools[k%len(tools)]
				tc := toolCall{id: s.newToolID(), name: t.Function.Name, args: toolArgs(t.Function.Parameters)}
				c.tools = append(c.tools, tc)
				c.tokens += toolTokens(tc)
			}
			c.finish = "tool_calls"
			continue
		}
		// Fixed content: constrained output (an instance of the
		// response_format schema, as a grammar-constrained server gives),
		// or the echo of the prompt; a few bytes a token.
		var fixed []string
		switch {
		case req.jsonSchema != nil:
			var doc map[string]any
			_ = json.Unmarshal(req.jsonSchema, &doc)
			fixed = fragments(string(appendSchemaValue(nil, doc, 0)))
		case beh.Echo:
			fixed = fragments(echoText(req.lastUser))
		}
		if fixed != nil {
			got := take(len(fixed))
			c.content = fixed[:got]
			c.tokens += got
			if got < len(fixed) {
				c.finish = "length"
			}
			continue
		}
		want := outTokens
		got := take(want)
		c.content = make([]string, 0, got)
		for k := 0; k < got; k++ {
			if k == want-1 && want > 1 {
				c.content = append(c.content, ".")
				continue
			}
			c.content = append(c.content, piece(contentWords[:], contentSpaced, cs, k))
		}
		c.tokens += got
		if got < want {
			c.finish = "length"
		}
		if stopped := false; len(req.stop) > 0 {
			c.content, stopped = applyStop(c.content, req.stop)
			if stopped {
				c.tokens = r + len(c.content)
				c.finish = "stop"
			}
		}
	}
	if s.flavour == LlamaCpp && req.reasoningInline {
		for i := range p.choices {
			inlineReasoning(&p.choices[i], p.choices[i].reasonTok == reasonTokens)
		}
	}
	for i := range p.choices {
		if s.flavour == LlamaCpp && i > 0 {
			break // llama.cpp reports the first choice's tokens only
		}
		p.completion += p.choices[i].tokens
		p.reasoning += p.choices[i].reasonTok
	}
	return p
}

// inlineReasoning moves c's reasoning into its content between <think> and
// </think> (the closing tag only when the reasoning was not cut short), as
// llama.cpp leaves it when asked not to extract it (reasoningInline). The
// tokens stay in the completion; none count as reasoning.
func inlineReasoning(c *choicePlan, complete bool) {
	if len(c.reasoning) == 0 {
		return
	}
	think := c.reasoning
	think[0] = "<think>" + think[0]
	if complete {
		think[len(think)-1] += "</think>"
	}
	c.content = append(think, c.content...)
	c.reasoning, c.reasonTok = nil, 0
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

const alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

func appendRand(b []byte, seq uint64, n int, alphabet string) []byte {
	x := splitmix(seq)
	for i := 0; i < n; i++ {
		if i%8 == 7 {
			x = splitmix(x)
		}
		b = append(b, alphabet[x%uint64(len(alphabet))])
		x /= uint64(len(alphabet))
	}
	return b
}

func (s *Server) newID() string {
	seq := s.idSeq.Add(1)
	var b [64]byte
	out := b[:0]
	switch s.flavour {
	case LlamaCpp:
		out = appendRand(append(out, "chatcmpl-"...), seq, 32, alnum)
	case Ollama:
		out = strconv.AppendUint(append(out, "chatcmpl-"...), splitmix(seq)%1000, 10)
	case VLLM:
		out = appendRand(append(out, "chatcmpl-"...), seq, 32, hexDigits)
	case SGLang:
		out = appendRand(out, seq, 32, hexDigits)
	case OpenAI:
		out = appendRand(append(out, "chatcmpl-"...), seq, 29, alnum)
	default:
		out = strconv.AppendInt(append(out, "gen-"...), time.Now().Unix(), 10)
		out = appendRand(append(out, '-'), seq, 20, alnum)
	}
	return string(out)
}

func (s *Server) newToolID() string {
	seq := s.idSeq.Add(1) ^ 0x5bd1e995
	var b [64]byte
	out := b[:0]
	switch s.flavour {
	case LlamaCpp, Ollama:
		out = appendRand(out, seq, 32, alnum)
	case VLLM:
		out = appendRand(append(out, "chatcmpl-tool-"...), seq, 32, hexDigits)
	case SGLang:
		out = appendRand(append(out, "call_"...), seq, 24, hexDigits)
	default:
		out = appendRand(append(out, "call_"...), seq, 24, alnum)
	}
	return string(out)
}

// sleep waits d; false when the client went away first.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// complete writes a non-streamed answer; false when the client went away.
func (s *Server) complete(w http.ResponseWriter, r *http.Request, p *plan, beh Behaviour) bool {
	wait := beh.TTFT + time.Duration(p.completion)*beh.TokenGap
	if !sleep(r.Context(), wait) {
		return false
	}
	bp := s.bufs.Get().(*[]byte)
	b := s.appendCompletion((*bp)[:0], p, beh)
	if beh.Fault == FaultMalformed {
		b = b[:len(b)/2] // a 200 whose body stops in the middle of the JSON
	}
	h := w.Header()
	h.Set("Content-Type", s.jsonType())
	h.Set("Content-Length", strconv.Itoa(len(b)))
	if s.flavour == LlamaCpp {
		h.Set("Server", "llama.cpp")
	}
	_, err := w.Write(b)
	*bp = b
	s.bufs.Put(bp)
	return err == nil
}

// abort closes the connection without an answer (a hijack where possible,
// else the handler abort that net/http and HTTP/2 both honour).
func abort(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

func readAll(r io.Reader, b []byte) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			if err == io.EOF {
				return b, nil
			}
			return b, err
		}
	}
}
