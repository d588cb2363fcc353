package kvevents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/tollgate/tollgate/internal/jsonscan"
	"github.com/tollgate/tollgate/upstream"
)

// A node's KV-cache events name its blocks by token ids: the prompt as the
// model's chat template renders it and its tokenizer reads it. tollgate has
// neither, so it asks the node: vLLM serves POST /tokenize at its root,
// whose chat form ({"model", "messages", "tools", "add_generation_prompt":
// true, "add_special_tokens": false}, the chat completion's own defaults)
// answers {"count", "max_model_len", "tokens": [ids], "token_strs": null}
// with the ids the chat completion's prompt is made of, the ones its
// BlockStored events carry. The answer is keyed in the node's block size
// (Keys) and matched against each node's index.

// DefaultTokenizeTimeout bounds a /tokenize call on the request path: past
// it, the request is routed by the approximate index.
const DefaultTokenizeTimeout = 100 * time.Millisecond

// Back-off of a node that does not serve the chat form of /tokenize
// (404, 405, 501: a vLLM too old, a model name it does not know, or not a
// vLLM): after refusalsToBackOff such answers in a row it is not asked for
// tokenizeBackOff.
const (
	refusalsToBackOff = 3
	tokenizeBackOff   = time.Minute
)

// The answers kept, so a prompt sent again (a retry) is not tokenized
// twice: at most tokenCacheEntries prompts and tokenCacheTokens ids.
const (
	tokenCacheEntries = 64
	tokenCacheTokens  = 1 << 20
)

// maxTokenizeAnswer bounds the answer read (about 1.5 M token ids).
const maxTokenizeAnswer = 16 << 20

// ErrUnsupported is a node that does not serve the chat form of /tokenize
// (or is backed off after answering so).
var ErrUnsupported = errors.New("kvevents: the node does not serve the chat form of /tokenize")

// RenderFields are the chat request's fields besides messages and tools
// that change how vLLM renders the prompt; sent on when the client set them.
var RenderFields = []string{"add_generation_prompt", "continue_final_message", "chat_template", "chat_template_kwargs"}

// TokenizerOptions configure a Tokenizer.
type TokenizerOptions struct {
	URL     string        // the node's /tokenize, e.g. http://h:8000/tokenize
	Key     string        // the node's API key ("": none)
	Dialer  *net.Dialer   // nil: a default one
	Timeout time.Duration // 0: DefaultTokenizeTimeout
	Log     *slog.Logger
}

// Tokenizer asks one node for prompts' token ids. Safe for concurrent use.
type Tokenizer struct {
	o    TokenizerOptions
	pool *upstream.Pool
	auth string

	refusals atomic.Int32 // refusing answers in a row
	offUntil atomic.Int64 // unix ns: backed off until then
	warned   atomic.Bool

	asked, answered, failed atomic.Int64

	mu     sync.Mutex
	cache  map[uint64][]uint32
	ring   [tokenCacheEntries]uint64 // cache keys in arrival order
	next   int                       // ring's oldest slot
	tokens int                       // ids held in cache
}

// NewTokenizer returns the client for a node's /tokenize.
func NewTokenizer(o TokenizerOptions) (*Tokenizer, error) {
	if o.Dialer == nil {
		o.Dialer = &net.Dialer{Timeout: time.Second}
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTokenizeTimeout
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	p, err := upstream.NewPool(o.URL, o.Dialer)
	if err != nil {
		return nil, err
	}
	p.SetMaxIdle(64)
	t := &Tokenizer{o: o, pool: p, cache: map[uint64][]uint32{}}
	if o.Key != "" {
		t.auth = "Bearer " + o.Key
	}
	return t, nil
}

// Usable reports whether the node is asked now (not backed off).
func (t *Tokenizer) Usable(now int64) bool { return now >= t.offUntil.Load() }

// TokenizerStats count a Tokenizer's calls.
type TokenizerStats struct {
	Asked    int64 // calls made to the node
	Answered int64 // of which answered with token ids
	Failed   int64 // timed out, failed or refused
}

// Stats returns the counters.
func (t *Tokenizer) Stats() TokenizerStats {
	return TokenizerStats{Asked: t.asked.Load(), Answered: t.answered.Load(), Failed: t.failed.Load()}
}

// Close drops the idle connections.
func (t *Tokenizer) Close() { t.pool.CloseIdle() }

// Tokenize returns the token ids of the prompt of a chat request for model
// (the name the node serves it by), whose raw JSON fields field returns
// (nil: absent): messages, tools and RenderFields. The ids are shared:
// the caller must not change them. ErrUnsupported when the node does not
// serve the chat form (or is backed off); another error when it failed
// or did not answer within the timeout.
func (t *Tokenizer) Tokenize(ctx context.Context, model string, field func(string) []byte) ([]uint32, error) {
	bp := bodyBufs.Get().(*[]byte)
	defer bodyBufs.Put(bp)
	body := appendTokenizeBody((*bp)[:0], model, field)
	if cap(body) <= 1<<20 {
		*bp = body
	}
	key := xxhash.Sum64(body)
	t.mu.Lock()
	ids, ok := t.cache[key]
	t.mu.Unlock()
	if ok {
		return ids, nil
	}
	if !t.Usable(time.Now().UnixNano()) {
		return nil, ErrUnsupported
	}
	t.asked.Add(1)
	ids, err := t.call(ctx, body)
	if err != nil {
		t.failed.Add(1)
		return nil, err
	}
	t.answered.Add(1)
	t.keep(key, ids)
	return ids, nil
}

func (t *Tokenizer) call(ctx context.Context, body []byte) ([]uint32, error) {
	ctx, cancel := context.WithTimeout(ctx, t.o.Timeout)
	defer cancel()
	resp, err := t.pool.Post(ctx, upstream.Head{Authorization: t.auth}, body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case 200:
	case 404, 405, 501:
		t.refused(resp.StatusCode)
		return nil, ErrUnsupported
	default:
		return nil, fmt.Errorf("kvevents: /tokenize answered %d", resp.StatusCode)
	}
	if resp.ContentLength > maxTokenizeAnswer {
		return nil, errors.New("kvevents: /tokenize answer too large")
	}
	bp := answerBufs.Get().(*[]byte)
	defer answerBufs.Put(bp)
	b := *bp
	if n := int(resp.ContentLength); n > cap(b) {
		b = make([]byte, 0, n)
	}
	b, err = readAnswer(b[:0], resp.Body)
	if cap(b) <= 1<<20 {
		*bp = b
	}
	if err != nil {
		return nil, err
	}
	ids, err := parseTokenizeAnswer(b)
	if err != nil {
		return nil, err
	}
	t.refusals.Store(0)
	return ids, nil
}

var bodyBufs = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

var answerBufs = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

// readAnswer appends r's bytes to b, at most maxTokenizeAnswer.
func readAnswer(b []byte, r io.Reader) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if len(b) > maxTokenizeAnswer {
			return b, errors.New("kvevents: /tokenize answer too large")
		}
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// refused counts a refusing answer and backs the node off after
// refusalsToBackOff in a row (logged the first time).
func (t *Tokenizer) refused(status int) {
	if t.refusals.Add(1) < refusalsToBackOff {
		return
	}
	t.refusals.Store(0)
	t.offUntil.Store(time.Now().Add(tokenizeBackOff).UnixNano())
	level := slog.LevelDebug
	if t.warned.CompareAndSwap(false, true) {
		level = slog.LevelWarn
	}
	t.o.Log.Log(context.Background(), level, "kv events: the node does not serve the chat form of /tokenize; its KV-cache events are not matched, routing by the approximate index",
		"url", t.o.URL, "status", status, "retry_in", tokenizeBackOff)
}

// keep caches a prompt's ids, dropping the oldest past the bounds.
func (t *Tokenizer) keep(key uint64, ids []uint32) {
	if len(ids) > tokenCacheTokens/4 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.cache[key]; ok {
		return
	}
	for len(t.cache) > 0 && (len(t.cache) >= tokenCacheEntries || t.tokens+len(ids) > tokenCacheTokens) {
		old := t.ring[t.next]
		t.tokens -= len(t.cache[old])
		delete(t.cache, old)
		t.next = (t.next + 1) % tokenCacheEntries
	}
	slot := (t.next + len(t.cache)) % tokenCacheEntries
	t.ring[slot] = key
	t.cache[key] = ids
	t.tokens += len(ids)
}

// appendTokenizeBody writes the chat form of vLLM's tokenize request.
func appendTokenizeBody(b []byte, model string, field func(string) []byte) []byte {
	b = append(b, `{"model":`...)
	// json.Marshal, not openai's quoting: openai's tests import the
	// simulator, which imports this package.
	name, _ := json.Marshal(model) // a string always marshals
	b = append(b, name...)
	b = append(b, `,"messages":`...)
	if m := field("messages"); m != nil {
		b = append(b, m...)
	} else {
		b = append(b, "[]"...)
	}
	if tools := field("tools"); tools != nil && string(tools) != "null" {
		b = append(b, `,"tools":`...)
		b = append(b, tools...)
	}
	for _, name := range RenderFields {
		v := field(name)
		if v == nil {
			if name == "add_generation_prompt" {
				b = append(b, `,"add_generation_prompt":true`...)
			}
			continue
		}
		b = append(b, ',', '"')
		b = append(b, name...)
		b = append(b, '"', ':')
		b = append(b, v...)
	}
	return append(b, `,"add_special_tokens":false}`...)
}

// parseTokenizeAnswer reads the token ids of a /tokenize answer.
func parseTokenizeAnswer(b []byte) ([]uint32, error) {
	// Only tokens is read, and parseIDs checks it: the other members are
	// skipped by their brackets.
	it := jsonscan.NewTrustedObjIter(b)
	for {
		k, _, v, ok := it.Next()
		if !ok {
			if err := it.Err(); err != nil {
				return nil, fmt.Errorf("kvevents: /tokenize answer: %w", err)
			}
			return nil, errors.New("kvevents: /tokenize answer without tokens")
		}
		if string(k) == "tokens" {
			return parseIDs(v)
		}
	}
}

var errBadIDs = errors.New("kvevents: /tokenize answer: tokens is not an array of token ids")

// parseIDs reads a JSON array of token ids (integers below 2³²).
func parseIDs(v []byte) ([]uint32, error) {
	i := jsonscan.SkipWS(v, 0)
	if i >= len(v) || v[i] != '[' {
		return nil, errBadIDs
	}
	ids := make([]uint32, 0, len(v)/6)
	i = jsonscan.SkipWS(v, i+1)
	if i < len(v) && v[i] == ']' {
		return ids, nil
	}
	for {
		var n uint64
		start := i
		for i < len(v) && v[i] >= '0' && v[i] <= '9' {
			n = n*10 + uint64(v[i]-'0')
			if n > 1<<32-1 {
				return nil, errBadIDs
			}
			i++
		}
		if i == start {
			return nil, errBadIDs
		}
		ids = append(ids, uint32(n))
		i = jsonscan.SkipWS(v, i)
		if i >= len(v) {
			return nil, errBadIDs
		}
		switch v[i] {
		case ',':
			i = jsonscan.SkipWS(v, i+1)
		case ']':
			return ids, nil
		default:
			return nil, errBadIDs
		}
	}
}
