package kubelet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/nodevigil/nodevigil/collectors"
	"github.com/nodevigil/nodevigil/integration/fakeproc"
)

const ciliumTaint = "node.cilium.io/agent-not-ready"

func TestConfigCheck(t *testing.T) {
	tests := []struct {
		host     string
		expected []string
		status   collectors.Status
		reason   string
		message  []string // substrings
		wantErr  bool
		// missingUnhealthy sets ConfigCheckConfig.MissingIsUnhealthy.
		missingUnhealthy bool
	}{
		{
			host:     "flag-valid",
			expected: []string{ciliumTaint},
			status:   collectors.StatusHealthy,
			reason:   ReasonKubeletConfigValid,
			message:  []string{"kubelet pid 1234 registers 1 startup taint(s) [node.cilium.io/agent-not-ready=true:NoExecute] from --register-with-taints; all 1 expected present"},
		},
		{
			host:     "flag-quoted",
			expected: []string{ciliumTaint + ":NoExecute"},
			status:   collectors.StatusUnhealthy,
			reason:   ReasonStartupTaintMalformed,
			message: []string{`kubelet pid 1234: --register-with-taints entry "\"node.cilium.io/agent-not-ready=true:NoExecute\"" has quote characters inside the value: ` +
				`the kubelet sees the taint key "\"node.cilium.io/agent-not-ready", value "true" and effect "NoExecute\""; the kubelet rejects the whole flag and exits; ` +
				`pass --register-with-taints=node.cilium.io/agent-not-ready=true:NoExecute without inner quotes`},
		},
		{
			host:     "flag-quoted-name",
			expected: []string{ciliumTaint},
			status:   collectors.StatusUnhealthy,
			reason:   ReasonStartupTaintMalformed,
			message:  []string{"the kubelet rejects the whole flag and exits; pass --register-with-taints=node.cilium.io/agent-not-ready=true:NoExecute without inner quotes"},
		},
		{
			host:             "flag-overrides-config",
			expected:         []string{ciliumTaint + ":NoExecute"},
			status:           collectors.StatusUnhealthy,
			missingUnhealthy: true,
			reason:           ReasonStartupTaintMissing,
			message: []string{`expected startup taint "node.cilium.io/agent-not-ready:NoExecute" is not registered by the kubelet; ` +
				`pass --register-with-taints=other.example.com/x:NoSchedule,node.cilium.io/agent-not-ready:NoExecute to the kubelet`},
		},
		{
			host:     "config-valid",
			expected: []string{ciliumTaint + "=true:NoExecute"},
			status:   collectors.StatusHealthy,
			reason:   ReasonKubeletConfigValid,
			message:  []string{"from ", " /etc/kubernetes/kubelet/config.yaml;"},
		},
		{
			host:     "config-valid",
			expected: []string{ciliumTaint + ":NoSchedule"},
			status:   collectors.StatusWarning, // an advisory
			reason:   ReasonStartupTaintMissing,
			message: []string{
				"(registered with effect NoExecute instead of NoSchedule)",
				"add {key: node.cilium.io/agent-not-ready, effect: NoSchedule} to registerWithTaints in ",
			},
		},
		{
			host:     "config-missing-taint",
			expected: []string{ciliumTaint + "=true:NoExecute", "readiness.k8s.io/network"},
			status:   collectors.StatusWarning, // an advisory
			reason:   ReasonStartupTaintMissing,
			message: []string{
				`expected startup taint "node.cilium.io/agent-not-ready=true:NoExecute" is not registered by the kubelet; ` +
					`pass --register-with-taints=node.cilium.io/agent-not-ready=true:NoExecute,readiness.k8s.io/network:NoSchedule to the kubelet ` +
					`or add {key: node.cilium.io/agent-not-ready, value: "true", effect: NoExecute} to registerWithTaints in /etc/kubernetes/kubelet/config.yaml`,
				`expected startup taint "readiness.k8s.io/network" is not registered`,
			},
		},
		{
			host:     "config-bad-effect",
			expected: []string{ciliumTaint},
			status:   collectors.StatusUnhealthy,
			reason:   ReasonStartupTaintMalformed,
			message: []string{`registerWithTaints entry {key: "node.cilium.io/agent-not-ready", value: "true", effect: "noExecute"} in `,
				`has effect "noExecute", but effects are case-sensitive (NoExecute); the kubelet refuses it and exits at start; write it as {key: node.cilium.io/agent-not-ready, value: "true", effect: NoExecute}`},
		},
		{
			host:     "dropin-json",
			expected: []string{ciliumTaint + ":NoExecute"},
			status:   collectors.StatusHealthy,
			reason:   ReasonKubeletConfigValid,
			message:  []string{"kubelet pid 2201 registers 1 startup taint(s) [node.cilium.io/agent-not-ready=true:NoExecute] from ", "00-nodeadm.conf"},
		},
		{
			host:     "argv0-only",
			expected: []string{ciliumTaint},
			status:   collectors.StatusHealthy,
			reason:   ReasonKubeletConfigValid,
			message:  []string{"kubelet pid 3001"},
		},
		{
			host:   "no-taints",
			status: collectors.StatusHealthy,
			reason: ReasonKubeletConfigValid,
			message: []string{"kubelet pid 1234 registers 0 startup taint(s) [] (no --register-with-taints flag nor registerWithTaints setting); " +
				"all 0 expected present"},
		},
		{
			host:             "no-taints",
			expected:         []string{ciliumTaint + "=true:NoExecute"},
			status:           collectors.StatusUnhealthy,
			missingUnhealthy: true,
			reason:           ReasonStartupTaintMissing,
			message:          []string{"pass --register-with-taints=node.cilium.io/agent-not-ready=true:NoExecute to the kubelet"},
		},
		{
			host:    "config-unreadable",
			status:  collectors.StatusUnknown,
			reason:  ReasonKubeletConfigUnreadable,
			message: []string{"cannot validate the startup taints of kubelet pid 1234", "missing.yaml"},
			wantErr: true,
		},
		{
			host:    "config-invalid-yaml",
			status:  collectors.StatusUnknown,
			reason:  ReasonKubeletConfigUnreadable,
			message: []string{"parse kubelet config"},
			wantErr: true,
		},
		{
			host:     "no-kubelet",
			expected: []string{ciliumTaint},
			status:   collectors.StatusUnknown,
			reason:   ReasonKubeletProcessNotFound,
			message:  []string{"no kubelet process found in "},
			wantErr:  true,
		},
		{
			host:    "does-not-exist",
			status:  collectors.StatusUnknown,
			reason:  ReasonKubeletProcessNotFound,
			wantErr: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.host+"/"+strings.Join(tt.expected, ","), func(t *testing.T) {
			clock := newFakeClock()
			c, err := NewConfigCheck(ConfigCheckConfig{
				HostRoot:           filepath.Join("testdata", "hosts", tt.host),
				ExpectedTaints:     tt.expected,
				MissingIsUnhealthy: tt.missingUnhealthy,
				Now:                clock.Now,
			})
			if err != nil {
				t.Fatalf("NewConfigCheck: %v", err)
			}
			if c.Name() != "kubelet-config" {
				t.Errorf("Name() = %q", c.Name())
			}
			res := c.Check(context.Background())
			if res.Check != "kubelet-config" || !res.Time.Equal(clock.Now()) {
				t.Errorf("Check/Time = %q/%v", res.Check, res.Time)
			}
			if res.Status != tt.status || res.Reason != tt.reason {
				t.Fatalf("got %s/%s (%s), want %s/%s", res.Status, res.Reason, res.Message, tt.status, tt.reason)
			}
			for _, m := range tt.message {
				if !strings.Contains(res.Message, m) {
					t.Errorf("message\n  %s\nwant it to contain\n  %s", res.Message, m)
				}
			}
			if (res.Err != nil) != tt.wantErr {
				t.Errorf("Err = %v, want error: %v", res.Err, tt.wantErr)
			}
		})
	}
}

func TestConfigCheckProcessNotFoundIsNotUnhealthy(t *testing.T) {
	c, err := NewConfigCheck(ConfigCheckConfig{HostRoot: filepath.Join("testdata", "hosts", "no-kubelet")})
	if err != nil {
		t.Fatal(err)
	}
	res := c.Check(context.Background())
	if res.Status != collectors.StatusUnknown || !errors.Is(res.Err, errKubeletNotFound) {
		t.Fatalf("got %s err=%v, want Unknown wrapping errKubeletNotFound", res.Status, res.Err)
	}
}

func TestConfigCheckCancelled(t *testing.T) {
	c, err := NewConfigCheck(ConfigCheckConfig{HostRoot: filepath.Join("testdata", "hosts", "flag-valid")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res := c.Check(ctx)
	if res.Status != collectors.StatusUnknown || !errors.Is(res.Err, context.Canceled) {
		t.Fatalf("got %s err=%v, want Unknown with context.Canceled", res.Status, res.Err)
	}
}

func TestNewConfigCheckRejectsBadExpectation(t *testing.T) {
	_, err := NewConfigCheck(ConfigCheckConfig{ExpectedTaints: []string{"ok:NoSchedule", "bad:noschedule"}})
	if err == nil || !strings.Contains(err.Error(), "ExpectedTaints[1]") || !strings.Contains(err.Error(), "case-sensitive") {
		t.Fatalf("err = %v, want one naming ExpectedTaints[1] and the case problem", err)
	}
}

func TestParseKubeletArgs(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want kubeletFlags
	}{
		{name: "argv0 only", args: []string{"/usr/bin/kubelet"}},
		{
			name: "equals form",
			args: []string{"kubelet", "--config=/c.yaml", "--config-dir=/d", "--register-with-taints=a:NoSchedule"},
			want: kubeletFlags{config: "/c.yaml", configDir: "/d", taints: "a:NoSchedule", taintsSet: true, taintsArg: 3},
		},
		{
			name: "separate value form",
			args: []string{"kubelet", "--config", "/c.yaml", "--register-with-taints", "a:NoSchedule"},
			want: kubeletFlags{config: "/c.yaml", taints: "a:NoSchedule", taintsSet: true, taintsArg: 4},
		},
		{
			name: "last occurrence wins",
			args: []string{"kubelet", "--register-with-taints=a:NoSchedule", "--register-with-taints=b:NoExecute"},
			want: kubeletFlags{taints: "b:NoExecute", taintsSet: true, taintsArg: 2},
		},
		{
			name: "empty value still counts as set",
			args: []string{"kubelet", "--register-with-taints="},
			want: kubeletFlags{taintsSet: true, taintsArg: 1},
		},
		{
			name: "flag at the end without value",
			args: []string{"kubelet", "--register-with-taints"},
			want: kubeletFlags{taintsSet: true, taintsArg: 1},
		},
		{
			name: "leading quote moves onto the value",
			args: []string{"kubelet", `'--register-with-taints=a:NoSchedule'`},
			want: kubeletFlags{taints: `'a:NoSchedule'`, taintsSet: true, taintsArg: 1},
		},
		{
			name: "other flags and their values are skipped",
			args: []string{"kubelet", "--node-labels=a=b", "--v", "2", "positional", "--hostname-override=x"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := parseKubeletArgs(tt.args); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("parseKubeletArgs(%q) = %+v, want %+v", tt.args, got, tt.want)
			}
		})
	}
}

func TestParseConfigTaints(t *testing.T) {
	tests := []struct {
		name    string
		data    string
		want    []Taint
		set     bool
		wantErr bool
	}{
		{name: "absent", data: "kind: KubeletConfiguration\n"},
		{name: "explicit empty list", data: "registerWithTaints: []\n", want: []Taint{}, set: true},
		{
			name: "yaml",
			data: "registerWithTaints:\n- key: a\n  effect: NoSchedule\n- {key: b, value: c, effect: NoExecute}\n",
			want: []Taint{{Key: "a", Effect: "NoSchedule"}, {Key: "b", Value: "c", Effect: "NoExecute"}},
			set:  true,
		},
		{
			name: "json",
			data: `{"registerWithTaints":[{"key":"a","effect":"NoSchedule"}]}`,
			want: []Taint{{Key: "a", Effect: "NoSchedule"}},
			set:  true,
		},
		{name: "wrong type", data: "registerWithTaints: notalist\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, set, err := parseConfigTaints([]byte(tt.data))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if set != tt.set || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %#v set=%v, want %#v set=%v", got, set, tt.want, tt.set)
			}
		})
	}
}

// TestConfigCheckEKSHostRoots runs the check on host roots laid out as real EKS nodes: AL2
// (kubelet.service plus bootstrap.sh's drop-ins, systemd 219) and AL2023 (nodeadm's
// environment file and kubelet config drop-in, systemd 252), each with a malformed and a
// healthy variant, with and without a kubelet process. A malformed taint makes the kubelet
// exit, so "no process" is the usual case and the unit files are all there is to read.
func TestConfigCheckEKSHostRoots(t *testing.T) {
	const extraArgs = "/etc/systemd/system/kubelet.service.d/30-kubelet-extra-args.conf"
	tests := []struct {
		host     string
		expected []string
		status   collectors.Status
		reason   string
		message  []string // substrings
		absent   []string // must not appear
	}{
		{
			// bootstrap.sh --kubelet-extra-args '--register-with-taints="..."': systemd removes
			// the quotes when it splits $KUBELET_EXTRA_ARGS, so the kubelet gets a clean flag.
			host:     "al2-dropin-quoted-ok",
			expected: []string{ciliumTaint + ":NoExecute"},
			status:   collectors.StatusHealthy,
			reason:   ReasonKubeletConfigValid,
			message: []string{"kubelet.service (no kubelet process; command line rebuilt from /etc/systemd/system/kubelet.service, " +
				"/etc/systemd/system/kubelet.service.d/10-kubelet-args.conf, " + extraArgs + ") registers 1 startup taint(s) [node.cilium.io/agent-not-ready=true:NoExecute]"},
		},
		{
			host:     "al2-running-ok",
			expected: []string{ciliumTaint},
			status:   collectors.StatusHealthy,
			reason:   ReasonKubeletConfigValid,
			message:  []string{"kubelet pid 4242 registers 1 startup taint(s)"},
		},
		{
			host:     "al2-dropin-bad-effect",
			expected: []string{ciliumTaint},
			status:   collectors.StatusUnhealthy,
			reason:   ReasonStartupTaintMalformed,
			message: []string{extraArgs + `:2: --register-with-taints entry "node.cilium.io/agent-not-ready=true:noExecute" has effect "noExecute", but effects are case-sensitive (NoExecute); ` +
				`the kubelet rejects the whole flag and exits; pass --register-with-taints=node.cilium.io/agent-not-ready=true:NoExecute; ` +
				`write: Environment='KUBELET_EXTRA_ARGS=--node-labels=eks.amazonaws.com/nodegroup=ng-1 --register-with-taints=node.cilium.io/agent-not-ready=true:NoExecute'`},
			absent: []string{"is not registered"},
		},
		{
			// An operator's drop-in passes ${KUBELET_EXTRA_ARGS}: verbatim, quotes included.
			host:     "al2-dropin-braced",
			expected: []string{ciliumTaint},
			status:   collectors.StatusUnhealthy,
			reason:   ReasonStartupTaintMalformed,
			message: []string{extraArgs + `:2: --register-with-taints entry "\"node.cilium.io/agent-not-ready=true:NoSchedule\"" has quote characters inside the value: ` +
				`the kubelet sees the taint key "\"node.cilium.io/agent-not-ready", value "true" and effect "NoSchedule\""; the kubelet rejects the whole flag and exits; ` +
				`pass --register-with-taints=node.cilium.io/agent-not-ready=true:NoSchedule without inner quotes; ` +
				`write: Environment='KUBELET_EXTRA_ARGS=--register-with-taints=node.cilium.io/agent-not-ready=true:NoSchedule' ` +
				`(ExecStart= in /etc/systemd/system/kubelet.service.d/50-custom-exec.conf:4 uses ${KUBELET_EXTRA_ARGS}`},
		},
		{
			// kubectl's removal syntax: the kubelet runs and silently drops the taint.
			host:     "al2-running-removal",
			expected: []string{ciliumTaint},
			status:   collectors.StatusUnhealthy,
			reason:   ReasonStartupTaintMalformed,
			message: []string{"kubelet pid 4242: " + extraArgs + `:2: --register-with-taints entry "node.cilium.io/agent-not-ready=true:NoExecute-" ends with '-'`,
				"write: Environment='KUBELET_EXTRA_ARGS=--register-with-taints=node.cilium.io/agent-not-ready=true:NoExecute'"},
		},
		{
			host:     "al2023-env-ok",
			expected: []string{ciliumTaint + "=true:NoExecute"},
			status:   collectors.StatusHealthy,
			reason:   ReasonKubeletConfigValid,
			message:  []string{"kubelet.service (no kubelet process; command line rebuilt from /etc/systemd/system/kubelet.service) registers 1 startup taint(s)"},
		},
		{
			host:     "al2023-env-ok-running",
			expected: []string{ciliumTaint + "=true:NoExecute"},
			status:   collectors.StatusHealthy,
			reason:   ReasonKubeletConfigValid,
			message:  []string{"kubelet pid 3101 registers 1 startup taint(s)"},
		},
		{
			// kubectl's removal syntax in nodeadm's environment file: the kubelet runs (the
			// process exists) and silently drops the taint.
			host:     "al2023-env-removal-running",
			expected: []string{ciliumTaint},
			status:   collectors.StatusUnhealthy,
			reason:   ReasonStartupTaintMalformed,
			message:  []string{"kubelet pid 3101: /etc/eks/kubelet/environment:1: " + `--register-with-taints entry "node.cilium.io/agent-not-ready=true:NoExecute-" ends with '-'`},
			absent:   []string{"is not registered"},
		},
		{
			host:     "al2023-env-no-effect",
			expected: []string{ciliumTaint},
			status:   collectors.StatusUnhealthy,
			reason:   ReasonStartupTaintMalformed,
			message: []string{`/etc/eks/kubelet/environment:1: --register-with-taints entry "node.cilium.io/agent-not-ready=true" has no effect; the kubelet rejects the whole flag and exits; ` +
				`every registered taint needs key[=value]:Effect`},
			absent: []string{"is not registered"},
		},
		{
			host:     "al2023-nodeadm-config-bad",
			expected: []string{ciliumTaint},
			status:   collectors.StatusUnhealthy,
			reason:   ReasonStartupTaintMalformed,
			message: []string{`registerWithTaints entry {key: "node.cilium.io/agent-not-ready", value: "true", effect: "noExecute"} in /etc/kubernetes/kubelet/config.json.d/40-nodeadm.conf ` +
				`has effect "noExecute", but effects are case-sensitive (NoExecute); the kubelet refuses it and exits at start; write it as {key: node.cilium.io/agent-not-ready, value: "true", effect: NoExecute}`},
			absent: []string{"is not registered"},
		},
		{
			host:     "al2023-nodeadm-config-ok",
			expected: []string{ciliumTaint + ":NoExecute"},
			status:   collectors.StatusHealthy,
			reason:   ReasonKubeletConfigValid,
			message:  []string{"from /etc/kubernetes/kubelet/config.json.d/40-nodeadm.conf"},
		},
		{
			// A healthy node that does not register the agent's own taint: an advisory.
			host:     "al2023-no-owned-taint",
			expected: []string{ciliumTaint},
			status:   collectors.StatusWarning,
			reason:   ReasonStartupTaintMissing,
			message: []string{"(NodeConfig spec.kubelet.flags: - --register-with-taints=node.cilium.io/agent-not-ready:NoSchedule; nodeadm writes it to NODEADM_KUBELET_ARGS in /etc/eks/kubelet/environment)",
				"(advisory: "},
		},
		{
			host:     "al2023-no-owned-taint-running",
			expected: []string{ciliumTaint},
			status:   collectors.StatusWarning,
			reason:   ReasonStartupTaintMissing,
			message:  []string{"kubelet pid 3101: expected startup taint"},
		},
		{
			host:    "al2023-no-owned-taint",
			status:  collectors.StatusHealthy,
			reason:  ReasonKubeletConfigValid,
			message: []string{"registers 0 startup taint(s)"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.host+"/"+strings.Join(tt.expected, ","), func(t *testing.T) {
			c, err := NewConfigCheck(ConfigCheckConfig{HostRoot: filepath.Join("testdata", "hosts", tt.host), ExpectedTaints: tt.expected})
			if err != nil {
				t.Fatal(err)
			}
			res := c.Check(context.Background())
			if res.Status != tt.status || res.Reason != tt.reason {
				t.Fatalf("got %s/%s (%s), want %s/%s", res.Status, res.Reason, res.Message, tt.status, tt.reason)
			}
			for _, m := range tt.message {
				if !strings.Contains(res.Message, m) {
					t.Errorf("message\n  %s\nwant it to contain\n  %s", res.Message, m)
				}
			}
			for _, m := range tt.absent {
				if strings.Contains(res.Message, m) {
					t.Errorf("message\n  %s\nmust not contain\n  %s", res.Message, m)
				}
			}
			if res.Err != nil {
				t.Errorf("Err = %v", res.Err)
			}
		})
	}
}

func TestConfigCheckUnitUnreadable(t *testing.T) {
	root := writeHost(t, map[string]string{
		"/proc/1/comm":                        "systemd\n",
		"/proc/1/cmdline":                     "/usr/lib/systemd/systemd\x00",
		"/etc/systemd/system/kubelet.service": "[Service]\nEnvironmentFile=/etc/eks/kubelet/environment\nExecStart=/usr/bin/kubelet $NODEADM_KUBELET_ARGS\n",
	})
	c, err := NewConfigCheck(ConfigCheckConfig{HostRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	res := c.Check(context.Background())
	if res.Status != collectors.StatusUnknown || res.Reason != ReasonKubeletConfigUnreadable ||
		!strings.Contains(res.Message, "EnvironmentFile=/etc/eks/kubelet/environment does not exist") {
		t.Fatalf("got %s/%s %q", res.Status, res.Reason, res.Message)
	}
}

func TestConfigCheckInputsForExplain(t *testing.T) {
	c, err := NewConfigCheck(ConfigCheckConfig{HostRoot: filepath.Join("testdata", "hosts", "al2-dropin-bad-effect"), ExpectedTaints: []string{ciliumTaint}})
	if err != nil {
		t.Fatal(err)
	}
	res := c.Check(context.Background())
	want := []collectors.Input{
		{Name: "kubelet command line", Source: "/etc/systemd/system/kubelet.service, /etc/systemd/system/kubelet.service.d/10-kubelet-args.conf, " +
			"/etc/systemd/system/kubelet.service.d/30-kubelet-extra-args.conf",
			Value: "18 arguments rebuilt from ExecStart= at /etc/systemd/system/kubelet.service:10 with systemd < 233 rules (Amazon Linux 2)"},
		{Name: "--register-with-taints", Source: "/etc/systemd/system/kubelet.service.d/30-kubelet-extra-args.conf:2 Environment KUBELET_EXTRA_ARGS",
			Value: "node.cilium.io/agent-not-ready=true:noExecute", Threshold: "key[=value]:Effect,... as the kubelet parses it (pkg/util/taints.ParseTaints)"},
		{Name: "expected startup taints", Source: "agent configuration (owned taints)", Value: "[node.cilium.io/agent-not-ready]",
			Threshold: "each registered (same key, and same effect when one is given)"},
	}
	if !reflect.DeepEqual(res.Inputs, want) {
		t.Errorf("Inputs =\n%+v\nwant\n%+v", res.Inputs, want)
	}
}

// TestConfigCheckFollowsTheKubeletAcrossRestarts: the check remembers the kubelet's PID so
// that it does not scan a node's hundreds of processes every time, and must still follow
// the kubelet when it restarts under a new PID, when its old PID is reused by another
// program, and when it is gone.
func TestConfigCheckFollowsTheKubeletAcrossRestarts(t *testing.T) {
	root := t.TempDir()
	if err := fakeproc.NodeSizedCopy(root, filepath.Join("testdata", "hosts", "dropin-json")); err != nil {
		t.Fatal(err)
	}
	proc := filepath.Join(root, "proc")
	raw, err := os.ReadFile(filepath.Join(proc, "2201", "cmdline"))
	if err != nil {
		t.Fatal(err)
	}
	good := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
	bad := append(slices.Clone(good), "--register-with-taints=bad key:NoSchedule")
	setProc := func(pid int, comm string, argv ...string) {
		t.Helper()
		if err := fakeproc.Write(proc, pid, comm, argv...); err != nil {
			t.Fatal(err)
		}
	}
	exit := func(pid int) {
		t.Helper()
		if err := fakeproc.Remove(proc, pid); err != nil {
			t.Fatal(err)
		}
	}
	c, err := NewConfigCheck(ConfigCheckConfig{HostRoot: root, ExpectedTaints: []string{ciliumTaint}})
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name       string
		change     func()
		wantStatus collectors.Status
		wantReason string
		wantPID    int // 0: no kubelet process
	}{
		{"running kubelet", func() {}, collectors.StatusHealthy, ReasonKubeletConfigValid, 2201},
		{"a kubelet-named process with a lower PID appears (a kubelet in a container): the followed one stays",
			func() { setProc(1500, "kubelet", bad...) }, collectors.StatusHealthy, ReasonKubeletConfigValid, 2201},
		{"restart under a new PID, with a malformed taint flag", func() {
			exit(1500)
			exit(2201)
			setProc(2300, "kubelet", bad...)
		}, collectors.StatusUnhealthy, ReasonStartupTaintMalformed, 2300},
		{"old PID reused by another program, kubelet restarted again", func() {
			setProc(2300, "containerd", "/usr/bin/containerd")
			setProc(2400, "kubelet", good...)
		}, collectors.StatusHealthy, ReasonKubeletConfigValid, 2400},
		{"old PID reused by a kernel thread named kubelet, no kubelet left", func() {
			exit(2400)
			setProc(2400, "kubelet")
		}, collectors.StatusUnknown, ReasonKubeletProcessNotFound, 0},
		{"kubelet back at its old PID", func() { setProc(2201, "kubelet", good...) }, collectors.StatusHealthy, ReasonKubeletConfigValid, 2201},
	}
	for _, s := range steps {
		s.change()
		res := c.Check(context.Background())
		if res.Status != s.wantStatus || res.Reason != s.wantReason {
			t.Fatalf("%s: got %s/%s (%s), want %s/%s", s.name, res.Status, res.Reason, res.Message, s.wantStatus, s.wantReason)
		}
		src := ""
		for _, in := range res.Inputs {
			if in.Name == "kubelet command line" {
				src = in.Source
			}
		}
		if want := fmt.Sprintf("/proc/%d/cmdline", s.wantPID); s.wantPID != 0 && src != want {
			t.Fatalf("%s: command line read from %q, want %s", s.name, src, want)
		}
		if s.wantPID == 0 && src != "" {
			t.Fatalf("%s: command line read from %q, want no kubelet process", s.name, src)
		}
	}
}
