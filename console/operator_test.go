package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/relay"
)

const adminToken = "s3cret-admin-token"

// newOperator serves the operator's console beside the env's store; set
// changes its options.
func newOperator(t *testing.T, e *env, token string, set ...func(*OperatorOptions)) *browser {
	o := OperatorOptions{Token: token, Catalog: e.con.o.Catalog, Uptime: uptime{3, 4},
		APIBase: "http://api.example", Now: e.clock.now}
	for _, f := range set {
		f(&o)
	}
	op, err := NewOperator(e.st, o)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(operatorRoutes(op))
	t.Cleanup(srv.Close)
	b := e.browser(t)
	b.e = &env{srv: srv, st: e.st, clock: e.clock}
	return b
}

func (b *browser) operatorSignin(token string) page {
	b.t.Helper()
	p := b.get("/console/signin")
	return b.post("/console/signin", url.Values{"csrf": {p.csrf(b.t)}, "token": {token}})
}

func TestOperatorNeedsTheToken(t *testing.T) {
	e := newEnv(t, Options{})
	b := newOperator(t, e, adminToken)
	for _, path := range []string{"/console/", "/console/service", "/console/accounts/" + e.acct.ID} {
		if r := b.get(path); r.status != http.StatusSeeOther || r.header.Get("Location") != "/console/signin" {
			t.Errorf("GET %s without signing in: %d %q", path, r.status, r.header.Get("Location"))
		}
	}
	if r := b.post("/console/accounts/"+e.acct.ID+"/credit", url.Values{"amount": {"100"}}); r.status != http.StatusUnauthorized {
		t.Errorf("credit without signing in: %d", r.status)
	}
	for _, tok := range []string{"", "wrong", adminToken + "x"} {
		if r := b.operatorSignin(tok); r.status != http.StatusUnauthorized || r.code() != "unauthorized" {
			t.Errorf("sign-in with %q: %d %s", tok, r.status, r.code())
		}
	}
	// An account holder's session is not an operator's.
	hb := e.signedIn(t)
	for _, c := range hb.c.Jar.Cookies(mustURL(e.srv.URL + "/console/")) {
		req, _ := http.NewRequest("GET", b.e.srv.URL+"/console/", nil)
		req.AddCookie(&http.Cookie{Name: operatorCookie, Value: c.Value})
		if r := b.do(req); r.status != http.StatusSeeOther {
			t.Errorf("an account holder's cookie opened the operator console: %d", r.status)
		}
	}
	if bal, _ := e.st.Balance(t.Context(), e.acct.ID); bal.Balance != tollgate.MustParseAmount("10") {
		t.Errorf("balance moved without the token: %s", bal.Balance)
	}
	// No token configured: nobody signs in.
	nb := newOperator(t, e, "")
	if r := nb.operatorSignin(""); r.status != http.StatusUnauthorized {
		t.Errorf("sign-in with no token configured: %d", r.status)
	}
}

func mustURL(s string) *url.URL { u, _ := url.Parse(s); return u }

func TestOperatorAccounts(t *testing.T) {
	e := newEnv(t, Options{})
	e.newAccount(t, "zeta corp", "3")
	b := newOperator(t, e, adminToken)
	if r := b.operatorSignin(adminToken); r.status != http.StatusSeeOther {
		t.Fatalf("sign-in: %d %s", r.status, r.code())
	}
	list := b.get("/console/")
	if list.status != 200 || !strings.Contains(list.body, "zeta corp") || !strings.Contains(list.body, e.acct.ID) || !strings.Contains(list.body, "10.00") {
		t.Fatalf("accounts: %d\n%s", list.status, list.body)
	}
	if s := b.get("/console/?q=ZETA"); !strings.Contains(s.body, "zeta corp") || strings.Contains(s.body, e.acct.ID) {
		t.Error("search by name did not narrow the list")
	}
	csrf := list.csrf(t)
	if r := b.post("/console/accounts", url.Values{"name": {"no token"}}); r.status != http.StatusBadRequest || r.code() != "invalid_request" {
		t.Errorf("create without the CSRF token: %d %s", r.status, r.code())
	}
	if r := b.post("/console/accounts", url.Values{"csrf": {csrf}, "name": {" "}}); r.status != http.StatusBadRequest || !strings.Contains(r.body, `data-param="name"`) {
		t.Errorf("create without a name: %d %s", r.status, r.code())
	}
	r := b.post("/console/accounts", url.Values{"csrf": {csrf}, "name": {"new co"}})
	loc := r.header.Get("Location")
	id := regexp.MustCompile(`acct_[0-9A-Za-z]+`).FindString(loc)
	if r.status != http.StatusSeeOther || id == "" {
		t.Fatalf("create: %d %q", r.status, loc)
	}
	acct := "/console/accounts/" + id
	if r := b.post(acct+"/credit", url.Values{"csrf": {csrf}, "amount": {"12.345"}, "note": {"invoice 7"}}); r.status != http.StatusSeeOther {
		t.Fatalf("credit: %d %s", r.status, r.code())
	}
	if r := b.post(acct+"/debit", url.Values{"csrf": {csrf}, "amount": {"0.345"}, "note": {"refund"}}); r.status != http.StatusSeeOther {
		t.Fatalf("debit: %d %s", r.status, r.code())
	}
	if r := b.post(acct+"/debit", url.Values{"csrf": {csrf}, "amount": {"100"}}); r.status != http.StatusPaymentRequired || r.code() != "insufficient_balance" {
		t.Errorf("debit beyond the free balance: %d %s", r.status, r.code())
	}
	if r := b.post(acct+"/credit", url.Values{"csrf": {csrf}, "amount": {"-5"}}); r.status != http.StatusBadRequest || !strings.Contains(r.body, `data-param="amount"`) {
		t.Errorf("negative credit: %d %s", r.status, r.code())
	}
	var notes []string
	_ = e.st.Ledger(t.Context(), tollgate.UsageFilter{AccountID: id}, func(le tollgate.LedgerEntry) error {
		notes = append(notes, string(le.Kind)+" "+le.Amount.String()+" "+le.Note)
		return nil
	})
	if strings.Join(notes, "; ") != "credit 12.345 invoice 7; debit -0.345 refund" {
		t.Errorf("ledger = %q", notes)
	}
	p := b.get(acct + "?done=credit")
	if !strings.Contains(p.body, shown("balance", "12.00")) || !strings.Contains(p.body, "Credit posted.") {
		t.Errorf("account page after the entries:\n%s", p.body)
	}
	// The page lists the entries, newest first, with their notes and who
	// made them (this console, from the test's loopback address).
	entries := regexp.MustCompile(`<tr class="entry-(\w+)"><td class="nowrap">[^<]+</td><td>\w+</td><td class="num"><data class="[^"]+" value="([-0-9.]+)"[^>]*>[^<]+</data></td><td>([^<]*)</td><td>([^<]*)</td>`).FindAllStringSubmatch(p.body, -1)
	var listed []string
	for _, m := range entries {
		listed = append(listed, strings.Join(m[1:], " | "))
	}
	if want := []string{"debit | -0.345000000000 | refund | the operator console from 127.0.0.1", "credit | 12.345000000000 | invoice 7 | the operator console from 127.0.0.1"}; strings.Join(listed, "\n") != strings.Join(want, "\n") {
		t.Errorf("the account page lists the entries\n%s\nwant\n%s", strings.Join(listed, "\n"), strings.Join(want, "\n"))
	}
	// Disabling asks first: the button only opens the confirmation.
	if !regexp.MustCompile(`(?s)<details class="confirm"><summary class="button danger">Disable the account…</summary>.*?<form method="post" action="/console/accounts/` + id + `/disable">`).MatchString(p.body) {
		t.Errorf("disable is not behind a confirmation:\n%s", p.body)
	}
	if r := b.post(acct+"/disable", url.Values{"csrf": {csrf}}); r.status != http.StatusSeeOther {
		t.Fatalf("disable: %d", r.status)
	}
	if a, _ := e.st.Account(t.Context(), id); !a.Disabled {
		t.Error("not disabled")
	}
	if r := b.post(acct+"/enable", url.Values{"csrf": {csrf}}); r.status != http.StatusSeeOther {
		t.Fatalf("enable: %d", r.status)
	}
	if a, _ := e.st.Account(t.Context(), id); a.Disabled {
		t.Error("not enabled again")
	}
	inv := b.post(acct+"/invite", url.Values{"csrf": {csrf}})
	link := regexp.MustCompile(`http://api\.example/console/invite\?token=(inv-[0-9A-Za-z]{32})`).FindStringSubmatch(inv.body)
	if inv.status != http.StatusCreated || link == nil {
		t.Fatalf("invite: %d\n%s", inv.status, inv.body)
	}
	if got, err := e.st.AcceptInvite(t.Context(), tollgate.HashKey(link[1]), "h", e.clock.now()); err != nil || got != id {
		t.Errorf("the invitation shown does not work: %q %v", got, err)
	}
	if r := b.post("/console/accounts/acct_nope/credit", url.Values{"csrf": {csrf}, "amount": {"1"}}); r.status != http.StatusNotFound {
		t.Errorf("credit of a missing account: %d", r.status)
	}
	if r := b.post("/console/signout", url.Values{"csrf": {csrf}}); r.status != http.StatusSeeOther {
		t.Fatalf("sign-out: %d", r.status)
	}
	if r := b.get("/console/"); r.status != http.StatusSeeOther {
		t.Errorf("after sign-out: %d", r.status)
	}
}

func TestOperatorService(t *testing.T) {
	e := newEnv(t, Options{})
	e.charge(t, e.key, "tg-chat", 5, e.clock.now())
	// The first node is ejected by outlier detection while its probes
	// pass, the third is down by its probes.
	ejectedUntil := e.clock.now().Add(90 * time.Second)
	b := newOperator(t, e, adminToken, func(o *OperatorOptions) {
		o.NodeHealth = func(n *relay.Node) relay.NodeHealth {
			h := relay.NodeHealth{Up: true, Recent: 40, RequestsInARow: 0, Window: time.Minute}
			switch n.BaseURL {
			case "http://127.0.0.1:1/v1":
				if n.Class == tollgate.ClassNetwork {
					h.EjectedUntil, h.RecentFailed, h.RequestsInARow = ejectedUntil, 12, 5
				}
			case "http://127.0.0.1:2/v1":
				h.Up, h.ProbesInARow = false, 3
			}
			return h
		}
	})
	b.operatorSignin(adminToken)
	p := b.get("/console/service")
	if p.status != 200 || strings.Count(p.body, `status-active">up`) != 1 || !strings.Contains(p.body, "75% (3 of 4 requests)") ||
		!strings.Contains(p.body, `id="audit-result">Never run`) || !strings.Contains(p.body, `href="http://api.example/pricing"`) {
		t.Fatalf("service: %d\n%s", p.status, p.body)
	}
	for _, want := range []string{
		`<span class="status-revoked">ejected</span> until ` + ejectedUntil.UTC().Format("15:04:05") + ` UTC (failing requests)`,
		`<span class="status-revoked">down</span> (health probes)`,
		`Failed, last 1m0s`, `>12 of 40<`, `>5 / 0<`, `>0 / 3<`,
	} {
		if !strings.Contains(p.body, want) {
			t.Errorf("service page lacks %q\n%s", want, p.body)
		}
	}
	if r := b.post("/console/service/audit", url.Values{"csrf": {p.csrf(t)}}); r.status != http.StatusSeeOther {
		t.Fatalf("run audit: %d %s", r.status, r.code())
	}
	after := b.get("/console/service?done=audit")
	rep, _ := billing.Audit(t.Context(), e.st, e.clock.now(), 0)
	line := regexp.MustCompile(`id="audit-result" class="status-active">OK at [^:]+:\d\d UTC from the operator console: 1 accounts, 1 keys, balances <data class="amt[^"]*" value="9\.\d{12}"[^>]*>\d+\.\d{6}</data> USD, held <data class="amt" value="0\.0{12}"[^>]*>0\.000000</data> USD; took \d[^ ]*s\.`)
	if !rep.OK || !line.MatchString(after.body) {
		t.Errorf("audit result not shown:\n%s", after.body)
	}
	if run, err := e.st.LastAudit(t.Context()); err != nil || run.Source != tollgate.AuditFromConsole || !run.Time.Equal(e.clock.now()) || run.Balance != rep.Balance {
		t.Errorf("the console's audit recorded %+v, %v", run, err)
	}
	// Another instance, or this one restarted, shows the same run.
	other := newOperator(t, e, adminToken)
	other.operatorSignin(adminToken)
	if p := other.get("/console/service"); !line.MatchString(p.body) {
		t.Errorf("a new operator console does not show the audit:\n%s", p.body)
	}
}

// The service page shows the last audit recorded in the store, wherever it
// ran: a freshly built console (a restarted instance) shows a failed run
// from the CLI with its kept problems and how many more there were, then a
// run through the admin API.
func TestOperatorServiceShowsTheLastAuditFromAnywhere(t *testing.T) {
	e := newEnv(t, Options{})
	problems := make([]string, tollgate.AuditProblemsKept+7)
	for i := range problems {
		problems[i] = fmt.Sprintf("account acct_%02d: balance <1> is below zero", i)
	}
	at := e.clock.now().Add(-time.Hour)
	cli := tollgate.AuditRun{Time: at, Source: tollgate.AuditFromCLI, Accounts: 57, Keys: 3, Balance: tollgate.MustParseAmount("12.5"),
		Held: tollgate.MustParseAmount("0.25"), Problems: problems[:tollgate.AuditProblemsKept], ProblemCount: int64(len(problems)), Took: 1234567 * time.Microsecond}
	if err := e.st.RecordAudit(t.Context(), cli); err != nil {
		t.Fatal(err)
	}
	b := newOperator(t, e, adminToken)
	b.operatorSignin(adminToken)
	p := b.get("/console/service")
	want := `id="audit-result" class="status-revoked">57 problems at ` + at.Format("2006-01-02 15:04") + ` UTC from the CLI: 57 accounts, 3 keys, balances ` + cash("12.5") + ` USD, held ` + cash("0.25") + ` USD; took 1.235s.`
	// Beside the held figure, why money is held right after traffic.
	if !regexp.MustCompile(`(?s)` + regexp.QuoteMeta(want) + `</p>\s*<p class="held-note" id="held-note">Held money right after traffic is normal, not stuck`).MatchString(p.body) {
		t.Errorf("the service page has no note about held money right after the audit's figure")
	}
	if !strings.Contains(p.body, want) || strings.Count(p.body, "is below zero</li>") != tollgate.AuditProblemsKept ||
		!strings.Contains(p.body, "balance &lt;1&gt;") || !strings.Contains(p.body, "<li>and 7 more") || strings.Contains(p.body, "acct_50") {
		t.Fatalf("service page after a CLI audit, want %q:\n%s", want, p.body)
	}

	adm := admin.New(e.st, admin.Options{Token: adminToken, Now: e.clock.now})
	api := httptest.NewServer(adm.Authorized(adm.Audit))
	defer api.Close()
	req, _ := http.NewRequest("GET", api.URL+"/admin/v1/audit", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := api.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("admin audit: %d", resp.StatusCode)
	}
	b = newOperator(t, e, adminToken)
	b.operatorSignin(adminToken)
	p = b.get("/console/service")
	if !regexp.MustCompile(`class="status-active">OK at `+e.clock.now().Format("2006-01-02 15:04")+` UTC from the admin API: 1 accounts`).MatchString(p.body) ||
		strings.Contains(p.body, "<li>") && strings.Contains(p.body, "below zero") {
		t.Errorf("service page after an admin API audit:\n%s", p.body)
	}
}

// Every operator form refuses a missing or foreign CSRF token and changes
// nothing; an operator session ends after its 12 hours; failed sign-ins are
// limited per client, counted as the holder's are.
func TestOperatorCSRFExpiryAndLimit(t *testing.T) {
	e := newEnv(t, Options{})
	b := newOperator(t, e, adminToken)
	if r := b.operatorSignin(adminToken); r.status != http.StatusSeeOther {
		t.Fatalf("sign-in: %d %s", r.status, r.code())
	}
	other := newOperator(t, e, adminToken)
	other.e = b.e // the same operator console, another browser
	other.operatorSignin(adminToken)
	foreign := other.get("/console/").csrf(t)
	acct := "/console/accounts/" + e.acct.ID
	forms := map[string]url.Values{
		"/console/accounts":      {"name": {"x"}},
		acct + "/credit":         {"amount": {"5"}, "note": {"x"}},
		acct + "/debit":          {"amount": {"5"}, "note": {"x"}},
		acct + "/disable":        {},
		acct + "/invite":         {},
		"/console/service/audit": {},
		"/console/signout":       {},
	}
	for path, form := range forms {
		for name, tok := range map[string]string{"no token": "", "another session's": foreign} {
			f := url.Values{}
			for k, v := range form {
				f[k] = v
			}
			if tok != "" {
				f.Set("csrf", tok)
			}
			if r := b.post(path, f); r.status != http.StatusBadRequest || r.code() != "invalid_request" {
				t.Errorf("POST %s with %s token: %d %s, want 400 invalid_request", path, name, r.status, r.code())
			}
		}
	}
	if bal, _ := e.st.Balance(t.Context(), e.acct.ID); bal.Balance != tollgate.MustParseAmount("10") {
		t.Errorf("the balance moved through forms without a valid token: %s", bal.Balance)
	}
	if a, _ := e.st.Account(t.Context(), e.acct.ID); a.Disabled {
		t.Error("the account was disabled through a form without a valid token")
	}
	if r := b.get("/console/"); r.status != 200 {
		t.Fatalf("still signed in after the refused sign-out: %d", r.status)
	}
	e.clock.add(operatorSessionTTL)
	if r := b.get("/console/"); r.status != http.StatusSeeOther || r.header.Get("Location") != "/console/signin" {
		t.Errorf("after %s: %d %q, want 303 to the sign-in page", operatorSessionTTL, r.status, r.header.Get("Location"))
	}

	for i := range operatorFailures {
		if r := b.operatorSignin("wrong"); r.status != http.StatusUnauthorized {
			t.Fatalf("failure %d: %d", i+1, r.status)
		}
	}
	r := b.operatorSignin(adminToken)
	if r.status != http.StatusTooManyRequests || r.code() != "rate_limit_exceeded" || r.header.Get("Retry-After") == "" {
		t.Errorf("the right token after %d failures: %d %s, want 429 with Retry-After", operatorFailures, r.status, r.code())
	}
	e.clock.add(failureWindow)
	if r := b.operatorSignin(adminToken); r.status != http.StatusSeeOther {
		t.Errorf("after the window: %d %s", r.status, r.code())
	}
}

// unrecordedAudits is a store that cannot record audits.
type unrecordedAudits struct{ testStore }

func (unrecordedAudits) RecordAudit(context.Context, tollgate.AuditRun) error {
	return errors.New("disk full")
}

// An audit run from the console that cannot be recorded is shown at once,
// with a notice, instead of the older run the store has.
func TestOperatorAuditUnrecorded(t *testing.T) {
	e := newEnv(t, Options{})
	b := newOperator(t, &env{st: unrecordedAudits{e.st}, con: e.con, clock: e.clock}, adminToken)
	b.operatorSignin(adminToken)
	p := b.get("/console/service")
	r := b.post("/console/service/audit", url.Values{"csrf": {p.csrf(t)}})
	if r.status != http.StatusOK || !strings.Contains(r.body, "could not be saved") ||
		!strings.Contains(r.body, `class="status-active">OK at `+e.clock.now().Format("2006-01-02 15:04")+` UTC from the operator console: 1 accounts`) {
		t.Errorf("audit whose record failed: %d\n%s", r.status, r.body)
	}
	if _, err := e.st.LastAudit(t.Context()); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("LastAudit: %v, want ErrNotFound", err)
	}
}
