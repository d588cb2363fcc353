package simulate

import "sync"

// recordLog keeps the latest requests a simulated server received, at most
// max of them (max < 0: none), for tests to inspect.
type recordLog struct {
	mu   sync.Mutex
	max  int
	list []Recorded // oldest first
}

func (l *recordLog) add(rec Recorded) {
	if l.max < 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.list) >= l.max {
		n := copy(l.list, l.list[len(l.list)-l.max+1:])
		l.list = l.list[:n]
	}
	l.list = append(l.list, rec)
}

// all returns a copy of the kept requests, oldest first.
func (l *recordLog) all() []Recorded {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Recorded(nil), l.list...)
}

// last returns the latest request.
func (l *recordLog) last() (Recorded, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.list) == 0 {
		return Recorded{}, false
	}
	return l.list[len(l.list)-1], true
}

func (l *recordLog) reset() {
	l.mu.Lock()
	l.list = nil
	l.mu.Unlock()
}
