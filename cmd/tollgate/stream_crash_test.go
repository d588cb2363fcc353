package main

import (
	"bufio"
	"context"
	"encoding/json"
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
	"github.com/tollgate/tollgate/sqlite"
)

// A stream cut by a kill -9 of its `tollgate serve` process is charged for
// what it had delivered, less at most the last second or so of it
// (docs/billing.md, "Streams cut by a crash"): the process records the
// stream's charge so far in its charge journal every second, and the next
// process applies the latest record. SQLite (the journal by default), and
// PostgreSQL with billing.journal set.
func TestBillingStreamCutByACrashIsCharged(t *testing.T) {
	bin := buildBinary(t)
	t.Run("sqlite", func(t *testing.T) {
		sim := startFlatSim(t)
		path := filepath.Join(t.TempDir(), "t.db")
		st, err := sqlite.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		f := &procFleet{t: t, bin: bin, config: multiprocConfig(t, "  sqlite: "+path+"\n", sim.URL())}
		streamCutByACrash(t, st, f)
	})
	t.Run("postgres", func(t *testing.T) {
		schema := postgres.NewTestSchema(t) // skips without TOLLGATE_TEST_POSTGRES
		st := postgres.OpenTestSchema(t, schema)
		sim := startFlatSim(t)
		cfg := multiprocConfig(t, "  postgres_url_env: TG_TEST_PG\n", sim.URL())
		doc, err := os.ReadFile(cfg)
		if err != nil {
			t.Fatal(err)
		}
		doc = []byte(strings.Replace(string(doc), "billing:\n", "billing:\n  journal: "+filepath.Join(t.TempDir(), "charges")+"\n", 1))
		if err := os.WriteFile(cfg, doc, 0o644); err != nil {
			t.Fatal(err)
		}
		f := &procFleet{t: t, bin: bin, config: cfg, env: []string{"TG_TEST_PG=" + pgURLWithSchema(t, schema)}}
		streamCutByACrash(t, st, f)
	})
}

func streamCutByACrash(t *testing.T, st interface {
	tollgate.Store
	billingStore
}, f *procFleet) {
	acct, key := fundAccount(t, st, flatHold*100_000)
	a := f.start()

	// 400 tokens, one every 25 ms: ten seconds of output.
	body := `{"model":"bill-flat","stream":true,"max_tokens":400,"messages":[{"role":"user","content":"Talk. [sim tokens=400 gap=25ms]"}]}`
	req, _ := http.NewRequest(http.MethodPost, "http://"+a.api+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	requestID := resp.Header.Get("X-Request-Id")
	// The client's count of what it received, with the time of each piece,
	// counted as the relay counts a stream's tokens (openai.PieceTokens).
	type piece struct {
		at     time.Time
		tokens int64 // received so far
	}
	var mu sync.Mutex
	var got []piece
	var total int64
	go func() {
		sc := bufio.NewScanner(resp.Body)
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
			if json.Unmarshal([]byte(line), &ch) != nil || len(ch.Choices) == 0 {
				continue
			}
			mu.Lock()
			total += openai.PieceTokens(int64(len(ch.Choices[0].Delta.Content)))
			got = append(got, piece{time.Now(), total})
			mu.Unlock()
		}
	}()
	time.Sleep(3500 * time.Millisecond)
	killedAt := time.Now()
	a.kill9(t)
	mu.Lock()
	delivered := total
	var before int64 // received by the client up to 1.5 s before the kill
	for _, p := range got {
		if p.at.Before(killedAt.Add(-1500 * time.Millisecond)) {
			before = p.tokens
		}
	}
	mu.Unlock()
	if delivered == 0 || before == 0 {
		t.Fatalf("the client received %d tokens (%d by 1.5 s before the kill): the test proves nothing", delivered, before)
	}

	f.start() // applies the dead process's journal before serving
	e := ledgerEntry(t, st, requestID)
	c := e.Charge
	if c == nil || !c.Estimated || e.Amount >= 0 || c.Cost != -e.Amount {
		t.Fatalf("the cut stream's charge: %+v %+v", e, c)
	}
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

	// The books add up once the dead process's reservation is swept.
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, err := billing.Audit(context.Background(), st, time.Now(), 0)
		bal, _ := st.Balance(context.Background(), acct.ID)
		if err == nil && r.OK && bal.Held == 0 {
			if want := flatHold*100_000 - c.Cost; bal.Balance != want {
				t.Errorf("balance %s, want %s", bal.Balance, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("audit: %v %v; held %s", r.Problems, err, bal.Held)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
