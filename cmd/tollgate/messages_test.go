package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/syncbuf"
)

// runCLI runs the binary's dispatcher (exit status, stderr and all).
func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(t.Context(), args, &o, &e)
	return code, o.String(), e.String()
}

// Flag help states each default once, and no flag shows a type name taken
// from a word in backquotes.
func TestFlagHelpWithoutStrayDefaults(t *testing.T) {
	help := func(args ...string) string {
		code, _, stderr := runCLI(t, append(args, "-h")...)
		if code != 0 {
			t.Fatalf("%v -h: exit %d", args, code)
		}
		return stderr
	}
	audit := help("audit")
	if strings.Contains(audit, "-1ns") || !strings.Contains(audit, "-grace DURATION") {
		t.Errorf("audit -h:\n%s", audit)
	}
	if h := help("bench"); strings.Contains(h, "-access-log tollgate") || !strings.Contains(h, "-access-log string") {
		t.Errorf("bench -h shows a stray type name:\n%s", h)
	}
	if h := help("simulate"); strings.Contains(h, "-model-path model") {
		t.Errorf("simulate -h shows a stray type name:\n%s", h)
	}
	demo := help("demo")
	if first := strings.SplitN(demo, "\n", 2)[0]; !strings.Contains(first, "--credit") || !strings.Contains(first, "--log-level") {
		t.Errorf("demo's usage line omits flags: %s", first)
	}
	twoDefaults := regexp.MustCompile(`\(default[^\n]*\(default`)
	for _, args := range [][]string{{"serve"}, {"audit"}, {"migrate"}, {"usage"}, {"accounts", "list"}, {"accounts", "credit"}, {"keys", "create"}} {
		h := help(args...)
		if !strings.Contains(h, "-config FILE") || twoDefaults.MatchString(h) {
			t.Errorf("%v -h: --config should state its default once:\n%s", args, h)
		}
	}
}

func TestAmountsAndStoreErrorsInWords(t *testing.T) {
	cfg := writeStoreConfig(t, "sqlite: t.db")
	acct := decode[struct{ ID string }](t, "accounts create", mustCLI(t, "accounts", "create", "--name", "a", "--json", "--config", cfg))
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"accounts", "credit", acct.ID, "-5", "--config", cfg}, 2, "AMOUNT -5: must not be negative (to take from a balance, use 'tollgate accounts debit')"},
		{[]string{"accounts", "debit", "--config", cfg, acct.ID, "-0.5"}, 2, "AMOUNT -0.5: must not be negative"},
		{[]string{"accounts", "credit", acct.ID, "0.0000000000001", "--config", cfg}, 2, "AMOUNT 0.0000000000001: more than 12 decimals"},
		{[]string{"accounts", "credit", acct.ID, "0", "--config", cfg}, 2, "AMOUNT 0: must be more than zero"},
		{[]string{"accounts", "credit", acct.ID, "five", "--config", cfg}, 2, `AMOUNT "five": not a decimal number of USD`},
		{[]string{"keys", "create", "--account", acct.ID, "--spend-limit", "1.0000000000001", "--config", cfg}, 2, "--spend-limit 1.0000000000001: more than 12 decimals"},
		{[]string{"keys", "create", "--account", acct.ID, "--expires", "yesterday", "--config", cfg}, 2, `--expires "yesterday": want a duration`},
		{[]string{"keys", "create", "--account", acct.ID, "--models", "gpt-4", "--config", cfg}, 2, `--models: "gpt-4" is not in the catalogue`},
		{[]string{"keys", "create", "--account", acct.ID, "--tpm", "-1", "--config", cfg}, 2, "--tpm must not be negative"},
		{[]string{"keys", "create", "--account", "acct_nope", "--config", cfg}, 1, "account acct_nope not found"},
		{[]string{"accounts", "debit", acct.ID, "5", "--config", cfg}, 1, "tollgate accounts: a debit of 5 USD exceeds the free balance of 0 USD\n"},
	}
	for _, c := range cases {
		code, _, stderr := runCLI(t, c.args...)
		if code != c.code || !strings.Contains(stderr, c.want) || strings.Contains(stderr, "flag provided") || strings.Contains(stderr, "sqlite:") {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", c.args, code, stderr, c.code, c.want)
		}
	}
	// A note that reads like a negative number is the flag's value.
	if _, err := cli(t, "accounts", "credit", acct.ID, "1", "--note", "-5", "--config", cfg); err != nil {
		t.Errorf("--note -5: %v", err)
	}
	mustCLI(t, "keys", "create", "--account", acct.ID, "--config", cfg)
	if out := mustCLI(t, "audit", "--config", cfg); !strings.HasPrefix(out, "1 account, 1 key; ") {
		t.Errorf("audit: %q, want 1 account, 1 key", out)
	}
	mustCLI(t, "accounts", "create", "--name", "b", "--config", cfg)
	if out := mustCLI(t, "audit", "--grace", "1m", "--config", cfg); !strings.HasPrefix(out, "2 accounts, 1 key; ") {
		t.Errorf("audit: %q, want 2 accounts, 1 key", out)
	}
}

// A command run without a config file says how to point at one.
func TestMissingConfigSaysHowToPointAtOne(t *testing.T) {
	t.Setenv("TOLLGATE_CONFIG", "")
	t.Chdir(t.TempDir())
	for _, args := range [][]string{{"accounts", "list"}, {"serve"}, {"audit", "--config", "nowhere.yaml"}} {
		code, _, stderr := runCLI(t, args...)
		if code != 1 || !strings.Contains(stderr, "--config FILE or the TOLLGATE_CONFIG environment variable") {
			t.Errorf("%v: exit %d, %q", args, code, stderr)
		}
	}
}

// freeAddr returns a loopback address with a port nobody listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// runSimulate runs `tollgate simulate args...` until the test ends, once
// its output says ready; it must then exit 0.
func runSimulate(t *testing.T, ready string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var out, errOut syncbuf.Buffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, append([]string{"simulate"}, args...), &out, &errOut) }()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("simulate %v exited %d: %s", args, code, errOut.String())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), ready) {
		if time.Now().After(deadline) {
			t.Fatalf("simulate %v did not start: %q %q", args, out.String(), errOut.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// `tollgate simulate --fault refuse` refuses connections at the TCP level,
// as a node that is down: the port is closed.
func TestSimulateFaultRefuseRefusesConnections(t *testing.T) {
	addr := freeAddr(t)
	runSimulate(t, "refusing every connection", "--listen", addr, "--fault", "refuse")
	for i := 0; i < 3; i++ {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err == nil {
			c.Close()
			t.Fatal("a connection was accepted")
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dial: %v, want connection refused", err)
		}
	}
}
