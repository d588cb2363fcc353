package main

import (
	"encoding/json"
	"io"
	"strings"
	"testing"
)

// A client's stream_options.continuous_usage_stats reaches vLLM and SGLang
// (which then put the running usage on their chunks); the client still gets
// the usage once, in the final chunk, as docs/streams.md says.
func TestContinuousUsageStatsThroughTheRelay(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, model := range []string{"flav-vllm", "flav-sglang"} {
		resp := h.openChat(`{"model":"` + model + `","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"messages":[{"role":"user","content":"hi"}]}`)
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("%s: %d %s", model, resp.StatusCode, b)
		}
		b, _ := io.ReadAll(resp.Body)
		var withUsage, chunks int
		var last struct {
			Choices []json.RawMessage `json:"choices"`
			Usage   *struct {
				Prompt     int64 `json:"prompt_tokens"`
				Completion int64 `json:"completion_tokens"`
				Total      int64 `json:"total_tokens"`
			} `json:"usage"`
		}
		for _, line := range strings.Split(string(b), "\n") {
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok || data == "[DONE]" {
				continue
			}
			chunks++
			last.Usage, last.Choices = nil, nil
			if err := json.Unmarshal([]byte(data), &last); err != nil {
				t.Fatalf("%s: %v: %s", model, err, data)
			}
			if last.Usage != nil {
				withUsage++
			}
		}
		if withUsage != 1 || last.Usage == nil || len(last.Choices) != 0 {
			t.Errorf("%s: %d of %d chunks carry usage, want only the last (choices: [])\n%s", model, withUsage, chunks, b)
			continue
		}
		if u := last.Usage; u.Completion < 1 || u.Total != u.Prompt+u.Completion {
			t.Errorf("%s: final usage %+v", model, *u)
		}
		rec, ok := h.sim(strings.TrimPrefix(model, "flav-")).LastRequest()
		if !ok || !strings.Contains(string(rec.Body), `"continuous_usage_stats":true`) {
			t.Errorf("%s: the backend did not get continuous_usage_stats: %s", model, rec.Body)
		}
	}
}
