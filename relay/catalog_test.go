package relay

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/routing"
	"github.com/tollgate/tollgate/upstream"
)

// A config reload (SIGHUP) runs while requests use the nodes: building the
// new catalogue must not write to a node that requests are reading.
func TestReloadDoesNotWriteNodesInUse(t *testing.T) {
	spec := func(maxc int64) CatalogSpec {
		return catalog(netModel("m", "up", 1000, 100, 0, NodeSpec{Name: "n", URL: "http://10.0.0.1:8000/v1", MaxConcurrent: maxc}))
	}
	same, changed := spec(4), spec(8)
	cat := NewCatalog(same, nil)
	if got := cat.Models[0].ImageTokens; got != DefaultImageTokens {
		t.Fatalf("image_tokens of a model that does not set it: %d, want %d", got, DefaultImageTokens)
	}
	n := cat.Models[0].Backends[0].Nodes[0]
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var p routing.Picker[*Backend, *Node]
		for i := 0; i < 200; i++ {
			if _, n := p.Pick(cat.Models[0].Backends, tollgate.ClassNetwork, nil, nil); n != nil {
				_ = n.Flavour
				_ = n.HealthURL
				n.Release()
			}
		}
	}()
	for i := 0; i < 50; i++ {
		NewCatalog(same, cat)
		NewCatalog(changed, cat)
	}
	wg.Wait()
	if got := NewCatalog(changed, cat).Models[0].Backends[0].Nodes[0].MaxConcurrent; got != 8 {
		t.Fatalf("reloaded max_concurrent = %d, want 8", got)
	}
	if NewCatalog(same, cat).Models[0].Backends[0].Nodes[0] != n {
		t.Fatal("a reload with the same settings must keep the node (health, in-flight count)")
	}
}

// Swapping the catalogue closes the idle connections of nodes it dropped:
// the next request on the dropped node's client has to dial again.
func TestSetCatalogClosesDroppedNodesIdleConnections(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{}`)
	}))
	defer srv.Close()
	old := &Catalog{byID: map[string]*Model{}}
	n := &Node{Name: "a", BaseURL: srv.URL + "/v1", Class: "network"}
	old.Models = []*Model{{ID: "m", Backends: []*Backend{{Class: "network", Nodes: []*Node{n}}}}}
	r := New(old, Options{}, Deps{})
	p := r.h1For(n)
	post := func() {
		t.Helper()
		resp, err := p.Post(context.Background(), upstream.Head{RequestID: "x"}, []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	post()
	post()
	if d := p.Dials(); d != 1 {
		t.Fatalf("%d dials for two requests in turn, want 1: the idle connection is reused", d)
	}
	r.SetCatalog(&Catalog{byID: map[string]*Model{}})
	post()
	if d := p.Dials(); d != 2 {
		t.Fatalf("%d dials after the node was dropped, want 2: its idle connection was closed", d)
	}
}
