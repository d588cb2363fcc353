package console

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"html/template"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/operator"
	"github.com/tollgate/tollgate/relay"
)

// The operator's console on the admin listener, under /console/: accounts
// (list, search, create, credit, debit, disable, enable, invite) and the
// service (nodes, traffic share, the audit). It is behind the admin token:
// a sign-in form takes it and opens a session kept in this instance's
// memory (docs/decisions.md).

// OperatorStore is what the operator's console reads and writes.
type OperatorStore interface {
	Store
	operator.Store
	Accounts(ctx context.Context) ([]tollgate.Account, error)
}

// OperatorOptions configure the operator's console.
type OperatorOptions struct {
	// Token is the admin token; empty refuses every sign-in.
	Token   string
	Catalog func() *relay.Catalog
	// NodeHealth reports a node's state in rotation (relay.Relay.NodeHealth);
	// nil shows the probes' view only.
	NodeHealth func(*relay.Node) relay.NodeHealth
	Uptime     UptimeReader
	// AuditGrace is admin.Options.AuditGrace.
	AuditGrace time.Duration
	// APIBase is the api listener's URL, to print invitation links whole.
	APIBase        string
	TrustedProxies []netip.Prefix
	// Payments shows the accounts' payments, the events to look at and
	// what accounts owe, and offers the re-check; nil when payments are
	// off, and the console shows none of it.
	Payments OperatorPayments
	Log      *slog.Logger
	Now      func() time.Time
}

const (
	operatorCookie     = "tg_operator"
	operatorSessionTTL = 12 * time.Hour
	operatorFailures   = 10
	accountsPage       = 50
)

// Operator serves the operator's pages.
type Operator struct {
	st    OperatorStore
	o     OperatorOptions
	token [32]byte
	pages map[string]*template.Template
	c     *Console // headers, cookies, client address and rendering

	mu       sync.Mutex
	sessions map[tollgate.KeyHash]time.Time // expiry
	failures *attempts
}

// auditRun is the service page's audit line: the last run recorded in the
// store, wherever it ran.
type auditRun struct {
	tollgate.AuditRun
	From string // "the CLI", …
	Took string // rounded
	More int64  // problems not kept with the run
}

// auditSources name where a run came from, for the audit line.
var auditSources = map[tollgate.AuditSource]string{
	tollgate.AuditFromCLI:      "the CLI",
	tollgate.AuditFromAdminAPI: "the admin API",
	tollgate.AuditFromConsole:  "the operator console",
}

func newAuditRun(run tollgate.AuditRun) *auditRun {
	a := &auditRun{AuditRun: run, From: cmp.Or(auditSources[run.Source], string(run.Source)), More: run.ProblemCount - int64(len(run.Problems))}
	a.Took = run.Took.String()
	if run.Took >= time.Millisecond {
		a.Took = run.Took.Round(time.Millisecond).String()
	}
	return a
}

// NewOperator builds the operator's console.
func NewOperator(st OperatorStore, o OperatorOptions) (*Operator, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	op := &Operator{st: st, o: o, token: sha256.Sum256([]byte(o.Token)), pages: map[string]*template.Template{},
		sessions: map[tollgate.KeyHash]time.Time{}, failures: newAttempts(operatorFailures, failureWindow),
		c: &Console{o: Options{TrustedProxies: o.TrustedProxies, Log: o.Log, Now: o.Now}, secret: randomSecret()}}
	for _, name := range []string{"op_signin", "op_accounts", "op_account", "op_service", "op_payments", "error"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, err
		}
		op.pages[name] = t
	}
	op.c.pages = op.pages
	var err error
	if op.c.files, err = staticFiles(); err != nil {
		return nil, err
	}
	return op, nil
}

// Page serves h as an operator's page, as Console.Page does.
func (op *Operator) Page(h func(http.ResponseWriter, *http.Request) error) http.Handler {
	return op.c.Page(h)
}

// SignedIn is Page for a page of a signed-in operator: without a live
// session the browser is sent to the sign-in page, and a POST without the
// session's CSRF token is refused.
func (op *Operator) SignedIn(h func(http.ResponseWriter, *http.Request) error) http.Handler {
	return op.c.Page(op.signedIn(h))
}

// Static serves the embedded files under /console/static/.
func (op *Operator) Static(w http.ResponseWriter, r *http.Request) error {
	op.c.files.ServeHTTP(w, r)
	return nil
}

// NotFound answers a path under /console/ that no operator's page is
// served on.
func (op *Operator) NotFound(w http.ResponseWriter, r *http.Request) error {
	return tollgate.Errorf(tollgate.CodeNotFound, "there is no operator page %s %s", r.Method, r.URL.Path)
}

type opRequest struct{ token string }

type opKey struct{}

func opCurrent(r *http.Request) *opRequest { v, _ := r.Context().Value(opKey{}).(*opRequest); return v }

func (op *Operator) signedIn(h func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		ck, err := op.c.cookie(r, operatorCookie)
		if err != nil || ck.Value == "" || !op.live(tollgate.HashKey(ck.Value)) {
			return op.c.toSignin(w, r)
		}
		if r.Method == http.MethodPost && !tokensEqual(r.PostFormValue("csrf"), sessionCSRF(ck.Value)) {
			return errCSRF
		}
		w.Header().Set("Cache-Control", "no-store")
		return h(w, r.WithContext(context.WithValue(r.Context(), opKey{}, &opRequest{token: ck.Value})))
	}
}

func (op *Operator) live(h tollgate.KeyHash) bool {
	now := op.o.Now()
	op.mu.Lock()
	defer op.mu.Unlock()
	exp, ok := op.sessions[h]
	if ok && !now.Before(exp) {
		delete(op.sessions, h)
		return false
	}
	return ok
}

func (op *Operator) view(r *http.Request, title, nav string) *view {
	return &view{Title: title, Nav: nav, Operator: true, CSRF: sessionCSRF(opCurrent(r).token), Payments: op.o.Payments != nil}
}

func (op *Operator) render(w http.ResponseWriter, status int, page string, v *view) error {
	return op.c.render(w, status, page, v)
}

// SigninForm is the operator's sign-in page.
func (op *Operator) SigninForm(w http.ResponseWriter, r *http.Request) error {
	v := op.c.publicView(w, r, "Operator sign-in")
	v.Operator = true
	return op.render(w, http.StatusOK, "op_signin", v)
}

// Signin compares the SHA-256 of the presented token with the configured
// one's in constant time, like the admin API.
func (op *Operator) Signin(w http.ResponseWriter, r *http.Request) error {
	if err := op.c.checkFormToken(r); err != nil {
		return err
	}
	now := op.o.Now()
	addr := op.c.clientAddr(r)
	again := func(status int, err *tollgate.Error) error {
		v := op.c.publicView(w, r, "Operator sign-in")
		v.Operator, v.Error = true, err
		return op.render(w, status, "op_signin", v)
	}
	client := addressKey(addr)
	if ok, until := op.failures.try(client, now); !ok {
		w.Header().Set("Retry-After", retryAfter(until, now))
		return again(http.StatusTooManyRequests, tollgate.Errorf(tollgate.CodeRateLimitExceeded, "too many failed sign-ins; try again after %s UTC", until.UTC().Format("15:04")))
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(r.PostFormValue("token"))))
	if op.o.Token == "" || subtle.ConstantTimeCompare(got[:], op.token[:]) != 1 {
		op.o.Log.Warn("operator console sign-in failed", "client", addr)
		return again(http.StatusUnauthorized, tollgate.Errorf(tollgate.CodeUnauthorized, "that is not the admin token"))
	}
	op.failures.forgive(client)
	token := randomToken()
	op.mu.Lock()
	for h, exp := range op.sessions {
		if !now.Before(exp) {
			delete(op.sessions, h)
		}
	}
	op.sessions[tollgate.HashKey(token)] = now.Add(operatorSessionTTL)
	op.mu.Unlock()
	op.o.Log.Info("operator console sign-in", "client", addr)
	op.c.setCookieNamed(w, r, operatorCookie, token, operatorSessionTTL)
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
	return nil
}

// Signout ends the operator's session.
func (op *Operator) Signout(w http.ResponseWriter, r *http.Request) error {
	op.mu.Lock()
	delete(op.sessions, tollgate.HashKey(opCurrent(r).token))
	op.mu.Unlock()
	op.c.clearCookie(w, r, operatorCookie)
	http.Redirect(w, r, "/console/signin", http.StatusSeeOther)
	return nil
}

type opAccountRow struct {
	tollgate.Account
	Held, Free, Spent tollgate.Amount
}

type opAccountsData struct {
	Query    string
	Accounts []opAccountRow
	Total    int
	Page     int
	Prev     string
	Next     string
	Created  *tollgate.Account
}

func (op *Operator) row(ctx context.Context, a tollgate.Account) (opAccountRow, error) {
	v, err := operator.View(ctx, op.st, a)
	if err != nil {
		return opAccountRow{}, err
	}
	row := opAccountRow{Account: v.Account, Held: v.Held, Free: v.Free}
	usage, err := op.st.KeyUsage(ctx, a.ID)
	if err != nil {
		return opAccountRow{}, err
	}
	for _, u := range usage {
		row.Spent += u.Spent
	}
	return row, nil
}

// Accounts lists the accounts, newest first, 50 a page; q matches the id
// or the name, ignoring case.
func (op *Operator) Accounts(w http.ResponseWriter, r *http.Request) error {
	return op.renderAccounts(w, r, http.StatusOK, nil, nil)
}

func (op *Operator) renderAccounts(w http.ResponseWriter, r *http.Request, status int, created *tollgate.Account, verr *tollgate.Error) error {
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	all, err := op.st.Accounts(r.Context())
	if err != nil {
		return err
	}
	slices.Reverse(all)
	if q != "" {
		lq := strings.ToLower(q)
		all = slices.DeleteFunc(all, func(a tollgate.Account) bool {
			return !strings.Contains(strings.ToLower(a.ID), lq) && !strings.Contains(strings.ToLower(a.Name), lq)
		})
	}
	page := max(atoiDefault(r.URL.Query().Get("page"), 1), 1)
	d := opAccountsData{Query: q, Total: len(all), Page: page, Created: created}
	from := min((page-1)*accountsPage, len(all))
	to := min(from+accountsPage, len(all))
	for _, a := range all[from:to] {
		row, err := op.row(r.Context(), a)
		if err != nil {
			return err
		}
		d.Accounts = append(d.Accounts, row)
	}
	qs := ""
	if q != "" {
		qs = "q=" + urlEscape(q) + "&"
	}
	if page > 1 {
		d.Prev = qs + "page=" + itoa(int64(page-1))
	}
	if to < len(all) {
		d.Next = qs + "page=" + itoa(int64(page+1))
	}
	v := op.view(r, "Accounts", "accounts")
	v.Data, v.Error = d, verr
	return op.render(w, status, "op_accounts", v)
}

// CreateAccount creates an account and shows its page.
func (op *Operator) CreateAccount(w http.ResponseWriter, r *http.Request) error {
	name := strings.TrimSpace(r.PostFormValue("name"))
	if name == "" {
		return op.renderAccounts(w, r, http.StatusBadRequest, nil, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "name", "an account needs a name"))
	}
	a, err := operator.CreateAccount(r.Context(), op.st, name, op.o.Now())
	if err != nil {
		return err
	}
	op.o.Log.Info("account created in the operator console", "account", a.ID, "name", a.Name)
	http.Redirect(w, r, "/console/accounts/"+a.ID+"?done=created", http.StatusSeeOther)
	return nil
}

// opEntries is how many of an account's operator entries its page lists.
const opEntries = 50

type opAccountData struct {
	Row  opAccountRow
	Keys []tollgate.Key
	// Entries are the newest of its ledger entries that are not charges
	// (the opening balance, credits, debits, payments, refunds, disputes),
	// with notes and who made them.
	Entries []tollgate.LedgerEntry
	Invite  string // the whole invitation link, shown once
	Amount  string // what was typed, when the form comes back with an error
	Note    string
	// PaymentsOn: payments are on, and Payments are the account's newest
	// and Owed what it owes after refunds or disputes.
	PaymentsOn bool
	Payments   []tollgate.Payment
	Owed       tollgate.Amount
}

var doneNotices = map[string]string{
	"created": "Account created. Credit it, then invite its holder.",
	"credit":  "Credit posted.",
	"debit":   "Debit posted.",
	"disable": "Account disabled: its keys are refused (403 account_disabled) and its console sessions stop working.",
	"enable":  "Account enabled.",
	"audit":   "Audit run.",
}

// Account is one account's page.
func (op *Operator) Account(w http.ResponseWriter, r *http.Request) error {
	return op.renderAccount(w, r, http.StatusOK, opAccountData{}, nil)
}

func (op *Operator) renderAccount(w http.ResponseWriter, r *http.Request, status int, d opAccountData, verr *tollgate.Error) error {
	id := r.PathValue("id")
	a, err := op.st.Account(r.Context(), id)
	if errors.Is(err, tollgate.ErrNotFound) {
		return tollgate.Errorf(tollgate.CodeNotFound, "account %s does not exist", id)
	}
	if err != nil {
		return err
	}
	if d.Row, err = op.row(r.Context(), a); err != nil {
		return err
	}
	if d.Keys, err = op.st.Keys(r.Context(), id); err != nil {
		return err
	}
	if d.Entries, err = op.st.OperatorEntries(r.Context(), id, opEntries); err != nil {
		return err
	}
	if err := op.accountPayments(r.Context(), id, &d); err != nil {
		return err
	}
	v := op.view(r, a.Name, "accounts")
	v.Data, v.Error = d, verr
	if verr == nil {
		v.Notice = doneNotices[r.URL.Query().Get("done")]
		if r.URL.Query().Get("done") == "recheck" {
			v.Notice = recheckNotice(r.URL.Query().Get("payment"), tollgate.PaymentOutcome(r.URL.Query().Get("outcome")))
		}
	}
	return op.render(w, status, "op_account", v)
}

// AccountAction is credit, debit, disable, enable or invite.
func (op *Operator) AccountAction(w http.ResponseWriter, r *http.Request) error {
	id, action := r.PathValue("id"), r.PathValue("action")
	ctx := r.Context()
	if _, err := op.st.Account(ctx, id); errors.Is(err, tollgate.ErrNotFound) {
		return tollgate.Errorf(tollgate.CodeNotFound, "account %s does not exist", id)
	} else if err != nil {
		return err
	}
	switch action {
	case "credit", "debit":
		amountText, note := strings.TrimSpace(r.PostFormValue("amount")), strings.TrimSpace(r.PostFormValue("note"))
		back := opAccountData{Amount: amountText, Note: note}
		amount, err := tollgate.ParseAmount(amountText)
		if err != nil || amount <= 0 {
			return op.renderAccount(w, r, http.StatusBadRequest, back, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "amount",
				"amount %q: want a positive amount of USD such as 25 or 12.50", amountText))
		}
		kind := tollgate.LedgerCredit
		if action == "debit" {
			kind = tollgate.LedgerDebit
		}
		p, err := operator.Post(ctx, op.st, kind, id, amount, note, "the operator console from "+op.c.clientAddr(r), op.o.Now())
		if err != nil {
			var te *tollgate.Error
			if errors.As(err, &te) {
				return op.renderAccount(w, r, statusOf(te.Code), back, te)
			}
			return err
		}
		op.o.Log.Info("ledger entry posted in the operator console", "kind", kind, "account", id, "amount", p.Entry.Amount.String(), "entry", p.Entry.ID)
	case "disable", "enable":
		if _, err := operator.SetDisabled(ctx, op.st, id, action == "disable"); err != nil {
			return err
		}
		op.o.Log.Info("account disabled flag set in the operator console", "account", id, "disabled", action == "disable")
	case "invite":
		inv, err := operator.Invite(ctx, op.st, id, op.o.Now())
		if err != nil {
			return err
		}
		op.o.Log.Info("console invitation issued in the operator console", "account", id, "expires", inv.Expires)
		v := opAccountData{Invite: op.o.APIBase + inv.Path}
		return op.renderAccount(w, r, http.StatusCreated, v, nil)
	default:
		return tollgate.Errorf(tollgate.CodeNotFound, "there is no account action %q", action)
	}
	http.Redirect(w, r, "/console/accounts/"+id+"?done="+action, http.StatusSeeOther)
	return nil
}

type opNodeRow struct {
	Model, Class, Node, Upstream string
	Health                       relay.NodeHealth
	Inflight, Max                int64
}

type opServiceData struct {
	Nodes          []opNodeRow
	Window         time.Duration // of the nodes' recent requests
	PricingURL     string        // /pricing on the api listener; "" if unknown
	Network, Total int64
	Share          string
	Audit          *auditRun
}

// Service is the service page: nodes, traffic share, the audit.
func (op *Operator) Service(w http.ResponseWriter, r *http.Request) error {
	v := op.view(r, "Service", "service")
	if r.URL.Query().Get("done") == "audit" {
		v.Notice = doneNotices["audit"]
	}
	return op.renderService(w, r, v, nil)
}

// renderService shows the service page with the audit line of run, or of
// the last run recorded when run is nil.
func (op *Operator) renderService(w http.ResponseWriter, r *http.Request, v *view, run *auditRun) error {
	d := opServiceData{Audit: run}
	if op.o.Catalog != nil {
		for _, m := range op.o.Catalog().Models {
			for _, b := range m.Backends {
				for _, n := range b.Nodes {
					h := relay.NodeHealth{Up: n.Healthy(), ProbesInARow: n.Failures()}
					if op.o.NodeHealth != nil {
						h = op.o.NodeHealth(n)
					}
					d.Nodes = append(d.Nodes, opNodeRow{Model: m.ID, Class: string(b.Class), Node: cmp.Or(n.Name, n.BaseURL), Upstream: b.UpstreamModel,
						Health: h, Inflight: n.Inflight(), Max: n.MaxConcurrent})
				}
			}
		}
	}
	if op.o.Uptime != nil {
		var err error
		if d.Network, d.Total, err = op.o.Uptime.Uptime(r.Context()); err != nil {
			return err
		}
	}
	for _, n := range d.Nodes {
		d.Window = max(d.Window, n.Health.Window)
	}
	if op.o.APIBase != "" {
		d.PricingURL = strings.TrimSuffix(op.o.APIBase, "/") + "/pricing"
	}
	d.Share = "no traffic yet (counts as 1)"
	if d.Total > 0 {
		d.Share = itoa(d.Network*100/d.Total) + "% (" + groupDigits(d.Network) + " of " + groupDigits(d.Total) + " requests)"
	}
	if d.Audit == nil {
		last, err := op.st.LastAudit(r.Context())
		if err == nil {
			d.Audit = newAuditRun(last)
		} else if !errors.Is(err, tollgate.ErrNotFound) {
			return err
		}
	}
	v.Data = d
	return op.render(w, http.StatusOK, "op_service", v)
}

// RunAudit runs the audit of the books and shows the service page.
func (op *Operator) RunAudit(w http.ResponseWriter, r *http.Request) error {
	start := time.Now()
	rep, err := billing.RunAudit(r.Context(), op.st, op.o.Now(), op.o.AuditGrace, tollgate.AuditFromConsole)
	if errors.Is(err, billing.ErrAuditNotRecorded) {
		// The page would show an older run: this one is shown now instead,
		// once, and the failure is logged.
		op.o.Log.Warn("audit run from the operator console", "ok", rep.OK, "problems", len(rep.Problems), "err", err)
		run := tollgate.AuditRun{Time: rep.Time, Source: tollgate.AuditFromConsole, OK: rep.OK, Accounts: int64(rep.Accounts), Keys: int64(rep.Keys),
			Balance: rep.Balance, Held: rep.Held, Problems: rep.Problems, ProblemCount: int64(len(rep.Problems)), Took: time.Since(start)}
		v := op.view(r, "Service", "service")
		v.Notice = "Audit run, but its result could not be saved (see the log): it is shown here, and only here."
		return op.renderService(w, r, v, newAuditRun(run))
	}
	if err != nil {
		return err
	}
	op.o.Log.Info("audit run from the operator console", "ok", rep.OK, "problems", len(rep.Problems))
	http.Redirect(w, r, "/console/service?done=audit", http.StatusSeeOther)
	return nil
}

func atoiDefault(s string, def int) int {
	n := 0
	if s == "" {
		return def
	}
	for _, c := range s {
		if c < '0' || c > '9' || n > 1_000_000 {
			return def
		}
		n = n*10 + int(c-'0')
	}
	return n
}
