package simulate

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// signal wakes the goroutines waiting for a server's counters to change
// (WaitStats): notify closes the current channel and makes a new one, and
// does nothing while nobody waits (the request path then pays one atomic
// load).
type signal struct {
	mu      sync.Mutex
	ch      chan struct{}
	waiters atomic.Int32
}

func (s *signal) current() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

func (s *signal) notify() {
	if s.waiters.Load() == 0 {
		return
	}
	s.mu.Lock()
	if s.ch != nil {
		close(s.ch)
	}
	s.ch = make(chan struct{})
	s.mu.Unlock()
}

// waitFor waits until cond holds for stats(), or timeout passes.
func waitFor[T any](s *signal, timeout time.Duration, stats func() T, cond func(T) bool) error {
	s.waiters.Add(1)
	defer s.waiters.Add(-1)
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		ch := s.current()
		st := stats()
		if cond(st) {
			return nil
		}
		select {
		case <-ch:
		case <-deadline.C:
			return fmt.Errorf("simulate: condition not met within %v (stats %+v)", timeout, st)
		}
	}
}
