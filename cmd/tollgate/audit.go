package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/billing"
)

// auditCmd is `tollgate audit`: checks that the books add up.
type auditCmd struct {
	storeCommand
	stdout, stderr io.Writer
	json           bool
	grace          optionalDuration
}

// optionalDuration is a duration flag that may be left unset: its default
// is derived from the config, so -h prints no "(default ...)" for it.
type optionalDuration struct {
	d   time.Duration
	set bool
}

func (o *optionalDuration) String() string {
	if o == nil || !o.set {
		return ""
	}
	return o.d.String()
}

func (o *optionalDuration) Set(v string) error {
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return errors.New("want a duration such as 10m")
	}
	o.d, o.set = d, true
	return nil
}

// errAuditFailed makes the exit status 1 after the problems were printed.
var errAuditFailed = errors.New("the books do not add up")

func (c *auditCmd) Run(ctx context.Context, args []string) error {
	fs := newFlagSet("audit", `audit [--grace DURATION] [--json] [--config FILE]

Checks every account: balance = opening + credits - debits - charges (the sum
of its ledger), what is held = the sum of its holds and no more than the
balance, the balance not below zero, and no hold whose lease ended more than
--grace ago (orphaned: nothing released it). Checks every key's spent and held
totals against the ledger and the holds. Exits 1 if anything is wrong. The
run is recorded in the store, where the operator console's service page shows
the last one.`, c.stderr)
	c.registerConfigFlag(fs)
	fs.Var(&c.grace, "grace", "how long past its lease a hold may live, a `DURATION` such as 10m (default: two sweeps and a renewal of the config)")
	fs.BoolVar(&c.json, "json", false, "print the report as JSON")
	st, err := c.openFlagsOnly(ctx, fs, args)
	if err != nil {
		return err
	}
	defer st.Close()
	grace := c.grace.d
	if !c.grace.set {
		grace = auditGrace(c.cfg)
	}
	r, err := billing.RunAudit(ctx, st, time.Now(), grace, tollgate.AuditFromCLI)
	unrecorded := errors.Is(err, billing.ErrAuditNotRecorded)
	if err != nil && !unrecorded {
		return err
	}
	if c.json {
		r.Details = nil
		if err := writeJSON(c.stdout, r); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(c.stdout, "%s, %s; balances %s USD, held %s USD\n", count(r.Accounts, "account"), count(r.Keys, "key"), r.Balance, r.Held)
		for _, p := range r.Problems {
			fmt.Fprintln(c.stdout, "PROBLEM:", p)
		}
		if r.OK {
			fmt.Fprintln(c.stdout, "ok: every balance is the sum of its ledger and every hold is live")
		}
	}
	if unrecorded {
		// The report above is whole; the exit status stays the books'.
		fmt.Fprintln(c.stderr, "warning:", err)
	}
	if !r.OK {
		return errAuditFailed
	}
	return nil
}
