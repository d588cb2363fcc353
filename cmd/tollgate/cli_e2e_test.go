package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/simulate"
)

// The operator's path end to end (issue 5): the CLI creates an account,
// credits it and makes a key on the config of a running service; a client
// calls the service with that key; the CLI revokes it; the service answers
// 401 api_key_revoked.
func TestCLIKeyLifecycleAgainstTheService(t *testing.T) {
	sim, err := simulate.Start(simulate.Config{Flavour: simulate.VLLM, Models: []string{"up"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "tollgate.yaml")
	doc := `listen: {api: "127.0.0.1:0"}
store: {sqlite: tollgate.db}
health: {interval: "off"}
auth: {poll: 50ms}
models:
  - id: m
    kind: chat
    context_length: 8192
    max_output_tokens: 512
    backends:
      - class: network
        upstream_model: up
        rates: {input: "1", output: "2"}
        nodes: [{url: "` + sim.URL() + `/v1", flavour: vllm}]
`
	if err := os.WriteFile(cfgPath, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	acct := decode[struct{ ID string }](t, "accounts create", mustCLI(t, "accounts", "create", "--name", "cli", "--json", "--config", cfgPath))
	mustCLI(t, "accounts", "credit", acct.ID, "5", "--config", cfgPath)
	secret := strings.TrimSpace(mustCLI(t, "keys", "create", "--account", acct.ID, "--name", "k", "--config", cfgPath))
	keys := decode[[]struct{ ID, Prefix string }](t, "keys list", mustCLI(t, "keys", "list", "--account", acct.ID, "--json", "--config", cfgPath))
	if len(keys) != 1 || !strings.HasPrefix(secret, keys[0].Prefix) || strings.Contains(mustCLI(t, "keys", "list", "--config", cfgPath), secret) {
		t.Fatalf("keys list = %+v (secret must show only as its prefix)", keys)
	}

	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	journalBesideConfig(cfg, cfgPath)
	m := &Main{Config: cfg}
	if err := m.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	call := func() (int, string) {
		req, _ := http.NewRequest("POST", m.APIURL()+"/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	if status, body := call(); status != 200 {
		t.Fatalf("with the CLI's key: %d %s", status, body)
	}
	mustCLI(t, "keys", "revoke", keys[0].ID, "--config", cfgPath)
	deadline := time.Now().Add(10 * time.Second)
	for {
		status, body := call()
		if status == 401 && strings.Contains(body, `"code":"api_key_revoked"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after keys revoke: %d %s", status, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
