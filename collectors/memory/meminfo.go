package memory

import (
	"bytes"
	"fmt"
	"strconv"
)

// maxMeminfoSize bounds how much of /proc/meminfo is read: about 55 lines of under 32 bytes
// on current kernels.
const maxMeminfoSize = 64 << 10

// meminfo is what the check needs of /proc/meminfo, in bytes.
type meminfo struct {
	totalBytes, availableBytes uint64
	hasTotal, hasAvailable     bool
}

// parseMeminfo reads MemTotal and MemAvailable from /proc/meminfo. Every line must have the
// kernel's shape, "Key:  value" with an optional "kB" unit, as prometheus/procfs required when
// this check read the file through it: a file that is not meminfo is an error, not a zero.
// It parses bytes in place, so a check allocates nothing for the ~55 lines it skips; the
// file is read with collectors/hostfile, which is why procfs's reader is not used here.
func parseMeminfo(data []byte) (meminfo, error) {
	var m meminfo
	for line := range bytes.Lines(data) {
		line = bytes.TrimSuffix(line, []byte("\n"))
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		key, rest, ok := bytes.Cut(line, []byte(":"))
		fields := bytes.Fields(rest)
		if !ok || len(key) == 0 || len(fields) == 0 || len(fields) > 2 || (len(fields) == 2 && string(fields[1]) != "kB") {
			return meminfo{}, fmt.Errorf("malformed line %q", line)
		}
		v, err := strconv.ParseUint(string(fields[0]), 10, 64)
		if err != nil {
			return meminfo{}, fmt.Errorf("malformed line %q: %w", line, err)
		}
		if len(fields) == 2 {
			if v > (1<<64-1)/1024 {
				return meminfo{}, fmt.Errorf("malformed line %q: value out of range", line)
			}
			v *= 1024
		}
		switch string(key) {
		case "MemTotal":
			m.totalBytes, m.hasTotal = v, true
		case "MemAvailable":
			m.availableBytes, m.hasAvailable = v, true
		}
	}
	return m, nil
}
