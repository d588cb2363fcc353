//go:build !linux

package sqlite

import "os"

// datasync flushes f to disk; without fdatasync(2) that is os.File.Sync
// (fsync, F_FULLFSYNC on macOS).
func datasync(f *os.File) error { return f.Sync() }

// syncDir: directories cannot be synced portably (Windows cannot open them
// as files); the file's own sync is what there is.
func syncDir(string) error { return nil }
