// Package syncbuf is a text buffer that goroutines may write at once: what
// tests hand to a logger or a child process as its output and read while
// it runs.
package syncbuf

import (
	"strings"
	"sync"
)

// Buffer is an io.Writer whose text can be read at any time.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
