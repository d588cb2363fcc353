package main

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/operator"
)

// usageCmd is `tollgate usage`: charges summed by account, key, model,
// backend and period, from the ledger.
type usageCmd struct {
	storeCommand
	stdout, stderr               io.Writer
	account, key, model, backend string
	since, until, by, period     string
	json, csv                    bool
}

func (c *usageCmd) Run(ctx context.Context, args []string) error {
	fs := newFlagSet("usage", `usage [--account ID] [--key ID] [--model ID] [--backend network|fallback]
	[--since WHEN] [--until WHEN] [--by account,key,model,backend] [--period hour|day|month]
	[--csv | --json] [--config FILE]

Sums the charges in the ledger: requests, tokens (prompt, completion, cached,
reasoning), how many were estimated, the cost charged and any uncollected
excess. WHEN is a time (RFC 3339), a date (YYYY-MM-DD, UTC) or a duration back
from now (24h). Without --by and --period, one total row.`, c.stderr)
	c.registerConfigFlag(fs)
	fs.StringVar(&c.account, "account", "", "only this account")
	fs.StringVar(&c.key, "key", "", "only this key (id)")
	fs.StringVar(&c.model, "model", "", "only this catalogue model")
	fs.StringVar(&c.backend, "backend", "", "only this backend class (network or fallback)")
	fs.StringVar(&c.since, "since", "", "from this time on (inclusive)")
	fs.StringVar(&c.until, "until", "", "before this time")
	fs.StringVar(&c.by, "by", "", "group by these, comma-separated: "+strings.Join(billing.UsageGroups, ", "))
	fs.StringVar(&c.period, "period", "", "group by period (UTC): "+strings.Join(billing.UsagePeriods, ", "))
	fs.BoolVar(&c.json, "json", false, "print a JSON array")
	fs.BoolVar(&c.csv, "csv", false, "print CSV with a header row")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 0, ""); err != nil {
		return err
	}
	if c.json && c.csv {
		return usageError{"--json and --csv exclude each other"}
	}
	f, err := operator.ParseFilter(c.account, c.key, c.model, c.backend, c.since, c.until, time.Now())
	if err != nil {
		return usageError{err.Error()}
	}
	var by []string
	if c.by != "" {
		by = splitList(c.by)
	}
	st, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	rows, err := billing.Usage(ctx, st, f, by, c.period)
	if tollgate.ErrorCode(err) == tollgate.CodeInvalidRequest {
		return usageError{err.Error()} // a bad --by or --period
	}
	if err != nil {
		return err // the store's: exit status 1
	}
	switch {
	case c.json:
		return writeJSON(c.stdout, rows)
	case c.csv:
		return writeUsageCSV(c.stdout, by, c.period != "", rows)
	}
	return writeUsageTable(c.stdout, by, c.period != "", rows)
}

func writeUsageCSV(w io.Writer, by []string, period bool, rows []billing.UsageRow) error {
	cw := csv.NewWriter(w)
	if err := billing.WriteUsageCSV(cw, by, period, rows); err != nil {
		return err
	}
	cw.Flush()
	return cw.Error()
}

func writeUsageTable(w io.Writer, by []string, period bool, rows []billing.UsageRow) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	head, _ := billing.UsageColumns(by, period, billing.UsageRow{})
	fmt.Fprintln(tw, strings.ToUpper(strings.Join(head, "\t"))+"\t")
	for _, r := range rows {
		_, vals := billing.UsageColumns(by, period, r)
		fmt.Fprintln(tw, strings.Join(vals, "\t")+"\t")
	}
	return tw.Flush()
}
