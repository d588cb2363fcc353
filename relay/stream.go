package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/openai"
)

var (
	errStreamIdle  = errors.New("backend idle too long")
	errStreamTotal = errors.New("stream exceeded its total time")
)

// streamer writes one SSE response. The upstream reader (the request's own
// goroutine) and the watchdog (keep-alives, idle cap) share the writer under mu.
type streamer struct {
	x   *exchange
	w   http.ResponseWriter
	rc  *http.ResponseController
	mu  sync.Mutex
	buf []byte

	// The watchdog is a timer, not a goroutine: a stream that answers
	// quickly never runs it, and ending it needs no hand-off.
	watch   *time.Timer
	period  time.Duration
	cancel  context.CancelCauseFunc
	stopped bool // the watchdog must do nothing more (under mu)

	committed bool  // status and headers sent
	pending   bool  // written but not flushed
	writeErr  error // the client stopped reading

	lastWrite    atomic.Int64 // unix nanos of the last bytes sent to the client
	lastUpstream atomic.Int64 // unix nanos of the last event from the backend
}

func (x *exchange) stream(w http.ResponseWriter, req *http.Request) error {
	ctx, cancel := context.WithCancelCause(req.Context())
	defer cancel(nil)
	totalTimer := time.AfterFunc(x.r.opts.StreamTotal, func() { cancel(errStreamTotal) })
	defer totalTimer.Stop()

	// The watchdog runs from the start: a backend that is slow to send even
	// its headers (queueing, long prefill) still gets keep-alives to the client.
	s := &streamer{x: x, w: w, rc: http.NewResponseController(w)}
	now := x.r.now().UnixNano()
	s.lastWrite.Store(now)
	s.lastUpstream.Store(now)
	s.startWatchdog(cancel)
	stop := s.stopWatchdog
	defer stop()

	norm := &openai.StreamNormalizer{ID: x.completionID(), Model: x.model.ID, Flavour: x.node.Flavour}
	var failure, readErr error
	done := false
	resp, err := x.send(ctx)
	switch {
	case err != nil && (errors.Is(context.Cause(ctx), errStreamIdle) || errors.Is(context.Cause(ctx), errStreamTotal)):
		// Our own idle or total cap ended the wait for the headers: mapped below.
		readErr = err
	case err != nil:
		failure = x.transportError(ctx, req, err)
	case resp.StatusCode/100 != 2:
		failure = x.classifyStatus(resp)
		resp.Body.Close()
	default:
		defer resp.Body.Close()
		if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
			// A server that answers a stream with one JSON body is reporting an error.
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			x.node.reportFailure(x.r.opts.Health, false, x.r.now())
			failure = openai.ClassifyUpstreamError(x.node.Flavour, http.StatusBadGateway, body)
			break
		}
		er := openai.NewEventReader(resp.Body)
		er.OnWait = s.flush
		for {
			ev, err := er.Next()
			if err != nil {
				readErr = err
				break
			}
			s.lastUpstream.Store(x.r.now().UnixNano())
			out, err := norm.Event(ev)
			if errors.Is(err, openai.ErrDone) {
				done = true
				break
			}
			if err != nil {
				failure = err
				break
			}
			if out == nil {
				continue
			}
			if !s.send(out) {
				break // the client is gone
			}
		}
	}
	stop()
	if done {
		// Only the end of the body is left: finish it so the connection is reused.
		if d, ok := resp.Body.(interface{ Drain(time.Duration) }); ok {
			d.Drain(50 * time.Millisecond)
		}
	}

	clientGone := req.Context().Err() != nil || s.writeErr != nil
	cause := context.Cause(ctx)
	served := failure == nil && (done || (errors.Is(readErr, io.EOF) && norm.SawFinish()))
	switch {
	case served, failure != nil, clientGone:
	case errors.Is(cause, errStreamIdle):
		failure = tollgate.Errorf(tollgate.CodeTimeout, "the backend sent nothing for %s; the stream was ended", x.r.opts.StreamIdle)
	case errors.Is(cause, errStreamTotal):
		failure = tollgate.Errorf(tollgate.CodeTimeout, "the stream exceeded the maximum duration of %s", x.r.opts.StreamTotal)
	default:
		failure = &tollgate.Error{Code: tollgate.CodeUpstreamError, Err: readErr,
			Message: "the backend closed the stream before it finished"}
	}
	if resp != nil && resp.StatusCode/100 == 2 {
		if failure != nil && !clientGone {
			x.node.reportFailure(x.r.opts.Health, false, x.r.now())
		} else if served {
			x.node.reportSuccess()
		}
	}

	// What to bill: the backend's usage when it gave one; otherwise a local
	// count of what was delivered. A failure with nothing delivered costs nothing.
	u, reported := norm.Usage()
	if !reported {
		if norm.DeliveredBytes() == 0 && !served {
			u = openai.Usage{}
		} else {
			u = norm.FinalUsage(x.promptEstimate)
		}
	}
	u = u.Normalize()

	s.mu.Lock()
	defer s.mu.Unlock()
	if failure != nil && !s.committed && !clientGone {
		// Nothing reached the client yet: a plain HTTP error is clearer than a stream.
		x.call.Outcome = "failed"
		return failure
	}
	cost, err := x.cost(u)
	if err != nil {
		return fmt.Errorf("price stream: %w", err)
	}
	cost = x.settle(u, cost)
	x.call.Usage, x.call.Cost = u, cost
	if served || u.CompletionTokens > 0 || u.PromptTokens > 0 {
		x.noteServed()
	}
	switch {
	case clientGone:
		x.call.Outcome = "disconnected"
		return nil
	case failure != nil:
		x.call.Outcome = "failed_mid_stream"
	default:
		x.call.Outcome = "served"
	}
	if !s.committed {
		s.commit()
	}
	s.buf = openai.AppendData(s.buf[:0], norm.UsageChunk(u, &cost))
	if failure != nil {
		var te *tollgate.Error
		if !errors.As(failure, &te) {
			te = &tollgate.Error{Code: tollgate.CodeUpstreamError, Message: "the backend failed mid-stream", Err: failure}
		}
		s.buf = openai.AppendData(s.buf, openai.ErrorEvent(te))
	} else {
		s.buf = append(s.buf, openai.DoneEvent...)
	}
	s.w.Header().Set("X-Tollgate-Cost", cost.String())
	if u.Estimated {
		s.w.Header().Set("X-Tollgate-Usage-Estimated", "true")
	}
	if _, err := s.w.Write(s.buf); err == nil {
		_ = s.rc.Flush()
	}
	return nil
}

// commit sends the status and headers (under mu).
func (s *streamer) commit() {
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	s.x.setServedHeaders(h)
	h.Set("Trailer", "X-Tollgate-Cost, X-Tollgate-Usage-Estimated")
	// No server-wide WriteTimeout (it would cut long streams): this stream's own.
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.x.r.opts.StreamTotal + time.Minute))
	s.w.WriteHeader(http.StatusOK)
	s.committed = true
}

// send writes one chunk. It is flushed before the reader next waits for the
// backend (flush, via EventReader.OnWait): chunks that arrived together leave
// in one write, and no chunk waits for a later one. It reports false when the
// client can no longer be written to.
func (s *streamer) send(chunk []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.writeErr != nil {
		return false
	}
	if !s.committed {
		s.commit()
	}
	s.buf = openai.AppendData(s.buf[:0], chunk)
	if _, err := s.w.Write(s.buf); err != nil {
		s.writeErr = err
		return false
	}
	s.pending = true
	return true
}

// flush sends what was written to the client.
func (s *streamer) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.pending || s.writeErr != nil {
		return
	}
	s.pending = false
	if err := s.rc.Flush(); err != nil {
		s.writeErr = err
		return
	}
	s.lastWrite.Store(s.x.r.now().UnixNano())
}

// startWatchdog arms the watchdog: every period it sends a `: keep-alive`
// comment if nothing else was written for KeepAlive, and ends the upstream
// call when the backend has been silent past StreamIdle.
func (s *streamer) startWatchdog(cancel context.CancelCauseFunc) {
	o := s.x.r.opts
	s.mu.Lock() // tick takes mu first, so it sees s.watch set
	defer s.mu.Unlock()
	s.period = max(min(o.KeepAlive, o.StreamIdle)/4, 5*time.Millisecond)
	s.cancel = cancel
	s.watch = time.AfterFunc(s.period, s.tick)
}

// stopWatchdog ends the watchdog: once it returns, the watchdog writes
// nothing and cancels nothing. It may be called more than once.
func (s *streamer) stopWatchdog() {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.watch.Stop()
}

// tick is one watchdog round (on the timer's goroutine).
func (s *streamer) tick() {
	o := s.x.r.opts
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	now := s.x.r.now().UnixNano()
	if time.Duration(now-s.lastUpstream.Load()) >= o.StreamIdle {
		s.cancel(errStreamIdle)
		return
	}
	if time.Duration(now-s.lastWrite.Load()) >= o.KeepAlive && s.writeErr == nil {
		if !s.committed {
			s.commit()
		}
		if _, err := s.w.Write(openai.KeepAliveComment); err != nil {
			s.writeErr = err
		} else if err := s.rc.Flush(); err != nil {
			s.writeErr = err
		}
		s.lastWrite.Store(now)
	}
	s.watch.Reset(s.period)
}
