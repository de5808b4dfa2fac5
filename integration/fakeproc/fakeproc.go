// Package fakeproc writes processes into a /proc fixture of a host root, as the agent's
// checks read them: a directory per PID with comm and cmdline. The checks' own fixtures hold
// the few processes a test is about; a node has hundreds, and what the checks cost on a node
// depends on them, so benchmarks add a node's worth with AddNodeSized.
package fakeproc

import (
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Write creates or replaces process pid under dir (a fixture's proc directory): comm, and
// cmdline with argv NUL-terminated as the kernel shows it. No argv is a kernel thread (an
// empty cmdline).
func Write(dir string, pid int, comm string, argv ...string) error {
	d := filepath.Join(dir, strconv.Itoa(pid))
	if err := os.MkdirAll(d, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(d, "comm"), []byte(comm+"\n"), 0o644); err != nil {
		return err
	}
	var cmdline strings.Builder
	for _, a := range argv {
		cmdline.WriteString(a)
		cmdline.WriteByte(0)
	}
	return os.WriteFile(filepath.Join(d, "cmdline"), []byte(cmdline.String()), 0o644)
}

// Remove deletes process pid from dir, as if it had exited.
func Remove(dir string, pid int) error {
	return os.RemoveAll(filepath.Join(dir, strconv.Itoa(pid)))
}

// AddNodeSized adds what a busy EKS node runs besides systemd and the kubelet: 150 kernel
// threads (PIDs 3–152) and 150 user processes (PIDs 300–449). It leaves PIDs 1 and 2 and
// anything above 449 to the fixture, so a kubelet there is found after every one of them, as
// on a node where it starts late in boot.
func AddNodeSized(dir string) error {
	for pid := 3; pid < 153; pid++ {
		if err := Write(dir, pid, fmt.Sprintf("kworker/%d:1", pid)); err != nil {
			return err
		}
	}
	for pid := 300; pid < 450; pid++ {
		if err := Write(dir, pid, fmt.Sprintf("proc-%d", pid), fmt.Sprintf("/usr/bin/proc-%d", pid), "--flag"); err != nil {
			return err
		}
	}
	return nil
}

// NodeSizedCopy copies the host root fixture at src into dst and adds AddNodeSized's
// processes to its proc directory: a fixture's own few processes, on a node's worth of others.
func NodeSizedCopy(dst, src string) error {
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		return err
	}
	return AddNodeSized(filepath.Join(dst, "proc"))
}

// Meminfo and VMStat are full-length /proc/meminfo and /proc/vmstat from a real machine (24 GiB,
// idle, oom_kill 0), for fixtures that should cost what a node's do to parse.
var (
	//go:embed testdata/meminfo
	Meminfo string
	//go:embed testdata/vmstat
	VMStat string
)
