package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/config"
)

// The operator's tools on a running service's store: credit, debit, show,
// key limits, usage in three formats, and the audit (clean, then failing on
// an orphaned hold).
func TestOperatorCLI(t *testing.T) {
	h := newHarness(t, harnessOptions{models: flatModel, credit: tollgate.Dollars(1)})
	cfgPath := filepath.Join(h.main.Config.Dir, "tollgate.yaml")
	acct := h.acct.ID

	out, err := cli(t, "accounts", "credit", acct, "2.5", "--note", "top-up", "--config", cfgPath)
	if err != nil || !strings.Contains(out, "balance 3.5 USD") {
		t.Fatalf("credit: %q, %v", out, err)
	}
	if _, err := cli(t, "accounts", "debit", acct, "99", "--config", cfgPath); tollgate.ErrorCode(err) != tollgate.CodeInsufficientBalance {
		t.Errorf("debit beyond the balance: %v, want insufficient_balance", err)
	}
	if _, err := cli(t, "accounts", "debit", acct, "0.5", "--config", cfgPath); err != nil {
		t.Fatalf("debit: %v", err)
	}
	var shown struct {
		Account tollgate.Account `json:"account"`
		Held    tollgate.Amount  `json:"held"`
		Free    tollgate.Amount  `json:"free"`
	}
	out, err = cli(t, "accounts", "show", acct, "--json", "--config", cfgPath)
	if err != nil || json.Unmarshal([]byte(out), &shown) != nil || shown.Account.Balance != tollgate.Dollars(3) || shown.Free != tollgate.Dollars(3) {
		t.Fatalf("show: %q, %v", out, err)
	}
	if out, _ := cli(t, "accounts", "show", acct, "--config", cfgPath); !strings.Contains(out, "held:") || !strings.Contains(out, "free:") {
		t.Errorf("show without --json lacks held/free:\n%s", out)
	}

	var created struct {
		Key    tollgate.Key `json:"key"`
		Secret string       `json:"secret"`
	}
	out, err = cli(t, "keys", "create", "--account", acct, "--spend-limit", "0.00007", "--rpm", "100", "--tpm", "100000", "--json", "--config", cfgPath)
	if err != nil || json.Unmarshal([]byte(out), &created) != nil {
		t.Fatalf("keys create: %q, %v", out, err)
	}
	if created.Key.SpendLimit != tollgate.MustParseAmount("0.00007") || created.Key.RPM != 100 || created.Key.TPM != 100000 {
		t.Errorf("created key limits = %+v", created.Key)
	}
	for i, want := range []int{200, 200, 403} { // 2 × 30.00007 µUSD fit in 70 µUSD, a third does not
		if status, _, body := h.postKey(created.Secret, flatBody, nil); status != want {
			t.Errorf("request %d with the limited key: %d %s, want %d", i, status, body, want)
		}
	}
	if status, _, body := h.post("/v1/chat/completions", flatBody, nil); status != 200 {
		t.Fatalf("request: %d %s", status, body)
	}

	h.main.Biller.Wait()
	var rows []billing.UsageRow
	out, err = cli(t, "usage", "--account", acct, "--by", "key,model", "--json", "--config", cfgPath)
	if err != nil || json.Unmarshal([]byte(out), &rows) != nil {
		t.Fatalf("usage --json: %q, %v", out, err)
	}
	if len(rows) != 2 || rows[0].Model != "bill-flat" || rows[0].Requests+rows[1].Requests != 3 ||
		rows[0].Cost+rows[1].Cost != flatHold*3 || rows[0].CompletionTokens+rows[1].CompletionTokens != 30 {
		t.Errorf("usage rows = %+v", rows)
	}
	out, err = cli(t, "usage", "--account", acct, "--period", "day", "--csv", "--config", cfgPath)
	recs, cerr := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil || cerr != nil || len(recs) != 2 || recs[0][0] != "period" || recs[1][1] != "3" || recs[1][7] != (flatHold*3).String() {
		t.Errorf("usage --csv: %q, %v %v", out, err, cerr)
	}
	if out, err := cli(t, "usage", "--by", "backend", "--config", cfgPath); err != nil || !strings.Contains(out, "network") {
		t.Errorf("usage table: %q, %v", out, err)
	}
	if _, err := cli(t, "usage", "--by", "colour", "--config", cfgPath); err == nil {
		t.Error("usage --by colour: no error")
	}

	if out, err := cli(t, "audit", "--config", cfgPath); err != nil || !strings.HasPrefix(strings.Split(out, "\n")[1], "ok") {
		t.Fatalf("audit of clean books: %q, %v", out, err)
	}
	if run, err := h.books().LastAudit(context.Background()); err != nil || run.Source != tollgate.AuditFromCLI || !run.OK || run.Accounts < 1 {
		t.Errorf("the CLI's audit recorded %+v, %v", run, err)
	}
	// A hold nobody renews or releases: the audit must fail once its lease is past the grace.
	orphan := &tollgate.BillingOp{Kind: tollgate.OpHold, Hold: tollgate.Hold{ID: "hold_orphan", RequestID: "req_orphan",
		AccountID: acct, KeyID: h.keyRec.ID, Model: "bill-flat", Class: tollgate.ClassNetwork, Amount: 1, Owner: "inst_dead",
		Created: time.Now().Add(-time.Hour), Expires: time.Now().Add(-time.Hour)}}
	if err := h.books().ApplyBilling(context.Background(), []*tollgate.BillingOp{orphan}); err != nil || orphan.Outcome != tollgate.HoldOK {
		t.Fatalf("place orphan: %v %d", err, orphan.Outcome)
	}
	out, err = cli(t, "audit", "--json", "--config", cfgPath)
	var rep billing.AuditReport
	if !errors.Is(err, errAuditFailed) || json.Unmarshal([]byte(out), &rep) != nil || rep.OK || len(rep.Problems) != 1 ||
		!strings.Contains(rep.Problems[0], "orphaned") {
		t.Errorf("audit with an orphaned hold: %v %s", err, out)
	}
	if run, err := h.books().LastAudit(context.Background()); err != nil || run.Source != tollgate.AuditFromCLI || run.OK ||
		!run.Time.Equal(rep.Time) || run.ProblemCount != 1 || !slices.Equal(run.Problems, rep.Problems) || run.Balance != rep.Balance {
		t.Errorf("the CLI's failed audit recorded %+v, %v; it reported %+v", run, err, rep)
	}
}

// adminAPIServer serves the admin listener's routes with cfg's admin token.
func adminAPIServer(t *testing.T, h *harness, cfg *config.Config) *httptest.Server {
	t.Helper()
	op, err := newOperator(cfg, h.main.Relay, h.main.Share, h.main.Store, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return httptest.NewServer(h.main.Server.Handler(adminListenerRoutes(h.main.Server, newAdminAPI(cfg, h.main.Store, nil, nil), op, nil, nil, cfg.AdminToken)))
}

// The admin API: token required (401 unauthorized), show, credit, usage, audit.
func TestAdminAPI(t *testing.T) {
	h := newHarness(t, harnessOptions{models: flatModel, credit: tollgate.Dollars(1)})
	cfg := *h.main.Config
	cfg.AdminToken = "s3cret-admin-token"
	srv := adminAPIServer(t, h, &cfg)
	defer srv.Close()
	call := func(method, path, token, body string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	acctPath := "/admin/v1/accounts/" + h.acct.ID
	for _, tok := range []string{"", "wrong", "s3cret-admin-token-and-more"} {
		if status, body := call("GET", acctPath, tok, ""); status != 401 || !strings.Contains(string(body), `"code":"unauthorized"`) {
			t.Errorf("token %q: %d %s", tok, status, body)
		}
	}
	const tok = "s3cret-admin-token"
	if status, body := call("POST", acctPath+"/credit", tok, `{"amount":"0.75","note":"api"}`); status != 200 || !strings.Contains(string(body), `"free": "1.75"`) {
		t.Errorf("credit: %d %s", status, body)
	}
	if status, body := call("POST", acctPath+"/debit", tok, `{"amount":"5"}`); status != 402 {
		t.Errorf("debit beyond the free balance: %d %s", status, body)
	}
	if status, body := call("POST", acctPath+"/credit", tok, `{"amount":1.5}`); status != 200 {
		t.Errorf("credit with a JSON number: %d %s", status, body)
	}
	if status, body := call("POST", acctPath+"/credit", tok, `{"amount":"-1"}`); status != 400 {
		t.Errorf("negative credit: %d %s", status, body)
	}
	if status, _ := call("GET", "/admin/v1/accounts/acct_nope", tok, ""); status != 404 {
		t.Errorf("unknown account: %d", status)
	}
	if status, _, body := h.post("/v1/chat/completions", flatBody, nil); status != 200 {
		t.Fatalf("request: %d %s", status, body)
	}
	h.main.Biller.Wait()
	var view AccountViewJSON
	status, body := call("GET", acctPath, tok, "")
	if status != 200 || json.Unmarshal(body, &view) != nil || view.Balance != tollgate.MustParseAmount("3.25")-flatHold || view.Held != 0 {
		t.Errorf("show: %d %s", status, body)
	}
	var usage struct {
		Data []billing.UsageRow `json:"data"`
	}
	status, body = call("GET", "/admin/v1/usage?account="+h.acct.ID+"&by=model&period=month", tok, "")
	if status != 200 || json.Unmarshal(body, &usage) != nil || len(usage.Data) != 1 || usage.Data[0].Cost != flatHold || usage.Data[0].Period == "" {
		t.Errorf("usage: %d %s", status, body)
	}
	if status, _ := call("GET", "/admin/v1/usage?backend=moon", tok, ""); status != 400 {
		t.Errorf("usage with a bad backend: %d", status)
	}
	var rep billing.AuditReport
	if status, body := call("GET", "/admin/v1/audit", tok, ""); status != 200 || json.Unmarshal(body, &rep) != nil || !rep.OK {
		t.Errorf("audit: %d %s", status, body)
	}
	if run, err := h.books().LastAudit(context.Background()); err != nil || run.Source != tollgate.AuditFromAdminAPI || !run.Time.Equal(rep.Time) {
		t.Errorf("the admin API's audit recorded %+v, %v; it reported %+v", run, err, rep)
	}
	// Health stays open without a token.
	if status, _ := call("GET", "/healthz", "", ""); status != 200 {
		t.Errorf("/healthz: %d", status)
	}
}

// The admin API's accounts and keys: create an account, fund it, give it a
// key restricted to one model, use the key on the API listener, disable and
// enable the account, revoke the key; bad bodies are 400 with the field.
func TestAdminAPIAccountsAndKeys(t *testing.T) {
	h := newHarness(t, harnessOptions{models: flatModel, credit: tollgate.Dollars(1)})
	cfg := *h.main.Config
	cfg.AdminToken = "s3cret-admin-token"
	srv := adminAPIServer(t, h, &cfg)
	defer srv.Close()
	call := func(method, path, body string, into any) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer s3cret-admin-token")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if into != nil && resp.StatusCode < 300 {
			if err := json.Unmarshal(b, into); err != nil {
				t.Fatalf("%s %s: %v in %s", method, path, err, b)
			}
		}
		return resp.StatusCode, b
	}
	var acct struct {
		ID       string          `json:"id"`
		Name     string          `json:"name"`
		Disabled bool            `json:"disabled"`
		Free     tollgate.Amount `json:"free"`
	}
	if status, body := call("POST", "/admin/v1/accounts", `{"name":"acme"}`, &acct); status != 201 || acct.Name != "acme" || !strings.HasPrefix(acct.ID, "acct_") {
		t.Fatalf("create account: %d %s", status, body)
	}
	if status, body := call("POST", "/admin/v1/accounts/"+acct.ID+"/credit", `{"amount":"2"}`, nil); status != 200 {
		t.Fatalf("credit: %d %s", status, body)
	}
	var accts struct {
		Data []struct {
			ID   string          `json:"id"`
			Free tollgate.Amount `json:"free"`
		} `json:"data"`
	}
	if status, body := call("GET", "/admin/v1/accounts", "", &accts); status != 200 || len(accts.Data) != 2 || accts.Data[1].ID != acct.ID || accts.Data[1].Free != tollgate.Dollars(2) {
		t.Errorf("list accounts: %d %s", status, body)
	}

	for _, bad := range []struct{ body, param string }{
		{`{"name":"x"}`, "account_id"},
		{`{"account_id":"` + acct.ID + `","models":["gpt-imaginary"]}`, "models"},
		{`{"account_id":"` + acct.ID + `","expires":"yesterday"}`, "expires"},
		{`{"account_id":"` + acct.ID + `","spend_limit":"-1"}`, "spend_limit"},
		{`{"account_id":"` + acct.ID + `","colour":"red"}`, ""},
	} {
		status, body := call("POST", "/admin/v1/keys", bad.body, nil)
		if status != 400 || !strings.Contains(string(body), `"param":"`+bad.param+`"`) && bad.param != "" {
			t.Errorf("key %s: %d %s, want 400 naming %q", bad.body, status, body, bad.param)
		}
	}
	if status, _ := call("POST", "/admin/v1/keys", `{"account_id":"acct_nope"}`, nil); status != 404 {
		t.Errorf("key for an unknown account: %d", status)
	}
	var created struct {
		Key struct {
			ID            string    `json:"id"`
			Prefix        string    `json:"prefix"`
			AllowedModels []string  `json:"allowed_models"`
			Expires       time.Time `json:"expires"`
			RPM           int64     `json:"rpm"`
		} `json:"key"`
		Secret string `json:"secret"`
	}
	status, body := call("POST", "/admin/v1/keys", `{"account_id":"`+acct.ID+`","name":"ci","models":["bill-flat"],"expires":"30d","rpm":100}`, &created)
	if status != 201 || !tollgate.LooksLikeKey(created.Secret) || created.Key.Prefix != tollgate.DisplayPrefix(created.Secret) ||
		len(created.Key.AllowedModels) != 1 || created.Key.RPM != 100 || time.Until(created.Key.Expires) < 29*24*time.Hour {
		t.Fatalf("create key: %d %s", status, body)
	}
	if status, body := call("GET", "/admin/v1/keys?account="+acct.ID, "", nil); status != 200 || !strings.Contains(string(body), created.Key.ID) ||
		strings.Contains(string(body), created.Secret) {
		t.Errorf("list keys: %d %s", status, body)
	}
	auth := map[string]string{"Authorization": "Bearer " + created.Secret}
	// The API answers the new key; after each change, within the auth cache's poll.
	expect := func(what string, want int, code string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			status, _, body := h.post("/v1/chat/completions", flatBody, auth)
			if status == want && strings.Contains(string(body), code) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d %s, want %d %s", what, status, body, want, code)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	expect("the new key", 200, "")
	if status, body := call("POST", "/admin/v1/accounts/"+acct.ID+"/disable", "", &acct); status != 200 || !acct.Disabled {
		t.Fatalf("disable: %d %s", status, body)
	}
	expect("the disabled account's key", 403, "account_disabled")
	if status, body := call("POST", "/admin/v1/accounts/"+acct.ID+"/enable", "", &acct); status != 200 || acct.Disabled {
		t.Fatalf("enable: %d %s", status, body)
	}
	expect("the enabled account's key", 200, "")
	var revoked struct {
		Revoked time.Time `json:"revoked"`
	}
	if status, body := call("POST", "/admin/v1/keys/"+created.Key.ID+"/revoke", "", &revoked); status != 200 || revoked.Revoked.IsZero() {
		t.Fatalf("revoke: %d %s", status, body)
	}
	expect("the revoked key", 401, "api_key_revoked")
	if status, _ := call("POST", "/admin/v1/keys/key_nope/revoke", "", nil); status != 404 {
		t.Errorf("revoke an unknown key: %d", status)
	}
	if status, _ := call("POST", "/admin/v1/accounts/acct_nope/disable", "", nil); status != 404 {
		t.Errorf("disable an unknown account: %d", status)
	}
}

// AccountViewJSON reads admin.AccountView.
type AccountViewJSON struct {
	Balance tollgate.Amount `json:"balance"`
	Held    tollgate.Amount `json:"held"`
	Free    tollgate.Amount `json:"free"`
}
