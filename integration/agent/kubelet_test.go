package agent_test

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nodevigil/nodevigil/integration/fakesystemd"
	"github.com/nodevigil/nodevigil/integration/testbin"
)

// startSystemdBus is the narrow seam: a real dbus-daemon listening where the agent looks for
// the host's system bus (<host-root>/run/dbus/system_bus_socket), with integration/fakesystemd's
// stand-in for org.freedesktop.systemd1 on it (the one integration/fleet uses).
func startSystemdBus(t *testing.T, hostRoot string) *fakesystemd.Systemd {
	t.Helper()
	sd, err := fakesystemd.Start(fakesystemd.Config{HostRoot: hostRoot})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sd.Close() })
	return sd
}

// waitSubscribed polls until the agent has subscribed to systemd's signals.
func waitSubscribed(t *testing.T, sd *fakesystemd.Systemd) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for sd.Subscribed() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the agent never subscribed to systemd's signals")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func hasReason(t, reason string) func(*corev1.Node) bool {
	return func(obj *corev1.Node) bool {
		c := condition(obj, t)
		return c != nil && c.Reason == reason
	}
}

// TestKubeletSignalsEndToEnd: the real agent binary over a real dbus-daemon. An OOM kill and
// the restart after it, 50 ms apart and between two checks, are reported; three quick
// restarts are a loop; a unit an operator stopped is reported and never restarted even with
// local repair on.
func TestKubeletSignalsEndToEnd(t *testing.T) {
	n := newNode(t, true)
	sd := startSystemdBus(t, n.hostRoot)
	n.extraArgs = []string{"--kubelet-repair=true"}
	n.start()
	n.waitFor("KubeletHealthy=True", 30*time.Second, hasStatus("KubeletHealthy", corev1.ConditionTrue))
	waitSubscribed(t, sd)

	sd.Crash("oom-kill")
	obj := n.waitFor("KubeletOOMKilled", 20*time.Second, hasReason("KubeletHealthy", "KubeletOOMKilled"))
	if c := condition(obj, "KubeletHealthy"); c.Status != corev1.ConditionFalse {
		t.Fatalf("OOM kill between checks: %+v", c)
	}

	sd.Crash("exit-code")
	sd.Crash("exit-code")
	sd.Crash("exit-code")
	// The OOM kill is reported first (more specific) for its window; the loop shows in the
	// message's restart count either way, so look for the count.
	n.waitFor("restart count in the message", 20*time.Second, func(obj *corev1.Node) bool {
		c := condition(obj, "KubeletHealthy")
		return c != nil && c.Status == corev1.ConditionFalse && strings.Contains(c.Message, "NRestarts=4")
	})

	// systemctl stop: reported, and never restarted although repair is on.
	if err := sd.Stop(1_700_000_100_000_000); err != nil {
		t.Fatal(err)
	}
	obj = n.waitFor("KubeletStoppedByOperator", 20*time.Second, hasReason("KubeletHealthy", "KubeletStoppedByOperator"))
	if c := condition(obj, "KubeletHealthy"); !strings.Contains(c.Message, "stop job for kubelet.service was seen") {
		t.Errorf("the stop job was not seen live: %q", c.Message)
	}
	time.Sleep(3 * time.Second) // several cycles with repair on
	for _, c := range sd.Calls() {
		if strings.HasPrefix(c, "RestartUnit") {
			t.Fatalf("the agent restarted a unit an operator stopped: %v", sd.Calls())
		}
	}

	// Started again, then the kubelet exits 0 on its own: inactive with a clean result, but
	// no stop job; not an operator stop, so local repair restarts it.
	sd.StartAt(1_700_000_200_000_000)
	n.waitFor("KubeletHealthy again", 20*time.Second, func(obj *corev1.Node) bool {
		c := condition(obj, "KubeletHealthy")
		return c != nil && c.Reason != "KubeletStoppedByOperator"
	})
	sd.ExitOnItsOwn(1_700_000_300_000_000)
	obj = n.waitFor("KubeletUnitInactive", 20*time.Second, hasReason("KubeletHealthy", "KubeletUnitInactive"))
	if c := condition(obj, "KubeletHealthy"); !strings.Contains(c.Message, "exited on its own") {
		t.Errorf("message %q does not say the kubelet exited on its own", c.Message)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !slices.ContainsFunc(sd.Calls(), func(c string) bool { return strings.HasPrefix(c, "RestartUnit") }) {
		if time.Now().After(deadline) {
			t.Fatalf("a kubelet that exited on its own was not restarted: %v", sd.Calls())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCheckKubeletNotRunning: `check` on a host whose kubelet exited at once (no process in
// the host's process table, /healthz refused, no bus) reports Unhealthy with exit 1.
func TestCheckKubeletNotRunning(t *testing.T) {
	root := t.TempDir()
	writeHost(t, root, true)
	writeFile(t, filepath.Join(root, "proc/1/comm"), "systemd\n", 0o644)
	writeFile(t, filepath.Join(root, "proc/700/comm"), "containerd\n", 0o644)
	refused, release, err := testbin.RefusedAddr() // nothing listens there, and nothing can start to
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	cmd := exec.Command(agentBin, "check", "--host-root", root, "--kubelet-healthz-url", "http://"+refused+"/healthz")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit %v, want 1\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), "KubeletNotRunning") {
		t.Errorf("stdout lacks KubeletNotRunning:\n%s", stdout.String())
	}
}
