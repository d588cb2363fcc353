package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

func userMsg(text string) []openai.ChatCompletionMessageParamUnion {
	return []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("You are terse."), openai.UserMessage(text)}
}

// Every flavour, non-streamed, through the official Go client: the answer
// has the catalogue id, tollgate's id, a consistent usage, and the headers
// saying who served it and what it cost.
func TestEveryFlavourNonStreamed(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, f := range flavourSims {
		t.Run(string(f), func(t *testing.T) {
			var resp *http.Response
			c, err := h.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
				Model:    "flav-" + string(f),
				Messages: userMsg("Say hello."),
			}, option.WithResponseInto(&resp))
			if err != nil {
				t.Fatalf("chat: %v", err)
			}
			if c.Model != "flav-"+string(f) {
				t.Errorf("model = %q, want the catalogue id", c.Model)
			}
			if !strings.HasPrefix(c.ID, "chatcmpl-req_") || c.Object != "chat.completion" {
				t.Errorf("id/object = %q/%q", c.ID, c.Object)
			}
			if len(c.Choices) != 1 || c.Choices[0].Message.Content == "" || c.Choices[0].FinishReason == "" {
				t.Fatalf("choices = %+v", c.Choices)
			}
			u := c.Usage
			if u.PromptTokens <= 0 || u.CompletionTokens <= 0 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
				t.Errorf("usage = %+v", u)
			}
			if got := resp.Header.Get("X-Tollgate-Backend"); got == "" {
				t.Error("no X-Tollgate-Backend header")
			}
			if resp.Header.Get("X-Request-Id") == "" || resp.Header.Get("X-Tollgate-Cost") == "" {
				t.Errorf("missing X-Request-Id or X-Tollgate-Cost: %v", resp.Header)
			}
			var raw map[string]json.RawMessage
			if err := json.Unmarshal([]byte(c.RawJSON()), &raw); err != nil {
				t.Fatal(err)
			}
			for _, leak := range []string{"system_fingerprint", "timings", "provider"} {
				if _, ok := raw[leak]; ok {
					t.Errorf("backend field %q leaked to the client", leak)
				}
			}
			var usage struct {
				Cost string `json:"cost"`
			}
			_ = json.Unmarshal(raw["usage"], &usage)
			if usage.Cost != resp.Header.Get("X-Tollgate-Cost") {
				t.Errorf("usage.cost %q != header %q", usage.Cost, resp.Header.Get("X-Tollgate-Cost"))
			}
			// The simulator saw the backend's own model name, never the catalogue id.
			rec, ok := h.sim(string(f)).LastRequest()
			if !ok || !strings.Contains(string(rec.Body), `"model":"up-`+string(f)+`"`) {
				t.Errorf("upstream body = %s", rec.Body)
			}
		})
	}
}

// Every flavour streamed without stream_options: exactly one usage chunk,
// at the end, and the accumulator of the official client agrees.
func TestEveryFlavourStreamedUsageWithoutAsking(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, f := range flavourSims {
		t.Run(string(f), func(t *testing.T) {
			stream := h.client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
				Model:    "flav-" + string(f),
				Messages: userMsg("Say hello."),
			})
			acc := openai.ChatCompletionAccumulator{}
			usageChunks, chunks := 0, 0
			for stream.Next() {
				ch := stream.Current()
				chunks++
				if !acc.AddChunk(ch) {
					t.Fatalf("accumulator rejected chunk %d: %s", chunks, ch.RawJSON())
				}
				if ch.Model != "flav-"+string(f) {
					t.Errorf("chunk model = %q", ch.Model)
				}
				if ch.JSON.Usage.Valid() && ch.Usage.TotalTokens > 0 {
					usageChunks++
					if len(ch.Choices) != 0 {
						t.Errorf("usage chunk has choices: %s", ch.RawJSON())
					}
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("stream: %v", err)
			}
			if usageChunks != 1 {
				t.Errorf("usage chunks = %d, want exactly 1", usageChunks)
			}
			if acc.Usage.TotalTokens == 0 || acc.Usage.TotalTokens != acc.Usage.PromptTokens+acc.Usage.CompletionTokens {
				t.Errorf("accumulated usage = %+v", acc.Usage)
			}
			if len(acc.Choices) != 1 || acc.Choices[0].Message.Content == "" {
				t.Errorf("accumulated choices = %+v", acc.Choices)
			}
			// tollgate asked the backend for usage itself.
			rec, _ := h.sim(string(f)).LastRequest()
			if !strings.Contains(string(rec.Body), `"include_usage":true`) {
				t.Errorf("upstream body did not ask for usage: %s", rec.Body)
			}
		})
	}
}

var weatherTool = openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{
	Name:        "get_weather",
	Description: openai.String("Get the weather for a city"),
	Parameters: openai.FunctionParameters{
		"type": "object",
		"properties": map[string]any{
			"city": map[string]any{"type": "string"},
		},
		"required": []string{"city"},
	},
})

// Tool calls stream in pieces (vLLM) and whole (Ollama-style flavours); the
// client reassembles valid JSON arguments either way.
func TestToolCallsStreamed(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, f := range []string{"vllm", "llamacpp", "openrouter", "sglang"} {
		t.Run(f, func(t *testing.T) {
			stream := h.client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
				Model:    "flav-" + f,
				Messages: userMsg("Weather in Paris? [sim tools=1]"),
				Tools:    []openai.ChatCompletionToolUnionParam{weatherTool},
			})
			acc := openai.ChatCompletionAccumulator{}
			pieces := 0
			for stream.Next() {
				ch := stream.Current()
				acc.AddChunk(ch)
				if len(ch.Choices) > 0 && len(ch.Choices[0].Delta.ToolCalls) > 0 {
					pieces++
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("stream: %v", err)
			}
			if len(acc.Choices) != 1 || len(acc.Choices[0].Message.ToolCalls) != 1 {
				t.Fatalf("tool calls = %+v", acc.Choices)
			}
			tc := acc.Choices[0].Message.ToolCalls[0]
			var args map[string]any
			if tc.Function.Name != "get_weather" || json.Unmarshal([]byte(tc.Function.Arguments), &args) != nil || tc.ID == "" {
				t.Errorf("tool call = %+v", tc)
			}
			if acc.Choices[0].FinishReason != "tool_calls" {
				t.Errorf("finish_reason = %q", acc.Choices[0].FinishReason)
			}
			if f == "vllm" && pieces < 2 {
				t.Errorf("vLLM's tool call came in %d piece(s), want several", pieces)
			}
		})
	}
}

// Reasoning comes back as `reasoning` whatever the server calls it, and
// reasoning tokens are reported inside completion tokens.
func TestReasoningFieldNormalised(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, f := range []string{"llamacpp", "vllm", "sglang", "ollama"} {
		t.Run(f, func(t *testing.T) {
			c, err := h.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
				Model:           "flav-" + f,
				Messages:        userMsg("Think first. [sim reasoning=12]"),
				ReasoningEffort: openai.ReasoningEffortLow,
			})
			if err != nil {
				t.Fatalf("chat: %v", err)
			}
			msg := c.Choices[0].Message
			if _, ok := msg.JSON.ExtraFields["reasoning_content"]; ok {
				t.Errorf("reasoning_content reached the client: %s", msg.RawJSON())
			}
			r, ok := msg.JSON.ExtraFields["reasoning"]
			if !ok || len(r.Raw()) < 3 {
				t.Errorf("no reasoning field in %s", msg.RawJSON())
			}
			// Only SGLang reports reasoning tokens (top-level usage.reasoning_tokens,
			// moved where the protocol has it); the others leave them out and so do we.
			rt := c.Usage.CompletionTokensDetails.ReasoningTokens
			if f == "sglang" && (rt <= 0 || rt > c.Usage.CompletionTokens) {
				t.Errorf("reasoning tokens %d of completion %d", rt, c.Usage.CompletionTokens)
			}
			if f != "sglang" && c.Usage.JSON.CompletionTokensDetails.Valid() {
				t.Errorf("reasoning tokens invented for %s: %s", f, c.Usage.RawJSON())
			}
		})
	}
}

func TestCachedTokensReported(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	c, err := h.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:    "flav-vllm",
		Messages: userMsg("Repeat after me. [sim cached=16]"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Usage.PromptTokensDetails.CachedTokens != 16 {
		t.Errorf("cached tokens = %d, want 16 (%s)", c.Usage.PromptTokensDetails.CachedTokens, c.Usage.RawJSON())
	}
}

// A failure after the status was sent reaches the client as an error from
// the official client's stream, after a usage chunk.
func TestMidStreamFailureRaisesInClient(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, tc := range []struct{ flavour, fault string }{
		{"vllm", "cut"}, {"llamacpp", "stream_error"}, {"openrouter", "stream_error"}, {"sglang", "malformed"},
	} {
		t.Run(tc.flavour+"/"+tc.fault, func(t *testing.T) {
			stream := h.client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
				Model:    "flav-" + tc.flavour,
				Messages: userMsg("Go. [sim fault=" + tc.fault + " after=3 tokens=20]"),
			})
			sawUsage, content := false, ""
			for stream.Next() {
				ch := stream.Current()
				if ch.JSON.Usage.Valid() && ch.Usage.TotalTokens > 0 {
					sawUsage = true
				}
				if len(ch.Choices) > 0 {
					content += ch.Choices[0].Delta.Content
				}
			}
			err := stream.Err()
			if err == nil {
				t.Fatal("the client saw no error")
			}
			if !sawUsage {
				t.Error("no usage chunk before the error event")
			}
			if content == "" {
				t.Error("nothing was delivered before the failure")
			}
		})
	}
}

// A client that goes away mid-stream cancels the backend call at once.
func TestDisconnectCancelsBackend(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	sim := h.sim("vllm")
	ctx, cancel := context.WithCancel(context.Background())
	stream := h.client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:    "flav-vllm",
		Messages: userMsg("Talk slowly. [sim tokens=2000 gap=20ms]"),
	})
	if !stream.Next() {
		t.Fatalf("no first chunk: %v", stream.Err())
	}
	cancel()
	stream.Close()
	if err := sim.WaitStats(10*time.Second, func(s simStats) bool { return s.Cancelled >= 1 && s.OpenStreams == 0 }); err != nil {
		t.Fatalf("backend call not cancelled: %v (stats %+v)", err, sim.Stats())
	}
}

// Errors carry the envelope and the stable code; the official client maps
// the status to its exception type.
func TestClientSeesErrorCodes(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	_, err := h.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:    "no-such-model",
		Messages: userMsg("hi"),
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" || apiErr.Param != "model" {
		t.Fatalf("unknown model: %v", err)
	}
	_, err = h.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:    "tg-mini",
		Messages: userMsg("hi"),
		Tools:    []openai.ChatCompletionToolUnionParam{weatherTool},
	})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Code != "capability_not_supported" || apiErr.Param != "tools" {
		t.Fatalf("tools on tg-mini: %v", err)
	}
	bad := h.clientWith("sk-tg-00000000000000000000000000000000")
	_, err = bad.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model: "tg-chat", Messages: userMsg("hi"),
	})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || apiErr.Code != "invalid_api_key" {
		t.Fatalf("bad key: %v", err)
	}
}

// Streams and plain requests to a node reuse its keep-alive connection.
func TestUpstreamConnectionsReused(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for i := 0; i < 10; i++ {
		if status, _, b := h.post("/v1/chat/completions", `{"model":"flav-vllm","stream":true,`+hiMessages+`}`, nil); status != 200 {
			t.Fatalf("stream: %d %s", status, b)
		}
		if status, _, b := h.post("/v1/chat/completions", `{"model":"flav-vllm",`+hiMessages+`}`, nil); status != 200 {
			t.Fatalf("non-streamed: %d %s", status, b)
		}
	}
	found := false
	for _, n := range h.main.Relay.Catalog().Nodes() {
		if n.Name == "node-vllm" {
			found = true
			if n.Dials() != 1 {
				t.Fatalf("20 sequential requests opened %d connections to the node, want 1", n.Dials())
			}
		}
	}
	if !found {
		t.Fatal("no node named node-vllm in the catalogue")
	}
}
