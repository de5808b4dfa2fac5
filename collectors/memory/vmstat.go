package memory

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
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
// fixtures. Other lines are ignored.
func parseOOMKills(r io.Reader) (uint64, error) {
	sc := bufio.NewScanner(io.LimitReader(r, maxVMStatSize))
	for sc.Scan() {
		// Bytes, not Text: a string per line would be ~190 allocations per check for one line.
		name, value, ok := bytes.Cut(sc.Bytes(), []byte(" "))
		if !ok || string(name) != "oom_kill" {
			continue
		}
		n, err := strconv.ParseUint(string(bytes.TrimSpace(value)), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("oom_kill %q: %w", value, err)
		}
		return n, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errNoOOMKill
}
