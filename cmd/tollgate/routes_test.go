package main

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/server"
)

// routeMiss is what every miss says: the listener's 404 (its 405 is told by
// its status), the console's, the operator's and the admin API's own 404
// for a path under them that nothing serves.
var routeMiss = regexp.MustCompile(`is not served on this listener|is not an admin API route|there is no console page|there is no operator page`)

// everyRouteHarness runs Main with every listener and payments on, so that
// every route is served, and token the admin token. No path a test asks
// should reach the payment provider, which is nowhere.
func everyRouteHarness(t *testing.T, token string) *harness {
	t.Helper()
	t.Setenv("TG_TEST_ADMIN_TOKEN", token)
	t.Setenv("TG_TEST_STRIPE_KEY", "sk_test_routes")
	t.Setenv("TG_TEST_STRIPE_WHSEC", "whsec_routes")
	return newHarness(t, harnessOptions{listen: "  public: 127.0.0.1:0\n  admin: 127.0.0.1:0\n", extraYAML: `admin_token_env: TG_TEST_ADMIN_TOKEN
payments:
  provider: stripe
  secret_key_env: TG_TEST_STRIPE_KEY
  webhook_secret_env: TG_TEST_STRIPE_WHSEC
  api_url: http://127.0.0.1:1
  console_url: http://127.0.0.1:1/console/
  auto_topup: true
`})
}

// Every route routes.go declares on each listener, asked on a running
// instance (payments on) with its method, the admin token and a console
// session (and its CSRF token), is answered by its handler: not with a miss
// (404 or 405). Misses are told apart: a made-up path, or a served path
// with another method, is one on every listener and in every subtree. The console's, the operator's and the
// admin API's own tests serve their routes through lists of their own
// (console/routes_test.go, console/oproutes_test.go, admin/routes_test.go):
// those are the lists routes.go declares.
func TestRoutes(t *testing.T) {
	const token = "routes-test-token"
	h := everyRouteHarness(t, token)
	m, cfg := h.main, h.main.Config
	con, err := newConsole(cfg, m.Relay, m.Share, m.Store, m.paymentsConsole(), nil)
	if err != nil {
		t.Fatal(err)
	}
	op, err := newOperator(cfg, m.Relay, m.Share, m.Store, m.paymentsAdmin(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var metricsHandler http.Handler
	if m.Metrics != nil {
		metricsHandler = m.Metrics.Handler()
	}
	// The routes Main serves, built again for their patterns.
	listeners := map[string]*server.Mux{
		"api":    apiRoutes(m.Server, con, m.Payments),
		"public": publicRoutes(m.Server, m.Payments),
		"admin":  adminListenerRoutes(m.Server, newAdminAPI(cfg, m.Store, m.paymentsAdmin(), nil), op, m.Payments, metricsHandler, cfg.AdminToken),
	}

	// A browser per listener, signed in to its console (so that a page
	// behind the session is asked, not the sign-in page), which sends the
	// admin token and, with a POST, the session's CSRF token.
	clients, csrf := map[string]*http.Client{}, map[string]string{}
	ask := func(listener, method, path string, form url.Values) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+m.Addr(listener)+path, strings.NewReader(form.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := clients[listener].Do(req)
		if err != nil {
			t.Fatalf("%s %s on %s: %v", method, path, listener, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	csrfOf := func(listener, path string) string {
		t.Helper()
		status, body := ask(listener, http.MethodGet, path, nil)
		f := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(body)
		if f == nil {
			t.Fatalf("GET %s on %s: %d, no CSRF token in\n%s", path, listener, status, body)
		}
		return f[1]
	}
	for name := range listeners {
		jar, _ := cookiejar.New(nil)
		clients[name] = &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	session := "routes-test-session"
	now := time.Now()
	if err := m.Store.CreateSession(t.Context(), tollgate.HashKey(session), tollgate.ConsoleSession{AccountID: h.acct.ID, Created: now, Expires: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	clients["api"].Jar.SetCookies(&url.URL{Scheme: "http", Host: m.Addr("api"), Path: "/console/"}, []*http.Cookie{{Name: "tg_console", Value: session, Path: "/console/"}})
	csrf["api"] = csrfOf("api", "/console/")
	if status, body := ask("admin", http.MethodPost, "/console/signin", url.Values{"csrf": {csrfOf("admin", "/console/signin")}, "token": {token}}); status != http.StatusSeeOther {
		t.Fatalf("the operator's sign-in: %d %s", status, body)
	}
	csrf["admin"] = csrfOf("admin", "/console/")
	miss := func(status int, body string) bool {
		return status == http.StatusMethodNotAllowed || status == http.StatusNotFound && routeMiss.MatchString(body)
	}

	for _, c := range []struct{ listener, method, path string }{
		{"api", "GET", "/no-such-path"},
		{"api", "DELETE", "/v1/models"},
		{"api", "GET", "/console/no-such-page"},
		{"api", "PUT", "/console/keys"},
		{"public", "GET", "/no-such-path"},
		{"admin", "GET", "/no-such-path"},
		{"admin", "POST", "/healthz"},
		{"admin", "GET", "/console/no-such-page"},
		{"admin", "POST", "/console/service"},
		{"admin", "GET", "/admin/v1/no-such-endpoint"},
		{"admin", "DELETE", "/admin/v1/accounts"},
	} {
		if status, body := ask(c.listener, c.method, c.path, nil); !miss(status, body) {
			t.Errorf("%s %s on %s, which nothing serves, is not told as a miss: %d %s", c.method, c.path, c.listener, status, body)
		}
	}

	wildcard := regexp.MustCompile(`\{[a-z]+\}`)
	for name, mux := range listeners {
		patterns := mux.Patterns()
		if len(patterns) == 0 {
			t.Errorf("%s: no routes declared", name)
		}
		// Signing out last, so that the pages after it see the session.
		signout := func(p string) int {
			if strings.Contains(p, "signout") {
				return 1
			}
			return 0
		}
		slices.SortStableFunc(patterns, func(a, b string) int { return signout(a) - signout(b) })
		for _, pattern := range patterns {
			method, path, ok := strings.Cut(pattern, " ")
			if !ok {
				method, path = http.MethodGet, pattern
			}
			target := wildcard.ReplaceAllString(strings.ReplaceAll(path, "{$}", ""), "x")
			if strings.HasPrefix(target, "/debug/pprof/") {
				target += "?seconds=1" // a CPU profile or a trace, not for the default 30 s
			}
			if strings.HasSuffix(path, "/") {
				// A subtree: a path under it is its own, a miss there its own.
				target = path + "no-such-page"
				if status, body := ask(name, method, target, nil); strings.Contains(body, "is not served on this listener") {
					t.Errorf("%s: subtree %s: %s %s is the listener's miss: %d %s", name, pattern, method, target, status, body)
				}
				continue
			}
			var form url.Values
			if method == http.MethodPost {
				form = url.Values{"csrf": {csrf[name]}}
			}
			if status, body := ask(name, method, target, form); miss(status, body) {
				t.Errorf("%s: route %s: %s %s is a miss: %d %s", name, pattern, method, target, status, body)
			}
		}
	}

	// The packages' tests' lists: each of their patterns is declared on the
	// listener, and each the listener declares under their prefix is in
	// their list.
	declared := regexp.MustCompile(`\.Handle\("([^"]+)"`)
	for _, c := range []struct{ file, listener, prefix string }{
		{"../../console/routes_test.go", "api", "/console/"},
		{"../../console/oproutes_test.go", "admin", "/console/"},
		{"../../admin/routes_test.go", "admin", "/admin/v1/"},
	} {
		src, err := os.ReadFile(c.file)
		if err != nil {
			t.Fatal(err)
		}
		var theirs []string
		for _, m := range declared.FindAllStringSubmatch(string(src), -1) {
			theirs = append(theirs, m[1])
		}
		ours := listeners[c.listener].Patterns()
		for _, p := range theirs {
			if !slices.Contains(ours, p) {
				t.Errorf("%s serves %q, which routes.go does not declare on the %s listener", c.file, p, c.listener)
			}
		}
		for _, p := range ours {
			_, path, ok := strings.Cut(p, " ")
			if !ok {
				path = p
			}
			if strings.HasPrefix(path, c.prefix) && !slices.Contains(theirs, p) {
				t.Errorf("routes.go declares %q on the %s listener, which %s does not serve", p, c.listener, c.file)
			}
		}
		if len(theirs) < 10 {
			t.Errorf("%s: %d routes found: %q", c.file, len(theirs), theirs)
		}
	}
}
