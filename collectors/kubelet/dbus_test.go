package kubelet

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
	"github.com/godbus/dbus/v5/prop"

	"github.com/nodevigil/nodevigil/collectors"
)

// These tests run the real go-systemd client against a private dbus-daemon on which a fake
// systemd owns org.freedesktop.systemd1 and implements exactly what the client calls:
// Properties.GetAll on the unit object for the Unit and Service interfaces, and
// Manager.RestartUnit / ResetFailedUnit, answering RestartUnit with a job path and then the
// JobRemoved signal go-systemd waits for.

const (
	sdBusName      = "org.freedesktop.systemd1"
	sdManagerPath  = godbus.ObjectPath("/org/freedesktop/systemd1")
	sdManagerIface = "org.freedesktop.systemd1.Manager"
	sdUnitIface    = "org.freedesktop.systemd1.Unit"
	sdServiceIface = "org.freedesktop.systemd1.Service"
	kubeletPath    = godbus.ObjectPath("/org/freedesktop/systemd1/unit/kubelet_2eservice")
)

const busConfig = `<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path=%s</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
  </policy>
</busconfig>
`

// startBus starts a private dbus-daemon listening on socket and returns its address. The
// daemon is killed in t.Cleanup.
func startBus(t testing.TB, socket string) string {
	t.Helper()
	daemon, err := exec.LookPath("dbus-daemon")
	if err != nil {
		t.Fatalf("dbus-daemon not found (%v): install the dbus package (apt-get install dbus) to run the D-Bus tests", err)
	}
	conf := filepath.Join(filepath.Dir(socket), "bus.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, busConfig, socket), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(daemon, "--config-file="+conf, "--print-address", "--nofork")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start dbus-daemon: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	lines := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(stdout)
		if s.Scan() {
			lines <- s.Text()
		}
		close(lines)
	}()
	select {
	case addr, ok := <-lines:
		if !ok || addr == "" {
			t.Fatalf("dbus-daemon printed no address; stderr: %s", stderr.String())
		}
		return addr
	case <-time.After(10 * time.Second):
		t.Fatalf("dbus-daemon did not print its address within 10s; stderr: %s", stderr.String())
	}
	return ""
}

// socketDir returns a short directory for a unix socket (paths are limited to 108 bytes).
func socketDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "nvdbus")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// fakeSystemd is the systemd side of the bus.
type fakeSystemd struct {
	conn  *godbus.Conn
	props *prop.Properties

	mu            sync.Mutex
	restarts      []string // "unit mode" per RestartUnit call
	resets        []string
	jobID         uint32
	jobResult     string
	withNRestarts bool
	nrestarts     uint32
	pid           uint32
	subscribed    int
	jobs          [][]any // ListJobs rows (usssoo) of the jobs queued now
}

func startFakeSystemd(t testing.TB, addr string) *fakeSystemd {
	return startFakeSystemdWith(t, addr, true)
}

// startFakeSystemdWith starts the fake; withNRestarts false imitates systemd 219 (Amazon Linux
// 2), whose Service interface has no NRestarts. Every property emits PropertiesChanged on
// change, as systemd's do, so the collector's subscription sees transitions between checks.
func startFakeSystemdWith(t testing.TB, addr string, withNRestarts bool) *fakeSystemd {
	t.Helper()
	conn, err := godbus.Connect(addr)
	if err != nil {
		t.Fatalf("fake systemd: connect: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	reply, err := conn.RequestName(sdBusName, godbus.NameFlagDoNotQueue)
	if err != nil || reply != godbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("fake systemd: request name: reply %v, err %v", reply, err)
	}
	f := &fakeSystemd{conn: conn, jobResult: "done", withNRestarts: withNRestarts, pid: 1000}
	service := map[string]*prop.Prop{
		"Result":                 {Value: "success", Emit: prop.EmitTrue},
		"MainPID":                {Value: uint32(1000), Emit: prop.EmitTrue},
		"ExecMainStartTimestamp": {Value: uint64(1_700_000_000_000_000), Emit: prop.EmitTrue},
		"ExecMainExitTimestamp":  {Value: uint64(0), Emit: prop.EmitTrue},
		"ExecMainCode":           {Value: int32(0), Emit: prop.EmitTrue},
		"ExecMainStatus":         {Value: int32(0), Emit: prop.EmitTrue},
	}
	if withNRestarts {
		service["NRestarts"] = &prop.Prop{Value: uint32(0), Emit: prop.EmitTrue}
	}
	f.props, err = prop.Export(conn, kubeletPath, prop.Map{
		sdUnitIface: {
			"Id":                  {Value: "kubelet.service"},
			"LoadState":           {Value: "loaded"},
			"ActiveState":         {Value: "active", Emit: prop.EmitTrue},
			"SubState":            {Value: "running", Emit: prop.EmitTrue},
			"ActiveExitTimestamp": {Value: uint64(0), Emit: prop.EmitTrue},
			// Not emitted here, so the tests prove the JobNew subscription alone suffices.
			"Job": {Value: noJob, Emit: prop.EmitFalse},
		},
		sdServiceIface: service,
	})
	if err != nil {
		t.Fatalf("fake systemd: export properties: %v", err)
	}
	err = conn.ExportMethodTable(map[string]any{
		"RestartUnit":     f.restartUnit,
		"ResetFailedUnit": f.resetFailedUnit,
		"GetUnit":         f.getUnit,
		"Subscribe":       f.subscribe,
		"ListJobs":        f.listJobs,
	}, sdManagerPath, sdManagerIface)
	if err != nil {
		t.Fatalf("fake systemd: export manager: %v", err)
	}
	return f
}

// set changes the unit as systemd would: the Service properties first, then the Unit state
// whose PropertiesChanged signal go-systemd forwards, so a reader woken by that signal sees
// a consistent unit. It returns how many properties it set: each emits one PropertiesChanged
// signal, which a test waits for before it steps its clock.
func (f *fakeSystemd) set(active, sub, result string, nrestarts uint32) int {
	n := 3
	f.props.SetMust(sdServiceIface, "Result", result)
	if f.withNRestarts {
		f.props.SetMust(sdServiceIface, "NRestarts", nrestarts)
		n++
	}
	f.props.SetMust(sdUnitIface, "ActiveState", active)
	f.props.SetMust(sdUnitIface, "SubState", sub)
	return n
}

// crash imitates one automatic restart cycle of systemd between two checks: the main
// process dies with result (exit-code, oom-kill), the unit waits in auto-restart
// (RestartSec), then starts a new main process. Each step emits PropertiesChanged.
func (f *fakeSystemd) crash(t testing.TB, result string, seen func() int) {
	t.Helper()
	f.mu.Lock()
	f.nrestarts++
	f.pid++
	n, pid := f.nrestarts, f.pid
	f.mu.Unlock()
	// Every signal of the cycle is waited for, not only the first: one still queued when the
	// test steps its clock or checks would be folded in at the wrong time (CI saw a restart
	// counted after an 11-minute step, and a check that ran before the OOM kill's Result).
	before := seen()
	f.props.SetMust(sdServiceIface, "MainPID", uint32(0))
	signals := 1 + f.set("activating", "auto-restart", result, n)
	waitSeen(t, seen, before+signals)
	before = seen()
	f.props.SetMust(sdServiceIface, "MainPID", pid)
	f.props.SetMust(sdServiceIface, "ExecMainStartTimestamp", uint64(1_700_000_000_000_000)+uint64(pid))
	signals = 2 + f.set("active", "running", "success", n)
	waitSeen(t, seen, before+signals)
}

// waitSeen polls until the collector has folded in at least want signalled observations.
func waitSeen(t testing.TB, seen func() int, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for seen() < want {
		if time.Now().After(deadline) {
			t.Fatalf("collector saw %d unit changes over D-Bus, want %d", seen(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// noJob is Unit.Job when no job is queued: (0, "/").
var noJob = jobRef{0, "/"}

// jobRef is the (uo) struct of Unit.Job.
type jobRef struct {
	ID   uint32
	Path godbus.ObjectPath
}

func (f *fakeSystemd) listJobs() ([][]any, *godbus.Error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]any{}, f.jobs...), nil
}

// stop imitates systemctl stop: a stop job is queued (JobNew, the unit's Job), the unit is
// taken out of the active state, its process exits after (a kubelet exits 0 on SIGTERM),
// and the job is removed. noticed, when set, is waited on after JobNew, the way a real stop
// job lasts until the kubelet has shut down. The Result stays what it was: systemd keeps the
// crash's result when a unit waiting to be restarted is stopped.
func (f *fakeSystemd) stop(t testing.TB, noticed func()) {
	t.Helper()
	f.mu.Lock()
	f.jobID++
	id := f.jobID
	job := godbus.ObjectPath(fmt.Sprintf("/org/freedesktop/systemd1/job/%d", id))
	f.jobs = append(f.jobs, []any{id, "kubelet.service", "stop", "running", job, kubeletPath})
	f.mu.Unlock()
	f.props.SetMust(sdUnitIface, "Job", jobRef{id, job})
	if err := f.conn.Emit(sdManagerPath, sdManagerIface+".JobNew", id, job, "kubelet.service"); err != nil {
		t.Fatal(err)
	}
	if noticed != nil {
		noticed()
	}
	active, _ := f.props.Get(sdUnitIface, "ActiveState")
	if active.Value() == "active" {
		f.props.SetMust(sdUnitIface, "ActiveExitTimestamp", uint64(1_700_000_000_500_000))
		f.props.SetMust(sdServiceIface, "ExecMainExitTimestamp", uint64(1_700_000_000_600_000))
		f.props.SetMust(sdServiceIface, "ExecMainCode", int32(1))
	}
	f.props.SetMust(sdServiceIface, "MainPID", uint32(0))
	f.props.SetMust(sdUnitIface, "ActiveState", "inactive")
	f.props.SetMust(sdUnitIface, "SubState", "dead")
	f.mu.Lock()
	f.jobs = nil
	f.mu.Unlock()
	f.props.SetMust(sdUnitIface, "Job", noJob)
	_ = f.conn.Emit(sdManagerPath, sdManagerIface+".JobRemoved", id, job, "kubelet.service", "done")
}

// exitOnItsOwn imitates a kubelet whose process exits with status 0 under Restart=on-failure:
// the process exits first, then the unit leaves the active state, and nothing restarts it.
func (f *fakeSystemd) exitOnItsOwn() {
	f.props.SetMust(sdServiceIface, "ExecMainExitTimestamp", uint64(1_700_000_000_500_000))
	f.props.SetMust(sdServiceIface, "ExecMainCode", int32(1))
	f.props.SetMust(sdServiceIface, "MainPID", uint32(0))
	f.props.SetMust(sdUnitIface, "ActiveExitTimestamp", uint64(1_700_000_000_500_100))
	f.set("inactive", "dead", "success", 0)
}

func (f *fakeSystemd) subscribe() *godbus.Error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.subscribed++
	return nil
}

// waitSubscribed polls until a client has subscribed to the fake's signals.
func (f *fakeSystemd) waitSubscribed(t testing.TB) {
	t.Helper()
	f.waitSubscriptions(t, 1)
}

// waitSubscriptions polls until clients have subscribed want times in all: a watcher that
// replaces another subscribes anew, and signals sent before it has are not its to see.
func (f *fakeSystemd) waitSubscriptions(t testing.TB, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		f.mu.Lock()
		n := f.subscribed
		f.mu.Unlock()
		if n >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the collector subscribed to systemd's signals %d times, want %d", n, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// subscriptions is how many times clients have subscribed so far.
func (f *fakeSystemd) subscriptions() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.subscribed
}

func (f *fakeSystemd) getUnit(name string) (godbus.ObjectPath, *godbus.Error) {
	if name != "kubelet.service" {
		return "", godbus.NewError("org.freedesktop.systemd1.NoSuchUnit", []any{"Unit " + name + " not loaded."})
	}
	return kubeletPath, nil
}

func (f *fakeSystemd) resetFailedUnit(name string) *godbus.Error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resets = append(f.resets, name)
	return nil
}

// restartUnit answers with a job path, then (as systemd does once the job is finished)
// marks the unit running and emits JobRemoved with the configured result.
func (f *fakeSystemd) restartUnit(name, mode string) (godbus.ObjectPath, *godbus.Error) {
	f.mu.Lock()
	f.restarts = append(f.restarts, name+" "+mode)
	f.jobID++
	id, result := f.jobID, f.jobResult
	f.mu.Unlock()
	job := godbus.ObjectPath(fmt.Sprintf("/org/freedesktop/systemd1/job/%d", id))
	go func() {
		if result == "done" {
			f.set("active", "running", "success", 0)
		}
		_ = f.conn.Emit(sdManagerPath, sdManagerIface+".JobRemoved", id, job, name, result)
	}()
	return job, nil
}

func (f *fakeSystemd) calls() (restarts, resets []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.restarts...), append([]string(nil), f.resets...)
}

func okHealthz(t testing.TB) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	t.Cleanup(s.Close)
	return s
}

func TestDBusCollector(t *testing.T) {
	addr := startBus(t, filepath.Join(socketDir(t), "bus.sock"))
	sd := startFakeSystemd(t, addr)
	hz := okHealthz(t)
	clock := newFakeClock()
	c, seen := countingCollector(t, Config{DBusAddress: addr, HealthzURL: hz.URL, Now: clock.Now, Timeout: 5 * time.Second})

	steps := []struct {
		name    string
		advance time.Duration
		set     func() int // returns the signals it caused, to be folded in before the next step
		status  collectors.Status
		reason  string
		message string
	}{
		{
			name: "active", status: collectors.StatusHealthy, reason: ReasonKubeletHealthy,
			message: "kubelet.service active/running (NRestarts=0, Result=success), +0 restarts in 10m0s; kubelet /healthz 200 in ",
		},
		{
			name: "restart 1", advance: time.Minute, set: func() int { return sd.set("active", "running", "success", 1) },
			status: collectors.StatusHealthy, reason: ReasonKubeletHealthy, message: "+1 restarts",
		},
		{
			name: "restart 2", advance: time.Minute, set: func() int { return sd.set("activating", "auto-restart", "exit-code", 2) },
			status: collectors.StatusHealthy, reason: ReasonKubeletHealthy, // healthz still answers in this fake
		},
		{
			name: "restart 3: loop", advance: time.Minute, set: func() int { return sd.set("active", "running", "success", 3) },
			status: collectors.StatusUnhealthy, reason: ReasonKubeletRestartLoop,
			message: "kubelet restarted 3 times in 2m0s (threshold 3 in 10m0s): kubelet.service active/running (NRestarts=3, Result=success)",
		},
		{
			name: "oom-killed and failed", advance: 15 * time.Minute, set: func() int { return sd.set("failed", "failed", "oom-kill", 3) },
			status: collectors.StatusUnhealthy, reason: ReasonKubeletOOMKilled,
			message: "kubelet was killed by the kernel OOM killer: kubelet.service failed/failed (NRestarts=3, Result=oom-kill)",
		},
		{
			name: "stopped", advance: 15 * time.Minute, set: func() int { sd.set("active", "running", "success", 0); sd.stop(t, nil); return 0 },
			status: collectors.StatusUnhealthy, reason: ReasonKubeletStoppedByOperator,
		},
	}
	c.Check(context.Background()) // connects and subscribes
	sd.waitSubscribed(t)
	for _, s := range steps {
		clock.Step(s.advance)
		if s.set != nil {
			before := seen()
			waitSeen(t, seen, before+s.set())
		}
		res := c.Check(context.Background())
		if res.Status != s.status || res.Reason != s.reason {
			t.Fatalf("%s: got %s/%s (%s), want %s/%s", s.name, res.Status, res.Reason, res.Message, s.status, s.reason)
		}
		if !strings.Contains(res.Message, s.message) {
			t.Errorf("%s: message\n  %s\nwant it to contain\n  %s", s.name, res.Message, s.message)
		}
	}
}

func TestDBusLazyConnectAndReconnect(t *testing.T) {
	dir := socketDir(t)
	socket := filepath.Join(dir, "bus.sock")
	hz := okHealthz(t)
	clock := newFakeClock()
	var logs logBuffer
	c := newTestCollector(t, Config{
		DBusAddress: "unix:path=" + socket, HealthzURL: hz.URL, Now: clock.Now,
		Timeout: 5 * time.Second, Logger: newTestLogger(&logs),
	}, nil)

	// No bus yet: verdict from healthz alone.
	res := c.Check(context.Background())
	if res.Reason != ReasonKubeletHealthy || !strings.Contains(res.Message, "socket missing; health from /healthz only") {
		t.Fatalf("before the bus: %s %s", res.Reason, res.Message)
	}
	// The bus comes up; within the backoff the collector does not redial.
	addr := startBus(t, socket)
	if addr == "" {
		t.Fatal("no address")
	}
	sd := startFakeSystemd(t, addr)
	sd.set("failed", "failed", "exit-code", 0)
	clock.Step(time.Second)
	if res := c.Check(context.Background()); !strings.Contains(res.Message, "health from /healthz only") {
		t.Fatalf("within the backoff: %s %s, want the cached bus failure", res.Reason, res.Message)
	}
	// After the backoff it connects and sees the failed unit.
	clock.Step(busInitialBackoff)
	if res := c.Check(context.Background()); res.Reason != ReasonKubeletUnitFailed {
		t.Fatalf("after the backoff: %s %s, want %s", res.Reason, res.Message, ReasonKubeletUnitFailed)
	}
	if !strings.Contains(logs.String(), "systemd bus reachable again") {
		t.Errorf("recovery not logged:\n%s", logs.String())
	}
}

func TestDBusRepairer(t *testing.T) {
	addr := startBus(t, filepath.Join(socketDir(t), "bus.sock"))
	sd := startFakeSystemd(t, addr)
	clock := newFakeClock()
	r := newTestRepairer(t, RepairConfig{
		DBusAddress: addr, InitialBackoff: time.Minute, MaxBackoff: 4 * time.Minute, MaxPerHour: 2, Now: clock.Now,
	}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Unit running: nothing to do, whatever the (stale) result says.
	if got, err := r.Repair(ctx, failedResult); err != nil || got.Reason != RepairNotNeeded {
		t.Fatalf("running unit: %+v, %v; want NotNeeded", got, err)
	}

	sd.set("failed", "failed", "oom-kill", 2)
	got, err := r.Repair(ctx, oomResult)
	if err != nil || got != (RepairAttempt{Attempted: true, Reason: RepairRestarted, Attempt: 1, NextAllowed: clock.Now().Add(time.Minute)}) {
		t.Fatalf("first restart: %+v, %v", got, err)
	}
	restarts, resets := sd.calls()
	if len(restarts) != 1 || restarts[0] != "kubelet.service replace" || len(resets) != 1 || resets[0] != "kubelet.service" {
		t.Fatalf("fake systemd saw restarts %q resets %q, want one reset-failed and one replace-mode restart of kubelet.service", restarts, resets)
	}

	// Dead again 30s later: backoff.
	clock.Step(30 * time.Second)
	sd.set("failed", "failed", "exit-code", 0)
	if got, err := r.Repair(ctx, failedResult); err != nil || got.Reason != RepairBackoffActive || got.Attempted {
		t.Fatalf("within backoff: %+v, %v; want BackoffActive", got, err)
	}
	// After the backoff: second restart, whose job fails.
	clock.Step(30 * time.Second)
	sd.mu.Lock()
	sd.jobResult = "failed"
	sd.mu.Unlock()
	got, err = r.Repair(ctx, failedResult)
	if err == nil || got.Reason != RepairRestartFailed || !got.Attempted || got.Attempt != 2 {
		t.Fatalf("failing job: %+v, %v; want an attempted RestartFailed #2", got, err)
	}
	// Backoff elapsed, but two restarts this hour: capped.
	clock.Step(3 * time.Minute)
	if got, err := r.Repair(ctx, failedResult); err != nil || got.Reason != RepairHourlyCapReached {
		t.Fatalf("over the cap: %+v, %v; want HourlyCapReached", got, err)
	}
	if restarts, _ := sd.calls(); len(restarts) != 2 {
		t.Fatalf("fake systemd saw %d restarts, want 2", len(restarts))
	}
}

// hungBus listens on a unix socket, accepts connections and never speaks D-Bus. closed
// receives one value per client connection that the client side closed.
func hungBus(t *testing.T) (socket string, closed <-chan struct{}) {
	t.Helper()
	socket = filepath.Join(socketDir(t), "hung.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	ch := make(chan struct{}, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 512)
				for {
					if _, err := c.Read(buf); err != nil {
						select {
						case ch <- struct{}{}:
						default:
						}
						return
					}
				}
			}()
		}
	}()
	return socket, ch
}

// TestDBusHungBusIsBounded points the collector at a socket that accepts connections and
// never speaks D-Bus: the authentication handshake blocks, and Check must still return
// within its timeout, from /healthz alone.
func TestDBusHungBusIsBounded(t *testing.T) {
	socket, _ := hungBus(t)
	const timeout = 300 * time.Millisecond
	hz := okHealthz(t)
	c := newTestCollector(t, Config{DBusAddress: "unix:path=" + socket, HealthzURL: hz.URL, Timeout: timeout}, nil)
	start := time.Now()
	res := c.Check(context.Background())
	if elapsed := time.Since(start); elapsed > timeout+time.Second {
		t.Errorf("Check took %s with a hung bus and Timeout %s", elapsed, timeout)
	}
	if res.Status != collectors.StatusHealthy || !strings.Contains(res.Message, "(systemd not reachable over D-Bus: timed out; health from /healthz only)") {
		t.Fatalf("got %s/%s %q", res.Status, res.Reason, res.Message)
	}
}

// TestDialSystemdAbandonsHungHandshake checks the dial itself (not only Check's guard):
// it returns at its deadline and closes the connection it was authenticating on.
func TestDialSystemdAbandonsHungHandshake(t *testing.T) {
	socket, closed := hungBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	type result struct {
		conn *sddbus.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		c, err := dialSystemd(ctx, "unix:path="+socket, context.Background())
		done <- result{c, err}
	}()
	select {
	case r := <-done:
		if r.err == nil {
			r.conn.Close()
			t.Fatal("dialSystemd succeeded against a bus that never answers")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("dialSystemd did not return within 5s of a 200ms deadline")
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the abandoned handshake connection was not closed")
	}
}

// countingCollector wraps the collector's signal hook to count signalled observations.
func countingCollector(t *testing.T, cfg Config) (*Collector, func() int) {
	t.Helper()
	c := newTestCollector(t, cfg, nil)
	var mu sync.Mutex
	n := 0
	unit := c.units.(*systemdUnit)
	inner := unit.onChange
	unit.onChange = func(st unitState) {
		inner(st)
		mu.Lock()
		n++
		mu.Unlock()
	}
	return c, func() int { mu.Lock(); defer mu.Unlock(); return n }
}

// TestDBusSignalsBetweenChecks: with RestartSec=5 and a 10 s check interval, an OOM kill and
// the automatic restart that follows both happen between two checks. Polling alone sees a
// running unit and Result=success both times; the PropertiesChanged subscription sees the
// kill and the restarts.
func TestDBusSignalsBetweenChecks(t *testing.T) {
	for _, tc := range []struct {
		name          string
		withNRestarts bool
	}{{"systemd with NRestarts", true}, {"systemd 219 without NRestarts", false}} {
		t.Run(tc.name, func(t *testing.T) {
			addr := startBus(t, filepath.Join(socketDir(t), "bus.sock"))
			sd := startFakeSystemdWith(t, addr, tc.withNRestarts)
			hz := okHealthz(t)
			clock := newFakeClock()
			c, seen := countingCollector(t, Config{DBusAddress: addr, HealthzURL: hz.URL, Now: clock.Now, Timeout: 5 * time.Second})

			res := c.Check(context.Background()) // connects and subscribes
			sd.waitSubscribed(t)
			if res.Reason != ReasonKubeletHealthy || !res.Disrupted.IsZero() {
				t.Fatalf("first check: %s %q disrupted %v", res.Reason, res.Message, res.Disrupted)
			}
			clock.Step(10 * time.Second)
			sd.crash(t, "oom-kill", seen)
			clock.Step(time.Second)
			res = c.Check(context.Background())
			if res.Status != collectors.StatusUnhealthy || res.Reason != ReasonKubeletOOMKilled {
				t.Fatalf("after an OOM kill between checks: %s/%s %q, want Unhealthy/%s", res.Status, res.Reason, res.Message, ReasonKubeletOOMKilled)
			}
			if res.Disrupted.IsZero() || res.Disrupted.After(clock.Now()) {
				t.Errorf("Disrupted = %v, want the time of the kill", res.Disrupted)
			}

			// Two more crashes between checks: three restarts within the window are a loop,
			// counted from NRestarts or, on systemd 219, from MainPID/start-time changes.
			clock.Step(11 * time.Minute) // past the OOM memory
			sd.crash(t, "exit-code", seen)
			sd.crash(t, "exit-code", seen)
			sd.crash(t, "exit-code", seen)
			res = c.Check(context.Background())
			if res.Reason != ReasonKubeletRestartLoop || !strings.Contains(res.Message, "restarted 3 times") {
				t.Fatalf("after three restarts between checks: %s %q, want %s", res.Reason, res.Message, ReasonKubeletRestartLoop)
			}
			if !tc.withNRestarts && !strings.Contains(res.Message, "NRestarts=n/a") {
				t.Errorf("message %q should say NRestarts is unavailable rather than print 0", res.Message)
			}
		})
	}
}

// TestDBusStopJob: over a real dbus-daemon, an operator's stop is told from a kubelet that
// exited on its own. (1) Stopped while systemd waits to restart a crashed kubelet, between two
// checks: the run was ended by the crash, so only the stop job, seen through the JobNew
// subscription, shows it was stopped on purpose; it is reported and the repairer leaves it.
// (2) An agent that starts after a systemctl stop reads it from systemd's timestamps. (3) A
// kubelet that exits 0 on its own is not an operator stop, and the repairer restarts it.
func TestDBusStopJob(t *testing.T) {
	addr := startBus(t, filepath.Join(socketDir(t), "bus.sock"))
	sd := startFakeSystemd(t, addr)
	clock := newFakeClock()
	refused := healthzClient(0, "", errConnRefused)
	c, seen := countingCollector(t, Config{DBusAddress: addr, HTTPClient: refused, Now: clock.Now, Timeout: 5 * time.Second})
	r := newTestRepairer(t, RepairConfig{DBusAddress: addr, Now: clock.Now}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	c.Check(ctx) // connects and subscribes
	sd.waitSubscribed(t)
	// (1) The kubelet crashes, and the operator stops it before systemd restarts it.
	before := seen()
	sd.props.SetMust(sdServiceIface, "ExecMainExitTimestamp", uint64(1_700_000_000_100_000))
	sd.props.SetMust(sdUnitIface, "ActiveExitTimestamp", uint64(1_700_000_000_100_100))
	sd.set("activating", "auto-restart", "exit-code", 1)
	// Six property changes, six signals: all folded in, so no late read of them can see the
	// stop job below, and only the JobNew subscription can.
	waitSeen(t, seen, before+6)
	sd.stop(t, func() {
		deadline := time.Now().Add(10 * time.Second)
		for {
			c.mu.Lock()
			at := c.stopJobAt
			c.mu.Unlock()
			if !at.IsZero() {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the collector never noticed the stop job")
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	clock.Step(10 * time.Second)
	res := c.Check(ctx)
	if res.Reason != ReasonKubeletStoppedByOperator || !strings.Contains(res.Message, "a stop job for kubelet.service was seen at") {
		t.Fatalf("stopped during auto-restart: %s %q, want %s from the stop job", res.Reason, res.Message, ReasonKubeletStoppedByOperator)
	}
	if got, err := r.Repair(ctx, res); err != nil || got.Attempted {
		t.Fatalf("repair of an operator stop: %+v, %v", got, err)
	}

	// (2) Started again; stopped while no agent watches; a new agent reads the timestamps.
	sd.props.SetMust(sdServiceIface, "ExecMainStartTimestamp", uint64(1_700_000_000_200_000))
	sd.props.SetMust(sdServiceIface, "ExecMainExitTimestamp", uint64(0))
	sd.set("active", "running", "success", 0)
	sd.stop(t, nil)
	late := newTestCollector(t, Config{DBusAddress: addr, HTTPClient: refused, Now: clock.Now, Timeout: 5 * time.Second}, nil)
	res = late.Check(ctx)
	if res.Reason != ReasonKubeletStoppedByOperator || !strings.Contains(res.Message, "before its process exited") {
		t.Fatalf("agent started after systemctl stop: %s %q, want %s from the timestamps", res.Reason, res.Message, ReasonKubeletStoppedByOperator)
	}
	if got, err := r.Repair(ctx, inactiveResult); err != nil || got.Attempted || got.Reason != RepairOperatorStopped {
		t.Fatalf("repair handed a stale result for a stopped unit: %+v, %v; want OperatorStopped", got, err)
	}

	// (3) Started again, then the kubelet exits 0 by itself.
	sd.props.SetMust(sdServiceIface, "ExecMainStartTimestamp", uint64(1_700_000_000_300_000))
	sd.props.SetMust(sdServiceIface, "ExecMainExitTimestamp", uint64(0))
	sd.set("active", "running", "success", 0)
	clock.Step(10 * time.Second)
	if res := c.Check(ctx); res.Reason == ReasonKubeletStoppedByOperator {
		t.Fatalf("running again: %s %q", res.Reason, res.Message)
	}
	sd.exitOnItsOwn()
	clock.Step(10 * time.Second)
	res = c.Check(ctx)
	if res.Reason != ReasonKubeletUnitInactive || !strings.Contains(res.Message, "exited on its own (exit status 0)") {
		t.Fatalf("exited on its own: %s %q, want %s", res.Reason, res.Message, ReasonKubeletUnitInactive)
	}
	if got, err := r.Repair(ctx, res); err != nil || got.Reason != RepairRestarted {
		t.Fatalf("repair of a kubelet that exited on its own: %+v, %v; want Restarted", got, err)
	}
}

// TestDBusWatcherEndsWithItsConnection: when the checks' connection to systemd is lost and
// replaced, the signal watcher of the old one ends at once (its own bus connection closes)
// and a new one follows the unit; no liveness timer wakes the agent to notice.
func TestDBusWatcherEndsWithItsConnection(t *testing.T) {
	addr := startBus(t, filepath.Join(socketDir(t), "bus.sock"))
	sd := startFakeSystemd(t, addr)
	hz := okHealthz(t)
	clock := newFakeClock()
	c, seen := countingCollector(t, Config{DBusAddress: addr, HealthzURL: hz.URL, Now: clock.Now, Timeout: 5 * time.Second})
	observer, err := godbus.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer observer.Close()
	if err := observer.Auth(nil); err != nil {
		t.Fatal(err)
	}
	if err := observer.Hello(); err != nil {
		t.Fatal(err)
	}
	clients := func() int {
		var names []string
		if err := observer.BusObject().Call("org.freedesktop.DBus.ListNames", 0).Store(&names); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, name := range names {
			if strings.HasPrefix(name, ":") {
				n++
			}
		}
		return n
	}

	c.Check(context.Background()) // connects and subscribes
	sd.waitSubscribed(t)
	before := clients()

	// The call connection dies; the next check dials a new one and watches on it.
	unit := c.units.(*systemdUnit)
	unit.bus.sem <- struct{}{}
	unit.bus.conn.Close()
	<-unit.bus.sem
	subscribed := sd.subscriptions()
	clock.Step(10 * time.Second)
	c.Check(context.Background())
	sd.waitSubscriptions(t, subscribed+1) // the new watcher

	deadline := time.Now().Add(10 * time.Second) // the removed liveness ticker took 30 s
	for n := clients(); n != before; n = clients() {
		if time.Now().After(deadline) {
			t.Fatalf("bus clients = %d after the connection was replaced, want %d: the old watcher's connection is still open", n, before)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// And the unit's changes are still seen between checks, by the new watcher.
	clock.Step(10 * time.Second)
	sd.crash(t, "oom-kill", seen)
	clock.Step(time.Second)
	if res := c.Check(context.Background()); res.Reason != ReasonKubeletOOMKilled {
		t.Fatalf("after an OOM kill between checks: %s %q, want %s", res.Reason, res.Message, ReasonKubeletOOMKilled)
	}
}
