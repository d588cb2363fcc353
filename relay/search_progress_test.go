package relay

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/openai"
)

// testClock is the relay's clock in a test: each reading moves it on by
// step, and advance moves it on at will.
type testClock struct {
	t    atomic.Int64 // unix nanos
	step time.Duration
}

func newTestClock(step time.Duration) *testClock {
	c := &testClock{step: step}
	c.t.Store(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	return c
}

func (c *testClock) now() time.Time          { return time.Unix(0, c.t.Add(int64(c.step))).UTC() }
func (c *testClock) advance(d time.Duration) { c.t.Add(int64(d)) }

// searchPrices are searchYAML's rates and search price.
var (
	searchPrices     = tollgate.Prices{Input: tollgate.Rate(1_000_000), Output: tollgate.Rate(2_000_000)}
	searchPriceOfOne = tollgate.Amount(10_000_000_000) // 0.01
)

// withoutTime is c but for its time (a record's and the settle's differ).
func withoutTime(c tollgate.Charge) tollgate.Charge {
	c.Time = time.Time{}
	return c
}

// wantCost is what c's tokens and searches cost at searchYAML's prices.
func wantCost(t *testing.T, c tollgate.Charge) tollgate.Amount {
	t.Helper()
	cost, err := searchPrices.Cost(c.PromptTokens, c.CompletionTokens)
	if err != nil {
		t.Fatal(err)
	}
	return cost + tollgate.Amount(c.Searches)*searchPriceOfOne
}

// A web-search stream records its charge so far once content reached the
// client, at every chunk that is due: with a clock that moves a second at
// each reading, every chunk is. The first record comes with the first
// content (the second call's: the first only searched) and holds both
// searches' fees; the last, made at the backend's usage chunk, is the
// charge the settle then writes.
func TestSearchStreamRecordsItsProgress(t *testing.T) {
	r, sm, fb := searchRelay(t, &fakeSearcher{})
	r.now = newTestClock(streamProgressEvery).now
	w, err := serveSearchRequest(t, r, `{"model":"m","stream":true,"messages":[{"role":"user","content":"news twice"}],"web_search_options":{}}`)
	if err != nil {
		t.Fatal(err)
	}
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if len(fb.charges) != 1 || len(sm.usages) != 2 {
		t.Fatalf("charges %d, model calls %d; want 1 and 2: %s", len(fb.charges), len(sm.usages), w.Body.String())
	}
	settled := fb.charges[0]
	if settled.Searches != 2 || settled.Cost != wantCost(t, settled) {
		t.Fatalf("the settle's charge: %+v", settled)
	}
	if len(fb.progress) < 3 {
		t.Fatalf("%d progress records; want one at each chunk of the answer", len(fb.progress))
	}
	first := fb.progress[0]
	if first.Searches != 2 || first.SearchPrice != searchPriceOfOne || !first.Estimated {
		t.Fatalf("first record %+v: want the two searches' fees and the answer's first tokens, estimated", first)
	}
	u1 := sm.usages[0]
	if first.PromptTokens <= int64(u1[0]) || first.CompletionTokens <= int64(u1[1]) {
		t.Fatalf("first record %+v: want the first call's usage %v and the second's so far", first, u1)
	}
	prev := tollgate.Charge{}
	for i, c := range fb.progress {
		if c.Cost != wantCost(t, c) || c.RequestID != "req_1" || c.Model != "m" || c.Prices != searchPrices {
			t.Fatalf("record %d: %+v", i, c)
		}
		if c.Cost < prev.Cost || c.CompletionTokens < prev.CompletionTokens {
			t.Fatalf("record %d went back: %+v after %+v", i, c, prev)
		}
		prev = c
	}
	if last := fb.progress[len(fb.progress)-1]; withoutTime(last) != withoutTime(settled) {
		t.Fatalf("last record %+v\nsettled     %+v", last, settled)
	}
}

// Records are a second apart: with a clock that stands still but for the
// search (a second), the stream records at the first content (the first
// call's preface, no search yet) and once more as the search ends (the
// first call's usage as the backend reported it, and the search's fee), and
// not at the answer's chunks, which come less than a second after that.
func TestSearchStreamProgressEverySecond(t *testing.T) {
	clock := newTestClock(0)
	fs := &fakeSearcher{onSearch: func() { clock.advance(streamProgressEvery) }}
	r, sm, fb := searchRelay(t, fs)
	r.now = clock.now
	w, err := serveSearchRequest(t, r, `{"model":"m","stream":true,"messages":[{"role":"user","content":"preface news"}],"web_search_options":{}}`)
	if err != nil {
		t.Fatal(err)
	}
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if len(fb.charges) != 1 || len(sm.usages) != 2 || fs.calls.Load() != 1 {
		t.Fatalf("charges %d, model calls %d, searches %d; want 1, 2, 1: %s", len(fb.charges), len(sm.usages), fs.calls.Load(), w.Body.String())
	}
	if len(fb.progress) != 2 {
		t.Fatalf("%d progress records, want 2: %+v", len(fb.progress), fb.progress)
	}
	first, second := fb.progress[0], fb.progress[1]
	// The first content piece ("Let m", 5 bytes), counted as the relay counts.
	if first.Searches != 0 || !first.Estimated || first.PromptTokens <= 0 ||
		first.CompletionTokens != openai.PieceTokens(5) || first.Cost != wantCost(t, first) {
		t.Fatalf("first record %+v: want the prompt estimate and the first piece's tokens", first)
	}
	u1 := sm.usages[0]
	if second.Searches != 1 || second.Estimated || second.PromptTokens != int64(u1[0]) ||
		second.CompletionTokens != int64(u1[1]) || second.Cost != wantCost(t, second) {
		t.Fatalf("second record %+v: want the first call's usage %v and one search", second, u1)
	}
	if d := second.Time.Sub(first.Time); d < streamProgressEvery {
		t.Fatalf("records %s apart", d)
	}
	if settled := fb.charges[0]; settled.Cost <= second.Cost || settled.Searches != 1 {
		t.Fatalf("settled %+v after the record %+v", settled, second)
	}
}

// Nothing reached the client, nothing is recorded: the search fails after
// the first call, which only searched.
func TestSearchStreamFailedBeforeContentRecordsNothing(t *testing.T) {
	r, _, fb := searchRelay(t, &fakeSearcher{fail: true})
	r.now = newTestClock(streamProgressEvery).now
	_, err := serveSearchRequest(t, r, `{"model":"m","stream":true,"messages":[{"role":"user","content":"news"}],"web_search_options":{}}`)
	if tollgate.ErrorCode(err) != tollgate.CodeSearchUnavailable {
		t.Fatalf("error %v, want search_unavailable", err)
	}
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if len(fb.progress) != 0 || len(fb.charges) != 0 || fb.release != 1 {
		t.Fatalf("progress records %d, charges %d, releases %d; want 0, 0, 1", len(fb.progress), len(fb.charges), fb.release)
	}
}

// A round of searches that ran after the answer began is recorded as soon
// as it ends, not at the backend's next chunk a second later: here the
// clock stands still, so only that record can carry the search.
func TestSearchStreamRecordsSearchesWhenTheyEnd(t *testing.T) {
	clock := newTestClock(0)
	r, sm, fb := searchRelay(t, &fakeSearcher{})
	r.now = clock.now
	w, err := serveSearchRequest(t, r, `{"model":"m","stream":true,"messages":[{"role":"user","content":"preface news"}],"web_search_options":{}}`)
	if err != nil {
		t.Fatal(err)
	}
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if len(fb.progress) != 2 || len(sm.usages) != 2 {
		t.Fatalf("%d progress records over %d model calls, want 2 and 2: %+v\n%s", len(fb.progress), len(sm.usages), fb.progress, w.Body.String())
	}
	u1 := sm.usages[0]
	if rec := fb.progress[1]; rec.Searches != 1 || rec.PromptTokens != int64(u1[0]) || rec.CompletionTokens != int64(u1[1]) || rec.Cost != wantCost(t, rec) {
		t.Fatalf("the record after the search %+v: want the first call's usage %v and its search", rec, u1)
	}
}
