package sqlite

import (
	"errors"
	"os"
	"syscall"
)

// datasync flushes f's data (and the metadata needed to read it back, such
// as its size) to disk: fdatasync(2).
func datasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// syncDir fsyncs a directory, so that a file created in it is found after a
// power loss.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
