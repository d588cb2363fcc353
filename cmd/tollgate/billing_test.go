package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/billing"
)

// flatModel costs exactly its hold when the simulator answers with
// max_tokens tokens: input is free and the hold is max_tokens × output.
const flatModel = `
  - id: bill-flat
    kind: chat
    context_length: 32768
    max_output_tokens: 4096
    backends:
      - class: network
        upstream_model: up-vllm
        capabilities: [tools]
        rates: {input: "0", output: "3.000007"}
        nodes:
          - {name: node-flat, url: "{{flav-vllm}}/v1", flavour: vllm}
`

// flatBody is a request to bill-flat that the simulator answers with exactly
// 10 completion tokens, so it costs 10 × 3.000007 µUSD = its hold.
const flatBody = `{"model":"bill-flat","max_tokens":10,"messages":[{"role":"user","content":"Count. [sim tokens=10]"}]}`

var flatHold = tollgate.Amount(10 * 3_000_007)

func (h *harness) books() Store { return h.main.Store }

// usageOrError is what an answer or a stream's event says of its cost or
// its failure.
type usageOrError struct {
	Usage *struct {
		Cost string `json:"cost"`
	} `json:"usage"`
	Error *struct {
		Code string `json:"code"`
	} `json:"error"`
}

// postKey is h.post with another key.
func (h *harness) postKey(key, body string, headers map[string]string) (int, http.Header, []byte) {
	h.t.Helper()
	if headers == nil {
		headers = map[string]string{}
	}
	headers["Authorization"] = "Bearer " + key
	return h.post("/v1/chat/completions", body, headers)
}

// ledgerEntry waits (a settle after a disconnect runs after the client left)
// for the charge of request id and returns it.
func ledgerEntry(t *testing.T, st Store, id string) tollgate.LedgerEntry {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var found *tollgate.LedgerEntry
		err := st.Ledger(context.Background(), tollgate.UsageFilter{}, func(e tollgate.LedgerEntry) error {
			if e.ID == id {
				found = &e
			}
			return nil
		})
		if err == nil && found != nil {
			return *found
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ledger entry for request %s: %v", id, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func mustAudit(t *testing.T, st billing.BooksStore) billing.AuditReport {
	t.Helper()
	r, err := billing.Audit(context.Background(), st, time.Now(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK {
		t.Errorf("audit: %v", r.Problems)
	}
	return r
}

func countCharges(t *testing.T, st Store, acct string) (n int, sum tollgate.Amount) {
	t.Helper()
	err := st.Ledger(context.Background(), tollgate.UsageFilter{AccountID: acct}, func(e tollgate.LedgerEntry) error {
		if e.Kind == tollgate.LedgerCharge {
			n++
			sum -= e.Amount
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n, sum
}

// 500 concurrent requests against an account that can afford exactly 137 of
// them: exactly 137 are served, the others get 402, nothing is overdrawn and
// the books add up.
func TestBillingConcurrentExactlyN(t *testing.T) {
	h := newHarness(t, harnessOptions{models: flatModel})
	const n, total = 137, 500
	acct, _, key := h.newKey(flatHold*n+flatHold-1, nil)
	st := h.books()
	var served, refused atomic.Int64
	var wg sync.WaitGroup
	for range total {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, hdr, body := h.postKey(key, flatBody, nil)
			switch status {
			case http.StatusOK:
				served.Add(1)
				if got := hdr.Get("X-Tollgate-Cost"); got != flatHold.String() {
					t.Errorf("X-Tollgate-Cost = %s, want %s", got, flatHold)
				}
			case http.StatusPaymentRequired:
				refused.Add(1)
				if !strings.Contains(string(body), `"code":"insufficient_balance"`) || hdr.Get("X-Should-Retry") != "false" {
					t.Errorf("402 body %s, headers %v", body, hdr)
				}
			default:
				t.Errorf("status %d: %s", status, body)
			}
		}()
	}
	wg.Wait()
	h.main.Biller.Wait() // settles within their holds are committed after the response
	if served.Load() != n || refused.Load() != total-n {
		t.Errorf("served %d, refused %d; want exactly %d served and %d refused", served.Load(), refused.Load(), n, total-n)
	}
	b, err := st.Balance(context.Background(), acct.ID)
	if err != nil {
		t.Fatal(err)
	}
	if b.Balance != flatHold-1 || b.Held != 0 {
		t.Errorf("balance %s held %s, want %s and 0", b.Balance, b.Held, flatHold-1)
	}
	if c, sum := countCharges(t, st, acct.ID); c != n || sum != flatHold*n {
		t.Errorf("%d charges summing to %s, want %d summing to %s", c, sum, n, flatHold*n)
	}
	mustAudit(t, st)
}

var holdMsg = regexp.MustCompile(`needs a hold of ([0-9.]+) USD and the account has ([0-9.]+) USD free`)

// The 402 names both amounts; the backend is never called.
func TestBillingInsufficientNamesAmounts(t *testing.T) {
	h := newHarness(t, harnessOptions{models: flatModel})
	_, _, key := h.newKey(flatHold-1, nil)
	before := h.sim("vllm").Stats().Requests
	status, _, body := h.postKey(key, flatBody, nil)
	if status != http.StatusPaymentRequired {
		t.Fatalf("status %d: %s", status, body)
	}
	m := holdMsg.FindStringSubmatch(string(body))
	if m == nil || m[1] != flatHold.String() || m[2] != (flatHold-1).String() {
		t.Errorf("message %s: want the hold %s and the free balance %s", body, flatHold, flatHold-1)
	}
	if after := h.sim("vllm").Stats().Requests; after != before {
		t.Errorf("the backend was called %d times for a refused request", after-before)
	}
}

// sseResult is what a raw streamed request gave.
type sseResult struct {
	requestID string
	usageCost string // usage.cost of the usage chunk
	trailer   string // X-Tollgate-Cost
	errCode   string // code of an error event
	done      bool
}

// stream posts a streamed request and reads it to the end, or until stopAfter
// content chunks when stopAfter > 0 (then it hangs up).
func (h *harness) stream(key, body string, stopAfter int) sseResult {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.main.APIURL()+"/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	r := sseResult{requestID: resp.Header.Get("X-Request-Id")}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		h.t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	sc := bufio.NewScanner(resp.Body)
	chunks := 0
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			r.done = true
			continue
		}
		var ev struct {
			Choices []json.RawMessage `json:"choices"`
			usageOrError
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			h.t.Fatalf("bad event %s: %v", line, err)
		}
		if ev.Usage != nil {
			r.usageCost = ev.Usage.Cost
		}
		if ev.Error != nil {
			r.errCode = ev.Error.Code
		}
		if len(ev.Choices) > 0 {
			chunks++
			if stopAfter > 0 && chunks >= stopAfter {
				cancel()
				return r
			}
		}
	}
	r.trailer = resp.Trailer.Get("X-Tollgate-Cost")
	return r
}

// checkCharge compares the ledger row of a request with what the client saw.
func checkCharge(t *testing.T, st Store, id string, shown ...string) tollgate.LedgerEntry {
	t.Helper()
	e := ledgerEntry(t, st, id)
	if e.Kind != tollgate.LedgerCharge || e.Charge == nil {
		t.Fatalf("entry %s is %+v, want a charge", id, e)
	}
	c := e.Charge
	want, err := c.Prices.Cost(c.PromptTokens, c.CompletionTokens)
	if err != nil || want != c.Cost || -e.Amount != c.Cost-e.Uncollected {
		t.Errorf("entry %s: cost %s, amount %s, uncollected %s; tokens at the rates cost %s", id, c.Cost, e.Amount, e.Uncollected, want)
	}
	for _, s := range shown {
		if s != (-e.Amount).String() {
			t.Errorf("request %s: the client was shown %q, the ledger charged %s", id, s, -e.Amount)
		}
	}
	return e
}

// Streams are charged as the contract says, and what the client is shown
// (usage.cost, the X-Tollgate-Cost trailer) is the ledger row to the digit.
func TestBillingStreams(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	st := h.books()

	t.Run("complete", func(t *testing.T) {
		r := h.stream(h.key, `{"model":"flav-openai","stream":true,"messages":[{"role":"user","content":"Hi [sim tokens=12 reasoning=3 cached=4]"}]}`, 0)
		if !r.done || r.usageCost == "" || r.trailer == "" {
			t.Fatalf("stream %+v", r)
		}
		e := checkCharge(t, st, r.requestID, r.usageCost, r.trailer)
		if e.Charge.Estimated || e.Charge.CompletionTokens != 15 || e.Charge.ReasoningTokens != 3 || e.Charge.CachedTokens != 4 ||
			e.Charge.Node != "fallback" || e.Charge.Class != tollgate.ClassFallback || e.Charge.Model != "flav-openai" {
			t.Errorf("charge %+v", e.Charge)
		}
	})
	t.Run("no_usage", func(t *testing.T) {
		r := h.stream(h.key, `{"model":"flav-vllm","stream":true,"messages":[{"role":"user","content":"Hi [sim tokens=20 fault=no_usage]"}]}`, 0)
		if !r.done {
			t.Fatalf("stream %+v", r)
		}
		e := checkCharge(t, st, r.requestID, r.usageCost, r.trailer)
		if !e.Charge.Estimated || e.Charge.CompletionTokens == 0 || e.Amount == 0 {
			t.Errorf("a usage-less stream: charge %+v amount %s; want an estimated, non-zero charge", e.Charge, e.Amount)
		}
	})
	t.Run("mid_stream_failure", func(t *testing.T) {
		r := h.stream(h.key, `{"model":"flav-llamacpp","stream":true,"messages":[{"role":"user","content":"Hi [sim tokens=40 fault=stream_error after=5]"}]}`, 0)
		if r.done || r.errCode == "" {
			t.Fatalf("stream %+v: want an error event and no [DONE]", r)
		}
		e := checkCharge(t, st, r.requestID, r.usageCost, r.trailer)
		if e.Charge.CompletionTokens == 0 || e.Charge.CompletionTokens >= 40 {
			t.Errorf("failed after 5 of 40 tokens: charged for %d completion tokens", e.Charge.CompletionTokens)
		}
	})
	t.Run("disconnect", func(t *testing.T) {
		r := h.stream(h.key, `{"model":"flav-vllm","stream":true,"messages":[{"role":"user","content":"Talk [sim tokens=2000 gap=5ms]"}]}`, 5)
		e := checkCharge(t, st, r.requestID)
		if !e.Charge.Estimated || e.Charge.CompletionTokens < 4 || e.Charge.CompletionTokens >= 2000 || e.Amount == 0 {
			t.Errorf("hung up after 5 chunks of 2000: charge %+v", e.Charge)
		}
	})
	t.Run("failure_before_output", func(t *testing.T) {
		before, _ := st.Balance(context.Background(), h.acct.ID)
		status, _, body := h.post("/v1/chat/completions", `{"model":"flav-vllm","messages":[{"role":"user","content":"Hi [sim fault=500]"}]}`, nil)
		if status != http.StatusBadGateway {
			t.Fatalf("status %d: %s", status, body)
		}
		h.main.Biller.Wait() // the instance's unused reservation is given back
		after, _ := st.Balance(context.Background(), h.acct.ID)
		if after.Balance != before.Balance || after.Held != 0 {
			t.Errorf("a failed request changed the balance from %s to %s (held %s)", before.Balance, after.Balance, after.Held)
		}
	})
	h.main.Biller.Wait()
	if c, sum := countCharges(t, st, h.acct.ID); c != 4 {
		t.Errorf("%d charges (%s), want 4", c, sum)
	}
	mustAudit(t, st)
}

// Key limits: the spend limit is 403 key_limit_reached, requests per minute
// are 429 rate_limit_exceeded with Retry-After.
func TestBillingKeyLimits(t *testing.T) {
	h := newHarness(t, harnessOptions{models: flatModel})
	ctx := context.Background()
	mk := func(mod func(*tollgate.Key)) string {
		acct := tollgate.Account{ID: tollgate.NewID("acct_"), Name: "limits", Balance: tollgate.Dollars(1), Created: time.Now().UTC()}
		if err := h.main.Store.CreateAccount(ctx, acct); err != nil {
			t.Fatal(err)
		}
		secret := tollgate.NewKeySecret()
		k := tollgate.Key{ID: tollgate.NewID("key_"), AccountID: acct.ID, Prefix: tollgate.DisplayPrefix(secret), Created: time.Now().UTC()}
		mod(&k)
		if err := h.main.Store.CreateKey(ctx, k, tollgate.HashKey(secret)); err != nil {
			t.Fatal(err)
		}
		return secret
	}
	spend := mk(func(k *tollgate.Key) { k.SpendLimit = flatHold * 2 })
	for i, want := range []int{200, 200, 403} {
		status, hdr, body := h.postKey(spend, flatBody, nil)
		if status != want {
			t.Fatalf("spend-limited request %d: status %d (%s), want %d", i, status, body, want)
		}
		if status == 403 && (!strings.Contains(string(body), `"code":"key_limit_reached"`) || hdr.Get("X-Should-Retry") != "false") {
			t.Errorf("403 %s %v", body, hdr)
		}
	}
	rpm := mk(func(k *tollgate.Key) { k.RPM = 3 })
	codes := []int{}
	var retryAfter string
	for range 5 {
		status, hdr, body := h.postKey(rpm, flatBody, nil)
		codes = append(codes, status)
		if status == 429 {
			retryAfter = hdr.Get("Retry-After")
			if !strings.Contains(string(body), `"code":"rate_limit_exceeded"`) {
				t.Errorf("429 body %s", body)
			}
		}
	}
	// A minute boundary may fall between the requests; then the window restarts.
	ok := fmt.Sprint(codes) == "[200 200 200 429 429]" || strings.Count(fmt.Sprint(codes), "200") > 3
	if !ok {
		t.Errorf("rpm 3: statuses %v", codes)
	}
	if n := 0; retryAfter != "" {
		if _, err := fmt.Sscan(retryAfter, &n); err != nil || n < 1 || n > 60 {
			t.Errorf("Retry-After = %q, want 1..60 seconds", retryAfter)
		}
	} else if codes[3] == 429 {
		t.Error("429 without Retry-After")
	}
	h.main.Biller.Wait()
	mustAudit(t, h.books())
}
