//go:build !unix

package upstream

// alive cannot look at a socket without blocking here: a pooled connection
// is taken as alive, and one the server closed fails its request with 502.
func alive(c *h1Conn) bool { return c.br.Buffered() == 0 }

func socketFD(any) int { return -1 }
