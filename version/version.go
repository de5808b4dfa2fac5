// Package version formats the one line both nodevigil binaries print for --version, so an
// operator comparing an agent and a remediator (or an image label and a running binary) reads
// the same fields in the same order.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Line returns "<name> <version> (commit <commit>, <go version>)". The version and commit are
// stamped into each main package with -ldflags -X; when no commit was stamped (go run, go
// install), the VCS revision the Go toolchain recorded is used, else "unknown".
func Line(name, version, commit string) string {
	if commit == "" {
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" {
					commit = s.Value
				}
			}
		}
	}
	if commit == "" {
		commit = "unknown"
	}
	return fmt.Sprintf("%s %s (commit %s, %s)", name, version, commit, runtime.Version())
}
