package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate/postgres"
)

// pgCluster is a PostgreSQL cluster of the test's own, in a temp dir on a
// free port, that the test may crash and stop (the server the other tests
// use belongs to the machine and is never restarted). As root, its
// commands run as nobody (PostgreSQL refuses to run as root).
type pgCluster struct {
	t      *testing.T
	bin    string // the directory of initdb and pg_ctl
	dir    string
	port   int
	asUser bool
}

// pgBinDir finds initdb and pg_ctl: on PATH, in /usr/local/bin, or in
// Debian's /usr/lib/postgresql/*/bin. Missing, the test fails: .ci/run
// installs the postgresql package.
func pgBinDir(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p)
	}
	cands, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	for _, c := range append([]string{"/usr/local/bin/initdb"}, cands...) {
		if _, err := os.Stat(c); err == nil {
			return filepath.Dir(c)
		}
	}
	t.Fatal("initdb is not installed (apt-get install postgresql)")
	return ""
}

func startPGCluster(t *testing.T) *pgCluster {
	t.Helper()
	dir, err := os.MkdirTemp("", "tollgate-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	c := &pgCluster{t: t, bin: pgBinDir(t), dir: dir, port: port, asUser: os.Geteuid() == 0}
	if c.asUser {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dir, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	c.run("initdb", "-D", c.data(), "-U", "postgres", "--auth=trust", "-N")
	c.ctl("start")
	t.Cleanup(func() { _ = c.cmd("pg_ctl", "-D", c.data(), "-m", "immediate", "-w", "stop").Run() })
	return c
}

func (c *pgCluster) data() string { return filepath.Join(c.dir, "data") }

func (c *pgCluster) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

func (c *pgCluster) cmd(name string, args ...string) *exec.Cmd {
	path := filepath.Join(c.bin, name)
	if c.asUser {
		return exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", path}, args...)...)
	}
	return exec.Command(path, args...)
}

func (c *pgCluster) run(name string, args ...string) {
	c.t.Helper()
	if out, err := c.cmd(name, args...).CombinedOutput(); err != nil {
		c.t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// ctl runs pg_ctl action (start, stop, restart) with more args, and waits.
func (c *pgCluster) ctl(action string, more ...string) {
	c.t.Helper()
	args := append([]string{"-D", c.data(), "-l", filepath.Join(c.dir, "log"), "-w", "-o",
		"-p " + strconv.Itoa(c.port) + " -k " + c.data() + " -c listen_addresses=127.0.0.1 -c fsync=off"}, more...)
	c.run("pg_ctl", append([]string{action}, args...)...)
}

// TestOutageOwnPostgres: the outage as an operator's bad day has it, on a
// cluster of the test's own: the database crashes (pg_ctl restart -m
// immediate), then is stopped for 10 s, and one instance is killed with
// kill -9 while it is down. The checks are outageScenario's: every cost a
// client saw is in the ledger once, no 500, holds back to zero, audit
// clean.
func TestOutageOwnPostgres(t *testing.T) {
	if os.Getenv(postgres.TestEnv) == "" {
		t.Skip(postgres.TestEnv + " is not set; skipping a PostgreSQL test")
	}
	c := startPGCluster(t)
	t.Setenv(postgres.TestEnv, c.url())
	schema := postgres.NewTestSchema(t)
	outageScenario(t, schema, pgURLWithSchema(t, schema), "200ms", func(kill func()) (down, restored time.Time) {
		c.ctl("restart", "-m", "immediate")
		time.Sleep(1500 * time.Millisecond)
		// Fast shutdown drops every client connection as it begins, and
		// the instances' auth cache serves for 3 s without the store:
		// the outage starts when the stop is asked, not when pg_ctl
		// returns (which can take longer than those 3 s).
		down = time.Now()
		c.ctl("stop", "-m", "fast")
		time.Sleep(time.Second)
		kill()
		time.Sleep(9 * time.Second)
		c.ctl("start")
		return down, time.Now()
	})
}
