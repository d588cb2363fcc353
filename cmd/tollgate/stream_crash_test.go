package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/openai"
	"github.com/tollgate/tollgate/postgres"
	"github.com/tollgate/tollgate/simulate"
)

// A stream cut by a kill -9 of its `tollgate serve` process is charged for
// what it had delivered, less at most the last second or so of it
// (docs/billing.md, "Streams cut by a crash"): the process records the
// stream's charge so far in its charge journal every second, and the next
// process applies the latest record. SQLite (the journal by default), and
// PostgreSQL with billing.journal set.
func TestBillingStreamCutByACrashIsCharged(t *testing.T) {
	onCrashStores(t, streamCutByACrash)
}

// The same for a stream with web search: the next process charges the
// searches, the call that searched, and what the answer had delivered less
// at most its last second or so.
func TestBillingSearchStreamCutByACrashIsCharged(t *testing.T) {
	onCrashStores(t, searchStreamCutByACrash)
}

type crashStore = Store

// crashSearchPrice is the price of one search in onCrashStores' config.
var crashSearchPrice = tollgate.MustParseAmount("0.004")

// onCrashStores runs cut against `tollgate serve` processes on SQLite and
// on PostgreSQL with billing.journal set (skipped without
// TOLLGATE_TEST_POSTGRES), serving bill-flat with web search through a
// simulated SearXNG.
func onCrashStores(t *testing.T, cut func(t *testing.T, st crashStore, f *procFleet)) {
	bin := buildBinary(t)
	// withSearch adds the search section to a multiprocConfig.
	withSearch := func(t *testing.T, cfg string) {
		t.Helper()
		searx, err := simulate.StartSearch(simulate.SearchConfig{Flavour: simulate.SearXNG})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { searx.Close() })
		editConfig(t, cfg, "models:\n", "search:\n  provider: searxng\n  url: \""+searx.URL()+"\"\n  price: \""+crashSearchPrice.String()+"\"\nmodels:\n")
	}
	t.Run("sqlite", func(t *testing.T) {
		sim := startFlatSim(t)
		st, path := tempSQLite(t)
		cfg := multiprocConfig(t, "  sqlite: "+path+"\n", sim.URL())
		withSearch(t, cfg)
		cut(t, st, &procFleet{t: t, bin: bin, config: cfg})
	})
	t.Run("postgres", func(t *testing.T) {
		schema := postgres.NewTestSchema(t) // skips without TOLLGATE_TEST_POSTGRES
		st := postgres.OpenTestSchema(t, schema)
		sim := startFlatSim(t)
		cfg := multiprocConfig(t, "  postgres_url_env: TG_TEST_PG\n", sim.URL())
		editConfig(t, cfg, "billing:\n", "billing:\n  journal: "+filepath.Join(t.TempDir(), "charges")+"\n")
		withSearch(t, cfg)
		cut(t, st, &procFleet{t: t, bin: bin, config: cfg, env: []string{"TG_TEST_PG=" + pgURLWithSchema(t, schema)}})
	})
}

// editConfig replaces the first old in the config file at path with new.
func editConfig(t *testing.T, path, old, new string) {
	t.Helper()
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), old) {
		t.Fatalf("config %s has no %q", path, old)
	}
	doc = []byte(strings.Replace(string(doc), old, new, 1))
	if err := os.WriteFile(path, doc, 0o644); err != nil {
		t.Fatal(err)
	}
}

// postStream posts a chat request and returns the response (its body
// still streaming).
func postStream(t *testing.T, api, key, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+api+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	return resp
}

// receipt is the client's count of the content a stream delivered, with
// the time of each piece, counted as the relay counts a stream's tokens
// (openai.PieceTokens).
type receipt struct {
	mu     sync.Mutex
	got    []piece
	total  int64
	pieces int64 // content deltas
	ended  chan struct{}
}

type piece struct {
	at     time.Time
	tokens int64 // received so far
}

// receive reads the stream's body until it ends.
func receive(body io.Reader) *receipt {
	r := &receipt{ended: make(chan struct{})}
	go func() {
		defer close(r.ended)
		sc := bufio.NewScanner(body)
		for sc.Scan() {
			line, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok || line == "[DONE]" {
				continue
			}
			var ch struct {
				Choices []struct {
					Delta struct {
						Content string `json:"content"`
					} `json:"delta"`
				} `json:"choices"`
			}
			if json.Unmarshal([]byte(line), &ch) != nil || len(ch.Choices) == 0 || ch.Choices[0].Delta.Content == "" {
				continue
			}
			r.mu.Lock()
			r.total += openai.PieceTokens(int64(len(ch.Choices[0].Delta.Content)))
			r.pieces++
			r.got = append(r.got, piece{time.Now(), r.total})
			r.mu.Unlock()
		}
	}()
	return r
}

// upTo returns the tokens received in all and those received up to 1.5 s
// before t.
func (r *receipt) upTo(t time.Time) (delivered, before int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.got {
		if p.at.Before(t.Add(-1500 * time.Millisecond)) {
			before = p.tokens
		}
	}
	return r.total, before
}

// killMidStream kills process a with kill -9 3.5 s into a stream that the
// client receives in r, and returns what the client received (in all, and
// by 1.5 s before the kill).
func killMidStream(t *testing.T, a *proc, r *receipt) (delivered, before int64) {
	t.Helper()
	time.Sleep(3500 * time.Millisecond)
	killedAt := time.Now()
	a.kill9(t)
	delivered, before = r.upTo(killedAt)
	if delivered == 0 || before == 0 {
		t.Fatalf("the client received %d tokens (%d by 1.5 s before the kill): the test proves nothing", delivered, before)
	}
	return delivered, before
}

// cutCharge is the charge the next process applied for a cut request:
// estimated (counted from the stream), and the ledger's amount.
func cutCharge(t *testing.T, st crashStore, requestID string) tollgate.Charge {
	t.Helper()
	e := ledgerEntry(t, st, requestID)
	c := e.Charge
	if c == nil || !c.Estimated || e.Amount >= 0 || c.Cost != -e.Amount {
		t.Fatalf("the cut stream's charge: %+v %+v", e, c)
	}
	return *c
}

// booksAddUp waits until the dead process's reservation is swept, then
// wants the audit clean and the account's balance at want.
func booksAddUp(t *testing.T, st crashStore, accountID string, want tollgate.Amount) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, err := billing.Audit(context.Background(), st, time.Now(), 0)
		bal, _ := st.Balance(context.Background(), accountID)
		if err == nil && r.OK && bal.Held == 0 {
			if bal.Balance != want {
				t.Errorf("balance %s, want %s", bal.Balance, want)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("audit: %v %v; held %s", r.Problems, err, bal.Held)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func streamCutByACrash(t *testing.T, st crashStore, f *procFleet) {
	acct, key := fundAccount(t, st, flatHold*100_000)
	a := f.start()

	// 400 tokens, one every 25 ms: ten seconds of output.
	resp := postStream(t, a.api, key, `{"model":"bill-flat","stream":true,"max_tokens":400,"messages":[{"role":"user","content":"Talk. [sim tokens=400 gap=25ms]"}]}`)
	requestID := resp.Header.Get("X-Request-Id")
	delivered, before := killMidStream(t, a, receive(resp.Body))

	f.start() // applies the dead process's journal before serving
	c := cutCharge(t, st, requestID)
	// Charged for what was delivered, less at most the last second and the
	// gap to the next token (1.5 s allows for the scheduling of a loaded
	// machine); never for more than was delivered.
	if c.CompletionTokens < before || c.CompletionTokens > delivered {
		t.Errorf("charged %d completion tokens; the client received %d, and %d by 1.5 s before the kill",
			c.CompletionTokens, delivered, before)
	}
	if c.PromptTokens <= 0 {
		t.Errorf("the prompt was not charged: %+v", c)
	}
	t.Logf("cut after %d tokens received (%d by 1.5 s before the kill); charged %d completion tokens, %s USD",
		delivered, before, c.CompletionTokens, c.Cost)
	booksAddUp(t, st, acct.ID, flatHold*100_000-c.Cost)
}

func searchStreamCutByACrash(t *testing.T, st crashStore, f *procFleet) {
	acct, key := fundAccount(t, st, flatHold*100_000)
	a := f.start()
	const question = "What happened in Porto? [sim searches=2 cite=all gap=%s]"
	body := func(gap string) string {
		return `{"model":"bill-flat","stream":true,"max_tokens":400,"web_search_options":{},"messages":[{"role":"user","content":"` +
			strings.Replace(question, "%s", gap, 1) + `"}]}`
	}

	// The same question served whole first, at once: the simulated model
	// searches the same way (its queries leave the marker out), so the
	// first call's completion tokens are its charge's less the answer's
	// pieces (one token each).
	whole := postStream(t, a.api, key, body("0"))
	r := receive(whole.Body)
	<-r.ended
	full := ledgerEntry(t, st, whole.Header.Get("X-Request-Id")).Charge
	if full == nil || full.Searches != 2 || full.Estimated {
		t.Fatalf("the whole answer's charge: %+v", full)
	}
	searching := full.CompletionTokens - r.pieces
	if searching <= 0 || r.pieces < 80 {
		t.Fatalf("the whole answer: %d pieces, %d completion tokens charged: the cut below proves nothing", r.pieces, full.CompletionTokens)
	}

	// The answer, a piece every 60 ms after the searches: about five
	// seconds of output, cut 3.5 s after its first piece.
	resp := postStream(t, a.api, key, body("60ms"))
	requestID := resp.Header.Get("X-Request-Id")
	delivered, before := killMidStream(t, a, receive(resp.Body))

	f.start() // applies the dead process's journal before serving
	c := cutCharge(t, st, requestID)
	// Both searches and the call that made them, and the answer less at
	// most its last second and the gap to the next piece; never more than
	// was delivered.
	if c.Searches != 2 || c.SearchPrice != crashSearchPrice {
		t.Errorf("charged %d searches at %s, want 2 at %s", c.Searches, c.SearchPrice, crashSearchPrice)
	}
	if answer := c.CompletionTokens - searching; answer < before || answer > delivered {
		t.Errorf("charged %d completion tokens: %d for the answer; the client received %d, and %d by 1.5 s before the kill",
			c.CompletionTokens, answer, delivered, before)
	}
	if c.PromptTokens <= full.PromptTokens/2 {
		t.Errorf("the prompts were not charged: %+v (the whole answer's: %d)", c, full.PromptTokens)
	}
	tokens, err := c.Prices.Cost(c.PromptTokens, c.CompletionTokens)
	if err != nil {
		t.Fatal(err)
	}
	if fees, _ := tollgate.SearchFee(2, crashSearchPrice); c.Cost != tokens+fees {
		t.Errorf("cost %s, want %s for the tokens and %s for the searches", c.Cost, tokens, fees)
	}
	t.Logf("cut after %d answer tokens received (%d by 1.5 s before the kill); charged %d completion tokens (%d searching), 2 searches, %s USD",
		delivered, before, c.CompletionTokens, searching, c.Cost)
	booksAddUp(t, st, acct.ID, flatHold*100_000-full.Cost-c.Cost)
}
