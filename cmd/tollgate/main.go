// Command tollgate is the whole service in one binary: `tollgate serve` runs
// it, `tollgate demo` runs it with simulated model servers, and the other
// subcommands manage its store.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/tollgate/tollgate"
)

// command is one subcommand. Each lives in its own file with its own FlagSet
// and usage text.
type command interface {
	Run(ctx context.Context, args []string) error
}

// commands lists every subcommand with a one-line summary, in help order.
var commandSummaries = [][2]string{
	{"serve", "run the service from a config file"},
	{"demo", "run the service with simulated model servers and a funded demo key"},
	{"bench", "measure tollgate against a direct simulated server and print the ratios"},
	{"simulate", "run a simulated model server (vllm, sglang, llamacpp, ollama, openai, openrouter)"},
	{"accounts", "create, list, show, credit, debit, disable and enable accounts"},
	{"keys", "create, list and revoke API keys"},
	{"usage", "sum charges by account, key, model, backend and period (table, CSV, JSON)"},
	{"audit", "check that every balance is the sum of its ledger and no hold is orphaned"},
	{"migrate", "create the store and apply pending schema migrations"},
	{"version", "print the version, commit and Go version of this binary"},
}

func newCommand(name string, stdout, stderr io.Writer) command {
	switch name {
	case "accounts":
		return &accountsCmd{stdout: stdout, stderr: stderr}
	case "keys":
		return &keysCmd{stdout: stdout, stderr: stderr}
	case "usage":
		return &usageCmd{stdout: stdout, stderr: stderr}
	case "audit":
		return &auditCmd{stdout: stdout, stderr: stderr}
	case "migrate":
		return &migrateCmd{stdout: stdout, stderr: stderr}
	case "simulate":
		return &simulateCmd{stdout: stdout, stderr: stderr}
	case "serve":
		return &serveCmd{stdout: stdout, stderr: stderr}
	case "demo":
		return &demoCmd{stdout: stdout, stderr: stderr}
	case "bench":
		return &benchCmd{stdout: stdout, stderr: stderr}
	case "version":
		return &versionCmd{stdout: stdout, stderr: stderr}
	case "bench-client": // run by bench for its paired phases; not in the help
		return &benchClientCmd{stdout: stdout, stderr: stderr}
	}
	return nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd := newCommand(args[0], stdout, stderr)
	if cmd == nil {
		fmt.Fprintf(stderr, "tollgate: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	if err := cmd.Run(ctx, args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "tollgate %s: %v\n", args[0], err)
			return 2
		}
		fmt.Fprintf(stderr, "tollgate %s: %s\n", args[0], inWords(err))
		return 1
	}
	return 0
}

// inWords is an error as an operator reads it: a store's refusal (a
// *tollgate.Error such as insufficient_balance or conflict) is its message
// alone, without the layers that wrapped it on the way up.
func inWords(err error) string {
	var te *tollgate.Error
	if errors.As(err, &te) && te.Code != tollgate.CodeInternal && te.Message != "" {
		return te.Message
	}
	return err.Error()
}

// count is n and a noun, in the plural unless n is 1: "1 account", "2 keys".
func count[N ~int | ~int64](n N, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// flagErr marks a flag that could not be parsed (an unknown flag, a value of
// the wrong type) as a usage error, exit status 2; -h stays flag.ErrHelp.
func flagErr(err error) error {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	return usageError{err.Error()}
}

// usageError marks a mistake in the command line (exit status 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usage(w io.Writer) {
	fmt.Fprintln(w, "Usage: tollgate <command> [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	for _, c := range commandSummaries {
		fmt.Fprintf(w, "  %-10s %s\n", c[0], c[1])
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'tollgate <command> -h' for a command's flags.")
}
