package relay

import "testing"

func TestIsEventStream(t *testing.T) {
	for ct, want := range map[string]bool{
		"text/event-stream":                     true,
		"text/event-stream; charset=utf-8":      true,
		"Text/Event-Stream;charset=UTF-8":       true,
		" text/event-stream ":                   true,
		"text/event-stream ; charset=utf-8":     true,
		"application/json":                      false,
		"text/event-streams":                    false,
		"text/event":                            false,
		"":                                      false,
		"application/json; x=text/event-stream": false,
	} {
		if got := isEventStream(ct); got != want {
			t.Errorf("isEventStream(%q) = %t, want %t", ct, got, want)
		}
	}
}
