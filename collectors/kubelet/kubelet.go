// Package kubelet checks the health of the node's kubelet from the node itself, with two
// independent observations: systemd's view of the kubelet unit over D-Bus (state, automatic
// restarts, the result of the last run, so an OOM kill or a crash loop is named as such) and
// the kubelet's own /healthz endpoint on loopback. Either alone can be missing (no bus socket
// mounted into the agent, a kubelet not run by systemd); the check then says which one it
// used. It also validates the kubelet's startup taints against those the agent owns
// (ConfigCheck) and can restart a dead kubelet unit with backoff (Repairer).
package kubelet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nodevigil/nodevigil/collectors"
)

// Reasons of the "kubelet" check. They become Node condition reasons; keep them stable.
const (
	// ReasonKubeletHealthy: the unit is running (or systemd is not observable) and /healthz
	// answered 200.
	ReasonKubeletHealthy = "KubeletHealthy"
	// ReasonKubeletUnitFailed: systemd reports the unit failed and is not restarting it.
	ReasonKubeletUnitFailed = "KubeletUnitFailed"
	// ReasonKubeletUnitInactive: the unit is stopped or stopping.
	ReasonKubeletUnitInactive = "KubeletUnitInactive"
	// ReasonKubeletOOMKilled: the kernel OOM killer killed the kubelet, now or within the
	// last RestartLoopWindow.
	ReasonKubeletOOMKilled = "KubeletOOMKilled"
	// ReasonKubeletRestartLoop: systemd restarted the unit RestartLoopThreshold times or
	// more within RestartLoopWindow.
	ReasonKubeletRestartLoop = "KubeletRestartLoop"
	// ReasonKubeletHealthzFailed: /healthz did not answer 200 in time.
	ReasonKubeletHealthzFailed = "KubeletHealthzFailed"
	// ReasonKubeletUnobservable: neither systemd nor /healthz could be reached (Unknown).
	ReasonKubeletUnobservable = "KubeletUnobservable"
	// ReasonKubeletNotRunning: systemd cannot be asked, /healthz refuses connections and the
	// host's process table (<HostRoot>/proc with the host's PIDs) has no kubelet: it is not
	// running, e.g. it exits at once on a malformed flag.
	ReasonKubeletNotRunning = "KubeletNotRunning"
	// ReasonKubeletStoppedByOperator: the unit is inactive (or being stopped) and a stop job
	// ended its run: seen live (JobNew / the unit's Job is a stop job), or, when the agent
	// was not watching, from systemd's timestamps (stoppedByJob). Unhealthy, but never
	// restarted by the repairer. A kubelet that exited on its own with a clean result, or
	// that was never started since boot, is KubeletUnitInactive instead.
	ReasonKubeletStoppedByOperator = "KubeletStoppedByOperator"
)

// Defaults of Config.
const (
	DefaultUnit                 = "kubelet.service"
	DefaultHealthzURL           = "http://127.0.0.1:10248/healthz"
	DefaultTimeout              = 2 * time.Second
	DefaultRestartLoopThreshold = 3
	DefaultRestartLoopWindow    = 10 * time.Minute
	// DefaultHealthzFailureThreshold is how many consecutive /healthz failures, while systemd
	// shows the unit running (or cannot be asked), make the check Unhealthy.
	DefaultHealthzFailureThreshold = 3
)

const (
	checkName = collectors.CheckKubelet
	// maxHistory bounds the restart history whatever the check interval.
	maxHistory = 256
	// maxBodyBytes is how much of a /healthz body is read and quoted in messages.
	maxBodyBytes = 256
	// resultGrace is how long Check waits past its deadline for an observation that failed
	// to honour the context before declaring it timed out.
	resultGrace = 250 * time.Millisecond
)

// Config configures the kubelet check. The zero value checks kubelet.service on the local
// host.
type Config struct {
	// HostRoot is where the host's root filesystem is mounted in the agent ("/" by default);
	// it locates the default bus socket.
	HostRoot string
	// Unit is the systemd service running the kubelet (default kubelet.service).
	Unit string
	// DBusAddress is the system bus address (default
	// unix:path=<HostRoot>/run/dbus/system_bus_socket).
	DBusAddress string
	// HealthzURL is the kubelet's healthz endpoint (default http://127.0.0.1:10248/healthz).
	HealthzURL string
	// Timeout bounds one whole Check, D-Bus and HTTP together (default 2s).
	Timeout time.Duration
	// RestartLoopThreshold is how many automatic restarts within RestartLoopWindow make a
	// restart loop (default 3).
	RestartLoopThreshold int
	// RestartLoopWindow is the window for restart loops and for how long an OOM kill is
	// remembered (default 10m).
	RestartLoopWindow time.Duration
	// HealthzFailureThreshold is how many consecutive /healthz failures make the kubelet
	// Unhealthy while systemd shows the unit running or cannot be asked (default 3; 1 for a
	// one-shot check). A unit that systemd shows down needs no debouncing.
	HealthzFailureThreshold int
	// HTTPClient is used for /healthz (default: a client without proxy that keeps one idle
	// loopback connection).
	HTTPClient *http.Client
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Logger receives reachability changes of the bus (default slog.Default()).
	Logger *slog.Logger
}

// unitReader is the collector's view of systemd; the D-Bus implementation is systemdUnit.
type unitReader interface {
	readUnit(ctx context.Context) (unitState, error)
}

// Collector is the "kubelet" check. It keeps a short history of the unit's restart counter
// to tell a restart loop from a single restart, so one Collector should live for the
// lifetime of the agent. It is safe for concurrent use.
type Collector struct {
	cfg        Config
	healthzURL string
	client     *http.Client
	units      unitReader
	closeUnits func() error

	mu      sync.Mutex
	history []restartObs
	lastOOM time.Time
	// prev is the previous observation of the unit (from a check or a D-Bus signal), to count
	// restarts where NRestarts is missing; restarts is the resulting restart count.
	prev     unitState
	havePrev bool
	restarts uint64
	// disrupted is the latest time the unit was seen down or restarting, by any observation.
	disrupted time.Time
	// stopJobAt is when a stop job for the unit was last seen (D-Bus JobNew or the unit's Job
	// property); zero once the unit is seen active again with no job queued.
	stopJobAt time.Time
	// hzFailures counts consecutive failed /healthz probes.
	hzFailures int
	// lookupProcess finds the kubelet process (lookupKubelet over <HostRoot>/proc).
	lookupProcess func() processState
}

// New validates cfg, fills defaults and returns a collector. It does not connect to
// anything; the bus is dialled on the first Check.
func New(cfg Config) (*Collector, error) {
	if cfg.HostRoot == "" {
		cfg.HostRoot = "/"
	}
	if cfg.Unit == "" {
		cfg.Unit = DefaultUnit
	}
	if !strings.HasSuffix(cfg.Unit, ".service") {
		return nil, fmt.Errorf("kubelet: Config.Unit %q must name a service unit, e.g. %s", cfg.Unit, DefaultUnit)
	}
	if cfg.DBusAddress == "" {
		cfg.DBusAddress = defaultBusAddress(cfg.HostRoot)
	}
	if cfg.HealthzURL == "" {
		cfg.HealthzURL = DefaultHealthzURL
	}
	u, err := url.Parse(cfg.HealthzURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("kubelet: Config.HealthzURL %q must be an absolute http(s) URL such as %s", cfg.HealthzURL, DefaultHealthzURL)
	}
	if cfg.Timeout < 0 || cfg.RestartLoopWindow < 0 || cfg.RestartLoopThreshold < 0 {
		return nil, errors.New("kubelet: Config.Timeout, RestartLoopWindow and RestartLoopThreshold must not be negative; leave them zero for the defaults")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.RestartLoopThreshold == 0 {
		cfg.RestartLoopThreshold = DefaultRestartLoopThreshold
	}
	if cfg.RestartLoopWindow == 0 {
		cfg.RestartLoopWindow = DefaultRestartLoopWindow
	}
	if cfg.HealthzFailureThreshold < 0 {
		return nil, errors.New("kubelet: Config.HealthzFailureThreshold must not be negative; leave it zero for the default")
	}
	if cfg.HealthzFailureThreshold == 0 {
		cfg.HealthzFailureThreshold = DefaultHealthzFailureThreshold
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	client := cfg.HTTPClient
	if client == nil {
		client = defaultHTTPClient()
	}
	unit := &systemdUnit{
		bus:  newSystemdBus(cfg.DBusAddress, string(checkName), cfg.Now, cfg.Logger),
		unit: cfg.Unit,
	}
	procDir := filepath.Join(cfg.HostRoot, "proc")
	c := &Collector{
		cfg:           cfg,
		healthzURL:    u.String(),
		client:        client,
		units:         unit,
		closeUnits:    unit.close,
		lookupProcess: func() processState { return lookupKubelet(procDir) },
	}
	// Between two checks systemd may restart the kubelet several times (RestartSec=5): every
	// change of the unit's properties, signalled over D-Bus, is folded into the history.
	unit.onChange = func(st unitState) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.noteUnit(c.cfg.Now(), st)
	}
	return c, nil
}

// Seed resumes from the kubelet condition a previous agent left on the Node: a kubelet
// reported OOM-killed stays reported for the rest of its window, a restart loop for the rest
// of its window, and a failing /healthz stays failed until it answers again, instead of the
// restarted agent first reporting healthy.
func (c *Collector) Seed(prior collectors.Prior) {
	if prior.Status != collectors.StatusUnhealthy {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	since := prior.Since
	if since.IsZero() {
		since = c.cfg.Now()
	}
	switch prior.Reason {
	case ReasonKubeletOOMKilled:
		c.lastOOM = since
	case ReasonKubeletHealthzFailed:
		c.hzFailures = c.cfg.HealthzFailureThreshold
	case ReasonKubeletRestartLoop:
		// Count the loop's restarts at its start, so it is reported until the window passes.
		c.recordRestarts(since, uint64(c.cfg.RestartLoopThreshold))
	}
	if since.After(c.disrupted) {
		c.disrupted = since
	}
}

// noteUnit folds one observation of the unit (from a check or a D-Bus signal) into the
// restart count, the OOM memory and the disruption time. Restarts are counted from NRestarts
// where systemd has it, otherwise (systemd 219, Amazon Linux 2) from changes of
// ExecMainStartTimestamp or MainPID. The caller holds c.mu.
func (c *Collector) noteUnit(now time.Time, st unitState) {
	if st.LoadState == "not-found" {
		return
	}
	restarted := false
	before := c.restarts
	if c.havePrev {
		p := c.prev
		switch {
		case st.HasNRestarts && p.HasNRestarts && st.NRestarts > p.NRestarts:
			c.restarts += uint64(st.NRestarts - p.NRestarts)
			restarted = true
		case st.HasNRestarts && p.HasNRestarts:
			// Counter unchanged or reset by a manual start: a start by hand is a restart for
			// the stability window, not for the loop count.
			restarted = st.NRestarts < p.NRestarts
		case st.MainStart != 0 && p.MainStart != 0 && st.MainStart != p.MainStart,
			st.MainPID != 0 && p.MainPID != 0 && st.MainPID != p.MainPID:
			c.restarts++
			restarted = true
		}
	}
	c.prev, c.havePrev = st, true
	switch {
	case st.JobType == "stop":
		if c.stopJobAt.IsZero() {
			c.stopJobAt = now
		}
	case st.JobType != "", unitActive(st) && st.JobID == 0:
		// Started again, or another job (start, restart) replaced the stop.
		c.stopJobAt = time.Time{}
	}
	if st.Result == "oom-kill" {
		c.lastOOM = now
	}
	if restarted || !unitActive(st) {
		c.disrupted = now
	}
	c.recordRestarts(now, c.restarts-before)
}

func unitActive(st unitState) bool {
	return st.ActiveState == "active" || st.ActiveState == "reloading" || st.ActiveState == "refreshing"
}

func defaultBusAddress(hostRoot string) string {
	return "unix:path=" + filepath.Join(hostRoot, "run/dbus/system_bus_socket")
}

// defaultHTTPClient talks to loopback only: no proxy from the environment, one idle
// connection kept so a probe every few seconds does not churn sockets.
func defaultHTTPClient() *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{KeepAlive: -1}).DialContext,
			MaxIdleConns:        1,
			MaxIdleConnsPerHost: 1,
			IdleConnTimeout:     time.Minute,
			DisableCompression:  true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Name returns "kubelet".
func (c *Collector) Name() collectors.CheckName { return checkName }

// Close releases the bus connection. The collector must not be used afterwards.
func (c *Collector) Close() error {
	if c.closeUnits == nil {
		return nil
	}
	return c.closeUnits()
}

// unitObservation is the outcome of asking systemd.
type unitObservation struct {
	state unitState
	err   error
}

// Check observes the unit and /healthz concurrently, both bounded by Config.Timeout, and
// returns the verdict. It never blocks much longer than the timeout, whatever the kubelet or
// the bus do.
func (c *Collector) Check(ctx context.Context) collectors.Result {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()

	unitCh := make(chan unitObservation, 1)
	go func() {
		st, err := c.units.readUnit(ctx)
		unitCh <- unitObservation{state: st, err: err}
	}()
	hz := probeHealthz(ctx, c.client, c.healthzURL)

	var uo unitObservation
	select {
	case uo = <-unitCh:
	case <-ctx.Done():
		// The reader honours ctx; give it a moment to report before calling it a timeout.
		grace := time.NewTimer(resultGrace)
		select {
		case uo = <-unitCh:
		case <-grace.C:
			uo = unitObservation{err: &busError{Kind: "timed out", Err: ctx.Err()}}
		}
		grace.Stop()
	}
	return c.verdict(c.cfg.Now(), uo, hz)
}

// restartObs is n restarts seen at one time.
type restartObs struct {
	at time.Time
	n  uint64
}

// recordRestarts notes d restarts observed at now (d may be 0: the call also prunes).
// Restarts are attributed to the observation that revealed them: with the D-Bus
// subscription that is the moment they happened; with checks alone, at most one check
// interval later. Entries older than the window are forgotten and the history is bounded.
func (c *Collector) recordRestarts(now time.Time, d uint64) {
	if d > 0 {
		c.history = append(c.history, restartObs{at: now, n: d})
	}
	cutoff := now.Add(-c.cfg.RestartLoopWindow)
	drop := 0
	for drop < len(c.history) && c.history[drop].at.Before(cutoff) {
		drop++
	}
	if len(c.history)-drop > maxHistory {
		drop = len(c.history) - maxHistory
	}
	if drop > 0 {
		c.history = append(c.history[:0], c.history[drop:]...)
	}
}

// restartsInWindow returns the restarts seen within the window and when the first of them
// was seen (now when none).
func (c *Collector) restartsInWindow(now time.Time) (delta uint64, since time.Time) {
	c.recordRestarts(now, 0)
	since = now
	for i, h := range c.history {
		delta += h.n
		if i == 0 {
			since = h.at
		}
	}
	return delta, since
}

// verdict turns the two observations into a Result. Precedence, most specific first:
//
//  1. Result=oom-kill while the unit is not active: KubeletOOMKilled (systemd resets Result
//     when the unit starts again, so this is the kill that just happened).
//  0. Inactive, deactivating or failed (a kubelet killed at TimeoutStopSec) and a stop job
//     ended the run: KubeletStoppedByOperator. The stop job is seen live (a JobNew signal or
//     the unit's Job property with type "stop", remembered until the unit is active again
//     with no job or another job replaces it), or, when the agent was not
//     watching (it started after the stop), read from systemd's timestamps: the unit left
//     the active state before its process exited (stoppedByJob). Whatever the last Result:
//     an operator who stops a crash-looping kubelet to debug it must not see it restarted.
//  2. failed: KubeletUnitFailed; inactive and never started since boot, or inactive after
//     its process exited on its own (even with Result=success): KubeletUnitInactive, which
//     local repair may restart; other inactive or deactivating: KubeletUnitInactive.
//  3. The restart count grew by RestartLoopThreshold or more within RestartLoopWindow:
//     KubeletRestartLoop (this is also how "activating in a loop" shows up). Restarts are
//     counted from NRestarts or, without it, from MainPID/ExecMainStartTimestamp changes, in
//     checks and in the D-Bus PropertiesChanged signals between them.
//  4. An OOM kill was seen within RestartLoopWindow even though the unit is running again:
//     KubeletOOMKilled. Documented choice: the memory pressure that killed the kubelet is
//     usually still there and a second kill likely, so the check stays Unhealthy for one
//     window after the last sighting and recovers on its own. Kills between two checks are
//     seen through the D-Bus signals.
//  5. /healthz not 200: KubeletHealthzFailed, at once when the unit is not active, after
//     HealthzFailureThreshold consecutive failures when it is.
//
// When systemd cannot be observed (no bus, unit unknown to systemd, query failed) the
// verdict comes from /healthz alone (debounced likewise) and the message says so. When
// /healthz refuses connections too, the host's process table decides: no kubelet process is
// KubeletNotRunning (Unhealthy); when the process table is not the host's, the result is
// Unknown (KubeletUnobservable) and says which mount is missing.
func (c *Collector) verdict(now time.Time, uo unitObservation, hz healthzObservation) collectors.Result {
	res := collectors.Result{Check: checkName, Time: now}
	unitKnown := uo.err == nil && uo.state.LoadState != "not-found"

	c.mu.Lock()
	defer c.mu.Unlock()
	if hz.ok() {
		c.hzFailures = 0
	} else {
		c.hzFailures++
	}
	debounced := !hz.ok() && c.hzFailures < c.cfg.HealthzFailureThreshold
	pending := func() string {
		return fmt.Sprintf("; not yet unhealthy: %d of %d consecutive /healthz failures", c.hzFailures, c.cfg.HealthzFailureThreshold)
	}
	res.Inputs = []collectors.Input{
		{Name: "healthz", Source: c.healthzURL, Value: hz.describe(),
			Threshold: fmt.Sprintf("200 expected; unhealthy after %d consecutive failures while the unit runs", c.cfg.HealthzFailureThreshold)},
	}

	if !unitKnown {
		var why string
		switch {
		case uo.err != nil:
			var be *busError
			if errors.As(uo.err, &be) && be.Kind == kindQueryFailed {
				why = "systemd query over D-Bus failed"
			} else if be != nil {
				why = "systemd not reachable over D-Bus: " + be.Kind
			} else {
				why = "systemd not reachable over D-Bus: " + uo.err.Error()
			}
		default:
			why = fmt.Sprintf("systemd has no unit %s", c.cfg.Unit)
		}
		res.Inputs = append(res.Inputs, collectors.Input{Name: "systemd unit " + c.cfg.Unit, Source: c.cfg.DBusAddress, Value: why})
		suffix := " (" + why + "; health from /healthz only)"
		var proc processState
		refused := !hz.reached && errors.Is(hz.err, syscall.ECONNREFUSED)
		if refused {
			proc = c.lookupProcess()
			v := "no kubelet process"
			switch {
			case !proc.hostPIDs:
				v = "not the host's process table (PID 1 is not systemd or init)"
			case proc.running:
				v = fmt.Sprintf("kubelet pid %d", proc.pid)
			}
			res.Inputs = append(res.Inputs, collectors.Input{Name: "kubelet process", Source: filepath.Join(c.cfg.HostRoot, "proc"), Value: v})
		}
		switch {
		case hz.ok():
			res.Status, res.Reason = collectors.StatusHealthy, ReasonKubeletHealthy
			res.Message = "kubelet " + hz.describe() + suffix
		case refused && proc.hostPIDs && !proc.running:
			res.Status, res.Reason = collectors.StatusUnhealthy, ReasonKubeletNotRunning
			res.Message = fmt.Sprintf("kubelet is not running: no kubelet process in the host's process table and %s%s", hz.describe(), suffix)
			c.disrupted = now
		case hz.reached && debounced:
			res.Status, res.Reason = collectors.StatusHealthy, ReasonKubeletHealthy
			res.Message = "kubelet " + hz.describe() + suffix + pending()
		case hz.reached || (refused && proc.running):
			res.Status, res.Reason = collectors.StatusUnhealthy, ReasonKubeletHealthzFailed
			res.Message = "kubelet " + hz.describe() + suffix
			if refused {
				res.Message += fmt.Sprintf("; kubelet pid %d exists but does not serve /healthz", proc.pid)
			}
			c.disrupted = now
		default:
			res.Status, res.Reason = collectors.StatusUnknown, ReasonKubeletUnobservable
			res.Message = fmt.Sprintf("kubelet cannot be observed: %s, and %s. To observe it, mount the host's /run/dbus at %s "+
				"(systemd's view) or the host's /proc at %s (the process table)",
				why, hz.describe(), filepath.Join(c.cfg.HostRoot, "run/dbus"), filepath.Join(c.cfg.HostRoot, "proc"))
			unitErr := uo.err
			if unitErr == nil {
				unitErr = fmt.Errorf("unit %s not found: %w", c.cfg.Unit, collectors.ErrNotSupported)
			}
			res.Err = errors.Join(unitErr, hz.err)
		}
		res.Disrupted = c.disrupted
		return res
	}

	st := uo.state
	c.noteUnit(now, st)
	delta, since := c.restartsInWindow(now)
	lastOOM := c.lastOOM

	active := unitActive(st)
	nrestarts := "n/a"
	if st.HasNRestarts {
		nrestarts = strconv.FormatUint(uint64(st.NRestarts), 10)
	}
	unit := fmt.Sprintf("%s %s/%s (NRestarts=%s, Result=%s)", c.cfg.Unit, st.ActiveState, st.SubState, nrestarts, st.Result)
	res.Inputs = append(res.Inputs,
		collectors.Input{Name: "systemd unit", Source: c.cfg.Unit + " over D-Bus", Value: unit},
		collectors.Input{Name: "restarts in window", Value: strconv.FormatUint(delta, 10),
			Threshold: fmt.Sprintf(">= %d in %s is a restart loop (counted from NRestarts, else MainPID/start-time changes)", c.cfg.RestartLoopThreshold, c.cfg.RestartLoopWindow)})
	if !st.HasNRestarts {
		unit += fmt.Sprintf(" (no NRestarts on this systemd; %d restart(s) counted from MainPID/start-time changes)", c.restarts)
	}
	loop := int64(delta) >= int64(c.cfg.RestartLoopThreshold)
	stopJobAt := c.stopJobAt
	res.Status = collectors.StatusUnhealthy
	switch {
	case !active && st.ActiveState != "activating" && (st.JobID == 0 || st.JobType == "stop") && (!stopJobAt.IsZero() || stoppedByJob(st)):
		// (A start or restart job queued means systemd is bringing it back: systemctl restart
		// passes through inactive with the same timestamps as a stop.)
		res.Reason = ReasonKubeletStoppedByOperator
		how := "systemd took the unit out of service before its process exited, i.e. a stop job such as systemctl stop"
		if !stopJobAt.IsZero() {
			how = "a stop job for " + c.cfg.Unit + " was seen at " + stopJobAt.UTC().Format(time.RFC3339)
		}
		res.Message = fmt.Sprintf("kubelet unit was stopped on purpose (%s) and is left stopped: %s; %s; start it with systemctl start %s",
			how, unit, hz.describe(), c.cfg.Unit)
	case st.Result == "oom-kill" && !active:
		res.Reason = ReasonKubeletOOMKilled
		res.Message = fmt.Sprintf("kubelet was killed by the kernel OOM killer: %s; %s", unit, hz.describe())
	case st.ActiveState == "failed":
		res.Reason = ReasonKubeletUnitFailed
		res.Message = fmt.Sprintf("kubelet unit failed: %s; %s", unit, hz.describe())
	case !active && st.ActiveState != "activating" && st.JobID != 0 && st.JobType != "stop":
		res.Reason = ReasonKubeletUnitInactive
		res.Message = fmt.Sprintf("kubelet unit is down and systemd has a %s job queued for it: %s; %s", orUnknown(st.JobType), unit, hz.describe())
	case st.ActiveState == "inactive" && (st.Result == "success" || st.Result == "") && neverStarted(st):
		res.Reason = ReasonKubeletUnitInactive
		res.Message = fmt.Sprintf("kubelet unit has not been started since boot (systemd records no start and no stop of it): %s; %s; "+
			"the node bootstrap starts it (systemctl start %s)", unit, hz.describe(), c.cfg.Unit)
	case st.ActiveState == "inactive" && (st.Result == "success" || st.Result == ""):
		res.Reason = ReasonKubeletUnitInactive
		res.Message = fmt.Sprintf("kubelet exited on its own (%s) and systemd did not restart it; no stop job ended it, so it was not stopped on purpose: %s; %s",
			describeExit(st), unit, hz.describe())
	case st.ActiveState == "inactive" || st.ActiveState == "deactivating":
		res.Reason = ReasonKubeletUnitInactive
		res.Message = fmt.Sprintf("kubelet unit is not running: %s; %s", unit, hz.describe())
	case loop:
		res.Reason = ReasonKubeletRestartLoop
		res.Message = fmt.Sprintf("kubelet restarted %d times in %s (threshold %d in %s): %s; %s",
			delta, roundDuration(now.Sub(since)), c.cfg.RestartLoopThreshold, c.cfg.RestartLoopWindow, unit, hz.describe())
	case !lastOOM.IsZero() && now.Sub(lastOOM) < c.cfg.RestartLoopWindow:
		res.Reason = ReasonKubeletOOMKilled
		res.Message = fmt.Sprintf("kubelet was OOM-killed %s ago (reported for %s after a kill): %s; %s",
			roundDuration(now.Sub(lastOOM)), c.cfg.RestartLoopWindow, unit, hz.describe())
	case !hz.ok() && (!active || !debounced):
		res.Reason = ReasonKubeletHealthzFailed
		res.Message = fmt.Sprintf("kubelet %s while %s", hz.describe(), unit)
		c.disrupted = now
	default:
		res.Status, res.Reason = collectors.StatusHealthy, ReasonKubeletHealthy
		res.Message = fmt.Sprintf("%s, +%d restarts in %s; kubelet %s", unit, delta, c.cfg.RestartLoopWindow, hz.describe())
		if !hz.ok() {
			res.Message += pending()
		}
	}
	res.Disrupted = c.disrupted
	return res
}

func orUnknown(s string) string {
	if s == "" {
		return "(finished)"
	}
	return s
}

// describeExit says how the unit's last main process ended, from ExecMainCode/Status.
func describeExit(st unitState) string {
	switch st.MainCode {
	case 1: // CLD_EXITED
		return fmt.Sprintf("exit status %d", st.MainStatus)
	case 2, 3: // CLD_KILLED, CLD_DUMPED
		return fmt.Sprintf("killed by signal %d", st.MainStatus)
	}
	return "clean result"
}

// roundDuration keeps messages readable: whole seconds above a second, milliseconds above a
// millisecond, microseconds below.
func roundDuration(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(time.Second)
	case d >= time.Millisecond:
		return d.Round(time.Millisecond)
	default:
		return d.Round(time.Microsecond)
	}
}
