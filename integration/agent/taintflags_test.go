package agent_test

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// eksHosts are the host roots laid out as EKS nodes, shared with the kubelet collector's unit
// tests (TestConfigCheckEKSHostRoots).
const eksHosts = "../../collectors/kubelet/testdata/hosts"

// ciliumTaintKey is the startup taint the EKS fixtures register (Cilium's, owned here).
const ciliumTaintKey = "node.cilium.io/agent-not-ready"

// copyHost copies the fixture host root name over root (files, directories and symlinks, such
// as masked units), leaving what root already holds (memory and CNI files) in place.
func copyHost(t *testing.T, name, root string) {
	t.Helper()
	src := filepath.Join(eksHosts, name)
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		dst := filepath.Join(root, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(dst, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, dst)
		default:
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(dst, data, 0o644)
		}
	})
	if err != nil {
		t.Fatalf("copy host root %s: %v", name, err)
	}
}

// eksFlagCases are the S004 host roots: AL2 (bootstrap.sh's drop-in, systemd 219) and AL2023
// (nodeadm's environment file), each malformed and healthy, with and without a kubelet process.
// A malformed taint makes the kubelet exit at once, so "no process" is the usual case and the
// unit files are all there is to read; the running ones use kubectl's removal syntax, which
// the kubelet accepts and silently drops.
var eksFlagCases = []struct {
	host    string
	running bool
	healthy bool
	message []string // substrings of the kubelet-config message (and the condition's)
}{
	{host: "al2-dropin-bad-effect", message: []string{
		"no kubelet process; command line rebuilt from /etc/systemd/system/kubelet.service",
		`/etc/systemd/system/kubelet.service.d/30-kubelet-extra-args.conf:2: --register-with-taints entry "node.cilium.io/agent-not-ready=true:noExecute" has effect "noExecute"`,
		"write: Environment='KUBELET_EXTRA_ARGS=--node-labels=eks.amazonaws.com/nodegroup=ng-1 --register-with-taints=node.cilium.io/agent-not-ready=true:NoExecute'"}},
	{host: "al2-running-removal", running: true, message: []string{
		"kubelet pid 4242: /etc/systemd/system/kubelet.service.d/30-kubelet-extra-args.conf:2: " +
			`--register-with-taints entry "node.cilium.io/agent-not-ready=true:NoExecute-" ends with '-'`}},
	{host: "al2-dropin-quoted-ok", healthy: true, message: []string{"no kubelet process", "registers 1 startup taint(s)"}},
	{host: "al2-running-ok", running: true, healthy: true, message: []string{"kubelet pid 4242 registers 1 startup taint(s)"}},

	{host: "al2023-env-no-effect", message: []string{
		"no kubelet process; command line rebuilt from /etc/systemd/system/kubelet.service",
		`/etc/eks/kubelet/environment:1: --register-with-taints entry "node.cilium.io/agent-not-ready=true" has no effect`}},
	{host: "al2023-env-removal-running", running: true, message: []string{
		`kubelet pid 3101: /etc/eks/kubelet/environment:1: --register-with-taints entry "node.cilium.io/agent-not-ready=true:NoExecute-" ends with '-'`}},
	{host: "al2023-env-ok", healthy: true, message: []string{"no kubelet process", "registers 1 startup taint(s)"}},
	{host: "al2023-env-ok-running", running: true, healthy: true, message: []string{"kubelet pid 3101 registers 1 startup taint(s)"}},
}

// TestCheckEKSTaintFlags runs `nodevigil-agent check` (the real binary) on each EKS host root,
// with healthy memory, CNI and kubelet /healthz around it, so the kubelet-config verdict alone
// decides the exit code: 1 for a malformed flag, 0 for the healthy counterparts.
func TestCheckEKSTaintFlags(t *testing.T) {
	for _, tc := range eksFlagCases {
		t.Run(tc.host, func(t *testing.T) {
			t.Parallel()
			n := newNode(t, true)
			copyHost(t, tc.host, n.hostRoot)
			cmd := exec.Command(agentBin, "check", "--host-root", n.hostRoot, "--kubelet-healthz-url", n.healthz.URL+"/healthz",
				"--owned-taints", ciliumTaintKey, "--output", "json")
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			wantCode, wantStatus, wantReason := 1, "Unhealthy", "StartupTaintMalformed"
			if tc.healthy {
				wantCode, wantStatus, wantReason = 0, "Healthy", "KubeletConfigValid"
			}
			var out []struct{ Check, Status, Reason, Message string }
			if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
				t.Fatalf("output: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
			}
			byCheck := map[string]string{}
			var msg string
			for _, o := range out {
				byCheck[o.Check] = o.Status + "/" + o.Reason
				if o.Check == "kubelet-config" {
					msg = o.Message
				}
			}
			if code != wantCode {
				t.Errorf("exit %d, want %d; verdicts %v\nstderr:\n%s", code, wantCode, byCheck, stderr.String())
			}
			if got := byCheck["kubelet-config"]; got != wantStatus+"/"+wantReason {
				t.Fatalf("kubelet-config = %s, want %s/%s: %s", got, wantStatus, wantReason, msg)
			}
			for _, c := range []string{"memory", "kubelet", "cni"} {
				if byCheck[c] != "" && !strings.HasPrefix(byCheck[c], "Healthy/") {
					t.Errorf("%s = %s; the fixture around the flags must be healthy", c, byCheck[c])
				}
			}
			for _, m := range tc.message {
				if !strings.Contains(msg, m) {
					t.Errorf("message\n  %s\nwant it to contain\n  %s", msg, m)
				}
			}
			if strings.Contains(msg, "is not registered") && !tc.healthy {
				t.Errorf("a malformed flag is reported as a missing taint: %s", msg)
			}
		})
	}
}

// TestAgentReportsEKSTaintFlags runs the agent (the real binary, run mode) on each EKS host
// root against the real control plane: the KubeletConfigValid condition carries the verdict and
// the message naming the file, line and fix; a healthy host root reports True.
func TestAgentReportsEKSTaintFlags(t *testing.T) {
	for _, tc := range eksFlagCases {
		t.Run(tc.host, func(t *testing.T) {
			t.Parallel()
			n := newNode(t, true)
			copyHost(t, tc.host, n.hostRoot)
			n.extraArgs = []string{"--owned-taints", ciliumTaintKey}
			n.start()
			want, reason := corev1.ConditionFalse, "StartupTaintMalformed"
			if tc.healthy {
				want, reason = corev1.ConditionTrue, "KubeletConfigValid"
			}
			obj := n.waitFor("KubeletConfigValid="+string(want), 45*time.Second, func(obj *corev1.Node) bool {
				c := condition(obj, "KubeletConfigValid")
				return c != nil && c.Status == want && c.Reason == reason
			})
			c := condition(obj, "KubeletConfigValid")
			for _, m := range tc.message {
				if !strings.Contains(c.Message, m) {
					t.Errorf("condition message\n  %s\nwant it to contain\n  %s", c.Message, m)
				}
			}
		})
	}
}
