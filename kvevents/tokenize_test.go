package kvevents_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/kvevents"
	"github.com/tollgate/tollgate/simulate"
)

func fields(m map[string]string) func(string) []byte {
	return func(k string) []byte {
		if v, ok := m[k]; ok {
			return []byte(v)
		}
		return nil
	}
}

func newTokenizer(t *testing.T, url string, timeout time.Duration) *kvevents.Tokenizer {
	t.Helper()
	tok, err := kvevents.NewTokenizer(kvevents.TokenizerOptions{URL: url, Key: "k", Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tok.Close)
	return tok
}

// The chat form sent to a (simulated) vLLM: the request's messages, tools
// and rendering fields, vLLM's defaults otherwise; the ids come back as
// the server's tokenizer reads the prompt, and a prompt asked again is
// answered from the cache.
func TestTokenizerAsksTheChatForm(t *testing.T) {
	sim := simulate.New(simulate.Config{Flavour: simulate.VLLM, Models: []string{"served"}})
	ts := httptest.NewServer(sim)
	defer ts.Close()
	tok := newTokenizer(t, ts.URL+"/tokenize", 5*time.Second)
	msgs := `[{"role":"user","content":"what is in the cache?"}]`
	tools := `[{"type":"function","function":{"name":"lookup"}}]`
	req := fields(map[string]string{"messages": msgs, "tools": tools, "chat_template_kwargs": `{"enable_thinking":false}`})
	ids, err := tok.Tokenize(context.Background(), "served", req)
	if err != nil {
		t.Fatal(err)
	}
	prompt := tools + msgs
	if len(ids) != len(prompt)/4 || ids[0] != binary.LittleEndian.Uint32([]byte(prompt)) {
		t.Fatalf("%d ids, want %d", len(ids), len(prompt)/4)
	}
	all := sim.AllRequests()
	if len(all) != 1 || all[0].Path != "/tokenize" || all[0].Header.Get("Authorization") != "Bearer k" {
		t.Fatalf("requests %+v", all)
	}
	want := `{"model":"served","messages":` + msgs + `,"tools":` + tools +
		`,"add_generation_prompt":true,"chat_template_kwargs":{"enable_thinking":false},"add_special_tokens":false}`
	if string(all[0].Body) != want {
		t.Fatalf("body\n%s\nwant\n%s", all[0].Body, want)
	}
	if _, err := tok.Tokenize(context.Background(), "served", req); err != nil || len(sim.AllRequests()) != 1 {
		t.Fatalf("asked again for the same prompt (%v, %d requests)", err, len(sim.AllRequests()))
	}
	if st := tok.Stats(); st.Asked != 1 || st.Answered != 1 || st.Failed != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// A render field the client set is sent as it is, in place of the default.
func TestTokenizerSendsTheClientsRenderFields(t *testing.T) {
	sim := simulate.New(simulate.Config{Flavour: simulate.VLLM, Models: []string{"served"}})
	ts := httptest.NewServer(sim)
	defer ts.Close()
	tok := newTokenizer(t, ts.URL+"/tokenize", 5*time.Second)
	msgs := `[{"role":"assistant","content":"the cache holds"}]`
	req := fields(map[string]string{"messages": msgs, "tools": "null",
		"add_generation_prompt": "false", "continue_final_message": "true"})
	if _, err := tok.Tokenize(context.Background(), "served", req); err != nil {
		t.Fatal(err)
	}
	want := `{"model":"served","messages":` + msgs +
		`,"add_generation_prompt":false,"continue_final_message":true,"add_special_tokens":false}`
	if all := sim.AllRequests(); len(all) != 1 || string(all[0].Body) != want {
		t.Fatalf("requests %+v\nwant body\n%s", all, want)
	}
}

// A node that does not answer within the timeout fails the call (the
// request is routed by the approximate index) and is asked again next time.
func TestTokenizerTimesOut(t *testing.T) {
	release := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer ts.Close()
	defer close(release)
	tok := newTokenizer(t, ts.URL+"/tokenize", 50*time.Millisecond)
	req := fields(map[string]string{"messages": `[]`})
	if _, err := tok.Tokenize(context.Background(), "m", req); !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "deadline") && !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("err %v, want a timeout", err)
	}
	if !tok.Usable(time.Now().UnixNano()) {
		t.Fatal("backed off after a timeout")
	}
	if st := tok.Stats(); st.Asked != 1 || st.Failed != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// A node without the chat form (here: a vLLM that does not know the model
// name, 404) is backed off after three refusals and not asked meanwhile.
func TestTokenizerBacksOffANodeThatRefuses(t *testing.T) {
	sim := simulate.New(simulate.Config{Flavour: simulate.VLLM, Models: []string{"served"}})
	ts := httptest.NewServer(sim)
	defer ts.Close()
	tok := newTokenizer(t, ts.URL+"/tokenize", 5*time.Second)
	for i := 0; i < 3; i++ {
		req := fields(map[string]string{"messages": `[{"role":"user","content":"` + strings.Repeat("x", i) + `"}]`})
		if _, err := tok.Tokenize(context.Background(), "unknown", req); !errors.Is(err, kvevents.ErrUnsupported) {
			t.Fatalf("call %d: %v, want ErrUnsupported", i, err)
		}
	}
	if tok.Usable(time.Now().UnixNano()) {
		t.Fatal("still asked after three refusals")
	}
	if !tok.Usable(time.Now().Add(2 * time.Minute).UnixNano()) {
		t.Fatal("backed off for good")
	}
	if _, err := tok.Tokenize(context.Background(), "unknown", fields(map[string]string{"messages": `[]`})); !errors.Is(err, kvevents.ErrUnsupported) {
		t.Fatalf("backed off: %v", err)
	}
	if n := len(sim.AllRequests()); n != 3 {
		t.Fatalf("%d requests, want 3 (none while backed off)", n)
	}
	// Another kind of failure (a 500) is not a refusal.
	sim2 := simulate.New(simulate.Config{Flavour: simulate.VLLM, Models: []string{"served"}, Behaviour: simulate.Behaviour{Fault: simulate.Fault500}})
	ts2 := httptest.NewServer(sim2)
	defer ts2.Close()
	tok2 := newTokenizer(t, ts2.URL+"/tokenize", 5*time.Second)
	for i := 0; i < 5; i++ {
		if _, err := tok2.Tokenize(context.Background(), "served", fields(map[string]string{"messages": `[]`})); err == nil || errors.Is(err, kvevents.ErrUnsupported) {
			t.Fatalf("500: %v", err)
		}
	}
	if !tok2.Usable(time.Now().UnixNano()) {
		t.Fatal("backed off after 500s")
	}
}

// Answers that are not token ids are errors, not ids.
func TestTokenizerRejectsBadAnswers(t *testing.T) {
	for _, answer := range []string{`{"count":1}`, `{"tokens":[1,-2]}`, `{"tokens":[4294967296]}`, `{"tokens":"x"}`, `{"tokens":[1,]}`, `not json`} {
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(answer)) }))
		tok := newTokenizer(t, ts.URL+"/tokenize", 5*time.Second)
		if ids, err := tok.Tokenize(context.Background(), "m", fields(map[string]string{"messages": `[]`})); err == nil {
			t.Errorf("%s: ids %v", answer, ids)
		}
		ts.Close()
	}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"count":3,"max_model_len":8,"tokens":[ 0, 7 ,4294967295],"token_strs":null}`))
	}))
	defer ts.Close()
	ids, err := newTokenizer(t, ts.URL+"/tokenize", 5*time.Second).Tokenize(context.Background(), "m", fields(map[string]string{"messages": `[]`}))
	if err != nil || len(ids) != 3 || ids[2] != 4294967295 {
		t.Fatalf("%v %v", ids, err)
	}
}

// BenchmarkTokenize100KB is tollgate's side of a /tokenize call for a 100
// KB conversation (25,000 ids of a real vocabulary's size) over loopback:
// the request written, the answer read and parsed; the node answers at
// once (a real node's tokenizing comes on top). A fresh prompt each time:
// no cache.
func BenchmarkTokenize100KB(b *testing.B) {
	answer := []byte(`{"count":25000,"max_model_len":131072,"tokens":[`)
	for i := 0; i < 25000; i++ {
		if i > 0 {
			answer = append(answer, ',')
		}
		answer = strconv.AppendInt(answer, int64(i*7919%151643), 10)
	}
	answer = append(answer, `],"token_strs":null}`...)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Write(answer)
	}))
	defer ts.Close()
	tok, err := kvevents.NewTokenizer(kvevents.TokenizerOptions{URL: ts.URL + "/tokenize", Timeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer tok.Close()
	msgs := []byte(`[{"role":"user","content":"` + strings.Repeat("the conversation so far, ", 4000) + `"}]`)
	b.SetBytes(int64(len(msgs)))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		m := append([]byte(fmt.Sprintf(`[{"role":"system","content":"%d"},`, i)), msgs[1:]...)
		ids, err := tok.Tokenize(context.Background(), "m", fields(map[string]string{"messages": string(m)}))
		if err != nil || len(ids) != 25000 {
			b.Fatal(len(ids), err)
		}
	}
}
