package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/tollgate/tollgate/simulate"
)

// simulateCmd runs one simulated model server until interrupted.
type simulateCmd struct {
	stdout, stderr io.Writer
}

const simulateUsage = `Usage: tollgate simulate [flags]

Runs a simulated model server that answers like vLLM, SGLang, llama.cpp's
llama-server, Ollama's /v1 API, the OpenAI API or OpenRouter, quirks included.
Every request may override the behaviour with an "X-Sim: key=value ..." header
or a "[sim key=value ...]" marker in its last user message (see
docs/simulator.md).

With --search searxng|brave it serves a simulated web-search provider instead
(SearXNG's /search?format=json or Brave's /res/v1/web/search); --fault then
takes a search fault: 500, 403, slow, hang, garbage.

With --stripe it serves a simulated Stripe instead: the API for Checkout
Sessions, PaymentIntents, refunds and customers (point stripe-go's
BackendConfig.URL at it), the hosted Checkout page with Pay, Decline and Pay
later buttons, and signed webhooks to --stripe-webhook-url.

Flags:
`

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func (c *simulateCmd) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	var (
		flavour   = fs.String("flavour", "vllm", "server to imitate: vllm, sglang, llamacpp, ollama, openai, openrouter")
		listen    = fs.String("listen", "127.0.0.1:9001", "address to listen on")
		models    stringList
		modelPath = fs.String("model-path", "", "llamacpp: the model file path reported as the model (default /models/<model>.gguf)")
		ctxLen    = fs.Int("context", 8192, "context window in tokens")
		reasonKey = fs.String("reasoning-field", "", "override the reasoning field name: reasoning or reasoning_content")
		noTools   = fs.Bool("no-tools", false, "reject tools like a server without tool calling")
		noReason  = fs.Bool("no-reasoning", false, "a model that never reasons")
		noImages  = fs.Bool("no-images", false, "reject image parts like a text-only model")
		noPDF     = fs.Bool("no-pdf", false, "reject file parts")
		ttft      = fs.Duration("ttft", 0, "time to first token")
		gap       = fs.Duration("gap", 0, "time between streamed tokens")
		tokens    = fs.Int("tokens", 16, "content tokens per answer")
		reasonTok = fs.Int("reasoning-tokens", 8, "reasoning tokens when the model reasons")
		always    = fs.Bool("always-reason", false, "reason even when not asked (a thinking model)")
		noCalls   = fs.Bool("no-tool-calls", false, "answer with text even when tools are offered")
		calls     = fs.Int("tool-calls", 1, "tool calls made when tools are offered")
		cached    = fs.Int("cached", 0, "prompt tokens reported as cached")
		fault     = fs.String("fault", "", "fault for every request: "+faultNames())
		after     = fs.Int("fault-after", 2, "tokens streamed before stall, cut, malformed or stream_error")
		usageLast = fs.Bool("usage-on-last-delta", false, "stream usage on the finish chunk instead of its own chunk")
		inPrice   = fs.Float64("prompt-price", 1, "OpenRouter usage.cost: USD per million prompt tokens")
		outPrice  = fs.Float64("completion-price", 2, "OpenRouter usage.cost: USD per million completion tokens")
		noRecord  = fs.Bool("no-record", false, "do not keep received requests in memory")
		cacheTok  = fs.Int("prefix-cache-tokens", 0, "GPU: prefix cache capacity in tokens, blocks of 16 (0: no cache; reports cached_tokens from it)")
		prefill   = fs.Float64("prefill-tokens-per-sec", 0, "GPU: prefill rate of uncached prompt tokens, one prompt at a time (0: instant)")
		decode    = fs.Float64("decode-tokens-per-sec", 0, "GPU: generation rate when --gap is 0 (0: no gap)")
		maxConc   = fs.Int("max-concurrent", 0, "GPU: requests served at once; more wait their turn (0: unlimited)")
		kvEvents  = fs.String("kv-events", "", "GPU: publish the prefix cache's KV-cache events as vLLM's --kv-events-config does, on this ZeroMQ address (tcp://*:5557); needs --prefix-cache-tokens")
		kvReplay  = fs.String("kv-events-replay", "", "GPU: with --kv-events, the replay (ROUTER) socket's address (tcp://*:5558)")
		search    = fs.String("search", "", "serve a simulated search provider instead of a model server: searxng or brave")
		token     = fs.String("search-token", "", "brave: the only X-Subscription-Token accepted (default: any non-empty token)")
		noJSON    = fs.Bool("search-no-json", false, "searxng: JSON format not enabled (format=json answers 403)")
		slow      = fs.Duration("search-slow", 3*time.Second, "how long the search fault slow waits")
		stripeOn  = fs.Bool("stripe", false, "serve a simulated Stripe (API, Checkout page, webhooks) instead of a model server")
		sc        stripeFlags
	)
	fs.StringVar(&sc.key, "stripe-secret-key", "", "stripe: the only API key accepted (default: any sk_test_ key)")
	fs.StringVar(&sc.hookURL, "stripe-webhook-url", "", "stripe: the webhook endpoint events are POSTed to (default: none)")
	fs.StringVar(&sc.secret, "stripe-webhook-secret", "", "stripe: the endpoint's signing secret (default: a new whsec_ secret, printed)")
	fs.StringVar(&sc.events, "stripe-webhook-events", "", "stripe: comma-separated event types the endpoint receives (default: all)")
	fs.DurationVar(&sc.delay, "stripe-webhook-delay", 0, "stripe: wait before each webhook delivery")
	fs.IntVar(&sc.dups, "stripe-webhook-duplicates", 0, "stripe: extra copies of every event delivered")
	fs.StringVar(&sc.decline, "stripe-decline", "", "stripe: decline every payment with this decline code (generic_decline, insufficient_funds, ...)")
	fs.DurationVar(&sc.async, "stripe-async-delay", 5*time.Second, "stripe: how long a Pay later payment takes to settle")
	fs.DurationVar(&sc.lifetime, "stripe-session-lifetime", 24*time.Hour, "stripe: how long an unpaid Checkout Session stays open")
	fs.StringVar(&sc.public, "stripe-public-url", "", "stripe: base URL of the Checkout pages it hands out (default: the listen address)")
	fs.Var(&models, "model", "served model name (repeatable; default sim-model)")
	fs.Usage = func() {
		fmt.Fprint(c.stderr, simulateUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return flagErr(err)
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected arguments: %v", fs.Args())}
	}
	if *stripeOn {
		return c.runStripe(ctx, *listen, sc, *noRecord)
	}
	if *search != "" {
		return c.runSearch(ctx, *search, *listen, *fault, *token, *noJSON, *slow, *noRecord)
	}
	fl, err := simulate.ParseFlavour(*flavour)
	if err != nil {
		return usageError{err.Error()}
	}
	f, err := simulate.ParseFault(*fault)
	if err != nil {
		return usageError{err.Error()}
	}
	cfg := simulate.Config{
		Flavour:         fl,
		Models:          models,
		ModelPath:       *modelPath,
		ContextLength:   *ctxLen,
		ReasoningField:  *reasonKey,
		NoTools:         *noTools,
		NoReasoning:     *noReason,
		NoImages:        *noImages,
		NoPDF:           *noPDF,
		PromptPrice:     *inPrice,
		CompletionPrice: *outPrice,
		Behaviour: simulate.Behaviour{
			TTFT:             *ttft,
			TokenGap:         *gap,
			OutputTokens:     *tokens,
			ReasoningTokens:  *reasonTok,
			AlwaysReason:     *always,
			NoToolCalls:      *noCalls,
			ToolCalls:        *calls,
			CachedTokens:     *cached,
			Fault:            f,
			FaultAfter:       *after,
			UsageOnLastDelta: *usageLast,
		},
		GPU: simulate.GPU{PrefixCacheTokens: *cacheTok, PrefillTokensPerSec: *prefill,
			DecodeTokensPerSec: *decode, MaxConcurrent: *maxConc},
	}
	if *noRecord {
		cfg.MaxRecorded = -1
	} else {
		cfg.MaxRecorded = 1000
	}
	run, err := simulate.Listen(cfg, *listen)
	if err != nil {
		return err
	}
	if *kvEvents != "" {
		pub, err := run.PublishKVEvents(*kvEvents, *kvReplay)
		if err != nil {
			run.Close()
			return err
		}
		defer pub.Close()
		fmt.Fprintf(c.stdout, "publishing KV-cache events on %s (replay: %s)\n", pub.PubAddr(), cmp.Or(pub.ReplayAddr(), "none"))
	}
	prefix := "/v1"
	if fl == simulate.OpenRouter {
		prefix = "/api/v1 (and /v1)"
	}
	if len(models) == 0 {
		models = stringList{"sim-model"}
	}
	if f == simulate.FaultRefuse {
		// A server-wide refuse is a refused connection, as a dead node
		// gives: nothing listens on the port (the address is kept, so the
		// port stays this process's choice), connections get ECONNREFUSED.
		if err := run.RefuseConnections(true); err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "simulating %s on %s%s, refusing every connection (--fault refuse: the port is closed)\n", fl, run.URL(), prefix)
	} else {
		fmt.Fprintf(c.stdout, "simulating %s on %s%s, models %v\n", fl, run.URL(), prefix, []string(models))
	}
	<-ctx.Done()
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return run.Shutdown(shutdown)
}

// runSearch serves a simulated search provider until ctx ends.
func (c *simulateCmd) runSearch(ctx context.Context, provider, listen, fault, token string, noJSON bool, slow time.Duration, noRecord bool) error {
	fl, err := simulate.ParseSearchFlavour(provider)
	if err != nil {
		return usageError{err.Error()}
	}
	f, err := simulate.ParseSearchFault(fault)
	if err != nil {
		return usageError{err.Error()}
	}
	cfg := simulate.SearchConfig{Flavour: fl, Token: token, JSONDisabled: noJSON, SlowDelay: slow, Fault: f, MaxRecorded: 1000}
	if noRecord {
		cfg.MaxRecorded = -1
	}
	run, err := simulate.ListenSearch(cfg, listen)
	if err != nil {
		return err
	}
	path := "/search?q=...&format=json"
	if fl == simulate.Brave {
		path = "/res/v1/web/search?q=... (header X-Subscription-Token)"
	}
	fmt.Fprintf(c.stdout, "simulating %s search on %s%s\n", fl, run.URL(), path)
	<-ctx.Done()
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return run.Shutdown(shutdown)
}

// stripeFlags are the --stripe-* flags.
type stripeFlags struct {
	key, hookURL, secret, events, decline, public string
	delay, async, lifetime                        time.Duration
	dups                                          int
}

// runStripe serves a simulated Stripe until ctx ends.
func (c *simulateCmd) runStripe(ctx context.Context, listen string, f stripeFlags, noRecord bool) error {
	cfg := simulate.StripeConfig{SecretKey: f.key, PublicURL: f.public, WebhookURL: f.hookURL,
		WebhookSecret: f.secret, WebhookDelay: f.delay, WebhookDuplicates: f.dups, Decline: f.decline,
		AsyncDelay: f.async, SessionLifetime: f.lifetime, MaxRecorded: 1000}
	if f.events != "" {
		cfg.WebhookEvents = strings.Split(f.events, ",")
	}
	if noRecord {
		cfg.MaxRecorded = -1
	}
	run, err := simulate.ListenStripe(cfg, listen)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "simulating Stripe on %s (API %s/v1, Checkout pages %s/c/pay/...)\n", run.URL(), run.URL(), run.URL())
	if f.hookURL != "" {
		fmt.Fprintf(c.stdout, "webhooks to %s, signing secret %s\n", f.hookURL, run.WebhookSecret())
	} else {
		fmt.Fprintf(c.stdout, "no --stripe-webhook-url: events are kept, not sent (signing secret %s)\n", run.WebhookSecret())
	}
	<-ctx.Done()
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return run.Shutdown(shutdown)
}

func faultNames() string {
	var names []string
	for _, f := range simulate.Faults() {
		names = append(names, string(f))
	}
	return strings.Join(names, ", ")
}
