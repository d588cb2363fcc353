package admin

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/sqlite"
)

const testToken = "admin-token-0123456789abcdef"

// newTestAPI serves the admin API on loopback over a real SQLite store.
func newTestAPI(t *testing.T, wrap func(*sqlite.DB) Store) (*httptest.Server, *sqlite.DB) {
	t.Helper()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "t.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	var st Store = db
	if wrap != nil {
		st = wrap(db)
	}
	srv := httptest.NewServer(routes(New(st, Options{Token: testToken, Models: []string{"chat-1"}, AuditGrace: time.Minute})))
	t.Cleanup(srv.Close)
	return srv, db
}

type apiError struct {
	Error struct {
		Code, Message, Param string
	}
}

// call makes one request and returns the status and the decoded error
// envelope (zero for a success).
func call(t *testing.T, srv *httptest.Server, token, method, path, body string) (int, apiError, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e apiError
	if resp.StatusCode >= 400 {
		if err := json.Unmarshal(b, &e); err != nil || e.Error.Code == "" {
			t.Fatalf("%s %s: %d without an error envelope: %s", method, path, resp.StatusCode, b)
		}
	}
	return resp.StatusCode, e, b
}

func TestAdminRefusesWithoutTheToken(t *testing.T) {
	srv, _ := newTestAPI(t, nil)
	for _, token := range []string{"", "wrong", strings.ToUpper(testToken)} {
		status, e, _ := call(t, srv, token, "GET", "/admin/v1/accounts", "")
		if status != 401 || e.Error.Code != "unauthorized" {
			t.Errorf("token %q: %d %+v", token, status, e)
		}
	}
	// No token configured: everything is refused, even an empty bearer.
	open := httptest.NewServer(routes(New(nil, Options{})))
	defer open.Close()
	if status, e, _ := call(t, open, "", "GET", "/admin/v1/accounts", ""); status != 401 || e.Error.Code != "unauthorized" {
		t.Errorf("no token configured: %d %+v", status, e)
	}
	req, _ := http.NewRequest("GET", srv.URL+"/admin/v1/audit", nil)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer") {
		t.Errorf("401 without a Bearer challenge: %q", got)
	}
}

func TestAdminErrorPaths(t *testing.T) {
	srv, db := newTestAPI(t, nil)
	acct := tollgate.Account{ID: "acct_test", Name: "t", Created: time.Now().UTC().Truncate(time.Microsecond)}
	if err := db.CreateAccount(context.Background(), acct); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, method, path, body string
		status                   int
		code, param, message     string
	}{
		{"bad JSON", "POST", "/admin/v1/accounts", `{"name":`, 400, "invalid_request", "", "want {\"name\": \"...\"}"},
		{"unknown field", "POST", "/admin/v1/accounts", `{"name":"a","owner":"b"}`, 400, "invalid_request", "", "unknown field \"owner\""},
		{"trailing data", "POST", "/admin/v1/accounts", `{"name":"a"} {}`, 400, "invalid_request", "", "nothing after it"},
		{"unknown account", "GET", "/admin/v1/accounts/acct_nope", "", 404, "not_found", "", "account acct_nope does not exist"},
		{"disable unknown", "POST", "/admin/v1/accounts/acct_nope/disable", "", 404, "not_found", "", "account acct_nope"},
		{"credit unknown", "POST", "/admin/v1/accounts/acct_nope/credit", `{"amount":"5"}`, 404, "not_found", "", "account acct_nope"},
		{"keys of unknown", "GET", "/admin/v1/keys?account=acct_nope", "", 404, "not_found", "", "account acct_nope"},
		{"key for unknown", "POST", "/admin/v1/keys", `{"account_id":"acct_nope"}`, 404, "not_found", "", "account acct_nope"},
		{"revoke unknown", "POST", "/admin/v1/keys/key_nope/revoke", "", 404, "not_found", "", "key key_nope"},
		{"unknown route", "GET", "/admin/v1/nothing", "", 404, "not_found", "", "is not an admin API route"},
		{"amount with 13 decimals", "POST", "/admin/v1/accounts/acct_test/credit", `{"amount":"0.0000000000001"}`, 400, "invalid_request", "amount", "more than 12 decimals"},
		{"amount not a number", "POST", "/admin/v1/accounts/acct_test/credit", `{"amount":"five"}`, 400, "invalid_request", "amount", "not a decimal number"},
		{"negative amount", "POST", "/admin/v1/accounts/acct_test/credit", `{"amount":"-5"}`, 400, "invalid_request", "", ""},
		{"zero amount", "POST", "/admin/v1/accounts/acct_test/credit", `{"amount":"0"}`, 400, "invalid_request", "", "must be positive"},
		{"debit beyond the balance", "POST", "/admin/v1/accounts/acct_test/debit", `{"amount":"1"}`, 402, "insufficient_balance", "", "exceeds the free balance of 0 USD"},
		{"key without account", "POST", "/admin/v1/keys", `{"name":"k"}`, 400, "invalid_request", "account_id", "required"},
		{"negative spend limit", "POST", "/admin/v1/keys", `{"account_id":"acct_test","spend_limit":"-1"}`, 400, "invalid_request", "spend_limit", ""},
		{"negative rpm", "POST", "/admin/v1/keys", `{"account_id":"acct_test","rpm":-1}`, 400, "invalid_request", "rpm", ""},
		{"model not in the catalogue", "POST", "/admin/v1/keys", `{"account_id":"acct_test","models":["gpt-9"]}`, 400, "invalid_request", "models", `"gpt-9" is not in the catalogue (chat-1)`},
		{"bad expiry", "POST", "/admin/v1/keys", `{"account_id":"acct_test","expires":"someday"}`, 400, "invalid_request", "expires", ""},
		{"bad usage backend", "GET", "/admin/v1/usage?backend=gpu", "", 400, "invalid_request", "backend", "want network or fallback"},
		{"bad usage since", "GET", "/admin/v1/usage?since=yesterday", "", 400, "invalid_request", "since", "want a time"},
		{"wrong method", "DELETE", "/admin/v1/accounts/acct_test", "", 404, "not_found", "", "DELETE /admin/v1/accounts/acct_test is not an admin API route"},
	}
	for _, c := range cases {
		status, e, body := call(t, srv, testToken, c.method, c.path, c.body)
		if status != c.status || e.Error.Code != c.code || e.Error.Param != c.param || !strings.Contains(e.Error.Message, c.message) {
			t.Errorf("%s: %d %s\nwant %d %s param %q message containing %q", c.name, status, body, c.status, c.code, c.param, c.message)
		}
	}
	// Nothing above changed the books.
	b, err := db.Balance(context.Background(), "acct_test")
	if err != nil || b.Balance != 0 || b.Held != 0 {
		t.Errorf("balance after refused requests: %+v %v", b, err)
	}
	if keys, err := db.Keys(context.Background(), ""); err != nil || len(keys) != 0 {
		t.Errorf("keys after refused requests: %v %v", keys, err)
	}
}

// conflictStore is the real store with another writer that took the same
// account id first: the store's own refusal must reach the operator as 409.
type conflictStore struct{ *sqlite.DB }

func (s conflictStore) CreateAccount(ctx context.Context, a tollgate.Account) error {
	if err := s.DB.CreateAccount(ctx, a); err != nil {
		return err
	}
	return s.DB.CreateAccount(ctx, a)
}

func TestAdminConflict(t *testing.T) {
	srv, _ := newTestAPI(t, func(db *sqlite.DB) Store { return conflictStore{db} })
	status, e, body := call(t, srv, testToken, "POST", "/admin/v1/accounts", `{"name":"a"}`)
	if status != 409 || e.Error.Code != "conflict" || !strings.Contains(e.Error.Message, "already exists") || strings.Contains(string(body), "UNIQUE") {
		t.Errorf("duplicate account: %d %s", status, body)
	}
}

// The audit records its run (source admin_api) with what it reported, and
// its response is the report alone.
func TestAdminAuditRecordsTheRun(t *testing.T) {
	srv, db := newTestAPI(t, nil)
	ctx := t.Context()
	if err := db.CreateAccount(ctx, tollgate.Account{ID: "acct_a", Name: "a", Created: time.Now(), Balance: tollgate.MustParseAmount("7.000000000003")}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.LastAudit(ctx); !errors.Is(err, tollgate.ErrNotFound) {
		t.Fatalf("LastAudit before any audit: %v", err)
	}
	status, _, body := call(t, srv, testToken, "GET", "/admin/v1/audit", "")
	var fields map[string]json.RawMessage
	var rep billing.AuditReport
	if status != 200 || json.Unmarshal(body, &fields) != nil || json.Unmarshal(body, &rep) != nil || !rep.OK {
		t.Fatalf("audit: %d %s", status, body)
	}
	if got := slices.Sorted(maps.Keys(fields)); !slices.Equal(got, []string{"accounts", "balance", "held", "keys", "ok", "problems", "time"}) {
		t.Errorf("audit response fields %v", got)
	}
	run, err := db.LastAudit(ctx)
	if err != nil || run.Source != tollgate.AuditFromAdminAPI || !run.OK || run.Accounts != 1 || run.Keys != 0 ||
		run.Balance != rep.Balance || rep.Balance != tollgate.MustParseAmount("7.000000000003") || !run.Time.Equal(rep.Time) ||
		run.ProblemCount != 0 || run.Problems != nil || run.Took <= 0 {
		t.Errorf("recorded run %+v, %v; the report was %+v", run, err, rep)
	}
}

// failingRecord is a store that cannot record audits.
type failingRecord struct{ *sqlite.DB }

func (failingRecord) RecordAudit(context.Context, tollgate.AuditRun) error {
	return errors.New("disk full")
}

// A run that cannot be recorded still answers with the report.
func TestAdminAuditUnrecordedStillReports(t *testing.T) {
	srv, _ := newTestAPI(t, func(db *sqlite.DB) Store { return failingRecord{db} })
	status, _, body := call(t, srv, testToken, "GET", "/admin/v1/audit", "")
	var rep billing.AuditReport
	if status != 200 || json.Unmarshal(body, &rep) != nil || !rep.OK || rep.Time.IsZero() {
		t.Errorf("audit whose record failed: %d %s", status, body)
	}
}
