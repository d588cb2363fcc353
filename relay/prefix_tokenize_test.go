package relay

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/kvevents"
	"github.com/tollgate/tollgate/openai"
	"github.com/tollgate/tollgate/simulate"
)

// kvFleet is three simulated vLLM nodes with a prefix cache publishing
// their KV-cache events, behind one relay (real HTTP and ZMQ on loopback).
type kvFleet struct {
	sims  []*simulate.Server
	names []string
	r     *Relay
}

// newKVFleet starts the nodes; wrap, when set, stands in front of node i's
// HTTP server.
func newKVFleet(t *testing.T, wrap func(i int, h http.Handler) http.Handler) *kvFleet {
	t.Helper()
	f := &kvFleet{}
	var specs []NodeSpec
	for i := 0; i < 3; i++ {
		sim := simulate.New(simulate.Config{Flavour: simulate.VLLM, Models: []string{"up"}, ContextLength: 100000,
			GPU: simulate.GPU{PrefixCacheTokens: 200000}})
		pub, err := sim.PublishKVEvents("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pub.Close)
		var h http.Handler = sim
		if wrap != nil {
			h = wrap(i, sim)
		}
		ts := httptest.NewServer(h)
		t.Cleanup(ts.Close)
		name := fmt.Sprint("n", i)
		f.sims, f.names = append(f.sims, sim), append(f.names, name)
		specs = append(specs, NodeSpec{Name: name, URL: ts.URL + "/v1", KVEvents: pub.PubAddr(), KVEventsReplay: pub.ReplayAddr()})
	}
	f.r = New(NewCatalog(catalog(netModel("m", "up", 100000, 100, 0, specs...)), nil), Options{}, Deps{})
	t.Cleanup(f.r.Close)
	// A PUB socket drops what it sends before a subscriber joins: prompts
	// straight to each node until every subscriber has heard one.
	for i := 0; f.r.PrefixStats().EventsLive < 3; i++ {
		if i == 300 {
			t.Fatalf("%d of 3 nodes heard", f.r.PrefixStats().EventsLive)
		}
		for _, sim := range f.sims {
			askSim(t, sim, fmt.Sprintf(`[{"role":"user","content":"warm-up %d %s"}]`, i, strings.Repeat("w", 100)))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return f
}

// kvTurn is conversation c's turn (1-based): a shared system prompt, then
// questions and answers of a few hundred bytes.
func kvTurn(c, turn int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `[{"role":"system","content":"You are a gateway's support assistant. %s"}`, strings.Repeat("Be brief. ", 40))
	for i := 0; i < turn; i++ {
		fmt.Fprintf(&b, `,{"role":"user","content":"conversation %d question %d %s"}`, c, i, strings.Repeat("q", 300))
		if i < turn-1 {
			fmt.Fprintf(&b, `,{"role":"assistant","content":"answer %d %s"}`, i, strings.Repeat("a", 300))
		}
	}
	b.WriteByte(']')
	return []byte(b.String())
}

// askSim sends a chat request to a node directly (not through tollgate).
func askSim(t *testing.T, sim *simulate.Server, msgs string) {
	t.Helper()
	w := httptest.NewRecorder()
	sim.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"up","max_tokens":1,"messages":`+msgs+`}`)))
	if w.Code != 200 {
		t.Fatalf("node answered %d: %s", w.Code, w.Body)
	}
}

// ask sends a chat request through the relay and returns the node that
// served it.
func (f *kvFleet) ask(t *testing.T, msgs []byte) int {
	t.Helper()
	w := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	if err := f.r.ServeChat(w, req, &Call{RequestID: "r", Body: []byte(`{"model":"m","max_tokens":1,"messages":` + string(msgs) + `}`)}); err != nil || w.Code != 200 {
		t.Fatalf("%v %d %s", err, w.Code, w.Body)
	}
	for i, name := range f.names {
		if w.Header().Get("X-Tollgate-Node") == name {
			return i
		}
	}
	t.Fatalf("served by %q", w.Header().Get("X-Tollgate-Node"))
	return -1
}

// tokenizeCalls counts the /tokenize requests the nodes got.
func (f *kvFleet) tokenizeCalls() int {
	n := 0
	for _, sim := range f.sims {
		for _, rec := range sim.AllRequests() {
			if rec.Path == "/tokenize" {
				n++
			}
		}
	}
	return n
}

// waitEvents waits until the relay's view of the nodes' events holds what
// their caches hold.
func (f *kvFleet) waitEvents(t *testing.T) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		want := 0
		for _, sim := range f.sims {
			want += sim.CacheStats().Blocks
		}
		if int(f.r.PrefixStats().EventBlocks) == want {
			return
		}
	}
	t.Fatal("the events never caught up with the caches")
}

// A conversation's next turn goes to the node whose events say it holds
// the conversation, by the token ids the nodes' /tokenize gives: its home
// emptied its cache and another node served the last turn (as another
// tollgate instance may have sent it there).
func TestPrefixRoutingMatchesEventsThroughTokenize(t *testing.T) {
	f := newKVFleet(t, nil)
	home := f.ask(t, kvTurn(7, 1))
	other := (home + 1) % 3
	askSim(t, f.sims[other], string(kvTurn(7, 2)))
	f.sims[home].ClearCache()
	f.waitEvents(t)
	calls := f.tokenizeCalls()
	if calls != 0 {
		t.Fatalf("%d /tokenize calls for a conversation's opening (no node can hold more of it)", calls)
	}
	if got := f.ask(t, kvTurn(7, 3)); got != other {
		t.Fatalf("turn 3 went to n%d; the node holding turn 2 by its events is n%d (home n%d)", got, other, home)
	}
	if got := f.tokenizeCalls(); got != calls+1 {
		t.Fatalf("%d /tokenize calls for one request", got-calls)
	}
	// The tokenize request is vLLM's chat form for the backend's model,
	// asked of the conversation's home (its first-ranked node).
	var body string
	for i, sim := range f.sims {
		for _, rec := range sim.AllRequests() {
			if rec.Path == "/tokenize" {
				body = string(rec.Body)
				if i != home {
					t.Fatalf("/tokenize asked of n%d, the conversation's home is n%d", i, home)
				}
			}
		}
	}
	if !strings.HasPrefix(body, `{"model":"up","messages":[`) || !strings.HasSuffix(body, `"add_generation_prompt":true,"add_special_tokens":false}`) {
		t.Fatalf("tokenize body %s", body)
	}
	if st := f.r.PrefixStats(); st.Hits == 0 || st.Tokenized != 1 || st.TokenizeFailed != 0 {
		t.Fatalf("stats %+v, want 1 prompt tokenized (turn 3)", st)
	}
	if m := f.r.PrefixMetrics(); m.Tokenized != 1 || m.TokenizeFailed != 0 {
		t.Errorf("metrics: %d tokenized, %d failed", m.Tokenized, m.TokenizeFailed)
	}
}

// Nodes whose /tokenize is missing (a vLLM too old for its chat form; here
// 404) are routed by the approximate index: the same turn goes to the home,
// which this instance's index says served the conversation, and after
// three refusals a node is not asked.
func TestPrefixRoutingWithoutTokenizeUsesTheIndex(t *testing.T) {
	var asked [3]atomic.Int64
	f := newKVFleet(t, func(i int, h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/tokenize" {
				asked[i].Add(1)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusNotFound)
				w.Write([]byte(`{"detail":"Not Found"}`))
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	home := f.ask(t, kvTurn(7, 1))
	if got := f.ask(t, kvTurn(7, 2)); got != home {
		t.Fatalf("turn 2 went to n%d, turn 1 to n%d", got, home)
	}
	other := (home + 1) % 3
	askSim(t, f.sims[other], string(kvTurn(7, 3)))
	f.sims[home].ClearCache()
	f.waitEvents(t)
	if got := f.ask(t, kvTurn(7, 4)); got != home {
		t.Fatalf("turn 4 went to n%d; without token ids the index's home n%d takes it", got, home)
	}
	// Each node is asked three times, then backed off (the next is asked).
	for c := 0; c < 10; c++ {
		f.ask(t, kvTurn(20+c, 2))
	}
	for i := range asked {
		if n := asked[i].Load(); n != 3 {
			t.Fatalf("refusing node n%d was asked %d times, want 3", i, n)
		}
	}
	// Backed off, the nodes are judged by the index, heard or not.
	if st := f.r.PrefixStats(); st.Tokenized != 0 || st.TokenizeFailed != 9 || st.EventsLive != 0 {
		t.Fatalf("stats %+v", st)
	}
	if m := f.r.PrefixMetrics(); m.Tokenized != 0 || m.TokenizeFailed != 9 {
		t.Errorf("metrics: %d tokenized, %d failed", m.Tokenized, m.TokenizeFailed)
	}
}

// The added time on the request path: routing a 100 KB conversation over
// three simulated vLLM nodes with events, tokenized by a node's /tokenize
// (a fresh prompt each time: no cache), against the same without events.
func BenchmarkPrefixRouteTokenize100KB(b *testing.B) {
	for _, kv := range []bool{false, true} {
		b.Run(fmt.Sprint("kv=", kv), func(b *testing.B) {
			var specs []NodeSpec
			var pubs []*kvevents.Publisher
			for i := 0; i < 3; i++ {
				sim := simulate.New(simulate.Config{Flavour: simulate.VLLM, Models: []string{"up"}, ContextLength: 1 << 20})
				ts := httptest.NewServer(sim)
				defer ts.Close()
				spec := NodeSpec{Name: fmt.Sprint("n", i), URL: ts.URL + "/v1"}
				if kv {
					pub, err := kvevents.Publish(kvevents.PublisherOptions{Endpoint: "tcp://127.0.0.1:0"})
					if err != nil {
						b.Fatal(err)
					}
					defer pub.Close()
					spec.KVEvents = pub.PubAddr()
					pubs = append(pubs, pub)
				}
				specs = append(specs, spec)
			}
			r := New(NewCatalog(catalog(netModel("m", "up", 1<<20, 100, 0, specs...)), nil), Options{}, Deps{})
			defer r.Close()
			// The nodes are heard (an event every 100 ms), so their /tokenize is asked.
			stop := make(chan struct{})
			defer close(stop)
			go func() {
				for {
					for _, p := range pubs {
						p.Send(kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: []uint64{1}})
					}
					select {
					case <-stop:
						return
					case <-time.After(100 * time.Millisecond):
					}
				}
			}()
			for kv && r.PrefixStats().EventsLive < 3 {
				time.Sleep(10 * time.Millisecond)
			}
			m, _ := r.Catalog().Lookup("m")
			base := []byte(`[{"role":"system","content":"bench"},{"role":"user","content":"` + strings.Repeat("the conversation so far, ", 4000) + `"}]`) // 100 KB
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				cr, err := openai.ParseChatRequest([]byte(`{"model":"m","messages":` + fmt.Sprintf(`[{"role":"user","content":"%d"},`, i) + string(base[1:]) + `}`))
				if err != nil {
					b.Fatal(err)
				}
				var pr prefixRoute
				_, n, err := r.picker.Route(m.ID, m.Backends, nil, r.picker.Start(context.Background(), &pr, m.ID, m.Backends, cr, r.now()))
				pr.Done()
				if err != nil {
					b.Fatal(err)
				}
				n.Release()
			}
			if st := r.PrefixStats(); kv && st.Tokenized < int64(i) {
				b.Fatalf("%d of %d prompts tokenized", st.Tokenized, i)
			}
		})
	}
}

// Nodes whose events are not heard (silent since tollgate subscribed) are
// judged by the index: their /tokenize is not asked.
func TestPrefixRoutingAsksNoTokenizeWhileNoEventIsHeard(t *testing.T) {
	sim := simulate.New(simulate.Config{Flavour: simulate.VLLM, Models: []string{"up"}, ContextLength: 100000})
	ts := httptest.NewServer(sim)
	defer ts.Close()
	pub, err := kvevents.Publish(kvevents.PublisherOptions{Endpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	r := New(NewCatalog(catalog(netModel("m", "up", 100000, 100, 0, NodeSpec{Name: "n0", URL: ts.URL + "/v1", KVEvents: pub.PubAddr()})), nil), Options{}, Deps{})
	defer r.Close()
	f := &kvFleet{sims: []*simulate.Server{sim}, names: []string{"n0"}, r: r}
	f.ask(t, kvTurn(3, 2))
	if n := f.tokenizeCalls(); n != 0 || r.PrefixStats().EventsLive != 0 {
		t.Fatalf("%d /tokenize calls with no event heard", n)
	}
}
