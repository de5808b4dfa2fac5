// Package memory is the node memory-pressure check of nodevigil. It exists because the usual
// way a Kubernetes node goes silent is memory pressure: the kernel OOM-kills the kubelet and the
// node turns Ready=Unknown. The check sees the pressure coming, from the host itself.
//
// # Signals
//
// The check reads three things, all under <HostRoot>/proc:
//
//   - pressure stall information (PSI): the share of time every non-idle task was stalled
//     waiting for memory ("full"), node-wide from /proc/pressure/memory and, when present,
//     from the cgroup v2 memory.pressure file of the kubelet's pod cgroup (kubepods.slice with
//     the systemd cgroup driver, kubepods with cgroupfs). The worse of the two is judged;
//   - MemAvailable against MemTotal from /proc/meminfo;
//   - the kernel's OOM-kill counter (oom_kill in /proc/vmstat), reported as a metric and named
//     in the message for OOMKillWindow after a kill.
//
// # Verdict and defaults
//
// PSI alone does not make a node unhealthy: a single container stalling against its own
// cgroup limit raises it on a node with plenty of memory to spare. The node is under memory
// pressure when either
//
//   - PSI full avg10 >= PSIFullEnterPercent (default 25%) while MemAvailable is below the low
//     level (default the smaller of 10% of MemTotal and 2 GiB), reason MemoryPressure; or
//   - MemAvailable is below the critical level (default the smaller of 5% of MemTotal and
//     1 GiB) whatever PSI says, reason LowMemoryAvailable. The absolute caps keep large,
//     densely packed nodes from being called short at tens of GiB free.
//
// The verdict turns Unhealthy when one of these held at every check for at least EnterAfter
// (default 30s, as systemd-oomd), and Healthy again only when, for at least ExitAfter (default
// 2m), PSI was below PSIFullExitPercent (default 10%) or MemAvailable at or above the low
// level, and MemAvailable at or above the critical exit level (default the smaller of 10% and
// 2 GiB). Readings between the levels keep the current verdict.
//
// A restarted agent does not forget: Seed sets the verdict from the MemoryHealthy condition
// already on the Node, so an agent OOM-killed during pressure keeps reporting it (and the
// condition its transition time) until the readings have been clear for ExitAfter.
//
// With OneShot (the `check` command) there is no history: each Check judges one reading, with
// PSI full avg60 (a minute-long average stands in for EnterAfter) and the instant MemAvailable.
//
// # Kernels without PSI
//
// When the kernel has no memory PSI (Amazon Linux 2 with kernel 4.14, psi=0, CONFIG_PSI off)
// the verdict falls back to the critical MemAvailable rule alone and the Message says so. This
// is logged once, with reason PSIUnsupported, not on every check, and Result.Err stays nil: it
// is a property of the host, not a failure. If meminfo cannot be read, the result is Unknown
// with reason MeminfoUnreadable. A missing or unreadable /proc/vmstat only drops the OOM-kill
// count from the message.
package memory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodevigil/nodevigil/collectors"
	"github.com/nodevigil/nodevigil/collectors/hostfile"
)

// Name is the check name the memory collector reports under.
const Name = collectors.CheckMemory

// Reasons of memory results. They are stable: they become Node condition reasons and alert
// labels.
const (
	// ReasonNoMemoryPressure: memory PSI and MemAvailable are within their levels.
	ReasonNoMemoryPressure = "NoMemoryPressure"
	// ReasonMemoryPressure: tasks are stalling on memory (PSI at or past its level).
	ReasonMemoryPressure = "MemoryPressure"
	// ReasonLowMemoryAvailable: MemAvailable is below its level while PSI is not (or the kernel
	// has no PSI).
	ReasonLowMemoryAvailable = "LowMemoryAvailable"
	// ReasonPSIUnreadable: a PSI file exists but could not be read or parsed.
	ReasonPSIUnreadable = "PSIUnreadable"
	// ReasonMeminfoUnreadable: /proc/meminfo could not be read or parsed, or lacks
	// MemTotal/MemAvailable.
	ReasonMeminfoUnreadable = "MeminfoUnreadable"
	// ReasonCheckCanceled: the caller's context was done before the check ran.
	ReasonCheckCanceled = "CheckCanceled"
	// ReasonPSIUnsupported is the log reason (not a Result reason) used once when the kernel
	// has no memory PSI and the verdict falls back to meminfo.
	ReasonPSIUnsupported = "PSIUnsupported"
)

// Defaults. They are deliberately conservative: a false "unhealthy" on a busy but working node
// costs more trust than a verdict that arrives half a minute later. docs/agent-verdicts.md
// explains each.
const (
	DefaultPSIFullEnterPercent   = 25.0
	DefaultPSIFullExitPercent    = 10.0
	DefaultAvailableLowPercent   = 10.0
	DefaultAvailableLowBytes     = 2 << 30
	DefaultAvailableEnterPercent = 5.0
	DefaultAvailableExitPercent  = 10.0
	DefaultAvailableEnterBytes   = 1 << 30
	DefaultAvailableExitBytes    = 2 << 30
	DefaultEnterAfter            = 30 * time.Second
	DefaultExitAfter             = 2 * time.Minute
	DefaultOOMKillWindow         = 10 * time.Minute
)

// oomHistory bounds the OOM-kill counter history kept for the message.
const oomHistory = 64

// Config configures the memory check. Zero values select the documented defaults, so callers
// set only what they mean to change.
type Config struct {
	// HostRoot is where the host's filesystem is mounted in the agent's container; "/" when
	// empty. /proc and /sys/fs/cgroup are read below it.
	HostRoot string
	// Now is the clock; time.Now when nil. Tests pass a fake to drive the hysteresis.
	Now func() time.Time
	// Logger receives the rare state messages (PSI unsupported); slog.Default() when nil.
	Logger *slog.Logger

	// PSIFullEnterPercent is the "full avg10" level, in percent, at or above which the node is
	// under memory pressure. Negative disables the PSI rule (PSI is then not read).
	PSIFullEnterPercent float64
	// PSIFullExitPercent is the "full avg10" level below which the pressure is over. It must
	// not exceed PSIFullEnterPercent.
	PSIFullExitPercent float64

	// AvailableLowPercent and AvailableLowBytes set the "low" MemAvailable level (the smaller
	// of the percentage of MemTotal and the byte count): PSI at or past its enter level counts
	// only while MemAvailable is below it, so a container stalling against its own cgroup
	// limit on a roomy node does not mark the node.
	AvailableLowPercent float64
	AvailableLowBytes   uint64

	// AvailableEnterPercent and AvailableEnterBytes set the critical MemAvailable level below
	// which the node is short of memory whatever PSI says: the smaller of the percentage of
	// MemTotal and the byte count. A negative AvailableEnterPercent disables this rule while
	// PSI is available; on a kernel without PSI it is still judged, then with the default
	// percentage.
	AvailableEnterPercent float64
	AvailableEnterBytes   uint64
	// AvailableExitPercent and AvailableExitBytes set the MemAvailable level (the smaller of
	// the two) at or above which the shortage is over. Each must be at least its enter
	// counterpart.
	AvailableExitPercent float64
	AvailableExitBytes   uint64

	// EnterAfter is how long the readings must stay at or past an enter level before the
	// verdict turns Unhealthy.
	EnterAfter time.Duration
	// ExitAfter is how long the readings must stay below every exit level before the verdict
	// turns Healthy again.
	ExitAfter time.Duration

	// OneShot judges each Check from its own reading, without hysteresis: PSI full avg60
	// against the enter level, MemAvailable as read. The `check` command sets it.
	OneShot bool
	// OOMKillWindow is how long kernel OOM kills stay named in the message (default 10m).
	OOMKillWindow time.Duration
	// KubeletUnit is the systemd unit of the kubelet (default kubelet.service), so an OOM
	// kill in its cgroup is named as the kubelet's.
	KubeletUnit string
}

// Collector is the memory check. It keeps the verdict between calls (that is what the
// hysteresis needs), so one Collector must be used for the life of the agent. Check is safe
// for concurrent use.
type Collector struct {
	hostRoot string
	now      func() time.Time
	log      *slog.Logger

	psiEnabled, memEnabled bool
	psiEnter, psiExit      float64
	availLowPct            float64
	availLowBytes          uint64
	availEnterPct          float64
	availExitPct           float64
	availEnterBytes        uint64
	availExitBytes         uint64
	oneShot                bool
	oomWindow              time.Duration
	kubeletUnit            string

	mu     sync.Mutex
	procOK bool // <hostRoot>/proc has been seen to exist
	// buf is reused for every file a check reads (under mu): the check reads four files every
	// cycle, and a buffer each would be most of what it allocates.
	buf     []byte
	state   hysteresis
	cause   string // reason recorded when the verdict last turned unhealthy
	psiLost bool   // the PSI-unsupported message has been logged
	// ooms holds oom_kill counter readings that differ from the previous one, newest last,
	// within oomWindow; oomTotal is the latest reading (read by the metric).
	ooms     []oomObs
	oomTotal atomic.Uint64
	oomOK    atomic.Bool
	// cgroups attributes kills to cgroups (not in one-shot mode: it needs a baseline).
	cgroups cgroupOOMs
}

// oomObs is one change of the kernel's oom_kill counter.
type oomObs struct {
	at    time.Time
	n     uint64
	delta uint64 // kills since the previous reading (0 for the first one)
	// victims are the cgroups the kills happened in, when the cgroup counters could tell.
	victims []oomVictim
}

// New validates cfg, fills defaults and returns a Collector. It does not touch the host, so a
// missing mount shows up as Unknown results rather than a failed start.
func New(cfg Config) (*Collector, error) {
	c := &Collector{
		hostRoot:        cfg.HostRoot,
		now:             cfg.Now,
		log:             cfg.Logger,
		psiEnter:        orDefault(cfg.PSIFullEnterPercent, DefaultPSIFullEnterPercent),
		psiExit:         orDefault(cfg.PSIFullExitPercent, DefaultPSIFullExitPercent),
		availLowPct:     orDefault(cfg.AvailableLowPercent, DefaultAvailableLowPercent),
		availLowBytes:   orDefault(cfg.AvailableLowBytes, DefaultAvailableLowBytes),
		oneShot:         cfg.OneShot,
		oomWindow:       orDefault(cfg.OOMKillWindow, DefaultOOMKillWindow),
		kubeletUnit:     orDefault(cfg.KubeletUnit, "kubelet.service"),
		availEnterPct:   orDefault(cfg.AvailableEnterPercent, DefaultAvailableEnterPercent),
		availExitPct:    orDefault(cfg.AvailableExitPercent, DefaultAvailableExitPercent),
		availEnterBytes: orDefault(cfg.AvailableEnterBytes, DefaultAvailableEnterBytes),
		availExitBytes:  orDefault(cfg.AvailableExitBytes, DefaultAvailableExitBytes),
	}
	if c.hostRoot == "" {
		c.hostRoot = "/"
	}
	c.cgroups.root = filepath.Join(c.hostRoot, "sys", "fs", "cgroup")
	if c.now == nil {
		c.now = time.Now
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	// A disabled rule keeps the default enter level: the meminfo levels still serve as the
	// fallback on kernels without PSI, and validation below stays meaningful.
	c.psiEnabled = !(cfg.PSIFullEnterPercent < 0)
	if !c.psiEnabled {
		c.psiEnter = DefaultPSIFullEnterPercent
	}
	c.memEnabled = !(cfg.AvailableEnterPercent < 0)
	if !c.memEnabled {
		c.availEnterPct = DefaultAvailableEnterPercent
	}
	if !c.psiEnabled && !c.memEnabled {
		return nil, errors.New("memory: both PSIFullEnterPercent and AvailableEnterPercent are negative; enable at least one rule")
	}
	if math.IsNaN(c.psiEnter) || c.psiEnter > 100 {
		return nil, fmt.Errorf("memory: PSIFullEnterPercent %v must be between 0 and 100", cfg.PSIFullEnterPercent)
	}
	if math.IsNaN(c.psiExit) || c.psiExit < 0 || c.psiExit > c.psiEnter {
		return nil, fmt.Errorf("memory: PSIFullExitPercent %v must be between 0 and PSIFullEnterPercent (%v)", c.psiExit, c.psiEnter)
	}
	if math.IsNaN(c.availEnterPct) || c.availEnterPct > 100 {
		return nil, fmt.Errorf("memory: AvailableEnterPercent %v must be between 0 and 100", cfg.AvailableEnterPercent)
	}
	if math.IsNaN(c.availExitPct) || c.availExitPct < c.availEnterPct || c.availExitPct > 100 {
		return nil, fmt.Errorf("memory: AvailableExitPercent %v must be between AvailableEnterPercent (%v) and 100", c.availExitPct, c.availEnterPct)
	}
	if c.availExitBytes < c.availEnterBytes {
		return nil, fmt.Errorf("memory: AvailableExitBytes %d must be at least AvailableEnterBytes (%d)", c.availExitBytes, c.availEnterBytes)
	}
	if math.IsNaN(c.availLowPct) || c.availLowPct < 0 || c.availLowPct > 100 {
		return nil, fmt.Errorf("memory: AvailableLowPercent %v must be between 0 and 100", cfg.AvailableLowPercent)
	}
	if cfg.OOMKillWindow < 0 {
		return nil, fmt.Errorf("memory: OOMKillWindow (%v) must not be negative", cfg.OOMKillWindow)
	}
	if cfg.EnterAfter < 0 || cfg.ExitAfter < 0 {
		return nil, fmt.Errorf("memory: EnterAfter (%v) and ExitAfter (%v) must not be negative", cfg.EnterAfter, cfg.ExitAfter)
	}
	c.state = hysteresis{
		enterAfter: orDefault(cfg.EnterAfter, DefaultEnterAfter),
		exitAfter:  orDefault(cfg.ExitAfter, DefaultExitAfter),
	}
	return c, nil
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Name returns "memory".
func (c *Collector) Name() collectors.CheckName { return Name }

// reading is what one check observed, before any verdict.
type reading struct {
	psiOK       bool    // a PSI value is available
	psiFull     float64 // worst full avg10 over the sources read
	psiAvg60    float64 // full avg60 of the same source
	worst60     float64 // worst full avg60 over the sources read (one-shot judging)
	psiSource   string  // "node" or "kubepods": where psiFull came from
	nodeFull    float64
	nodeOK      bool
	podsFull    float64
	podsOK      bool
	unsupported error // non-nil when the kernel has no memory PSI

	memOK        bool
	availBytes   uint64
	totalBytes   uint64
	availPercent float64

	oomOK    bool   // /proc/vmstat carried oom_kill
	oomKills uint64 // the kernel's oom_kill counter
}

// Check reads memory PSI and meminfo once, advances the hysteresis and returns the verdict.
// Failing reads give StatusUnknown with Err set and leave the verdict as it was.
func (c *Collector) Check(ctx context.Context) collectors.Result {
	now := c.now()
	res := collectors.Result{Check: Name, Time: now}
	if err := ctx.Err(); err != nil {
		res.Status, res.Reason, res.Err = collectors.StatusUnknown, ReasonCheckCanceled, err
		res.Message = "memory check canceled before it ran"
		return res
	}

	c.mu.Lock()
	defer c.mu.Unlock()

	r, reason, err := c.read()
	if err != nil {
		c.state.reset()
		res.Status, res.Reason, res.Err = collectors.StatusUnknown, reason, err
		res.Message = err.Error()
		return res
	}
	c.noteSupport(r.unsupported)
	c.noteOOM(now, r)

	breach, clear, cause := c.judge(r)
	if c.oneShot {
		c.state.unhealthy, c.cause = breach, cause
		if !breach {
			cause = ""
		}
	} else if c.state.observe(now, breach, clear) && c.state.unhealthy {
		c.cause = cause
	}
	res.Status, res.Reason = collectors.StatusHealthy, ReasonNoMemoryPressure
	if c.state.unhealthy {
		res.Status, res.Reason = collectors.StatusUnhealthy, c.cause
		if cause != "" {
			// Report what is wrong now; fall back to the cause recorded on entry while
			// recovering (all readings between the levels).
			res.Reason = cause
		}
	}
	res.Message = c.message(now, r)
	if c.oneShot {
		res.Inputs = c.inputs(r) // only `check` shows them; the agent's loop does not pay for them
	}
	return res
}

// Seed sets the verdict a freshly started collector begins with, from the MemoryHealthy
// condition a previous agent left on the Node: an Unhealthy prior keeps the node unhealthy
// (with the prior reason) until the readings have been clear for ExitAfter, instead of
// starting Healthy and flipping the condition (and its transition time) on the first check.
// Any other prior leaves the collector as it is. It is meant to be called once, before the
// first Check; a one-shot collector ignores it.
func (c *Collector) Seed(prior collectors.Prior) {
	if c.oneShot || prior.Status != collectors.StatusUnhealthy {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.state.unhealthy, c.state.pendingSince = true, time.Time{}
	c.cause = ReasonMemoryPressure
	if prior.Reason == ReasonLowMemoryAvailable {
		c.cause = ReasonLowMemoryAvailable
	}
}

// OOMKills returns the kernel's oom_kill counter as last read, and whether it was readable.
// The agent exports it as nodevigil_memory_oom_kills_total.
func (c *Collector) OOMKills() (uint64, bool) { return c.oomTotal.Load(), c.oomOK.Load() }

// noteOOM records the oom_kill counter and forgets changes older than the window.
func (c *Collector) noteOOM(now time.Time, r reading) {
	if !r.oomOK {
		return
	}
	c.oomTotal.Store(r.oomKills)
	c.oomOK.Store(true)
	switch k := len(c.ooms); {
	case k == 0:
		c.ooms = append(c.ooms, oomObs{at: now, n: r.oomKills})
		c.cgroupVictims() // the baseline of the per-cgroup counters
	case r.oomKills > c.ooms[k-1].n:
		c.ooms = append(c.ooms, oomObs{at: now, n: r.oomKills, delta: r.oomKills - c.ooms[k-1].n, victims: c.cgroupVictims()})
	case r.oomKills < c.ooms[k-1].n: // counter went back: the host rebooted under us
		c.ooms = append(c.ooms[:0], oomObs{at: now, n: r.oomKills})
		c.cgroups = cgroupOOMs{root: c.cgroups.root}
		c.cgroupVictims()
	}
	// Keep the latest reading as the baseline; drop changes outside the window.
	cutoff := now.Add(-c.oomWindow)
	drop := 0
	for drop < len(c.ooms)-1 && (c.ooms[drop].at.Before(cutoff) || len(c.ooms)-drop > oomHistory) {
		drop++
	}
	if drop > 0 {
		c.ooms = append(c.ooms[:0], c.ooms[drop:]...)
	}
}

// cgroupVictims walks the memory cgroups for the kills since the last walk (see
// oomvictims.go). Only when the node-wide counter moved, so it costs nothing in steady state;
// a host without the cgroup mount just leaves the kills unnamed.
func (c *Collector) cgroupVictims() []oomVictim {
	if c.oneShot {
		return nil
	}
	v, err := c.cgroups.victims()
	if err != nil {
		return nil
	}
	return v
}

// describeVictims names the cgroups of the recent kills, most kills first, marking the
// kubelet's.
func (c *Collector) describeVictims(now time.Time) string {
	cutoff := now.Add(-c.oomWindow)
	counts := map[string]uint64{}
	var order []string
	for _, o := range c.ooms {
		if o.at.Before(cutoff) {
			continue
		}
		for _, v := range o.victims {
			name := describeCgroup(v.cgroup)
			if name == c.kubeletUnit {
				name += " (the kubelet)"
			}
			if _, ok := counts[name]; !ok {
				order = append(order, name)
			}
			counts[name] += v.n
		}
	}
	if len(order) == 0 {
		return ""
	}
	parts := make([]string, len(order))
	for i, name := range order {
		parts[i] = fmt.Sprintf("%s ×%d", name, counts[name])
	}
	return strings.Join(parts, ", ")
}

// recentOOMs returns how many kills the counter grew by within the window and the time of
// the latest growth.
func (c *Collector) recentOOMs(now time.Time) (n uint64, last time.Time) {
	cutoff := now.Add(-c.oomWindow)
	for _, o := range c.ooms {
		if o.delta > 0 && !o.at.Before(cutoff) {
			n += o.delta
			last = o.at
		}
	}
	return n, last
}

// read gathers meminfo and the PSI sources. The returned reason names the first source that
// failed; unsupported PSI is not a failure.
func (c *Collector) read() (reading, string, error) {
	var r reading
	if !c.procOK {
		p := filepath.Join(c.hostRoot, "proc")
		fi, err := os.Stat(p)
		if err == nil && !fi.IsDir() {
			err = fmt.Errorf("%s is not a directory", p)
		}
		if err != nil {
			return r, ReasonMeminfoUnreadable, fmt.Errorf("memory: open proc under host root %q: %w", c.hostRoot, err)
		}
		c.procOK = true
	}

	if c.psiEnabled {
		if err := c.readPSI(&r); err != nil {
			return r, ReasonPSIUnreadable, err
		}
	}
	// MemAvailable is always read: the PSI rule needs it too.
	if err := c.readMeminfo(&r); err != nil {
		if r.unsupported != nil {
			err = fmt.Errorf("%w (and memory PSI is unsupported by this kernel)", err)
		}
		return r, ReasonMeminfoUnreadable, err
	}
	c.readVMStat(&r)
	return r, "", nil
}

// readVMStat reads the oom_kill counter; failures only drop it from the message.
func (c *Collector) readVMStat(r *reading) {
	data, err := c.readFile(filepath.Join(c.hostRoot, "proc", "vmstat"), maxVMStatSize)
	if err != nil {
		return
	}
	if n, err := parseOOMKills(data); err == nil {
		r.oomOK, r.oomKills = true, n
	}
}

// readFile reads one host file into the collector's buffer; the result is valid until the
// next call.
func (c *Collector) readFile(path string, limit int) ([]byte, error) {
	data, err := hostfile.Read(path, c.buf, limit)
	if cap(data) > cap(c.buf) {
		c.buf = data[:0]
	}
	return data, err
}

func (c *Collector) readPSI(r *reading) error {
	var nodeUnsupported error
	data, err := c.readFile(filepath.Join(c.hostRoot, "proc", "pressure", "memory"), maxPSIFileSize)
	switch {
	case err == nil:
		st, err := parsePSI(data)
		if err == nil && !st.HasFull {
			err = errors.New(`no "full" line`)
		}
		if err != nil {
			return fmt.Errorf("memory: parse /proc/pressure/memory: %w", err)
		}
		r.nodeOK, r.nodeFull = true, st.Full.Avg10
		r.psiOK, r.psiFull, r.psiAvg60, r.psiSource = true, st.Full.Avg10, st.Full.Avg60, "node"
		r.worst60 = st.Full.Avg60
	case isUnsupported(err):
		nodeUnsupported = fmt.Errorf("%w: %w", errPSIUnsupported, err)
	default:
		return fmt.Errorf("memory: read /proc/pressure/memory: %w", err)
	}

	path, st, err := c.readKubepodsPSI()
	switch {
	case path == "":
		// No pod cgroup with PSI (cgroup v1, or not created yet): node-wide only.
	case errors.Is(err, errPSIUnsupported):
		// PSI switched off for this cgroup only; the node-wide value still stands.
	case err == nil && !st.HasFull:
		return fmt.Errorf("memory: parse %s: no \"full\" line", path)
	case err != nil:
		return fmt.Errorf("memory: read %s: %w", path, err)
	default:
		r.podsOK, r.podsFull = true, st.Full.Avg10
		r.worst60 = max(r.worst60, st.Full.Avg60)
		if !r.psiOK || st.Full.Avg10 > r.psiFull {
			r.psiOK, r.psiFull, r.psiAvg60, r.psiSource = true, st.Full.Avg10, st.Full.Avg60, "kubepods"
		}
	}
	if !r.psiOK {
		r.unsupported = nodeUnsupported
	}
	return nil
}

func (c *Collector) readMeminfo(r *reading) error {
	data, err := c.readFile(filepath.Join(c.hostRoot, "proc", "meminfo"), maxMeminfoSize)
	if err != nil {
		return fmt.Errorf("memory: read /proc/meminfo: %w", err)
	}
	m, err := parseMeminfo(data)
	if err != nil {
		return fmt.Errorf("memory: parse /proc/meminfo: %w", err)
	}
	switch {
	case !m.hasTotal || m.totalBytes == 0:
		return errors.New("memory: /proc/meminfo has no usable MemTotal")
	case !m.hasAvailable:
		return errors.New("memory: /proc/meminfo has no MemAvailable (kernel older than 3.14?)")
	case m.availableBytes > m.totalBytes:
		return fmt.Errorf("memory: /proc/meminfo MemAvailable %d exceeds MemTotal %d", m.availableBytes, m.totalBytes)
	}
	r.memOK = true
	r.availBytes, r.totalBytes = m.availableBytes, m.totalBytes
	r.availPercent = 100 * float64(r.availBytes) / float64(r.totalBytes)
	return nil
}

// noteSupport logs, once per change, that the verdict is falling back to meminfo.
func (c *Collector) noteSupport(unsupported error) {
	switch {
	case unsupported != nil && !c.psiLost:
		c.psiLost = true
		c.log.Warn("memory pressure stall information unavailable, judging by meminfo alone",
			"check", Name, "reason", ReasonPSIUnsupported, "err", unsupported)
	case unsupported == nil && c.psiLost:
		c.psiLost = false
		c.log.Info("memory pressure stall information available again", "check", Name)
	}
}

// levels returns the critical MemAvailable enter and exit levels for a node of the given size.
func (c *Collector) levels(total uint64) (enter, exit uint64) {
	enter = min(uint64(float64(total)*c.availEnterPct/100), c.availEnterBytes)
	exit = min(uint64(float64(total)*c.availExitPct/100), c.availExitBytes)
	return enter, exit
}

// lowLevel returns the MemAvailable level below which PSI counts.
func (c *Collector) lowLevel(total uint64) uint64 {
	return min(uint64(float64(total)*c.availLowPct/100), c.availLowBytes)
}

// psiValue is the PSI figure judged: the worst full avg10, or in one-shot mode the worst full
// avg60 (one minute of stalls stands in for the EnterAfter a single reading cannot have).
func (c *Collector) psiValue(r reading) float64 {
	if c.oneShot {
		return r.worst60
	}
	return r.psiFull
}

// judge turns one reading into the inputs of the hysteresis, and the reason that applies if
// the node is (or becomes) unhealthy because of it: the most severe finding wins, the
// critical MemAvailable rule before PSI because it needs no corroboration.
//
//   - breach: MemAvailable below the critical level (rule on, or no PSI), or PSI at or past
//     its enter level while MemAvailable is below the low level;
//   - clear: MemAvailable at or above the critical exit level, and PSI below its exit level
//     or MemAvailable at or above the low level;
//   - anything else is between the levels.
func (c *Collector) judge(r reading) (breach, clear bool, cause string) {
	psi := c.psiEnabled && r.psiOK
	crit := r.memOK && (c.memEnabled || !r.psiOK)
	var enter, exit, low uint64
	if r.memOK {
		enter, exit = c.levels(r.totalBytes)
		low = c.lowLevel(r.totalBytes)
	}
	memLow := r.memOK && r.availBytes < low
	v := c.psiValue(r)
	switch {
	case crit && r.availBytes < enter:
		return true, false, ReasonLowMemoryAvailable
	case psi && memLow && v >= c.psiEnter:
		return true, false, ReasonMemoryPressure
	case crit && r.availBytes < exit:
		return false, false, ReasonLowMemoryAvailable
	case psi && memLow && v >= c.psiExit:
		return false, false, ReasonMemoryPressure
	}
	return false, true, ""
}

// message renders the observed values, the levels they were judged against and any pending
// change, so `kubectl describe node` needs nothing else.
func (c *Collector) message(now time.Time, r reading) string {
	var b strings.Builder
	switch {
	case r.psiOK:
		fmt.Fprintf(&b, "memory PSI full avg10=%.2f%% avg60=%.2f%%", r.psiFull, r.psiAvg60)
		if c.oneShot {
			fmt.Fprintf(&b, " (one reading: worst avg60 %.2f%% judged)", r.worst60)
		}
		if r.nodeOK && r.podsOK {
			other, otherVal := "node", r.nodeFull
			if r.psiSource == "node" {
				other, otherVal = "kubepods", r.podsFull
			}
			fmt.Fprintf(&b, " from %s (%s %.2f%%)", r.psiSource, other, otherVal)
		} else {
			fmt.Fprintf(&b, " from %s", r.psiSource)
		}
		fmt.Fprintf(&b, " (enter %s%%, exit %s%%)", fmtPct(c.psiEnter), fmtPct(c.psiExit))
	case r.unsupported != nil:
		b.WriteString("memory PSI unsupported by this kernel, judging by meminfo alone")
	default:
		b.WriteString("memory PSI not judged")
	}
	if r.memOK {
		enter, exit := c.levels(r.totalBytes)
		fmt.Fprintf(&b, ", MemAvailable %s of %s (%.1f%%; ", fmtBytes(r.availBytes), fmtBytes(r.totalBytes), r.availPercent)
		if c.psiEnabled && r.psiOK {
			fmt.Fprintf(&b, "PSI counts below %s, ", fmtBytes(c.lowLevel(r.totalBytes)))
		}
		fmt.Fprintf(&b, "critical below %s, clear at %s)", fmtBytes(enter), fmtBytes(exit))
		if c.psiEnabled && r.psiOK && c.psiValue(r) >= c.psiEnter && r.availBytes >= c.lowLevel(r.totalBytes) {
			b.WriteString("; PSI is high but memory is not low: a cgroup stalling at its own limit, not the node")
		}
	}
	if n, last := c.recentOOMs(now); n > 0 {
		fmt.Fprintf(&b, "; kernel OOM killer killed %d process(es) in the last %v, latest seen %v ago (vmstat oom_kill %d)",
			n, c.oomWindow, now.Sub(last).Round(time.Second), r.oomKills)
		if v := c.describeVictims(now); v != "" {
			b.WriteString(", in cgroups: " + v)
		}
	}
	if elapsed, need, ok := c.state.pending(now); ok && !c.oneShot {
		to := "unhealthy"
		if c.state.unhealthy {
			to = "healthy"
		}
		fmt.Fprintf(&b, "; %s in %v unless readings change (%v of %v)", to, (need - elapsed).Round(time.Second), elapsed.Round(time.Second), need)
	}
	return b.String()
}

// inputs lists what the verdict was computed from, for `check --explain`.
func (c *Collector) inputs(r reading) []collectors.Input {
	var in []collectors.Input
	if r.psiOK && c.psiEnabled {
		window := "avg10"
		if c.oneShot {
			window = "avg60"
		}
		if r.nodeOK {
			in = append(in, collectors.Input{Name: "psi.full (node)", Source: "/proc/pressure/memory",
				Value: fmt.Sprintf("avg10=%.2f%%", r.nodeFull)})
		}
		if r.podsOK {
			in = append(in, collectors.Input{Name: "psi.full (kubepods)", Source: "memory.pressure of the kubepods cgroup",
				Value: fmt.Sprintf("avg10=%.2f%%", r.podsFull)})
		}
		in = append(in, collectors.Input{Name: "psi.full." + window + " judged", Source: r.psiSource,
			Value:     fmt.Sprintf("%.2f%%", c.psiValue(r)),
			Threshold: fmt.Sprintf(">= %s%% with MemAvailable below the low level (exit below %s%%)", fmtPct(c.psiEnter), fmtPct(c.psiExit))})
	} else if r.unsupported != nil {
		in = append(in, collectors.Input{Name: "psi.full", Source: "/proc/pressure/memory", Value: "unsupported by this kernel"})
	}
	if r.memOK {
		enter, exit := c.levels(r.totalBytes)
		in = append(in,
			collectors.Input{Name: "MemTotal", Source: "/proc/meminfo", Value: fmtBytes(r.totalBytes)},
			collectors.Input{Name: "MemAvailable", Source: "/proc/meminfo", Value: fmt.Sprintf("%s (%.1f%%)", fmtBytes(r.availBytes), r.availPercent),
				Threshold: fmt.Sprintf("low < %s (min %s%%, %s); critical < %s (min %s%%, %s); clear >= %s",
					fmtBytes(c.lowLevel(r.totalBytes)), fmtPct(c.availLowPct), fmtBytes(c.availLowBytes),
					fmtBytes(enter), fmtPct(c.availEnterPct), fmtBytes(c.availEnterBytes), fmtBytes(exit))})
	}
	if r.oomOK {
		in = append(in, collectors.Input{Name: "oom_kill", Source: "/proc/vmstat", Value: strconv.FormatUint(r.oomKills, 10),
			Threshold: fmt.Sprintf("informational; growth named for %v", c.oomWindow)})
	}
	if !c.oneShot {
		in = append(in, collectors.Input{Name: "hysteresis", Value: fmt.Sprintf("unhealthy=%v", c.state.unhealthy),
			Threshold: fmt.Sprintf("enter after %v, exit after %v", c.state.enterAfter, c.state.exitAfter)})
	}
	return in
}

// fmtPct prints a threshold without trailing zeros: 25, 2.5.
func fmtPct(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// fmtBytes prints a byte count with binary units as kubectl does: 312Mi, 7.6Gi.
func fmtBytes(n uint64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return fmt.Sprintf("%dB", n)
	}
	v := float64(n)
	i := -1
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if v < 10 {
		return fmt.Sprintf("%.1f%ci", v, units[i])
	}
	return fmt.Sprintf("%.0f%ci", v, units[i])
}
