package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/auth"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/postgres"
)

// writeStoreConfig writes a minimal valid config whose store is storeYAML
// (e.g. "sqlite: t.db") and returns its path.
func writeStoreConfig(t *testing.T, storeYAML string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tollgate.yaml")
	doc := `listen:
  api: 127.0.0.1:0
store:
  ` + storeYAML + `
models:
  - id: chat-1
    kind: chat
    context_length: 8192
    max_output_tokens: 1024
    backends:
      - class: fallback
        upstream_model: some-chat
        url: http://127.0.0.1:9/v1
        rates: {input: "0.1", output: "0.2"}
  - id: cheap-1
    kind: cheap
    context_length: 8192
    max_output_tokens: 1024
    backends:
      - class: fallback
        upstream_model: some-cheap
        url: http://127.0.0.1:9/v1
        rates: {input: "0.01", output: "0.02"}
`
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// cli runs one store subcommand through main's dispatcher and returns stdout.
func cli(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := newCommand(args[0], &stdout, &stderr)
	if cmd == nil {
		t.Fatalf("newCommand(%q) = nil", args[0])
	}
	err := cmd.Run(t.Context(), args[1:])
	if err != nil {
		t.Logf("tollgate %s: %v\nstderr: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), err
}

func mustCLI(t *testing.T, args ...string) string {
	t.Helper()
	out, err := cli(t, args...)
	if err != nil {
		t.Fatalf("tollgate %s: %v", strings.Join(args, " "), err)
	}
	return out
}

func decode[T any](t *testing.T, what, s string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("%s: not the JSON expected: %v\n%s", what, err, s)
	}
	return v
}

func TestStoreCLISQLite(t *testing.T) {
	testStoreCLI(t, writeStoreConfig(t, "sqlite: data/tollgate.db"))
}

func TestStoreCLIPostgres(t *testing.T) {
	schema := postgres.NewTestSchema(t) // skips without TOLLGATE_TEST_POSTGRES
	url := os.Getenv(postgres.TestEnv)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	// pgx passes unknown URL parameters to the server as settings.
	t.Setenv("TOLLGATE_CLI_TEST_PG", url+sep+"search_path="+schema)
	testStoreCLI(t, writeStoreConfig(t, "postgres_url_env: TOLLGATE_CLI_TEST_PG"))
}

func testStoreCLI(t *testing.T, cfgPath string) {
	out := mustCLI(t, "migrate", "--config", cfgPath)
	if !regexp.MustCompile(`schema up to date at \d{4}_`).MatchString(out) {
		t.Errorf("migrate: %q", out)
	}

	acct := decode[tollgate.Account](t, "accounts create -json",
		mustCLI(t, "accounts", "create", "--config", cfgPath, "--name", "Ada Lovelace", "-json"))
	if !strings.HasPrefix(acct.ID, "acct_") || acct.Name != "Ada Lovelace" || acct.Disabled {
		t.Errorf("accounts create: %+v", acct)
	}
	plainID := strings.TrimSpace(mustCLI(t, "accounts", "create", "--config", cfgPath, "--name", "Bob"))
	if !strings.HasPrefix(plainID, "acct_") {
		t.Errorf("accounts create (text) printed %q, want an account id", plainID)
	}

	accts := decode[[]tollgate.Account](t, "accounts list -json", mustCLI(t, "accounts", "list", "--config", cfgPath, "-json"))
	if len(accts) != 2 || accts[0].ID != acct.ID || accts[1].ID != plainID {
		t.Errorf("accounts list: %+v", accts)
	}
	if table := mustCLI(t, "accounts", "list", "--config", cfgPath); !strings.Contains(table, "Ada Lovelace") || !strings.Contains(table, "active") {
		t.Errorf("accounts list (table):\n%s", table)
	}

	// Flags after the positional argument work too.
	created := decode[struct {
		Key    tollgate.Key `json:"key"`
		Secret string       `json:"secret"`
	}](t, "keys create -json", mustCLI(t, "keys", "create", "--account", acct.ID, "--name", "laptop",
		"--expires", "30d", "--models", "chat-1, cheap-1,chat-1", "-json", "--config", cfgPath))
	if !tollgate.LooksLikeKey(created.Secret) || created.Key.Prefix != tollgate.DisplayPrefix(created.Secret) {
		t.Fatalf("keys create: secret shape or prefix wrong: prefix %q", created.Key.Prefix)
	}
	if d := created.Key.Expires.Sub(created.Key.Created); d != 30*24*time.Hour {
		t.Errorf("keys create --expires 30d: expires %v after creation, want 720h", d)
	}
	if got := strings.Join(created.Key.AllowedModels, ","); got != "chat-1,cheap-1" {
		t.Errorf("keys create --models: %q, want chat-1,cheap-1", got)
	}
	plainSecret := strings.TrimSpace(mustCLI(t, "keys", "create", "--config", cfgPath, "--account", plainID))
	if !tollgate.LooksLikeKey(plainSecret) {
		t.Errorf("keys create (text) printed %q, want only the secret", plainSecret)
	}

	listJSON := mustCLI(t, "keys", "list", "--config", cfgPath, "-json", "--account", acct.ID)
	keys := decode[[]tollgate.Key](t, "keys list -json", listJSON)
	if len(keys) != 1 || keys[0].ID != created.Key.ID || keys[0].Prefix != created.Key.Prefix || keys[0].Name != "laptop" {
		t.Errorf("keys list --account: %+v", keys)
	}
	all := mustCLI(t, "keys", "list", "--config", cfgPath)
	for _, out := range []string{listJSON, all, mustCLI(t, "accounts", "show", acct.ID, "--config", cfgPath)} {
		if strings.Contains(out, created.Secret) || strings.Contains(out, plainSecret) {
			t.Errorf("a listing shows a secret:\n%s", out)
		}
	}
	if !strings.Contains(all, created.Key.Prefix+"…") || strings.Count(all, "\n") != 3 {
		t.Errorf("keys list (table): want a header and 2 keys with prefixes:\n%s", all)
	}

	// The key authenticates against the store the CLI wrote; after revoke it is refused.
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	st, err := openStore(t.Context(), cfg.Store)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a := auth.New(st, auth.Options{})
	if _, _, err := a.Authenticate(t.Context(), "Bearer "+created.Secret, time.Now()); err != nil {
		t.Fatalf("a fresh key is refused: %v", err)
	}
	if out := mustCLI(t, "keys", "revoke", created.Key.ID, "--config", cfgPath); !strings.Contains(out, "revoked") {
		t.Errorf("keys revoke: %q", out)
	}
	if _, _, err := a.Authenticate(t.Context(), "Bearer "+created.Secret, time.Now()); tollgate.ErrorCode(err) != tollgate.CodeAPIKeyRevoked {
		t.Errorf("after keys revoke: %v, want %s", err, tollgate.CodeAPIKeyRevoked)
	}
	keys = decode[[]tollgate.Key](t, "keys list -json", mustCLI(t, "keys", "list", "--config", cfgPath, "-json"))
	if len(keys) != 2 || keys[0].Revoked.IsZero() || !keys[1].Revoked.IsZero() {
		t.Errorf("keys list after revoke: want the first revoked, the second not: %+v", keys)
	}

	// Disabling the account refuses its other key with 403 account_disabled; enabling restores it.
	mustCLI(t, "accounts", "disable", plainID, "--config", cfgPath)
	if _, _, err := a.Authenticate(t.Context(), "Bearer "+plainSecret, time.Now()); tollgate.ErrorCode(err) != tollgate.CodeAccountDisabled {
		t.Errorf("after accounts disable: %v, want %s", err, tollgate.CodeAccountDisabled)
	}
	show := decode[struct {
		Account tollgate.Account `json:"account"`
		Keys    []tollgate.Key   `json:"keys"`
	}](t, "accounts show -json", mustCLI(t, "accounts", "show", "--config", cfgPath, plainID, "-json"))
	if !show.Account.Disabled || len(show.Keys) != 1 {
		t.Errorf("accounts show after disable: %+v", show)
	}
	mustCLI(t, "accounts", "enable", plainID, "--config", cfgPath)
	if _, _, err := a.Authenticate(t.Context(), "Bearer "+plainSecret, time.Now()); err != nil {
		t.Errorf("after accounts enable: %v", err)
	}

	// Mistakes.
	var ue usageError
	for _, args := range [][]string{
		{"keys", "create", "--config", cfgPath},
		{"keys", "create", "--config", cfgPath, "--account", acct.ID, "--models", "gpt-4"},
		{"keys", "create", "--config", cfgPath, "--account", acct.ID, "--expires", "yesterday"},
		{"keys", "create", "--config", cfgPath, "--account", acct.ID, "--expires", "2001-01-01"},
		{"keys", "revoke", "--config", cfgPath},
		{"accounts", "create", "--config", cfgPath},
		{"accounts", "show", "--config", cfgPath, "a", "b"},
		{"accounts", "frobnicate"},
		{"keys"},
		// Flags the parser refuses (exit status 2 like the rest, not 1).
		{"keys", "create", "--config", cfgPath, "--account", acct.ID, "--rpm", "abc"},
		{"keys", "list", "--config", cfgPath, "--no-such-flag"},
		{"usage", "--config", cfgPath, "--by", "colour"},
	} {
		if _, err := cli(t, args...); !errors.As(err, &ue) {
			t.Errorf("tollgate %s: got %v, want a usage error", strings.Join(args, " "), err)
		}
	}
	for _, args := range [][]string{
		{"keys", "revoke", "key_missing", "--config", cfgPath},
		{"keys", "create", "--config", cfgPath, "--account", "acct_missing"},
		{"accounts", "show", "acct_missing", "--config", cfgPath},
		{"accounts", "disable", "acct_missing", "--config", cfgPath},
		{"keys", "list", "--account", "acct_missing", "--config", cfgPath},
	} {
		if _, err := cli(t, args...); err == nil || !strings.Contains(err.Error(), "not found") {
			t.Errorf("tollgate %s: got %v, want a not-found error", strings.Join(args, " "), err)
		}
	}
	if _, err := cli(t, "keys", "list", "-h"); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("keys list -h: got %v, want flag.ErrHelp", err)
	}
}
