package kubelet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nodevigil/nodevigil/collectors"
)

// Reasons of a RepairAttempt.
const (
	// RepairRestarted: the unit was restarted and the job finished with "done".
	RepairRestarted = "Restarted"
	// RepairBackoffActive: a restart is needed but the previous one was too recent.
	RepairBackoffActive = "BackoffActive"
	// RepairHourlyCapReached: MaxPerHour restarts were already attempted in the last hour.
	RepairHourlyCapReached = "HourlyCapReached"
	// RepairNotNeeded: the result or the live unit state does not call for a restart.
	RepairNotNeeded = "NotNeeded"
	// RepairRestartFailed: the restart could not be issued or its job did not finish "done".
	RepairRestartFailed = "RestartFailed"
	// RepairOperatorStopped: a stop job ended the unit's run (systemctl stop), i.e. it was
	// stopped on purpose; it is reported, never restarted.
	RepairOperatorStopped = "OperatorStopped"
)

// Defaults of RepairConfig.
const (
	DefaultRepairInitialBackoff = 30 * time.Second
	DefaultRepairMaxBackoff     = 10 * time.Minute
	DefaultRepairMaxPerHour     = 3
)

const (
	// repairConnectTimeout bounds dialling the bus when the caller's ctx has no deadline.
	repairConnectTimeout = 5 * time.Second
	// repairJobTimeout bounds waiting for the restart job; systemd's default start timeout
	// is 90s.
	repairJobTimeout = 2 * time.Minute
)

// RepairConfig configures the local repair of the kubelet unit.
type RepairConfig struct {
	// HostRoot locates the default bus socket ("/" by default).
	HostRoot string
	// Unit is the systemd service running the kubelet (default kubelet.service).
	Unit string
	// DBusAddress is the system bus address (default
	// unix:path=<HostRoot>/run/dbus/system_bus_socket).
	DBusAddress string
	// InitialBackoff is the wait after the first restart before another (default 30s); it
	// doubles with every consecutive restart up to MaxBackoff.
	InitialBackoff time.Duration
	// MaxBackoff caps the wait between restarts (default 10m).
	MaxBackoff time.Duration
	// MaxPerHour caps restarts in any rolling hour (default 3): a kubelet that dies again
	// right after every restart needs a human or a new node, not a restart storm.
	MaxPerHour int
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Logger receives one line per restart (default slog.Default()).
	Logger *slog.Logger
}

// RepairAttempt says what Repair did, for the agent's Event and metric.
type RepairAttempt struct {
	// Attempted is true when a restart was issued to systemd.
	Attempted bool
	// Reason is RepairRestarted, RepairBackoffActive, RepairHourlyCapReached,
	// RepairNotNeeded or RepairRestartFailed.
	Reason string
	// Attempt is the number of consecutive restarts in the current backoff sequence,
	// including this one when Attempted.
	Attempt int
	// NextAllowed is the earliest time another restart may be issued (zero when no restart
	// is pending).
	NextAllowed time.Time
}

// unitRestarter is the repairer's view of systemd; the D-Bus implementation is systemdUnit.
type unitRestarter interface {
	readUnit(ctx context.Context) (unitState, error)
	restartUnit(ctx context.Context, resetFailed bool) (string, error)
	close() error
}

// Repairer restarts a dead kubelet unit, the first step of the two-signal model ("machine
// alive, kubelet dead: local repair first"), with exponential backoff and an hourly cap so
// it can never turn into a restart storm. It acts only on a kubelet Result that says the
// unit is down, and confirms the live unit state before restarting, so a unit that systemd
// is already restarting is left alone. It is safe for concurrent use.
type Repairer struct {
	cfg   RepairConfig
	units unitRestarter

	mu          sync.Mutex
	attempts    []time.Time // restarts issued within the last hour, oldest first
	consecutive int         // restarts in the current backoff sequence
	lastAttempt time.Time
}

// NewRepairer validates cfg and fills defaults. It does not connect; the bus is dialled on
// the first restart that is needed.
func NewRepairer(cfg RepairConfig) (*Repairer, error) {
	if cfg.HostRoot == "" {
		cfg.HostRoot = "/"
	}
	if cfg.Unit == "" {
		cfg.Unit = DefaultUnit
	}
	if !strings.HasSuffix(cfg.Unit, ".service") {
		return nil, fmt.Errorf("kubelet: RepairConfig.Unit %q must name a service unit, e.g. %s", cfg.Unit, DefaultUnit)
	}
	if cfg.DBusAddress == "" {
		cfg.DBusAddress = defaultBusAddress(cfg.HostRoot)
	}
	if cfg.InitialBackoff < 0 || cfg.MaxBackoff < 0 || cfg.MaxPerHour < 0 {
		return nil, errors.New("kubelet: RepairConfig.InitialBackoff, MaxBackoff and MaxPerHour must not be negative; leave them zero for the defaults")
	}
	if cfg.InitialBackoff == 0 {
		cfg.InitialBackoff = DefaultRepairInitialBackoff
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = DefaultRepairMaxBackoff
	}
	if cfg.MaxBackoff < cfg.InitialBackoff {
		return nil, fmt.Errorf("kubelet: RepairConfig.MaxBackoff (%s) must be at least InitialBackoff (%s)", cfg.MaxBackoff, cfg.InitialBackoff)
	}
	if cfg.MaxPerHour == 0 {
		cfg.MaxPerHour = DefaultRepairMaxPerHour
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Repairer{
		cfg: cfg,
		units: &systemdUnit{
			bus:  newSystemdBus(cfg.DBusAddress, string(checkName), cfg.Now, cfg.Logger),
			unit: cfg.Unit,
		},
	}, nil
}

// Close releases the bus connection.
func (r *Repairer) Close() error { return r.units.close() }

// needsRestart reports whether a kubelet Result says the unit is down and may be restarted
// (KubeletStoppedByOperator is down on purpose and is not).
func needsRestart(res collectors.Result) bool {
	switch res.Reason {
	case ReasonKubeletUnitFailed, ReasonKubeletUnitInactive, ReasonKubeletOOMKilled:
		return res.Status == collectors.StatusUnhealthy
	}
	return false
}

// backoffFor returns the wait after the n-th consecutive restart (n >= 1).
func (r *Repairer) backoffFor(n int) time.Duration {
	d := r.cfg.InitialBackoff
	for i := 1; i < n && d < r.cfg.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, r.cfg.MaxBackoff)
}

// Repair looks at the latest kubelet result and restarts the unit when it is failed/inactive
// and policy allows. Policy, in order: a healthy result seen after the backoff has elapsed
// ends the backoff sequence; only KubeletUnitFailed, KubeletUnitInactive and KubeletOOMKilled
// call for a restart; at most MaxPerHour restarts in any rolling hour; at least
// InitialBackoff·2^(n-1) (capped at MaxBackoff) after the n-th consecutive restart; and the
// live unit state must still be failed or inactive (systemd may be restarting it already).
// A failed unit is reset-failed first so a unit that hit its start limit can start again.
// The error is non-nil only with RepairRestartFailed.
func (r *Repairer) Repair(ctx context.Context, res collectors.Result) (RepairAttempt, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.cfg.Now()
	nextAllowed := time.Time{}
	if r.consecutive > 0 {
		nextAllowed = r.lastAttempt.Add(r.backoffFor(r.consecutive))
	}

	if !needsRestart(res) {
		if res.Status == collectors.StatusHealthy && r.consecutive > 0 && !now.Before(nextAllowed) {
			r.consecutive = 0
			nextAllowed = time.Time{}
		}
		return RepairAttempt{Reason: RepairNotNeeded, Attempt: r.consecutive, NextAllowed: nextAllowed}, nil
	}

	cutoff := now.Add(-time.Hour)
	keep := 0
	for keep < len(r.attempts) && !r.attempts[keep].After(cutoff) {
		keep++
	}
	r.attempts = append(r.attempts[:0], r.attempts[keep:]...)
	if len(r.attempts) >= r.cfg.MaxPerHour {
		capEnd := r.attempts[len(r.attempts)-r.cfg.MaxPerHour].Add(time.Hour)
		if capEnd.Before(nextAllowed) {
			capEnd = nextAllowed
		}
		return RepairAttempt{Reason: RepairHourlyCapReached, Attempt: r.consecutive, NextAllowed: capEnd}, nil
	}
	if now.Before(nextAllowed) {
		return RepairAttempt{Reason: RepairBackoffActive, Attempt: r.consecutive, NextAllowed: nextAllowed}, nil
	}

	readCtx, cancel := context.WithTimeout(ctx, repairConnectTimeout)
	st, err := r.units.readUnit(readCtx)
	cancel()
	if err != nil {
		return RepairAttempt{Reason: RepairRestartFailed, Attempt: r.consecutive, NextAllowed: nextAllowed},
			fmt.Errorf("kubelet repair: read unit %s state: %w", r.cfg.Unit, err)
	}
	if st.JobType == "stop" || ((st.ActiveState == "inactive" || st.ActiveState == "failed") && stoppedByJob(st)) {
		// Stopped on purpose (systemctl stop), seen in the live state: restarting it would
		// undo the operator's decision.
		return RepairAttempt{Reason: RepairOperatorStopped, Attempt: r.consecutive, NextAllowed: nextAllowed}, nil
	}
	if st.LoadState == "not-found" || st.JobID != 0 || (st.ActiveState != "failed" && st.ActiveState != "inactive") {
		// Running, unknown, or systemd already has a job queued for it (a start or restart).
		return RepairAttempt{Reason: RepairNotNeeded, Attempt: r.consecutive, NextAllowed: nextAllowed}, nil
	}

	// Record before acting: a restart that fails or hangs still counts towards backoff and cap.
	r.consecutive++
	r.lastAttempt = now
	r.attempts = append(r.attempts, now)
	att := RepairAttempt{Attempted: true, Attempt: r.consecutive, NextAllowed: now.Add(r.backoffFor(r.consecutive))}
	r.cfg.Logger.Info("restarting kubelet unit", "check", checkName, "reason", res.Reason, "attempt", att.Attempt)

	jobCtx, cancel := context.WithTimeout(ctx, repairJobTimeout)
	defer cancel()
	result, err := r.units.restartUnit(jobCtx, st.ActiveState == "failed")
	switch {
	case err != nil:
		att.Reason = RepairRestartFailed
		r.cfg.Logger.Warn("kubelet unit restart failed", "check", checkName, "attempt", att.Attempt, "err", err)
		return att, fmt.Errorf("kubelet repair: %w", err)
	case result != "done":
		att.Reason = RepairRestartFailed
		err := fmt.Errorf("kubelet repair: restart job of %s finished with result %q", r.cfg.Unit, result)
		r.cfg.Logger.Warn("kubelet unit restart failed", "check", checkName, "attempt", att.Attempt, "err", err)
		return att, err
	}
	att.Reason = RepairRestarted
	return att, nil
}
