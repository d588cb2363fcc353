package simulate

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

func postTokenize(t *testing.T, url, ctype, body string) (int, http.Header, string) {
	t.Helper()
	resp, err := http.Post(url, ctype, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

func idsOf(s string) []uint32 {
	var out []uint32
	for ; len(s) >= 4; s = s[4:] {
		out = append(out, binary.LittleEndian.Uint32([]byte(s[:4])))
	}
	return out
}

// vLLM's /tokenize, at the root: the chat form reads tools then messages
// as the prefix cache does; the text form the prompt; its quirks as vLLM's
// FastAPI routes answer them.
func TestVLLMTokenize(t *testing.T) {
	_, ts := newTS(t, Config{Flavour: VLLM, ContextLength: 4096})
	msgs := `[{"role":"user","content":"hello there"}]`
	tools := `[{"type":"function","function":{"name":"f"}}]`
	code, h, body := postTokenize(t, ts.URL+"/tokenize", "application/json",
		`{"model":"m","messages":`+msgs+`,"tools":`+tools+`,"add_generation_prompt":true,"add_special_tokens":false}`)
	if code != 200 || h.Get("Content-Type") != "application/json" {
		t.Fatalf("%d %s: %s", code, h.Get("Content-Type"), body)
	}
	var got struct {
		Count     int      `json:"count"`
		MaxLen    int      `json:"max_model_len"`
		Tokens    []uint32 `json:"tokens"`
		TokenStrs *[]string
	}
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	want := idsOf(tools + msgs)
	if got.Count != len(want) || got.MaxLen != 4096 || len(got.Tokens) != len(want) || got.Tokens[len(want)-1] != want[len(want)-1] || got.Tokens[0] != want[0] {
		t.Fatalf("answer %s, want %d ids %v", body, len(want), want[:3])
	}
	if !strings.HasPrefix(body, `{"count":`) || !strings.HasSuffix(body, `,"token_strs":null}`) {
		t.Fatalf("not vLLM's field order: %s", body)
	}
	// The text form.
	code, _, body = postTokenize(t, ts.URL+"/tokenize", "application/json", `{"model":"m","prompt":"abcdefgh"}`)
	if want := `{"count":2,"max_model_len":4096,"tokens":[1684234849,1751606885],"token_strs":null}`; code != 200 || body != want {
		t.Fatalf("text form: %d %s, want %s", code, body, want)
	}
	// An unknown model is vLLM's 404; a body that is not JSON and one with
	// neither form are 400 in its validation shape.
	code, _, body = postTokenize(t, ts.URL+"/tokenize", "application/json", `{"model":"other","messages":`+msgs+`}`)
	if code != 404 || !strings.Contains(body, "The model `other` does not exist.") || !strings.Contains(body, `"type":"NotFoundError"`) {
		t.Fatalf("unknown model: %d %s", code, body)
	}
	code, _, body = postTokenize(t, ts.URL+"/tokenize", "application/json", `{"model":`)
	if code != 400 || !strings.Contains(body, "JSON decode error") || !strings.Contains(body, `"type":"Bad Request"`) {
		t.Fatalf("malformed: %d %s", code, body)
	}
	code, _, body = postTokenize(t, ts.URL+"/tokenize", "application/json", `{"model":"m"}`)
	if code != 400 || !strings.Contains(body, "TokenizeChatRequest") {
		t.Fatalf("neither form: %d %s", code, body)
	}
	// GET is FastAPI's 405; /v1/tokenize does not exist.
	resp, err := http.Get(ts.URL + "/tokenize")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" || string(b) != `{"detail":"Method Not Allowed"}` {
		t.Fatalf("GET: %d %q %s", resp.StatusCode, resp.Header.Get("Allow"), b)
	}
	if code, _, body = postTokenize(t, ts.URL+"/v1/tokenize", "application/json", `{"prompt":"abcd"}`); code != 404 || body != `{"detail":"Not Found"}` {
		t.Fatalf("/v1/tokenize: %d %s", code, body)
	}
	// The server's faults apply.
	_, ts2 := newTS(t, Config{Flavour: VLLM, Behaviour: Behaviour{Fault: Fault503}})
	if code, _, _ = postTokenize(t, ts2.URL+"/tokenize", "application/json", `{"prompt":"abcd"}`); code != 503 {
		t.Fatalf("503 fault: %d", code)
	}
}

// SGLang's /tokenize and /v1/tokenize take text only: a chat body is a
// missing-field error.
func TestSGLangTokenize(t *testing.T) {
	_, ts := newTS(t, Config{Flavour: SGLang, ContextLength: 2048})
	for _, path := range []string{"/tokenize", "/v1/tokenize"} {
		code, _, body := postTokenize(t, ts.URL+path, "application/json", `{"prompt":"abcdefgh"}`)
		if want := `{"tokens":[1684234849,1751606885],"count":2,"max_model_len":2048}`; code != 200 || body != want {
			t.Fatalf("%s: %d %s, want %s", path, code, body, want)
		}
	}
	code, _, body := postTokenize(t, ts.URL+"/v1/tokenize", "application/json", `{"prompt":["abcd","efghijkl"]}`)
	if want := `{"tokens":[[1684234849],[1751606885,1818978921]],"count":[1,2],"max_model_len":2048}`; code != 200 || body != want {
		t.Fatalf("list: %d %s, want %s", code, body, want)
	}
	code, _, body = postTokenize(t, ts.URL+"/tokenize", "application/json", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	if code != 400 || !strings.Contains(body, "'loc': ('body', 'prompt')") || !strings.Contains(body, `"object":"error"`) {
		t.Fatalf("chat form: %d %s", code, body)
	}
}
