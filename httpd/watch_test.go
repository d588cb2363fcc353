package httpd

import (
	"net"
	"testing"
	"time"
)

// TestWatchOnlyForItsRequest: a run of the watcher's timer that belongs to
// an earlier request (late on a busy machine) must not read the connection,
// nor may a run read when a byte is already held for the next request: the
// second read would overwrite the first byte of a pipelined request.
func TestWatchOnlyForItsRequest(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	s := &Server{WatchDelay: time.Hour} // the real timer run never comes
	c := newConn(s, a)
	c.cancel = func() {}
	returns := func(what string) {
		t.Helper()
		done := make(chan struct{})
		go func() { c.watch(); close(done) }()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			t.Fatalf("%s: the watcher read the connection", what)
		}
	}

	c.arm()
	returns("a run before WatchDelay has passed since arm")

	c.watchMu.Lock()
	c.armedAt = time.Now().Add(-2 * time.Hour)
	c.src.peeked, c.src.b[0] = true, 'G'
	c.watchMu.Unlock()
	returns("a run with a byte already held")
	if c.src.b[0] != 'G' {
		t.Fatalf("held byte %q, want 'G'", c.src.b[0])
	}

	// The control: a run in time, nothing held, reads and keeps the byte.
	c.src.peeked = false
	done := make(chan struct{})
	go func() { c.watch(); close(done) }()
	if _, err := b.Write([]byte("P")); err != nil {
		t.Fatal(err)
	}
	<-done
	if !c.src.peeked || c.src.b[0] != 'P' {
		t.Fatalf("peeked %v %q, want the byte 'P' held", c.src.peeked, c.src.b[0])
	}
	c.disarm()
}
