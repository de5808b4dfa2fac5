package kubelet

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodevigil/nodevigil/collectors"
)

var (
	activeUnit = unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "active", SubState: "running", Result: "success"}
	// stoppedUnit was stopped by a stop job: out of the active state at 200, its process (a
	// kubelet exits 0 on SIGTERM) gone at 250.
	stoppedUnit = unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "inactive", SubState: "dead", Result: "success",
		MainStart: 100, ActiveExit: 200, MainExit: 250, MainCode: 1}
	// exitedUnit's process exited on its own at 200 and the unit left the active state after.
	exitedUnit = unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "inactive", SubState: "dead", Result: "success",
		MainStart: 100, ActiveExit: 201, MainExit: 200, MainCode: 1}
	errNoBus = classifyBusError(&syscallErr{syscall.ENOENT})
)

// syscallErr mimics the *net.OpError chain of a dial to a missing socket.
type syscallErr struct{ errno syscall.Errno }

func (e *syscallErr) Error() string {
	return "dial unix /run/dbus/system_bus_socket: " + e.errno.Error()
}
func (e *syscallErr) Unwrap() error { return e.errno }

func TestCheckVerdict(t *testing.T) {
	tests := []struct {
		name    string
		unit    unitState
		unitErr error
		hzCode  int
		hzBody  string
		hzErr   error
		status  collectors.Status
		reason  string
		message []string
		wantErr bool
	}{
		{
			name: "active and healthz ok", unit: activeUnit, hzCode: 200, hzBody: "ok",
			status: collectors.StatusHealthy, reason: ReasonKubeletHealthy,
			message: []string{"kubelet.service active/running (NRestarts=0, Result=success), +0 restarts in 10m0s; kubelet /healthz 200 in "},
		},
		{
			name: "failed by oom-kill", unit: unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "failed", SubState: "failed", Result: "oom-kill", NRestarts: 4},
			hzErr: errConnRefused, status: collectors.StatusUnhealthy, reason: ReasonKubeletOOMKilled,
			message: []string{"kubelet was killed by the kernel OOM killer: kubelet.service failed/failed (NRestarts=4, Result=oom-kill)", "connection refused"},
		},
		{
			name: "auto-restarting after oom-kill", unit: unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "activating", SubState: "auto-restart", Result: "oom-kill", NRestarts: 1},
			hzErr: errConnRefused, status: collectors.StatusUnhealthy, reason: ReasonKubeletOOMKilled,
		},
		{
			name: "failed with exit code", unit: unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "failed", SubState: "failed", Result: "exit-code", NRestarts: 5},
			hzErr: errConnRefused, status: collectors.StatusUnhealthy, reason: ReasonKubeletUnitFailed,
			message: []string{"kubelet unit failed: kubelet.service failed/failed (NRestarts=5, Result=exit-code)"},
		},
		{
			name: "hit start limit", unit: unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "failed", SubState: "failed", Result: "start-limit-hit"},
			hzErr: errConnRefused, status: collectors.StatusUnhealthy, reason: ReasonKubeletUnitFailed,
		},
		{
			name: "inactive after a failure", unit: unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "inactive", SubState: "dead", Result: "signal"},
			hzErr: errConnRefused, status: collectors.StatusUnhealthy, reason: ReasonKubeletUnitInactive,
			message: []string{"kubelet unit is not running: kubelet.service inactive/dead"},
		},
		{
			// systemctl stop before the agent was watching: the unit left the active state
			// (ActiveExit) before its process exited (MainExit), which only a stop job does.
			name: "stopped on purpose, seen after the fact", unit: stoppedUnit,
			hzErr: errConnRefused, status: collectors.StatusUnhealthy, reason: ReasonKubeletStoppedByOperator,
			message: []string{"stopped on purpose (systemd took the unit out of service before its process exited", "start it with systemctl start kubelet.service"},
		},
		{
			name: "being stopped by a stop job", unit: unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "deactivating", SubState: "stop-sigterm",
				Result: "success", MainStart: 100, ActiveExit: 200, JobID: 7, JobType: "stop"},
			hzErr: errConnRefused, status: collectors.StatusUnhealthy, reason: ReasonKubeletStoppedByOperator,
			message: []string{"a stop job for kubelet.service was seen at "},
		},
		{
			// systemctl restart, caught between its stop and its start: not stopped.
			name: "restart job between stop and start", unit: unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "inactive", SubState: "dead",
				Result: "success", MainStart: 100, ActiveExit: 200, MainExit: 250, MainCode: 1, JobID: 8, JobType: "restart"},
			hzErr: errConnRefused, status: collectors.StatusUnhealthy, reason: ReasonKubeletUnitInactive,
			message: []string{"systemd has a restart job queued for it"},
		},
		{
			// Restart=on-failure and the kubelet exited 0 by itself: inactive with a clean
			// result, but no stop job ended it.
			name: "exited on its own with a clean result", unit: exitedUnit,
			hzErr: errConnRefused, status: collectors.StatusUnhealthy, reason: ReasonKubeletUnitInactive,
			message: []string{"kubelet exited on its own (exit status 0) and systemd did not restart it; no stop job ended it, so it was not stopped on purpose"},
		},
		{
			// systemctl stop of a kubelet that ignored SIGTERM: killed at TimeoutStopSec.
			name: "stopped on purpose, killed at the stop timeout", unit: unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "failed", SubState: "failed",
				Result: "timeout", MainStart: 100, ActiveExit: 200, MainExit: 90_200, MainCode: 2, MainStatus: 9},
			hzErr: errConnRefused, status: collectors.StatusUnhealthy, reason: ReasonKubeletStoppedByOperator,
		},
		{
			name: "never started since boot", unit: unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "inactive", SubState: "dead", Result: "success"},
			hzErr: errConnRefused, status: collectors.StatusUnhealthy, reason: ReasonKubeletUnitInactive,
			message: []string{"kubelet unit has not been started since boot"},
		},
		{
			// Stopped long ago (ActiveExit 200), started again, and this run exited before
			// it ever became active: the old ActiveExit must not make it look stopped.
			name: "later run ended before becoming active", unit: unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "inactive", SubState: "dead",
				Result: "success", MainStart: 300, ActiveExit: 200, MainExit: 301, MainCode: 1},
			hzErr: errConnRefused, status: collectors.StatusUnhealthy, reason: ReasonKubeletUnitInactive,
			message: []string{"exited on its own (exit status 0)"},
		},
		{
			name: "systemd 219 without NRestarts", unit: unitState{LoadState: "loaded", ActiveState: "active", SubState: "running", Result: "success", MainPID: 42, MainStart: 1},
			hzCode: 200, status: collectors.StatusHealthy, reason: ReasonKubeletHealthy,
			message: []string{"NRestarts=n/a", "0 restart(s) counted from MainPID/start-time changes"},
		},
		{
			name: "deactivating", unit: unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "deactivating", SubState: "stop-sigterm", Result: "success"},
			hzCode: 200, status: collectors.StatusUnhealthy, reason: ReasonKubeletUnitInactive,
		},
		{
			name: "active but healthz 500", unit: activeUnit, hzCode: 500, hzBody: "[-]syncloop failed\n",
			status: collectors.StatusUnhealthy, reason: ReasonKubeletHealthzFailed,
			message: []string{`kubelet /healthz returned 500 in `, `"[-]syncloop failed" while kubelet.service active/running`},
		},
		{
			name: "active but healthz refused", unit: activeUnit, hzErr: errConnRefused,
			status: collectors.StatusUnhealthy, reason: ReasonKubeletHealthzFailed,
			message: []string{"/healthz failed after", "connection refused"},
		},
		{
			name: "no bus, healthz ok", unitErr: errNoBus, hzCode: 200,
			status: collectors.StatusHealthy, reason: ReasonKubeletHealthy,
			message: []string{"kubelet /healthz 200 in ", " (systemd not reachable over D-Bus: socket missing; health from /healthz only)"},
		},
		{
			name: "no bus, healthz 503", unitErr: errNoBus, hzCode: 503,
			status: collectors.StatusUnhealthy, reason: ReasonKubeletHealthzFailed,
			message: []string{"kubelet /healthz returned 503", "(systemd not reachable over D-Bus: socket missing; health from /healthz only)"},
		},
		{
			name: "no bus, healthz refused", unitErr: errNoBus, hzErr: errConnRefused,
			status: collectors.StatusUnknown, reason: ReasonKubeletUnobservable,
			message: []string{"kubelet cannot be observed: systemd not reachable over D-Bus: socket missing, and /healthz failed after"},
			wantErr: true,
		},
		{
			name: "unit unknown to systemd, healthz ok", unit: unitState{LoadState: "not-found", ActiveState: "inactive", SubState: "dead"}, hzCode: 200,
			status: collectors.StatusHealthy, reason: ReasonKubeletHealthy,
			message: []string{"(systemd has no unit kubelet.service; health from /healthz only)"},
		},
		{
			name: "unit unknown to systemd, healthz refused", unit: unitState{LoadState: "not-found"}, hzErr: errConnRefused,
			status: collectors.StatusUnknown, reason: ReasonKubeletUnobservable, wantErr: true,
		},
		{
			name: "query failed, healthz refused", unitErr: &busError{Kind: kindQueryFailed, Err: errors.New("boom")}, hzErr: errConnRefused,
			status: collectors.StatusUnknown, reason: ReasonKubeletUnobservable, wantErr: true,
			message: []string{"kubelet cannot be observed: systemd query over D-Bus failed, and /healthz failed after"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newFakeClock()
			units := &fakeUnits{}
			units.set(tt.unit, tt.unitErr)
			c := newTestCollector(t, Config{Now: clock.Now, HTTPClient: healthzClient(tt.hzCode, tt.hzBody, tt.hzErr)}, units)
			res := c.Check(context.Background())
			if res.Check != "kubelet" || !res.Time.Equal(clock.Now()) {
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

func TestCheckUnobservableWrapsNotSupported(t *testing.T) {
	units := &fakeUnits{}
	units.set(unitState{}, errNoBus)
	c := newTestCollector(t, Config{HTTPClient: healthzClient(0, "", errConnRefused)}, units)
	res := c.Check(context.Background())
	if !errors.Is(res.Err, collectors.ErrNotSupported) {
		t.Fatalf("Err = %v, want it to wrap collectors.ErrNotSupported (missing socket)", res.Err)
	}
}

func TestRestartLoopAndOOMMemory(t *testing.T) {
	type step struct {
		advance time.Duration
		unit    unitState
		reason  string
		message string
	}
	running := func(n uint32) unitState {
		return unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "active", SubState: "running", Result: "success", NRestarts: n}
	}
	looping := func(n uint32) unitState {
		return unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "activating", SubState: "auto-restart", Result: "exit-code", NRestarts: n}
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name: "three restarts within the window",
			steps: []step{
				{unit: running(0), reason: ReasonKubeletHealthy},
				{advance: time.Minute, unit: running(1), reason: ReasonKubeletHealthy, message: "+1 restarts in 10m0s"},
				{advance: time.Minute, unit: looping(2), reason: ReasonKubeletHealthzFailed},
				{advance: time.Minute, unit: running(3), reason: ReasonKubeletRestartLoop, message: "kubelet restarted 3 times in 2m0s (threshold 3 in 10m0s)"},
				{advance: 5 * time.Minute, unit: running(3), reason: ReasonKubeletRestartLoop},
				// The window slides past the restarts: healthy again.
				{advance: 10 * time.Minute, unit: running(3), reason: ReasonKubeletHealthy, message: "+0 restarts"},
			},
		},
		{
			name: "activating in a loop",
			steps: []step{
				{unit: looping(10), reason: ReasonKubeletHealthzFailed},
				{advance: 20 * time.Second, unit: looping(11), reason: ReasonKubeletHealthzFailed},
				{advance: 20 * time.Second, unit: looping(13), reason: ReasonKubeletRestartLoop, message: "restarted 3 times in 20s"},
			},
		},
		{
			name: "restarts spread wider than the window are not a loop",
			steps: []step{
				{unit: running(0), reason: ReasonKubeletHealthy},
				{advance: 6 * time.Minute, unit: running(2), reason: ReasonKubeletHealthy},
				{advance: 11 * time.Minute, unit: running(4), reason: ReasonKubeletHealthy, message: "+2 restarts"},
			},
		},
		{
			name: "counter reset starts the history over",
			steps: []step{
				{unit: running(5), reason: ReasonKubeletHealthy},
				{advance: time.Minute, unit: running(0), reason: ReasonKubeletHealthy},
				{advance: time.Minute, unit: running(2), reason: ReasonKubeletHealthy, message: "+2 restarts"},
			},
		},
		{
			name: "oom kill is remembered for one window",
			steps: []step{
				{unit: unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "failed", SubState: "failed", Result: "oom-kill"}, reason: ReasonKubeletOOMKilled},
				{advance: time.Minute, unit: running(0), reason: ReasonKubeletOOMKilled, message: "kubelet was OOM-killed 1m0s ago (reported for 10m0s after a kill)"},
				{advance: 8 * time.Minute, unit: running(0), reason: ReasonKubeletOOMKilled, message: "OOM-killed 9m0s ago"},
				{advance: time.Minute, unit: running(0), reason: ReasonKubeletHealthy},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newFakeClock()
			units := &fakeUnits{}
			c := newTestCollector(t, Config{Now: clock.Now}, units)
			for i, s := range tt.steps {
				clock.Step(s.advance)
				units.set(s.unit, nil)
				code := 200
				if s.unit.ActiveState != "active" {
					code = 0
				}
				var hzErr error
				if code == 0 {
					hzErr = errConnRefused
				}
				c.client = healthzClient(code, "ok", hzErr)
				res := c.Check(context.Background())
				if res.Reason != s.reason {
					t.Fatalf("step %d: reason %s (%s), want %s", i, res.Reason, res.Message, s.reason)
				}
				if s.message != "" && !strings.Contains(res.Message, s.message) {
					t.Errorf("step %d: message\n  %s\nwant it to contain\n  %s", i, res.Message, s.message)
				}
			}
		})
	}
}

func TestRestartHistoryIsBounded(t *testing.T) {
	clock := newFakeClock()
	c := newTestCollector(t, Config{Now: clock.Now, RestartLoopWindow: 24 * time.Hour, RestartLoopThreshold: 1 << 30}, &fakeUnits{})
	for i := 0; i < 3*maxHistory; i++ {
		clock.Step(time.Second)
		c.recordRestarts(clock.Now(), uint64(i%3+1))
	}
	if len(c.history) > maxHistory {
		t.Fatalf("history has %d entries, want at most %d", len(c.history), maxHistory)
	}
}

// hangingUnits never answers and ignores ctx: the worst case Check must survive.
type hangingUnits struct{ release chan struct{} }

func (h hangingUnits) readUnit(context.Context) (unitState, error) {
	<-h.release
	return unitState{}, errors.New("released")
}

func TestCheckBoundedByTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	// A kubelet that accepts the connection and never answers.
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	}))
	defer hung.Close()

	tests := []struct {
		name   string
		units  unitReader
		limit  time.Duration
		reason string
		status collectors.Status
		msg    string
	}{
		{
			name: "hung kubelet, unit active", units: &fakeUnits{state: activeUnit},
			limit: timeout + time.Second, status: collectors.StatusUnhealthy, reason: ReasonKubeletHealthzFailed,
			msg: "/healthz accepted the connection but did not answer within",
		},
		{
			name: "hung kubelet, no bus", units: &fakeUnits{err: errNoBus},
			limit: timeout + time.Second, status: collectors.StatusUnhealthy, reason: ReasonKubeletHealthzFailed,
			msg: "health from /healthz only",
		},
		{
			name: "hung kubelet and a bus reader that ignores ctx", units: hangingUnits{release: make(chan struct{})},
			limit: timeout + resultGrace + time.Second, status: collectors.StatusUnhealthy, reason: ReasonKubeletHealthzFailed,
			msg: "systemd not reachable over D-Bus: timed out",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestCollector(t, Config{HealthzURL: hung.URL + "/healthz", Timeout: timeout}, tt.units)
			if h, ok := tt.units.(hangingUnits); ok {
				defer close(h.release)
			}
			start := time.Now()
			res := c.Check(context.Background())
			elapsed := time.Since(start)
			if elapsed > tt.limit {
				t.Errorf("Check took %s with Timeout %s, want at most %s", elapsed, timeout, tt.limit)
			}
			if res.Status != tt.status || res.Reason != tt.reason || !strings.Contains(res.Message, tt.msg) {
				t.Errorf("got %s/%s %q, want %s/%s containing %q", res.Status, res.Reason, res.Message, tt.status, tt.reason, tt.msg)
			}
		})
	}
}

func TestMissingSocketLogsOnce(t *testing.T) {
	var logs logBuffer
	clock := newFakeClock()
	hz := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	defer hz.Close()
	c := newTestCollector(t, Config{
		HostRoot:   t.TempDir(), // no run/dbus/system_bus_socket under it
		HealthzURL: hz.URL,
		Now:        clock.Now,
		Logger:     newTestLogger(&logs),
	}, nil)
	for i := 0; i < 6; i++ {
		res := c.Check(context.Background())
		if res.Status != collectors.StatusHealthy || res.Reason != ReasonKubeletHealthy {
			t.Fatalf("check %d: %s/%s %s", i, res.Status, res.Reason, res.Message)
		}
		if want := "(systemd not reachable over D-Bus: socket missing; health from /healthz only)"; !strings.HasSuffix(res.Message, want) {
			t.Fatalf("check %d: message %q, want suffix %q", i, res.Message, want)
		}
		if res.Err != nil {
			t.Fatalf("check %d: Err = %v, want nil (the verdict came from /healthz)", i, res.Err)
		}
		clock.Step(10 * time.Minute) // past any backoff: every check redials
	}
	if n := strings.Count(logs.String(), "systemd bus unreachable"); n != 1 {
		t.Fatalf("logged %d times, want once:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), `reason="socket missing"`) {
		t.Errorf("log does not name the reason:\n%s", logs.String())
	}
}

func TestNewConfig(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
		check   func(t *testing.T, c *Collector)
	}{
		{
			name: "defaults",
			check: func(t *testing.T, c *Collector) {
				if c.cfg.Unit != "kubelet.service" || c.cfg.HealthzURL != DefaultHealthzURL || c.cfg.Timeout != 2*time.Second ||
					c.cfg.RestartLoopThreshold != 3 || c.cfg.RestartLoopWindow != 10*time.Minute ||
					c.cfg.DBusAddress != "unix:path=/run/dbus/system_bus_socket" {
					t.Errorf("defaults not applied: %+v", c.cfg)
				}
			},
		},
		{
			name: "bus address follows HostRoot",
			cfg:  Config{HostRoot: "/host"},
			check: func(t *testing.T, c *Collector) {
				if want := "unix:path=" + filepath.Join("/host", "run/dbus/system_bus_socket"); c.cfg.DBusAddress != want {
					t.Errorf("DBusAddress = %q, want %q", c.cfg.DBusAddress, want)
				}
			},
		},
		{name: "not a service", cfg: Config{Unit: "kubelet"}, wantErr: "Config.Unit"},
		{name: "bad url", cfg: Config{HealthzURL: "127.0.0.1:10248/healthz"}, wantErr: "Config.HealthzURL"},
		{name: "negative timeout", cfg: Config{Timeout: -time.Second}, wantErr: "must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(tt.cfg)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if c.Name() != "kubelet" {
				t.Errorf("Name() = %q", c.Name())
			}
			tt.check(t, c)
		})
	}
}

func TestClassifyBusError(t *testing.T) {
	tests := []struct {
		err  error
		kind string
	}{
		{&syscallErr{syscall.ENOENT}, "socket missing"},
		{&syscallErr{syscall.ECONNREFUSED}, "socket not accepting connections"},
		{&syscallErr{syscall.EACCES}, "permission denied"},
		{context.DeadlineExceeded, "timed out"},
		{errors.New("dbus: authentication failed"), "connection failed"},
	}
	for _, tt := range tests {
		if got := classifyBusError(tt.err); got.Kind != tt.kind || !errors.Is(got, tt.err) {
			t.Errorf("classifyBusError(%v) = %q (unwraps: %v), want %q", tt.err, got.Kind, errors.Is(got, tt.err), tt.kind)
		}
	}
}

// refused is what a real dial to a closed port returns (errors.Is ECONNREFUSED).
var refused = &url.Error{Op: "Get", URL: "http://127.0.0.1:10248/healthz", Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}

// TestKubeletNotRunning: with no systemd to ask and /healthz refusing connections, the host's
// process table decides. A kubelet that exits at once (a malformed flag) is Unhealthy, not
// Unknown; only a process table that is not the host's leaves the verdict Unknown, and the
// message says which mount would fix it.
func TestKubeletNotRunning(t *testing.T) {
	tests := []struct {
		host   string
		status collectors.Status
		reason string
		msg    string
	}{
		{"host-no-kubelet", collectors.StatusUnhealthy, ReasonKubeletNotRunning, "no kubelet process in the host's process table"},
		{"host-kubelet", collectors.StatusUnhealthy, ReasonKubeletHealthzFailed, "kubelet pid 2417 exists but does not serve /healthz"},
		{"container", collectors.StatusUnknown, ReasonKubeletUnobservable, "mount the host's /run/dbus at"},
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			units := &fakeUnits{}
			units.set(unitState{}, errNoBus)
			c := newTestCollector(t, Config{HostRoot: filepath.Join("testdata/proc", tt.host), HTTPClient: healthzClient(0, "", refused)}, units)
			res := c.Check(context.Background())
			if res.Status != tt.status || res.Reason != tt.reason || !strings.Contains(res.Message, tt.msg) {
				t.Fatalf("got %s/%s %q, want %s/%s containing %q", res.Status, res.Reason, res.Message, tt.status, tt.reason, tt.msg)
			}
		})
	}
}

// TestHealthzDebounce: while systemd shows the unit running, one failed probe is not an
// outage; HealthzFailureThreshold consecutive ones are, and a success starts over. A unit
// systemd shows down needs no debouncing.
func TestHealthzDebounce(t *testing.T) {
	units := &fakeUnits{}
	units.set(activeUnit, nil)
	c := newTestCollector(t, Config{HealthzFailureThreshold: 3}, units)
	probe := func(ok bool) collectors.Result {
		if ok {
			c.client = healthzClient(200, "ok", nil)
		} else {
			c.client = healthzClient(500, "[-]syncloop failed", nil)
		}
		return c.Check(context.Background())
	}
	for i, step := range []struct {
		ok     bool
		status collectors.Status
		msg    string
	}{
		{false, collectors.StatusHealthy, "not yet unhealthy: 1 of 3 consecutive /healthz failures"},
		{false, collectors.StatusHealthy, "2 of 3"},
		{true, collectors.StatusHealthy, ""},
		{false, collectors.StatusHealthy, "1 of 3"},
		{false, collectors.StatusHealthy, "2 of 3"},
		{false, collectors.StatusUnhealthy, "returned 500"},
		{false, collectors.StatusUnhealthy, "returned 500"},
		{true, collectors.StatusHealthy, ""},
	} {
		res := probe(step.ok)
		if res.Status != step.status || !strings.Contains(res.Message, step.msg) {
			t.Fatalf("probe %d: got %s %q, want %s containing %q", i, res.Status, res.Message, step.status, step.msg)
		}
	}
	units.set(unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "activating", SubState: "auto-restart", Result: "exit-code"}, nil)
	if res := probe(false); res.Status != collectors.StatusUnhealthy {
		t.Errorf("unit down and healthz failing: %s %q, want Unhealthy at once", res.Status, res.Message)
	}
}

// TestRestartsWithoutNRestarts: systemd 219 has no NRestarts; restarts are counted from
// MainPID and ExecMainStartTimestamp changes instead of reading as 0.
func TestRestartsWithoutNRestarts(t *testing.T) {
	clock := newFakeClock()
	units := &fakeUnits{}
	c := newTestCollector(t, Config{Now: clock.Now, HTTPClient: healthzClient(200, "ok", nil)}, units)
	run := func(pid uint32, start uint64) collectors.Result {
		clock.Step(time.Minute)
		units.set(unitState{LoadState: "loaded", ActiveState: "active", SubState: "running", Result: "success", MainPID: pid, MainStart: start}, nil)
		return c.Check(context.Background())
	}
	run(100, 1)
	if res := run(100, 1); !strings.Contains(res.Message, "+0 restarts") {
		t.Fatalf("no change counted as a restart: %q", res.Message)
	}
	if res := run(230, 2); !strings.Contains(res.Message, "+1 restarts") || res.Disrupted.IsZero() {
		t.Fatalf("new MainPID not counted: %q disrupted %v", res.Message, res.Disrupted)
	}
	run(231, 3)
	res := run(232, 4)
	if res.Reason != ReasonKubeletRestartLoop || !strings.Contains(res.Message, "NRestarts=n/a") {
		t.Fatalf("three restarts from MainPID changes: %s %q, want %s", res.Reason, res.Message, ReasonKubeletRestartLoop)
	}
}

// TestStopJobSeenLive: an operator stops a crash-looping kubelet while systemd waits to
// restart it. The run was ended by the crash (its process exited first), so the timestamps
// alone say "exited on its own"; the stop job the collector saw says "stopped on purpose",
// and that wins until the unit is seen active again. A later exit of its own is then not
// mistaken for an operator stop.
func TestStopJobSeenLive(t *testing.T) {
	clock := newFakeClock()
	units := &fakeUnits{}
	c := newTestCollector(t, Config{Now: clock.Now, HTTPClient: healthzClient(0, "", errConnRefused)}, units)
	steps := []struct {
		name   string
		unit   unitState
		reason string
	}{
		{"crashed, waiting to restart", unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "activating", SubState: "auto-restart",
			Result: "exit-code", MainStart: 100, MainExit: 200, ActiveExit: 201, MainCode: 1, MainStatus: 1}, ReasonKubeletHealthzFailed},
		{"operator's stop job queued", unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "deactivating", SubState: "stop",
			Result: "exit-code", MainStart: 100, MainExit: 200, ActiveExit: 201, JobID: 9, JobType: "stop"}, ReasonKubeletStoppedByOperator},
		{"stopped", unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "inactive", SubState: "dead",
			Result: "exit-code", MainStart: 100, MainExit: 200, ActiveExit: 201, MainCode: 1, MainStatus: 1}, ReasonKubeletStoppedByOperator},
		{"operator's start job queued", unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "inactive", SubState: "dead",
			Result: "exit-code", MainStart: 100, MainExit: 200, ActiveExit: 201, JobID: 10, JobType: "start"}, ReasonKubeletUnitInactive},
		{"started again by the operator", unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "active", SubState: "running",
			Result: "success", MainStart: 300, ActiveExit: 201}, ReasonKubeletHealthzFailed},
		{"exited on its own", unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "inactive", SubState: "dead",
			Result: "success", MainStart: 300, MainExit: 400, ActiveExit: 401, MainCode: 1}, ReasonKubeletUnitInactive},
	}
	for _, s := range steps {
		clock.Step(10 * time.Second)
		units.set(s.unit, nil)
		res := c.Check(context.Background())
		if res.Reason != s.reason {
			t.Fatalf("%s: %s %q, want %s", s.name, res.Reason, res.Message, s.reason)
		}
		if s.reason == ReasonKubeletStoppedByOperator && !strings.Contains(res.Message, "a stop job for kubelet.service was seen at") {
			t.Errorf("%s: message %q does not say how the stop was seen", s.name, res.Message)
		}
	}
}

// TestSeed: a restarted agent resumes the kubelet verdicts that have memory.
func TestSeed(t *testing.T) {
	clock := newFakeClock()
	units := &fakeUnits{}
	units.set(activeUnit, nil)
	c := newTestCollector(t, Config{Now: clock.Now, HealthzFailureThreshold: 3, HTTPClient: healthzClient(500, "", nil)}, units)
	c.Seed(collectors.Prior{Status: collectors.StatusUnhealthy, Reason: ReasonKubeletHealthzFailed, Since: clock.Now().Add(-time.Minute)})
	if res := c.Check(context.Background()); res.Reason != ReasonKubeletHealthzFailed {
		t.Errorf("seeded healthz failure: %s %q, want it kept without a new debounce", res.Reason, res.Message)
	}

	c2 := newTestCollector(t, Config{Now: clock.Now, HTTPClient: healthzClient(200, "ok", nil)}, units)
	c2.Seed(collectors.Prior{Status: collectors.StatusUnhealthy, Reason: ReasonKubeletOOMKilled, Since: clock.Now().Add(-4 * time.Minute)})
	if res := c2.Check(context.Background()); res.Reason != ReasonKubeletOOMKilled || !strings.Contains(res.Message, "OOM-killed 4m0s ago") {
		t.Errorf("seeded OOM kill: %s %q", res.Reason, res.Message)
	}
	c3 := newTestCollector(t, Config{Now: clock.Now, HTTPClient: healthzClient(200, "ok", nil)}, units)
	c3.Seed(collectors.Prior{Status: collectors.StatusHealthy, Reason: ReasonKubeletHealthy})
	if res := c3.Check(context.Background()); res.Reason != ReasonKubeletHealthy {
		t.Errorf("healthy prior: %s %q", res.Reason, res.Message)
	}
}
