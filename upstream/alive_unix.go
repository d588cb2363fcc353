//go:build unix

package upstream

import (
	"errors"
	"syscall"
)

// alive reports whether a pooled connection can take a request: one
// non-blocking read finds nothing to read (EAGAIN). End of input (the server
// closed the connection while it sat in the pool: a keep-alive timeout, a
// restart), an error, or bytes nobody asked for mean it cannot. A request is
// written only to a connection that passed this, so a connection's failure
// after the write is never taken for a stale one and the request is never
// sent twice.
//
// The read goes straight to the socket (its descriptor, taken at dial), not
// through the runtime's poller: the connection is ours alone while pooled, a
// non-blocking read never waits, and the wrapper cost a closure and its
// allocation a request.
func alive(c *h1Conn) bool {
	if c.br.Buffered() > 0 {
		return false
	}
	if c.fd < 0 {
		return true // not a socket (tests' pipes): nothing to look at
	}
	_, err := syscall.Read(c.fd, c.probe[:])
	return errors.Is(err, syscall.EAGAIN)
}

// socketFD is the descriptor of c's socket, or -1.
func socketFD(c any) int {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return -1
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return -1
	}
	fd := -1
	if raw.Control(func(s uintptr) { fd = int(s) }) != nil {
		return -1
	}
	return fd
}
