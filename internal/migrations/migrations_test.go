package migrations

import (
	"strings"
	"testing"
	"testing/fstest"
)

func TestReadSortsAndRejectsBadNames(t *testing.T) {
	fsys := fstest.MapFS{
		"m/0010_later.sql": {Data: []byte("B")},
		"m/0002_first.sql": {Data: []byte("A")},
	}
	ms, err := Read(fsys, "m")
	if err != nil || len(ms) != 2 || ms[0].Name != "0002_first" || ms[0].Version != 2 || ms[1].SQL != "B" {
		t.Fatalf("Read = %+v, %v", ms, err)
	}
	fsys["m/x_bad.sql"] = &fstest.MapFile{Data: []byte("C")}
	if _, err := Read(fsys, "m"); err == nil || !strings.Contains(err.Error(), "x_bad.sql") {
		t.Fatalf("a name without a number: %v", err)
	}
	delete(fsys, "m/x_bad.sql")
	fsys["m/0002_again.sql"] = &fstest.MapFile{Data: []byte("D")}
	if _, err := Read(fsys, "m"); err == nil || !strings.Contains(err.Error(), "share version 2") {
		t.Fatalf("two files with one version: %v", err)
	}
}
