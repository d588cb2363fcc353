package console

import (
	"cmp"
	"encoding/csv"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/operator"
	"github.com/tollgate/tollgate/server"
)

// chartDays is how many days the overview's chart shows, today included.
const chartDays = 30

type overviewData struct {
	Balance                     tollgate.Balance
	Today, Month                tollgate.Amount
	TodayRequests, MonthRequest int64
	Spend, Tokens               chart // per day by model, the chart's days
	Models                      []modelSpend
	Prices                      []priceRow
	Uptime                      string
	// TopUpNotice says auto top-up was turned off, and why (a declined card).
	TopUpNotice string
}

// modelSpend is one model's charges over the chart's days.
type modelSpend struct {
	Model    string
	Requests int64
	Tokens   int64
	Cost     tollgate.Amount
}

// Overview is the signed-in account's home page.
func (c *Console) Overview(w http.ResponseWriter, r *http.Request) error {
	req := current(r)
	ctx := r.Context()
	var d overviewData
	var err error
	if d.Balance, err = c.st.Balance(ctx, req.account.ID); err != nil {
		return err
	}
	now := c.o.Now().UTC()
	today, first, month, since := overviewDays(now)
	acc := newChartAcc(first)
	byModel := map[string]*modelSpend{}
	closed, err := c.closed.get(ctx, c.st, c.o.Log, req.account.ID, since, today)
	if err != nil {
		return err
	}
	live, err := c.st.DailyCharges(ctx, tollgate.UsageFilter{AccountID: req.account.ID, Since: today})
	if err != nil {
		return err
	}
	for _, day := range append(closed[:len(closed):len(closed)], live...) {
		if !day.Day.Before(month) {
			d.Month += day.Cost
			d.MonthRequest += day.Requests
		}
		if day.Day.Equal(today) {
			d.Today += day.Cost
			d.TodayRequests += day.Requests
		}
		if day.Day.Before(first) {
			continue
		}
		acc.add(day.Day, day.Model, day.Cost, day.PromptTokens+day.CompletionTokens)
		m := byModel[day.Model]
		if m == nil {
			m = &modelSpend{Model: day.Model}
			byModel[day.Model] = m
		}
		m.Requests += day.Requests
		m.Tokens += day.PromptTokens + day.CompletionTokens
		m.Cost += day.Cost
	}
	d.Spend, d.Tokens = acc.charts()
	for _, m := range byModel {
		d.Models = append(d.Models, *m)
	}
	slices.SortFunc(d.Models, func(a, b modelSpend) int {
		return cmp.Or(cmp.Compare(b.Cost, a.Cost), strings.Compare(a.Model, b.Model))
	})
	if d.Prices, d.Uptime, err = c.prices(r); err != nil {
		return err
	}
	if d.TopUpNotice, err = c.topUpNotice(r); err != nil {
		return err
	}
	v := c.accountView(r, "Overview", "overview")
	v.Data = d
	return c.render(w, http.StatusOK, "overview", v)
}

// overviewDays are the overview's days: today, the chart's first, this
// month's first, and the earliest of the last two (where its sums start).
func overviewDays(now time.Time) (today, first, month, since time.Time) {
	now = now.UTC()
	today = now.Truncate(24 * time.Hour)
	month = time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	first = today.AddDate(0, 0, -(chartDays - 1))
	since = first
	if month.Before(first) {
		since = month
	}
	return today, first, month, since
}

// priceRow is one model's line of /pricing, as /pricing writes it.
type priceRow struct {
	ID        string      `json:"id"`
	Network   *priceRates `json:"network"`
	Fallback  *priceRates `json:"fallback"`
	Average   priceRates  `json:"average"`
	WebSearch string      `json:"web_search"`
}

type priceRates struct {
	Input  string `json:"input"`
	Output string `json:"output"`
}

// prices reads the catalogue's prices through the function that writes
// /pricing, so the console shows exactly its figures.
func (c *Console) prices(r *http.Request) ([]priceRow, string, error) {
	if c.o.Catalog == nil {
		return nil, "", nil
	}
	var network, total int64
	if c.o.Uptime != nil {
		var err error
		if network, total, err = c.o.Uptime.Uptime(r.Context()); err != nil {
			return nil, "", err
		}
	}
	var doc struct {
		Data   []priceRow      `json:"data"`
		Uptime json.RawMessage `json:"network_uptime_7d"`
	}
	if err := json.Unmarshal(server.BuildPricing(c.o.Catalog(), network, total), &doc); err != nil {
		return nil, "", err
	}
	return doc.Data, string(doc.Uptime), nil
}

// models are the catalogue's model ids.
func (c *Console) models() []string {
	if c.o.Catalog == nil {
		return nil
	}
	cat := c.o.Catalog()
	out := make([]string, 0, len(cat.Models))
	for _, m := range cat.Models {
		out = append(out, m.ID)
	}
	return out
}

type keysData struct {
	Keys    []keyRow
	Models  []string
	Created *operator.CreatedKey // shown once, right after creation
	Form    keyForm              // what was typed, when the form is shown again with an error
}

type keyRow struct {
	tollgate.Key
	Status string
	Usage  tollgate.KeyUsage
}

type keyForm struct {
	Name, Expires, SpendLimit, RPM, TPM string
	Models                              []string
}

func (c *Console) keysData(r *http.Request) (keysData, error) {
	req := current(r)
	keys, err := c.st.Keys(r.Context(), req.account.ID)
	if err != nil {
		return keysData{}, err
	}
	usage, err := c.st.KeyUsage(r.Context(), req.account.ID)
	if err != nil {
		return keysData{}, err
	}
	byKey := make(map[string]tollgate.KeyUsage, len(usage))
	for _, u := range usage {
		byKey[u.KeyID] = u
	}
	now := c.o.Now()
	d := keysData{Models: c.models()}
	// Newest first: the key just made is at the top.
	for i := len(keys) - 1; i >= 0; i-- {
		k := keys[i]
		row := keyRow{Key: k, Usage: byKey[k.ID], Status: "active"}
		switch {
		case !k.Revoked.IsZero():
			row.Status = "revoked"
		case !k.Active(now):
			row.Status = "expired"
		}
		d.Keys = append(d.Keys, row)
	}
	return d, nil
}

// Keys lists the account's keys, with the form to create one.
func (c *Console) Keys(w http.ResponseWriter, r *http.Request) error {
	d, err := c.keysData(r)
	if err != nil {
		return err
	}
	v := c.accountView(r, "API keys", "keys")
	v.Data = d
	return c.render(w, http.StatusOK, "keys", v)
}

// CreateKey makes a key with the admin API's rules and shows its secret in
// the answer to the POST, the only time it is shown (never in a redirect's
// URL, never stored).
func (c *Console) CreateKey(w http.ResponseWriter, r *http.Request) error {
	req := current(r)
	form := keyForm{Name: r.PostFormValue("name"), Expires: strings.TrimSpace(r.PostFormValue("expires")),
		SpendLimit: strings.TrimSpace(r.PostFormValue("spend_limit")), RPM: strings.TrimSpace(r.PostFormValue("rpm")),
		TPM: strings.TrimSpace(r.PostFormValue("tpm")), Models: r.PostForm["models"]}
	created, err := c.newKey(r, req.account.ID, form)
	d, derr := c.keysData(r)
	if derr != nil {
		return derr
	}
	v := c.accountView(r, "API keys", "keys")
	status := http.StatusCreated
	if err != nil {
		var te *tollgate.Error
		if !asError(err, &te) {
			return err
		}
		v.Error, d.Form, status = te, form, statusOf(te.Code)
	} else {
		d.Created = &created
		c.o.Log.Info("key created in the console", "key", created.Key.ID, "account", created.Key.AccountID)
	}
	v.Data = d
	return c.render(w, status, "keys", v)
}

func (c *Console) newKey(r *http.Request, accountID string, f keyForm) (operator.CreatedKey, error) {
	kr := operator.KeyRequest{AccountID: accountID, Name: f.Name, Expires: f.Expires, Models: f.Models}
	var err error
	if f.SpendLimit != "" {
		if kr.SpendLimit, err = tollgate.ParseAmount(f.SpendLimit); err != nil || kr.SpendLimit <= 0 {
			return operator.CreatedKey{}, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "spend_limit",
				"spend limit %q: want a positive amount of USD such as 5 or 12.50, or nothing for no limit", f.SpendLimit)
		}
	}
	for _, n := range []struct {
		name, text string
		dst        *int64
	}{{"rpm", f.RPM, &kr.RPM}, {"tpm", f.TPM, &kr.TPM}} {
		if n.text == "" {
			continue
		}
		if *n.dst, err = strconv.ParseInt(n.text, 10, 64); err != nil || *n.dst < 0 {
			return operator.CreatedKey{}, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, n.name,
				"%s %q: want a whole number, or nothing for no limit", n.name, n.text)
		}
	}
	return operator.CreateKey(r.Context(), c.st, kr, c.models(), c.o.Now())
}

// RevokeKey revokes one of the signed-in account's keys; another account's
// key id is not found, whether or not it exists.
func (c *Console) RevokeKey(w http.ResponseWriter, r *http.Request) error {
	req := current(r)
	id := r.PathValue("id")
	if _, err := operator.RevokeKey(r.Context(), c.st, req.account.ID, id, c.o.Now()); errors.Is(err, tollgate.ErrNotFound) {
		return tollgate.Errorf(tollgate.CodeNotFound, "this account has no key %s", id)
	} else if err != nil {
		return err
	}
	c.o.Log.Info("key revoked in the console", "key", id, "account", req.account.ID)
	http.Redirect(w, r, "/console/keys", http.StatusSeeOther)
	return nil
}

// activityPage is how many charges one page of the activity shows.
const activityPage = 50

type activityData struct {
	Entries   []activityRow
	Keys      []tollgate.Key
	Models    []string
	Filter    activityFilter
	Page      int
	Prev      string // query of the previous page, "" on the first
	Next      string // query of the next page, "" on the last
	CSV       string // query of the CSV export
	KeyLabels map[string]string
	// Payments are the account's newest payment events in the filter's
	// days, on the first page (payments on).
	Payments []paymentActivity
}

type activityRow struct {
	tollgate.LedgerEntry
	Key string
}

type activityFilter struct{ Key, Model, Since, Until string }

func (f activityFilter) query(page int) string {
	q := make([]string, 0, 5)
	for _, kv := range [][2]string{{"key", f.Key}, {"model", f.Model}, {"since", f.Since}, {"until", f.Until}} {
		if kv[1] != "" {
			q = append(q, kv[0]+"="+urlEscape(kv[1]))
		}
	}
	if page > 1 {
		q = append(q, "page="+strconv.Itoa(page))
	}
	return strings.Join(q, "&")
}

// activityFilter reads the filter; the dates are days (UTC), until inclusive.
func (c *Console) activityFilter(r *http.Request) (activityFilter, tollgate.UsageFilter, error) {
	q := r.URL.Query()
	f := activityFilter{Key: q.Get("key"), Model: q.Get("model"), Since: q.Get("since"), Until: q.Get("until")}
	until := ""
	if f.Until != "" {
		t, err := time.Parse(time.DateOnly, f.Until)
		if err != nil {
			return f, tollgate.UsageFilter{}, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "until", "until %q: want a date such as 2026-01-31", f.Until)
		}
		until = t.AddDate(0, 0, 1).Format(time.DateOnly)
	}
	if f.Since != "" {
		if _, err := time.Parse(time.DateOnly, f.Since); err != nil {
			return f, tollgate.UsageFilter{}, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "since", "since %q: want a date such as 2026-01-01", f.Since)
		}
	}
	uf, err := operator.ParseFilter(current(r).account.ID, f.Key, f.Model, "", f.Since, until, c.o.Now())
	return f, uf, err
}

// Activity is the account's spending, filtered.
func (c *Console) Activity(w http.ResponseWriter, r *http.Request) error {
	req := current(r)
	f, uf, err := c.activityFilter(r)
	if err != nil {
		return err
	}
	page, _ := strconv.Atoi(r.URL.Query().Get("page"))
	page = max(page, 1)
	entries, err := c.st.RecentCharges(r.Context(), uf, (page-1)*activityPage, activityPage+1)
	if err != nil {
		return err
	}
	keys, err := c.st.Keys(r.Context(), req.account.ID)
	if err != nil {
		return err
	}
	labels := make(map[string]string, len(keys))
	for _, k := range keys {
		labels[k.ID] = cmp.Or(k.Name, k.Prefix+"…")
	}
	d := activityData{Keys: keys, Models: c.models(), Filter: f, Page: page, CSV: f.query(0)}
	if len(entries) > activityPage {
		entries = entries[:activityPage]
		d.Next = f.query(page + 1)
	}
	if page > 1 {
		d.Prev = f.query(page - 1)
		if d.Prev == "" {
			d.Prev = "page=1"
		}
	}
	for _, e := range entries {
		d.Entries = append(d.Entries, activityRow{LedgerEntry: e, Key: labels[e.Charge.KeyID]})
	}
	if page == 1 {
		if d.Payments, err = c.paymentsActivity(r, uf); err != nil {
			return err
		}
	}
	v := c.accountView(r, "Activity", "activity")
	v.Data = d
	return c.render(w, http.StatusOK, "activity", v)
}

// ActivityCSV is the filtered charges summed by day, key, model and backend,
// in the columns of `tollgate usage --by key,model,backend --period day --csv`.
func (c *Console) ActivityCSV(w http.ResponseWriter, r *http.Request) error {
	_, uf, err := c.activityFilter(r)
	if err != nil {
		return err
	}
	days, err := c.st.DailyCharges(r.Context(), uf)
	if err != nil {
		return err
	}
	by := []string{"key", "model", "backend"}
	rows := make([]billing.UsageRow, 0, len(days))
	for _, d := range days {
		rows = append(rows, billing.UsageRow{Period: d.Day.Format(time.DateOnly), Key: d.KeyID, Model: d.Model, Backend: string(d.Class),
			Requests: d.Requests, PromptTokens: d.PromptTokens, CompletionTokens: d.CompletionTokens, CachedTokens: d.CachedTokens,
			ReasoningTokens: d.ReasoningTokens, Estimated: d.Estimated, Cost: d.Cost, Uncollected: d.Uncollected, Searches: d.Searches})
	}
	// billing.Usage's order: period, then key, model and backend as strings.
	slices.SortFunc(rows, func(a, b billing.UsageRow) int {
		return cmp.Or(strings.Compare(a.Period, b.Period), strings.Compare(a.Key, b.Key), strings.Compare(a.Model, b.Model),
			strings.Compare(a.Backend, b.Backend))
	})
	keys, err := c.st.Keys(r.Context(), current(r).account.ID)
	if err != nil {
		return err
	}
	names := make(map[string]string, len(keys))
	for _, k := range keys {
		names[k.ID] = k.Name
	}
	w.Header().Set("Content-Type", "text/csv; charset=utf-8")
	w.Header().Set("Content-Disposition", `attachment; filename="tollgate-usage-`+current(r).account.ID+`.csv"`)
	cw := csv.NewWriter(w)
	// tollgate usage's columns, and the key's name after its id: the page
	// shows names, the CLI and the API ids.
	head, _ := billing.UsageColumns(by, true, billing.UsageRow{})
	at := slices.Index(head, "key") + 1
	if err := cw.Write(slices.Insert(head, at, "key_name")); err != nil {
		return err
	}
	for _, row := range rows {
		_, vals := billing.UsageColumns(by, true, row)
		if err := cw.Write(slices.Insert(vals, at, names[row.Key])); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}
