package memory

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// maxVMStatSize bounds how much of /proc/vmstat is read: about 180 lines of under 40 bytes on
// current kernels.
const maxVMStatSize = 64 << 10

// errNoOOMKill marks a /proc/vmstat without the oom_kill counter (kernels older than 4.13).
var errNoOOMKill = errors.New(`no "oom_kill" line (kernel older than 4.13?)`)

// parseOOMKills returns the oom_kill counter of /proc/vmstat: how many processes the kernel's
// OOM killer has killed since boot, in any cgroup. prometheus/procfs has no /proc/vmstat
// parser, hence this small one; reading is kept apart from parsing so it is tested over
// fixtures. Other lines are ignored. It works on the bytes in place: a string or a scanner
// buffer per check would be most of what the memory check allocates.
func parseOOMKills(data []byte) (uint64, error) {
	for line := range bytes.Lines(data) {
		name, value, ok := bytes.Cut(line, []byte(" "))
		if !ok || string(name) != "oom_kill" {
			continue
		}
		value = bytes.TrimSpace(value)
		n, err := strconv.ParseUint(string(value), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("oom_kill %q: %w", value, err)
		}
		return n, nil
	}
	return 0, errNoOOMKill
}
