package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/operator"
)

// keysCmd is `tollgate keys create|list|revoke`.
type keysCmd struct {
	stdout, stderr io.Writer
}

func (c *keysCmd) Run(ctx context.Context, args []string) error {
	return runGroup(ctx, "keys", []subcommand{
		{"create", "create a key and print its secret (once)", &keysCreateCmd{stdout: c.stdout, stderr: c.stderr}},
		{"list", "list keys (prefixes only)", &keysListCmd{stdout: c.stdout, stderr: c.stderr}},
		{"revoke", "revoke a key (401 api_key_revoked)", &keysRevokeCmd{stdout: c.stdout, stderr: c.stderr}},
	}, args, c.stderr)
}

// keysCreateCmd is `tollgate keys create --account ID`.
type keysCreateCmd struct {
	storeCommand
	stdout, stderr io.Writer
	account        string
	name           string
	expires        string
	models         string
	spendLimit     string
	rpm, tpm       int64
	json           bool
	now            func() time.Time // tests fix the clock
}

func (c *keysCreateCmd) Run(ctx context.Context, args []string) error {
	fs := newFlagSet("keys create", `keys create --account ACCOUNT_ID [--name NAME] [--expires WHEN] [--models a,b] [--json] [--config FILE]

Creates an API key and prints its secret. The secret is shown this once:
only its SHA-256 hash is stored, and listings show its first characters.`, c.stderr)
	c.registerConfigFlag(fs)
	fs.StringVar(&c.account, "account", "", "the account the key belongs to (required)")
	fs.StringVar(&c.name, "name", "", "a name for the key")
	fs.StringVar(&c.expires, "expires", "", "when the key stops working: a duration from now (720h, 30d) or a time (RFC 3339 or YYYY-MM-DD, UTC); default never")
	fs.StringVar(&c.models, "models", "", "comma-separated catalogue model ids the key may call; default all")
	fs.StringVar(&c.spendLimit, "spend-limit", "", "USD the key may spend in all (charges plus holds in flight); default no limit (403 key_limit_reached)")
	fs.Int64Var(&c.rpm, "rpm", 0, "requests per minute (429 rate_limit_exceeded); default no limit")
	fs.Int64Var(&c.tpm, "tpm", 0, "tokens per minute, prompt bound plus output cap while in flight, actual tokens after; default no limit")
	fs.BoolVar(&c.json, "json", false, "print {\"key\": ..., \"secret\": ...} as JSON")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 0, ""); err != nil {
		return err
	}
	req := operator.KeyRequest{AccountID: c.account, Name: c.name, Expires: c.expires, Models: splitList(c.models), RPM: c.rpm, TPM: c.tpm}
	if c.spendLimit != "" {
		if req.SpendLimit, err = parseUSD("--spend-limit", c.spendLimit, false); err != nil {
			return err
		}
	}
	if c.account == "" {
		fs.Usage()
		return usageError{"--account is required"}
	}
	now := time.Now
	if c.now != nil {
		now = c.now
	}
	st, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	catalogue := []string{}
	for _, m := range c.cfg.Models {
		catalogue = append(catalogue, m.ID)
	}
	created, err := operator.CreateKey(ctx, st, req, catalogue, now())
	if err != nil {
		return flagError(notFound("account", c.account, err))
	}
	if c.json {
		return writeJSON(c.stdout, created)
	}
	fmt.Fprintf(c.stderr, "Created key %s for account %s. The secret below is shown once; store it now.\n", created.Key.ID, created.Key.AccountID)
	fmt.Fprintln(c.stdout, created.Secret)
	return nil
}

// flagError turns an operation's refusal of a field (invalid_request with a
// Param, its message starting with the field's name) into a usage error
// naming the flag instead: "expires ..." becomes "--expires ...".
func flagError(err error) error {
	var te *tollgate.Error
	if !errors.As(err, &te) || te.Code != tollgate.CodeInvalidRequest || te.Param == "" {
		return err
	}
	flag := "--" + strings.ReplaceAll(te.Param, "_", "-")
	return usageError{flag + strings.TrimPrefix(te.Message, te.Param)}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// keysListCmd is `tollgate keys list [--account ID]`.
type keysListCmd struct {
	storeCommand
	stdout, stderr io.Writer
	account        string
	json           bool
}

func (c *keysListCmd) Run(ctx context.Context, args []string) error {
	fs := newFlagSet("keys list", `keys list [--account ACCOUNT_ID] [--json] [--config FILE]

Lists keys, oldest first, with their prefixes (the secrets are not stored).`, c.stderr)
	c.registerConfigFlag(fs)
	fs.StringVar(&c.account, "account", "", "only this account's keys")
	fs.BoolVar(&c.json, "json", false, "print a JSON array")
	st, err := c.openFlagsOnly(ctx, fs, args)
	if err != nil {
		return err
	}
	defer st.Close()
	keys, err := operator.ListKeys(ctx, st, c.account)
	if err != nil {
		return notFound("account", c.account, err)
	}
	if c.json {
		return writeJSON(c.stdout, keys)
	}
	return printKeys(c.stdout, keys, time.Now())
}

func keyStatus(k tollgate.Key, now time.Time) string {
	switch {
	case !k.Revoked.IsZero():
		return "revoked"
	case !k.Expires.IsZero() && !now.Before(k.Expires):
		return "expired"
	}
	return "active"
}

func printKeys(w io.Writer, keys []tollgate.Key, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPREFIX\tACCOUNT\tNAME\tCREATED\tEXPIRES\tSTATUS\tMODELS")
	for _, k := range keys {
		exp, models := "never", "all"
		if !k.Expires.IsZero() {
			exp = k.Expires.Format(time.RFC3339)
		}
		if len(k.AllowedModels) > 0 {
			models = strings.Join(k.AllowedModels, ",")
		}
		fmt.Fprintf(tw, "%s\t%s…\t%s\t%s\t%s\t%s\t%s\t%s\n",
			k.ID, k.Prefix, k.AccountID, k.Name, k.Created.Format(time.RFC3339), exp, keyStatus(k, now), models)
	}
	return tw.Flush()
}

// keysRevokeCmd is `tollgate keys revoke ID`.
type keysRevokeCmd struct {
	storeCommand
	stdout, stderr io.Writer
}

func (c *keysRevokeCmd) Run(ctx context.Context, args []string) error {
	fs := newFlagSet("keys revoke", `keys revoke KEY_ID [--config FILE]

Revokes a key: every instance refuses it with 401 api_key_revoked within
the auth poll interval (default 1s). Revoking twice keeps the first time.`, c.stderr)
	c.registerConfigFlag(fs)
	st, id, err := c.openWithID(ctx, fs, args, "one KEY_ID (see 'tollgate keys list')")
	if err != nil {
		return err
	}
	defer st.Close()
	if _, err := operator.RevokeKey(ctx, st, "", id, time.Now()); err != nil {
		return notFound("key", id, err)
	}
	fmt.Fprintf(c.stdout, "key %s revoked\n", id)
	return nil
}
