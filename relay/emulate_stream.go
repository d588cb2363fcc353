package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/openai"
	"github.com/tollgate/tollgate/upstream"
)

// streamN serves a streamed request for n choices on a node whose server
// ignores n (and needs no tool choice enforced): n upstream streams at once,
// each for one choice, forwarded as they arrive with their choice's index
// (0..n-1); then one usage chunk with the summed usage and the cost, and
// one charge. The first failure ends the others; what was delivered by then
// is charged, as for any stream.
func (x *exchange) streamN(w http.ResponseWriter, req *http.Request, n int) error {
	ctx, cancel := context.WithCancelCause(req.Context())
	defer cancel(nil)
	w.Header().Set(emulatedHeader, controlParams(openai.ControlN))
	s := x.startStreamer(w, cancel)
	defer s.stopWatchdog()
	if x.r.tracer != nil {
		ctx = x.startBackendSpan(ctx)
	}

	h1 := x.r.h1For(x.node)
	if h1 == nil {
		return fmt.Errorf("node %s: URL %q is not http or https", x.node.Name, x.node.BaseURL)
	}
	head := upstream.Head{RequestID: x.call.RequestID, Traceparent: x.traceparent}
	if x.node.Key != "" {
		head.Authorization = x.node.authorization()[0]
	}
	legs := make([]streamLeg, n)
	// What the streams delivered goes to the charge journal at the first
	// token and then every streamProgressEvery, as for any stream.
	prog := &legProgress{prog: x.progress(), usage: make([]openai.Usage, n)}
	var first sync.Once
	var wg sync.WaitGroup
	start := x.r.now()
	for i := range legs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := &legs[i]
			l.norm.Reset(x.completionID(), x.model.ID, x.node.Flavour)
			l.run(ctx, x, s, h1, head, i, &first, prog)
			if l.failure != nil {
				cancel(errLegFailed) // the answer is incomplete: end the others
			}
		}()
	}
	wg.Wait()
	x.call.UpstreamTime = x.r.now().Sub(start)
	s.stopWatchdog()

	clientGone := req.Context().Err() != nil || s.writeErr != nil
	var failure error
	var u openai.Usage
	served := true
	for i := range legs {
		l := &legs[i]
		if failure == nil && l.failure != nil && !errors.Is(l.failure, errLegFailed) {
			failure = l.failure
		}
		served = served && l.served()
		u = sumUsage(u, l.usage(x.promptEstimate))
	}
	if failure == nil && !served && !clientGone {
		failure = x.capError(context.Cause(ctx))
		if failure == nil {
			failure = &tollgate.Error{Code: tollgate.CodeUpstreamError, Message: "the backend closed the stream before it finished"}
		}
	}
	x.streamHealth(served, failure, clientGone)
	u = u.Normalize()
	if x.r.tracer != nil {
		x.endBackendSpan(u, "", failure)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	return s.settleEnd(x, &legs[0].norm, u, served, clientGone, failure, func(err error) error {
		w.Header().Del(emulatedHeader) // an error, not an answer served so
		return x.transportError(ctx, req, err)
	})
}

// errLegFailed ends the other streams of a request when one failed.
var errLegFailed = errors.New("another choice's stream failed")

// streamLeg is one of streamN's upstream streams.
type streamLeg struct {
	norm openai.StreamNormalizer
	streamRead
	answered bool // a 2xx event stream
}

// run reads one upstream stream and forwards its chunks as choice i's.
func (l *streamLeg) run(ctx context.Context, x *exchange, s *streamer, h1 *upstream.Pool, head upstream.Head, i int, first *sync.Once, prog *legProgress) {
	resp, err := h1.Post(ctx, head, x.body)
	if err != nil {
		l.failure = err
		if cause := context.Cause(ctx); cause != nil {
			l.failure = cause
		}
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		l.failure = x.classifyStatus(resp)
		return
	}
	if l.failure = x.notEventStream(resp); l.failure != nil {
		return
	}
	l.answered = true
	er := openai.NewEventReader(resp.Body)
	er.OnWait = s.flush
	l.streamRead = s.readEvents(er, &l.norm, func(out []byte, _ int64) bool {
		if out == nil {
			return true
		}
		if !s.send(reindexChunk(out, i)) {
			return false // the client is gone
		}
		if l.norm.DeliveredBytes() > 0 {
			first.Do(func() {
				x.call.FirstToken = x.r.now()
				x.firstTokenEvent()
				s.flush()
			})
			if prog.prog.pr != nil {
				prog.note(x, i, l.norm.FinalUsage(x.promptEstimate))
			}
		}
		return true
	})
	if l.readErr != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(l.readErr, io.EOF) {
			if c := x.capError(cause); c != nil {
				l.failure = c
			} else if errors.Is(cause, errLegFailed) {
				l.failure = errLegFailed
			}
		}
	}
}

// legProgress records the charge so far of streamN's streams together.
type legProgress struct {
	mu    sync.Mutex
	prog  progress
	usage []openai.Usage // each stream's so far
}

// note takes stream i's usage so far and records the sum when a record is
// due.
func (p *legProgress) note(x *exchange, i int, u openai.Usage) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.usage[i] = u
	if !p.prog.due(x.r.now().UnixNano()) {
		return
	}
	var sum openai.Usage
	for _, v := range p.usage {
		sum = sumUsage(sum, v)
	}
	x.recordProgress(p.prog.pr, sum.Normalize(), 0)
}

// served reports whether the stream ended as a stream should.
func (l *streamLeg) served() bool {
	return l.failure == nil && l.finished(&l.norm)
}

// usage is what the stream is billed: the backend's usage when it gave one,
// else a local count of what was delivered (nothing when nothing was).
func (l *streamLeg) usage(promptEstimate int64) openai.Usage {
	return streamUsage(&l.norm, l.served(), promptEstimate)
}

var choiceZero = []byte(`"choices":[{"index":0,`)

// reindexChunk gives a normalised chunk's choices (one call's: index 0)
// the index i.
func reindexChunk(chunk []byte, i int) []byte {
	if i == 0 {
		return chunk
	}
	// The normaliser writes a choice's index first: a byte edit keeps the
	// chunk as it was.
	if k := bytes.Index(chunk, choiceZero); k >= 0 {
		out := make([]byte, 0, len(chunk)+4)
		out = append(out, chunk[:k+len(choiceZero)-2]...)
		out = strconv.AppendInt(out, int64(i), 10)
		return append(out, chunk[k+len(choiceZero)-1:]...)
	}
	var doc map[string]json.RawMessage
	var cs []map[string]json.RawMessage
	if json.Unmarshal(chunk, &doc) != nil || json.Unmarshal(doc["choices"], &cs) != nil {
		return chunk
	}
	for _, c := range cs {
		c["index"] = json.RawMessage(strconv.Itoa(i))
	}
	doc["choices"], _ = json.Marshal(cs)
	return appendOrdered(nil, doc)
}
