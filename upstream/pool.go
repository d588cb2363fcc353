// Package upstream is the gateway's HTTP/1.1 client for model servers: a pool of
// keep-alive connections per URL, on which the calling goroutine writes a
// request and reads its answer itself, and a lean response reader that
// keeps only what the gateway uses (status, Content-Type, framing). A
// request written whole is never sent again: the server may be running it.
// relay uses it for chat requests and health probes.
package upstream

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Pool is the client for one URL, http or https: the request's own
// goroutine writes the request and reads the answer on a pooled keep-alive
// connection, where net/http's transport hands each exchange to two
// goroutines of its own. That hand-off is a large part of what a hop costs
// on loopback (docs/performance.md, "The HTTP server and the upstream
// client"). Answers are parsed by readResponse (response.go), a lean reader
// that keeps only what the gateway uses. An https node gets TLS (ALPN
// http/1.1: no HTTP/2 upstream).
type Pool struct {
	host    string      // host:port to dial
	hostHdr string      // Host header
	path    string      // request path, e.g. /v1/chat/completions
	tls     *tls.Config // nil: plain http
	dialer  *net.Dialer
	maxIdle int

	mu   sync.Mutex
	idle []*h1Conn

	dials atomic.Int64 // connections opened, for tests and benchmarks
}

// SetMaxIdle bounds how many idle connections p keeps (1024 unless set);
// set it before p's first use.
func (p *Pool) SetMaxIdle(n int) { p.maxIdle = n }

// Dials is how many connections p has opened.
func (p *Pool) Dials() int64 { return p.dials.Load() }

type h1Conn struct {
	c      net.Conn
	fd     int     // c's socket descriptor, for alive; -1 if c is not one
	probe  [1]byte // alive's read buffer
	br     *bufio.Reader
	reused bool
	idleAt time.Time
	head   []byte    // the request head's buffer, reused by every exchange
	bufs   [2][]byte // head and body, for one writev
}

// Head is what varies in a request's head; the rest is the same on
// every request to a node (POST path, Host, JSON in, JSON or SSE out).
type Head struct {
	RequestID     string // X-Request-Id
	Authorization string // the whole Authorization value; "" sends none
	Traceparent   string // W3C trace context of the backend call's span; "" sends none
	Probe         bool   // a GET without a body (health probes) instead of the POST
}

// maxIdle is how long a pooled connection is kept: below the 5 s keep-alive
// of llama.cpp's server and uvicorn (vLLM, SGLang), so the pool rarely hands
// out a connection the server is closing (get checks each one anyway).
const maxIdleTime = 4 * time.Second

// rootCAs are the roots an https node's certificate must chain to;
// nil: the system's. (Tests set their own.)
var rootCAs *x509.CertPool

// NewPool returns the client for rawURL (http or https), dialling with
// dialer.
func NewPool(rawURL string, dialer *net.Dialer) (*Pool, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	p := &Pool{hostHdr: u.Host, path: u.RequestURI(), dialer: dialer, maxIdle: 1024}
	port := "80"
	switch u.Scheme {
	case "http":
	case "https":
		port = "443"
		p.tls = &tls.Config{ServerName: u.Hostname(), NextProtos: []string{"http/1.1"}, RootCAs: rootCAs,
			MinVersion: tls.VersionTLS12, ClientSessionCache: tls.NewLRUClientSessionCache(64)}
	default:
		return nil, fmt.Errorf("node URL %q: want http or https", rawURL)
	}
	p.host = u.Host
	if u.Port() == "" {
		p.host = net.JoinHostPort(u.Hostname(), port)
	}
	return p, nil
}

// get returns the most recently used pooled connection that is still open
// (alive: one the server closed while it was pooled is dropped before
// anything is written to it), or a new one.
func (p *Pool) get(ctx context.Context) (*h1Conn, error) {
	for {
		p.mu.Lock()
		n := len(p.idle)
		if n == 0 {
			p.mu.Unlock()
			return p.dial(ctx)
		}
		c := p.idle[n-1] // the most recently used
		if time.Since(c.idleAt) > maxIdleTime {
			// The newest is too old, so are all the others.
			stale := p.idle
			p.idle = nil
			p.mu.Unlock()
			for _, o := range stale {
				o.c.Close()
			}
			return p.dial(ctx)
		}
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		if alive(c) {
			c.reused = true
			return c, nil
		}
		c.c.Close()
	}
}

// dial opens a new connection.
func (p *Pool) dial(ctx context.Context) (*h1Conn, error) {
	nc, err := p.dialer.DialContext(ctx, "tcp", p.host)
	if err != nil {
		return nil, err
	}
	p.dials.Add(1)
	// alive reads the TCP socket itself, under TLS too: a pooled TLS
	// connection has nothing to read either (bytes there, a close_notify
	// say, mean it cannot take a request).
	c := &h1Conn{c: nc, fd: socketFD(nc)}
	if p.tls != nil {
		tc := tls.Client(nc, p.tls)
		if p.dialer.Timeout > 0 {
			_ = nc.SetDeadline(time.Now().Add(p.dialer.Timeout))
		}
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, err
		}
		_ = nc.SetDeadline(time.Time{})
		c.c = tc
	}
	c.br = bufio.NewReaderSize(c.c, 16<<10)
	return c, nil
}

func (p *Pool) put(c *h1Conn) {
	c.idleAt = time.Now()
	p.mu.Lock()
	if len(p.idle) < p.maxIdle {
		p.idle = append(p.idle, c)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	c.c.Close()
}

// CloseIdle closes every pooled connection.
func (p *Pool) CloseIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, c := range idle {
		c.c.Close()
	}
}

// Post sends one POST (or, for a probe Head, one GET) and returns the answer. The body reads from the
// connection; reading it to the end returns the connection to the pool,
// closing it early discards the connection.
//
// A request is sent once. get hands out only a pooled connection still open
// (keep-alive timeouts are short: llama.cpp says timeout=5, max=100), and a
// request whose write failed part-way (notSentError: the server cannot have
// run a request it did not get whole) is written once more on a newly
// dialled connection. A failure after the whole request was written is
// returned, even before any byte of an answer: the server may have been
// running it (a vLLM answers a non-streamed request only when it is done),
// and sending it again would run it twice, on this node or, if this one now
// refuses connections, on another: no request is sent again once sent.
func (p *Pool) Post(ctx context.Context, header Head, body []byte) (*http.Response, error) {
	for attempt := 0; ; attempt++ {
		get := p.get
		if attempt > 0 {
			get = p.dial // the other pooled connections are likely dead too
		}
		c, err := get(ctx)
		if err != nil {
			return nil, err
		}
		resp, err := p.exchange(ctx, c, header, body)
		if err == nil {
			return resp, nil
		}
		c.c.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var ns *notSentError
		if attempt == 0 && errors.As(err, &ns) && retryable(ns.err) {
			continue
		}
		return nil, err
	}
}

// notSentError is a failure to write the whole request: the server did not
// get it whole, so it ran nothing, and the request may be written again.
type notSentError struct{ err error }

func (e *notSentError) Error() string { return e.err.Error() }
func (e *notSentError) Unwrap() error { return e.err }

// retryable: the server closed the connection under the write.
func retryable(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func (p *Pool) exchange(ctx context.Context, c *h1Conn, header Head, body []byte) (*http.Response, error) {
	// A cancelled context unblocks any read or write on the connection.
	stop := context.AfterFunc(ctx, func() { _ = c.c.SetDeadline(time.Unix(1, 0)) })
	// The head goes into the connection's own buffer (one exchange at a
	// time uses a connection): no allocation a request.
	var head []byte
	if header.Probe {
		head = append(c.head[:0], "GET "...)
		head = append(head, p.path...)
		head = append(head, " HTTP/1.1\r\nHost: "...)
		head = append(head, p.hostHdr...)
		head = append(head, "\r\nUser-Agent: tollgate\r\nAccept: */*"...)
	} else {
		head = append(c.head[:0], "POST "...)
		head = append(head, p.path...)
		head = append(head, " HTTP/1.1\r\nHost: "...)
		head = append(head, p.hostHdr...)
		head = append(head, "\r\nUser-Agent: tollgate\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: "...)
		head = strconv.AppendInt(head, int64(len(body)), 10)
	}
	if header.RequestID != "" {
		head = append(head, "\r\nX-Request-Id: "...)
		head = append(head, header.RequestID...)
	}
	if header.Traceparent != "" {
		head = append(head, "\r\nTraceparent: "...)
		head = append(head, header.Traceparent...)
	}
	if header.Authorization != "" {
		head = append(head, "\r\nAuthorization: "...)
		head = append(head, header.Authorization...)
	}
	head = append(head, "\r\n\r\n"...)
	c.head = head
	c.bufs = [2][]byte{head, body}
	bufs := net.Buffers(c.bufs[:])
	if _, err := bufs.WriteTo(c.c); err != nil {
		stop()
		return nil, &notSentError{err}
	}
	resp, b, err := readResponse(c.br)
	if err != nil {
		stop()
		return nil, err
	}
	b.c, b.p, b.stop = c, p, stop
	return resp, nil
}
