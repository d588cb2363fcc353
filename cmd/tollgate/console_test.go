package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/tollgate/tollgate"
)

// The console on the running service's api listener: the operator invites
// the holder (CLI and admin API), the holder sets a password, signs in,
// sees the balance, a request moves the spend, and a key made in the
// console works on the API until it is revoked there.
func TestConsoleOnTheAPIListener(t *testing.T) {
	h := newHarness(t, harnessOptions{models: flatModel, credit: tollgate.Dollars(1)})
	cfgPath := filepath.Join(h.main.Config.Dir, "tollgate.yaml")
	base := "http://" + h.main.Addr("api")

	out, err := cli(t, "accounts", "invite", h.acct.ID, "--config", cfgPath)
	link := regexp.MustCompile(`/console/invite\?token=inv-[0-9A-Za-z]{32}`).FindString(out)
	if err != nil || link == "" || !strings.Contains(out, "expires") {
		t.Fatalf("accounts invite: %q, %v", out, err)
	}
	if _, err := cli(t, "accounts", "invite", "acct_nope", "--config", cfgPath); err == nil || !strings.Contains(err.Error(), "account acct_nope not found") {
		t.Errorf("invite of a missing account: %v", err)
	}

	// The admin API issues them too.
	cfg := *h.main.Config
	cfg.AdminToken = "s3cret-admin-token"
	adm := httptest.NewServer(h.main.Server.AdminHandler(adminRoutes(&cfg, h.main.Store, nil, nil)))
	defer adm.Close()
	req, _ := http.NewRequest("POST", adm.URL+"/admin/v1/accounts/"+h.acct.ID+"/invite", nil)
	req.Header.Set("Authorization", "Bearer s3cret-admin-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var inv struct {
		AccountID string `json:"account_id"`
		Path      string `json:"path"`
	}
	err = json.NewDecoder(resp.Body).Decode(&inv)
	resp.Body.Close()
	if resp.StatusCode != 201 || err != nil || inv.AccountID != h.acct.ID || !strings.HasPrefix(inv.Path, "/console/invite?token=inv-") {
		t.Fatalf("admin invite: %d %+v %v", resp.StatusCode, inv, err)
	}
	req, _ = http.NewRequest("POST", adm.URL+"/admin/v1/accounts/"+h.acct.ID+"/invite", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 401 {
		t.Errorf("admin invite without the token: %v %v", resp.StatusCode, err)
	}

	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar}
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := browser.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	post := func(path string, form url.Values) (int, string) {
		t.Helper()
		resp, err := browser.PostForm(base+path, form)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	csrfOf := func(body string) string {
		m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("no csrf token in\n%s", body)
		}
		return m[1]
	}
	_, page := get(inv.Path)
	token := strings.TrimPrefix(inv.Path, "/console/invite?token=")
	pw := "a long enough password"
	if status, body := post("/console/invite", url.Values{"csrf": {csrfOf(page)}, "token": {token}, "password": {pw}, "confirm": {pw}}); status != 200 || !strings.Contains(body, "Your password is set") {
		t.Fatalf("set password: %d\n%s", status, body)
	}
	_, page = get("/console/signin")
	status, overview := post("/console/signin", url.Values{"csrf": {csrfOf(page)}, "account": {h.acct.ID}, "password": {pw}})
	if status != 200 || !strings.Contains(overview, `id="balance"><data class="amt" value="1.000000000000"`) || !strings.Contains(overview, `id="spend-today"><data class="amt" value="0.000000000000"`) {
		t.Fatalf("overview after sign-in: %d\n%s", status, overview)
	}
	if status, _, body := h.post("/v1/chat/completions", flatBody, nil); status != 200 {
		t.Fatalf("request: %d %s", status, body)
	}
	h.main.Biller.Wait()
	if _, overview = get("/console/"); strings.Contains(overview, `id="spend-today"><data class="amt" value="0.000000000000"`) || !strings.Contains(overview, "bill-flat") {
		t.Errorf("the spend did not move after a request:\n%s", overview)
	}

	_, keys := get("/console/keys")
	status, created := post("/console/keys", url.Values{"csrf": {csrfOf(keys)}, "name": {"from the console"}})
	secret := regexp.MustCompile(`sk-tg-[0-9A-Za-z]{32}`).FindString(created)
	if status != 201 || secret == "" {
		t.Fatalf("create key: %d\n%s", status, created)
	}
	if status, _, body := h.postKey(secret, flatBody, nil); status != 200 {
		t.Fatalf("request with the console's key: %d %s", status, body)
	}
	k, _, err := h.main.Store.KeyByHash(t.Context(), tollgate.HashKey(secret))
	if err != nil {
		t.Fatal(err)
	}
	if status, _ := post("/console/keys/"+k.ID+"/revoke", url.Values{"csrf": {csrfOf(keys)}}); status != 200 {
		t.Fatalf("revoke: %d", status)
	}
	if err := h.main.Auth.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	if status, _, body := h.postKey(secret, flatBody, nil); status != 401 || !strings.Contains(string(body), "api_key_revoked") {
		t.Errorf("request with the revoked key: %d %s, want 401 api_key_revoked", status, body)
	}
	// The protocol endpoints are untouched by the mount.
	if status, _, _ := h.post("/console", "", nil); status != 404 {
		t.Errorf("POST /console: %d, want 404", status)
	}
}
