package simulate

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// shape renders a JSON value's structure, keys in their order, values by
// kind: objects keep their keys, arrays the distinct shapes of their elements.
func shape(t *testing.T, raw []byte) string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	s, err := shapeValue(dec)
	if err != nil {
		t.Fatalf("shape of %q: %v", raw, err)
	}
	return s
}

func shapeValue(dec *json.Decoder) (string, error) {
	tok, err := dec.Token()
	if err != nil {
		return "", err
	}
	switch v := tok.(type) {
	case json.Delim:
		switch v {
		case '{':
			var parts []string
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return "", err
				}
				sub, err := shapeValue(dec)
				if err != nil {
					return "", err
				}
				parts = append(parts, fmt.Sprintf("%s:%s", k, sub))
			}
			_, err := dec.Token()
			return "{" + strings.Join(parts, ",") + "}", err
		case '[':
			seen := map[string]bool{}
			var elems []string
			for dec.More() {
				sub, err := shapeValue(dec)
				if err != nil {
					return "", err
				}
				if !seen[sub] {
					seen[sub] = true
					elems = append(elems, sub)
				}
			}
			_, err := dec.Token()
			return "[" + strings.Join(elems, "|") + "]", err
		}
	case string:
		return "s", nil
	case json.Number:
		return "n", nil
	case bool:
		return "b", nil
	case nil:
		return "null", nil
	}
	return "?", nil
}

// captured is a response: status, content type and body.
type captured struct {
	status      int
	contentType string
	body        []byte
}

func readCapture(t *testing.T, path string) (method, target string, reqBody []byte, resp captured) {
	t.Helper()
	req, err := os.ReadFile(path + ".req")
	if err != nil {
		t.Fatal(err)
	}
	line, body, _ := bytes.Cut(req, []byte("\n"))
	method, target, _ = strings.Cut(strings.TrimSpace(string(line)), " ")
	reqBody = bytes.TrimSpace(body)

	raw, err := os.ReadFile(path + ".http")
	if err != nil {
		t.Fatal(err)
	}
	// The captures hold the de-chunked body: drop the framing header so the
	// body is read to its end.
	raw = bytes.Replace(raw, []byte("Transfer-Encoding: chunked\r\n"), nil, 1)
	raw = bytes.Replace(raw, []byte("Transfer-Encoding: chunked\n"), nil, 1)
	r, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
	if err != nil {
		t.Fatalf("%s.http: %v", path, err)
	}
	b, _ := io.ReadAll(r.Body)
	return method, target, reqBody, captured{r.StatusCode, r.Header.Get("Content-Type"), b}
}

// streamShapes is the ordered list of distinct event shapes of an SSE body,
// with "[DONE]" for the terminator.
func streamShapes(t *testing.T, body []byte) []string {
	t.Helper()
	var out []string
	seen := map[string]bool{}
	for _, line := range strings.Split(string(body), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		s := "[DONE]"
		if data != "[DONE]" {
			s = shape(t, []byte(data))
		}
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// TestCaptures sends the captured requests to the llamacpp and ollama
// flavours and compares what comes back with what the real servers sent:
// status, content type, and the shape of every body and stream event.
func TestCaptures(t *testing.T) {
	servers := map[string]Config{
		"llamacpp":          {Flavour: LlamaCpp, Models: []string{"tiny-chat"}, ModelPath: "/models/tiny-chat.gguf", ContextLength: 1024},
		"llamacpp/thinking": {Flavour: LlamaCpp, Models: []string{"tiny-thinking"}, ModelPath: "/models/tiny-thinking.gguf", ContextLength: 1024, Behaviour: Behaviour{AlwaysReason: true, ReasoningTokens: 1}},
		"ollama":            {Flavour: Ollama, Models: []string{"tiny-chat", "tiny-thinking"}, ContextLength: 4096},
		"ollama/thinking":   {Flavour: Ollama, Models: []string{"tiny-chat", "tiny-thinking"}, ContextLength: 4096, Behaviour: Behaviour{AlwaysReason: true, ReasoningTokens: 1}},
	}
	names := make([]string, 0, len(servers))
	for n := range servers {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		cfg := servers[name]
		dir := filepath.Join("testdata", "real", strings.Split(name, "/")[0])
		thinking := strings.HasSuffix(name, "/thinking")
		files, _ := filepath.Glob(filepath.Join(dir, "*.req"))
		if len(files) == 0 {
			t.Fatalf("no captures in %s", dir)
		}
		ts := httptest.NewServer(New(cfg))
		compared := 0
		for _, f := range files {
			base := strings.TrimSuffix(f, ".req")
			n, _ := strconv.Atoi(filepath.Base(base)[:2])
			if (n >= 50) != thinking {
				continue
			}
			method, target, reqBody, want := readCapture(t, base)
			req, _ := http.NewRequest(method, ts.URL+target, bytes.NewReader(reqBody))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("%s: %v", base, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			got := captured{resp.StatusCode, resp.Header.Get("Content-Type"), body}
			compareCapture(t, name+"/"+filepath.Base(base), want, got)
			compared++
		}
		ts.Close()
		if compared < 4 {
			t.Errorf("%s: only %d captures compared", name, compared)
		}
	}
}

func compareCapture(t *testing.T, name string, want, got captured) {
	t.Helper()
	if got.status != want.status {
		t.Errorf("%s: status %d, real server %d\n%s", name, got.status, want.status, got.body)
		return
	}
	if got.contentType != want.contentType {
		t.Errorf("%s: Content-Type %q, real server %q", name, got.contentType, want.contentType)
	}
	switch {
	case strings.HasPrefix(want.contentType, "text/event-stream"):
		ws, gs := streamShapes(t, want.body), streamShapes(t, got.body)
		if strings.Join(ws, "\n") != strings.Join(gs, "\n") {
			t.Errorf("%s: stream event shapes differ\n--- simulator\n%s\n--- real server\n%s", name, strings.Join(gs, "\n"), strings.Join(ws, "\n"))
		}
	case strings.HasPrefix(want.contentType, "application/json"):
		if w, g := shape(t, want.body), shape(t, got.body); w != g {
			t.Errorf("%s: body shape differs\n--- simulator\n%s\n--- real server\n%s", name, g, w)
		}
	default:
		if !bytes.Equal(want.body, got.body) {
			t.Errorf("%s: body %q, real server %q", name, got.body, want.body)
		}
	}
}
