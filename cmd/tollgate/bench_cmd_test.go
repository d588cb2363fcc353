package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
)

// TestBenchCommandPaired runs `tollgate bench` briefly (paired phases only)
// and checks that it measures every target, the TCP relay included, with no
// failed round.
func TestBenchCommandPaired(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"bench", "--billing=false", "--duration", "300ms", "--warmup", "50ms",
		"--only", "paired", "--rate", "0"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	text := out.String()
	for _, label := range []string{"non-streamed, paired, one client", "streamed, paired, one client"} {
		if !strings.Contains(text, label) {
			t.Errorf("no %q phase in:\n%s", label, text)
		}
	}
	rounds := regexp.MustCompile(`\((\d+) rounds of direct, bare proxy, tollgate, TCP relay in turn, back to back; 0 failed rounds\)`)
	if m := rounds.FindAllStringSubmatch(text, -1); len(m) != 2 || m[0][1] == "0" || m[1][1] == "0" {
		t.Errorf("want two paired phases with rounds and no failed round, got %q in:\n%s", m, text)
	}
	added := regexp.MustCompile(`added, median of the rounds' differences: tollgate -?[0-9.]+[µm]?s   bare proxy -?[0-9.]+[µm]?s   TCP relay -?[0-9.]+[µm]?s`)
	if n := len(added.FindAllString(text, -1)); n != 2 {
		t.Errorf("want the added latency of all three for both phases, got %d lines in:\n%s", n, text)
	}
}
