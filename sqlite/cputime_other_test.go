//go:build !unix

package sqlite

import "time"

// cpuTime: no getrusage here; BenchmarkCharges then reports 0 CPU.
func cpuTime() time.Duration { return 0 }
