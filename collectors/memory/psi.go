package memory

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/nodevigil/nodevigil/collectors"
)

// maxPSIFileSize bounds how much of a pressure file is read. The kernel writes two lines of
// about 60 bytes; anything much larger is not a PSI file.
const maxPSIFileSize = 64 << 10

// maxPSILineSize bounds one line of a pressure file: the kernel's are about 60 bytes, and a
// longer one is rejected before its fields are quoted in an error message.
const maxPSILineSize = 4096

// kubepodsPressureFiles are the cgroup v2 memory.pressure files of the cgroup the kubelet puts
// every pod under, relative to the host root, in the order they are tried: the systemd cgroup
// driver names it kubepods.slice, the cgroupfs driver kubepods.
var kubepodsPressureFiles = []string{
	"sys/fs/cgroup/kubepods.slice/memory.pressure",
	"sys/fs/cgroup/kubepods/memory.pressure",
}

// psiLine is one line of a PSI file: the share of wall time, in percent, during which tasks
// were stalled on memory, averaged over 10, 60 and 300 seconds, and the cumulative stall time
// in microseconds.
type psiLine struct {
	Avg10  float64
	Avg60  float64
	Avg300 float64
	Total  uint64
}

// psiStats is a parsed PSI file. "some" is the share of time at least one task was stalled,
// "full" the share of time all non-idle tasks were stalled at once. A line the file did not
// carry has its Has flag false; values are kept inline so parsing allocates little.
type psiStats struct {
	Some    psiLine
	HasSome bool
	Full    psiLine
	HasFull bool
}

// errPSIUnsupported marks a host whose kernel does not provide memory PSI: the file is missing
// (kernel older than 4.20, CONFIG_PSI off, psi=0 on the command line) or reading it returns
// EOPNOTSUPP (PSI disabled at runtime). It wraps collectors.ErrNotSupported so callers can
// keep it apart from real failures.
var errPSIUnsupported = fmt.Errorf("memory pressure stall information: %w", collectors.ErrNotSupported)

// isUnsupported reports whether a read error means "this kernel has no PSI" rather than a
// failure worth reporting.
func isUnsupported(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.EOPNOTSUPP)
}

// parsePSI parses the PSI text format shared by /proc/pressure/memory and cgroup v2
// memory.pressure files:
//
//	some avg10=0.12 avg60=0.05 avg300=0.01 total=123456
//	full avg10=0.00 avg60=0.00 avg300=0.00 total=4567
//
// Lines with other prefixes and unknown key=value fields are ignored, so a future kernel that
// adds some does not break the check. A known line must carry avg10, avg60, avg300 (finite,
// between 0 and 100) and total exactly once; a file with neither a some nor a full line is an
// error.
func parsePSI(data []byte) (psiStats, error) {
	var st psiStats
	for line := range bytes.Lines(data) {
		if len(line) > maxPSILineSize {
			return psiStats{}, fmt.Errorf("line of %d bytes is too long for PSI (at most %d)", len(line), maxPSILineSize)
		}
		kind, rest, _ := strings.Cut(strings.TrimSpace(string(line)), " ")
		var dst *psiLine
		switch kind {
		case "some":
			if st.HasSome {
				return psiStats{}, errors.New(`duplicate "some" line`)
			}
			st.HasSome = true
			dst = &st.Some
		case "full":
			if st.HasFull {
				return psiStats{}, errors.New(`duplicate "full" line`)
			}
			st.HasFull = true
			dst = &st.Full
		default:
			continue
		}
		l, err := parsePSIFields(rest)
		if err != nil {
			return psiStats{}, fmt.Errorf("%s line: %w", kind, err)
		}
		*dst = l
	}
	if !st.HasSome && !st.HasFull {
		return psiStats{}, errors.New(`no "some" or "full" line`)
	}
	return st, nil
}

// parsePSIFields parses the key=value part of one PSI line.
func parsePSIFields(s string) (psiLine, error) {
	const (
		seenAvg10 = 1 << iota
		seenAvg60
		seenAvg300
		seenTotal
		seenAll = seenAvg10 | seenAvg60 | seenAvg300 | seenTotal
	)
	var (
		l    psiLine
		seen int
	)
	for _, field := range strings.Fields(s) {
		key, val, ok := strings.Cut(field, "=")
		if !ok {
			return psiLine{}, fmt.Errorf("field %q is not key=value", field)
		}
		var bit int
		var avg *float64
		switch key {
		case "avg10":
			bit, avg = seenAvg10, &l.Avg10
		case "avg60":
			bit, avg = seenAvg60, &l.Avg60
		case "avg300":
			bit, avg = seenAvg300, &l.Avg300
		case "total":
			bit = seenTotal
		default:
			continue
		}
		if seen&bit != 0 {
			return psiLine{}, fmt.Errorf("duplicate field %q", key)
		}
		seen |= bit
		if avg == nil {
			t, err := strconv.ParseUint(val, 10, 64)
			if err != nil {
				return psiLine{}, fmt.Errorf("total: %w", err)
			}
			l.Total = t
			continue
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return psiLine{}, fmt.Errorf("%s: %w", key, err)
		}
		if err := checkPercent(v); err != nil {
			return psiLine{}, fmt.Errorf("%s: %w", key, err)
		}
		*avg = v
	}
	if seen != seenAll {
		return psiLine{}, errors.New("want avg10, avg60, avg300 and total")
	}
	return l, nil
}

// checkPercent rejects values a PSI average can never take.
func checkPercent(v float64) error {
	if math.IsNaN(v) || v < 0 || v > 100 {
		return fmt.Errorf("%v is not a percentage", v)
	}
	return nil
}

// readKubepodsPSI reads the memory.pressure file of the kubelet's pod cgroup. It returns an
// empty path and no error when neither file exists (cgroup v1, or the kubelet has not created
// its cgroup yet); an error wrapping errPSIUnsupported when the file exists but PSI is off; and
// any other error as a failure. path is the file's location on the host (without hostRoot).
func (c *Collector) readKubepodsPSI() (path string, st psiStats, err error) {
	for _, rel := range kubepodsPressureFiles {
		data, err := c.readFile(filepath.Join(c.hostRoot, rel), maxPSIFileSize)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		path = "/" + rel
		if err == nil {
			st, err = parsePSI(data)
		}
		if errors.Is(err, syscall.EOPNOTSUPP) {
			return path, psiStats{}, fmt.Errorf("%w: %w", errPSIUnsupported, err)
		}
		return path, st, err
	}
	return "", psiStats{}, nil
}
