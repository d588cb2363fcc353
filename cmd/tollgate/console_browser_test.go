package main

import (
	"bytes"
	"context"
	"image"
	"image/color"
	"image/png"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tollgate/tollgate"
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
// DevTools protocol): sign in through an invitation, create a key, use the
// playground and watch the answer stream in and the spend move, revoke the
// key, and the revoked key gets 401 from the API. It runs when
// TOLLGATE_TEST_BROWSER is set; then a missing Chromium fails it. With
// TOLLGATE_SCREENSHOTS=update it writes the screenshots in docs/console/.
func TestConsoleInBrowser(t *testing.T) {
	if os.Getenv("TOLLGATE_TEST_BROWSER") == "" {
		t.Skip("TOLLGATE_TEST_BROWSER is not set")
	}
	browserPath := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			browserPath = p
			break
		}
	}
	if browserPath == "" {
		t.Fatal("TOLLGATE_TEST_BROWSER is set but no Chromium is installed (apt-get install -y chromium)")
	}
	shots := t.TempDir()
	if os.Getenv("TOLLGATE_SCREENSHOTS") == "update" {
		shots = filepath.Join("..", "..", "docs", "console")
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

	alloc, cancel := chromedp.NewExecAllocator(t.Context(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browserPath), chromedp.NoSandbox, chromedp.WindowSize(1280, 900))...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(alloc)
	defer cancel()
	ctx, cancel = context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	shot := func(name string) chromedp.Action[chromedp.Void] {
		return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
			png, err := chromedp.FullScreenshot(100)(ctx, tg)
			if err != nil {
				return chromedp.Void{}, err
			}
			return chromedp.Void{}, os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("read %s: %v", sel, err)
		}
		return s
	}
	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }

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
	if !strings.HasPrefix(text("#balance"), "4.9999") || spentBefore == "0.00 USD" {
		t.Fatalf("overview: balance %q, spent today %q", text("#balance"), spentBefore)
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
			if !regexp.MustCompile(`25 completion tokens · cost 0\.0000750001\d* USD`).MatchString(usage) {
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
	if n := keyRequests(t, h, k.ID); n != 2 {
		t.Errorf("the created key was charged for %d requests, want 2 (one from Go, one from the playground)", n)
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

	run("revoke the key",
		chromedp.Navigate(base+"/console/keys"),
		chromedp.WaitVisible(css(`#key-`+k.ID+` button.danger`)),
		chromedp.Click(css(`#key-`+k.ID+` button.danger`)),
		chromedp.WaitVisible(css(`#key-`+k.ID+` .status-revoked`)),
	)
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
		chromedp.Navigate(admin+"/console/service"),
		chromedp.WaitVisible(css(`#audit-result`)),
		chromedp.Click(css(`form[action="/console/service/audit"] button`)),
		chromedp.WaitVisible(css(`#audit-result.status-active`)),
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
