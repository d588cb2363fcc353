package main

import (
	"context"
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
type versionCmd struct{ stdout io.Writer }

func (c *versionCmd) Run(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] != "-h" && args[0] != "--help" {
		return usageError{"version takes no arguments"}
	}
	b := buildInfo()
	fmt.Fprintf(c.stdout, "tollgate %s (commit %s, %s)\n", b.Version, b.Commit, b.GoVersion)
	return nil
}
