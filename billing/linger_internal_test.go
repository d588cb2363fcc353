package billing

import (
	"testing"
	"time"
)

// The deadline of a batch that waits for company counts from the arrival of
// its oldest operation that a request waits for, not from when the worker
// took the batch: an operation that queued while the last batch was written
// has already waited that long. Writes of 600 ms and a wait of 800 ms: B,
// queued 80 ms after the worker began writing A alone, is taken at 600 ms and
// its batch must be written by 880 ms, not 1,400 ms. (The rule is checked on
// lingerUntil itself, with times made up, so that no scheduling delay of a
// loaded machine can pass for it or hide it; the worker arms its timer for
// the earlier of this deadline and a pause in arrivals.)
func TestBatchWaitCountsFromTheOldestOperation(t *testing.T) {
	const wait = 800 * time.Millisecond
	b := &Biller{opts: Options{BatchWait: wait}}
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	taken := t0.Add(600 * time.Millisecond)
	bg := &pending{at: t0.Add(10 * time.Millisecond), background: true} // a reservation's give-back, queued first
	opB := &pending{at: t0.Add(80 * time.Millisecond)}
	opC := &pending{at: t0.Add(160 * time.Millisecond)}

	if got, want := b.lingerUntil([]*pending{bg, opB, opC}, taken), opB.at.Add(wait); !got.Equal(want) {
		t.Errorf("a batch taken at %v whose oldest foreground operation queued at %v waits until %v, want %v (BatchWait after that operation)",
			taken.Sub(t0), opB.at.Sub(t0), got.Sub(t0), want.Sub(t0))
	}
	// An operation that queued before the worker's last write ended may
	// already be past its deadline: the batch is then due at once.
	late := t0.Add(2 * time.Second)
	if d := b.lingerUntil([]*pending{opB}, late); !d.Before(late) {
		t.Errorf("a batch taken %v after its operation queued may wait until %v; its %v were up already", late.Sub(opB.at), d.Sub(t0), wait)
	}
	// A batch nobody waits for (background operations only) waits
	// asyncLinger BatchWaits from when the worker began to wait.
	if got, want := b.lingerUntil([]*pending{bg}, taken), taken.Add(asyncLinger*wait); !got.Equal(want) {
		t.Errorf("a background-only batch taken at %v waits until %v, want %v", taken.Sub(t0), got.Sub(t0), want.Sub(t0))
	}
}
