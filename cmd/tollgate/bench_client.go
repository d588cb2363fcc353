package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"time"
)

// The paired phases' client can run in a process of its own
// (`tollgate bench --client-process`), as every real client of tollgate does.
// In the bench's own process (the default) it shares Go's scheduler with
// tollgate and the simulator: after tollgate flushes a stream's first content,
// the client's goroutine is ready in the kernel but runs only once a thread
// of the process polls the network, often only when tollgate's goroutine has
// finished the rest of the burst. In a process of its own the client is woken
// by the kernel instead, and every hop between the processes pays a wake-up
// (docs/performance.md, "How the benchmarks are built").

// benchClientEnv, set to "1", makes a test binary run the paired client
// (TestMain), since it has no `bench-client` command line of its own.
const benchClientEnv = "TOLLGATE_BENCH_CLIENT"

// benchClientSpec is one paired phase, as the parent hands it over on stdin.
type benchClientSpec struct {
	Targets [4]target
	Label   string
	Stream  bool
	Rate    int
	Warm    time.Duration
	Dur     time.Duration
}

// benchClientCmd is the hidden `tollgate bench-client`: it reads a
// benchClientSpec on stdin, runs the paired phase and writes its
// pairedResult as JSON on stdout.
type benchClientCmd struct {
	stdout, stderr io.Writer
}

func (c *benchClientCmd) Run(ctx context.Context, args []string) error {
	if len(args) != 0 {
		return fmt.Errorf("bench-client takes no arguments (it is run by tollgate bench)")
	}
	var spec benchClientSpec
	if err := json.NewDecoder(os.Stdin).Decode(&spec); err != nil {
		return fmt.Errorf("bench-client: reading the phase: %w", err)
	}
	res := runPaired(ctx, newBenchClient(), spec.Targets, spec.Label, spec.Stream, spec.Rate, spec.Warm, spec.Dur)
	res.ClientProcess = true
	return json.NewEncoder(c.stdout).Encode(res)
}

// newBenchClient is the load generator's HTTP client.
func newBenchClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096, MaxIdleConns: 4096, DisableCompression: true}}
}

// runPairedProcess runs one paired phase in a child process (this
// executable's `bench-client`) and returns what it measured.
func runPairedProcess(ctx context.Context, stderr io.Writer, targets [4]target, label string, stream bool, rate int, warm, dur time.Duration) (pairedResult, error) {
	exe, err := os.Executable()
	if err != nil {
		return pairedResult{}, err
	}
	spec := benchClientSpec{Targets: targets, Label: label, Stream: stream, Rate: rate, Warm: warm, Dur: dur}
	in, err := json.Marshal(spec)
	if err != nil {
		return pairedResult{}, err
	}
	cmd := exec.CommandContext(ctx, exe, "bench-client")
	cmd.Env = append(os.Environ(), benchClientEnv+"=1")
	cmd.Stdin = bytes.NewReader(in)
	cmd.Stderr = stderr
	out, err := cmd.Output()
	if err != nil {
		return pairedResult{}, fmt.Errorf("the paired client's process: %w", err)
	}
	var res pairedResult
	if err := json.Unmarshal(out, &res); err != nil {
		return pairedResult{}, fmt.Errorf("the paired client's answer: %w", err)
	}
	return res, nil
}
