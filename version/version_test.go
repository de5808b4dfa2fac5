package version

import (
	"runtime"
	"strings"
	"testing"
)

func TestLine(t *testing.T) {
	tests := []struct {
		name, version, commit string
		want                  string
	}{
		{"nodevigil-agent", "v1.2.3", "abc123", "nodevigil-agent v1.2.3 (commit abc123, " + runtime.Version() + ")"},
		{"nodevigil-remediator", "dev", "deadbeef", "nodevigil-remediator dev (commit deadbeef, " + runtime.Version() + ")"},
	}
	for _, tt := range tests {
		if got := Line(tt.name, tt.version, tt.commit); got != tt.want {
			t.Errorf("Line(%q, %q, %q) = %q, want %q", tt.name, tt.version, tt.commit, got, tt.want)
		}
	}
	// No stamped commit: the toolchain's VCS revision (none in a test binary) or "unknown".
	if got := Line("x", "dev", ""); !strings.HasPrefix(got, "x dev (commit ") || strings.Contains(got, "commit ,") {
		t.Errorf("Line without a commit = %q, want a filled-in commit", got)
	}
}
