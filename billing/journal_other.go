//go:build !unix

package billing

import "os"

type journalFile = *os.File

func createMapped(tmp, path string, size int) (*os.File, []byte, error) {
	return nil, nil, errJournalUnsupported
}

func unmapClose(f *os.File, mem []byte) error { return nil }

func lockIfDead(path string) (*os.File, bool, error) { return nil, false, nil }

func slotHeader(s []byte) *uint64 { return new(uint64) }
