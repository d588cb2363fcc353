package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"text/tabwriter"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/operator"
)

// accountsCmd is `tollgate accounts create|list|show|disable|enable`.
type accountsCmd struct {
	stdout, stderr io.Writer
}

func (c *accountsCmd) Run(ctx context.Context, args []string) error {
	return runGroup(ctx, "accounts", []subcommand{
		{"create", "create an account", &accountsCreateCmd{stdout: c.stdout, stderr: c.stderr}},
		{"list", "list accounts", &accountsListCmd{stdout: c.stdout, stderr: c.stderr}},
		{"show", "show one account and its keys", &accountsShowCmd{stdout: c.stdout, stderr: c.stderr}},
		{"disable", "refuse every key of an account (403 account_disabled)", &accountsSetDisabledCmd{stdout: c.stdout, stderr: c.stderr, disabled: true}},
		{"enable", "accept the account's keys again", &accountsSetDisabledCmd{stdout: c.stdout, stderr: c.stderr}},
		{"invite", "issue a one-time link where the holder sets a console password", &accountsInviteCmd{stdout: c.stdout, stderr: c.stderr}},
		{"credit", "add to an account's balance (ledger entry)", &accountsPostCmd{stdout: c.stdout, stderr: c.stderr, kind: tollgate.LedgerCredit}},
		{"debit", "take from an account's balance (ledger entry)", &accountsPostCmd{stdout: c.stdout, stderr: c.stderr, kind: tollgate.LedgerDebit}},
	}, args, c.stderr)
}

// accountsCreateCmd is `tollgate accounts create --name NAME`.
type accountsCreateCmd struct {
	storeCommand
	stdout, stderr io.Writer
	name           string
	json           bool
}

func (c *accountsCreateCmd) Run(ctx context.Context, args []string) error {
	fs := newFlagSet("accounts create", `accounts create --name NAME [--json] [--config FILE]

Creates an account with a zero balance and prints its id.`, c.stderr)
	c.registerConfigFlag(fs)
	fs.StringVar(&c.name, "name", "", "a name for the account (required)")
	fs.BoolVar(&c.json, "json", false, "print the account as JSON")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 0, ""); err != nil {
		return err
	}
	if c.name == "" {
		fs.Usage()
		return usageError{"--name is required"}
	}
	st, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	a, err := operator.CreateAccount(ctx, st, c.name, time.Now())
	if err != nil {
		return err
	}
	if c.json {
		return writeJSON(c.stdout, a)
	}
	fmt.Fprintln(c.stdout, a.ID)
	return nil
}

// accountsListCmd is `tollgate accounts list`.
type accountsListCmd struct {
	storeCommand
	stdout, stderr io.Writer
	json           bool
}

func (c *accountsListCmd) Run(ctx context.Context, args []string) error {
	fs := newFlagSet("accounts list", `accounts list [--json] [--config FILE]

Lists every account, oldest first.`, c.stderr)
	c.registerConfigFlag(fs)
	fs.BoolVar(&c.json, "json", false, "print a JSON array")
	st, err := c.openFlagsOnly(ctx, fs, args)
	if err != nil {
		return err
	}
	defer st.Close()
	accts, err := st.Accounts(ctx)
	if err != nil {
		return err
	}
	if c.json {
		return writeJSON(c.stdout, accts)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tCREATED\tSTATUS\tBALANCE (USD)")
	for _, a := range accts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", a.ID, a.Name, a.Created.Format(time.RFC3339), accountStatus(a), a.Balance)
	}
	return tw.Flush()
}

func accountStatus(a tollgate.Account) string {
	if a.Disabled {
		return "disabled"
	}
	return "active"
}

// accountsShowCmd is `tollgate accounts show ID`.
type accountsShowCmd struct {
	storeCommand
	stdout, stderr io.Writer
	json           bool
}

func (c *accountsShowCmd) Run(ctx context.Context, args []string) error {
	fs := newFlagSet("accounts show", `accounts show ACCOUNT_ID [--json] [--config FILE]

Shows one account and its keys (prefixes only; secrets are never stored).`, c.stderr)
	c.registerConfigFlag(fs)
	fs.BoolVar(&c.json, "json", false, "print {\"account\": ..., \"keys\": [...]} as JSON")
	st, id, err := c.openWithID(ctx, fs, args, "one ACCOUNT_ID")
	if err != nil {
		return err
	}
	defer st.Close()
	a, err := st.Account(ctx, id)
	if err != nil {
		return notFound("account", id, err)
	}
	keys, err := st.Keys(ctx, a.ID)
	if err != nil {
		return err
	}
	money, err := operator.View(ctx, st, a)
	if err != nil {
		return err
	}
	if c.json {
		return writeJSON(c.stdout, struct {
			Account tollgate.Account `json:"account"`
			Held    tollgate.Amount  `json:"held"`
			Free    tollgate.Amount  `json:"free"`
			Keys    []tollgate.Key   `json:"keys"`
		}{a, money.Held, money.Free, keys})
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "id:\t%s\n", a.ID)
	fmt.Fprintf(tw, "name:\t%s\n", a.Name)
	fmt.Fprintf(tw, "created:\t%s\n", a.Created.Format(time.RFC3339))
	fmt.Fprintf(tw, "status:\t%s\n", accountStatus(a))
	fmt.Fprintf(tw, "balance:\t%s USD\n", a.Balance)
	fmt.Fprintf(tw, "held:\t%s USD\n", money.Held)
	fmt.Fprintf(tw, "free:\t%s USD\n", money.Free)
	fmt.Fprintf(tw, "keys:\t%d\n", len(keys))
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(keys) > 0 {
		fmt.Fprintln(c.stdout)
		return printKeys(c.stdout, keys, time.Now())
	}
	return nil
}

// accountsSetDisabledCmd is `tollgate accounts disable|enable ID`.
type accountsSetDisabledCmd struct {
	storeCommand
	stdout, stderr io.Writer
	disabled       bool
}

func (c *accountsSetDisabledCmd) Run(ctx context.Context, args []string) error {
	verb := "enable"
	help := "Accepts the account's keys again."
	if c.disabled {
		verb = "disable"
		help = "Refuses every key of the account with 403 account_disabled, on every\ninstance within the auth poll interval. Keys stay as they are."
	}
	fs := newFlagSet("accounts "+verb, "accounts "+verb+" ACCOUNT_ID [--config FILE]\n\n"+help, c.stderr)
	c.registerConfigFlag(fs)
	st, id, err := c.openWithID(ctx, fs, args, "one ACCOUNT_ID")
	if err != nil {
		return err
	}
	defer st.Close()
	if _, err := operator.SetDisabled(ctx, st, id, c.disabled); err != nil {
		return notFound("account", id, err)
	}
	fmt.Fprintf(c.stdout, "account %s %sd\n", id, verb)
	return nil
}

// accountsInviteCmd is `tollgate accounts invite ID`.
type accountsInviteCmd struct {
	storeCommand
	stdout, stderr io.Writer
}

func (c *accountsInviteCmd) Run(ctx context.Context, args []string) error {
	fs := newFlagSet("accounts invite", `accounts invite ACCOUNT_ID [--config FILE]

Issues a one-time invitation and prints its link on the api listener: the
account holder opens it, sets a console password (which replaces any earlier
one) and signs in at /console/ with the account id. The link works once and
expires after 72 hours.`, c.stderr)
	c.registerConfigFlag(fs)
	st, id, err := c.openWithID(ctx, fs, args, "one ACCOUNT_ID")
	if err != nil {
		return err
	}
	defer st.Close()
	inv, err := operator.Invite(ctx, st, id, time.Now())
	if err != nil {
		return notFound("account", id, err)
	}
	fmt.Fprintf(c.stdout, "%s%s\n(one use, expires %s)\n", consoleBase(c.cfg.Listen.API), inv.Path, inv.Expires.Format(time.RFC3339))
	return nil
}

// consoleBase is the api listener's address as a URL for links printed by
// the CLI: a wildcard host becomes localhost.
func consoleBase(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "http://" + listen
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port)
}
