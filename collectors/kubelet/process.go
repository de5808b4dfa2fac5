package kubelet

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
)

// processState is what <HostRoot>/proc says about the kubelet process.
type processState struct {
	// hostPIDs is true when <HostRoot>/proc shows the host's PID namespace: PID 1 is systemd
	// or init. Only then does "no kubelet process" mean the kubelet is not running (in the
	// agent's own PID namespace no kubelet would ever be visible).
	hostPIDs bool
	// running is true when a process whose comm is "kubelet" exists.
	running bool
	// pid is the first kubelet process found.
	pid int
}

// lookupKubelet scans procDir for a process named kubelet. It is only called when /healthz
// fails to connect, so the scan (one small read per process) costs nothing on a healthy node.
func lookupKubelet(procDir string) processState {
	var st processState
	init, err := os.ReadFile(filepath.Join(procDir, "1", "comm"))
	if err != nil {
		return st
	}
	switch string(bytes.TrimSpace(init)) {
	case "systemd", "init":
		st.hostPIDs = true
	default:
		return st
	}
	entries, err := os.ReadDir(procDir)
	if err != nil {
		st.hostPIDs = false
		return st
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 1 {
			continue
		}
		comm, err := os.ReadFile(filepath.Join(procDir, e.Name(), "comm"))
		if err == nil && string(bytes.TrimSpace(comm)) == "kubelet" {
			st.running, st.pid = true, pid
			return st
		}
	}
	return st
}
