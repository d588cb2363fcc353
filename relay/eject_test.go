package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/syncbuf"
	"github.com/tollgate/tollgate/routing"
	"github.com/tollgate/tollgate/simulate"
)

// Through the relay with simulated vLLM nodes: node a answers /health with
// 200 but fails every chat request with 500. It stops getting traffic while
// its probes keep succeeding, gets it again after the ejection, and when b
// fails too only one of the two is ejected.
func TestOutlierEjectsANodeThatPassesItsProbe(t *testing.T) {
	var aBad, bBad atomic.Bool
	var aChats, aProbes, bChats atomic.Int64
	faulty := func(bad *atomic.Bool, chats, probes *atomic.Int64) http.Handler {
		sim := simulate.New(simulate.Config{Flavour: simulate.VLLM, Models: []string{"up"}})
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/health" {
				if probes != nil {
					probes.Add(1)
				}
			} else {
				chats.Add(1)
				if bad.Load() {
					r.Header.Set("X-Sim-Fault", "500") // this request only: /health stays 200
				}
			}
			sim.ServeHTTP(w, r)
		})
	}
	a := httptest.NewServer(faulty(&aBad, &aChats, &aProbes))
	defer a.Close()
	b := httptest.NewServer(faulty(&bBad, &bChats, nil))
	defer b.Close()
	cat := catalog(netModel("m", "up", 1000, 100, 0, NodeSpec{Name: "a", URL: a.URL + "/v1"}, NodeSpec{Name: "b", URL: b.URL + "/v1"}))
	base := time.Second // long enough that a loaded machine ends no ejection early
	var logged syncbuf.Buffer
	r := New(NewCatalog(cat, nil), Options{Health: routing.HealthPolicy{FailureThreshold: 3, EjectionBase: base,
		EjectionMax: 10 * base, MinRequests: 1000}}, Deps{Log: slog.New(slog.NewTextHandler(&logged, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.RunHealthChecks(ctx, 10*time.Millisecond, time.Second)
	nodeA := r.Catalog().Models[0].Backends[0].Nodes[0]

	// call returns "ok" or the error code the client gets.
	call := func() string {
		w := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		c := &Call{RequestID: "r", Body: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)}
		if err := r.ServeChat(w, req, c); err != nil {
			var te *tollgate.Error
			if !errors.As(err, &te) {
				t.Fatalf("unexpected error %v", err)
			}
			return string(te.Code)
		}
		if w.Code != http.StatusOK {
			return fmt.Sprint(w.Code)
		}
		return "ok"
	}

	aBad.Store(true)
	for i := 0; i < 20; i++ {
		call()
	}
	if got := aChats.Load(); got != 3 {
		t.Fatalf("node a took %d chat requests, want 3 (the failures that eject it)", got)
	}
	if !nodeA.Ejected(time.Now()) {
		t.Fatal("node a not ejected")
	}
	// What the operator's console shows of both.
	if h := r.NodeHealth(nodeA); !h.Up || h.EjectedUntil.IsZero() || time.Until(h.EjectedUntil) > base {
		t.Errorf("node a's health = %+v, want up by its probes and ejected for at most %s", h, base)
	}
	if h := r.NodeHealth(r.Catalog().Models[0].Backends[0].Nodes[1]); !h.Up || !h.EjectedUntil.IsZero() ||
		h.Recent < 17 || h.RecentFailed != 0 || h.RequestsInARow != 0 || h.Window <= 0 {
		t.Errorf("node b's health = %+v, want up, not ejected, its 17 or more answers counted in the window, none failed", h)
	}
	if l := logged.String(); !strings.Contains(l, "node ejected") || !strings.Contains(l, "node=a") || !strings.Contains(l, "ejection_seconds=1 ") {
		t.Fatalf("the ejection was not logged: %s", l)
	}
	probesBefore := aProbes.Load()
	for i := 0; i < 20; i++ {
		if code := call(); code != "ok" {
			t.Fatalf("request %d while a is ejected: %s, want an answer from b", i, code)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if aProbes.Load() == probesBefore {
		t.Fatal("no probe of a ran during the test: the probe could not have reset anything")
	}
	if !nodeA.Ejected(time.Now()) || aChats.Load() != 3 {
		t.Fatalf("good probes brought a back: ejected %v, chats %d", nodeA.Ejected(time.Now()), aChats.Load())
	}

	// The ejection passes: a gets traffic again, fails three times, and is
	// out for twice the base.
	time.Sleep(base)
	for i := 0; i < 20; i++ {
		call()
	}
	if got := aChats.Load(); got != 6 {
		t.Fatalf("after the ejection node a took %d chat requests in all, want 6", got)
	}
	until := r.NodeHealth(nodeA).EjectedUntil
	if left := time.Until(until); left <= base || left > 2*base {
		t.Fatalf("second ejection ends in %s, want longer than the first (%s), at most %s", left, base, 2*base)
	}

	// b fails too: a is ejected, so b (half of two nodes) is not.
	bBad.Store(true)
	before := bChats.Load()
	for i := 0; i < 10; i++ {
		if code := call(); code == "ok" {
			t.Fatal("b's failure reached the client as a success")
		}
	}
	if got := bChats.Load() - before; got != 10 {
		t.Fatalf("b took %d of 10 requests while a is ejected, want all 10 (max 50%% ejected)", got)
	}
	if nodeB := r.Catalog().Models[0].Backends[0].Nodes[1]; nodeB.Ejected(time.Now()) {
		t.Fatal("both nodes of the backend ejected")
	}
}
