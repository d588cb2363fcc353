//go:build unix

package billing

import (
	"errors"
	"os"
	"syscall"
	"unsafe"
)

// journalFile is the journal's open file; its lock (flock) says its process
// is alive.
type journalFile = *os.File

// createMapped creates the file at tmp with size zero bytes, allocated on
// disk (not sparse: a store into a hole of a full disk would kill the
// process), locks it, maps it and renames it to path.
func createMapped(tmp, path string, size int) (*os.File, []byte, error) {
	// Not truncated before it is locked: another process starting with the
	// same instance id may hold it, mapped.
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, nil, err
	}
	fail := func(err error) (*os.File, []byte, error) {
		f.Close()
		os.Remove(tmp)
		return nil, nil, err
	}
	if err := f.Truncate(0); err != nil {
		return fail(err)
	}
	if err := allocate(f, size); err != nil {
		return fail(err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		syscall.Munmap(mem)
		return fail(err)
	}
	return f, mem, nil
}

// unmapClose unmaps mem and closes f (which releases its lock).
func unmapClose(f *os.File, mem []byte) error {
	err := syscall.Munmap(mem)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// lockIfDead opens the journal at path and takes its lock. ok is false when
// another process holds it (its owner is alive, or another instance is
// recovering it) or the file is gone.
func lockIfDead(path string) (f *os.File, ok bool, err error) {
	f, err = os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, err
	}
	// Locked: but if it was recovered and deleted between the open and the
	// lock, this is a file nobody will see again.
	if _, err := os.Stat(path); err != nil {
		f.Close()
		return nil, false, nil
	}
	return f, true, nil
}

// slotHeader is the 8-byte header at the start of slot s (slots are
// 512-byte aligned in a page-aligned mapping, so the word is aligned).
func slotHeader(s []byte) *uint64 { return (*uint64)(unsafe.Pointer(&s[0])) }

// writeZeros allocates size bytes of f by writing them.
func writeZeros(f *os.File, size int) error {
	zero := make([]byte, 1<<20)
	for off := 0; off < size; off += len(zero) {
		if _, err := f.WriteAt(zero[:min(len(zero), size-off)], int64(off)); err != nil {
			return err
		}
	}
	return nil
}
