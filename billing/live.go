package billing

import (
	"hash/maphash"
	"sync"
)

// liveHolds maps this instance's holds in flight to what settling them
// needs. Every request adds one key and removes it: a write-only churn of
// unique keys, which sync.Map handles badly (it copies its read map into a
// new dirty map after every promotion). Shards of plain maps under mutexes
// cost one hash and one uncontended lock.
type liveHolds struct {
	seed   maphash.Seed
	shards [liveShards]liveShard
}

const liveShards = 16

type liveShard struct {
	mu sync.Mutex
	m  map[string]liveHold
}

func (l *liveHolds) shard(id string) *liveShard {
	if l.seed == (maphash.Seed{}) {
		panic("billing: liveHolds used before init")
	}
	return &l.shards[maphash.String(l.seed, id)%liveShards]
}

func (l *liveHolds) init() {
	l.seed = maphash.MakeSeed()
	for i := range l.shards {
		l.shards[i].m = map[string]liveHold{}
	}
}

// Store records id's hold.
func (l *liveHolds) Store(id string, h liveHold) {
	s := l.shard(id)
	s.mu.Lock()
	s.m[id] = h
	s.mu.Unlock()
}

// Load returns id's hold, if there is one.
func (l *liveHolds) Load(id string) (liveHold, bool) {
	s := l.shard(id)
	s.mu.Lock()
	h, ok := s.m[id]
	s.mu.Unlock()
	return h, ok
}

// LoadAndDelete removes id's hold and returns it, if there was one.
func (l *liveHolds) LoadAndDelete(id string) (liveHold, bool) {
	s := l.shard(id)
	s.mu.Lock()
	h, ok := s.m[id]
	if ok {
		delete(s.m, id)
	}
	s.mu.Unlock()
	return h, ok
}
