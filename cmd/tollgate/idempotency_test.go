package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/simulate"
)

// charges returns the request ids of the account's charges.
func charges(t *testing.T, st Store, accountID string) []string {
	t.Helper()
	var ids []string
	err := st.Ledger(context.Background(), tollgate.UsageFilter{AccountID: accountID}, func(e tollgate.LedgerEntry) error {
		if e.Kind == tollgate.LedgerCharge {
			ids = append(ids, e.ID)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

type idemResponse struct {
	status int
	header http.Header
	body   []byte
	err    error
}

func (r idemResponse) code() string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(r.body, &e)
	return e.Error.Code
}

// postIdem posts a chat completion with an Idempotency-Key to base ("host:port").
func postIdem(base, apiKey, idemKey, body string) idemResponse {
	req, err := http.NewRequest(http.MethodPost, "http://"+base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return idemResponse{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return idemResponse{err: err}
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, err = b.ReadFrom(resp.Body)
	return idemResponse{status: resp.StatusCode, header: resp.Header, body: b.Bytes(), err: err}
}

// checkConcurrent checks the answers to n identical requests sent at once
// with one key: exactly one ran (200 without Idempotent-Replayed); every
// other is a 409 idempotency_key_in_flight with Retry-After or a replay of
// that one, byte for byte, with its headers. It returns the original.
func checkConcurrent(t *testing.T, rs []idemResponse) idemResponse {
	t.Helper()
	var orig *idemResponse
	for i := range rs {
		r := &rs[i]
		if r.err != nil {
			t.Fatalf("request %d: %v", i, r.err)
		}
		if r.status == http.StatusOK && r.header.Get("Idempotent-Replayed") == "" {
			if orig != nil {
				t.Fatalf("two requests ran: %s and %s", orig.header.Get("X-Request-Id"), r.header.Get("X-Request-Id"))
			}
			orig = r
		}
	}
	if orig == nil {
		t.Fatal("no request ran")
	}
	replays, conflicts := 0, 0
	for i, r := range rs {
		switch {
		case &rs[i] == orig:
		case r.status == http.StatusConflict:
			conflicts++
			if r.code() != "idempotency_key_in_flight" || r.header.Get("Retry-After") == "" {
				t.Errorf("409 = %s (Retry-After %q)", r.body, r.header.Get("Retry-After"))
			}
		case r.status == http.StatusOK:
			replays++
			checkReplay(t, *orig, r)
		default:
			t.Errorf("request %d: %d %s", i, r.status, r.body)
		}
	}
	t.Logf("%d requests: 1 ran, %d replays, %d conflicts", len(rs), replays, conflicts)
	return *orig
}

// checkReplay checks that r replays orig byte for byte.
func checkReplay(t *testing.T, orig, r idemResponse) {
	t.Helper()
	if r.status != orig.status || !bytes.Equal(r.body, orig.body) {
		t.Errorf("replay = %d %q, want %d %q", r.status, r.body, orig.status, orig.body)
	}
	if r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay without Idempotent-Replayed: true: %v", r.header)
	}
	for _, h := range []string{"Content-Type", "Content-Length", "X-Request-Id", "X-Tollgate-Backend", "X-Tollgate-Node", "X-Tollgate-Cost"} {
		if r.header.Get(h) != orig.header.Get(h) {
			t.Errorf("replayed %s = %q, want %q", h, r.header.Get(h), orig.header.Get(h))
		}
	}
}

func sendConcurrently(n int, send func(i int) idemResponse) []idemResponse {
	rs := make([]idemResponse, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			rs[i] = send(i)
		}()
	}
	close(start)
	wg.Wait()
	return rs
}

const idemBody = `{"model":"flav-vllm","messages":[{"role":"user","content":"Say it once. [sim ttft=200ms]"}]}`

// 50 identical requests at once with one key: the model is called once, the
// account charged once, and everyone gets that answer (or 409 while it runs).
func TestIdempotencyConcurrent(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	sim := h.sim("vllm")
	before := sim.Stats().Requests
	addr := h.main.Addr("api")
	rs := sendConcurrently(50, func(int) idemResponse { return postIdem(addr, h.key, "order-42", idemBody) })
	orig := checkConcurrent(t, rs)
	if got := sim.Stats().Requests - before; got != 1 {
		t.Errorf("the simulator saw %d calls, want 1", got)
	}
	h.main.Biller.Wait() // charges within their holds commit just after the response
	if ids := charges(t, h.main.Store, h.acct.ID); len(ids) != 1 || ids[0] != orig.header.Get("X-Request-Id") {
		t.Errorf("charges = %v, want exactly one, for %s", ids, orig.header.Get("X-Request-Id"))
	}
	// After it finished: a replay, through the official client too.
	checkReplay(t, orig, postIdem(addr, h.key, "order-42", idemBody))
	var resp *http.Response
	c, err := h.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:    "flav-vllm",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say it once. [sim ttft=200ms]")},
	}, option.WithHeader("Idempotency-Key", "order-43"), option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	c2, err := h.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:    "flav-vllm",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say it once. [sim ttft=200ms]")},
	}, option.WithHeader("Idempotency-Key", "order-43"), option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	if c2.ID != c.ID || c2.RawJSON() != c.RawJSON() || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("official client: second answer %s (replayed %q), want the first, %s", c2.ID, resp.Header.Get("Idempotent-Replayed"), c.ID)
	}
	if got := sim.Stats().Requests - before; got != 2 {
		t.Errorf("the simulator saw %d calls for two keys, want 2", got)
	}
}

func TestIdempotencyReusedAndInvalid(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	sim := h.sim("vllm")
	addr := h.main.Addr("api")
	if r := postIdem(addr, h.key, "k1", idemBody); r.status != 200 {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	before := sim.Stats().Requests
	other := strings.Replace(idemBody, "Say it once.", "Say it twice.", 1)
	r := postIdem(addr, h.key, "k1", other)
	if r.status != http.StatusUnprocessableEntity || r.code() != "idempotency_key_reused" {
		t.Errorf("different body: %d %s, want 422 idempotency_key_reused", r.status, r.body)
	}
	// Same body, another model: another request too.
	r = postIdem(addr, h.key, "k1", strings.Replace(idemBody, "flav-vllm", "flav-sglang", 1))
	if r.status != http.StatusUnprocessableEntity {
		t.Errorf("different model: %d %s, want 422", r.status, r.body)
	}
	// The same value from another account is another key.
	_, _, otherKey := h.newKey(tollgate.Dollars(1), nil)
	if r := postIdem(addr, otherKey, "k1", other); r.status != 200 || r.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("another account, same key value: %d %s, want a fresh 200", r.status, r.body)
	}
	for _, bad := range []string{strings.Repeat("k", 256), "caf\xc3\xa9"} {
		r := postIdem(addr, h.key, bad, idemBody)
		if r.status != http.StatusBadRequest || r.code() != "invalid_idempotency_key" {
			t.Errorf("key %q: %d %s, want 400 invalid_idempotency_key", bad, r.status, r.body)
		}
	}
	if r := postIdem(addr, h.key, strings.Repeat("k", 255), idemBody); r.status != 200 {
		t.Errorf("255-byte key: %d %s", r.status, r.body)
	}
	// Two Idempotency-Key headers: which one would count? Neither.
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(idemBody))
	req.Header.Set("Authorization", "Bearer "+h.key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Add("Idempotency-Key", "a")
	req.Header.Add("Idempotency-Key", "b")
	if code, _, body := h.do(req); code != http.StatusBadRequest || !strings.Contains(string(body), "invalid_idempotency_key") {
		t.Errorf("two headers: %d %s, want 400", code, body)
	}
	// A stream ignores the header, whatever it holds: two of them, or a
	// value that would be refused on a non-streamed request.
	streamBody := strings.Replace(idemBody, "{", `{"stream":true,`, 1)
	for _, keys := range [][]string{{"a", "b"}, {strings.Repeat("k", 256)}} {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(streamBody))
		req.Header.Set("Authorization", "Bearer "+h.key)
		req.Header.Set("Content-Type", "application/json")
		for _, k := range keys {
			req.Header.Add("Idempotency-Key", k)
		}
		if code, _, body := h.do(req); code != http.StatusOK || !strings.Contains(string(body), "data: [DONE]") {
			t.Errorf("stream with Idempotency-Key %q: %d %s, want the stream", keys, code, body)
		}
	}
	if got := sim.Stats().Requests - before; got != 4 { // the other account, the 255-byte key, two streams
		t.Errorf("the simulator saw %d calls, want 4", got)
	}
}

// A failure frees the key: the retry runs afresh and is charged once.
func TestIdempotencyFailureReleases(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	sim := h.sim("vllm")
	addr := h.main.Addr("api")
	sim.SetFault(simulate.Fault500)
	r := postIdem(addr, h.key, "retry-me", idemBody)
	if r.status != http.StatusBadGateway {
		t.Fatalf("with the backend failing: %d %s, want 502", r.status, r.body)
	}
	h.main.Biller.Wait() // charges within their holds commit just after the response
	if ids := charges(t, h.main.Store, h.acct.ID); len(ids) != 0 {
		t.Fatalf("a failure was charged: %v", ids)
	}
	sim.SetFault(simulate.FaultNone)
	before := sim.Stats().Requests
	r = postIdem(addr, h.key, "retry-me", idemBody)
	if r.status != 200 || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry: %d %s, want a fresh 200", r.status, r.body)
	}
	checkReplay(t, r, postIdem(addr, h.key, "retry-me", idemBody))
	if got := sim.Stats().Requests - before; got != 1 {
		t.Errorf("the retry and its replay called the simulator %d times, want 1", got)
	}
	h.main.Biller.Wait() // charges within their holds commit just after the response
	if ids := charges(t, h.main.Store, h.acct.ID); len(ids) != 1 || ids[0] != r.header.Get("X-Request-Id") {
		t.Errorf("charges = %v, want one, for the retry %s", ids, r.header.Get("X-Request-Id"))
	}
	// 402 frees the key too: an account without money, then with a key that has it.
	poor, _, poorKey := h.newKey(0, nil)
	if r := postIdem(addr, poorKey, "p", idemBody); r.status != http.StatusPaymentRequired {
		t.Fatalf("no balance: %d %s, want 402", r.status, r.body)
	}
	if err := h.main.Store.PostEntry(context.Background(), &tollgate.LedgerEntry{ID: tollgate.NewID("le_"), Kind: tollgate.LedgerCredit,
		AccountID: poor.ID, Amount: tollgate.Dollars(1), Time: h.main.Server.Now()}); err != nil {
		t.Fatal(err)
	}
	if r := postIdem(addr, poorKey, "p", idemBody); r.status != 200 || r.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("after the credit: %d %s, want a fresh 200", r.status, r.body)
	}
}

// A stream cannot be replayed: the header is ignored.
func TestIdempotencyStreamIgnoresKey(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	sim := h.sim("vllm")
	before := sim.Stats().Requests
	stream := `{"model":"flav-vllm","stream":true,"messages":[{"role":"user","content":"Stream."}]}`
	for i := range 2 {
		r := postIdem(h.main.Addr("api"), h.key, "s", stream)
		if r.status != 200 || !strings.Contains(string(r.body), "data: [DONE]") || r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("stream %d: %d %q", i, r.status, r.body)
		}
	}
	if got := sim.Stats().Requests - before; got != 2 {
		t.Errorf("two streams with one key called the simulator %d times, want 2", got)
	}
	// And the key was never claimed: a non-streamed request with it runs.
	if r := postIdem(h.main.Addr("api"), h.key, "s", idemBody); r.status != 200 || r.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("non-streamed after streams: %d %s", r.status, r.body)
	}
}
