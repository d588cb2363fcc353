package relay

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tollgate/tollgate/openai"
)

// TestStreamKeepAliveGaps runs the stream watchdog on a made-up clock (so
// that no scheduling delay of a loaded machine can pass for a late
// keep-alive or hide one): while the backend is silent, no gap between two
// writes to the client is longer than keep_alive, also when the silence
// starts after a token rather than at the start, and also when every timer
// fires late by almost a tenth of keep_alive (the watchdog aims that much
// early). It does not flood the client either: a keep-alive goes out only
// once nothing was written for most of keep_alive. A watchdog that looked
// every quarter of keep_alive let a gap that began between two of its looks
// reach 1.25 × keep_alive.
func TestStreamKeepAliveGaps(t *testing.T) {
	const keepAlive = 200 * time.Millisecond
	for _, late := range []time.Duration{0, keepAlive/10 - time.Millisecond} {
		t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC).UnixNano()
		r := &Relay{opts: Options{KeepAlive: keepAlive, StreamIdle: 10 * time.Second, StreamTotal: time.Hour}}
		rec := httptest.NewRecorder()
		s := &streamer{x: &exchange{r: r}, w: rec, rc: *http.NewResponseController(rec), committed: true,
			endBy: t0 + int64(time.Hour), cancel: func(error) { t.Error("the watchdog ended a stream within its caps") }}
		s.lastWrite.Store(t0)
		s.lastUpstream.Store(t0)

		// Tokens 700 ms apart, the first after 105 ms: each silence starts
		// at its own point of the watchdog's schedule.
		var tokens []int64
		for k := range 4 {
			tokens = append(tokens, t0+int64(105*time.Millisecond+time.Duration(k)*700*time.Millisecond))
		}
		fire := t0 + int64(min(keepAliveDue(keepAlive), r.opts.StreamIdle, r.opts.StreamTotal)) // startWatchdog's first wait
		writes := []int64{t0}
		keepAlives := 0
		for len(tokens) > 0 {
			fireAt := fire + int64(late)
			if tokens[0] <= fireAt { // a token is written and flushed (streamer.send, flush)
				s.lastWrite.Store(tokens[0])
				s.lastUpstream.Store(tokens[0])
				writes = append(writes, tokens[0])
				tokens = tokens[1:]
				continue
			}
			n := rec.Body.Len()
			wait, again := s.round(fireAt)
			if !again {
				t.Fatalf("late %v: the watchdog stopped at %v", late, time.Duration(fireAt-t0))
			}
			if rec.Body.Len() > n {
				if got := rec.Body.Bytes()[n:]; !bytes.Equal(got, openai.KeepAliveComment) {
					t.Fatalf("the watchdog wrote %q", got)
				}
				if since := time.Duration(fireAt - writes[len(writes)-1]); since < keepAlive/2 {
					t.Errorf("late %v: a keep-alive at %v came only %v after the previous write", late, time.Duration(fireAt-t0), since)
				}
				writes = append(writes, fireAt)
				keepAlives++
			}
			fire = fireAt + int64(wait)
		}
		for i := 1; i < len(writes); i++ {
			if gap := time.Duration(writes[i] - writes[i-1]); gap > keepAlive {
				t.Errorf("timers late by %v: a write at %v came %v after the previous one; keep_alive is %v", late, time.Duration(writes[i]-t0), gap, keepAlive)
			}
		}
		if keepAlives < 6 {
			t.Errorf("timers late by %v: %d keep-alives in 2.2 s of silences with keep_alive %v", late, keepAlives, keepAlive)
		}
	}
}
