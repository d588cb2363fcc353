package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// The request line and headers may take 1 MiB + 4 KiB (net/http's limit of
// 1 MiB plus the 4 KiB it allows on top; where it cuts within a few bytes
// past that depends on how its reader was filled): 1,052,672 bytes are
// read, 1 KiB more is 431 request_too_large (docs/api.md, "HTTP").
func TestHeaderLimitIsOneMiBAndFourKiB(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	const limit = 1<<20 + 4<<10
	for _, c := range []struct {
		size int
		want int
	}{{limit, 200}, {limit + 1<<10, 431}} {
		head := "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Pad: "
		raw := head + strings.Repeat("a", c.size-len(head)-len("\r\n\r\n")) + "\r\n\r\n"
		conn, err := net.Dial("tcp", h.main.Addr("api"))
		if err != nil {
			t.Fatal(err)
		}
		go func() { _, _ = io.WriteString(conn, raw) }()
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			conn.Close()
			t.Fatalf("%d bytes of request line and headers: %v", c.size, err)
		}
		b, _ := io.ReadAll(resp.Body)
		conn.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%d bytes of request line and headers: %d %s, want %d", c.size, resp.StatusCode, b, c.want)
		}
	}
}
