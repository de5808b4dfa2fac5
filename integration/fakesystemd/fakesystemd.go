// Package fakesystemd runs a real dbus-daemon where nodevigil-agent looks for a host's system
// bus (<host-root>/run/dbus/system_bus_socket) and, on it, a stand-in for
// org.freedesktop.systemd1 that serves one service unit: the methods and properties go-systemd
// uses, PropertiesChanged when the unit changes, JobNew and JobRemoved around jobs, and the
// timestamps systemd keeps (ExecMainStart/ExitTimestamp, ActiveExitTimestamp). It is the
// narrow seam that lets a real agent process watch and locally repair a kubelet that is
// simulated (by kwok in the fleet, by a test's script in integration/agent: crashes, crash
// loops, OOM kills, an operator's stop, an exit on its own), without a real systemd.
package fakesystemd

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	godbus "github.com/godbus/dbus/v5"
	"github.com/godbus/dbus/v5/prop"
)

// SocketPath is where the agent looks for the system bus under a host root.
const SocketPath = "run/dbus/system_bus_socket"

// maxSocketPath is the longest unix socket path the kernel takes (sun_path, less its NUL).
const maxSocketPath = 107

const (
	managerPath  = godbus.ObjectPath("/org/freedesktop/systemd1")
	managerIface = "org.freedesktop.systemd1.Manager"
	unitIface    = "org.freedesktop.systemd1.Unit"
	serviceIface = "org.freedesktop.systemd1.Service"
)

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

// Config describes one host's bus and unit.
type Config struct {
	// HostRoot is the host root whose run/dbus/system_bus_socket the daemon listens on.
	HostRoot string
	// Unit is the service the stand-in serves. Default kubelet.service.
	Unit string
	// OnRestart is called when a client restarts the unit (RestartUnit). It returns whether
	// the service came up: true makes the unit active with a new main PID and ends the job
	// "done"; false leaves it failed (Result exit-code) and ends the job "failed", as a
	// service that crashes again at once does. Default: it comes up.
	OnRestart func() bool
}

// Systemd is a running dbus-daemon with the stand-in on it.
type Systemd struct {
	cfg    Config
	daemon *exec.Cmd
	conn   *godbus.Conn
	props  *prop.Properties
	unit   godbus.ObjectPath

	mu        sync.Mutex
	pid       uint32
	jobs      uint32
	restarts  uint32  // NRestarts: automatic restarts (Crash)
	queued    [][]any // ListJobs rows of the jobs in progress
	calls     []string
	subscribe int // Manager.Subscribe calls
}

// jobRef is the (uo) struct of Unit.Job; noJob is its value when no job is queued.
type jobRef struct {
	ID   uint32
	Path godbus.ObjectPath
}

var noJob = jobRef{0, "/"}

// Start starts the daemon and exports the unit, active and running.
func Start(cfg Config) (*Systemd, error) {
	if cfg.HostRoot == "" {
		return nil, errors.New("fakesystemd: Config.HostRoot is required")
	}
	if cfg.Unit == "" {
		cfg.Unit = "kubelet.service"
	}
	if cfg.OnRestart == nil {
		cfg.OnRestart = func() bool { return true }
	}
	socket := filepath.Join(cfg.HostRoot, SocketPath)
	if len(socket) > maxSocketPath {
		return nil, fmt.Errorf("fakesystemd: socket path %s is %d bytes, over the kernel's %d; use a shorter host root", socket, len(socket), maxSocketPath)
	}
	daemon, err := exec.LookPath("dbus-daemon")
	if err != nil {
		return nil, fmt.Errorf("fakesystemd: dbus-daemon not found (apt-get install dbus): %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		return nil, fmt.Errorf("fakesystemd: %w", err)
	}
	_ = os.Remove(socket) // a daemon of an earlier agent's life
	conf := filepath.Join(filepath.Dir(socket), "fakesystemd-bus.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, busConf, socket), 0o600); err != nil {
		return nil, fmt.Errorf("fakesystemd: %w", err)
	}
	s := &Systemd{cfg: cfg, pid: 1000, unit: unitPath(cfg.Unit)}
	s.daemon = exec.Command(daemon, "--config-file="+conf, "--print-address", "--nofork")
	out, err := s.daemon.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("fakesystemd: %w", err)
	}
	if err := s.daemon.Start(); err != nil {
		return nil, fmt.Errorf("fakesystemd: start dbus-daemon: %w", err)
	}
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		s.stopDaemon()
		return nil, errors.New("fakesystemd: dbus-daemon printed no address")
	}
	if s.conn, err = godbus.Connect(sc.Text()); err != nil {
		s.stopDaemon()
		return nil, fmt.Errorf("fakesystemd: connect: %w", err)
	}
	if err := s.export(); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Systemd) export() error {
	r, err := s.conn.RequestName("org.freedesktop.systemd1", godbus.NameFlagDoNotQueue)
	if err != nil || r != godbus.RequestNameReplyPrimaryOwner {
		return fmt.Errorf("fakesystemd: request name: reply %v: %w", r, err)
	}
	emit := func(v any) *prop.Prop { return &prop.Prop{Value: v, Emit: prop.EmitTrue} }
	s.props, err = prop.Export(s.conn, s.unit, prop.Map{
		unitIface: {
			"Id": {Value: s.cfg.Unit}, "LoadState": {Value: "loaded"},
			"ActiveState": emit("active"), "SubState": emit("running"),
			"ActiveExitTimestamp": emit(uint64(0)), "Job": {Value: noJob},
		},
		serviceIface: {
			"Result": emit("success"), "NRestarts": emit(uint32(0)), "MainPID": emit(s.pid),
			"ExecMainStartTimestamp": emit(startStamp(s.pid)),
			"ExecMainExitTimestamp":  emit(uint64(0)), "ExecMainCode": emit(int32(0)), "ExecMainStatus": emit(int32(0)),
		},
	})
	if err != nil {
		return fmt.Errorf("fakesystemd: export unit: %w", err)
	}
	err = s.conn.ExportMethodTable(map[string]any{
		"Subscribe": func() *godbus.Error { s.mu.Lock(); s.subscribe++; s.mu.Unlock(); return nil },
		"ListJobs": func() ([][]any, *godbus.Error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			return append([][]any{}, s.queued...), nil
		},
		"GetUnit": func(string) (godbus.ObjectPath, *godbus.Error) { return s.unit, nil },
		"RestartUnit": func(name, mode string) (godbus.ObjectPath, *godbus.Error) {
			return s.restart(name), nil
		},
		"ResetFailedUnit": func(name string) *godbus.Error { s.record("ResetFailedUnit " + name); return nil },
	}, managerPath, managerIface)
	if err != nil {
		return fmt.Errorf("fakesystemd: export manager: %w", err)
	}
	return nil
}

// restart runs a restart job: it answers with the job's path at once and ends the job a
// moment later, as systemd does, with the unit up or failed per Config.OnRestart.
func (s *Systemd) restart(name string) godbus.ObjectPath {
	s.record("RestartUnit " + name)
	s.mu.Lock()
	s.jobs++
	id := s.jobs
	s.mu.Unlock()
	job := jobPath(id)
	go func() {
		s.set("activating", "start", "success", 0)
		time.Sleep(100 * time.Millisecond)
		result := "done"
		if s.cfg.OnRestart() {
			s.Running()
		} else {
			s.set("failed", "failed", "exit-code", 0)
			result = "failed"
		}
		_ = s.conn.Emit(managerPath, managerIface+".JobRemoved", id, job, name, result)
	}()
	return job
}

// Running makes the unit active and running with a new main process.
func (s *Systemd) Running() {
	s.mu.Lock()
	s.pid++
	pid := s.pid
	s.mu.Unlock()
	s.props.SetMust(serviceIface, "ExecMainStartTimestamp", startStamp(pid))
	s.set("active", "running", "success", pid)
}

// Crash is one automatic restart (Restart=always) that lasts far less than the agent's check
// interval: the main process dies with result (exit-code, oom-kill, signal), the unit goes
// through auto-restart for 50 ms, NRestarts grows, and a new main process runs.
func (s *Systemd) Crash(result string) {
	s.mu.Lock()
	s.restarts++
	s.pid++
	pid := s.pid
	s.mu.Unlock()
	s.props.SetMust(serviceIface, "MainPID", uint32(0))
	s.set("activating", "auto-restart", result, 0)
	time.Sleep(50 * time.Millisecond)
	s.props.SetMust(serviceIface, "MainPID", pid)
	s.props.SetMust(serviceIface, "ExecMainStartTimestamp", startStamp(pid))
	s.set("active", "running", "success", pid)
}

// Stop is `systemctl stop` as systemd performs it, at time at (µs since the epoch): a stop job
// is queued (JobNew, Unit.Job, ListJobs), the unit leaves the active state, the main process
// exits 0 on SIGTERM 300 ms later, and the job is removed (JobRemoved "done").
func (s *Systemd) Stop(at uint64) error {
	s.mu.Lock()
	s.jobs++
	id := s.jobs
	job := jobPath(id)
	s.queued = [][]any{{id, s.cfg.Unit, "stop", "running", job, s.unit}}
	s.mu.Unlock()
	s.record("stop " + s.cfg.Unit)
	s.props.SetMust(unitIface, "Job", jobRef{id, job})
	if err := s.conn.Emit(managerPath, managerIface+".JobNew", id, job, s.cfg.Unit); err != nil {
		return fmt.Errorf("fakesystemd: emit JobNew: %w", err)
	}
	s.props.SetMust(unitIface, "ActiveExitTimestamp", at)
	s.set("deactivating", "stop-sigterm", "success", s.mainPID())
	time.Sleep(300 * time.Millisecond)
	s.props.SetMust(serviceIface, "ExecMainExitTimestamp", at+300_000)
	s.props.SetMust(serviceIface, "ExecMainCode", int32(1)) // CLD_EXITED
	s.set("inactive", "dead", "success", 0)
	s.mu.Lock()
	s.queued = nil
	s.mu.Unlock()
	s.props.SetMust(unitIface, "Job", noJob)
	if err := s.conn.Emit(managerPath, managerIface+".JobRemoved", id, job, s.cfg.Unit, "done"); err != nil {
		return fmt.Errorf("fakesystemd: emit JobRemoved: %w", err)
	}
	return nil
}

// StartAt is the unit running again with a new main process started at time at (µs since
// the epoch), with no exit recorded since.
func (s *Systemd) StartAt(at uint64) {
	s.mu.Lock()
	s.pid++
	pid := s.pid
	s.mu.Unlock()
	s.props.SetMust(serviceIface, "ExecMainStartTimestamp", at)
	s.props.SetMust(serviceIface, "ExecMainExitTimestamp", uint64(0))
	s.set("active", "running", "success", pid)
}

// ExitOnItsOwn is the main process exiting 0 by itself at time at under Restart=on-failure:
// the process exits first, the unit leaves the active state after, no job is involved and
// nothing restarts it.
func (s *Systemd) ExitOnItsOwn(at uint64) {
	s.props.SetMust(serviceIface, "ExecMainExitTimestamp", at)
	s.props.SetMust(serviceIface, "ExecMainCode", int32(1)) // CLD_EXITED
	s.props.SetMust(serviceIface, "MainPID", uint32(0))
	s.props.SetMust(unitIface, "ActiveExitTimestamp", at+100)
	s.set("inactive", "dead", "success", 0)
}

// Subscribed counts the clients' Manager.Subscribe calls: a client that subscribed follows
// the unit's signals.
func (s *Systemd) Subscribed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.subscribe
}

func (s *Systemd) mainPID() uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pid
}

// Fail makes the unit failed with result (e.g. "oom-kill": the kernel killed the main
// process and systemd gave up restarting it, its start limit hit).
func (s *Systemd) Fail(result string) { s.set("failed", "failed", result, 0) }

// Calls returns the Manager methods called so far ("RestartUnit kubelet.service", ...).
func (s *Systemd) Calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}

// Restarts counts the RestartUnit calls so far.
func (s *Systemd) Restarts() int {
	n := 0
	for _, c := range s.Calls() {
		if strings.HasPrefix(c, "RestartUnit ") {
			n++
		}
	}
	return n
}

// Close stops the daemon.
func (s *Systemd) Close() error {
	if s.conn != nil {
		_ = s.conn.Close()
	}
	s.stopDaemon()
	return nil
}

// set changes the unit as systemd does: the Service properties first, then the Unit state.
func (s *Systemd) set(active, sub, result string, pid uint32) {
	s.mu.Lock()
	n := s.restarts
	s.mu.Unlock()
	s.props.SetMust(serviceIface, "Result", result)
	s.props.SetMust(serviceIface, "NRestarts", n)
	s.props.SetMust(serviceIface, "MainPID", pid)
	s.props.SetMust(unitIface, "ActiveState", active)
	s.props.SetMust(unitIface, "SubState", sub)
}

func (s *Systemd) record(call string) {
	s.mu.Lock()
	s.calls = append(s.calls, call)
	s.mu.Unlock()
}

func (s *Systemd) stopDaemon() {
	if s.daemon != nil && s.daemon.Process != nil {
		_ = s.daemon.Process.Kill()
		_ = s.daemon.Wait()
	}
}

// unitPath is systemd's object path for a unit: every byte outside [A-Za-z0-9] escaped as _xx.
func unitPath(unit string) godbus.ObjectPath {
	var b strings.Builder
	for i := 0; i < len(unit); i++ {
		c := unit[i]
		if (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "_%02x", c)
		}
	}
	return godbus.ObjectPath("/org/freedesktop/systemd1/unit/" + b.String())
}

func jobPath(id uint32) godbus.ObjectPath {
	return godbus.ObjectPath(fmt.Sprintf("/org/freedesktop/systemd1/job/%d", id))
}

// startStamp is a main process's start time in µs since the epoch, distinct per PID.
func startStamp(pid uint32) uint64 { return 1_700_000_000_000_000 + uint64(pid) }
