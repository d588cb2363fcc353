package relay

import (
	"context"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/openai"
	"github.com/tollgate/tollgate/routing"
)

// A reload that keeps a node keeps its index; a node removed or replaced
// takes its index with it, and routing never sees a stale one.
func TestPrefixIndexAcrossReloads(t *testing.T) {
	spec := func(nodes ...NodeSpec) CatalogSpec { return catalog(netModel("m", "up", 100000, 100, 0, nodes...)) }
	a := NodeSpec{Name: "a", URL: "http://10.0.0.1:8000/v1"}
	b := NodeSpec{Name: "b", URL: "http://10.0.0.2:8000/v1"}
	c := NodeSpec{Name: "c", URL: "http://10.0.0.3:8000/v1"}
	cat := NewCatalog(spec(a, b), nil)
	if cat.Models[0].Backends[0].Routing != routing.PrefixCache {
		t.Fatalf("routing %q", cat.Models[0].Backends[0].Routing)
	}
	r := New(cat, Options{}, Deps{})
	// Two turns of a conversation, the second question pending.
	cr, err := openai.ParseChatRequest([]byte(`{"model":"m","messages":[{"role":"system","content":"reload"},` +
		`{"role":"user","content":"question 0 ` + strings.Repeat("q", 800) + `"},` +
		`{"role":"assistant","content":"answer 0 ` + strings.Repeat("a", 800) + `"},` +
		`{"role":"user","content":"question 1 ` + strings.Repeat("q", 800) + `"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	route := func() *Node {
		t.Helper()
		m, _ := r.Catalog().Lookup("m")
		var pr prefixRoute
		_, n, err := r.picker.Route(m.ID, m.Backends, nil, r.picker.Start(context.Background(), &pr, m.ID, m.Backends, cr, r.now()))
		pr.Done()
		if err != nil {
			t.Fatal(err)
		}
		n.Release()
		return n
	}
	first := route()
	held, _ := first.IndexSize()
	if held == 0 {
		t.Fatal("nothing recorded")
	}
	// A reload that keeps the holder: same node, same index, same route.
	r.SetCatalog(NewCatalog(spec(a, b), r.Catalog()))
	if n, _ := first.IndexSize(); n != held {
		t.Fatalf("kept node's index %d blocks, was %d", n, held)
	}
	if n := route(); n != first {
		t.Fatalf("after a reload that kept %s the turn went to %s", first.Name, n.Name)
	}
	// The holder's settings change (a new node object, an empty index) and
	// c is added: the old node is never routed to again.
	changed := map[string]NodeSpec{"a": a, "b": b}
	ch := changed[first.Name]
	ch.MaxConcurrent = 3
	changed[first.Name] = ch
	r.SetCatalog(NewCatalog(spec(changed["a"], changed["b"], c), r.Catalog()))
	again := route()
	if again == first {
		t.Fatal("the replaced node is still routed to")
	}
	// Remove the node holding the conversation: routing goes elsewhere,
	// and the stats count the blocks of the nodes in the catalogue only.
	holder := again.Name
	var keep []NodeSpec
	for _, n := range []NodeSpec{a, b, c} {
		if n.Name != holder {
			keep = append(keep, n)
		}
	}
	r.SetCatalog(NewCatalog(spec(keep...), r.Catalog()))
	before := r.PrefixStats().IndexBlocks
	if n := route(); n.Name == holder {
		t.Fatalf("routed to removed node %s", holder)
	}
	if after := r.PrefixStats(); after.IndexBlocks <= before {
		t.Fatalf("index blocks %d then %d: the new holder did not record", before, after.IndexBlocks)
	}
}
