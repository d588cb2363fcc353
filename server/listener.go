package server

import (
	"bytes"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// EnvelopeListener wraps a plain-TCP listener so that net/http's own
// answers to requests it cannot read (a malformed request line or header,
// headers over MaxHeaderBytes, an unsupported Transfer-Encoding or HTTP
// version) carry the protocol's error envelope and an X-Request-Id, as
// every answer of a handler does. net/http writes those answers straight to
// the connection, in one write, as plain text with no way to change them;
// this rewrites that one write. Not for TLS listeners: net/http needs their
// *tls.Conn as it is (handshake, ALPN), and this would see only ciphertext.
func EnvelopeListener(ln net.Listener, newID func() string) net.Listener {
	return &envelopeListener{Listener: ln, newID: newID}
}

type envelopeListener struct {
	net.Listener
	newID func() string
}

func (l *envelopeListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &envelopeConn{Conn: c, newID: l.newID}, nil
}

type envelopeConn struct {
	net.Conn
	newID func() string
}

// serverErrorHead is what follows the status line of every error net/http
// writes itself (net/http's server.go, conn.serve). A handler's response
// never has it: net/http writes a handler's header fields in sorted order
// (Connection before Content-Type) and always with a Date.
const serverErrorHead = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

func (c *envelopeConn) Write(p []byte) (int, error) {
	if len(p) < 13 || string(p[:9]) != "HTTP/1.1 " {
		return c.Conn.Write(p)
	}
	i := bytes.Index(p, []byte(serverErrorHead))
	if i < 0 || bytes.IndexByte(p[:i], '\n') >= 0 {
		return c.Conn.Write(p)
	}
	status, err := strconv.Atoi(string(p[9:12]))
	if err != nil || status < 400 {
		return c.Conn.Write(p)
	}
	// The body repeats the status ("431 Request Header Fields Too
	// Large", "400 Bad Request: missing required Host header"), except
	// for an unsupported Transfer-Encoding ("Unsupported transfer
	// encoding").
	msg := string(p[i+len(serverErrorHead):])
	msg = strings.TrimPrefix(msg, string(p[9:12])+" ")
	ct, body := HTTPErrorBody(status, msg)
	// The status line with the standard reason phrase (net/http puts its
	// message there too: "400 Bad Request: missing required Host header").
	out := append([]byte("HTTP/1.1 "), p[9:12]...)
	out = append(out, ' ')
	out = append(out, http.StatusText(status)...)
	out = append(out, "\r\nContent-Type: "...)
	out = append(out, ct...)
	out = append(out, "\r\nContent-Length: "...)
	out = strconv.AppendInt(out, int64(len(body)), 10)
	out = append(out, "\r\nX-Request-Id: "...)
	out = append(out, c.newID()...)
	out = append(out, "\r\nConnection: close\r\n\r\n"...)
	out = append(out, body...)
	if _, err := c.Conn.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// CloseWrite half-closes the connection, as net/http does after a 431 so
// that the client reads the answer before the connection goes.
func (c *envelopeConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
