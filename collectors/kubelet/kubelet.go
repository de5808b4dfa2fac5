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
	"strings"
	"sync"
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
)

// Defaults of Config.
const (
	DefaultUnit                 = "kubelet.service"
	DefaultHealthzURL           = "http://127.0.0.1:10248/healthz"
	DefaultTimeout              = 2 * time.Second
	DefaultRestartLoopThreshold = 3
	DefaultRestartLoopWindow    = 10 * time.Minute
)

const (
	checkName = "kubelet"
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
		bus:  newSystemdBus(cfg.DBusAddress, checkName, cfg.Now, cfg.Logger),
		unit: cfg.Unit,
	}
	return &Collector{
		cfg:        cfg,
		healthzURL: u.String(),
		client:     client,
		units:      unit,
		closeUnits: unit.close,
	}, nil
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
func (c *Collector) Name() string { return checkName }

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

// restartObs is one observation of the unit's NRestarts counter.
type restartObs struct {
	at time.Time
	n  uint32
}

// observeRestarts records n and returns how much the counter grew within the window and
// since when. A counter that went down was reset (manual start, reset-failed): the history
// starts over. Observations older than the window are forgotten, so growth is only counted
// between observations both inside the window: a conservative estimate.
func (c *Collector) observeRestarts(now time.Time, n uint32) (delta uint32, since time.Time) {
	if k := len(c.history); k > 0 && n < c.history[k-1].n {
		c.history = c.history[:0]
	}
	c.history = append(c.history, restartObs{at: now, n: n})
	cutoff := now.Add(-c.cfg.RestartLoopWindow)
	drop := 0
	for drop < len(c.history)-1 && c.history[drop].at.Before(cutoff) {
		drop++
	}
	if len(c.history)-drop > maxHistory {
		drop = len(c.history) - maxHistory
	}
	if drop > 0 {
		c.history = append(c.history[:0], c.history[drop:]...)
	}
	first := c.history[0]
	return n - first.n, first.at
}

// verdict turns the two observations into a Result. Precedence, most specific first:
//
//  1. Result=oom-kill while the unit is not active: KubeletOOMKilled (systemd resets Result
//     when the unit starts again, so this is the kill that just happened).
//  2. failed: KubeletUnitFailed; inactive or deactivating: KubeletUnitInactive.
//  3. NRestarts grew by RestartLoopThreshold or more within RestartLoopWindow:
//     KubeletRestartLoop (this is also how "activating in a loop" shows up).
//  4. An OOM kill was seen within RestartLoopWindow even though the unit is running again:
//     KubeletOOMKilled. Documented choice: the memory pressure that killed the kubelet is
//     usually still there and a second kill likely, so the check stays Unhealthy for one
//     window after the last sighting and recovers on its own. (Kills between two checks are
//     not seen as oom-kill, only as restarts.)
//  5. /healthz not 200: KubeletHealthzFailed.
//
// When systemd cannot be observed (no bus, unit unknown to systemd, query failed) the
// verdict comes from /healthz alone and the message says so; when /healthz cannot be reached
// either, the result is Unknown (KubeletUnobservable). /healthz refusing connections while
// systemd says the unit is active is Unhealthy: both were observed, and they disagree.
func (c *Collector) verdict(now time.Time, uo unitObservation, hz healthzObservation) collectors.Result {
	res := collectors.Result{Check: checkName, Time: now}
	unitKnown := uo.err == nil && uo.state.LoadState != "not-found"
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
		suffix := " (" + why + "; health from /healthz only)"
		switch {
		case hz.ok():
			res.Status, res.Reason = collectors.StatusHealthy, ReasonKubeletHealthy
			res.Message = "kubelet " + hz.describe() + suffix
		case hz.reached:
			res.Status, res.Reason = collectors.StatusUnhealthy, ReasonKubeletHealthzFailed
			res.Message = "kubelet " + hz.describe() + suffix
		default:
			res.Status, res.Reason = collectors.StatusUnknown, ReasonKubeletUnobservable
			res.Message = fmt.Sprintf("kubelet cannot be observed: %s, and %s", why, hz.describe())
			unitErr := uo.err
			if unitErr == nil {
				unitErr = fmt.Errorf("unit %s not found: %w", c.cfg.Unit, collectors.ErrNotSupported)
			}
			res.Err = errors.Join(unitErr, hz.err)
		}
		return res
	}

	st := uo.state
	c.mu.Lock()
	delta, since := c.observeRestarts(now, st.NRestarts)
	if st.Result == "oom-kill" {
		c.lastOOM = now
	}
	lastOOM := c.lastOOM
	c.mu.Unlock()

	active := st.ActiveState == "active" || st.ActiveState == "reloading" || st.ActiveState == "refreshing"
	unit := fmt.Sprintf("%s %s/%s (NRestarts=%d, Result=%s)", c.cfg.Unit, st.ActiveState, st.SubState, st.NRestarts, st.Result)
	loop := int64(delta) >= int64(c.cfg.RestartLoopThreshold)
	res.Status = collectors.StatusUnhealthy
	switch {
	case st.Result == "oom-kill" && !active:
		res.Reason = ReasonKubeletOOMKilled
		res.Message = fmt.Sprintf("kubelet was killed by the kernel OOM killer: %s; %s", unit, hz.describe())
	case st.ActiveState == "failed":
		res.Reason = ReasonKubeletUnitFailed
		res.Message = fmt.Sprintf("kubelet unit failed: %s; %s", unit, hz.describe())
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
	case !hz.ok():
		res.Reason = ReasonKubeletHealthzFailed
		res.Message = fmt.Sprintf("kubelet %s while %s", hz.describe(), unit)
	default:
		res.Status, res.Reason = collectors.StatusHealthy, ReasonKubeletHealthy
		res.Message = fmt.Sprintf("%s, +%d restarts in %s; kubelet %s", unit, delta, c.cfg.RestartLoopWindow, hz.describe())
	}
	return res
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
