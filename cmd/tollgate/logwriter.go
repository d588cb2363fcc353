package main

import (
	"bufio"
	"io"
	"sync"
	"time"
)

// logWriter buffers log lines and writes them out at least every interval
// (and whenever 64 KiB are waiting): one write system call for many request
// lines instead of one each. A crash loses at most the last interval's lines.
type logWriter struct {
	mu   sync.Mutex
	w    *bufio.Writer
	stop chan struct{}
	done chan struct{}
}

func newLogWriter(w io.Writer, interval time.Duration) *logWriter {
	l := &logWriter{w: bufio.NewWriterSize(w, 64<<10), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				l.Flush()
			case <-l.stop:
				return
			}
		}
	}()
	return l
}

// Write adds one line (slog writes each record in one call).
func (l *logWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Flush writes out what is buffered.
func (l *logWriter) Flush() {
	l.mu.Lock()
	_ = l.w.Flush()
	l.mu.Unlock()
}

// Close stops the flusher and writes out the rest.
func (l *logWriter) Close() {
	close(l.stop)
	<-l.done
	l.Flush()
}
