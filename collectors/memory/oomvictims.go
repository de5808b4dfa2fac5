package memory

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Naming the victims of kernel OOM kills.
//
// The kernel names each victim (pid and command) only in its log, /dev/kmsg, which needs
// CAP_SYSLOG; the agent runs with read-only host mounts and no such capability. What it can
// read is the per-cgroup OOM-kill counter under /sys/fs/cgroup: cgroup v2 memory.events
// ("oom_kill N", hierarchical since Linux 5.2: a cgroup counts the kills in its subtree) and
// cgroup v1 memory.oom_control ("oom_kill N", Linux 4.13+, the cgroup's own kills). When
// /proc/vmstat's node-wide counter grows, the agent walks the memory cgroup tree once and
// compares every counter with the previous walk: the cgroups whose own kills grew are the
// victims' cgroups — a systemd unit (kubelet.service, containerd.service) or a pod's
// container. That names what an operator acts on (which pod, whether it was the kubelet)
// robustly; it does not give the pid or command, which only the kernel log has. systemd's
// Result=oom-kill on the kubelet unit, seen by the kubelet check over D-Bus, says the same
// for the kubelet independently.

// maxOOMVictims bounds the victims kept per counter change.
const maxOOMVictims = 8

// oomVictim is one cgroup whose processes the OOM killer killed.
type oomVictim struct {
	cgroup string // path below the memory hierarchy's root, e.g. system.slice/kubelet.service
	n      uint64 // kills in this cgroup itself since the previous walk
}

// cgroupOOMs remembers the non-zero per-cgroup OOM-kill counters of the previous walk (a
// missing entry is 0, so the map stays as small as the set of cgroups that ever saw a kill).
type cgroupOOMs struct {
	root  string // <HostRoot>/sys/fs/cgroup
	last  map[string]uint64
	ready bool // a baseline walk has been taken
}

// cgroupCounter is one cgroup's counter as read.
type cgroupCounter struct {
	path         string
	n            uint64
	hierarchical bool // n includes the subtree (cgroup v2 on Linux 5.2+)
}

// walk reads every memory cgroup's OOM-kill counter. It prefers cgroup v2 (the unified
// hierarchy at the root), else the v1 memory controller's hierarchy.
func (o *cgroupOOMs) walk() ([]cgroupCounter, error) {
	base, file := o.root, "memory.events"
	if _, err := os.Stat(filepath.Join(o.root, "cgroup.controllers")); err != nil {
		base, file = filepath.Join(o.root, "memory"), "memory.oom_control"
	}
	var out []cgroupCounter
	err := filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == base {
				return err
			}
			return nil // a cgroup removed during the walk
		}
		if !d.IsDir() {
			return nil
		}
		data, err := os.ReadFile(filepath.Join(p, file))
		if err != nil {
			return nil // the root of v2 has no memory.events; other controllers' cgroups
		}
		n, ok := parseOOMKillLine(data)
		if !ok {
			return nil
		}
		rel, _ := filepath.Rel(base, p)
		hier := false
		if file == "memory.events" {
			// memory.events.local exists from Linux 5.2, where memory.events became
			// hierarchical.
			_, lerr := os.Stat(filepath.Join(p, "memory.events.local"))
			hier = lerr == nil
		}
		out = append(out, cgroupCounter{path: filepath.ToSlash(rel), n: n, hierarchical: hier})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("walk memory cgroups under %s: %w", base, err)
	}
	return out, nil
}

// parseOOMKillLine finds "oom_kill N" in a memory.events or memory.oom_control file.
func parseOOMKillLine(data []byte) (uint64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if ok && name == "oom_kill" {
			n, err := strconv.ParseUint(strings.TrimSpace(value), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// victims walks the tree and returns the cgroups whose own kills grew since the previous
// call; the first call only takes the baseline and returns nothing. With hierarchical
// counters a cgroup's own kills are its growth less its children's, so the kills of a
// container whose cgroup is already gone are put on the pod that held it.
func (o *cgroupOOMs) victims() ([]oomVictim, error) {
	counters, err := o.walk()
	if err != nil {
		return nil, err
	}
	if len(counters) == 0 {
		return nil, errors.New("no memory cgroup with an oom_kill counter (cgroup v2 memory.events or v1 memory.oom_control, Linux 4.13+)")
	}
	growth := make(map[string]uint64, len(counters))
	next := make(map[string]uint64)
	for _, c := range counters {
		if c.n > 0 {
			next[c.path] = c.n
		}
		prev := o.last[c.path]
		switch {
		case c.n > prev:
			growth[c.path] = c.n - prev
		case c.n < prev: // a cgroup of the same name made anew
			growth[c.path] = c.n
		}
	}
	baseline := !o.ready
	o.last, o.ready = next, true
	if baseline {
		return nil, nil
	}
	var out []oomVictim
	for _, c := range counters {
		own := growth[c.path]
		if own == 0 {
			continue
		}
		if c.hierarchical {
			var children uint64
			for _, d := range counters {
				if d.path != c.path && parentOf(d.path) == c.path {
					children += growth[d.path]
				}
			}
			own = max(own, children) - children
		}
		if own > 0 {
			out = append(out, oomVictim{cgroup: c.path, n: own})
		}
	}
	// Most kills first, then by path, and bounded.
	slices.SortFunc(out, func(a, b oomVictim) int {
		if c := cmp.Compare(b.n, a.n); c != 0 {
			return c
		}
		return strings.Compare(a.cgroup, b.cgroup)
	})
	if len(out) > maxOOMVictims {
		out = out[:maxOOMVictims]
	}
	return out, nil
}

func parentOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i]
	}
	return "."
}

// describeCgroup names a cgroup the way an operator knows it: a systemd unit by its name, a
// pod by its UID (and the container's ID when its cgroup is still there), from the layouts
// of the systemd and cgroupfs drivers; anything else by its path.
func describeCgroup(path string) string {
	parts := strings.Split(path, "/")
	var pod, ctr string
	for i, p := range parts {
		switch {
		case strings.Contains(p, "-pod") && strings.HasSuffix(p, ".slice"): // kubepods-burstable-pod<uid>.slice
			pod = strings.ReplaceAll(strings.TrimSuffix(p[strings.LastIndex(p, "-pod")+4:], ".slice"), "_", "-")
		case strings.HasPrefix(p, "pod") && i > 0 && strings.HasPrefix(parts[0], "kubepods"): // cgroupfs: kubepods/burstable/pod<uid>
			pod = strings.TrimPrefix(p, "pod")
		case pod != "" && i == len(parts)-1:
			ctr = strings.TrimSuffix(p, ".scope")
			if j := strings.LastIndexByte(ctr, '-'); j >= 0 {
				ctr = ctr[j+1:] // cri-containerd-<id>.scope
			}
			if len(ctr) > 12 {
				ctr = ctr[:12]
			}
		}
	}
	last := parts[len(parts)-1]
	switch {
	case pod != "" && ctr != "":
		return "pod " + pod + " container " + ctr
	case pod != "":
		return "pod " + pod
	case strings.HasSuffix(last, ".service"):
		return last
	}
	return path
}
