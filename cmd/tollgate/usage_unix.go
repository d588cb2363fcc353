//go:build unix

package main

import (
	"syscall"
	"time"
)

// readUsage is what getrusage(2) says of the whole process.
func readUsage() procUsage {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return procUsage{}
	}
	return procUsage{cpu: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), sleeps: ru.Nvcsw}
}
