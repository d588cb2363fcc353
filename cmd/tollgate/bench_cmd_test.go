package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
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
	rounds := regexp.MustCompile(`\((\d+) rounds of direct, bare proxy, tollgate, TCP relay in turn, back to back, client in this process; 0 failed rounds\)`)
	if m := rounds.FindAllStringSubmatch(text, -1); len(m) != 2 || m[0][1] == "0" || m[1][1] == "0" {
		t.Errorf("want two paired phases with rounds and no failed round, got %q in:\n%s", m, text)
	}
	added := regexp.MustCompile(`added, median of the rounds' differences: tollgate -?[0-9.]+[µm]?s   bare proxy -?[0-9.]+[µm]?s   TCP relay -?[0-9.]+[µm]?s`)
	if n := len(added.FindAllString(text, -1)); n != 2 {
		t.Errorf("want the added latency of all three for both phases, got %d lines in:\n%s", n, text)
	}
}

// TestMain lets the test binary stand in for `tollgate bench-client`, the
// paired client's own process (bench --client-process re-executes itself).
func TestMain(m *testing.M) {
	if os.Getenv(benchClientEnv) == "1" {
		os.Exit(run(context.Background(), []string{"bench-client"}, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// TestBenchCommandClientProcess runs the paired phases with the client in a
// process of its own and checks that the child measured every round.
func TestBenchCommandClientProcess(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"bench", "--billing=false", "--duration", "300ms", "--warmup", "50ms",
		"--only", "streamed, paired", "--rate", "0", "--client-process"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	text := out.String()
	rounds := regexp.MustCompile(`\((\d+) rounds of direct, bare proxy, tollgate, TCP relay in turn, back to back, client in its own process; 0 failed rounds\)`)
	if m := rounds.FindAllStringSubmatch(text, -1); len(m) != 2 || m[0][1] == "0" || m[1][1] == "0" {
		t.Errorf("want two paired phases measured by a client process, got %q in:\n%s", m, text)
	}
	if !regexp.MustCompile(`time to first content added: tollgate -?[0-9.]+[µm]?s`).MatchString(text) {
		t.Errorf("no time to first content from the client process in:\n%s", text)
	}
}

// TestBenchCommandInstances runs the multi-instance workload briefly, with
// the nodes' KV-cache events and a node restart halfway: a row for one
// instance and one for two, both served without errors from the nodes'
// caches, and the share per window.
func TestBenchCommandInstances(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"bench", "--workload", "multiturn", "--policies", "prefix_cache+kv",
		"--nodes", "3", "--instances", "2", "--store", "sqlite", "--duration", "3s", "--concurrency", "6", "--think", "50ms",
		"--prefill-tokens-per-sec", "200000", "--decode-tokens-per-sec", "2000", "--disrupt", "restart", "--window", "1s"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	text := out.String()
	row := regexp.MustCompile(`multiturn +prefix_cache\+kv +(\d) +(\d+) +(\d+) .* ([0-9.]+)% `)
	rows := row.FindAllStringSubmatch(text, -1)
	if len(rows) != 2 || rows[0][1] != "1" || rows[1][1] != "2" {
		t.Fatalf("want rows for 1 and 2 instances, got %q in:\n%s", rows, text)
	}
	for _, r := range rows {
		if r[2] == "0" || r[3] != "0" || r[4] == "0.0" {
			t.Errorf("%s instance(s): %s requests, %s errors, %s%% cached:\n%s", r[1], r[2], r[3], r[4], text)
		}
	}
	if !strings.Contains(text, "cached share per 1s window (restart at 1.5s):") {
		t.Errorf("no windows in:\n%s", text)
	}
}

// TestBenchCommandLoadPoll runs the +load policy (each instance reads the
// nodes' /metrics) briefly on two instances: served from the nodes'
// caches without errors; an unknown option is a usage error.
func TestBenchCommandLoadPoll(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"bench", "--workload", "multiturn", "--policies", "prefix_cache+kv+load",
		"--nodes", "3", "--instances", "2", "--store", "sqlite", "--duration", "2s", "--concurrency", "6", "--think", "50ms",
		"--prefill-tokens-per-sec", "200000", "--decode-tokens-per-sec", "2000", "--load-poll", "50ms"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	text := out.String()
	rows := regexp.MustCompile(`multiturn +prefix_cache\+kv\+load +(\d) +(\d+) +(\d+) .* ([0-9.]+)% `).FindAllStringSubmatch(text, -1)
	if len(rows) != 2 {
		t.Fatalf("want rows for 1 and 2 instances, got %q in:\n%s", rows, text)
	}
	for _, r := range rows {
		if r[2] == "0" || r[3] != "0" || r[4] == "0.0" {
			t.Errorf("%s instance(s): %s requests, %s errors, %s%% cached:\n%s", r[1], r[2], r[3], r[4], text)
		}
	}
	// Every instance polled every node, and their reports were in use.
	for _, want := range []string{"load: 3 of 3 polled nodes reporting at the end", "load: 6 of 6 polled nodes reporting at the end"} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in:\n%s", want, text)
		}
	}
	for _, bad := range []string{"least_outstanding+kv", "prefix_cache+load+load", "prefix_cache+fast"} {
		out.Reset()
		errb.Reset()
		if code := run(context.Background(), []string{"bench", "--workload", "multiturn", "--policies", bad}, &out, &errb); code != 2 ||
			!strings.Contains(errb.String(), "--policies") {
			t.Errorf("--policies %s: exit %d, stderr %q", bad, code, errb.String())
		}
	}
}

// TestBenchCommandRepeat runs a policy in two rounds on one instance and on
// two: a row per round, then the rounds pooled, with the count of rounds
// in which two instances did no worse than one.
func TestBenchCommandRepeat(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"bench", "--workload", "multiturn", "--policies", "prefix_cache",
		"--nodes", "2", "--instances", "2", "--store", "sqlite", "--duration", "1s", "--concurrency", "4", "--think", "50ms",
		"--prefill-tokens-per-sec", "200000", "--decode-tokens-per-sec", "2000", "--repeat", "2"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	text := out.String()
	rows := regexp.MustCompile(`(?m)^ +multiturn +prefix_cache +(\d) +(\d+) +0 .* (\d)$`).FindAllStringSubmatch(text, -1)
	var got []string
	for _, r := range rows {
		got = append(got, r[1]+"@"+r[3])
		if r[2] == "0" {
			t.Errorf("a run served nothing: %q", r[0])
		}
	}
	if strings.Join(got, " ") != "1@1 2@1 1@2 2@2" {
		t.Errorf("rows (instances@round) %v, want 1@1 2@1 1@2 2@2, in:\n%s", got, text)
	}
	pooled := regexp.MustCompile(`(?m)^ +multiturn +prefix_cache +2 +(\d+) +0 +[0-9.]+% .* [0-2]/2, [0-2]/2$`).FindStringSubmatch(text)
	if !strings.Contains(text, "all 2 rounds pooled:") || pooled == nil {
		t.Fatalf("no pooled row for 2 instances in:\n%s", text)
	}
	var sum int
	for _, r := range rows {
		if r[1] == "2" {
			var n int
			fmt.Sscan(r[2], &n)
			sum += n
		}
	}
	if pooled[1] != fmt.Sprint(sum) {
		t.Errorf("pooled requests %s, want the rounds' %d", pooled[1], sum)
	}
}

// TestBenchInstanceSlots checks the nodes' max_concurrent each of several
// instances is given: the node's slots divided among them by default,
// --instance-slots when set, the whole with +load.
func TestBenchInstanceSlots(t *testing.T) {
	for _, c := range []struct {
		policy        string
		instanceSlots int
		want          int64
	}{
		{"prefix_cache", 0, 6},
		{"prefix_cache", 11, 11},
		{"prefix_cache+kv+load", 11, 16},
	} {
		o := workloadOpts{nodes: 2, slots: 16, cacheTokens: 1000, prefillRate: 1e6, decodeRate: 1e4, margin: 6,
			instances: 3, instanceMargin: 4, instanceSlots: c.instanceSlots, store: "sqlite", loadPoll: 100 * time.Millisecond, loadMargin: 8}
		g, err := startGPUFleet(context.Background(), o, c.policy, 3)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range g.mains {
			for _, n := range m.Config.Models[0].Backends[0].Nodes {
				if n.MaxConcurrent != c.want {
					t.Errorf("%s, --instance-slots %d: instance %d's %s has max_concurrent %d, want %d", c.policy, c.instanceSlots, i, n.Name, n.MaxConcurrent, c.want)
				}
			}
		}
		g.close()
	}
}

// printPooled takes percentiles over every round's requests together, and
// compares several instances with one instance of the same round only.
func TestBenchPrintPooled(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		d := make([]time.Duration, len(v))
		for i, x := range v {
			d[i] = time.Duration(x) * time.Millisecond
		}
		return d
	}
	res := func(k, round int, ttft []time.Duration) workloadResult {
		return workloadResult{mix: "m", policy: "p", instances: k, round: round, requests: int64(len(ttft)),
			promptTokens: 100, cachedTokens: 50, ttft: ttft, perNode: []int64{1, 1}}
	}
	// Round 1: 3 instances faster than one; round 2: slower than that
	// round's one, yet faster than round 1's one.
	all := []workloadResult{
		res(1, 1, ms(400, 400)), res(3, 1, ms(100, 300)),
		res(1, 2, ms(10, 20)), res(3, 2, ms(200, 200)),
	}
	var out bytes.Buffer
	(&benchCmd{stdout: &out, stderr: &out}).printPooled(all, 2)
	row := regexp.MustCompile(`(?m)^ +m +p +3 +4 +0 +50\.0% +(\S+) +(\S+) +(\S+) +1\.00 +(\d/2, \d/2)$`).FindStringSubmatch(out.String())
	if row == nil {
		t.Fatalf("no pooled row for 3 instances in:\n%s", out.String())
	}
	// Pooled: 100 200 200 300 ms: mean 200, p50 the third, p99 the last.
	if row[1] != "200ms" || row[2] != "200ms" || row[3] != "300ms" || row[4] != "1/2, 1/2" {
		t.Errorf("pooled mean, p50, p99, rounds no worse = %q, want 200ms 200ms 300ms \"1/2, 1/2\"", row[1:])
	}
}
