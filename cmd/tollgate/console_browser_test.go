package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/console"
	"github.com/tollgate/tollgate/internal/browsertest"
)

// visionModel takes images and tools, for the playground's image and tool.
const visionModel = `
  - id: bill-vision
    kind: chat
    context_length: 32768
    max_output_tokens: 4096
    backends:
      - class: network
        upstream_model: up-vllm
        capabilities: [tools, image_input]
        rates: {input: "0.5", output: "3.000007"}
        nodes:
          - {name: node-vision, url: "{{flav-vllm}}/v1", flavour: vllm}
`

// tinyPNG is a small gradient to attach in the playground.
func tinyPNG(t *testing.T) []byte {
	t.Helper()
	m := image.NewRGBA(image.Rect(0, 0, 96, 64))
	for x := range 96 {
		for y := range 64 {
			m.Set(x, y, color.RGBA{R: uint8(x * 2), G: uint8(y * 3), B: 180, A: 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, m); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// The console in a real browser (headless Chromium, driven over the
// DevTools protocol): a login CSRF from a page on another port is refused;
// sign in through an invitation, which then says it was used; amounts show
// 6 decimals with the exact one in their title, and neither money nor names
// wrap at 1280px; create a key; use the playground, watch the answer stream
// in, and see a model's HTML and script shown as text; the activity fits
// 1280px and its CSV link keeps the key filter (key names beside ids);
// revoke the key behind a confirmation with script off, and the revoked key
// gets 401 from the API; one column of cards on a phone; /favicon.ico on
// both listeners; the operator credits (the account page lists the entry,
// its note and who made it), disables behind a confirmation, and runs the
// audit (held money explained beside it). It runs when TOLLGATE_TEST_BROWSER
// is set; then a missing Chromium fails it. TOLLGATE_SCREENSHOTS=update
// rewrites the screenshots in docs/console/; TOLLGATE_SCREENSHOTS=DIR
// writes every screenshot, the checks' views too, to DIR.
func TestConsoleInBrowser(t *testing.T) {
	browserPath := browsertest.Path(t)
	// The documentation's screenshots go to docs/console/ with
	// TOLLGATE_SCREENSHOTS=update; the others (the checks' views at 1280px
	// and on a phone) to the directory TOLLGATE_SCREENSHOTS names, if any.
	shots, looks := t.TempDir(), t.TempDir()
	switch dir := os.Getenv("TOLLGATE_SCREENSHOTS"); {
	case dir == "update":
		shots = filepath.Join("..", "..", "docs", "console")
	case dir != "":
		shots, looks = dir, dir
	}

	t.Setenv("TOLLGATE_TEST_ADMIN_TOKEN", "browser-admin-token")
	h := newHarness(t, harnessOptions{models: flatModel + visionModel, credit: tollgate.Dollars(5), listen: "  admin: 127.0.0.1:0\n",
		extraYAML: "admin_token_env: TOLLGATE_TEST_ADMIN_TOKEN\n"})
	base := "http://" + h.main.Addr("api")
	token, _, err := tollgate.IssueInvite(t.Context(), h.main.Store, h.acct.ID, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	// A charge before the first look, so the chart has a bar.
	if status, _, body := h.post("/v1/chat/completions", flatBody, nil); status != 200 {
		t.Fatalf("request: %d %s", status, body)
	}
	h.main.Biller.Wait()

	ctx := browsertest.Context(t, browserPath, chromedp.WindowSize(1280, 900))
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// shot writes a documentation screenshot, look one of the checks'.
	screenshot := func(dir, name string) chromedp.Action[chromedp.Void] {
		return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
			png, err := chromedp.FullScreenshot(100)(ctx, tg)
			if err != nil {
				return chromedp.Void{}, err
			}
			return chromedp.Void{}, os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644)
		}
	}
	shot := func(name string) chromedp.Action[chromedp.Void] { return screenshot(shots, name) }
	look := func(name string) chromedp.Action[chromedp.Void] { return screenshot(looks, name) }
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("read %s: %v", sel, err)
		}
		return s
	}
	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }
	eval := func(js string) bool {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[bool](js))
		if err != nil {
			t.Fatalf("evaluate %s: %v", js, err)
		}
		return v
	}
	// lines(el) is how many lines an element's text takes.
	const lines = `const lines = (el) => { const r = document.createRange(); r.selectNodeContents(el); const tops = new Set();
		for (const x of r.getClientRects()) if (x.width > 0) tops.add(Math.round(x.top)); return tops.size; };`
	// oneLine checks that every element sel matches (at least one) keeps its
	// text on one line: money and names do not wrap mid-word.
	oneLine := func(where, sel string) {
		t.Helper()
		bad, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`(() => {`+lines+`const els = [...document.querySelectorAll(`+strconv.Quote(sel)+`)];
			return els.length === 0 ? ["nothing matches"] : els.filter((e) => lines(e) !== 1).map((e) => e.textContent + " (" + lines(e) + " lines)"); })()`))
		if err != nil {
			t.Fatal(err)
		}
		if len(bad) > 0 {
			t.Errorf("%s: %s wraps: %q", where, sel, bad)
		}
	}

	// Login CSRF, the attack itself: a page on another port of this host
	// fetches a genuine pre-session from the console, plants its cookie
	// (cookies ignore the port) and posts the sign-in form with the
	// attacker's account. The victim's browser must not end up signed in.
	cs := h.main.Store.(tollgate.ConsoleStore)
	mallory := tollgate.Account{ID: tollgate.NewID("acct_"), Name: "mallory", Created: time.Now().UTC()}
	if err := h.main.Store.CreateAccount(t.Context(), mallory); err != nil {
		t.Fatal(err)
	}
	malloryPW := "mallory's own password"
	setPassword(t, cs, mallory.ID, malloryPW)
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, err := http.Get(base + "/console/signin")
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		token := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindSubmatch(page)
		for _, ck := range resp.Cookies() {
			if ck.Name == "tg_form" {
				http.SetCookie(w, &http.Cookie{Name: ck.Name, Value: ck.Value, Path: "/console/", SameSite: http.SameSiteStrictMode})
			}
		}
		if token == nil {
			http.Error(w, "no token", 500)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><form id="f" method="post" action="%s/console/signin">
<input name="csrf" value="%s"><input name="account" value="%s"><input name="password" value="%s"></form>
<script>document.getElementById("f").submit()</script>`, base, token[1], mallory.ID, malloryPW)
	}))
	defer evil.Close()
	if evil.Listener.Addr().String() == h.main.Addr("api") {
		t.Fatal("the attacker's page must be on another port")
	}
	run("login CSRF from another origin",
		chromedp.Navigate(evil.URL),
		chromedp.WaitVisible(css(`.alert.error[data-param=csrf]`)),
	)
	if msg := text(".alert.error"); !strings.Contains(msg, "another site") {
		t.Errorf("the cross-origin sign-in answered %q, want it refused as coming from another site", msg)
	}
	run("after the attack", chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(css(`input[name=account]`)))
	if eval(`document.getElementById("balance") !== null`) {
		t.Fatal("the attacker's page signed the browser in to the attacker's account")
	}

	pw := "a password for the browser"
	run("set the password",
		chromedp.Navigate(base+tollgate.InvitePath(token)),
		chromedp.WaitVisible(css(`input[name=password]`)),
		shot("invite"),
		chromedp.SendKeys(css(`input[name=password]`), pw),
		chromedp.SendKeys(css(`input[name=confirm]`), pw),
		chromedp.Click(css(`button[type=submit]`)),
		chromedp.WaitVisible(css(`input[name=account]`)),
		shot("signin"),
		chromedp.SendKeys(css(`input[name=password]`), pw),
		chromedp.Click(css(`main button[type=submit]`)),
		chromedp.WaitVisible(css(`#balance`)),
		shot("overview"),
	)
	spentBefore := text("#spend-today")
	if !strings.HasPrefix(text("#balance"), "4.9999") || spentBefore == "0.000000 USD" {
		t.Fatalf("overview: balance %q, spent today %q", text("#balance"), spentBefore)
	}
	// One rule for money: 6 decimals shown, the exact amount in the title
	// and the value, here the store's balance to the picodollar.
	exact := func(sel string) (shown, value, title string) {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`(() => { const d = document.querySelector(`+strconv.Quote(sel+" data.amt")+`); return [d.textContent, d.value, d.title]; })()`))
		if err != nil || len(v) != 3 {
			t.Fatalf("the amount in %s: %v %v", sel, v, err)
		}
		return v[0], v[1], v[2]
	}
	bal, err := h.main.Store.(interface {
		Balance(context.Context, string) (tollgate.Balance, error)
	}).Balance(t.Context(), h.acct.ID)
	if err != nil {
		t.Fatal(err)
	}
	shown, value, title := exact("#balance")
	if got, err := tollgate.ParseAmount(value); err != nil || got != bal.Balance || !regexp.MustCompile(`^\d+\.\d{12}$`).MatchString(value) ||
		!regexp.MustCompile(`^\d+\.\d{6}$`).MatchString(shown) || title != value+" USD exactly" {
		t.Errorf("the balance shows %q, value %q, title %q; want 6 decimals and the exact %s", shown, value, title, bal.Balance)
	}
	oneLine("overview at 1280px", ".card .value")
	oneLine("overview at 1280px", "data.amt")
	// The invitation, used, says so and shows no form.
	run("the used invitation", chromedp.Navigate(base+tollgate.InvitePath(token)), chromedp.WaitVisible(css(`#invite-gone[data-gone=used]`)),
		look("invite-used"))
	if eval(`document.querySelectorAll("input[type=password], form.stack").length > 0`) {
		t.Error("the used invitation still shows the password form")
	}

	run("create a key",
		chromedp.Navigate(base+"/console/keys"),
		chromedp.WaitVisible(css(`input[name=name]`)),
		chromedp.SendKeys(css(`input[name=name]`), "browser key"),
		chromedp.SendKeys(css(`input[name=spend_limit]`), "1"),
		chromedp.Click(css(`form.grid button[type=submit]`)),
		chromedp.WaitVisible(css(`#new-secret`)),
		chromedp.WaitVisible(css(`button[data-copy]`)), // the script shows the copy button
		shot("keys"),
	)
	secret := text("#new-secret")
	if !tollgate.LooksLikeKey(secret) {
		t.Fatalf("created key secret %q", secret)
	}
	if w, err := chromedp.Run(ctx, chromedp.Evaluate[string](`getComputedStyle(document.querySelector("input[name=name]")).fontWeight`)); err != nil || w != "400" {
		t.Errorf("the input text's weight is %q (%v), want 400", w, err)
	}
	oneLine("keys at 1280px", "#key-"+keyIDOf(t, h, secret)+" td.nowrap")
	if eval(`[...document.querySelectorAll(".table-wrap")].some((w) => w.scrollWidth > w.clientWidth + 1)`) {
		t.Error("the keys table is wider than the page at 1280px")
	}
	if status, _, body := h.postKey(secret, flatBody, nil); status != 200 {
		t.Fatalf("request with the browser's key: %d %s", status, body)
	}

	// The playground, with the key just created pasted in: the answer
	// arrives token by token (the simulator waits 40 ms between them), then
	// the usage and the cost.
	run("playground",
		chromedp.Navigate(base+"/console/playground"),
		chromedp.WaitVisible(css(`#pg-message`)),
		chromedp.SendKeys(css(`#pg-key`), secret),
		chromedp.SetValue(css(`#pg-model`), "bill-flat"),
		chromedp.SetValue(css(`#pg-message`), "Tell me about toll roads. [sim tokens=25 gap=40ms]"),
		chromedp.Click(css(`#pg-send`)),
	)
	seen := map[int]bool{}
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.getElementById("pg-answer").textContent.length`))
		if err != nil {
			t.Fatal(err)
		}
		usage := text("#pg-usage")
		if n > 0 {
			seen[n] = true
		}
		if strings.Contains(usage, "Error") {
			t.Fatalf("playground: %s", usage)
		}
		if strings.Contains(usage, "cost") {
			if !regexp.MustCompile(`25 completion tokens · cost 0\.000075 USD \(exactly 0\.000075000175\)`).MatchString(usage) {
				t.Errorf("playground usage %q, want 25 completion tokens and their cost", usage)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the playground's answer did not finish (usage %q)", usage)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(seen) < 3 {
		t.Errorf("the answer did not stream: lengths seen %v", seen)
	}
	run("playground screenshot", shot("playground"))

	// A model's output is shown as text: a simulated model that echoes its
	// input answers with HTML, script and markdown, and none of it runs or
	// becomes markup.
	payload := `<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script> **bold** [link](javascript:window.__pwned=3) <b>b</b>`
	run("playground echo",
		chromedp.SetValue(css(`#pg-message`), payload+" [sim echo=1]"),
		chromedp.Click(css(`#pg-send`)),
		chromedp.Poll[chromedp.Void](`/cost|Error/.test(document.getElementById("pg-usage").textContent)`, chromedp.WithPollingTimeout(20*time.Second)),
		look("playground-echo"),
	)
	if got := text("#pg-answer"); got != payload {
		t.Errorf("the echoed answer reads %q, want the payload as text %q", got, payload)
	}
	if eval(`document.getElementById("pg-answer").children.length > 0 || window.__pwned !== undefined || document.querySelector("main img[src=x], main b") !== null`) {
		t.Error("the model's output became markup or ran script")
	}

	// A model with tools and image input: the page shows the image field and
	// the demo tool for it (and not the image field for bill-flat), sends an
	// image as a data: URL, answers the model's get_time call itself and
	// streams the reply to the tool's answer.
	visible := func(id string) bool {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`!document.getElementById("`+id+`").hidden`))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if visible("pg-image-field") || !visible("pg-tools-field") {
		t.Errorf("bill-flat (tools, no images): image field shown %v, tool shown %v", visible("pg-image-field"), visible("pg-tools-field"))
	}
	img := filepath.Join(t.TempDir(), "dot.png")
	if err := os.WriteFile(img, tinyPNG(t), 0o644); err != nil {
		t.Fatal(err)
	}
	// The created key served the playground's request (the key's request
	// from Go above and this one).
	h.main.Biller.Wait()
	k, _, err := h.main.Store.KeyByHash(t.Context(), tollgate.HashKey(secret))
	if err != nil {
		t.Fatal(err)
	}
	if n := keyRequests(t, h, k.ID); n != 3 {
		t.Errorf("the created key was charged for %d requests, want 3 (one from Go, two from the playground)", n)
	}
	// The next requests use the key made for the sign-in.
	run("playground with an image and a tool",
		chromedp.Evaluate[chromedp.Void](`document.getElementById("pg-key").value = ""`),
		chromedp.SetValue(css(`#pg-model`), "bill-vision"),
		chromedp.Evaluate[chromedp.Void](`document.getElementById("pg-model").dispatchEvent(new Event("change"))`),
		chromedp.WaitVisible(css(`#pg-image`)),
		chromedp.SetUploadFiles(css(`#pg-image`), []string{img}),
		chromedp.WaitVisible(css(`#pg-image-preview`)),
		chromedp.Click(css(`#pg-tools`)),
		chromedp.SetValue(css(`#pg-message`), "What time is it, and what is in this picture? [sim tokens=12 gap=20ms]"),
		chromedp.Click(css(`#pg-send`)),
		chromedp.Poll[chromedp.Void](`/Request 2:.*cost|Error/.test(document.getElementById("pg-usage").textContent)`,
			chromedp.WithPollingTimeout(20*time.Second)),
		shot("playground-tools"),
	)
	usage := text("#pg-usage")
	steps := text("#pg-steps")
	if !strings.Contains(steps, "The model called get_time with") || !strings.Contains(steps, `This page answered {"utc":"`) {
		t.Errorf("the tool call and the page's answer are not shown: %q", steps)
	}
	if m := regexp.MustCompile(`^Request 1: (\d+) prompt \+ \d+ completion tokens · cost [0-9.]+ USD.* — Request 2: \d+ prompt \+ 12 completion tokens · cost [0-9.]+ USD`).FindStringSubmatch(usage); m == nil {
		t.Errorf("playground usage with a tool call %q, want two requests, the second with 12 completion tokens", usage)
	} else if n, _ := strconv.Atoi(m[1]); n < 85 {
		t.Errorf("the first request's prompt is %d tokens: the image (85 tokens and more) was not sent", n)
	}
	if a := text("#pg-answer"); len(a) == 0 {
		t.Error("no reply after the tool's answer")
	}
	h.main.Biller.Wait()

	run("overview after", chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(css(`#spend-today`)))
	if after := text("#spend-today"); after == spentBefore {
		t.Errorf("spent today did not move after the playground and the key's request: %q", after)
	}

	run("activity", chromedp.Navigate(base+"/console/activity"), chromedp.WaitVisible(css(`table`)), shot("activity"))
	if rows := text("tbody"); strings.Count(rows, "bill-flat") < 3 {
		t.Errorf("activity lists %d requests, want 3:\n%s", strings.Count(rows, "bill-flat"), rows)
	}
	// At 1280px the whole row shows (no sideways scroll), the request id
	// whole, and names on one line.
	if eval(`[...document.querySelectorAll(".table-wrap")].some((w) => w.scrollWidth > w.clientWidth + 1)`) {
		t.Error("the activity table is wider than the page at 1280px: the request ids are cut off")
	}
	oneLine("activity at 1280px", "td.request-id")
	oneLine("activity at 1280px", "td.nowrap")
	// Filtered by the key, the CSV link the page renders downloads that
	// key's charges only, with its name beside its id.
	run("activity filtered by key", chromedp.SetValue(css(`select[name=key]`), k.ID), chromedp.Click(css(`form.grid button[type=submit]`)))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		// The form's answer replaces the page: wait for it to be there.
		done, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`location.search.includes("key=") && document.readyState === "complete" && !!document.querySelector("a[download]")`))
		if err == nil && done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the filtered activity did not load: %v", err)
		}
	}
	csvText, err := chromedp.Run(ctx, chromedp.Evaluate[string](`fetch(document.querySelector("a[download]").href).then((r) => r.text())`,
		chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(strings.NewReader(csvText)).ReadAll()
	if err != nil || len(recs) < 2 || strings.Join(recs[0][:4], ",") != "period,key,key_name,model" {
		t.Fatalf("the filtered CSV: %v\n%s", err, csvText)
	}
	var csvRequests int
	for _, rec := range recs[1:] {
		if rec[1] != k.ID || rec[2] != "browser key" {
			t.Errorf("the CSV of key %s holds a row of %s (%s)", k.ID, rec[1], rec[2])
		}
		n, _ := strconv.Atoi(rec[5])
		csvRequests += n
	}
	if csvRequests != 3 {
		t.Errorf("the filtered CSV counts %d requests, want the key's 3", csvRequests)
	}

	// Revoking asks first, and works with the page's script off.
	scriptOff := func(off bool) {
		t.Helper()
		if _, err := chromedp.Call(ctx, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: off}); err != nil {
			t.Fatal(err)
		}
	}
	scriptOff(true)
	run("revoke the key: the first click asks",
		chromedp.Navigate(base+"/console/keys"),
		chromedp.WaitVisible(css(`#key-`+k.ID+` summary`)),
		chromedp.Click(css(`#key-`+k.ID+` summary`)),
		chromedp.WaitVisible(css(`#key-`+k.ID+` .confirm-box button`)),
		look("keys-revoke-confirm"),
	)
	if st := text(`#key-` + k.ID + ` td:nth-child(3)`); !strings.HasPrefix(st, "active") {
		t.Errorf("the key is %q after the first click, want still active", st)
	}
	run("revoke the key: confirmed",
		chromedp.Click(css(`#key-`+k.ID+` .confirm-box button`)),
		chromedp.WaitVisible(css(`#key-`+k.ID+` .status-revoked`)),
	)
	scriptOff(false)
	if err := h.main.Auth.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	if status, _, body := h.postKey(secret, flatBody, nil); status != http.StatusUnauthorized || !strings.Contains(string(body), "api_key_revoked") {
		t.Errorf("the revoked key: %d %s, want 401 api_key_revoked", status, body)
	}
	// And in the playground, which shows the API's error.
	run("the revoked key in the playground",
		chromedp.Navigate(base+"/console/playground"),
		chromedp.WaitVisible(css(`#pg-message`)),
		chromedp.SendKeys(css(`#pg-key`), secret),
		chromedp.SetValue(css(`#pg-model`), "bill-flat"),
		chromedp.Click(css(`#pg-send`)),
		chromedp.Poll[chromedp.Void](`/Error/.test(document.getElementById("pg-usage").textContent)`,
			chromedp.WithPollingTimeout(20*time.Second)),
	)
	if u := text("#pg-usage"); !strings.Contains(u, "(api_key_revoked)") {
		t.Errorf("the playground with the revoked key shows %q, want the API's api_key_revoked error", u)
	}

	// On a phone.
	run("phone",
		chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(3), chromedp.EmulateMobile),
		chromedp.Navigate(base+"/console/"),
		chromedp.WaitVisible(css(`#balance`)),
		shot("overview-phone"),
	)
	overflow, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.documentElement.scrollWidth > window.innerWidth + 1`))
	if err != nil || overflow {
		t.Error("the overview is wider than a phone's screen")
	}
	// One column of cards, as docs/console.md says.
	if eval(`new Set([...document.querySelectorAll(".card")].map((c) => Math.round(c.getBoundingClientRect().left))).size !== 1`) {
		t.Error("on a phone the overview's cards are not in one column")
	}
	oneLine("overview on a phone", "data.amt")
	for _, p := range []string{"keys", "activity", "playground"} {
		run("phone "+p, chromedp.Navigate(base+"/console/"+p), chromedp.WaitVisible(css(`h1`)), look(p+"-phone"))
		if eval(`document.documentElement.scrollWidth > window.innerWidth + 1`) {
			t.Errorf("the %s page is wider than a phone's screen (its tables scroll inside their frame)", p)
		}
	}
	// The icon, on both listeners.
	for _, u := range []string{base, "http://" + h.main.Addr("admin")} {
		resp, err := http.Get(u + "/favicon.ico")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "image/x-icon" || !bytes.HasPrefix(b, []byte{0, 0, 1, 0}) {
			t.Errorf("%s/favicon.ico: %d %q", u, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
	}

	// The operator's console on the admin listener.
	admin := "http://" + h.main.Addr("admin")
	run("operator",
		chromedp.EmulateViewport(1280, 900),
		chromedp.Navigate(admin+"/console/"),
		chromedp.WaitVisible(css(`input[name=token]`)),
		shot("operator-signin"),
		chromedp.SendKeys(css(`input[name=token]`), "browser-admin-token"),
		chromedp.Click(css(`main button[type=submit]`)),
		chromedp.WaitVisible(css(`input[name=q]`)),
		shot("operator-accounts"),
		chromedp.Click(css(`a[href="/console/accounts/`+h.acct.ID+`"]`)),
		chromedp.WaitVisible(css(`input[name=amount]`)),
		chromedp.SendKeys(css(`input[name=amount]`), "2.5"),
		chromedp.SendKeys(css(`input[name=note]`), "top-up from the browser"),
		chromedp.Click(css(`form.grid button[type=submit]`)),
		chromedp.WaitVisible(css(`.alert.notice`)),
		shot("operator-account"),
	)
	// The account page lists the credit with its note and who made it.
	if row := text(`tr.entry-credit`); !strings.Contains(row, "2.500000") || !strings.Contains(row, "top-up from the browser") ||
		!strings.Contains(row, "the operator console from 127.0.0.1") {
		t.Errorf("the account page's credit reads %q, want the amount, the note and who made it", row)
	}
	oneLine("the operator's account at 1280px", ".card .value")
	// Disabling asks first, with the page's script off too; enabling again
	// does not ask.
	scriptOff(true)
	run("disable, asked",
		chromedp.Click(css(`details.confirm summary`)),
		chromedp.WaitVisible(css(`.confirm-box button`)),
		look("operator-disable-confirm"),
		chromedp.Click(css(`.confirm-box button`)),
		chromedp.WaitVisible(css(`form[action$="/enable"] button`)),
		chromedp.Click(css(`form[action$="/enable"] button`)),
		chromedp.WaitVisible(css(`details.confirm summary`)),
	)
	scriptOff(false)
	run("service",
		chromedp.Navigate(admin+"/console/service"),
		chromedp.WaitVisible(css(`#audit-result`)),
		chromedp.Click(css(`form[action="/console/service/audit"] button`)),
		chromedp.WaitVisible(css(`#audit-result.status-active`)),
		chromedp.WaitVisible(css(`#audit-result + #held-note`)),
		shot("operator-service"),
	)
	if b, _ := h.main.Store.Balance(t.Context(), h.acct.ID); b.Balance <= tollgate.MustParseAmount("7.49") || b.Balance >= tollgate.MustParseAmount("7.5") {
		t.Errorf("balance after the operator's credit of 2.5: %s", b.Balance)
	}

	run("sign out", chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(css(`#balance`)), chromedp.Click(css(`header form button`)),
		chromedp.WaitVisible(css(`input[name=account]`)))
}

// keyRequests is how many requests the key was charged for.
func keyRequests(t *testing.T, h *harness, keyID string) int64 {
	t.Helper()
	usage, err := h.main.Store.KeyUsage(t.Context(), h.acct.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range usage {
		if u.KeyID == keyID {
			return u.Requests
		}
	}
	return 0
}

// setPassword sets acct's console password through an invitation, as the
// holder's first visit would.
func setPassword(t *testing.T, cs tollgate.ConsoleStore, acct, pw string) {
	t.Helper()
	token, _, err := tollgate.IssueInvite(t.Context(), cs, acct, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	hash, err := console.HashPassword(pw, console.DefaultPasswordParams)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.AcceptInvite(t.Context(), tollgate.HashKey(token), hash, time.Now()); err != nil {
		t.Fatal(err)
	}
}

// keyIDOf is the id of the key with secret.
func keyIDOf(t *testing.T, h *harness, secret string) string {
	t.Helper()
	k, _, err := h.main.Store.KeyByHash(t.Context(), tollgate.HashKey(secret))
	if err != nil {
		t.Fatal(err)
	}
	return k.ID
}
