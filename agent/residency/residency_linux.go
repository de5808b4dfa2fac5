//go:build linux

package residency

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
)

// madvise advice values (linux/mman.h). MADV_COLD needs Linux 5.4; older kernels answer EINVAL
// and only the mapping is dropped.
const (
	madvDontneed = 4
	madvCold     = 20
)

// mapping is one line of /proc/self/smaps: an address range and its resident bytes.
type mapping struct {
	start, end uintptr
	perms      string
	inode      uint64
	rss        int64
}

// Release drops the mappings of the executable's read-only pages and frees the start-up heap.
// See the package documentation for why it is safe and what it gains.
func Release() (Stats, error) {
	debug.FreeOSMemory()
	traced, err := tracerAttached()
	if err != nil {
		return Stats{}, err
	}
	if traced {
		return Stats{}, nil
	}
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/exe", &st); err != nil {
		return Stats{}, fmt.Errorf("stat /proc/self/exe: %w", err)
	}
	before, err := readOnlyMappings(st.Ino)
	if err != nil {
		return Stats{}, err
	}
	var s Stats
	for _, m := range before {
		s.Before += m.rss
		// Cold first (it needs the page table entries the second call removes): the pages
		// go to the inactive list, out of the container's working set, reclaimed first.
		if err := madvise(m.start, m.end-m.start, madvCold); err != nil && !errors.Is(err, syscall.EINVAL) {
			return s, fmt.Errorf("madvise cold %x-%x: %w", m.start, m.end, err)
		}
		if err := madvise(m.start, m.end-m.start, madvDontneed); err != nil {
			return s, fmt.Errorf("madvise dontneed %x-%x: %w", m.start, m.end, err)
		}
		s.Mappings++
	}
	after, err := readOnlyMappings(st.Ino)
	if err != nil {
		return s, err
	}
	for _, m := range after {
		s.After += m.rss
	}
	return s, nil
}

func madvise(addr, length uintptr, advice int) error {
	if _, _, e := syscall.Syscall(syscall.SYS_MADVISE, addr, length, uintptr(advice)); e != 0 {
		return e
	}
	return nil
}

// tracerAttached reports whether a debugger is attached (TracerPid in /proc/self/status).
func tracerAttached() (bool, error) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false, fmt.Errorf("read /proc/self/status: %w", err)
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "TracerPid:"); ok {
			return strings.TrimSpace(v) != "0", nil
		}
	}
	return false, nil
}

// readOnlyMappings lists the private, non-writable mappings of the file with inode ino in
// /proc/self/smaps, with their resident bytes.
func readOnlyMappings(ino uint64) ([]mapping, error) {
	data, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return nil, fmt.Errorf("read /proc/self/smaps: %w", err)
	}
	return parseSmaps(data, ino)
}

// parseSmaps is readOnlyMappings' parser, on smaps text.
func parseSmaps(data []byte, ino uint64) ([]mapping, error) {
	var out []mapping
	var cur *mapping
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if strings.HasSuffix(f[0], ":") {
			if cur != nil && f[0] == "Rss:" && len(f) >= 2 {
				kb, err := strconv.ParseInt(f[1], 10, 64)
				if err != nil {
					return nil, fmt.Errorf("smaps: bad Rss line %q: %w", line, err)
				}
				cur.rss = kb << 10
			}
			continue
		}
		// A mapping header: start-end perms offset dev inode [path].
		cur = nil
		if len(f) < 5 {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(f[4], 10, 64)
		if err != nil || n != ino || len(f[1]) != 4 || f[1][1] == 'w' || f[1][3] != 'p' {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			return nil, fmt.Errorf("smaps: bad address range %q", f[0])
		}
		out = append(out, mapping{start: uintptr(start), end: uintptr(end), perms: f[1], inode: n})
		cur = &out[len(out)-1]
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("smaps: %w", err)
	}
	return out, nil
}
