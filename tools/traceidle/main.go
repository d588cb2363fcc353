// Command traceidle reads a Go execution trace (go test -trace, or
// runtime/trace) and reports, for a window of it, how much of the machine's
// cores went unused and why: the time no goroutine ran on a core, and the
// time goroutines were ready to run while fewer than -cores of them ran Go
// code and others sat in system calls (a goroutine in a blocking system
// call, such as fdatasync, keeps its P until the runtime's monitor hands the
// P to another thread), by the system call's stack.
//
// It is its own module so that the service does not depend on
// golang.org/x/exp. docs/performance.md ("Billing: Session 8 figures") has
// the commands it was used with:
//
//	cd tools/traceidle && go run . -from 0.1 -to 2.0 /tmp/trace.out
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"golang.org/x/exp/trace"
)

func main() {
	from := flag.Float64("from", 0, "start of the window, seconds after the trace's first event")
	to := flag.Float64("to", 1e9, "end of the window, seconds after the trace's first event")
	cores := flag.Int("cores", 2, "the machine's cores")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: traceidle [-from s] [-to s] [-cores n] trace.out")
		os.Exit(2)
	}
	f, err := os.Open(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer f.Close()
	if err := run(f, *from, *to, float64(*cores)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// census: with -census, also count the goroutines blocked on each thing
// while a core is idle.
var census = flag.Bool("census", false, "also report what the blocked goroutines waited for while a core had no goroutine")

func run(in io.Reader, from, to, cores float64) error {
	r, err := trace.NewReader(in)
	if err != nil {
		return err
	}
	state := map[trace.GoID]trace.GoState{}
	count := map[trace.GoState]int{}
	sysStack := map[trace.GoID]string{}
	var first, last trace.Time
	var window, noGoroutine, waitingOnSyscall float64
	lastBlocked := ""                 // why the goroutine that last stopped running stopped
	idleAfter := map[string]float64{} // core-time with no goroutine, by lastBlocked
	heldBy := map[string]float64{}    // core-time with ready work waiting, by the system calls holding Ps
	// The census: what every goroutine blocked on, and for the idle
	// core-time, how many goroutines were blocked on each thing meanwhile.
	blockedOn := map[trace.GoID]string{}
	blockedCount := map[string]int{}
	idleCensus := map[string]float64{} // idle core-time × goroutines blocked on each thing
	var idleTime float64
	for {
		ev, err := r.ReadEvent()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		t := ev.Time()
		if first == 0 {
			first = t
		}
		if at := float64(t-first) / 1e9; last != 0 && at >= from && at <= to {
			dt := float64(t - last)
			window += dt
			running, insys, ready := float64(count[trace.GoRunning]), count[trace.GoSyscall], count[trace.GoRunnable]
			if busy := running + float64(insys); busy < cores {
				noGoroutine += dt * (cores - busy)
				idleAfter[lastBlocked] += dt * (cores - busy)
				if *census {
					idleTime += dt * (cores - busy)
					for k, n := range blockedCount {
						idleCensus[k] += dt * (cores - busy) * float64(n)
					}
				}
			}
			if running < cores && ready > 0 && insys > 0 {
				w := dt * min(cores-running, float64(ready))
				waitingOnSyscall += w
				for id, s := range state {
					if s == trace.GoSyscall {
						heldBy[sysStack[id]] += w / float64(insys)
					}
				}
			}
		}
		last = t
		if ev.Kind() != trace.EventStateTransition {
			continue
		}
		st := ev.StateTransition()
		if st.Resource.Kind != trace.ResourceGoroutine {
			continue
		}
		id := st.Resource.Goroutine()
		_, next := st.Goroutine()
		if old, ok := state[id]; ok {
			count[old]--
			if old == trace.GoRunning && next != trace.GoSyscall && next != trace.GoRunning {
				lastBlocked = next.String() + " " + st.Reason + ": " + frames(st.Stack)
			}
		}
		state[id] = next
		count[next]++
		if *census {
			if k, ok := blockedOn[id]; ok {
				if blockedCount[k]--; blockedCount[k] == 0 {
					delete(blockedCount, k)
				}
				delete(blockedOn, id)
			}
			if next == trace.GoWaiting {
				k := st.Reason + ": " + frames(st.Stack)
				blockedOn[id] = k
				blockedCount[k]++
			}
		}
		if next == trace.GoSyscall {
			sysStack[id] = frames(st.Stack)
		}
	}
	if window == 0 {
		return fmt.Errorf("no events between %gs and %gs", from, to)
	}
	pct := func(v float64) float64 { return v / window / cores * 100 }
	fmt.Printf("window %.3fs\n", window/1e9)
	fmt.Printf("no goroutine on a core: %.1f%% of the cores; by what the last goroutine to stop waited for:\n", pct(noGoroutine))
	printTop(idleAfter, pct, 12)
	fmt.Printf("ready goroutines waiting while Ps sat in system calls: %.1f%% of the cores; by system call:\n", pct(waitingOnSyscall))
	printTop(heldBy, pct, 12)
	if *census && idleTime > 0 {
		fmt.Printf("while a core had no goroutine, goroutines blocked on average on:\n")
		keys := make([]string, 0, len(idleCensus))
		for k := range idleCensus {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return idleCensus[keys[i]] > idleCensus[keys[j]] })
		for _, k := range keys[:min(15, len(keys))] {
			fmt.Printf("  %6.1f  %s\n", idleCensus[k]/idleTime, k)
		}
	}
	return nil
}

func printTop(m map[string]float64, pct func(float64) float64, n int) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] })
	for _, k := range keys[:min(n, len(keys))] {
		fmt.Printf("  %5.2f%%  %s\n", pct(m[k]), k)
	}
}

// frames is the first few frames of st outside the runtime and syscall
// packages, innermost first.
func frames(st trace.Stack) string {
	var out []string
	for fr := range st.Frames() {
		fn := fr.Func
		if i := strings.LastIndex(fn, "/"); i >= 0 {
			fn = fn[i+1:]
		}
		if strings.HasPrefix(fn, "runtime.") || strings.HasPrefix(fn, "internal/") || strings.HasPrefix(fn, "syscall.") {
			continue
		}
		out = append(out, fn)
		if len(out) == 3 {
			break
		}
	}
	return strings.Join(out, " < ")
}
