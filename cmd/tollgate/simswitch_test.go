package main

import (
	"testing"
)

// A simulated server's per-request switches reach it through tollgate only
// as a [sim ...] marker in the last user message (part of the body, which
// tollgate forwards): tollgate sends a backend its own headers, never the
// client's, so an X-Sim header stops at tollgate (docs/simulator.md,
// "Per-request switches").
func TestSimSwitchesThroughTollgate(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	status, _, b := h.post("/v1/chat/completions", `{"model":"flav-vllm","messages":[{"role":"user","content":"hi"}]}`,
		map[string]string{"X-Sim": "fault=500", "X-Sim-Fault": "500"})
	if status != 200 {
		t.Errorf("with X-Sim: fault=500 sent to tollgate: %d %s, want 200 (the header does not reach the simulator)", status, b)
	}
	rec, ok := h.sim("vllm").LastRequest()
	if !ok {
		t.Fatal("the simulator recorded no request")
	}
	for k := range rec.Header {
		if k == "X-Sim" || k == "X-Sim-Fault" {
			t.Errorf("tollgate forwarded the client's %s header", k)
		}
	}
	status, _, b = h.post("/v1/chat/completions", `{"model":"flav-vllm","messages":[{"role":"user","content":"hi [sim fault=500]"}]}`, nil)
	expectError(t, status, b, 502, "upstream_error", "")
}
