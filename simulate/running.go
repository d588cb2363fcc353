package simulate

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// Running is a simulated model server listening on a real port.
type Running struct {
	*Server
	*listener
}

// RunningSearch is a simulated search provider listening on a real port.
type RunningSearch struct {
	*Search
	*listener
}

// listener serves a handler on a real port and can refuse connections.
type listener struct {
	addr string
	srv  *http.Server

	mu      sync.Mutex
	ln      net.Listener // nil while refusing
	conns   map[net.Conn]struct{}
	serving sync.WaitGroup
	closed  bool
}

// Start listens on 127.0.0.1 on a free port and serves cfg.
func Start(cfg Config) (*Running, error) {
	return Listen(cfg, "127.0.0.1:0")
}

// Listen serves cfg on addr ("127.0.0.1:9001"; port 0 picks a free one).
func Listen(cfg Config, addr string) (*Running, error) {
	if _, err := ParseFlavour(string(cfg.Flavour)); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("simulate: listen %s: %w", addr, err)
	}
	s := New(cfg)
	return &Running{Server: s, listener: newListener(ln, s)}, nil
}

// StartSearch listens on 127.0.0.1 on a free port and serves a simulated
// search provider.
func StartSearch(cfg SearchConfig) (*RunningSearch, error) {
	return ListenSearch(cfg, "127.0.0.1:0")
}

// ListenSearch serves a simulated search provider on addr.
func ListenSearch(cfg SearchConfig, addr string) (*RunningSearch, error) {
	if _, err := ParseSearchFlavour(string(cfg.Flavour)); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("simulate: listen %s: %w", addr, err)
	}
	s := NewSearch(cfg)
	return &RunningSearch{Search: s, listener: newListener(ln, s)}, nil
}

func newListener(ln net.Listener, h http.Handler) *listener {
	r := &listener{addr: ln.Addr().String(), conns: make(map[net.Conn]struct{})}
	r.srv = &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ConnState:         r.connState,
	}
	r.serve(ln)
	return r
}

func (r *listener) serve(ln net.Listener) {
	r.ln = ln
	r.serving.Add(1)
	go func() {
		defer r.serving.Done()
		r.srv.Serve(ln)
	}()
}

func (r *listener) connState(c net.Conn, st http.ConnState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch st {
	case http.StateNew:
		r.conns[c] = struct{}{}
	case http.StateClosed, http.StateHijacked:
		delete(r.conns, c)
	}
}

// URL is the server's base address, e.g. "http://127.0.0.1:40123" (append
// "/v1", or "/api/v1" for OpenRouter).
func (r *listener) URL() string { return "http://" + r.addr }

// RefuseConnections(true) closes the listener and every open connection, so
// new connections are refused (ECONNREFUSED) and pooled ones fail;
// RefuseConnections(false) listens again on the same port.
func (r *listener) RefuseConnections(refuse bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("simulate: server closed")
	}
	if refuse {
		if r.ln == nil {
			return nil
		}
		err := r.ln.Close()
		r.ln = nil
		for c := range r.conns {
			c.Close()
		}
		return err
	}
	if r.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", r.addr)
	if err != nil {
		return fmt.Errorf("simulate: listen again on %s: %w", r.addr, err)
	}
	r.serve(ln)
	return nil
}

// Close stops the server at once, cutting running requests.
func (r *listener) Close() error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	err := r.srv.Close()
	r.serving.Wait()
	return err
}

// Shutdown stops accepting and waits for running requests until ctx ends.
func (r *listener) Shutdown(ctx context.Context) error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	err := r.srv.Shutdown(ctx)
	r.serving.Wait()
	return err
}
