package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/operator"
	"github.com/tollgate/tollgate/payments"
	"github.com/tollgate/tollgate/simulate"
)

// demoCmd is `tollgate demo`: the whole service on one machine with
// simulated model servers, so a newcomer can point an OpenAI client at it.
type demoCmd struct {
	stdout, stderr io.Writer
}

// demoSimulators are the model servers the demo starts, one per flavour
// (two vLLM nodes so the coder's network has a pool). Each takes prompts as
// long as the catalogue's context_length of every model it serves
// (demoConfig), so a prompt the catalogue admits is not refused by its node.
var demoSimulators = []struct {
	name string
	cfg  simulate.Config
}{
	{name: "vllm-a", cfg: simulate.Config{Flavour: simulate.VLLM, Models: []string{"qwen3-coder-30b"}, ContextLength: 131072, NoReasoning: true}},
	{name: "vllm-b", cfg: simulate.Config{Flavour: simulate.VLLM, Models: []string{"qwen3-coder-30b"}, ContextLength: 131072, NoReasoning: true}},
	{name: "sglang", cfg: simulate.Config{Flavour: simulate.SGLang, Models: []string{"llama-3.3-70b"}, ContextLength: 65536, NoImages: true, NoPDF: true}},
	{name: "llamacpp", cfg: simulate.Config{Flavour: simulate.LlamaCpp, Models: []string{"llama-3.3-70b"}, ContextLength: 65536, NoImages: true, NoPDF: true}},
	{name: "ollama", cfg: simulate.Config{Flavour: simulate.Ollama, Models: []string{"gemma3:4b"}, ContextLength: 32768, NoTools: true, NoReasoning: true, NoImages: true, NoPDF: true}},
	{name: "openrouter", cfg: simulate.Config{Flavour: simulate.OpenRouter, Models: []string{"anthropic/claude-sonnet-4.5", "google/gemma-3-4b-it"}, ContextLength: 131072, NoPDF: true}},
	{name: "openai", cfg: simulate.Config{Flavour: simulate.OpenAI, Models: []string{"gpt-4.1"}, ContextLength: 65536, NoImages: true, NoPDF: true}},
}

// demoConfig is the demo's catalogue. It is built to show every rule
// (web search, served through a simulated SearXNG, on every model with tools):
// only the coder reads images and PDFs; the coder's network reads PDFs but
// does not reason while its fallback reasons but reads no PDFs (so PDF +
// reasoning is capability_combination_unsupported); the cheap model has
// neither tools nor reasoning.
const demoConfig = `# tollgate demo config: written by 'tollgate demo' at every start (the
# simulated servers get new ports each run). Your accounts and keys live in
# the database beside it and are kept across runs.
listen:
  api: {{api}}
  admin: {{admin}}                 # /healthz, /readyz, /metrics, the admin API (loopback only)
admin_token_env: TOLLGATE_DEMO_ADMIN_TOKEN
store:
  sqlite: tollgate.db
health:
  interval: 5s
search:
  provider: searxng                # a simulated SearXNG instance
  url: "{{searxng}}"
  price: "0.004"                   # USD per search that ran
models:
  - id: tg-coder
    kind: coder
    context_length: 131072
    max_output_tokens: 16384
    backends:
      - class: network
        upstream_model: qwen3-coder-30b
        capabilities: [tools, image_input, pdf_input]
        rates: {input: "0.30", output: "1.20"}
        nodes:
          - {name: gpu-a, url: "{{vllm-a}}/v1", flavour: vllm, max_concurrent: 64}
          - {name: gpu-b, url: "{{vllm-b}}/v1", flavour: vllm, max_concurrent: 64}
      - class: fallback
        upstream_model: anthropic/claude-sonnet-4.5
        url: "{{openrouter}}/api/v1"
        flavour: openrouter
        capabilities: [tools, reasoning, image_input]
        rates: {input: "3.30", output: "16.50"}
  - id: tg-chat
    kind: chat
    context_length: 65536
    max_output_tokens: 8192
    backends:
      - class: network
        upstream_model: llama-3.3-70b
        capabilities: [tools, reasoning]
        rates: {input: "0.12", output: "0.40"}
        nodes:
          - {name: gpu-c, url: "{{sglang}}/v1", flavour: sglang, max_concurrent: 64}
          - {name: gpu-d, url: "{{llamacpp}}/v1", flavour: llamacpp, max_concurrent: 8}
      - class: fallback
        upstream_model: gpt-4.1
        url: "{{openai}}/v1"
        flavour: openai
        capabilities: [tools, reasoning]
        rates: {input: "2.20", output: "8.80"}
  - id: tg-mini
    kind: cheap
    context_length: 32768
    max_output_tokens: 4096
    backends:
      - class: network
        upstream_model: "gemma3:4b"
        capabilities: []
        rates: {input: "0.02", output: "0.04"}
        nodes:
          - {name: gpu-e, url: "{{ollama}}/v1", flavour: ollama, max_concurrent: 32}
      - class: fallback
        upstream_model: google/gemma-3-4b-it
        url: "{{openrouter}}/api/v1"
        flavour: openrouter
        capabilities: []
        rates: {input: "0.044", output: "0.088"}
`

func (c *demoCmd) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	dir := fs.String("dir", "tollgate-demo", "directory for the demo's config and database (reused on the next run)")
	listen := fs.String("listen", "127.0.0.1:8080", "API address (a free port is taken if this one is busy)")
	credit := fs.String("credit", "10", "USD credited to the demo account when it is created")
	logLevel := fs.String("log-level", "warn", "debug, info, warn or error")
	fs.Usage = func() {
		fmt.Fprintln(c.stderr, "Usage: tollgate demo [--dir DIR] [--listen ADDR] [--credit USD] [--log-level LEVEL]")
		fmt.Fprintln(c.stderr, "\nRuns tollgate with simulated model servers, a demo account and a key.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return flagErr(err)
	}
	log, err := newLogger(c.stderr, *logLevel)
	if err != nil {
		return usageError{err.Error()}
	}
	amount, err := parseUSD("--credit", *credit, true)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	unlock, err := lockDemoDir(*dir)
	if err != nil {
		return err
	}
	defer unlock()
	urls := map[string]string{}
	for _, s := range demoSimulators {
		run, err := simulate.Start(s.cfg)
		if err != nil {
			return fmt.Errorf("start simulated %s: %w", s.name, err)
		}
		defer run.Close()
		urls[s.name] = run.URL()
	}
	searx, err := simulate.StartSearch(simulate.SearchConfig{Flavour: simulate.SearXNG})
	if err != nil {
		return fmt.Errorf("start simulated search provider: %w", err)
	}
	defer searx.Close()
	urls["searxng"] = searx.URL()
	// The simulated Stripe: its Checkout page takes the payment and its
	// webhooks reach the api listener's /webhooks/stripe, once that listens.
	stripe, err := simulate.StartStripe(simulate.StripeConfig{SecretKey: demoStripeKey})
	if err != nil {
		return fmt.Errorf("start simulated Stripe: %w", err)
	}
	defer stripe.Close()
	urls["stripe"] = stripe.URL()
	os.Setenv("TOLLGATE_DEMO_STRIPE_KEY", demoStripeKey)
	os.Setenv("TOLLGATE_DEMO_STRIPE_WEBHOOK_SECRET", stripe.WebhookSecret())
	urls["admin"] = "127.0.0.1:0"
	adminToken, err := ensureDemoAdminToken(*dir)
	if err != nil {
		return err
	}
	os.Setenv("TOLLGATE_DEMO_ADMIN_TOKEN", adminToken)
	// The api address is fixed before the config is written: the payment
	// page sends the account holder back to the console there.
	if urls["api"], err = demoAPIAddr(*listen); err != nil {
		return err
	}
	text := demoConfig + demoPayments
	for k, v := range urls {
		text = strings.ReplaceAll(text, "{{"+k+"}}", v)
	}
	cfgPath := filepath.Join(*dir, "tollgate.yaml")
	if err := os.WriteFile(cfgPath, []byte(text), 0o644); err != nil {
		return err
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		return err
	}
	m := &Main{Config: cfg, Log: log}
	if err := m.Open(ctx); err != nil {
		return err
	}
	secret, err := ensureDemoKey(ctx, m.Store, *dir, amount)
	if err != nil {
		m.Close(context.Background())
		return err
	}
	k, _, err := m.Store.KeyByHash(ctx, tollgate.HashKey(secret))
	if err != nil {
		m.Close(context.Background())
		return err
	}
	invite, err := demoInvite(ctx, m.Store, k.AccountID)
	if err != nil {
		m.Close(context.Background())
		return err
	}
	base := m.APIURL()
	site := strings.TrimSuffix(base, "/v1")
	stripe.SetWebhook(site + payments.WebhookPath)
	fmt.Fprintf(c.stdout, `tollgate demo is running (config and database in %s/).

  export OPENAI_BASE_URL=%s
  export OPENAI_API_KEY=%s

  curl -s $OPENAI_BASE_URL/chat/completions \
    -H "Authorization: Bearer $OPENAI_API_KEY" -H "Content-Type: application/json" \
    -d '{"model":"tg-chat","messages":[{"role":"user","content":"Say hello"}]}'

  curl -s $OPENAI_BASE_URL/chat/completions \
    -H "Authorization: Bearer $OPENAI_API_KEY" -H "Content-Type: application/json" \
    -d '{"model":"tg-chat","web_search_options":{},"messages":[{"role":"user","content":"What is new in Lisbon?"}]}'

  curl -s $OPENAI_BASE_URL/models   # the catalogue and capabilities
  curl -s %s/pricing   # public rates

The console (balance, keys, activity, prices) is at %s/console/
  account: %s
  set its password once at %s%s
  (the link works once; later runs print a new one)

Add credit at %s/console/payments: the payment page is a simulated Stripe
  Checkout (card 4242 4242 4242 4242 pays, 4000 0000 0000 0002 is declined).

The operator console (accounts, credits, payments, nodes, audit) is at http://%s/console/
  sign in with the admin token %s
  (the same token opens the admin API and /debug/pprof/ there: Authorization: Bearer <token>)

  Operators: http://%s/metrics  /healthz  /readyz

Other commands work on it with --config %s. Ctrl-C stops it.
`, *dir, base, secret, site, site, k.AccountID, site, invite, site, m.Addr("admin"), adminToken, m.Addr("admin"), cfgPath)
	return m.waitAndClose(ctx, cfgPath)
}

// ensureDemoKey returns the demo key, creating the demo account (with its
// opening credit) and the key on the first run. The secret is kept in
// DIR/demo-key (mode 0600) because a key is otherwise shown only once.
func ensureDemoKey(ctx context.Context, st Store, dir string, credit tollgate.Amount) (string, error) {
	keyFile := filepath.Join(dir, "demo-key")
	if b, err := os.ReadFile(keyFile); err == nil {
		secret := strings.TrimSpace(string(b))
		if k, _, err := st.KeyByHash(ctx, tollgate.HashKey(secret)); err == nil && k.Revoked.IsZero() {
			return secret, nil
		}
	}
	var acct tollgate.Account
	accts, err := st.Accounts(ctx)
	if err != nil {
		return "", err
	}
	found := false
	for _, a := range accts {
		if a.Name == "demo" {
			acct, found = a, true
			break
		}
	}
	if !found {
		if acct, err = operator.CreateAccount(ctx, st, "demo", time.Now()); err != nil {
			return "", fmt.Errorf("create demo account: %w", err)
		}
		// The credit goes through the ledger, like any operator's top-up.
		if credit > 0 {
			if _, err := operator.Post(ctx, st, tollgate.LedgerCredit, acct.ID, credit, "demo credit", "tollgate demo", time.Now()); err != nil {
				return "", fmt.Errorf("credit demo account: %w", err)
			}
		}
	}
	k, err := operator.CreateKey(ctx, st, operator.KeyRequest{AccountID: acct.ID, Name: "demo"}, nil, time.Now())
	if err != nil {
		return "", fmt.Errorf("create demo key: %w", err)
	}
	if err := os.WriteFile(keyFile, []byte(k.Secret+"\n"), 0o600); err != nil {
		return "", err
	}
	return k.Secret, nil
}

// ensureDemoAdminToken returns the demo's admin token, made on the first run
// and kept in DIR/admin-token (mode 0600).
func ensureDemoAdminToken(dir string) (string, error) {
	path := filepath.Join(dir, "admin-token")
	if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) >= 32 {
		return strings.TrimSpace(string(b)), nil
	}
	var raw [24]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	token := hex.EncodeToString(raw[:])
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		return "", err
	}
	return token, nil
}

// demoInvite issues a console invitation for the demo account and returns
// its path.
func demoInvite(ctx context.Context, st Store, accountID string) (string, error) {
	inv, err := operator.Invite(ctx, st, accountID, time.Now())
	if err != nil {
		return "", fmt.Errorf("invite the demo account to the console: %w", err)
	}
	return inv.Path, nil
}

// demoPayments is the demo's payments section, appended to demoConfig
// (which the tests' harness shares without payments): credit is added in
// the console and paid on the simulated Stripe's Checkout page.
const demoPayments = `payments:
  provider: stripe
  api_url: "{{stripe}}"
  secret_key_env: TOLLGATE_DEMO_STRIPE_KEY
  webhook_secret_env: TOLLGATE_DEMO_STRIPE_WEBHOOK_SECRET
  console_url: "http://{{api}}/console/"
  auto_topup: true
`

// demoStripeKey is the API key the demo's simulated Stripe accepts.
const demoStripeKey = "sk_test_tollgate_demo"

// demoAPIAddr is the address the demo's api listener takes: listen, or a
// free port of the loopback when listen is busy or has port 0.
func demoAPIAddr(listen string) (string, error) {
	if ln, err := net.Listen("tcp", listen); err == nil {
		addr := ln.Addr().String()
		ln.Close()
		return addr, nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
