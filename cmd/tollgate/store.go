package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"strings"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/console"
	"github.com/tollgate/tollgate/idempotency"
	"github.com/tollgate/tollgate/payments"
	"github.com/tollgate/tollgate/postgres"
	"github.com/tollgate/tollgate/sqlite"
)

// Store is everything tollgate keeps in its database: the union of the
// interfaces each package declares for what it reads and writes. Both
// stores implement all of it (checked below when this compiles), so the
// wiring hands each package the store without asking what it can do. A new
// package's store interface is one more line here.
type Store interface {
	tollgate.Store
	billing.Store
	billing.BooksStore
	admin.Store
	console.Store
	console.OperatorStore
	idempotency.Store
	payments.Store
	migrator
	// WALSyncs counts the write-ahead log syncs tollgate made itself, for
	// the benchmark's report.
	WALSyncs() int64
}

var (
	_ Store = (*sqlite.DB)(nil)
	_ Store = (*postgres.DB)(nil)
)

// openStore opens (and migrates) the store the config names.
func openStore(ctx context.Context, s config.Store) (Store, error) {
	switch s.Driver {
	case "sqlite":
		return sqlite.OpenSynchronous(s.Path, s.SQLiteSynchronous)
	case "postgres":
		return postgres.Open(ctx, s.URL)
	}
	return nil, fmt.Errorf("store: unknown driver %q", s.Driver)
}

// describeStore names the store for humans, without the PostgreSQL URL (it
// may hold a password).
func describeStore(s config.Store) string {
	if s.Driver == "sqlite" {
		return "sqlite " + s.Path
	}
	return s.Driver
}

// storeCommand is what the store subcommands (accounts, keys, migrate) share:
// the --config flag and the way to open the store it names.
type storeCommand struct {
	configPath string
	cfg        *config.Config
}

// registerConfigFlag adds --config, defaulting to $TOLLGATE_CONFIG, else tollgate.yaml.
func (c *storeCommand) registerConfigFlag(fs *flag.FlagSet) { configFlag(fs, &c.configPath) }

// configFlag registers --config. Its default is resolved when the file is
// read (configPath), so that -h states it once, in words.
func configFlag(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "config", "", "config `FILE` (default $TOLLGATE_CONFIG, else tollgate.yaml)")
}

// configPath is the --config value, or its default.
func configPath(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	return defaultConfigPath()
}

// loadConfig reads the config file (config.Load, or config.LoadForStore
// for the commands that only manage the store). A missing file says how to
// point at one.
func loadConfig(path string, forStore bool) (*config.Config, error) {
	load := config.Load
	if forStore {
		load = config.LoadForStore
	}
	cfg, err := load(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no config file %s: point at one with --config FILE or the TOLLGATE_CONFIG environment variable (tollgate.example.yaml is an annotated example)", path)
	}
	return cfg, err
}

func (c *storeCommand) open(ctx context.Context) (Store, error) {
	cfg, err := loadConfig(configPath(c.configPath), true)
	if err != nil {
		return nil, err
	}
	c.cfg = cfg
	return openStore(ctx, cfg.Store)
}

// openWithID parses args for one positional argument, an id (what names it
// in the usage error), and opens the store.
func (c *storeCommand) openWithID(ctx context.Context, fs *flag.FlagSet, args []string, what string) (Store, string, error) {
	pos, err := parseArgs(fs, args)
	if err != nil {
		return nil, "", err
	}
	if err := wantArgs(fs, pos, 1, what); err != nil {
		return nil, "", err
	}
	st, err := c.open(ctx)
	if err != nil {
		return nil, "", err
	}
	return st, pos[0], nil
}

// openFlagsOnly parses args, which must hold flags only, and opens the store.
func (c *storeCommand) openFlagsOnly(ctx context.Context, fs *flag.FlagSet, args []string) (Store, error) {
	pos, err := parseArgs(fs, args)
	if err != nil {
		return nil, err
	}
	if err := wantArgs(fs, pos, 0, ""); err != nil {
		return nil, err
	}
	return c.open(ctx)
}

// parseArgs parses flags that may come before, between or after the
// positional arguments ("keys revoke key_1 --config x.yaml") and returns the
// positional ones. A negative number is positional ("accounts credit ID
// -5" is then refused for its amount, not as an unknown flag -5).
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		head := args
		neg := negativeAt(fs, args)
		if neg >= 0 {
			head = args[:neg]
		}
		if err := fs.Parse(head); err != nil {
			return nil, flagErr(err)
		}
		rest := fs.Args()
		used := len(head) - len(rest)
		if len(rest) > 0 {
			if used > 0 && head[used-1] == "--" {
				return append(pos, rest...), nil // everything after "--" is positional
			}
			pos = append(pos, rest[0])
			args = args[used+1:]
			continue
		}
		if neg < 0 {
			return pos, nil
		}
		pos = append(pos, args[neg])
		args = args[neg+1:]
	}
}

// wantArgs checks the number of positional arguments.
func wantArgs(fs *flag.FlagSet, pos []string, n int, what string) error {
	if len(pos) != n {
		fs.Usage()
		if n == 0 {
			return usageError{fmt.Sprintf("unexpected argument %q", pos[0])}
		}
		return usageError{"want " + what}
	}
	return nil
}

// newFlagSet returns a FlagSet that reports errors instead of exiting and
// prints usage (a synopsis and the flags) to stderr.
func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: tollgate %s\n\nFlags:\n", strings.TrimSpace(synopsis))
		fs.PrintDefaults()
	}
	return fs
}

// subcommand dispatches "tollgate <group> <sub> ...".
type subcommand struct {
	name    string
	summary string
	cmd     command
}

func runGroup(ctx context.Context, group string, subs []subcommand, args []string, stderr io.Writer) error {
	usage := func() {
		fmt.Fprintf(stderr, "Usage: tollgate %s <command> [flags]\n\nCommands:\n", group)
		for _, s := range subs {
			fmt.Fprintf(stderr, "  %-8s %s\n", s.name, s.summary)
		}
		fmt.Fprintf(stderr, "\nRun 'tollgate %s <command> -h' for a command's flags.\n", group)
	}
	if len(args) == 0 {
		usage()
		return usageError{"missing command"}
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage()
		return flag.ErrHelp
	}
	for _, s := range subs {
		if s.name == args[0] {
			return s.cmd.Run(ctx, args[1:])
		}
	}
	usage()
	return usageError{fmt.Sprintf("unknown command %q", args[0])}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// notFound turns a store's ErrNotFound into a plain message.
func notFound(what, id string, err error) error {
	if errors.Is(err, tollgate.ErrNotFound) {
		return fmt.Errorf("%s %s not found", what, id)
	}
	return err
}

// parseUSD parses an amount of USD given on the command line (what names
// it in the message: "AMOUNT", "--credit"). zeroOK admits 0.
func parseUSD(what, s string, zeroOK bool) (tollgate.Amount, error) {
	a, err := tollgate.ParseAmount(s)
	switch {
	case err != nil && strings.HasPrefix(s, "-"):
		return 0, usageError{fmt.Sprintf("%s %s: must not be negative", what, s)}
	case err != nil:
		if _, frac, ok := strings.Cut(s, "."); ok && len(strings.TrimRight(frac, "0")) > 12 {
			return 0, usageError{fmt.Sprintf("%s %s: more than 12 decimals (the smallest amount is 0.000000000001 USD)", what, s)}
		}
		return 0, usageError{fmt.Sprintf("%s %q: not a decimal number of USD (e.g. 25 or 0.50)", what, s)}
	case a < 0:
		return 0, usageError{fmt.Sprintf("%s %s: must not be negative", what, s)}
	case a == 0 && !zeroOK:
		return 0, usageError{fmt.Sprintf("%s %s: must be more than zero", what, s)}
	}
	return a, nil
}

// isNegativeNumber reports whether a command-line argument is a negative
// number ("-5", "-0.5"): never a flag, since no flag's name starts with a digit.
func isNegativeNumber(a string) bool {
	return len(a) > 1 && a[0] == '-' && (a[1] >= '0' && a[1] <= '9' || a[1] == '.')
}

// negativeAt is the index of the first argument that is a negative number
// standing where a flag name could be (not a flag's value, not after "--"),
// or -1.
func negativeAt(fs *flag.FlagSet, args []string) int {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return -1
		}
		if isNegativeNumber(a) {
			return i
		}
		if !strings.HasPrefix(a, "-") || strings.Contains(a, "=") {
			continue
		}
		if f := fs.Lookup(strings.TrimLeft(a, "-")); f != nil {
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
				i++ // the flag's value
			}
		}
	}
	return -1
}
