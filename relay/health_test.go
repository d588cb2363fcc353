package relay

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/routing"
)

// Health probes go through the nodes' own client (package upstream), as chat
// requests do: a GET of the health URL with the node's key, over a kept
// connection, and a non-2xx answer (llama.cpp's 503 while loading) is a
// failed probe.
func TestProbesUseTheNodesClient(t *testing.T) {
	var status atomic.Int64
	status.Store(200)
	var conns atomic.Int64
	var method, auth atomic.Value
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		method.Store(r.Method)
		auth.Store(r.Header.Get("Authorization"))
		w.WriteHeader(int(status.Load()))
		_, _ = w.Write([]byte(`{"status":"ok"}`))
	}))
	ts.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	ts.Start()
	defer ts.Close()
	n := &Node{Name: "n", BaseURL: ts.URL + "/v1", HealthURL: ts.URL + "/health", Key: "k1", Class: tollgate.ClassNetwork}
	r := New(&Catalog{Models: []*Model{{ID: "m", Backends: []*Backend{{Class: tollgate.ClassNetwork, Nodes: []*Node{n}}}}}},
		Options{Health: routing.HealthPolicy{FailureThreshold: 1, BackoffMin: time.Hour}}, Deps{})
	for range 3 {
		r.ProbeAll(context.Background(), time.Second)
	}
	if !n.Healthy() || method.Load() != "GET" || auth.Load() != "Bearer k1" {
		t.Fatalf("healthy %v, method %v, authorization %v", n.Healthy(), method.Load(), auth.Load())
	}
	if c := conns.Load(); c != 1 {
		t.Fatalf("three probes opened %d connections, want 1 (kept alive)", c)
	}
	status.Store(503)
	r.ProbeAll(context.Background(), time.Second)
	if n.Healthy() {
		t.Fatal("a 503 probe left the node healthy")
	}
}
