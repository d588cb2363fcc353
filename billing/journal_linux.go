package billing

import (
	"os"
	"syscall"
)

// allocate reserves size bytes of f on disk without writing them
// (fallocate: the blocks read as zeros), so that creating a journal dirties
// no page for the kernel to write back; where the file system cannot, it
// writes zeros.
func allocate(f *os.File, size int) error {
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, int64(size)); err == nil {
		return nil
	}
	return writeZeros(f, size)
}
