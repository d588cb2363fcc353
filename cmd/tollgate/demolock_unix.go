//go:build unix

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// lockDemoDir takes DIR/demo.lock with flock(2), so that a second `tollgate
// demo` on the same directory (the same database) says so and exits. The
// kernel drops the lock when its process ends however it ends, so a lock
// file left by a dead process blocks nothing. unlock releases it.
func lockDemoDir(dir string) (unlock func(), err error) {
	path := filepath.Join(dir, "demo.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			b, _ := os.ReadFile(path)
			who := "another tollgate demo"
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				who += " (pid " + strconv.Itoa(pid) + ")"
			}
			return nil, fmt.Errorf("%s is already running on %s: stop it first, or give this one its own --dir", who, dir)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// The pid is for the message above only; the lock itself is the flock.
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
