package simulate

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/golden")

const weatherTools = `[{"type":"function","function":{"name":"get_weather","description":"Get the weather for a city","parameters":{"type":"object","properties":{"city":{"type":"string","enum":["Paris","Oslo"]},"unit":{"type":"string","enum":["c","f"]}},"required":["city","unit"],"additionalProperties":false}}}]`

type goldenCase struct {
	name   string
	method string
	path   string
	header map[string]string
	body   string
}

func goldenCases() []goldenCase {
	chat := `{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello."}]`
	return []goldenCase{
		{name: "models", method: "GET", path: "/v1/models"},
		{name: "health", method: "GET", path: "/health"},
		{name: "root", method: "GET", path: "/"},
		{name: "not_found", method: "GET", path: "/v1/nope"},
		{name: "wrong_method", method: "GET", path: "/v1/chat/completions"},
		{name: "chat", body: chat + `}`},
		{name: "chat_stream", body: chat + `,"stream":true}`},
		{name: "chat_stream_usage", body: chat + `,"stream":true,"stream_options":{"include_usage":true}}`},
		{name: "length", body: chat + `,"max_tokens":3}`},
		{name: "max_completion_tokens_stream", body: chat + `,"max_completion_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`},
		{name: "stop", body: chat + `,"stop":[" every"],"X":1}`},
		{name: "n2", body: chat + `,"n":2,"max_tokens":3}`},
		{name: "reasoning", body: chat + `,"reasoning_effort":"low","max_tokens":12}`},
		{name: "reasoning_stream", body: chat + `,"reasoning_effort":"low","max_tokens":12,"stream":true,"stream_options":{"include_usage":true}}`},
		{name: "tools", body: `{"model":"m","messages":[{"role":"user","content":"Weather in Paris?"}],"tools":` + weatherTools + `}`},
		{name: "tools_stream", body: `{"model":"m","messages":[{"role":"user","content":"Weather in Paris?"}],"tools":` + weatherTools + `,"stream":true,"stream_options":{"include_usage":true}}`},
		{name: "cached_usage", header: map[string]string{"X-Sim": "cached=10 tokens=4"}, body: chat + `}`},
		{name: "unknown_model", body: `{"model":"no-such-model","messages":[{"role":"user","content":"hi"}]}`},
		{name: "malformed_json", body: `{"model": "m", "messages": [ {"role": "user", "content": "hi"} `},
		{name: "empty_body", body: ``},
		{name: "missing_messages", body: `{"model":"m"}`},
		{name: "empty_messages", body: `{"model":"m","messages":[]}`},
		{name: "context_length", body: `{"model":"m","messages":[{"role":"user","content":"[sim fault=context_length]"}]}`},
		{name: "overload", header: map[string]string{"X-Sim-Fault": "503"}, body: chat + `}`},
		{name: "stream_error", header: map[string]string{"X-Sim": "fault=stream_error after=2"}, body: chat + `,"stream":true}`},
	}
}

var (
	reID       = regexp.MustCompile(`"id":"(chatcmpl-[^"]*|gen-[^"]*|call_[^"]*|modelperm-[^"]*|[A-Za-z0-9]{32})"`)
	reCreated  = regexp.MustCompile(`"created":\d+`)
	reGenID    = regexp.MustCompile(`(?m)^X-Generation-Id: .*$`)
	reDate     = regexp.MustCompile(`(?m)^Date: .*\n`)
	reModified = regexp.MustCompile(`"modified_at":"[^"]*"`)
)

// normalise blanks what legitimately changes between runs: ids and times.
func normalise(s string) string {
	s = reID.ReplaceAllString(s, `"id":"ID"`)
	s = reCreated.ReplaceAllString(s, `"created":0`)
	s = reGenID.ReplaceAllString(s, "X-Generation-Id: ID")
	s = reDate.ReplaceAllString(s, "")
	s = reModified.ReplaceAllString(s, `"modified_at":""`)
	return s
}

// dump renders a response as status line, the headers that matter, and body.
func dump(resp *http.Response, body []byte) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d\n", resp.StatusCode)
	for _, h := range []string{"Content-Type", "Allow", "Retry-After", "Server", "X-Accel-Buffering", "X-Generation-Id"} {
		if v := resp.Header.Get(h); v != "" {
			fmt.Fprintf(&b, "%s: %s\n", h, v)
		}
	}
	b.WriteString("\n")
	b.Write(body)
	return normalise(b.String())
}

func doCase(t *testing.T, url string, c goldenCase) string {
	t.Helper()
	method := c.method
	if method == "" {
		method = "POST"
	}
	path := c.path
	if path == "" {
		path = "/v1/chat/completions"
	}
	req, err := http.NewRequest(method, url+path, bytes.NewBufferString(c.body))
	if err != nil {
		t.Fatal(err)
	}
	if c.body != "" || method == "POST" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range c.header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: read: %v", c.name, err)
	}
	return dump(resp, body)
}

func TestGolden(t *testing.T) {
	for _, f := range Flavours() {
		t.Run(string(f), func(t *testing.T) {
			ts := httptest.NewServer(New(Config{Flavour: f, Models: []string{"m"}}))
			defer ts.Close()
			for _, c := range goldenCases() {
				got := doCase(t, ts.URL, c)
				path := filepath.Join("testdata", "golden", string(f), c.name+".txt")
				if *update {
					if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
						t.Fatal(err)
					}
					continue
				}
				want, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("%s: %v (run go test ./simulate -run TestGolden -update)", c.name, err)
				}
				if got != string(want) {
					t.Errorf("%s/%s differs from %s\n--- got\n%s\n--- want\n%s", f, c.name, path, got, want)
				}
			}
		})
	}
}

// TestDeterministic: the same request gives the same text and counts.
func TestDeterministic(t *testing.T) {
	for _, f := range Flavours() {
		ts := httptest.NewServer(New(Config{Flavour: f, Models: []string{"m"}}))
		for _, c := range goldenCases() {
			if c.method != "" {
				continue
			}
			a, b := doCase(t, ts.URL, c), doCase(t, ts.URL, c)
			if a != b {
				t.Errorf("%s/%s: two runs differ:\n%s\n---\n%s", f, c.name, a, b)
			}
		}
		ts.Close()
	}
}
