package kubelet

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nodevigil/nodevigil/collectors"
)

var (
	failedResult   = collectors.Result{Check: "kubelet", Status: collectors.StatusUnhealthy, Reason: ReasonKubeletUnitFailed}
	inactiveResult = collectors.Result{Check: "kubelet", Status: collectors.StatusUnhealthy, Reason: ReasonKubeletUnitInactive}
	oomResult      = collectors.Result{Check: "kubelet", Status: collectors.StatusUnhealthy, Reason: ReasonKubeletOOMKilled}
	healthyResult  = collectors.Result{Check: "kubelet", Status: collectors.StatusHealthy, Reason: ReasonKubeletHealthy}
	healthzResult  = collectors.Result{Check: "kubelet", Status: collectors.StatusUnhealthy, Reason: ReasonKubeletHealthzFailed}
	loopResult     = collectors.Result{Check: "kubelet", Status: collectors.StatusUnhealthy, Reason: ReasonKubeletRestartLoop}
	failedUnit     = unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "failed", SubState: "failed", Result: "exit-code"}
	inactiveUnit   = unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "inactive", SubState: "dead", Result: "exit-code"}
)

func newTestRepairer(t *testing.T, cfg RepairConfig, units unitRestarter) *Repairer {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = discardLogger()
	}
	r, err := NewRepairer(cfg)
	if err != nil {
		t.Fatalf("NewRepairer: %v", err)
	}
	t.Cleanup(func() { _ = r.Close() })
	if units != nil {
		_ = r.units.close()
		r.units = units
	}
	return r
}

func TestRepairPolicy(t *testing.T) {
	type step struct {
		advance   time.Duration
		res       collectors.Result
		unit      unitState
		unitErr   error
		jobResult string
		want      RepairAttempt
		nextIn    time.Duration // want NextAllowed = now + nextIn (when non-zero)
		restarts  int           // cumulative restarts issued
		wantErr   bool
	}
	tests := []struct {
		name  string
		cfg   RepairConfig
		steps []step
	}{
		{
			name: "backoff doubles and the hourly cap holds",
			cfg:  RepairConfig{InitialBackoff: 30 * time.Second, MaxBackoff: 10 * time.Minute, MaxPerHour: 3},
			steps: []step{
				{res: healthyResult, unit: failedUnit, want: RepairAttempt{Reason: RepairNotNeeded}},
				{res: healthzResult, unit: failedUnit, want: RepairAttempt{Reason: RepairNotNeeded}},
				{res: loopResult, unit: failedUnit, want: RepairAttempt{Reason: RepairNotNeeded}},
				{res: failedResult, unit: failedUnit, want: RepairAttempt{Attempted: true, Reason: RepairRestarted, Attempt: 1}, nextIn: 30 * time.Second, restarts: 1},
				{advance: 10 * time.Second, res: failedResult, unit: failedUnit, want: RepairAttempt{Reason: RepairBackoffActive, Attempt: 1}, nextIn: 20 * time.Second, restarts: 1},
				{advance: 20 * time.Second, res: inactiveResult, unit: inactiveUnit, want: RepairAttempt{Attempted: true, Reason: RepairRestarted, Attempt: 2}, nextIn: time.Minute, restarts: 2},
				{advance: 59 * time.Second, res: oomResult, unit: failedUnit, want: RepairAttempt{Reason: RepairBackoffActive, Attempt: 2}, nextIn: time.Second, restarts: 2},
				{advance: time.Second, res: oomResult, unit: failedUnit, want: RepairAttempt{Attempted: true, Reason: RepairRestarted, Attempt: 3}, nextIn: 2 * time.Minute, restarts: 3},
				// Backoff elapsed, but three restarts in the last hour: capped until the first
				// one (at t=0) is an hour old.
				{advance: 2 * time.Minute, res: failedResult, unit: failedUnit, want: RepairAttempt{Reason: RepairHourlyCapReached, Attempt: 3}, nextIn: time.Hour - 3*time.Minute - 30*time.Second, restarts: 3},
				{advance: time.Hour - 3*time.Minute - 30*time.Second, res: failedResult, unit: failedUnit, want: RepairAttempt{Attempted: true, Reason: RepairRestarted, Attempt: 4}, nextIn: 4 * time.Minute, restarts: 4},
			},
		},
		{
			name: "backoff is capped at MaxBackoff",
			cfg:  RepairConfig{InitialBackoff: 30 * time.Second, MaxBackoff: 45 * time.Second, MaxPerHour: 10},
			steps: []step{
				{res: failedResult, unit: failedUnit, want: RepairAttempt{Attempted: true, Reason: RepairRestarted, Attempt: 1}, nextIn: 30 * time.Second, restarts: 1},
				{advance: 30 * time.Second, res: failedResult, unit: failedUnit, want: RepairAttempt{Attempted: true, Reason: RepairRestarted, Attempt: 2}, nextIn: 45 * time.Second, restarts: 2},
				{advance: 45 * time.Second, res: failedResult, unit: failedUnit, want: RepairAttempt{Attempted: true, Reason: RepairRestarted, Attempt: 3}, nextIn: 45 * time.Second, restarts: 3},
			},
		},
		{
			name: "live state decides: systemd already restarting it",
			cfg:  RepairConfig{},
			steps: []step{
				{res: failedResult, unit: unitState{LoadState: "loaded", HasNRestarts: true, ActiveState: "activating", SubState: "auto-restart"}, want: RepairAttempt{Reason: RepairNotNeeded}},
				{res: oomResult, unit: activeUnit, want: RepairAttempt{Reason: RepairNotNeeded}},
			},
		},
		{
			name: "failures count towards backoff; healthy after backoff resets it",
			cfg:  RepairConfig{InitialBackoff: time.Minute, MaxBackoff: 10 * time.Minute, MaxPerHour: 10},
			steps: []step{
				{res: failedResult, unit: failedUnit, jobResult: "failed", want: RepairAttempt{Attempted: true, Reason: RepairRestartFailed, Attempt: 1}, nextIn: time.Minute, restarts: 1, wantErr: true},
				{advance: time.Minute, res: failedResult, unit: failedUnit, want: RepairAttempt{Attempted: true, Reason: RepairRestarted, Attempt: 2}, nextIn: 2 * time.Minute, restarts: 2},
				// Healthy before the backoff elapsed: the sequence continues.
				{advance: time.Minute, res: healthyResult, unit: activeUnit, want: RepairAttempt{Reason: RepairNotNeeded, Attempt: 2}, nextIn: time.Minute, restarts: 2},
				// Healthy after it: the sequence ends.
				{advance: time.Minute, res: healthyResult, unit: activeUnit, want: RepairAttempt{Reason: RepairNotNeeded}, restarts: 2},
				{advance: time.Second, res: failedResult, unit: failedUnit, want: RepairAttempt{Attempted: true, Reason: RepairRestarted, Attempt: 1}, nextIn: time.Minute, restarts: 3},
			},
		},
		{
			name: "unreadable unit state is a failure without an attempt",
			cfg:  RepairConfig{},
			steps: []step{
				{res: failedResult, unitErr: errNoBus, want: RepairAttempt{Reason: RepairRestartFailed}, wantErr: true},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newFakeClock()
			units := &fakeUnits{}
			cfg := tt.cfg
			cfg.Now = clock.Now
			r := newTestRepairer(t, cfg, units)
			for i, s := range tt.steps {
				clock.Step(s.advance)
				units.set(s.unit, s.unitErr)
				units.mu.Lock()
				units.jobResult = s.jobResult
				units.mu.Unlock()

				got, err := r.Repair(context.Background(), s.res)
				if (err != nil) != s.wantErr {
					t.Fatalf("step %d: err = %v, wantErr %v", i, err, s.wantErr)
				}
				want := s.want
				if s.nextIn != 0 {
					want.NextAllowed = clock.Now().Add(s.nextIn)
				}
				if got != want {
					t.Fatalf("step %d: got %+v, want %+v", i, got, want)
				}
				if n, _ := units.counts(); n != s.restarts {
					t.Fatalf("step %d: %d restarts issued, want %d", i, n, s.restarts)
				}
			}
		})
	}
}

func TestRepairResetsFailedBeforeRestart(t *testing.T) {
	units := &fakeUnits{}
	r := newTestRepairer(t, RepairConfig{}, units)
	units.set(failedUnit, nil)
	if _, err := r.Repair(context.Background(), failedResult); err != nil {
		t.Fatal(err)
	}
	clock := newFakeClock()
	r2 := newTestRepairer(t, RepairConfig{Now: clock.Now}, units)
	units.set(inactiveUnit, nil)
	if _, err := r2.Repair(context.Background(), inactiveResult); err != nil {
		t.Fatal(err)
	}
	if restarts, resets := units.counts(); restarts != 2 || resets != 1 {
		t.Fatalf("restarts=%d resets=%d, want 2 restarts and 1 reset-failed (only for the failed unit)", restarts, resets)
	}
}

func TestRepairRestartError(t *testing.T) {
	units := &fakeUnits{jobErr: errors.New("org.freedesktop.systemd1.NoSuchUnit")}
	r := newTestRepairer(t, RepairConfig{}, units)
	units.set(failedUnit, nil)
	got, err := r.Repair(context.Background(), failedResult)
	if err == nil || !strings.Contains(err.Error(), "NoSuchUnit") || got.Reason != RepairRestartFailed || !got.Attempted {
		t.Fatalf("got %+v, %v; want an attempted RestartFailed with the error", got, err)
	}
}

func TestNewRepairerConfig(t *testing.T) {
	tests := []struct {
		cfg     RepairConfig
		wantErr string
	}{
		{cfg: RepairConfig{Unit: "kubelet.socket"}, wantErr: "RepairConfig.Unit"},
		{cfg: RepairConfig{MaxPerHour: -1}, wantErr: "must not be negative"},
		{cfg: RepairConfig{InitialBackoff: time.Hour, MaxBackoff: time.Minute}, wantErr: "MaxBackoff"},
	}
	for _, tt := range tests {
		if _, err := NewRepairer(tt.cfg); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("NewRepairer(%+v) err = %v, want containing %q", tt.cfg, err, tt.wantErr)
		}
	}
	r, err := NewRepairer(RepairConfig{HostRoot: "/host"})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.cfg.InitialBackoff != 30*time.Second || r.cfg.MaxBackoff != 10*time.Minute || r.cfg.MaxPerHour != 3 ||
		r.cfg.Unit != "kubelet.service" || r.cfg.DBusAddress != "unix:path=/host/run/dbus/system_bus_socket" {
		t.Errorf("defaults not applied: %+v", r.cfg)
	}
}

// TestRepairLeavesOperatorStopAlone: a unit a stop job ended (systemctl stop: out of the
// active state before its process exited) or that is being stopped is never restarted,
// whatever the result handed in says.
func TestRepairLeavesOperatorStopAlone(t *testing.T) {
	for _, st := range []unitState{
		stoppedUnit,
		{LoadState: "loaded", ActiveState: "inactive", SubState: "dead", Result: "exit-code", JobID: 3, JobType: "stop"},
	} {
		units := &fakeUnits{}
		units.set(st, nil)
		r := newTestRepairer(t, RepairConfig{}, units)
		for _, res := range []collectors.Result{inactiveResult, {Check: "kubelet", Status: collectors.StatusUnhealthy, Reason: ReasonKubeletStoppedByOperator}} {
			got, err := r.Repair(context.Background(), res)
			if err != nil || got.Attempted || (got.Reason != RepairOperatorStopped && got.Reason != RepairNotNeeded) {
				t.Fatalf("Repair(%s) of %+v = %+v, %v; want no restart", res.Reason, st, got, err)
			}
		}
		if restarts, _ := units.counts(); restarts != 0 {
			t.Fatalf("%d restarts of an operator-stopped unit %+v", restarts, st)
		}
	}
}

// TestRepairRestartsWhatNoOneStopped: an inactive unit with a clean result that no stop job
// ended (its process exited on its own, or it never started since boot) is restarted; one
// with a job already queued (systemd is starting it) is left to systemd.
func TestRepairRestartsWhatNoOneStopped(t *testing.T) {
	for _, tc := range []struct {
		name string
		st   unitState
		want string
	}{
		{"exited on its own", exitedUnit, RepairRestarted},
		{"never started", unitState{LoadState: "loaded", ActiveState: "inactive", SubState: "dead", Result: "success"}, RepairRestarted},
		{"start job queued", unitState{LoadState: "loaded", ActiveState: "inactive", SubState: "dead", Result: "success", JobID: 4, JobType: "start"}, RepairNotNeeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			units := &fakeUnits{}
			units.set(tc.st, nil)
			r := newTestRepairer(t, RepairConfig{}, units)
			got, err := r.Repair(context.Background(), inactiveResult)
			if err != nil || got.Reason != tc.want {
				t.Fatalf("Repair = %+v, %v; want %s", got, err, tc.want)
			}
		})
	}
}
