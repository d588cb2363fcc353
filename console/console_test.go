package console

import (
	"context"
	"encoding/csv"
	"errors"
	"html"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/internal/syncbuf"
	"github.com/tollgate/tollgate/openai"
	"github.com/tollgate/tollgate/operator"
	"github.com/tollgate/tollgate/postgres"
	"github.com/tollgate/tollgate/relay"
	"github.com/tollgate/tollgate/routing"
	"github.com/tollgate/tollgate/server"
	"github.com/tollgate/tollgate/sqlite"
)

// testCatalog is two models: tg-chat on a network node and a fallback,
// tg-mini on another node.
var testCatalog = relay.CatalogSpec{Models: []relay.ModelSpec{
	{ID: "tg-chat", Kind: tollgate.KindChat, ContextLength: 1000, MaxOutputTokens: 100, Backends: []relay.BackendSpec{
		{Class: tollgate.ClassNetwork, UpstreamModel: "up", Caps: tollgate.NewCapabilities(tollgate.CapTools, tollgate.CapImageInput),
			Prices: prices("0.12", "0.40"), Routing: routing.PrefixCache, PrefixMargin: 6,
			Nodes: []relay.NodeSpec{{Name: "node-1", URL: "http://127.0.0.1:1/v1", Flavour: openai.VLLM}}},
		{Class: tollgate.ClassFallback, UpstreamModel: "up2", Prices: prices("2.20", "8.80"),
			Nodes: []relay.NodeSpec{{Name: "fallback", URL: "http://127.0.0.1:1/v1", Flavour: openai.OpenAI}}},
	}},
	{ID: "tg-mini", Kind: tollgate.KindCheap, ContextLength: 1000, MaxOutputTokens: 100, Backends: []relay.BackendSpec{
		{Class: tollgate.ClassNetwork, UpstreamModel: "up3", Prices: prices("0.02", "0.04"), Routing: routing.PrefixCache, PrefixMargin: 6,
			Nodes: []relay.NodeSpec{{Name: "node-2", URL: "http://127.0.0.1:2/v1", Flavour: openai.VLLM}}},
	}},
}}

func prices(input, output string) tollgate.Prices {
	return tollgate.Prices{Input: tollgate.MustParseRate(input), Output: tollgate.MustParseRate(output)}
}

// cheap keeps the tests fast; the real parameters are DefaultPasswordParams.
var cheap = PasswordParams{Memory: 64, Time: 1, Threads: 1}

// clock is a settable time.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

type uptime struct{ network, total int64 }

func (u uptime) Uptime(context.Context) (int64, int64, error) { return u.network, u.total, nil }

// testStore is what the tests use of a store: the console's part and what
// sets up accounts, keys and charges.
type testStore interface {
	Store
	tollgate.Store
	billing.Store
}

type env struct {
	t     *testing.T
	st    testStore
	opts  Options // the console's, for restart
	con   *Console
	srv   *httptest.Server
	clock *clock
	cat   *relay.Catalog
	acct  tollgate.Account
	key   tollgate.Key // a key of acct
}

func newEnv(t testing.TB, o Options) *env {
	st, err := sqlite.Open(t.TempDir() + "/t.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return newEnvStore(t, o, st)
}

// newEnvStore is newEnv on st, which the caller closes.
func newEnvStore(t testing.TB, o Options, st testStore) *env {
	cat := relay.NewCatalog(testCatalog, nil)
	clk := &clock{t: time.Date(2026, 3, 20, 15, 0, 0, 0, time.UTC)}
	o.Catalog = func() *relay.Catalog { return cat }
	o.Uptime = uptime{3, 4}
	o.Password = cheap
	o.Now = clk.now
	con, err := New(st, o)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(routes(con))
	t.Cleanup(srv.Close)
	e := &env{st: st, opts: o, con: con, srv: srv, clock: clk, cat: cat}
	e.acct, e.key = e.newAccount(t, "alice", "10")
	return e
}

// restart replaces the env's console and its server with new ones on st
// (e.st or a wrapper of it): an instance started since, with nothing in its
// memory. log, if not nil, is the new console's logger. Browsers keep their
// cookies (a cookie jar ignores the port).
func (e *env) restart(t testing.TB, st Store, log *slog.Logger) {
	t.Helper()
	o := e.opts
	if log != nil {
		o.Log = log
	}
	con, err := New(st, o)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(routes(con))
	t.Cleanup(srv.Close)
	e.con, e.srv = con, srv
}

func (e *env) newAccount(t testing.TB, name, credit string) (tollgate.Account, tollgate.Key) {
	ctx := context.Background()
	a := tollgate.Account{ID: tollgate.NewID("acct_"), Name: name, Created: e.clock.now().AddDate(0, -3, 0)}
	if err := e.st.CreateAccount(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, err := operator.Post(ctx, e.st, tollgate.LedgerCredit, a.ID, tollgate.MustParseAmount(credit), "", "", a.Created); err != nil {
		t.Fatal(err)
	}
	secret := tollgate.NewKeySecret()
	k := tollgate.Key{ID: tollgate.NewID("key_"), AccountID: a.ID, Name: name + "-key", Prefix: tollgate.DisplayPrefix(secret), Created: a.Created, AllowedModels: []string{}}
	if err := e.st.CreateKey(ctx, k, tollgate.HashKey(secret)); err != nil {
		t.Fatal(err)
	}
	return a, k
}

// charge puts a settled request of key on the books at time at.
func (e *env) charge(t testing.TB, k tollgate.Key, model string, cost tollgate.Amount, at time.Time) {
	t.Helper()
	if err := e.st.ApplyBilling(context.Background(), chargeOps(k, model, cost, at)); err != nil {
		t.Fatal(err)
	}
}

func chargeOps(k tollgate.Key, model string, cost tollgate.Amount, at time.Time) []*tollgate.BillingOp {
	hold := &tollgate.BillingOp{Kind: tollgate.OpHold, Hold: tollgate.Hold{ID: tollgate.NewID("hold_"), RequestID: tollgate.NewOrderedID("req_", at),
		AccountID: k.AccountID, KeyID: k.ID, Model: model, Class: tollgate.ClassNetwork, Amount: cost, Owner: "test", Created: at, Expires: at.Add(time.Minute)}}
	settle := &tollgate.BillingOp{Kind: tollgate.OpSettle, HoldID: hold.Hold.ID, Charge: tollgate.Charge{RequestID: hold.Hold.RequestID,
		AccountID: k.AccountID, KeyID: k.ID, Model: model, Class: tollgate.ClassNetwork, Node: "gpu", PromptTokens: 100, CompletionTokens: 20,
		Cost: cost, Time: at}}
	return []*tollgate.BillingOp{hold, settle}
}

// browser is a client with a cookie jar that does not follow redirects.
type browser struct {
	t    testing.TB
	c    *http.Client
	e    *env
	from string // X-Forwarded-For, for an env that trusts loopback as its proxy
}

func (e *env) browser(t testing.TB) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, e: e, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

type page struct {
	status int
	body   string
	header http.Header
}

func (b *browser) do(req *http.Request) page {
	b.t.Helper()
	if b.from != "" {
		req.Header.Set("X-Forwarded-For", b.from)
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return page{resp.StatusCode, string(body), resp.Header}
}

func (b *browser) get(path string) page {
	b.t.Helper()
	req, _ := http.NewRequest("GET", b.e.srv.URL+path, nil)
	return b.do(req)
}

func (b *browser) post(path string, form url.Values) page {
	b.t.Helper()
	req, _ := http.NewRequest("POST", b.e.srv.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return b.do(req)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func (p page) csrf(t testing.TB) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(p.body)
	if m == nil {
		t.Fatalf("no csrf field in the page:\n%s", p.body)
	}
	return m[1]
}

// code is the error code the page shows, "" if none.
func (p page) code() string {
	m := regexp.MustCompile(`data-code="([^"]+)"`).FindStringSubmatch(p.body)
	if m == nil {
		return ""
	}
	return m[1]
}

const password = "correct horse battery"

// setPassword uses a fresh invitation of acct to set password.
func (b *browser) setPassword(acct, pw string) {
	b.t.Helper()
	token, _, err := tollgate.IssueInvite(context.Background(), b.e.st, acct, b.e.clock.now())
	if err != nil {
		b.t.Fatal(err)
	}
	p := b.get(tollgate.InvitePath(token)[len(""):])
	if p.status != 200 {
		b.t.Fatalf("invite page: %d", p.status)
	}
	r := b.post("/console/invite", url.Values{"csrf": {p.csrf(b.t)}, "token": {token}, "password": {pw}, "confirm": {pw}})
	if r.status != http.StatusSeeOther {
		b.t.Fatalf("set password: %d %s\n%s", r.status, r.code(), r.body)
	}
}

func (b *browser) signin(acct, pw string) page {
	b.t.Helper()
	p := b.get("/console/signin")
	return b.post("/console/signin", url.Values{"csrf": {p.csrf(b.t)}, "account": {acct}, "password": {pw}})
}

// signedIn returns a browser signed in as the env's account.
func (e *env) signedIn(t *testing.T) *browser {
	b := e.browser(t)
	b.setPassword(e.acct.ID, password)
	if r := b.signin(e.acct.ID, password); r.status != http.StatusSeeOther || r.header.Get("Location") != "/console/" {
		t.Fatalf("sign-in: %d %s %q", r.status, r.code(), r.header.Get("Location"))
	}
	return b
}

func TestSignInInviteAndSignOut(t *testing.T) {
	e := newEnv(t, Options{})
	b := e.browser(t)
	if r := b.get("/console/"); r.status != http.StatusSeeOther || r.header.Get("Location") != "/console/signin" {
		t.Fatalf("overview without a session: %d %q, want 303 to the sign-in page", r.status, r.header.Get("Location"))
	}
	// No password yet: the sign-in fails like a wrong password.
	if r := b.signin(e.acct.ID, password); r.status != http.StatusUnauthorized || r.code() != "unauthorized" {
		t.Fatalf("sign-in before any password: %d %s", r.status, r.code())
	}
	token, _, err := tollgate.IssueInvite(t.Context(), e.st, e.acct.ID, e.clock.now())
	if err != nil {
		t.Fatal(err)
	}
	p := b.get(tollgate.InvitePath(token))
	if p.header.Get("Referrer-Policy") != "same-origin" || !strings.Contains(p.header.Get("Content-Security-Policy"), "frame-ancestors 'none'") {
		t.Errorf("invite page headers: %v", p.header)
	}
	short := b.post("/console/invite", url.Values{"csrf": {p.csrf(t)}, "token": {token}, "password": {"short"}, "confirm": {"short"}})
	if short.status != http.StatusBadRequest || !strings.Contains(short.body, `data-param="password"`) {
		t.Errorf("short password: %d %s", short.status, short.code())
	}
	differ := b.post("/console/invite", url.Values{"csrf": {p.csrf(t)}, "token": {token}, "password": {password}, "confirm": {password + "x"}})
	if differ.status != http.StatusBadRequest || !strings.Contains(differ.body, `data-param="confirm"`) {
		t.Errorf("passwords that differ: %d %s", differ.status, differ.code())
	}
	ok := b.post("/console/invite", url.Values{"csrf": {p.csrf(t)}, "token": {token}, "password": {password}, "confirm": {password}})
	if ok.status != http.StatusSeeOther {
		t.Fatalf("set password: %d %s", ok.status, ok.code())
	}
	stored, err := e.st.PasswordHash(t.Context(), e.acct.ID)
	if err != nil || !strings.HasPrefix(stored, "$argon2id$v=19$m=64,t=1,p=1$") || strings.Contains(stored, password) {
		t.Errorf("stored password = %q, %v", stored, err)
	}
	// The link, opened again, says it was used and shows no form.
	used := b.get(tollgate.InvitePath(token))
	if used.status != http.StatusGone || !strings.Contains(used.body, `data-gone="used"`) || !strings.Contains(used.body, "It was used on 2026-03-20 15:00 UTC") ||
		strings.Contains(used.body, `type="password"`) {
		t.Errorf("a used invitation's page: %d\n%s", used.status, used.body)
	}
	if r := b.get("/console/invite?token=inv-madeup"); r.status != http.StatusNotFound || !strings.Contains(r.body, `data-gone="unknown"`) || strings.Contains(r.body, "<form") {
		t.Errorf("an unknown invitation's page: %d\n%s", r.status, r.body)
	}
	late, _, err := tollgate.IssueInvite(t.Context(), e.st, e.acct.ID, e.clock.now().Add(-tollgate.InviteTTL))
	if err != nil {
		t.Fatal(err)
	}
	if r := b.get(tollgate.InvitePath(late)); r.status != http.StatusGone || !strings.Contains(r.body, `data-gone="expired"`) || strings.Contains(r.body, "<form") {
		t.Errorf("an expired invitation's page: %d\n%s", r.status, r.body)
	}
	again := b.post("/console/invite", url.Values{"csrf": {p.csrf(t)}, "token": {token}, "password": {"another password!"}, "confirm": {"another password!"}})
	if again.status != http.StatusNotFound || again.code() != "not_found" {
		t.Errorf("second use of the invitation: %d %s", again.status, again.code())
	}
	if r := b.signin(e.acct.ID, "wrong password!"); r.status != http.StatusUnauthorized || r.code() != "unauthorized" {
		t.Errorf("wrong password: %d %s", r.status, r.code())
	}
	r := b.signin(e.acct.ID, password)
	if r.status != http.StatusSeeOther {
		t.Fatalf("sign-in: %d %s", r.status, r.code())
	}
	var sc *http.Cookie
	for _, c := range (&http.Response{Header: r.header}).Cookies() {
		if c.Name == sessionCookie {
			sc = c
		}
	}
	if sc == nil || !sc.HttpOnly || sc.SameSite != http.SameSiteLaxMode || sc.Secure || sc.Path != "/console/" || sc.MaxAge != int((12*time.Hour)/time.Second) {
		t.Errorf("session cookie = %+v", sc)
	}
	if _, err := e.st.Session(t.Context(), tollgate.HashKey(sc.Value), e.clock.now()); err != nil {
		t.Errorf("the session is not stored under the hash of its cookie: %v", err)
	}
	ov := b.get("/console/")
	if ov.status != 200 || !strings.Contains(ov.body, shown("balance", "10.00")) || ov.header.Get("Cache-Control") != "no-store" {
		t.Fatalf("overview: %d %q\n%s", ov.status, ov.header.Get("Cache-Control"), ov.body)
	}
	// Sign-out revokes the session's playground key.
	if _, err := e.st.SetSessionKey(t.Context(), tollgate.HashKey(sc.Value), e.key.ID); err != nil {
		t.Fatal(err)
	}
	if r := b.post("/console/signout", url.Values{"csrf": {ov.csrf(t)}}); r.status != http.StatusSeeOther {
		t.Fatalf("sign-out: %d %s", r.status, r.code())
	}
	if _, err := e.st.Session(t.Context(), tollgate.HashKey(sc.Value), e.clock.now()); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("session after sign-out: %v", err)
	}
	keys, _ := e.st.Keys(t.Context(), e.acct.ID)
	if keys[0].Revoked.IsZero() {
		t.Error("the session's playground key was not revoked at sign-out")
	}
	if r := b.get("/console/"); r.status != http.StatusSeeOther {
		t.Errorf("overview after sign-out: %d", r.status)
	}
}

func TestSignInRateLimited(t *testing.T) {
	e := newEnv(t, Options{})
	b := e.browser(t)
	b.setPassword(e.acct.ID, password)
	for i := range accountFailures {
		if r := b.signin(e.acct.ID, "wrong password!"); r.status != http.StatusUnauthorized {
			t.Fatalf("failure %d: %d", i+1, r.status)
		}
	}
	r := b.signin(e.acct.ID, password)
	if r.status != http.StatusTooManyRequests || r.code() != "rate_limit_exceeded" || r.header.Get("Retry-After") == "" {
		t.Fatalf("the right password after %d failures: %d %s, want 429 with Retry-After", accountFailures, r.status, r.code())
	}
	e.clock.add(failureWindow)
	if r := b.signin(e.acct.ID, password); r.status != http.StatusSeeOther {
		t.Errorf("after the window: %d %s", r.status, r.code())
	}
	// Per address: failures spread over many accounts still stop.
	for i := range addressFailures {
		b.signin("acct_guess"+itoa(int64(i)), "whatever")
	}
	if r := b.signin(e.acct.ID, password); r.status != http.StatusTooManyRequests {
		t.Errorf("after %d failures from one address: %d, want 429", addressFailures, r.status)
	}
}

// One client's failures on an account do not lock out its holder signing in
// from elsewhere; many clients together do (accountFailuresAll); an IPv6
// client counts as its /64.
func TestSignInLimitsByClient(t *testing.T) {
	e := newEnv(t, Options{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	holder := e.browser(t)
	holder.from = "198.51.100.9"
	holder.setPassword(e.acct.ID, password)
	guesser := e.browser(t)
	guesser.from = "203.0.113.7"
	for range accountFailures {
		guesser.signin(e.acct.ID, "wrong password!")
	}
	if r := guesser.signin(e.acct.ID, password); r.status != http.StatusTooManyRequests {
		t.Errorf("the guesser after %d failures: %d, want 429", accountFailures, r.status)
	}
	if r := holder.signin(e.acct.ID, password); r.status != http.StatusSeeOther {
		t.Fatalf("the holder from another address: %d %s, want 303 (not locked out by someone else)", r.status, r.code())
	}
	// Addresses of one IPv6 /64 are one client.
	v6 := e.browser(t)
	for i := range addressFailures {
		v6.from = "2001:db8:1:2::" + itoa(int64(i+1))
		if r := v6.signin("acct_guess"+itoa(int64(i)), "whatever"); r.status != http.StatusUnauthorized {
			t.Fatalf("IPv6 failure %d: %d", i+1, r.status)
		}
	}
	v6.from = "2001:db8:1:2:ffff::1"
	if r := v6.signin(e.acct.ID, password); r.status != http.StatusTooManyRequests {
		t.Errorf("another address of the /64 after %d failures: %d, want 429", addressFailures, r.status)
	}
	v6.from = "2001:db8:1:3::1"
	if r := v6.signin(e.acct.ID, password); r.status != http.StatusSeeOther {
		t.Errorf("the next /64: %d %s, want 303", r.status, r.code())
	}
	// Guessers from many addresses together lock the account.
	other, _ := e.newAccount(t, "bob", "1")
	holder.setPassword(other.ID, password)
	many := e.browser(t)
	for i := range accountFailuresAll {
		many.from = "192.0.2." + itoa(int64(i/accountFailures+1))
		if r := many.signin(other.ID, "wrong password!"); r.status != http.StatusUnauthorized {
			t.Fatalf("failure %d from %s: %d", i+1, many.from, r.status)
		}
	}
	holder.from = "198.51.100.10"
	if r := holder.signin(other.ID, password); r.status != http.StatusTooManyRequests {
		t.Errorf("after %d failures from many addresses: %d, want 429", accountFailuresAll, r.status)
	}
}

// Sign-ins sent at once are counted before their passwords are checked:
// no more than the limit get an answer to their guess.
func TestSignInConcurrentGuessesCounted(t *testing.T) {
	e := newEnv(t, Options{})
	b := e.browser(t)
	b.setPassword(e.acct.ID, password)
	form := b.get("/console/signin").csrf(t)
	const n = 4 * accountFailures
	var wg sync.WaitGroup
	statuses := make(chan int, n)
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequest("POST", e.srv.URL+"/console/signin",
				strings.NewReader(url.Values{"csrf": {form}, "account": {e.acct.ID}, "password": {"wrong password!"}}.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			resp, err := b.c.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			statuses <- resp.StatusCode
		})
	}
	wg.Wait()
	close(statuses)
	count := map[int]int{}
	for s := range statuses {
		count[s]++
	}
	if count[http.StatusUnauthorized] != accountFailures || count[http.StatusTooManyRequests] != n-accountFailures {
		t.Errorf("%d guesses at once: %v, want %d checked (401) and the rest refused (429)", n, count, accountFailures)
	}
}

// What a client types as an account id never becomes a limiter's key unless
// it could be one; a long one is refused like a wrong password.
func TestSignInImplausibleAccountID(t *testing.T) {
	e := newEnv(t, Options{})
	b := e.browser(t)
	if r := b.signin(strings.Repeat("x", 10_000), "whatever password"); r.status != http.StatusUnauthorized {
		t.Errorf("a 10,000-character account id: %d, want 401", r.status)
	}
	if r := b.signin("acct_<script>", "whatever password"); r.status != http.StatusUnauthorized {
		t.Errorf("an account id with markup: %d, want 401", r.status)
	}
	e.con.byAccount.mu.Lock()
	n := len(e.con.byAccount.seen)
	e.con.byAccount.mu.Unlock()
	if n != 0 {
		t.Errorf("the account limiter holds %d keys, want 0", n)
	}
}

// Trying invitations is limited per client before any password is hashed;
// accepting one ends the account's other sessions.
func TestInviteLimitsAndEndsSessions(t *testing.T) {
	e := newEnv(t, Options{})
	old := e.signedIn(t)
	if r := old.get("/console/"); r.status != 200 {
		t.Fatalf("overview: %d", r.status)
	}
	fresh := e.browser(t)
	fresh.setPassword(e.acct.ID, "a brand new password")
	if r := old.get("/console/"); r.status != http.StatusSeeOther {
		t.Errorf("a session from before the new password: %d, want 303 to the sign-in page", r.status)
	}
	// Two tries were used from this address (both browsers are loopback);
	// the rest of the window's are bogus tokens.
	p := fresh.get("/console/signin") // the same pre-session's token as the invitation form's
	for i := range addressInvites - 2 {
		r := fresh.post("/console/invite", url.Values{"csrf": {p.csrf(t)}, "token": {"inv-bogus" + itoa(int64(i))},
			"password": {"a brand new password"}, "confirm": {"a brand new password"}})
		if r.status != http.StatusNotFound {
			t.Fatalf("bogus invitation %d: %d %s, want 404", i+1, r.status, r.code())
		}
	}
	token, _, err := tollgate.IssueInvite(t.Context(), e.st, e.acct.ID, e.clock.now())
	if err != nil {
		t.Fatal(err)
	}
	r := fresh.post("/console/invite", url.Values{"csrf": {p.csrf(t)}, "token": {token},
		"password": {"a brand new password"}, "confirm": {"a brand new password"}})
	if r.status != http.StatusTooManyRequests || r.code() != "rate_limit_exceeded" || r.header.Get("Retry-After") == "" {
		t.Errorf("the %dth invitation tried from one address: %d %s, want 429 with Retry-After", addressInvites+1, r.status, r.code())
	}
}

func TestHashSlotsBounded(t *testing.T) {
	s := make(hashSlots, 1)
	if err := s.acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := s.acquire(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("acquire with every slot taken and the request gone: %v, want context.Canceled", err)
	}
	s.release()
	if err := s.acquire(ctx); err != nil {
		t.Errorf("acquire of a free slot: %v", err)
	}
}

func TestAttemptsBounded(t *testing.T) {
	a := newAttempts(3, time.Hour)
	now := time.Unix(0, 0)
	for i := range maxTracked + 1000 {
		a.try("k"+itoa(int64(i)), now)
	}
	if len(a.seen) > maxTracked {
		t.Errorf("%d keys tracked, want at most %d", len(a.seen), maxTracked)
	}
}

func TestDisabledAccountCannotSignIn(t *testing.T) {
	e := newEnv(t, Options{})
	b := e.signedIn(t)
	if err := e.st.SetAccountDisabled(t.Context(), e.acct.ID, true); err != nil {
		t.Fatal(err)
	}
	if r := b.get("/console/"); r.status != http.StatusForbidden || r.code() != "account_disabled" {
		t.Errorf("page of a disabled account: %d %s", r.status, r.code())
	}
	if r := b.signin(e.acct.ID, password); r.status != http.StatusForbidden || r.code() != "account_disabled" {
		t.Errorf("sign-in of a disabled account: %d %s", r.status, r.code())
	}
}

func TestCSRFRejected(t *testing.T) {
	e := newEnv(t, Options{})
	b := e.signedIn(t)
	other, _ := e.newAccount(t, "mallory", "1")
	ob := e.browser(t)
	ob.setPassword(other.ID, password)
	ob.signin(other.ID, password)
	theirs := ob.get("/console/keys").csrf(t)
	for name, form := range map[string]url.Values{
		"no token":              {"name": {"x"}},
		"another session's one": {"name": {"x"}, "csrf": {theirs}},
		"a made-up one":         {"name": {"x"}, "csrf": {"AAAA"}},
	} {
		r := b.post("/console/keys", form)
		if r.status != http.StatusBadRequest || r.code() != "invalid_request" || !strings.Contains(r.body, `data-param="csrf"`) {
			t.Errorf("%s: %d %s", name, r.status, r.code())
		}
	}
	if keys, _ := e.st.Keys(t.Context(), e.acct.ID); len(keys) != 1 {
		t.Errorf("a key was created without a valid token: %d keys", len(keys))
	}
	if r := b.post("/console/signout", url.Values{}); r.status != http.StatusBadRequest {
		t.Errorf("sign-out without the token: %d", r.status)
	}
	// The forms shown before sign-in: their token must match the cookie.
	fresh := e.browser(t)
	if r := fresh.post("/console/signin", url.Values{"csrf": {"x"}, "account": {e.acct.ID}, "password": {password}}); r.status != http.StatusBadRequest || r.code() != "invalid_request" {
		t.Errorf("sign-in without its form cookie: %d %s", r.status, r.code())
	}
}

func TestExpiredSession(t *testing.T) {
	e := newEnv(t, Options{SessionTTL: time.Hour})
	b := e.signedIn(t)
	csrf := b.get("/console/keys").csrf(t)
	e.clock.add(time.Hour)
	if r := b.get("/console/keys"); r.status != http.StatusSeeOther || r.header.Get("Location") != "/console/signin" {
		t.Errorf("page with an expired session: %d %q", r.status, r.header.Get("Location"))
	}
	if r := b.post("/console/keys", url.Values{"csrf": {csrf}, "name": {"late"}}); r.status != http.StatusUnauthorized || r.code() != "unauthorized" {
		t.Errorf("form with an expired session: %d %s", r.status, r.code())
	}
}

func TestSecureCookieBehindTrustedProxy(t *testing.T) {
	for _, tc := range []struct {
		name    string
		trusted []netip.Prefix
		secure  bool
	}{
		{"trusted", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, true},
		{"untrusted", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Options{TrustedProxies: tc.trusted})
			req, _ := http.NewRequest("GET", e.srv.URL+"/console/signin", nil)
			req.Header.Set("X-Forwarded-Proto", "https")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			cs := resp.Cookies()
			if len(cs) != 1 || cs[0].Secure != tc.secure {
				t.Fatalf("cookies %+v, want Secure=%t", cs, tc.secure)
			}
			// Over TLS, a __Host- cookie (Path=/, no Domain).
			if host := strings.HasPrefix(cs[0].Name, "__Host-"); host != tc.secure || tc.secure && (cs[0].Path != "/" || cs[0].Domain != "") {
				t.Errorf("cookie %+v over TLS=%t: want the __Host- prefix and Path=/ exactly over TLS", cs[0], tc.secure)
			}
		})
	}
}

// Served over TLS, the whole sign-in works with __Host- cookies, and a
// cookie without the prefix (which a sibling subdomain or a plain-http
// port could plant) is not read.
func TestHostCookiesOverTLS(t *testing.T) {
	e := newEnv(t, Options{})
	srv := httptest.NewTLSServer(routes(e.con))
	t.Cleanup(srv.Close)
	e.srv = srv
	b := e.browser(t)
	b.c.Transport = srv.Client().Transport
	b.setPassword(e.acct.ID, password)
	if r := b.signin(e.acct.ID, password); r.status != http.StatusSeeOther {
		t.Fatalf("sign-in over TLS: %d %s", r.status, r.code())
	}
	u, _ := url.Parse(srv.URL + "/console/")
	names := map[string]bool{}
	for _, ck := range b.c.Jar.Cookies(u) {
		names[ck.Name] = true
	}
	if !names["__Host-tg_console"] || !names["__Host-tg_form"] || names["tg_console"] || names["tg_form"] {
		t.Errorf("cookies over TLS: %v, want __Host-tg_console and __Host-tg_form only", names)
	}
	if r := b.get("/console/"); r.status != 200 {
		t.Errorf("overview over TLS: %d", r.status)
	}
	// A planted pre-session without the prefix is not the form's.
	planted := e.browser(t)
	planted.c.Transport = srv.Client().Transport
	p := b.get("/console/signin")
	planted.c.Jar.SetCookies(u, []*http.Cookie{{Name: "tg_form", Value: strings.Repeat("A", 43) + ".9999999999"}})
	if r := planted.post("/console/signin", url.Values{"csrf": {p.csrf(t)}, "account": {e.acct.ID}, "password": {password}}); r.status != http.StatusBadRequest || r.code() != "invalid_request" {
		t.Errorf("a planted tg_form cookie over TLS: %d %s", r.status, r.code())
	}
}

// Login CSRF: a page of another origin (another port of this host, a
// sibling subdomain) that can plant the pre-session cookie must still not
// sign the victim's browser in to the attacker's account.
func TestLoginCSRF(t *testing.T) {
	e := newEnv(t, Options{})
	attacker, _ := e.newAccount(t, "mallory", "1")
	e.browser(t).setPassword(attacker.ID, password)
	signedIn := func(b *browser) bool {
		t.Helper()
		return b.get("/console/").status == 200
	}
	u, _ := url.Parse(e.srv.URL + "/console/")

	// 1. The old attack: a made-up cookie and the same value as the token.
	victim := e.browser(t)
	made := strings.Repeat("x", 43)
	victim.c.Jar.SetCookies(u, []*http.Cookie{{Name: "tg_form", Value: made, Path: "/console/"}})
	if r := victim.post("/console/signin", url.Values{"csrf": {made}, "account": {attacker.ID}, "password": {password}}); r.code() != "invalid_request" || signedIn(victim) {
		t.Errorf("a made-up pre-session: %d %s, signed in %t", r.status, r.code(), signedIn(victim))
	}

	// A well-formed pre-session the server did not sign gets no token: the
	// sign-in page starts a new one instead.
	unsigned := made + "." + itoa(e.clock.now().Add(time.Hour).Unix()) + ".c2lnbmF0dXJl"
	victim.c.Jar.SetCookies(u, []*http.Cookie{{Name: "tg_form", Value: unsigned, Path: "/console/"}})
	if r := victim.get("/console/signin"); !strings.Contains(r.header.Get("Set-Cookie"), "tg_form=") || strings.Contains(r.header.Get("Set-Cookie"), unsigned) {
		t.Errorf("the sign-in page kept a pre-session it did not sign: Set-Cookie %q", r.header.Get("Set-Cookie"))
	}

	// 2. A genuine pre-session the attacker fetched and planted, sent from
	// the attacker's page: the browser says where the form came from.
	evil := e.browser(t)
	token := evil.get("/console/signin").csrf(t)
	var pre *http.Cookie
	for _, ck := range evil.c.Jar.Cookies(u) {
		if ck.Name == "tg_form" {
			pre = ck
		}
	}
	if pre == nil {
		t.Fatal("the sign-in page set no tg_form cookie")
	}
	for name, h := range map[string]http.Header{
		"Sec-Fetch-Site: same-site":     {"Sec-Fetch-Site": {"same-site"}, "Origin": {"http://127.0.0.1:1"}},
		"Sec-Fetch-Site: cross-site":    {"Sec-Fetch-Site": {"cross-site"}},
		"Origin of another port":        {"Origin": {"http://127.0.0.1:1"}},
		"Origin of a sibling subdomain": {"Origin": {"https://evil.example.com"}},
		"Origin: null":                  {"Origin": {"null"}},
	} {
		victim := e.browser(t)
		victim.c.Jar.SetCookies(u, []*http.Cookie{{Name: "tg_form", Value: pre.Value, Path: "/console/"}})
		req, _ := http.NewRequest("POST", e.srv.URL+"/console/signin",
			strings.NewReader(url.Values{"csrf": {token}, "account": {attacker.ID}, "password": {password}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		maps.Copy(req.Header, h)
		r := victim.do(req)
		if r.status != http.StatusBadRequest || r.code() != "invalid_request" || !strings.Contains(r.body, "another site") || signedIn(victim) {
			t.Errorf("%s: %d %s, signed in %t", name, r.status, r.code(), signedIn(victim))
		}
	}
	// The same form from this console's own page goes through.
	self := e.browser(t)
	self.c.Jar.SetCookies(u, []*http.Cookie{{Name: "tg_form", Value: pre.Value, Path: "/console/"}})
	req, _ := http.NewRequest("POST", e.srv.URL+"/console/signin",
		strings.NewReader(url.Values{"csrf": {token}, "account": {attacker.ID}, "password": {password}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	req.Header.Set("Origin", e.srv.URL)
	if r := self.do(req); r.status != http.StatusSeeOther || !signedIn(self) {
		t.Errorf("the console's own form: %d %s", r.status, r.code())
	}

	// 3. A pre-session past its expiry is refused, and another instance on
	// the same store (the secret is shared) accepts a live one.
	late := e.browser(t)
	tok := late.get("/console/signin").csrf(t)
	e.restart(t, e.st, nil)
	if r := late.post("/console/signin", url.Values{"csrf": {tok}, "account": {attacker.ID}, "password": {"wrong password!"}}); r.status != http.StatusUnauthorized {
		t.Errorf("a pre-session from another instance: %d %s, want the password checked (401)", r.status, r.code())
	}
	e.clock.add(formTTL + time.Second)
	if r := late.post("/console/signin", url.Values{"csrf": {tok}, "account": {attacker.ID}, "password": {password}}); r.code() != "invalid_request" || signedIn(late) {
		t.Errorf("an expired pre-session: %d %s", r.status, r.code())
	}

	// 4. Signed in, a cross-origin POST is refused too.
	b := e.signedIn(t)
	csrf := b.get("/console/keys").csrf(t)
	req, _ = http.NewRequest("POST", e.srv.URL+"/console/keys", strings.NewReader(url.Values{"csrf": {csrf}, "name": {"evil"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-site")
	if r := b.do(req); r.code() != "invalid_request" {
		t.Errorf("a signed-in POST from another origin: %d %s", r.status, r.code())
	}
	if keys, _ := e.st.Keys(t.Context(), e.acct.ID); len(keys) != 1 {
		t.Errorf("a key was made from another origin: %d keys", len(keys))
	}
}

var secretRE = regexp.MustCompile(`sk-tg-[0-9A-Za-z]{32}`)

func TestKeysCreateListRevoke(t *testing.T) {
	e := newEnv(t, Options{})
	b := e.signedIn(t)
	p := b.get("/console/keys")
	if p.status != 200 || !strings.Contains(p.body, "alice-key") || secretRE.MatchString(p.body) {
		t.Fatalf("keys page: %d\n%s", p.status, p.body)
	}
	csrf := p.csrf(t)
	bad := b.post("/console/keys", url.Values{"csrf": {csrf}, "name": {"laptop"}, "spend_limit": {"lots"}})
	if bad.status != http.StatusBadRequest || !strings.Contains(bad.body, `data-param="spend_limit"`) || !strings.Contains(bad.body, `value="laptop"`) {
		t.Errorf("bad spend limit: %d %s", bad.status, bad.code())
	}
	if r := b.post("/console/keys", url.Values{"csrf": {csrf}, "models": {"gpt-9"}}); r.status != http.StatusBadRequest || !strings.Contains(r.body, `data-param="models"`) {
		t.Errorf("a model outside the catalogue: %d %s", r.status, r.code())
	}
	created := b.post("/console/keys", url.Values{"csrf": {csrf}, "name": {"laptop"}, "expires": {"30d"}, "models": {"tg-mini"},
		"spend_limit": {"2.5"}, "rpm": {"60"}, "tpm": {"10000"}})
	secret := secretRE.FindString(created.body)
	if created.status != http.StatusCreated || secret == "" || !strings.Contains(created.body, `data-copy="new-secret"`) {
		t.Fatalf("create: %d %s\n%s", created.status, created.code(), created.body)
	}
	k, _, err := e.st.KeyByHash(t.Context(), tollgate.HashKey(secret))
	if err != nil {
		t.Fatal(err)
	}
	if k.AccountID != e.acct.ID || k.Name != "laptop" || k.SpendLimit != tollgate.MustParseAmount("2.5") || k.RPM != 60 || k.TPM != 10000 ||
		len(k.AllowedModels) != 1 || k.AllowedModels[0] != "tg-mini" || !k.Expires.Equal(e.clock.now().AddDate(0, 0, 30)) {
		t.Errorf("stored key = %+v", k)
	}
	list := b.get("/console/keys")
	if !regexp.MustCompile(`(?s)<details class="confirm"><summary class="button danger" aria-label="Revoke key laptop…">Revoke…</summary>.*?<form method="post" action="/console/keys/` + k.ID + `/revoke">`).MatchString(list.body) {
		t.Errorf("revoking is not behind a confirmation:\n%s", list.body)
	}
	if strings.Contains(list.body, secret) || !strings.Contains(list.body, k.Prefix+"…") || !strings.Contains(list.body, cash("2.5")+" USD") {
		t.Errorf("the list after creation shows the secret, or not the key")
	}
	// Another account's key id: not found, and the key stays active.
	_, theirs := e.newAccount(t, "bob", "1")
	if r := b.post("/console/keys/"+theirs.ID+"/revoke", url.Values{"csrf": {csrf}}); r.status != http.StatusNotFound || r.code() != "not_found" {
		t.Errorf("revoking another account's key: %d %s", r.status, r.code())
	}
	if bk, _ := e.st.Keys(t.Context(), theirs.AccountID); !bk[0].Revoked.IsZero() {
		t.Error("another account's key was revoked")
	}
	if r := b.post("/console/keys/"+k.ID+"/revoke", url.Values{"csrf": {csrf}}); r.status != http.StatusSeeOther {
		t.Fatalf("revoke: %d %s", r.status, r.code())
	}
	if k2, _, _ := e.st.KeyByHash(t.Context(), tollgate.HashKey(secret)); k2.Revoked.IsZero() {
		t.Error("the key is not revoked")
	}
	if r := b.get("/console/keys"); !strings.Contains(r.body, `class="status-revoked">revoked`) {
		t.Error("the list does not show the key revoked")
	}
}

func TestOverviewFigures(t *testing.T) {
	e := newEnv(t, Options{})
	now := e.clock.now() // 2026-03-20 15:00 UTC
	e.charge(t, e.key, "tg-chat", tollgate.MustParseAmount("0.000000000001"), now.Add(-time.Hour))
	e.charge(t, e.key, "tg-mini", tollgate.MustParseAmount("0.25"), now.Add(-2*time.Hour))
	e.charge(t, e.key, "tg-chat", tollgate.MustParseAmount("1"), now.AddDate(0, 0, -3))  // this month, not today
	e.charge(t, e.key, "tg-chat", tollgate.MustParseAmount("2"), now.AddDate(0, 0, -25)) // last month, in the chart
	e.charge(t, e.key, "tg-chat", tollgate.MustParseAmount("4"), now.AddDate(0, 0, -45)) // neither
	b := e.signedIn(t)
	p := b.get("/console/")
	for _, want := range []string{
		shown("balance", "2.749999999999"), // 10 − 7.250000000001
		shown("spend-today", "0.250000000001"),
		shown("spend-month", "1.250000000001"),
		`<td class="nowrap">tg-chat</td><td class="num">3</td><td class="num">360</td><td class="num">` + cash("3.000000000001") + `</td>`,
		// The prices are /pricing's: network 3 of 4 requests.
		`<td class="num">0.12 / 0.4</td>`, `<td class="num">2.2 / 8.8</td>`, `network share 0.75`,
	} {
		if !strings.Contains(p.body, want) {
			t.Errorf("overview lacks %s", want)
		}
	}
	if n := strings.Count(p.body, "<rect x="); n != 8 {
		t.Errorf("%d bars, want 4 in each chart (two models today, one 3 days ago, one 25 days ago)", n)
	}
	for _, want := range []string{
		bar("2026-02-23", "tg-chat", "2.00"), "2026-02-23 · tg-chat · 120 tokens", // the bars of 25 days ago
		`<svg class="chart" id="spend-chart"`, `<svg class="chart" id="tokens-chart"`,
		`<title id="tokens-svg-title">Tokens per day by model, last 30 days</title>`,
		`the tallest day is 240 tokens`, // today: two charges of 120 tokens
		// The tables for screen readers: a column per model, then the day's total.
		`<th scope="col" class="num">tg-chat</th><th scope="col" class="num">tg-mini</th><th scope="col" class="num">Total</th>`,
		`<tr><th scope="row">2026-03-20</th><td class="num">` + cash("0.000000000001") + `</td><td class="num">` + cash("0.25") + `</td><td class="num">` +
			cash("0.250000000001") + `</td></tr>`,
		`<tr><th scope="row">2026-03-20</th><td class="num">120</td><td class="num">120</td><td class="num">240</td></tr>`,
		`<tr><th scope="row">2026-03-17</th><td class="num">120</td><td class="num">0</td><td class="num">120</td></tr>`,
	} {
		if !strings.Contains(p.body, want) {
			t.Errorf("the charts lack %s", want)
		}
	}
	pricing := string(server.BuildPricing(e.cat, 3, 4))
	if !strings.Contains(pricing, `"network":{"input":"0.12","output":"0.4"}`) {
		t.Errorf("pricing document changed shape: %s", pricing)
	}
}

// The overview's past days are cached from sign-in on, and a charge that
// lands in a past day later (recovered from a dead instance's journal) shows
// at the next view; a new day moves the chart.
func TestOverviewPastDaysCache(t *testing.T) {
	e := newEnv(t, Options{})
	now := e.clock.now() // 2026-03-20 15:00 UTC
	e.charge(t, e.key, "tg-chat", tollgate.MustParseAmount("1"), now.AddDate(0, 0, -3))
	b := e.signedIn(t)
	a := e.con.closed.account(e.acct.ID)
	if len(a.out) != 1 || a.out[0].Cost != tollgate.MustParseAmount("1") {
		t.Fatalf("the sign-in did not sum the past days: %+v", a.out)
	}
	if p := b.get("/console/"); !strings.Contains(p.body, shown("spend-month", "1.00")) {
		t.Fatal("overview before the late charge")
	}
	e.charge(t, e.key, "tg-mini", tollgate.MustParseAmount("0.5"), now.AddDate(0, 0, -5))
	p := b.get("/console/")
	if !strings.Contains(p.body, shown("spend-month", "1.50")) || !strings.Contains(p.body, bar("2026-03-15", "tg-mini", "0.50")) {
		t.Error("a charge into a past day does not show at the next view")
	}
	// Only the changed day was summed again: the other day's sums are the
	// cached ones.
	if a.days[now.Truncate(24*time.Hour).AddDate(0, 0, -3)].sums[0].Requests != 1 || len(a.out) != 2 {
		t.Errorf("cached days after the late charge: %+v", a.out)
	}
	e.charge(t, e.key, "tg-chat", tollgate.MustParseAmount("2"), now)
	e.clock.add(10 * time.Hour) // 01:00 the next day, within the sign-in
	p = b.get("/console/")
	for _, want := range []string{shown("spend-today", "0.00"), shown("spend-month", "3.50"), bar("2026-03-20", "tg-chat", "2.00")} {
		if !strings.Contains(p.body, want) {
			t.Errorf("the next day, the overview lacks %s", want)
		}
	}
}

// countingStore counts the console's sums of closed days read from the
// ledger (DailyCharges with an end; today's sums have none) and its reads of
// the days' marks, and fails the saved days' reads and writes when told to.
type countingStore struct {
	testStore
	closedSums, dayMarks atomic.Int64
	fail                 error
}

func (s *countingStore) DayMarks(ctx context.Context, account string, since, until time.Time) ([]tollgate.DayMark, error) {
	s.dayMarks.Add(1)
	return s.testStore.DayMarks(ctx, account, since, until)
}

func (s *countingStore) DailyCharges(ctx context.Context, f tollgate.UsageFilter) ([]tollgate.ChargeDay, error) {
	if !f.Until.IsZero() {
		s.closedSums.Add(1)
	}
	return s.testStore.DailyCharges(ctx, f)
}

func (s *countingStore) SavedDays(ctx context.Context, account string, since, until time.Time) ([]tollgate.SavedDay, error) {
	if s.fail != nil {
		return nil, s.fail
	}
	return s.testStore.SavedDays(ctx, account, since, until)
}

func (s *countingStore) SaveDays(ctx context.Context, account string, since time.Time, days []tollgate.SavedDay) error {
	if s.fail != nil {
		return s.fail
	}
	return s.testStore.SaveDays(ctx, account, since, days)
}

// The past days summed are saved in the store: a restarted instance reads
// them and sums nothing from the ledger while they are current; a charge
// recovered into a saved day later makes that day (only) summed again, and
// saved again for the next instance. On SQLite and, with
// $TOLLGATE_TEST_POSTGRES, on PostgreSQL.
func TestOverviewPastDaysSaved(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) { testOverviewPastDaysSaved(t, newEnv(t, Options{})) })
	if os.Getenv(postgres.TestEnv) != "" {
		t.Run("postgres", func(t *testing.T) { testOverviewPastDaysSaved(t, newEnvStore(t, Options{}, postgres.OpenTest(t))) })
	}
}

func testOverviewPastDaysSaved(t *testing.T, e *env) {
	now := e.clock.now() // 2026-03-20 15:00 UTC
	today := now.Truncate(24 * time.Hour)
	e.charge(t, e.key, "tg-chat", tollgate.MustParseAmount("1"), now.AddDate(0, 0, -3))
	e.charge(t, e.key, "tg-mini", tollgate.MustParseAmount("0.5"), now.AddDate(0, 0, -5))
	e.charge(t, e.key, "tg-chat", tollgate.MustParseAmount("2"), now.AddDate(0, 0, -20)) // last month, in the chart
	e.charge(t, e.key, "tg-chat", tollgate.MustParseAmount("0.25"), now)
	if _, err := operator.Post(context.Background(), e.st, tollgate.LedgerCredit, e.acct.ID, tollgate.MustParseAmount("1"), "", "", now.AddDate(0, 0, -4)); err != nil {
		t.Fatal(err)
	}
	b := e.signedIn(t)
	want := []string{shown("spend-today", "0.25"), shown("spend-month", "1.75"), bar("2026-03-17", "tg-chat", "1.00"),
		bar("2026-03-15", "tg-mini", "0.50"), bar("2026-02-28", "tg-chat", "2.00")}
	view := func(what string, want []string) {
		t.Helper()
		p := b.get("/console/")
		if p.status != 200 {
			t.Fatalf("%s: overview %d %s", what, p.status, p.code())
		}
		for _, w := range want {
			if !strings.Contains(p.body, w) {
				t.Errorf("%s: the overview lacks %s", what, w)
			}
		}
	}
	view("signed in", want)
	// The sign-in saved the span's days with rows: their marks, the
	// charges' sums, and the credit's day without sums.
	_, _, _, since := overviewDays(now)
	marks, err := e.st.DayMarks(context.Background(), e.acct.ID, since, today)
	if err != nil {
		t.Fatal(err)
	}
	saved, err := e.st.SavedDays(context.Background(), e.acct.ID, since, today)
	if err != nil {
		t.Fatal(err)
	}
	if len(marks) != 4 || len(saved) != len(marks) {
		t.Fatalf("saved days %+v, marks %+v: want the 4 past days with rows", saved, marks)
	}
	for i, d := range saved {
		if d.Mark != marks[i] {
			t.Errorf("saved day %d: mark %+v, the ledger's %+v", i, d.Mark, marks[i])
		}
	}
	if len(saved[2].Sums) != 0 || len(saved[3].Sums) != 1 || saved[3].Sums[0].Cost != tollgate.MustParseAmount("1") {
		t.Errorf("saved sums: the credit's day %+v, the last day %+v", saved[2], saved[3])
	}

	cs := &countingStore{testStore: e.st}
	e.restart(t, cs, nil)
	view("restarted", want)
	if n, m := cs.closedSums.Load(), cs.dayMarks.Load(); n != 0 || m != 0 {
		t.Errorf("the restarted instance summed the past days %d times and read their marks %d times, want neither (they are saved, the span's count says unchanged)", n, m)
	}
	// A charge recovered into a saved day.
	e.charge(t, e.key, "tg-chat", tollgate.MustParseAmount("0.25"), now.AddDate(0, 0, -3).Add(time.Hour))
	want = []string{shown("spend-today", "0.25"), shown("spend-month", "2.00"), bar("2026-03-17", "tg-chat", "1.25"),
		bar("2026-03-15", "tg-mini", "0.50"), bar("2026-02-28", "tg-chat", "2.00")}
	view("a late charge", want)
	if n, m := cs.closedSums.Load(), cs.dayMarks.Load(); n != 1 || m != 1 {
		t.Errorf("after a late charge, the past days were summed %d times and their marks read %d times, want once each (the day that changed)", n, m)
	}
	cs2 := &countingStore{testStore: e.st}
	e.restart(t, cs2, nil)
	view("restarted after the late charge", want)
	if n := cs2.closedSums.Load(); n != 0 {
		t.Errorf("the instance restarted after the late charge summed the past days %d times, want none (the day was saved again)", n)
	}
	// Charges recovered while no instance runs, into a saved day and into a
	// day that had no rows: the next instance's first view has them.
	cs3 := &countingStore{testStore: e.st}
	e.restart(t, cs3, nil)
	e.charge(t, e.key, "tg-mini", tollgate.MustParseAmount("0.25"), now.AddDate(0, 0, -5).Add(time.Minute))
	e.charge(t, e.key, "tg-mini", tollgate.MustParseAmount("3"), now.AddDate(0, 0, -10))
	view("late charges before the first view of a restarted instance", []string{shown("spend-month", "5.25"),
		bar("2026-03-17", "tg-chat", "1.25"), bar("2026-03-15", "tg-mini", "0.75"), bar("2026-03-10", "tg-mini", "3.00"), bar("2026-02-28", "tg-chat", "2.00")})
	if n := cs3.closedSums.Load(); n != 1 {
		t.Errorf("the past days were summed %d times, want once (the span of the two days that changed)", n)
	}
}

// The saved days are a cache: when the store cannot read or write them,
// the overview sums the ledger, and the failure is logged.
func TestOverviewSavedDaysFail(t *testing.T) {
	e := newEnv(t, Options{})
	now := e.clock.now()
	e.charge(t, e.key, "tg-chat", tollgate.MustParseAmount("1"), now.AddDate(0, 0, -3))
	var log syncbuf.Buffer
	cs := &countingStore{testStore: e.st, fail: errors.New("the disk is on fire")}
	e.restart(t, cs, slog.New(slog.NewTextHandler(&log, nil)))
	b := e.signedIn(t)
	p := b.get("/console/")
	if p.status != 200 || !strings.Contains(p.body, shown("spend-month", "1.00")) {
		t.Fatalf("overview with the saved days failing: %d %s", p.status, p.code())
	}
	for _, w := range []string{"console: read the saved past days", "console: save the past days", "the disk is on fire"} {
		if !strings.Contains(log.String(), w) {
			t.Errorf("the log lacks %q:\n%s", w, log.String())
		}
	}
	if saved, err := e.st.SavedDays(context.Background(), e.acct.ID, now.AddDate(0, 0, -40), now); err != nil || len(saved) != 0 {
		t.Errorf("saved days = %+v, %v; want none", saved, err)
	}
}

func TestActivityAndCSV(t *testing.T) {
	e := newEnv(t, Options{})
	now := e.clock.now()
	_, other := e.newAccount(t, "bob", "5")
	e.charge(t, e.key, "tg-chat", tollgate.MustParseAmount("0.000123456789"), now.Add(-time.Hour))
	e.charge(t, e.key, "tg-mini", tollgate.MustParseAmount("0.5"), now.Add(-2*time.Hour))
	e.charge(t, e.key, "tg-chat", tollgate.MustParseAmount("0.01"), now.AddDate(0, 0, -2))
	e.charge(t, other, "tg-chat", tollgate.MustParseAmount("3"), now.Add(-time.Minute))
	for i := range activityPage {
		e.charge(t, e.key, "tg-mini", 1, now.AddDate(0, 0, -10).Add(time.Duration(i)*time.Second))
	}
	b := e.signedIn(t)
	p := b.get("/console/activity")
	if p.status != 200 || strings.Contains(p.body, "3.000000000000") {
		t.Fatalf("activity: %d (or it shows another account's charge)", p.status)
	}
	first := strings.Index(p.body, "0.000123456789")
	second := strings.Index(p.body, "0.500000000000")
	if first < 0 || second < first {
		t.Errorf("activity is not newest first with 12 decimals (%d, %d)", first, second)
	}
	if !strings.Contains(p.body, `rel="next"`) || strings.Count(p.body, `class="mono request-id"`) != activityPage {
		t.Errorf("first page: want %d rows and a next page", activityPage)
	}
	next := regexp.MustCompile(`<a href="([^"]*)" rel="next">`).FindStringSubmatch(p.body)
	if next == nil || html.UnescapeString(next[1]) != "/console/activity?page=2" {
		t.Errorf("the next page's link is %q, want /console/activity?page=2", next)
	}
	p2 := b.get(html.UnescapeString(next[1]))
	if n := strings.Count(p2.body, `class="mono request-id"`); n != 3 || strings.Contains(p2.body, `rel="next"`) {
		t.Errorf("second page: %d rows", n)
	}
	f := b.get("/console/activity?model=tg-chat&since=" + now.AddDate(0, 0, -1).Format(time.DateOnly))
	if n := strings.Count(f.body, `class="mono request-id"`); n != 1 || !strings.Contains(f.body, "0.000123456789") {
		t.Errorf("filtered by model and day: %d rows", n)
	}
	if r := b.get("/console/activity?since=yesterday"); r.status != http.StatusBadRequest || !strings.Contains(r.body, `data-param="since"`) {
		t.Errorf("bad date: %d %s", r.status, r.code())
	}
	// The CSV link the filtered page renders keeps the filter.
	filtered := b.get("/console/activity?model=tg-chat")
	m := regexp.MustCompile(`<a class="button secondary" href="([^"]*)" download>CSV</a>`).FindStringSubmatch(filtered.body)
	if m == nil {
		t.Fatalf("the filtered activity has no CSV link:\n%s", filtered.body)
	}
	if got := html.UnescapeString(m[1]); got != "/console/activity.csv?model=tg-chat" {
		t.Errorf("the filtered activity's CSV link is %q, want the filter in its query", got)
	}
	c := b.get(html.UnescapeString(m[1]))
	if c.status != 200 || c.header.Get("Content-Type") != "text/csv; charset=utf-8" {
		t.Fatalf("csv: %d %q", c.status, c.header.Get("Content-Type"))
	}
	recs, err := csv.NewReader(strings.NewReader(c.body)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	head, _ := billing.UsageColumns([]string{"key", "model", "backend"}, true, billing.UsageRow{})
	if want := slices.Insert(head, 2, "key_name"); strings.Join(recs[0], ",") != strings.Join(want, ",") {
		t.Errorf("csv header %v, want tollgate usage's with key_name after key: %v", recs[0], want)
	}
	if len(recs) != 3 || recs[1][0] != "2026-03-18" || recs[1][1] != e.key.ID || recs[1][2] != e.key.Name || recs[2][11] != "0.000123456789" {
		t.Errorf("csv rows = %v", recs)
	}
	// Without key_name, the same bytes as tollgate usage.
	var noName strings.Builder
	cw0 := csv.NewWriter(&noName)
	for _, rec := range recs {
		if err := cw0.Write(slices.Delete(rec, 2, 3)); err != nil {
			t.Fatal(err)
		}
	}
	cw0.Flush()
	// The same bytes as `tollgate usage --account A --model tg-chat --by key,model,backend --period day --csv`.
	rows, err := billing.Usage(t.Context(), e.st, tollgate.UsageFilter{AccountID: e.acct.ID, Model: "tg-chat"}, []string{"key", "model", "backend"}, "day")
	if err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	cw := csv.NewWriter(&want)
	if err := billing.WriteUsageCSV(cw, []string{"key", "model", "backend"}, true, rows); err != nil {
		t.Fatal(err)
	}
	cw.Flush()
	if noName.String() != want.String() {
		t.Errorf("csv export without key_name:\n%s\nwant what tollgate usage writes:\n%s", noName.String(), want.String())
	}
}

func TestPagesNeedSession(t *testing.T) {
	e := newEnv(t, Options{})
	b := e.browser(t)
	for _, path := range []string{"/console/", "/console/keys", "/console/activity", "/console/activity.csv", "/console/playground"} {
		if r := b.get(path); r.status != http.StatusSeeOther {
			t.Errorf("GET %s without a session: %d", path, r.status)
		}
	}
	if r := b.post("/console/keys/"+e.key.ID+"/revoke", url.Values{}); r.status != http.StatusUnauthorized {
		t.Errorf("revoke without a session: %d", r.status)
	}
	if r := b.get("/console/nope"); r.status != http.StatusNotFound || r.code() != "not_found" {
		t.Errorf("unknown page: %d %s", r.status, r.code())
	}
	if r := b.get("/console/static/console.css"); r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/css") {
		t.Errorf("stylesheet: %d %q", r.status, r.header.Get("Content-Type"))
	}
	if r := b.get("/favicon.ico"); r.status != 200 || r.header.Get("Content-Type") != "image/x-icon" || !strings.HasPrefix(r.body, "\x00\x00\x01\x00") {
		t.Errorf("favicon: %d %q", r.status, r.header.Get("Content-Type"))
	}
}

func TestPassword(t *testing.T) {
	h, err := HashPassword("pw", DefaultPasswordParams)
	if err != nil || !strings.HasPrefix(h, "$argon2id$v=19$m=19456,t=2,p=1$") {
		t.Fatalf("hash = %q, %v", h, err)
	}
	h2, _ := HashPassword("pw", DefaultPasswordParams)
	if h == h2 {
		t.Error("two hashes of one password are equal: no salt")
	}
	if ok, err := VerifyPassword("pw", h); !ok || err != nil {
		t.Errorf("verify right: %t %v", ok, err)
	}
	if ok, _ := VerifyPassword("pW", h); ok {
		t.Error("verify wrong: true")
	}
	if _, err := VerifyPassword("pw", "$2a$10$bcrypt"); err == nil {
		t.Error("a non-argon2id hash verified without error")
	}
}

// cash is an amount as the pages show it (money).
func cash(amount string) string { return string(money(tollgate.MustParseAmount(amount))) }

// shown is the markup of the element id showing amount USD.
func shown(id, amount string) string { return `id="` + id + `">` + cash(amount) + ` USD` }

// bar is the hover text of a spend chart's bar.
func bar(day, model, amount string) string {
	a := tollgate.MustParseAmount(amount)
	return day + " · " + model + " · " + rounded(a) + " USD (exactly " + fixed12(a) + ")"
}

func TestFixed12(t *testing.T) {
	for a, want := range map[tollgate.Amount]string{1: "0.000000000001", -1_500_000_000_000: "-1.500000000000", 0: "0.000000000000"} {
		if got := fixed12(a); got != want {
			t.Errorf("fixed12(%d) = %s, want %s", a, got, want)
		}
	}
	for a, want := range map[string]string{"10": "10.000000", "0": "0.000000", "2.5": "2.500000", "0.000001": "0.000001",
		"0.0000005": "0.000001", "0.000000499999": "0.000000", "9.999984680001": "9.999985", "-0.0000005": "-0.000001",
		"-0.0000004": "0.000000", "1234567.8999995": "1234567.900000"} {
		if got := rounded(tollgate.MustParseAmount(a)); got != want {
			t.Errorf("rounded(%s) = %s, want %s", a, got, want)
		}
	}
	if got, want := money(tollgate.MustParseAmount("9.999984680001")),
		`<data class="amt rounded" value="9.999984680001" title="9.999984680001 USD exactly">9.999985</data>`; string(got) != want {
		t.Errorf("money = %s, want %s", got, want)
	}
	if got := money(tollgate.MustParseAmount("2.5")); !strings.Contains(string(got), `class="amt"`) {
		t.Errorf("money(2.5) = %s, want it not marked rounded", got)
	}
}

func TestPlaygroundKey(t *testing.T) {
	e := newEnv(t, Options{})
	b := e.signedIn(t)
	p := b.get("/console/playground")
	if p.status != 200 || !strings.Contains(p.body, `<option value="tg-mini">`) || !strings.Contains(p.body, `id="pg-answer"`) {
		t.Fatalf("playground page: %d\n%s", p.status, p.body)
	}
	// The image field and the demo tool are offered for the model that takes
	// them (the page's script shows them for the option so marked).
	for _, want := range []string{`<option value="tg-chat" data-tools data-images>tg-chat (tools, image_input)</option>`,
		`<option value="tg-mini">tg-mini</option>`, `<input type="file" id="pg-image" accept="image/png,image/jpeg,image/gif,image/webp">`,
		`<input type="checkbox" id="pg-tools">`} {
		if !strings.Contains(p.body, want) {
			t.Errorf("playground page lacks %s", want)
		}
	}
	csrf := regexp.MustCompile(`data-csrf="([^"]+)"`).FindStringSubmatch(p.body)[1]
	ask := func(token string) page {
		req, _ := http.NewRequest("POST", e.srv.URL+"/console/playground/key", nil)
		if token != "" {
			req.Header.Set("X-CSRF-Token", token)
		}
		return b.do(req)
	}
	if r := ask(""); r.status != http.StatusBadRequest || r.code() != "invalid_request" {
		t.Errorf("key without the CSRF header: %d %s", r.status, r.code())
	}
	var got []string
	for range 2 {
		r := ask(csrf)
		secret := secretRE.FindString(r.body)
		if r.status != 200 || secret == "" || r.header.Get("Cache-Control") != "no-store" {
			t.Fatalf("playground key: %d %s", r.status, r.body)
		}
		got = append(got, secret)
	}
	first, _, _ := e.st.KeyByHash(t.Context(), tollgate.HashKey(got[0]))
	second, _, _ := e.st.KeyByHash(t.Context(), tollgate.HashKey(got[1]))
	if first.Revoked.IsZero() || !second.Revoked.IsZero() || second.AccountID != e.acct.ID || second.Name != playgroundKeyName {
		t.Errorf("first key %+v (want revoked), second %+v (want active, this account's)", first, second)
	}
	if second.Expires.IsZero() || !second.Expires.Equal(e.clock.now().Add(12*time.Hour)) {
		t.Errorf("playground key expires %v, want with the session", second.Expires)
	}
	// Two pages asking at once (two tabs): every key but the session's
	// last is revoked, none is left behind.
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			if r := ask(csrf); r.status != 200 {
				t.Errorf("playground key at once: %d %s", r.status, r.code())
			}
		})
	}
	wg.Wait()
	keys, _ := e.st.Keys(t.Context(), e.acct.ID)
	live := 0
	for _, k := range keys {
		if k.Name == playgroundKeyName && k.Revoked.IsZero() {
			live++
		}
	}
	if live != 1 {
		t.Errorf("%d playground keys live after pages asked at once, want 1", live)
	}
	if r := b.post("/console/signout", url.Values{"csrf": {csrf}}); r.status != http.StatusSeeOther {
		t.Fatalf("sign-out: %d", r.status)
	}
	keys, _ = e.st.Keys(t.Context(), e.acct.ID)
	for _, k := range keys {
		if k.Name == playgroundKeyName && k.Revoked.IsZero() {
			t.Errorf("playground key %s outlived the sign-out", k.ID)
		}
	}
}

func TestLargeFormRefused(t *testing.T) {
	e := newEnv(t, Options{})
	b := e.signedIn(t)
	csrf := b.get("/console/keys").csrf(t)
	r := b.post("/console/keys", url.Values{"csrf": {csrf}, "name": {strings.Repeat("x", maxFormBytes)}})
	if r.status != http.StatusBadRequest {
		t.Errorf("a form over %d bytes: %d %s", maxFormBytes, r.status, r.code())
	}
	if keys, _ := e.st.Keys(t.Context(), e.acct.ID); len(keys) != 1 {
		t.Errorf("a key was created from an oversized form")
	}
}

func TestAddressKey(t *testing.T) {
	for in, want := range map[string]string{
		"203.0.113.7":           "203.0.113.7",
		"203.0.113.7:5678":      "203.0.113.7",
		"::ffff:203.0.113.7":    "203.0.113.7",
		"2001:db8:1:2::1":       "2001:db8:1:2::/64",
		"[2001:db8:1:2::9]:443": "2001:db8:1:2::/64",
		"not an address":        "not an address",
	} {
		if got := addressKey(in); got != want {
			t.Errorf("addressKey(%q) = %q, want %q", in, got, want)
		}
	}
}

// resetDuringSignin is a store in which the account's password is replaced
// through an invitation right after a sign-in read the old one.
type resetDuringSignin struct {
	testStore
	once  sync.Once
	reset func()
}

func (s *resetDuringSignin) PasswordHash(ctx context.Context, id string) (string, error) {
	h, err := s.testStore.PasswordHash(ctx, id)
	s.once.Do(s.reset)
	return h, err
}

// A sign-in with the old password that races a reset gets no session.
func TestSignInRacingAPasswordReset(t *testing.T) {
	base := newEnv(t, Options{})
	base.browser(t).setPassword(base.acct.ID, password)
	st := &resetDuringSignin{testStore: base.st}
	st.reset = func() {
		token, _, err := tollgate.IssueInvite(context.Background(), base.st, base.acct.ID, base.clock.now())
		if err != nil {
			t.Error(err)
			return
		}
		h, _ := HashPassword("the new password!", cheap)
		if _, err := base.st.AcceptInvite(context.Background(), tollgate.HashKey(token), h, base.clock.now()); err != nil {
			t.Error(err)
		}
	}
	e := newEnvStore(t, Options{}, st)
	e.acct, e.clock = base.acct, base.clock
	b := e.browser(t)
	if r := b.signin(base.acct.ID, password); r.status != http.StatusUnauthorized || !strings.Contains(r.body, "changed just now") {
		t.Fatalf("sign-in with the old password during a reset: %d %s", r.status, r.code())
	}
	if r := b.get("/console/"); r.status != http.StatusSeeOther {
		t.Errorf("the old password's sign-in left a session: %d", r.status)
	}
	if r := b.signin(base.acct.ID, "the new password!"); r.status != http.StatusSeeOther {
		t.Errorf("the new password: %d %s", r.status, r.code())
	}
}
