package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/syncbuf"
)

// `tollgate demo` as the README's first command: it prints the exports, the
// web-search curl line works (an answer with citations), and the admin
// listener it prints serves /metrics and the operator console, which the
// printed admin token signs in to.
func TestDemoServesWebSearchAndMetrics(t *testing.T) {
	text := startDemo(t)
	base := regexp.MustCompile(`export OPENAI_BASE_URL=(\S+)`).FindStringSubmatch(text)
	key := regexp.MustCompile(`export OPENAI_API_KEY=(\S+)`).FindStringSubmatch(text)
	metrics := regexp.MustCompile(`(http://\S+/metrics)`).FindStringSubmatch(text)
	curl := regexp.MustCompile(`-d '(\{"model":"tg-chat","web_search_options".*\})'`).FindStringSubmatch(text)
	if base == nil || key == nil || metrics == nil || curl == nil {
		t.Fatalf("the demo's instructions are incomplete:\n%s", text)
	}
	req, _ := http.NewRequest(http.MethodPost, base[1]+"/chat/completions", strings.NewReader(curl[1]))
	req.Header.Set("Authorization", "Bearer "+key[1])
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var r struct {
		Choices []struct {
			Message struct {
				Content     string            `json:"content"`
				Annotations []json.RawMessage `json:"annotations"`
			} `json:"message"`
		} `json:"choices"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(body, &r) != nil || len(r.Choices) == 0 || len(r.Choices[0].Message.Annotations) == 0 {
		t.Fatalf("the README's web-search line: %d %s", resp.StatusCode, body)
	}
	mresp, err := http.Get(metrics[1])
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	if !strings.Contains(string(mb), `tollgate_web_searches_total{class="network",model="tg-chat"} 1`) {
		t.Fatalf("the demo's /metrics does not show the search: %.2000s", mb)
	}

	opConsole := regexp.MustCompile(`operator console .* is at (http://\S+/console/)\n\s+sign in with the admin token (\S+)`).FindStringSubmatch(text)
	if opConsole == nil {
		t.Fatalf("the demo does not say how to open the operator console:\n%s", text)
	}
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	form, err := browser.Get(opConsole[1] + "signin")
	if err != nil {
		t.Fatal(err)
	}
	fb, _ := io.ReadAll(form.Body)
	form.Body.Close()
	csrf := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindSubmatch(fb)
	if form.StatusCode != 200 || csrf == nil {
		t.Fatalf("operator sign-in form: %d %.500s", form.StatusCode, fb)
	}
	signin, err := browser.PostForm(opConsole[1]+"signin", url.Values{"csrf": {string(csrf[1])}, "token": {opConsole[2]}})
	if err != nil {
		t.Fatal(err)
	}
	signin.Body.Close()
	if signin.StatusCode != http.StatusSeeOther || signin.Header.Get("Location") != "/console/" {
		t.Fatalf("operator sign-in with the printed token: %d %s", signin.StatusCode, signin.Header.Get("Location"))
	}
	accounts, err := browser.Get(opConsole[1])
	if err != nil {
		t.Fatal(err)
	}
	ab, _ := io.ReadAll(accounts.Body)
	accounts.Body.Close()
	if accounts.StatusCode != 200 || !strings.Contains(string(ab), "acct_") {
		t.Fatalf("the operator console's accounts after sign-in: %d %.1000s", accounts.StatusCode, ab)
	}
}

// A second demo on the directory of a running one says so and exits; once
// the first has stopped, the lock file it leaves (as a killed one would)
// blocks nothing.
func TestSecondDemoOnOneDirExits(t *testing.T) {
	dir := t.TempDir()
	start := func() (stop func() int, out *syncbuf.Buffer) {
		ctx, cancel := context.WithCancel(context.Background())
		out = &syncbuf.Buffer{}
		var errOut syncbuf.Buffer
		done := make(chan int, 1)
		go func() { done <- run(ctx, []string{"demo", "--dir", dir, "--listen", "127.0.0.1:0"}, out, &errOut) }()
		deadline := time.Now().Add(15 * time.Second)
		for !strings.Contains(out.String(), "Ctrl-C stops it.") {
			select {
			case code := <-done:
				cancel()
				t.Fatalf("demo exited %d: %s", code, errOut.String())
			default:
			}
			if time.Now().After(deadline) {
				cancel()
				t.Fatalf("demo did not start: %s", errOut.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
		return func() int { cancel(); return <-done }, out
	}
	stop, _ := start()
	var out, errOut syncbuf.Buffer
	code := run(t.Context(), []string{"demo", "--dir", dir, "--listen", "127.0.0.1:0"}, &out, &errOut)
	if code != 1 || !strings.Contains(errOut.String(), "is already running on "+dir) || strings.Contains(out.String(), "is running") {
		t.Errorf("second demo: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	if code := stop(); code != 0 {
		t.Fatalf("first demo exited %d", code)
	}
	// The file stays, with a pid that is no longer running: not a lock.
	if err := os.WriteFile(filepath.Join(dir, "demo.lock"), []byte("999999999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stop, _ = start()
	if code := stop(); code != 0 {
		t.Fatalf("demo after a stale lock file exited %d", code)
	}
}

// Every simulated server of the demo takes prompts as long as the catalogue
// says each model it serves can take (context_length in /v1/models): a
// prompt the catalogue admits is not refused by its node.
func TestDemoNodesTakeTheCatalogueContext(t *testing.T) {
	t.Setenv("TOLLGATE_DEMO_ADMIN_TOKEN", "demo-test-token-0123456789abcdef")
	text := demoConfig
	sims := map[string]int{} // a simulator's URL in the config: its context window
	for _, s := range demoSimulators {
		url := "http://" + s.name + ".sim.invalid"
		text = strings.ReplaceAll(text, "{{"+s.name+"}}", url)
		sims[url] = s.cfg.ContextLength
		if sims[url] == 0 {
			sims[url] = 8192 // the simulator's default (simulate.Config)
		}
	}
	text = strings.NewReplacer("{{api}}", "127.0.0.1:0", "{{admin}}", "127.0.0.1:0", "{{searxng}}", "http://searxng.sim.invalid").Replace(text)
	path := filepath.Join(t.TempDir(), "tollgate.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, m := range cfg.Models {
		for _, b := range m.Backends {
			urls := []string{b.URL}
			if b.Class == tollgate.ClassNetwork {
				urls = urls[:0]
				for _, n := range b.Nodes {
					urls = append(urls, n.URL)
				}
			}
			for _, u := range urls {
				var ctxLen int
				for prefix, n := range sims {
					if strings.HasPrefix(u, prefix+"/") {
						ctxLen = n
					}
				}
				if ctxLen == 0 {
					t.Errorf("model %s: no demo simulator at %s", m.ID, u)
					continue
				}
				checked++
				if int64(ctxLen) < m.ContextLength {
					t.Errorf("model %s lists context_length %d, but its %s server refuses prompts over %d tokens", m.ID, m.ContextLength, u, ctxLen)
				}
			}
		}
	}
	if checked < 8 {
		t.Errorf("checked %d servers of the demo catalogue, want every one (8)", checked)
	}
}

// startDemo runs `tollgate demo` in a temporary directory on a free port
// until the test ends (checking that it then exits cleanly) and returns
// what it printed once it serves.
func startDemo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut syncbuf.Buffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"demo", "--dir", dir, "--listen", "127.0.0.1:0"}, &out, &errOut) }()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("demo exited %d: %s", code, errOut.String())
			}
		case <-time.After(20 * time.Second):
			t.Error("demo did not stop")
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(out.String(), "Ctrl-C stops it.") {
		if time.Now().After(deadline) {
			t.Fatalf("demo did not start: %s %s", out.String(), errOut.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return out.String()
}
