// Package simulate is a model-server simulator: an http.Handler that answers
// chat completions the way vLLM, SGLang, llama.cpp's llama-server, Ollama's
// /v1 endpoints, the OpenAI API and OpenRouter do, quirks included, with
// deterministic text and token counts (and vLLM's and SGLang's /tokenize,
// with the same tokenizer as their KV-cache events). It also imitates two web-search
// providers and Stripe (API, hosted Checkout page, signed webhooks).
// tollgate's tests, demo and benchmarks run against it; docs/simulator.md
// lists every quirk and its source.
//
// # API
//
//	srv := simulate.New(simulate.Config{Flavour: simulate.VLLM, Models: []string{"m"}})
//	ts := httptest.NewServer(srv)             // or:
//	run, err := simulate.Start(cfg)           // listens on 127.0.0.1:0
//	run.URL()                                 // "http://127.0.0.1:PORT" (+ "/v1"; OpenRouter also "/api/v1")
//	run.RefuseConnections(true)               // close listener and connections; false reopens the same port
//	run.Close()
//
// Types and functions:
//
//	type Flavour string       VLLM, SGLang, LlamaCpp, Ollama, OpenAI, OpenRouter; ParseFlavour, Flavours
//	type Fault string         FaultRefuse, Fault500, Fault503, FaultHang, FaultStall, FaultCut,
//	                          FaultMalformed, FaultNoUsage, FaultContextLength, FaultStreamError; ParseFault, Faults
//	type Config struct        Flavour, Models, ModelPath, ContextLength, ReasoningField,
//	                          NoTools, NoReasoning, NoImages, NoPDF, PromptPrice, CompletionPrice,
//	                          MaxRecorded, Behaviour, GPU
//	type GPU struct           PrefixCacheTokens, PrefillTokensPerSec, DecodeTokensPerSec, MaxConcurrent
//	type CacheStats struct    Requests, Hits, PromptTokens, CachedTokens, Blocks
//	const CacheBlockTokens    16: the prefix cache's block
//	type Behaviour struct     TTFT, TokenGap, OutputTokens, ReasoningTokens, AlwaysReason,
//	                          NoToolCalls, ToolCalls, CachedTokens, Fault, FaultAfter, UsageOnLastDelta,
//	                          NoSearch, Searches, SearchTurns, SearchFault, Cite, CiteForeign
//	func New(Config) *Server
//	func Start(Config) (*Running, error); func Listen(Config, addr string) (*Running, error)
//	(*Server) ServeHTTP, Flavour, Behaviour, SetBehaviour, SetFault, Stats, Requests,
//	          AllRequests, LastRequest, Reset, WaitStats, WaitIdle, CacheStats
//	(*Running) URL, Addr, RefuseConnections, Close, Shutdown (and every *Server method)
//	type Stats struct         Requests, InFlight, OpenStreams, Cancelled, Completed
//	type Recorded struct      Method, Path, Header, Body
//	type CiteStyle string     CiteMarkdown, CiteURL, CiteNumber, CiteAll, CiteNone; ParseCiteStyle
//	const ForeignURL          the URL cited with cite_foreign=1, never a search result
//
// Web search providers:
//
//	type SearchFlavour string SearXNG, Brave; ParseSearchFlavour
//	type SearchFault string   SearchFault500, SearchFault403, SearchFaultSlow, SearchFaultHang,
//	                          SearchFaultGarbage; ParseSearchFault, SearchFaults
//	type SearchConfig struct  Flavour, JSONDisabled, Token, SlowDelay, Fault, MaxRecorded
//	func NewSearch(SearchConfig) *Search
//	func StartSearch(SearchConfig) (*RunningSearch, error); func ListenSearch(SearchConfig, addr string) (*RunningSearch, error)
//	(*Search) ServeHTTP, Flavour, Fault, SetFault, Stats, Requests, LastRequest, Reset,
//	          WaitStats, WaitIdle
//	(*RunningSearch) URL, Addr, RefuseConnections, Close, Shutdown (and every *Search method)
//	type SearchStats struct   Requests, InFlight, Cancelled, Completed
//
// Stripe (test mode: Checkout Sessions, PaymentIntents, refunds, customers,
// the Checkout page at /c/pay/{id}, webhooks, operator actions under /_sim/):
//
//	const StripeAPIVersion    "2025-08-27.basil", stripe-go v82's
//	type StripeConfig struct  SecretKey, PublicURL, WebhookURL, WebhookSecret, WebhookEvents,
//	                          APIVersion, WebhookDelay, WebhookRetryBase, WebhookRetryMax,
//	                          WebhookAttempts, WebhookTimeout, WebhookClockSkew, WebhookDuplicates, Decline,
//	                          SessionLifetime, AsyncDelay, MaxRecorded
//	func NewStripe(StripeConfig) *Stripe
//	func StartStripe(StripeConfig) (*RunningStripe, error); func ListenStripe(StripeConfig, addr string) (*RunningStripe, error)
//	(*Stripe) ServeHTTP, Close, WebhookSecret, DeclineNext, Dispute, CloseDispute, Events,
//	          Deliveries, WaitDeliveries, SetWebhook, SetWebhookDelay, SetWebhookClockSkew, SetWebhookDuplicates,
//	          HoldWebhooks, ReleaseWebhooks, ResendEvent, RollWebhookSecret, Requests, LastRequest
//	(*RunningStripe) URL, RefuseConnections, Close, Shutdown (and every *Stripe method)
//	type StripeEvent struct   ID, Type, Payload (the exact bytes delivered)
//	type WebhookDelivery struct EventID, Type, Attempt, Copy, Status, Err, At; OK
//
// # Per-request switches
//
// A request overrides the server's Behaviour with a header
//
//	X-Sim: fault=stall after=5 gap=10ms
//	X-Sim-Fault: cut                     (one switch per X-Sim-<key> header)
//
// or with a marker anywhere in the text of its last user message
//
//	[sim fault=context_length]
//	[sim tokens=50 reasoning=10 tools=0 cached=100 ttft=200ms]
//
// The marker wins over the headers. Keys: fault (a Fault name or "none"),
// tokens, reasoning, tools, cached, after (integers), ttft, gap (Go durations
// or milliseconds), usage (last or separate); for web search: search (0
// disables it), searches, search_turns (integers), search_fault (a
// SearchFault name), cite (markdown, url, number, all, none), cite_foreign
// (0 or 1). See websearch.go and docs/simulator.md.
//
// # Determinism
//
// The same request (model and last user message) gives the same text and the
// same counts. Prompt tokens: 3 + per message 4 + ceil(bytes/4) of its text;
// an image part 85 + 1 per KiB, a file part 256 + 1 per KiB; tools
// ceil(bytes/4). Completion tokens: one per generated piece (reasoning
// included), a tool call ceil(len(arguments)/4) + 1. Ids and `created` are
// not deterministic.
package simulate
