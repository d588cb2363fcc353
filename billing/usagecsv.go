package billing

import (
	"encoding/csv"
	"slices"
	"strconv"
)

// UsageColumns are a usage row's column names and values as `tollgate
// usage` prints them (and the console exports them): the period when
// grouped by one, the groups in UsageGroups' order, then the sums.
func UsageColumns(by []string, period bool, r UsageRow) (head, vals []string) {
	if period {
		head, vals = append(head, "period"), append(vals, r.Period)
	}
	for _, g := range UsageGroups {
		if !slices.Contains(by, g) {
			continue
		}
		head = append(head, g)
		switch g {
		case "account":
			vals = append(vals, r.Account)
		case "key":
			vals = append(vals, r.Key)
		case "model":
			vals = append(vals, r.Model)
		case "backend":
			vals = append(vals, r.Backend)
		}
	}
	i := strconv.FormatInt
	head = append(head, "requests", "prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens", "estimated", "cost_usd", "uncollected_usd",
		"searches")
	vals = append(vals, i(r.Requests, 10), i(r.PromptTokens, 10), i(r.CompletionTokens, 10), i(r.CachedTokens, 10),
		i(r.ReasoningTokens, 10), i(r.Estimated, 10), r.Cost.String(), r.Uncollected.String(), i(r.Searches, 10))
	return head, vals
}

// WriteUsageCSV writes a header row and one row per usage row (the caller flushes).
func WriteUsageCSV(cw *csv.Writer, by []string, period bool, rows []UsageRow) error {
	head, _ := UsageColumns(by, period, UsageRow{})
	if err := cw.Write(head); err != nil {
		return err
	}
	for _, r := range rows {
		_, vals := UsageColumns(by, period, r)
		if err := cw.Write(vals); err != nil {
			return err
		}
	}
	return nil
}
