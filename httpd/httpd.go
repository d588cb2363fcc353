// Package httpd is a lean HTTP/1.1 server for tollgate's listeners. It runs
// an http.Handler as net/http's server does, over plain TCP, but serves each
// connection on one goroutine and starts no goroutine per request.
//
// Why not net/http: its server starts a goroutine per request to watch the
// connection for a client that goes away, and stops it again when the
// handler returns (a read deadline in the past, a wait on a condition
// variable). Each of those hand-offs wakes a thread; on an idle machine a
// wake-up is a sleeping CPU woken by an interrupt, which under
// virtualisation costs tens of microseconds. Here the connection is watched
// only once a request has run for WatchDelay (1ms): a request that is
// answered sooner never needs it, and a model's answer always takes longer,
// so a client that disconnects still cancels its backend call at once.
// docs/performance.md ("The HTTP server") has the figures.
//
// What it serves: HTTP/1.0 and HTTP/1.1 with keep-alive and pipelining,
// bodies by Content-Length or chunked, Expect: 100-continue, responses with
// Content-Length when the handler ends within the first 32 KiB and chunked
// (with trailers) otherwise, Flush and write deadlines through
// http.ResponseController. Not served: TLS, HTTP/2, Upgrade, Hijack.
// Malformed requests are answered and the connection closed; the rules are
// RFC 9112's (docs/api.md, "HTTP").
package httpd

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = http.ErrServerClosed

// Server serves HTTP/1.0 and HTTP/1.1 on the listeners given to Serve.
type Server struct {
	Handler           http.Handler
	ReadHeaderTimeout time.Duration // default 10s: from a request's first byte to the end of its headers
	IdleTimeout       time.Duration // default 120s: a kept-alive connection waiting for its next request
	BodyIdleTimeout   time.Duration // default 60s: the longest a request body may stall (no byte arriving)
	MaxHeaderBytes    int           // default 1 MiB: request line and headers
	// WatchDelay is how long a request runs, once its body is read, before
	// its connection is watched for the client going away (default 1ms);
	// from then on r.Context() is cancelled as soon as the client closes
	// the connection.
	WatchDelay time.Duration
	Log        *slog.Logger
	// ErrorBody renders the server's own error responses (a malformed
	// request, headers too large, ...); nil: plain text.
	ErrorBody func(status int, message string) (contentType string, body []byte)
	// RequestID, if set, gives each of the server's own error responses an
	// X-Request-Id, as the handler gives every other response.
	RequestID func() string

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	closing   atomic.Bool
	idle      chan struct{} // signalled when a connection ends during Shutdown
}

const (
	defaultReadHeaderTimeout = 10 * time.Second
	defaultIdleTimeout       = 120 * time.Second
	defaultBodyIdleTimeout   = 60 * time.Second
	defaultMaxHeaderBytes    = 1 << 20
	defaultWatchDelay        = time.Millisecond
)

func (s *Server) readHeaderTimeout() time.Duration {
	return positiveOr(s.ReadHeaderTimeout, defaultReadHeaderTimeout)
}

func (s *Server) idleTimeout() time.Duration { return positiveOr(s.IdleTimeout, defaultIdleTimeout) }
func (s *Server) bodyIdleTimeout() time.Duration {
	return positiveOr(s.BodyIdleTimeout, defaultBodyIdleTimeout)
}
func (s *Server) maxHeaderBytes() int       { return positiveOr(s.MaxHeaderBytes, defaultMaxHeaderBytes) }
func (s *Server) watchDelay() time.Duration { return positiveOr(s.WatchDelay, defaultWatchDelay) }

// positiveOr is v, or def when v is not set (zero or negative).
func positiveOr[T time.Duration | int](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

func (s *Server) log() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.New(slog.DiscardHandler)
}

// Serve accepts connections on ln until Shutdown or Close, and serves each
// on its own goroutine. It closes ln when it returns.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		_ = ln.Close()
		return ErrServerClosed
	}
	if s.listeners == nil {
		s.listeners = map[net.Listener]struct{}{}
		s.conns = map[*conn]struct{}{}
		s.idle = make(chan struct{}, 1)
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
		_ = ln.Close()
	}()

	var pause time.Duration // after a failed Accept (out of file descriptors, ...)
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return ErrServerClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			s.log().Warn("accept failed; retrying", "err", err, "in", pause)
			time.Sleep(pause)
			continue
		}
		pause = 0
		c := newConn(s, nc)
		if !s.track(c) {
			_ = nc.Close()
			return ErrServerClosed
		}
		go c.serve()
	}
}

// track registers c; false once the server is closing.
func (s *Server) track(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) forget(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	if s.closing.Load() {
		select {
		case s.idle <- struct{}{}:
		default:
		}
	}
}

// closeListeners closes every listener (under mu).
func (s *Server) closeListeners() {
	for ln := range s.listeners {
		_ = ln.Close()
	}
}

// Shutdown stops accepting, closes idle connections, and waits until every
// running request has been answered (its connection then closes), or until
// ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing.Store(true)
	s.closeListeners()
	if s.idle == nil {
		s.idle = make(chan struct{}, 1)
	}
	s.mu.Unlock()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		s.mu.Lock()
		for c := range s.conns {
			c.closeIfIdle()
		}
		n := len(s.conns)
		s.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.idle:
		case <-tick.C:
		}
	}
}

// Close closes the listeners and every connection at once.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing.Store(true)
	s.closeListeners()
	for c := range s.conns {
		_ = c.nc.Close()
	}
	return nil
}
