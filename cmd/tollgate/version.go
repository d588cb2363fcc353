package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/tollgate/tollgate/metrics"
)

// version is set at build time for releases:
//
//	go build -ldflags "-X main.version=v1.4.0 -X main.commit=$(git rev-parse HEAD)" ./cmd/tollgate
//
// Otherwise the module version of the build (or "devel") and the VCS stamp
// Go records when it builds from a checkout.
var version, commit = "", ""

// buildInfo is what `tollgate version`, /healthz and tollgate_build_info report.
func buildInfo() metrics.Build {
	b := metrics.ReadBuild(version)
	if commit != "" {
		b.Commit = commit
	}
	return b
}

// versionCmd is `tollgate version`.
type versionCmd struct{ stdout, stderr io.Writer }

func (c *versionCmd) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	fs.Usage = func() {
		fmt.Fprintln(c.stderr, "Usage: tollgate version")
		fmt.Fprintln(c.stderr, "\nPrints the binary's version, commit and Go version (/healthz and the")
		fmt.Fprintln(c.stderr, "tollgate_build_info metric report the same version and commit).")
	}
	if err := fs.Parse(args); err != nil {
		return flagErr(err)
	}
	if fs.NArg() > 0 {
		return usageError{"version takes no arguments"}
	}
	b := buildInfo()
	fmt.Fprintf(c.stdout, "tollgate %s (commit %s, %s)\n", b.Version, b.Commit, b.GoVersion)
	return nil
}
