package main

import (
	"context"
	"fmt"
	"io"
)

// migrateCmd is `tollgate migrate`: apply pending schema migrations.
type migrateCmd struct {
	storeCommand
	stdout, stderr io.Writer
}

// migrator applies the embedded schema migrations and names the newest applied.
type migrator interface {
	Migrate(ctx context.Context) ([]string, error)
	SchemaVersion(ctx context.Context) (string, error)
}

func (c *migrateCmd) Run(ctx context.Context, args []string) error {
	fs := newFlagSet("migrate", `migrate [--config FILE]

Creates the store if needed and applies pending schema migrations (embedded
in the binary, run in order, recorded in schema_migrations). 'tollgate serve'
does the same at start; several instances may start at once (PostgreSQL
migrations run under an advisory lock).`, c.stderr)
	c.registerConfigFlag(fs)
	st, err := c.openFlagsOnly(ctx, fs, args) // opening migrates
	if err != nil {
		return err
	}
	defer st.Close()
	if _, err := st.Migrate(ctx); err != nil {
		return err
	}
	v, err := st.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "%s: schema up to date at %s\n", describeStore(c.cfg.Store), v)
	return nil
}
