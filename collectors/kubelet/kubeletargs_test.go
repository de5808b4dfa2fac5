package kubelet

import (
	"os"
	"path"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"

	"github.com/prometheus/procfs"
)

// TestKubeletArgsAgreesWithProcfs checks kubeletArgs, which reads comm and cmdline itself,
// against the same decision made through procfs's Proc.Comm and Proc.CmdLine, which it
// replaced on the per-check path: same answer and same argv for every kind of process.
func TestKubeletArgsAgreesWithProcfs(t *testing.T) {
	procs := []struct {
		name, comm, cmdline string
		noCmdline           bool
		want                bool
	}{
		{name: "kubelet by comm", comm: "kubelet\n", cmdline: "/usr/bin/kubelet\x00--config=/etc/kubernetes/kubelet/config.json\x00--register-with-taints=a=b:NoSchedule\x00", want: true},
		{name: "kubelet by argv[0], comm renamed", comm: "kubelet-wrap\n", cmdline: "/opt/bin/kubelet\x00--v=2\x00", want: true},
		{name: "another program", comm: "containerd\n", cmdline: "/usr/bin/containerd\x00"},
		{name: "kernel thread: empty cmdline", comm: "kubelet\n", cmdline: ""},
		{name: "cmdline of one NUL", comm: "kubelet\n", cmdline: "\x00", want: true},
		{name: "no trailing NUL", comm: "sh\n", cmdline: "kubelet\x00--v=1", want: true},
		{name: "exited: no cmdline file", comm: "kubelet\n", noCmdline: true},
	}
	root := t.TempDir()
	for i, p := range procs {
		dir := filepath.Join(root, strconv.Itoa(100+i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "comm"), []byte(p.comm), 0o644); err != nil {
			t.Fatal(err)
		}
		if !p.noCmdline {
			if err := os.WriteFile(filepath.Join(dir, "cmdline"), []byte(p.cmdline), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	fs, err := procfs.NewFS(root)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range procs {
		t.Run(p.name, func(t *testing.T) {
			pid := 100 + i
			args, ok := kubeletArgs(root, pid)
			if ok != p.want {
				t.Fatalf("kubeletArgs(%d) = %q, %v; want ok = %v", pid, args, ok, p.want)
			}
			// The decision as it was made through procfs.
			var wantArgs []string
			wantOK := false
			if pp, err := fs.Proc(pid); err == nil {
				comm, cerr := pp.Comm()
				a, aerr := pp.CmdLine()
				if cerr == nil && aerr == nil && len(a) > 0 {
					wantArgs, wantOK = a, comm == "kubelet" || path.Base(a[0]) == "kubelet"
				}
			}
			if ok != wantOK || (ok && !reflect.DeepEqual(args, wantArgs)) {
				t.Fatalf("kubeletArgs(%d) = %q, %v; through procfs %q, %v", pid, args, ok, wantArgs, wantOK)
			}
		})
	}
}
