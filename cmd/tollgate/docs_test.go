package main

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/syncbuf"
	"github.com/tollgate/tollgate/server"
)

// The docs (README.md and docs/*.md) name HTTP paths, CLI commands and
// flags, config keys and error codes; each must exist in the product, so
// that a rename or a typo in a doc fails here instead of misleading a
// reader. What a doc names that is not tollgate's (other programs' flags,
// the endpoints tollgate does not serve) is in the allow-lists below.

// docSpan is a piece of code in a doc: an inline `span`, or one line of a
// fenced block.
type docSpan struct {
	where string // file:line
	text  string
}

var inlineCode = regexp.MustCompile("`([^`\n]+)`")

// docSpans returns the code spans of README.md and docs/*.md, and each
// file's text.
func docSpans(t *testing.T) ([]docSpan, map[string]string) {
	t.Helper()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../../README.md")
	var spans []docSpan
	texts := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(f, "../../")
		texts[name] = string(b)
		fenced := false
		for i, line := range strings.Split(string(b), "\n") {
			where := name + ":" + strconv.Itoa(i+1)
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				fenced = !fenced
				continue
			}
			if fenced {
				spans = append(spans, docSpan{where, line})
				continue
			}
			for _, m := range inlineCode.FindAllStringSubmatch(line, -1) {
				spans = append(spans, docSpan{where, m[1]})
			}
		}
	}
	if len(spans) < 1000 {
		t.Fatalf("found %d code spans in the docs; the docs are not where this test looks", len(spans))
	}
	return spans, texts
}

// externalFlags are other programs' flags the docs name on their own (vLLM,
// SGLang, llama.cpp, Ollama).
var externalFlags = []string{"api-key", "block-size", "page-size", "max-num-seqs", "parallel", "no-webui", "jinja", "no-jinja", "mmproj",
	"reasoning-parser", "enable-force-include-usage", "enable-cache-report", "tool-call-parser", "enable-auto-tool-choice",
	"kv-events-config", "enable-metrics"}

// cliFlags runs `tollgate ARGS -h` and returns the flags its usage lists.
func cliFlags(t *testing.T, args ...string) []string {
	t.Helper()
	var out, errOut syncbuf.Buffer
	if code := run(context.Background(), append(args, "-h"), &out, &errOut); code != 0 {
		t.Fatalf("tollgate %s -h: exit %d: %s", strings.Join(args, " "), code, errOut.String())
	}
	if !strings.Contains(errOut.String(), "Usage: tollgate "+strings.Join(args, " ")) {
		t.Errorf("tollgate %s -h prints no usage: %q", strings.Join(args, " "), errOut.String()+out.String())
	}
	flags := []string{"h", "help"}
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z][a-z0-9-]*)`).FindAllStringSubmatch(errOut.String(), -1) {
		flags = append(flags, m[1])
	}
	return flags
}

// subcommands lists the commands of `tollgate CMD -h` (accounts, keys).
func subcommands(t *testing.T, cmd string) []string {
	t.Helper()
	var out, errOut syncbuf.Buffer
	run(context.Background(), []string{cmd, "-h"}, &out, &errOut)
	_, list, ok := strings.Cut(errOut.String(), "Commands:\n")
	if !ok {
		return nil
	}
	var subs []string
	for _, m := range regexp.MustCompile(`(?m)^  ([a-z]+) `).FindAllStringSubmatch(list, -1) {
		subs = append(subs, m[1])
	}
	return subs
}

// A tollgate command line in a doc: `tollgate CMD ...`, `./cmd/tollgate CMD
// ...` or the compose file's `tollgate-1 CMD ...`.
var cliLine = regexp.MustCompile(`(?:^|[\s/("'])tollgate(?:-[12])?\s+([a-z][a-z-]*)(.*)`)

func TestDocsNameRealCommandsAndFlags(t *testing.T) {
	spans, _ := docSpans(t)
	flags := map[string][]string{} // "cmd" or "cmd sub": its flags
	subs := map[string][]string{}
	var all []string
	for _, c := range commandSummaries {
		cmd := c[0]
		if s := subcommands(t, cmd); len(s) > 0 {
			subs[cmd] = s
			for _, sub := range s {
				flags[cmd+" "+sub] = cliFlags(t, cmd, sub)
				flags[cmd] = append(flags[cmd], flags[cmd+" "+sub]...)
			}
			flags[cmd] = append(flags[cmd], "h", "help")
		} else {
			flags[cmd] = cliFlags(t, cmd)
		}
		all = append(all, flags[cmd]...)
	}
	flagName := regexp.MustCompile(`^--?([a-z][a-z0-9-]*)(=.*)?$`)
	lines := 0
	for _, s := range spans {
		if m := cliLine.FindStringSubmatch(s.text); m != nil {
			cmd := m[1]
			if _, ok := flags[cmd]; !ok && newCommand(cmd, io.Discard, io.Discard) != nil {
				continue // a command left out of the help (bench-client)
			} else if !ok {
				t.Errorf("%s: `tollgate %s`: there is no such command (%q)", s.where, cmd, s.text)
				continue
			}
			lines++
			set := cmd
			for i, tok := range strings.Fields(m[2]) {
				if strings.ContainsAny(tok[:1], "|;&#>\\") || strings.HasPrefix(tok, "2>") {
					break // the command line ends
				}
				if i == 0 && subs[cmd] != nil && regexp.MustCompile(`^[a-z]+(\|[a-z]+)*$`).MatchString(tok) {
					for _, sub := range strings.Split(tok, "|") {
						if !slices.Contains(subs[cmd], sub) {
							t.Errorf("%s: `tollgate %s %s`: %s has no command %s (it has %v)", s.where, cmd, sub, cmd, sub, subs[cmd])
						}
					}
					if !strings.Contains(tok, "|") {
						set = cmd + " " + tok
					}
					continue
				}
				if f := flagName.FindStringSubmatch(tok); f != nil && !slices.Contains(flags[set], f[1]) {
					t.Errorf("%s: `tollgate %s` has no flag --%s (%q)", s.where, set, f[1], s.text)
				}
			}
			continue
		}
		// A flag on its own (`--dir`, `--workload all`): some command's.
		if f := flagName.FindStringSubmatch(strings.Fields(s.text + " x")[0]); f != nil && strings.HasPrefix(s.text, "--") &&
			!slices.Contains(all, f[1]) && !slices.Contains(externalFlags, f[1]) {
			t.Errorf("%s: no tollgate command has a flag --%s", s.where, f[1])
		}
	}
	if lines < 30 {
		t.Errorf("found %d tollgate command lines in the docs; the pattern misses them", lines)
	}
}

// configKeys is every key of the config file, dotted, with [] for a list:
// "models[].backends[].nodes[].url".
func configKeys(typ reflect.Type, prefix string, keys map[string]bool) {
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	for i := range typ.NumField() {
		f := typ.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		key := prefix + name
		keys[key] = true
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct {
			keys[key+"[]"] = true
			configKeys(ft.Elem(), key+"[].", keys)
		} else if ft.Kind() == reflect.Struct && ft.NumField() > 0 {
			configKeys(ft, key+".", keys)
		}
	}
}

// notConfigKeys look like config keys but are not tollgate's: SearXNG's
// settings.yml key, and a column of the payments table (docs/payments.md).
var notConfigKeys = []string{"search.formats", "payments.credit_entry"}

func TestDocsNameRealConfigKeys(t *testing.T) {
	spans, _ := docSpans(t)
	keys := map[string]bool{}
	configKeys(reflect.TypeFor[config.Config](), "", keys)
	// A config key in a doc: a dotted path from a top-level key, with []
	// for lists, optionally followed by its value (`log.format: text`).
	var top []string
	for k := range keys {
		if !strings.ContainsAny(k, ".[") {
			top = append(top, k)
		}
	}
	configKeySpan := regexp.MustCompile(`^((?:` + strings.Join(top, "|") + `)(?:\[\])?(?:\.[a-z_]+(?:\[\])?)+)(?:\s*:.*|\s+\(.*)?$`)
	checked := 0
	for _, s := range spans {
		m := configKeySpan.FindStringSubmatch(strings.TrimSpace(s.text))
		if m == nil || slices.Contains(notConfigKeys, m[1]) {
			continue
		}
		checked++
		if !keys[m[1]] {
			t.Errorf("%s: config key %s does not exist (%q)", s.where, m[1], s.text)
		}
	}
	if checked < 80 {
		t.Errorf("checked %d config keys named in the docs; the pattern misses them", checked)
	}
}

// codeConstants parses the Code constants of the tollgate package.
func codeConstants(t *testing.T) map[string]bool {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../../error.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	codes := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		if vs, ok := n.(*ast.ValueSpec); ok {
			if id, ok := vs.Type.(*ast.Ident); ok && id.Name == "Code" {
				for _, v := range vs.Values {
					if lit, ok := v.(*ast.BasicLit); ok {
						s, _ := strconv.Unquote(lit.Value)
						codes[s] = true
					}
				}
			}
		}
		return true
	})
	if len(codes) < 20 {
		t.Fatalf("found %d Code constants in error.go", len(codes))
	}
	return codes
}

// httpLevelCodes are statuses net/http itself decides, answered with the
// envelope of the code named (docs/api.md, "HTTP").
var httpLevelCodes = map[string]bool{"431 request_too_large": true, "501 invalid_request": true, "505 invalid_request": true}

// externalCodes are other servers' error codes the docs name: Stripe's, as
// its imitation in the simulator answers them (docs/simulator.md).
var externalCodes = map[string]bool{"resource_missing": true, "parameter_unknown": true, "parameter_missing": true,
	"amount_too_small": true, "charge_already_refunded": true, "idempotency_key_in_use": true, "authentication_required": true}

func TestDocsNameRealErrorCodes(t *testing.T) {
	_, texts := docSpans(t)
	codes := codeConstants(t)
	// "404 `model_not_found`", and the error tables' "| 404 | `model_not_found` |".
	statusCode := regexp.MustCompile("\\b([1-5][0-9][0-9])\\s*\\|?\\s*`([a-z_]+)`")
	checked := 0
	for name, text := range texts {
		for _, m := range statusCode.FindAllStringSubmatch(text, -1) {
			status, code := m[1], m[2]
			if strings.HasSuffix(code, "_error") || externalCodes[code] {
				continue // an error type, tollgate's or a backend's (docs/streams.md), or another server's code
			}
			checked++
			if !codes[code] {
				t.Errorf("%s: %s `%s`: there is no such error code", name, status, code)
				continue
			}
			if want := strconv.Itoa(server.StatusOf(tollgate.Code(code))); want != status && !httpLevelCodes[status+" "+code] {
				t.Errorf("%s: %s `%s`: the code is answered with %s", name, status, code, want)
			}
		}
	}
	if checked < 50 {
		t.Errorf("checked %d status and code pairs in the docs; the pattern misses them", checked)
	}
	// docs/api.md's error table lists every code.
	table := texts["docs/api.md"][strings.Index(texts["docs/api.md"], "| status | `code` | `type` | when |"):]
	for code := range codes {
		if !regexp.MustCompile("\\| [1-5][0-9][0-9] \\| `" + code + "` \\|").MatchString(table) {
			t.Errorf("docs/api.md's error table does not list %s", code)
		}
	}
}

// unservedPaths are paths the docs name as not served (docs/api.md: every
// other path answers 404); each is checked to answer 404 on the api listener.
var unservedPaths = []string{"/v1/embeddings", "/v1/completions", "/v1/responses", "/v1/files", "/v1/assistants",
	"/v1/batches", "/v1/moderations", "/v1/models/{id}", "/v1/pricing", "/v1//chat/completions", "/v1/./models"}

// A tollgate path in a doc, optionally after its method: at the start of a
// word, or after tollgate's own address (not another server's URL, not a
// file path).
var docPath = regexp.MustCompile(`(?:^|[\s('"=]|\$[A-Z_]+|://(?:127\.0\.0\.1|localhost|HOST)(?::[0-9]+|:PORT)?)(?:(GET|POST|HEAD|PUT|PATCH|DELETE)\s+)?(/(?:v1|admin|healthz|readyz|metrics|debug/pprof|console|pricing)(?:[A-Za-z0-9_./{}$-]|…)*)`)

// stripePaths are Stripe's API paths, which docs/payments.md names as the
// requests tollgate sends.
var stripePaths = []string{"/v1/checkout/sessions", "/v1/checkout/sessions/{id}", "/v1/payment_intents", "/v1/payment_intents/{id}"}

// pathPrefixes are prefixes of served paths that the docs name as such.
var pathPrefixes = []string{"/v1", "/v1/", "/admin/v1/"}

func TestDocsNameRealPaths(t *testing.T) {
	spans, _ := docSpans(t)
	h := everyRouteHarness(t, "docs-test-token")
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	routeMissing := regexp.MustCompile(`is not served on this listener|is not an admin API route|there is no console page|there is no operator page`)
	ask := func(listener, method, path string) (int, string) {
		req, err := http.NewRequest(method, "http://"+h.main.Addr(listener)+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer docs-test-token")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	seen := map[string]bool{}
	for _, s := range spans {
		if strings.HasPrefix(s.where, "docs/simulator.md:") {
			continue // the simulated servers' own paths
		}
		for _, m := range docPath.FindAllStringSubmatch(s.text, -1) {
			method, path := m[1], m[2]
			if strings.Contains(path, "...") || strings.Contains(path, "…") || slices.Contains(pathPrefixes, path) {
				continue // a family of paths
			}
			path = strings.TrimRight(path, ".,)")
			if regexp.MustCompile(`\.(go|js|md|ya?ml|json)$`).MatchString(path) {
				continue // a file
			}
			path, _, _ = strings.Cut(path, "?")
			if seen[method+" "+path] {
				continue
			}
			seen[method+" "+path] = true
			if slices.Contains(unservedPaths, path) || slices.Contains(stripePaths, path) {
				continue
			}
			url := regexp.MustCompile(`\{[a-z_]+\}`).ReplaceAllString(path, "x")
			m := method
			if m == "" {
				m = http.MethodGet
			}
			var status int
			var body string
			for _, l := range []string{"api", "admin"} {
				if status, body = ask(l, m, url); !(status == 404 && routeMissing.MatchString(body)) {
					break
				}
			}
			switch {
			case status == 404 && routeMissing.MatchString(body):
				t.Errorf("%s: %s %s is served on no listener: %s", s.where, m, path, body)
			case status == 405 && method != "":
				t.Errorf("%s: %s %s: the path is served, but not to %s", s.where, m, path, m)
			}
		}
	}
	if len(seen) < 25 {
		t.Errorf("checked %d paths named in the docs; the pattern misses them", len(seen))
	}
	for _, p := range unservedPaths {
		if status, body := ask("api", http.MethodGet, strings.ReplaceAll(p, "{id}", "tg-chat")); status != 404 || !strings.Contains(body, `"code":"not_found"`) {
			t.Errorf("GET %s, which docs/api.md says is not served: %d %s", p, status, body)
		}
	}
}

// The Compose walkthrough of docs/operations.md sets every variable that
// deploy/tollgate.yaml names (`serve` refuses to start without one): the
// compose file passes each to the instances, from a variable the
// walkthrough exports when the compose file does not build it itself.
func TestComposeWalkthroughSetsTheConfigsVariables(t *testing.T) {
	read := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	cfg, compose, ops := read("../../deploy/tollgate.yaml"), read("../../deploy/docker-compose.yml"), read("../../docs/operations.md")
	start := strings.Index(ops, "```sh\ncd deploy\n")
	if start < 0 {
		t.Fatal("docs/operations.md has no Compose walkthrough (a block starting `cd deploy`)")
	}
	walk := ops[start : start+strings.Index(ops[start+3:], "```")]
	exported := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^export (.*)`).FindAllStringSubmatch(walk, -1) {
		for _, a := range regexp.MustCompile(`([A-Z_]+)=`).FindAllStringSubmatch(m[1], -1) {
			exported[a[1]] = true
		}
	}
	vars := regexp.MustCompile(`(?m)_env: ([A-Z_]+)`).FindAllStringSubmatch(cfg, -1)
	if len(vars) < 3 {
		t.Fatalf("deploy/tollgate.yaml names %d variables; the pattern misses them", len(vars))
	}
	for _, v := range vars {
		m := regexp.MustCompile(`(?m)^\s+` + v[1] + `: (.*)$`).FindStringSubmatch(compose)
		if m == nil {
			t.Errorf("deploy/tollgate.yaml names %s, which deploy/docker-compose.yml does not set", v[1])
			continue
		}
		for _, ref := range regexp.MustCompile(`\$\{([A-Z_]+)(:?[-?])?`).FindAllStringSubmatch(m[1], -1) {
			if ref[2] != ":?" {
				t.Errorf("deploy/docker-compose.yml: %s comes from ${%s%s...}: an unset variable must stop compose, not start an instance that refuses it", v[1], ref[1], ref[2])
			}
			if !exported[ref[1]] {
				t.Errorf("docs/operations.md's Compose walkthrough does not export %s (deploy/docker-compose.yml builds %s from it)", ref[1], v[1])
			}
		}
	}
}

// Every relative link of the docs leads to a file that exists and, with a
// #fragment, to one of its headings (as GitHub makes their anchors), so a
// fact stated once stays reachable from the docs that point at it.
func TestDocsLinksResolve(t *testing.T) {
	_, texts := docSpans(t)
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading := regexp.MustCompile("(?m)^#{1,6} (.+)$")
	anchors := func(text string) map[string]bool {
		set := map[string]bool{}
		for _, h := range heading.FindAllStringSubmatch(text, -1) {
			var b strings.Builder
			for _, r := range strings.ToLower(strings.TrimSpace(h[1])) {
				switch {
				case r == ' ':
					b.WriteRune('-')
				case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
					b.WriteRune(r)
				}
			}
			set[b.String()] = true
		}
		return set
	}
	checked := 0
	fence := regexp.MustCompile("(?ms)^```.*?^```")
	for name, text := range texts {
		prose := inlineCode.ReplaceAllString(fence.ReplaceAllString(text, ""), "")
		for _, m := range link.FindAllStringSubmatch(prose, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			path := filepath.Join("../..", filepath.Dir(name), file)
			if file == "" {
				path = filepath.Join("../..", name)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				if _, serr := os.Stat(path); serr != nil {
					t.Errorf("%s: link %s: %v", name, target, serr)
				}
				continue
			}
			checked++
			if frag != "" && !anchors(string(b))[frag] {
				t.Errorf("%s: link %s: %s has no heading #%s", name, target, file, frag)
			}
		}
	}
	if checked < 50 {
		t.Errorf("checked %d links in the docs; the pattern misses them", checked)
	}
}
