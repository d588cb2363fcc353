package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/tollgate/tollgate/billing"
)

// auditCmd is `tollgate audit`: checks that the books add up.
type auditCmd struct {
	storeCommand
	stdout, stderr io.Writer
	json           bool
	grace          time.Duration
}

// errAuditFailed makes the exit status 1 after the problems were printed.
var errAuditFailed = errors.New("the books do not add up")

func (c *auditCmd) Run(ctx context.Context, args []string) error {
	fs := newFlagSet("audit", `audit [--grace DURATION] [--json] [--config FILE]

Checks every account: balance = opening + credits - debits - charges (the sum
of its ledger), what is held = the sum of its holds and no more than the
balance, the balance not below zero, and no hold whose lease ended more than
--grace ago (orphaned: nothing released it). Checks every key's spent and held
totals against the ledger and the holds. Exits 1 if anything is wrong.`, c.stderr)
	c.registerConfigFlag(fs)
	fs.DurationVar(&c.grace, "grace", -1, "how long past its lease a hold may live (default: two sweeps and a renewal of the config)")
	fs.BoolVar(&c.json, "json", false, "print the report as JSON")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 0, ""); err != nil {
		return err
	}
	st, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	bs, err := books(st)
	if err != nil {
		return err
	}
	grace := c.grace
	if grace < 0 {
		grace = auditGrace(c.cfg)
	}
	r, err := billing.Audit(ctx, bs, time.Now(), grace)
	if err != nil {
		return err
	}
	if c.json {
		r.Details = nil
		if err := writeJSON(c.stdout, r); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(c.stdout, "%d accounts, %d keys; balances %s USD, held %s USD\n", r.Accounts, r.Keys, r.Balance, r.Held)
		for _, p := range r.Problems {
			fmt.Fprintln(c.stdout, "PROBLEM:", p)
		}
		if r.OK {
			fmt.Fprintln(c.stdout, "ok: every balance is the sum of its ledger and every hold is live")
		}
	}
	if !r.OK {
		return errAuditFailed
	}
	return nil
}
