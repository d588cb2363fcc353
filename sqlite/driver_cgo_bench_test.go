//go:build cgo

package sqlite

import _ "github.com/mattn/go-sqlite3" // registers driver "sqlite3"; test binary only

func init() {
	benchDrivers = append(benchDrivers, driver{name: "sqlite3", label: "mattn"}, driver{name: "sqlite3", label: "mattn-sync-normal", synchronous: "NORMAL"})
}
