package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/simulate"
	"github.com/tollgate/tollgate/tracing"
)

// harness runs the real Main on port 0 against simulated model servers: the
// demo catalogue plus one model per flavour ("flav-vllm", ...) served by a
// single backend of that flavour, so a test can aim at one server's quirks.
type harness struct {
	t       *testing.T
	main    *Main
	sims    map[string]*simulate.Running
	search  *simulate.RunningSearch // the demo's simulated SearXNG
	cfgPath string                  // the config file Main was opened with
	key     string
	acct    tollgate.Account
	keyRec  tollgate.Key
	client  openai.Client
}

type harnessOptions struct {
	extraYAML string // appended to the top level of the config
	timeouts  string // a `timeouts:` block
	store     string // a `store:` block; default SQLite in the test's temp dir
	credit    tollgate.Amount
	models    string       // more entries of the models list; {{name}} is a simulator's URL
	log       *slog.Logger // Main's logger (default: discarded)
	listen    string       // more listeners under listen:, such as "  admin: 127.0.0.1:0\n"
	// search replaces the demo's search: section ("{{searxng}}" is the
	// simulated SearXNG's URL); searchSim configures that simulator.
	search    string
	searchSim simulate.SearchConfig
	tracing   *tracing.Provider // set on Main before Open (an in-memory exporter)
}

// flavourSims are the per-flavour servers of the harness.
var flavourSims = []simulate.Flavour{simulate.VLLM, simulate.SGLang, simulate.LlamaCpp, simulate.Ollama, simulate.OpenAI, simulate.OpenRouter}

func newHarness(t *testing.T, o harnessOptions) *harness {
	t.Helper()
	h := &harness{t: t, sims: map[string]*simulate.Running{}}
	urls := map[string]string{"api": "127.0.0.1:0"}
	start := func(name string, cfg simulate.Config) {
		run, err := simulate.Start(cfg)
		if err != nil {
			t.Fatalf("start simulator %s: %v", name, err)
		}
		t.Cleanup(func() { run.Close() })
		h.sims[name] = run
		urls[name] = run.URL()
	}
	for _, s := range demoSimulators {
		start(s.name, s.cfg)
	}
	scfg := o.searchSim
	if scfg.Flavour == "" {
		scfg.Flavour = simulate.SearXNG
	}
	srun, err := simulate.StartSearch(scfg)
	if err != nil {
		t.Fatalf("start search simulator: %v", err)
	}
	t.Cleanup(func() { srun.Close() })
	h.search = srun
	urls["searxng"] = srun.URL()
	var flavModels strings.Builder
	for _, f := range flavourSims {
		name := "flav-" + string(f)
		start(name, simulate.Config{Flavour: f, Models: []string{"up-" + string(f)}})
		if f == simulate.OpenAI || f == simulate.OpenRouter {
			prefix := "/v1"
			if f == simulate.OpenRouter {
				prefix = "/api/v1"
			}
			fmt.Fprintf(&flavModels, `
  - id: %s
    kind: chat
    context_length: 32768
    max_output_tokens: 4096
    backends:
      - class: fallback
        upstream_model: up-%s
        url: "%s%s"
        flavour: %s
        capabilities: [tools, reasoning, image_input]
        rates: {input: "1", output: "2"}
`, name, f, urls[name], prefix, f)
		} else {
			fmt.Fprintf(&flavModels, `
  - id: %s
    kind: chat
    context_length: 32768
    max_output_tokens: 4096
    backends:
      - class: network
        upstream_model: up-%s
        capabilities: [tools, reasoning, image_input]
        rates: {input: "1", output: "2"}
        nodes:
          - {name: node-%s, url: "%s/v1", flavour: %s}
`, name, f, f, urls[name], f)
		}
	}
	// The demo's own admin listener and token are the demo's: a test asks
	// for an admin listener with o.listen (and its token with extraYAML).
	demo := regexp.MustCompile(`(?m)^  admin: \{\{admin\}\}.*\n`).ReplaceAllString(demoConfig, "")
	demo = strings.Replace(demo, "admin_token_env: TOLLGATE_DEMO_ADMIN_TOKEN\n", "", 1)
	text := strings.Replace(demo, "  api: {{api}}\n", "  api: {{api}}\n"+o.listen, 1) + flavModels.String() + o.models
	for k, v := range urls {
		text = strings.ReplaceAll(text, "{{"+k+"}}", v)
	}
	if o.search != "" {
		start := strings.Index(text, "search:\n")
		end := strings.Index(text, "models:\n")
		text = text[:start] + o.search + text[end:]
		text = strings.ReplaceAll(text, "{{searxng}}", urls["searxng"])
	}
	if o.store != "" {
		text = strings.Replace(text, "store:\n  sqlite: tollgate.db\n", o.store, 1)
	}
	text = strings.Replace(text, "health:\n  interval: 5s\n", "health:\n  interval: \"off\"\n", 1)
	text += o.timeouts + o.extraYAML
	dir := t.TempDir()
	path := filepath.Join(dir, "tollgate.yaml")
	h.cfgPath = path
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("config: %v\n%s", err, text)
	}
	journalBesideConfig(cfg, path)
	h.main = &Main{Config: cfg, Log: o.log, Tracing: o.tracing}
	if err := h.main.Open(context.Background()); err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := h.main.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	credit := o.credit
	if credit == 0 {
		credit = tollgate.Dollars(100)
	}
	h.acct, h.keyRec, h.key = h.newKey(credit, nil)
	h.client = h.clientWith(h.key)
	return h
}

// journalBesideConfig moves PostgreSQL's default charge journal, relative
// to the working directory (the package's source directory in tests, shared
// by every test), beside the test's config file, as `tollgate serve` gets it
// when it runs in the config's directory (procFleet).
func journalBesideConfig(cfg *config.Config, configPath string) {
	if cfg.Billing.JournalDir == config.DefaultPostgresJournal {
		cfg.Billing.JournalDir = filepath.Join(filepath.Dir(configPath), config.DefaultPostgresJournal)
	}
}

// newKey creates an account with credit and a key for it.
func (h *harness) newKey(credit tollgate.Amount, allowed []string) (tollgate.Account, tollgate.Key, string) {
	h.t.Helper()
	ctx := context.Background()
	acct := tollgate.Account{ID: tollgate.NewID("acct_"), Name: "test", Balance: credit, Created: time.Now().UTC()}
	if err := h.main.Store.CreateAccount(ctx, acct); err != nil {
		h.t.Fatal(err)
	}
	secret := tollgate.NewKeySecret()
	k := tollgate.Key{ID: tollgate.NewID("key_"), AccountID: acct.ID, Name: "test", Prefix: tollgate.DisplayPrefix(secret), AllowedModels: allowed, Created: time.Now().UTC()}
	if err := h.main.Store.CreateKey(ctx, k, tollgate.HashKey(secret)); err != nil {
		h.t.Fatal(err)
	}
	return acct, k, secret
}

func (h *harness) clientWith(key string, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{
		option.WithBaseURL(h.main.APIURL() + "/"),
		option.WithAPIKey(key),
		option.WithMaxRetries(0),
	}, opts...)...)
}

// post sends a raw request to the API listener and returns status, headers and body.
// openChat posts a chat completion with the harness's key and returns the
// response as it starts, its body unread (a stream to read as it comes).
func (h *harness) openChat(body string) *http.Response {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+h.main.Addr("api")+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+h.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func (h *harness) post(path, body string, headers map[string]string) (int, http.Header, []byte) {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+h.main.Addr("api")+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+h.key)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	return h.do(req)
}

func (h *harness) do(req *http.Request) (int, http.Header, []byte) {
	h.t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatalf("read body: %v", err)
	}
	return resp.StatusCode, resp.Header, b
}

func (h *harness) get(path string) (int, http.Header, []byte) {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+h.main.Addr("api")+path, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	return h.do(req)
}

// sim returns the simulator of a per-flavour model ("vllm", ...) or of a demo node.
func (h *harness) sim(name string) *simulate.Running {
	h.t.Helper()
	if s, ok := h.sims["flav-"+name]; ok {
		return s
	}
	if s, ok := h.sims[name]; ok {
		return s
	}
	h.t.Fatalf("no simulator %q", name)
	return nil
}

type simStats = simulate.Stats
