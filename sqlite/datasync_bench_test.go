package sqlite

import (
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkSync measures what durability costs on this file system: a 4 KiB
// write then fsync (SQLite's synchronous=FULL in the pure-Go build) or
// fdatasync (the store's own WAL sync, walsync.go), with the process's CPU
// time per operation beside the wall time. "append" grows the file (a WAL
// before its first checkpoint); "overwrite" writes within its size (a WAL
// that restarted from its beginning after a checkpoint, its usual state).
//
//	go test -run '^$' -bench BenchmarkSync -benchtime 2000x ./sqlite/
func BenchmarkSync(b *testing.B) {
	for _, c := range []struct {
		name      string
		sync      func(*os.File) error
		overwrite bool
	}{
		{"fsync/append", (*os.File).Sync, false},
		{"fdatasync/append", datasync, false},
		{"fsync/overwrite", (*os.File).Sync, true},
		{"fdatasync/overwrite", datasync, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			f, err := os.OpenFile(filepath.Join(b.TempDir(), "wal"), os.O_CREATE|os.O_RDWR, 0o644)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			page := make([]byte, 4096)
			const region = 256 // pages overwritten in turn
			if c.overwrite {
				if _, err := f.Write(make([]byte, region*len(page))); err != nil {
					b.Fatal(err)
				}
				if err := f.Sync(); err != nil {
					b.Fatal(err)
				}
			}
			cpu0 := cpuTime()
			i := 0
			for b.Loop() {
				var err error
				if c.overwrite {
					_, err = f.WriteAt(page, int64(i%region*len(page)))
				} else {
					_, err = f.Write(page)
				}
				if err != nil {
					b.Fatal(err)
				}
				i++
				if err := c.sync(f); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}
