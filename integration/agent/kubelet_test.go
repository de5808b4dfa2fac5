package agent_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	godbus "github.com/godbus/dbus/v5"
	"github.com/godbus/dbus/v5/prop"
	corev1 "k8s.io/api/core/v1"
)

// The narrow seam: a real dbus-daemon listening where the agent looks for the host's system
// bus (<host-root>/run/dbus/system_bus_socket), with a stand-in for org.freedesktop.systemd1
// that implements what go-systemd calls and emits PropertiesChanged like systemd does.

const busConf = `<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path=%s</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/><allow own="*"/><allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/>
  </policy>
</busconfig>
`

const unitPath = godbus.ObjectPath("/org/freedesktop/systemd1/unit/kubelet_2eservice")

type standInSystemd struct {
	conn  *godbus.Conn
	props *prop.Properties
	mu    sync.Mutex
	n     uint32
	pid   uint32
	calls []string
	jobs  [][]any // ListJobs rows of the queued jobs
	// subscribed counts Manager.Subscribe calls: the agent follows the unit's signals.
	subscribed int
}

// waitSubscribed polls until the agent has subscribed to systemd's signals.
func (s *standInSystemd) waitSubscribed(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s.mu.Lock()
		n := s.subscribed
		s.mu.Unlock()
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the agent never subscribed to systemd's signals")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// jobRef is the (uo) struct of Unit.Job; noJob is its value when no job is queued.
type jobRef struct {
	ID   uint32
	Path godbus.ObjectPath
}

var noJob = jobRef{0, "/"}

func startSystemdBus(t *testing.T, hostRoot string) *standInSystemd {
	t.Helper()
	socket := filepath.Join(hostRoot, "run/dbus/system_bus_socket")
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(t.TempDir(), "bus.conf")
	writeFile(t, conf, fmt.Sprintf(busConf, socket), 0o600)
	daemon, err := exec.LookPath("dbus-daemon")
	if err != nil {
		t.Fatalf("dbus-daemon not found (%v): apt-get install dbus", err)
	}
	cmd := exec.Command(daemon, "--config-file="+conf, "--print-address", "--nofork")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		t.Fatal("dbus-daemon printed no address")
	}
	conn, err := godbus.Connect(sc.Text())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if r, err := conn.RequestName("org.freedesktop.systemd1", godbus.NameFlagDoNotQueue); err != nil || r != godbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("request name: %v %v", r, err)
	}
	s := &standInSystemd{conn: conn, pid: 1000}
	emit := func(v any) *prop.Prop { return &prop.Prop{Value: v, Emit: prop.EmitTrue} }
	s.props, err = prop.Export(conn, unitPath, prop.Map{
		"org.freedesktop.systemd1.Unit": {
			"Id": {Value: "kubelet.service"}, "LoadState": {Value: "loaded"},
			"ActiveState": emit("active"), "SubState": emit("running"),
			"ActiveExitTimestamp": emit(uint64(0)), "Job": {Value: noJob},
		},
		"org.freedesktop.systemd1.Service": {
			"Result": emit("success"), "NRestarts": emit(uint32(0)), "MainPID": emit(uint32(1000)),
			"ExecMainStartTimestamp": emit(uint64(1_700_000_000_000_000)),
			"ExecMainExitTimestamp":  emit(uint64(0)), "ExecMainCode": emit(int32(0)), "ExecMainStatus": emit(int32(0)),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	record := func(name string) { s.mu.Lock(); s.calls = append(s.calls, name); s.mu.Unlock() }
	err = conn.ExportMethodTable(map[string]any{
		"Subscribe": func() *godbus.Error { s.mu.Lock(); s.subscribed++; s.mu.Unlock(); return nil },
		"GetUnit":   func(string) (godbus.ObjectPath, *godbus.Error) { return unitPath, nil },
		"RestartUnit": func(name, mode string) (godbus.ObjectPath, *godbus.Error) {
			record("RestartUnit " + name)
			return "/org/freedesktop/systemd1/job/1", nil
		},
		"ResetFailedUnit": func(name string) *godbus.Error { record("ResetFailedUnit " + name); return nil },
		"ListJobs": func() ([][]any, *godbus.Error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			return append([][]any{}, s.jobs...), nil
		},
	}, "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// set changes the unit as systemd does: Service properties, then the Unit state.
func (s *standInSystemd) set(active, sub, result string) {
	s.props.SetMust("org.freedesktop.systemd1.Service", "Result", result)
	s.mu.Lock()
	n := s.n
	s.mu.Unlock()
	s.props.SetMust("org.freedesktop.systemd1.Service", "NRestarts", n)
	s.props.SetMust("org.freedesktop.systemd1.Unit", "ActiveState", active)
	s.props.SetMust("org.freedesktop.systemd1.Unit", "SubState", sub)
}

// crash is one automatic restart that lasts far less than a check interval.
func (s *standInSystemd) crash(result string) {
	s.mu.Lock()
	s.n++
	s.pid++
	pid := s.pid
	s.mu.Unlock()
	s.props.SetMust("org.freedesktop.systemd1.Service", "MainPID", uint32(0))
	s.set("activating", "auto-restart", result)
	time.Sleep(50 * time.Millisecond)
	s.props.SetMust("org.freedesktop.systemd1.Service", "MainPID", pid)
	s.props.SetMust("org.freedesktop.systemd1.Service", "ExecMainStartTimestamp", uint64(1_700_000_000_000_000)+uint64(pid))
	s.set("active", "running", "success")
}

// stop is systemctl stop as systemd performs it: a stop job is queued (JobNew), the unit
// leaves the active state, then the kubelet exits 0 on SIGTERM, and the job is removed. The
// job lasts as long as the kubelet takes to shut down (here 300 ms).
func (s *standInSystemd) stop(t *testing.T, at uint64) {
	t.Helper()
	const job = godbus.ObjectPath("/org/freedesktop/systemd1/job/77")
	s.mu.Lock()
	s.jobs = [][]any{{uint32(77), "kubelet.service", "stop", "running", job, unitPath}}
	s.mu.Unlock()
	s.props.SetMust("org.freedesktop.systemd1.Unit", "Job", jobRef{77, job})
	if err := s.conn.Emit("/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager.JobNew", uint32(77), job, "kubelet.service"); err != nil {
		t.Fatal(err)
	}
	s.props.SetMust("org.freedesktop.systemd1.Unit", "ActiveExitTimestamp", at)
	s.set("deactivating", "stop-sigterm", "success")
	time.Sleep(300 * time.Millisecond)
	s.props.SetMust("org.freedesktop.systemd1.Service", "ExecMainExitTimestamp", at+300_000)
	s.props.SetMust("org.freedesktop.systemd1.Service", "ExecMainCode", int32(1))
	s.props.SetMust("org.freedesktop.systemd1.Service", "MainPID", uint32(0))
	s.set("inactive", "dead", "success")
	s.mu.Lock()
	s.jobs = nil
	s.mu.Unlock()
	s.props.SetMust("org.freedesktop.systemd1.Unit", "Job", noJob)
	_ = s.conn.Emit("/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager.JobRemoved", uint32(77), job, "kubelet.service", "done")
}

// start is the unit running again with a new process started at the given time.
func (s *standInSystemd) start(at uint64) {
	s.mu.Lock()
	s.pid++
	pid := s.pid
	s.mu.Unlock()
	s.props.SetMust("org.freedesktop.systemd1.Service", "ExecMainStartTimestamp", at)
	s.props.SetMust("org.freedesktop.systemd1.Service", "ExecMainExitTimestamp", uint64(0))
	s.props.SetMust("org.freedesktop.systemd1.Service", "MainPID", pid)
	s.set("active", "running", "success")
}

// exitOnItsOwn is a kubelet exiting 0 by itself under Restart=on-failure: the process exits
// first, the unit leaves the active state after, no job is involved and nothing restarts it.
func (s *standInSystemd) exitOnItsOwn(at uint64) {
	s.props.SetMust("org.freedesktop.systemd1.Service", "ExecMainExitTimestamp", at)
	s.props.SetMust("org.freedesktop.systemd1.Service", "ExecMainCode", int32(1))
	s.props.SetMust("org.freedesktop.systemd1.Service", "MainPID", uint32(0))
	s.props.SetMust("org.freedesktop.systemd1.Unit", "ActiveExitTimestamp", at+100)
	s.set("inactive", "dead", "success")
}

func (s *standInSystemd) restarts() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
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
	sd.waitSubscribed(t)

	sd.crash("oom-kill")
	obj := n.waitFor("KubeletOOMKilled", 20*time.Second, hasReason("KubeletHealthy", "KubeletOOMKilled"))
	if c := condition(obj, "KubeletHealthy"); c.Status != corev1.ConditionFalse {
		t.Fatalf("OOM kill between checks: %+v", c)
	}

	sd.crash("exit-code")
	sd.crash("exit-code")
	sd.crash("exit-code")
	// The OOM kill is reported first (more specific) for its window; the loop shows in the
	// message's restart count either way, so look for the count.
	n.waitFor("restart count in the message", 20*time.Second, func(obj *corev1.Node) bool {
		c := condition(obj, "KubeletHealthy")
		return c != nil && c.Status == corev1.ConditionFalse && strings.Contains(c.Message, "NRestarts=4")
	})

	// systemctl stop: reported, and never restarted although repair is on.
	sd.stop(t, 1_700_000_100_000_000)
	obj = n.waitFor("KubeletStoppedByOperator", 20*time.Second, hasReason("KubeletHealthy", "KubeletStoppedByOperator"))
	if c := condition(obj, "KubeletHealthy"); !strings.Contains(c.Message, "stop job for kubelet.service was seen") {
		t.Errorf("the stop job was not seen live: %q", c.Message)
	}
	time.Sleep(3 * time.Second) // several cycles with repair on
	for _, c := range sd.restarts() {
		if strings.HasPrefix(c, "RestartUnit") {
			t.Fatalf("the agent restarted a unit an operator stopped: %v", sd.restarts())
		}
	}

	// Started again, then the kubelet exits 0 on its own: inactive with a clean result, but
	// no stop job; not an operator stop, so local repair restarts it.
	sd.start(1_700_000_200_000_000)
	n.waitFor("KubeletHealthy again", 20*time.Second, func(obj *corev1.Node) bool {
		c := condition(obj, "KubeletHealthy")
		return c != nil && c.Reason != "KubeletStoppedByOperator"
	})
	sd.exitOnItsOwn(1_700_000_300_000_000)
	obj = n.waitFor("KubeletUnitInactive", 20*time.Second, hasReason("KubeletHealthy", "KubeletUnitInactive"))
	if c := condition(obj, "KubeletHealthy"); !strings.Contains(c.Message, "exited on its own") {
		t.Errorf("message %q does not say the kubelet exited on its own", c.Message)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !slices.ContainsFunc(sd.restarts(), func(c string) bool { return strings.HasPrefix(c, "RestartUnit") }) {
		if time.Now().After(deadline) {
			t.Fatalf("a kubelet that exited on its own was not restarted: %v", sd.restarts())
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
	port := freePort(t) // nothing listens there
	cmd := exec.Command(agentBin, "check", "--host-root", root, "--kubelet-healthz-url", fmt.Sprintf("http://127.0.0.1:%d/healthz", port))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit %v, want 1\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), "KubeletNotRunning") {
		t.Errorf("stdout lacks KubeletNotRunning:\n%s", stdout.String())
	}
}
