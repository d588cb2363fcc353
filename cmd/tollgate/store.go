package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/postgres"
	"github.com/tollgate/tollgate/sqlite"
)

// openStore opens (and migrates) the store the config names.
func openStore(ctx context.Context, s config.Store) (tollgate.Store, error) {
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
func (c *storeCommand) registerConfigFlag(fs *flag.FlagSet) {
	fs.StringVar(&c.configPath, "config", defaultConfigPath(), "config file (default $TOLLGATE_CONFIG, else tollgate.yaml)")
}

func (c *storeCommand) open(ctx context.Context) (tollgate.Store, error) {
	cfg, err := config.LoadForStore(c.configPath)
	if err != nil {
		return nil, err
	}
	c.cfg = cfg
	return openStore(ctx, cfg.Store)
}

// parseArgs parses flags that may come before, between or after the
// positional arguments ("keys revoke key_1 --config x.yaml") and returns the
// positional ones.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, flagErr(err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(pos, rest...), nil // everything after "--" is positional
		}
		pos = append(pos, rest[0])
		args = rest[1:]
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
