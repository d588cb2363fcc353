//go:build cgo && mattn

// Built only with the mattn tag: compiling mattn/go-sqlite3's C (cgo) took
// minutes of every cold `go test ./...` for one comparison benchmark.
//
//	go test -tags mattn -run '^$' -bench BenchmarkDriver -benchtime 2s ./sqlite/

package sqlite

import _ "github.com/mattn/go-sqlite3" // registers driver "sqlite3"; test binary only

func init() {
	benchDrivers = append(benchDrivers, driver{name: "sqlite3", label: "mattn"}, driver{name: "sqlite3", label: "mattn-sync-normal", synchronous: "NORMAL"})
}
