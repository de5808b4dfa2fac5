// Package collectors holds the node-local health checks of nodevigil and the result type they
// share. Nothing under collectors/ imports Kubernetes API packages: a check observes the host
// (procfs, systemd over D-Bus, files, loopback HTTP) and says what it saw. Turning results into
// Node conditions, taints and Events is the agent's job, so the checks stay usable from the
// one-shot `nodevigil-agent check` command on a node whose cluster is unreachable.
package collectors

import (
	"errors"
	"time"
)

// Status is the verdict of one check. "We could not tell" (Unknown) must never be mistaken for
// either healthy or unhealthy by the consumers, and a configuration advisory (Warning) must
// never fail a node: the subsystem works, but something an operator may want to change was seen.
type Status string

const (
	// StatusHealthy means the check observed the subsystem and it is fine.
	StatusHealthy Status = "Healthy"
	// StatusWarning means the check observed the subsystem, it works, and there is a
	// configuration advisory (for example the agent's owned startup taint is not registered by
	// the kubelet although nothing requires it). It counts as healthy for Node conditions,
	// startup-taint gating and the `check` exit code (0); Reason and Message carry the advice.
	StatusWarning Status = "Warning"
	// StatusUnhealthy means the check observed the subsystem and it is not fine.
	StatusUnhealthy Status = "Unhealthy"
	// StatusUnknown means the check could not observe the subsystem (unsupported kernel,
	// unreadable file, timeout); Reason says why.
	StatusUnknown Status = "Unknown"
)

// CheckName names a check. The names are stable: they are the first column of `check`, the
// agent's metric label, the keys of the Node condition mapping and the values of the
// gatingChecks setting, so a typo in any of those is a compile error rather than a check that
// silently never gates or never reports.
type CheckName string

// The checks nodevigil has.
const (
	// CheckMemory is node memory pressure (collectors/memory).
	CheckMemory CheckName = "memory"
	// CheckKubelet is the kubelet's health: unit state, restarts, /healthz (collectors/kubelet).
	CheckKubelet CheckName = "kubelet"
	// CheckCNI is CNI readiness: conflist, plugins, the CNI agent's health (collectors/cni).
	CheckCNI CheckName = "cni"
	// CheckKubeletConfig is the kubelet's startup-taint flags (collectors/kubelet ConfigCheck).
	CheckKubeletConfig CheckName = "kubelet-config"

	// CheckSpotInterruption is a spot interruption notice in the instance metadata
	// (spot/instance-action, collectors/imds).
	CheckSpotInterruption CheckName = "spot-interruption"
	// CheckRebalanceRecommendation is an EC2 rebalance recommendation
	// (events/recommendations/rebalance, collectors/imds).
	CheckRebalanceRecommendation CheckName = "rebalance-recommendation"
	// CheckScheduledEvents is the instance's active scheduled events: reboots, retirement,
	// stop (events/maintenance/scheduled, collectors/imds).
	CheckScheduledEvents CheckName = "scheduled-events"
	// CheckASGLifecycle is the Auto Scaling target lifecycle state
	// (autoscaling/target-lifecycle-state, collectors/imds).
	CheckASGLifecycle CheckName = "asg-lifecycle"
)

// Checks returns every check name, in the order `check` prints them.
func Checks() []CheckName {
	return []CheckName{CheckMemory, CheckKubelet, CheckCNI, CheckKubeletConfig}
}

// AWSEventChecks returns the checks that report AWS-initiated events (collectors/imds), in the
// order `check` prints them. They are not health checks: a pending event says AWS is taking
// the instance away, not that the node is broken, so they never gate startup taints and what
// an event means is decided per pool by the remediator's interruptions policy.
func AWSEventChecks() []CheckName {
	return []CheckName{CheckSpotInterruption, CheckRebalanceRecommendation, CheckScheduledEvents, CheckASGLifecycle}
}

// IsAWSEvent reports whether c is one of AWSEventChecks.
func IsAWSEvent(c CheckName) bool {
	switch c {
	case CheckSpotInterruption, CheckRebalanceRecommendation, CheckScheduledEvents, CheckASGLifecycle:
		return true
	}
	return false
}

// Result is what one run of a check observed. Reason is a CamelCase machine-readable word
// (it becomes a Node condition reason); Message is for humans and carries the numbers that led
// to the verdict, so an operator reading `kubectl describe node` needs nothing else.
type Result struct {
	// Check is the name of the check that produced the result.
	Check CheckName `json:"check"`
	// Status is the verdict.
	Status Status `json:"status"`
	// Reason is a CamelCase word, stable across releases, suitable for alerts.
	Reason string `json:"reason"`
	// Message explains the verdict with the observed values.
	Message string `json:"message"`
	// Time is when the observation was made.
	Time time.Time `json:"time"`
	// Inputs lists every value the verdict was computed from and the threshold it was compared
	// with, for `nodevigil-agent check --explain`. Optional; never written to the Node.
	Inputs []Input `json:"inputs,omitempty"`
	// Disrupted is the latest time the check saw its subject down, failing or restarting,
	// including between two runs (the kubelet check follows systemd's signals). Zero when
	// never. The startup-taint stability window restarts from it. Never serialised.
	Disrupted time.Time `json:"-"`
	// Err is set when the check failed to observe (as opposed to observing a problem). It is
	// counted in the agent's error metric and logged; it is never serialised.
	Err error `json:"-"`
}

// Input is one observed value behind a verdict: what was read, from where, and what it was
// compared with. It lets an operator re-derive the verdict by hand.
type Input struct {
	// Name is a short identifier of the value ("psi.full.avg10", "MemAvailable").
	Name string `json:"name"`
	// Source is where the value was read (a file under the host root, a D-Bus property, a URL).
	Source string `json:"source,omitempty"`
	// Value is the observed value as printed for humans, with its unit.
	Value string `json:"value"`
	// Threshold is the limit the value was compared with, with the comparison
	// ("> 10%", "< 5% of MemTotal"); empty when the value is informational.
	Threshold string `json:"threshold,omitempty"`
}

// Prior is what a previous run of the agent last reported for a check (read back from the
// Node's condition), so a check that keeps state between runs (hysteresis, debouncing) can
// resume from it after a restart instead of starting from "healthy". Since is when that status
// began (the condition's lastTransitionTime).
type Prior struct {
	Status Status
	Reason string
	Since  time.Time
}

// IsHealthy reports whether s counts as healthy for conditions, gating and exit codes: Healthy
// and Warning do, Unhealthy and Unknown do not.
func (s Status) IsHealthy() bool { return s == StatusHealthy || s == StatusWarning }

// ErrNotSupported marks a check or a data source that this host cannot provide (a kernel
// without PSI, a host without systemd). Checks wrap it so callers can tell "not available
// here" apart from real failures and avoid logging or alerting on it every cycle.
var ErrNotSupported = errors.New("not supported on this host")
