package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/operator"
)

// accountsPostCmd is `tollgate accounts credit|debit ACCOUNT_ID AMOUNT`.
type accountsPostCmd struct {
	storeCommand
	stdout, stderr io.Writer
	kind           tollgate.LedgerKind
	note           string
	json           bool
}

func (c *accountsPostCmd) Run(ctx context.Context, args []string) error {
	verb := string(c.kind)
	help := "Adds AMOUNT USD to the account's balance, with a ledger entry."
	if c.kind == tollgate.LedgerDebit {
		help = "Takes AMOUNT USD from the account's balance, with a ledger entry. A debit may\nnot take more than the free balance (the balance minus what requests in flight hold)."
	}
	fs := newFlagSet("accounts "+verb, "accounts "+verb+" ACCOUNT_ID AMOUNT [--note TEXT] [--json] [--config FILE]\n\n"+help+"\nAMOUNT is a decimal number of USD with at most 12 decimals (e.g. 25 or 0.50).", c.stderr)
	c.registerConfigFlag(fs)
	fs.StringVar(&c.note, "note", "", "why (kept in the ledger)")
	fs.BoolVar(&c.json, "json", false, "print {\"entry\": ..., \"balance\": ...} as JSON")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 2, "ACCOUNT_ID and AMOUNT"); err != nil {
		return err
	}
	amount, err := parseUSD("AMOUNT", pos[1], false)
	if err != nil {
		if strings.HasPrefix(pos[1], "-") && c.kind == tollgate.LedgerCredit {
			return usageError{err.Error() + " (to take from a balance, use 'tollgate accounts debit')"}
		}
		return err
	}
	st, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	p, err := operator.Post(ctx, st, c.kind, pos[0], amount, c.note, "the CLI as "+cliUser(), time.Now())
	if err != nil {
		return notFound("account", pos[0], err)
	}
	if c.json {
		return writeJSON(c.stdout, p)
	}
	b := p.Balance
	fmt.Fprintf(c.stdout, "%s %s USD on %s (entry %s); balance %s USD, held %s USD, free %s USD\n",
		c.kind, amount, pos[0], p.Entry.ID, b.Balance, b.Held, b.Free)
	return nil
}

// cliUser is who runs the CLI, user@host, for the ledger's record of who
// posted an entry; what cannot be learnt is left out.
func cliUser() string {
	name := ""
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	switch {
	case name != "" && host != "":
		return name + "@" + host
	case name != "":
		return name
	case host != "":
		return "someone on " + host
	}
	return "an unknown user"
}
