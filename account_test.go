package tollgate

import (
	"strings"
	"testing"
	"time"
)

func TestNewOrderedIDSortsByTime(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 6, 0, 0, 0, time.UTC)
	prev := ""
	seen := map[string]bool{}
	for i := range 1000 {
		// Several ids per microsecond, and steps across digit carries.
		at := t0.Add(time.Duration(i/3) * time.Microsecond * 61)
		id := NewOrderedID("hold_", at)
		if len(id) != len("hold_")+20 || !strings.HasPrefix(id, "hold_") {
			t.Fatalf("id %q: want hold_ and 20 characters", id)
		}
		if seen[id] {
			t.Fatalf("duplicate id %q", id)
		}
		seen[id] = true
		if i%3 == 0 && id <= prev {
			t.Fatalf("id %q made at %v sorts before %q made earlier", id, at, prev)
		}
		if i%3 == 0 {
			prev = id[:len(id)-11] + "zzzzzzzzzzz" // the largest id of this microsecond
		}
	}
	// Far dates keep the fixed width.
	if a, b := NewOrderedID("x_", time.Unix(0, 0)), NewOrderedID("x_", time.Date(2390, 1, 1, 0, 0, 0, 0, time.UTC)); len(a) != len(b) || a >= b {
		t.Errorf("epoch %q vs 2390 %q", a, b)
	}
}

func TestParseExpiry(t *testing.T) {
	now := time.Date(2025, 1, 31, 10, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"720h":                      now.Add(720 * time.Hour),
		"1d":                        now.AddDate(0, 0, 1),
		"90m":                       now.Add(90 * time.Minute),
		"2026-02-01":                time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC),
		"2026-02-01T12:00:00+02:00": time.Date(2026, 2, 1, 10, 0, 0, 0, time.UTC),
	} {
		got, err := ParseExpiry(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("ParseExpiry(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0d", "-1h", "0s", "2025-01-30", "soon", "1w"} {
		if _, err := ParseExpiry(in, now); err == nil {
			t.Errorf("ParseExpiry(%q): got nil error", in)
		}
	}
}
