//go:build unix && !linux

package billing

import "os"

// allocate reserves size bytes of f on disk by writing zeros.
func allocate(f *os.File, size int) error { return writeZeros(f, size) }
