// Package taints removes the startup taints the agent owns once the node is really ready.
//
// A node registers with startup taints (the agent's own
// readiness.k8s.io/nodevigil-agent-not-ready, and e.g. node.cilium.io/agent-not-ready) so no
// workload lands before it can run. Removing them too early lets pods land on a node whose
// kubelet is about to restart; never removing them leaves an autoscaler to kill the node. The
// Manager removes them only after the gating checks (kubelet and cni by default) have been
// Healthy without interruption for a stability window: any non-healthy gating result, Unknown
// included, restarts the window, so a kubelet restart during bootstrap does not release the
// node early.
//
// The Manager touches only taint keys it is configured to own. Removal is a JSON merge patch
// of spec.taints guarded by the Node's resourceVersion, retried on conflict, and idempotent
// (nothing to remove is success). Each removal is recorded as an Event on the Node.
package taints

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"

	"github.com/nodevigil/nodevigil/agent/nodepatch"
	"github.com/nodevigil/nodevigil/collectors"
)

// DefaultOwnedKey is the agent's own startup taint. The readiness.k8s.io/ prefix makes
// Karpenter treat it as an ephemeral startup taint.
const DefaultOwnedKey = "readiness.k8s.io/nodevigil-agent-not-ready"

// Event reasons recorded on the Node.
const (
	// ReasonTaintsRemoved: owned startup taints were removed (Normal).
	ReasonTaintsRemoved = "StartupTaintsRemoved"
	// ReasonTaintRemovalFailed: removing owned taints failed; it is retried next cycle (Warning).
	ReasonTaintRemovalFailed = "StartupTaintRemovalFailed"
	// ReasonTaintReadded: an owned taint was re-added because a gating check failed (Warning).
	ReasonTaintReadded = "StartupTaintReadded"
)

// Defaults.
const (
	DefaultStabilityWindow = 10 * time.Second
	DefaultRecheckInterval = 5 * time.Minute
	DefaultTimeout         = 5 * time.Second
)

// DefaultGatingChecks are the checks whose health releases the node.
var DefaultGatingChecks = []collectors.CheckName{collectors.CheckKubelet, collectors.CheckCNI}

// EventRecorder records Events on the Node. It is the subset of client-go's
// record.EventRecorder the Manager uses, so any recorder (client-go's, or the agent's own
// lighter one, package events) can be passed without this package linking an event
// broadcaster. The agent records its own Events (kubelet repair) through the same interface:
// it is declared once, here, because this package is the consumer the agent itself imports
// (package agent cannot be imported back).
type EventRecorder interface {
	Event(object runtime.Object, eventtype, reason, message string)
	Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any)
}

// Config configures a Manager. Zero values are replaced by defaults.
type Config struct {
	// Client reads and patches the Node. Required.
	Client nodepatch.NodeClient
	// NodeName is this node. Required.
	NodeName string
	// OwnedKeys are the taint keys the agent may remove (default [DefaultOwnedKey]). An empty
	// slice means the default; the agent never touches any other key.
	OwnedKeys []string
	// GatingChecks must all be Healthy for StabilityWindow (default kubelet, cni).
	GatingChecks []collectors.CheckName
	// StabilityWindow is the uninterrupted healthy time required (default 10s). Zero is
	// replaced by the default; use a negative value for "release on the first healthy cycle".
	StabilityWindow time.Duration
	// ReaddOnFailure re-adds the first owned key as a NoSchedule taint when a gating check
	// turns Unhealthy after the node was released. Unknown (could not observe) does not
	// re-add: taking a node out of scheduling needs evidence, not a blind spot.
	ReaddOnFailure bool
	// RecheckInterval is how often, after release, the Node is read again to remove owned
	// taints that came back (a re-registered Node) (default 5m).
	RecheckInterval time.Duration
	// Timeout bounds one API call (default 5s).
	Timeout time.Duration
	// StartTime is when the agent started, for the Event message (default: Clock.Now() at New).
	StartTime time.Time
	// Recorder records Events on the Node (default: discard).
	Recorder EventRecorder
	// Clock is the time source (default the real clock).
	Clock clock.PassiveClock
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Registerer receives the metrics (default a private throwaway registry).
	Registerer prometheus.Registerer
}

// Manager decides when to remove the owned startup taints. Reconcile is meant to be called
// from one goroutine after each check cycle.
type Manager struct {
	cfg      Config
	nodeRef  *v1.ObjectReference
	removals *prometheus.CounterVec
	readds   *prometheus.CounterVec

	mu sync.Mutex
	// stableSince is when the gating checks last became all Healthy; zero when they are not.
	stableSince time.Time
	// released is true once the Node was seen without owned taints after the window.
	released     bool
	lastVerified time.Time
	// failing is true after a failed removal, so the Warning Event is recorded once per outage.
	failing bool
}

// New validates cfg, fills defaults and registers the metrics.
func New(cfg Config) (*Manager, error) {
	if cfg.Client == nil {
		return nil, errors.New("taints: Client is required")
	}
	if cfg.NodeName == "" {
		return nil, errors.New("taints: NodeName is required")
	}
	if len(cfg.OwnedKeys) == 0 {
		cfg.OwnedKeys = []string{DefaultOwnedKey}
	}
	if len(cfg.GatingChecks) == 0 {
		cfg.GatingChecks = DefaultGatingChecks
	}
	if cfg.StabilityWindow == 0 {
		cfg.StabilityWindow = DefaultStabilityWindow
	}
	if cfg.StabilityWindow < 0 {
		cfg.StabilityWindow = 0
	}
	if cfg.RecheckInterval <= 0 {
		cfg.RecheckInterval = DefaultRecheckInterval
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.StartTime.IsZero() {
		cfg.StartTime = cfg.Clock.Now()
	}
	if cfg.Recorder == nil {
		cfg.Recorder = discard{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	m := &Manager{
		cfg: cfg,
		// The kubelet's own convention: a Node's events carry UID = node name, which is what
		// `kubectl describe node` searches for.
		nodeRef: &v1.ObjectReference{Kind: "Node", Name: cfg.NodeName, UID: types.UID(cfg.NodeName)},
		removals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodevigil_agent_taint_removals_total",
			Help: "Attempts to remove owned startup taints from the Node, by result (success, noop, error).",
		}, []string{"result"}),
		readds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodevigil_agent_taint_readds_total",
			Help: "Owned taints re-added after a gating check failed, by result (success, error).",
		}, []string{"result"}),
	}
	for _, c := range []prometheus.Collector{m.removals, m.readds} {
		if err := cfg.Registerer.Register(c); err != nil {
			return nil, fmt.Errorf("taints: register metrics: %w", err)
		}
	}
	for _, r := range []string{"success", "noop", "error"} {
		m.removals.WithLabelValues(r)
	}
	for _, r := range []string{"success", "error"} {
		m.readds.WithLabelValues(r)
	}
	return m, nil
}

// Released reports whether the owned taints have been removed (or were never there) after
// the gating checks became stable.
func (m *Manager) Released() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.released
}

// Reconcile advances the stability window with the latest results and removes owned taints
// when it has elapsed. A missing gating result counts as not healthy.
func (m *Manager) Reconcile(ctx context.Context, results []collectors.Result) error {
	m.mu.Lock()
	defer m.mu.Unlock()

	now := m.cfg.Clock.Now()
	healthy, unhealthy, blocking := m.gate(results)
	if !healthy {
		if !m.stableSince.IsZero() {
			m.cfg.Logger.Info("startup taint stability window reset", "node", m.cfg.NodeName, "check", blocking.Check, "reason", blocking.Reason,
				"duration", now.Sub(m.stableSince).String())
		}
		m.stableSince = time.Time{}
		if m.cfg.ReaddOnFailure && m.released && unhealthy != nil {
			return m.readd(ctx, *unhealthy)
		}
		return nil
	}
	if m.stableSince.IsZero() {
		m.stableSince = now
	}
	// A disruption a gating check saw between two runs (a kubelet restart signalled by
	// systemd over D-Bus) restarts the window from when it happened.
	if d := latestDisruption(results, m.cfg.GatingChecks); d.After(m.stableSince) && !m.released {
		m.cfg.Logger.Info("startup taint stability window reset", "node", m.cfg.NodeName, "reason", "DisruptedBetweenChecks",
			"duration", d.Sub(m.stableSince).String())
		m.stableSince = d
	}
	if now.Sub(m.stableSince) < m.cfg.StabilityWindow {
		return nil
	}
	if m.released && now.Sub(m.lastVerified) < m.cfg.RecheckInterval {
		return nil
	}
	if err := m.remove(ctx, now); err != nil {
		if errors.Is(err, errReadyFlapped) {
			return nil
		}
		return err
	}
	m.released = true
	m.lastVerified = now
	return nil
}

// gate evaluates the gating checks: all Healthy, or the first Unhealthy one (for re-adding)
// and the first non-healthy one (for logging).
func (m *Manager) gate(results []collectors.Result) (healthy bool, unhealthy *collectors.Result, blocking collectors.Result) {
	byCheck := make(map[collectors.CheckName]collectors.Result, len(results))
	for _, r := range results {
		byCheck[r.Check] = r
	}
	healthy = true
	for _, g := range m.cfg.GatingChecks {
		r, ok := byCheck[g]
		if !ok {
			r = collectors.Result{Check: g, Status: collectors.StatusUnknown, Reason: "NoResult"}
		}
		if r.Status.IsHealthy() {
			continue
		}
		if healthy {
			blocking = r
		}
		healthy = false
		if r.Status == collectors.StatusUnhealthy && unhealthy == nil {
			rr := r
			unhealthy = &rr
		}
	}
	return healthy, unhealthy, blocking
}

func (m *Manager) owned(key string) bool { return slices.Contains(m.cfg.OwnedKeys, key) }

// remove strips the owned taints from the Node, retrying on conflict.
// errReadyFlapped stops a removal because the Node's Ready condition changed within the
// window (or is not True); the window has been restarted.
var errReadyFlapped = errors.New("node Ready changed within the stability window")

// latestDisruption returns the latest Disrupted time among the gating checks' results.
func latestDisruption(results []collectors.Result, gating []collectors.CheckName) time.Time {
	var latest time.Time
	for _, r := range results {
		if slices.Contains(gating, r.Check) && r.Disrupted.After(latest) {
			latest = r.Disrupted
		}
	}
	return latest
}

// readyFlapped checks the kubelet's Ready condition before a first release: not True, or
// turned True after the window began (a flap between two checks, caught through its
// lastTransitionTime), restarts the window. A Node without Ready (no kubelet has posted
// status yet) gives no evidence either way and does not block.
func (m *Manager) readyFlapped(node *v1.Node, now time.Time) bool {
	for _, c := range node.Status.Conditions {
		if c.Type != v1.NodeReady {
			continue
		}
		switch {
		case c.Status != v1.ConditionTrue:
			m.cfg.Logger.Info("startup taint stability window reset", "node", m.cfg.NodeName, "reason", "NodeNotReady")
			m.stableSince = now
			return true
		case c.LastTransitionTime.After(m.stableSince):
			m.cfg.Logger.Info("startup taint stability window reset", "node", m.cfg.NodeName, "reason", "ReadyFlapped",
				"duration", c.LastTransitionTime.Sub(m.stableSince).String())
			m.stableSince = c.LastTransitionTime.Time
			return now.Sub(m.stableSince) < m.cfg.StabilityWindow
		}
	}
	return false
}

func (m *Manager) remove(ctx context.Context, now time.Time) error {
	var (
		removed []string
		created time.Time
	)
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
		defer cancel()
		node, err := m.cfg.Client.Get(cctx, m.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		created = node.CreationTimestamp.Time
		if !m.released && m.readyFlapped(node, now) {
			return errReadyFlapped
		}
		keep, drop := Split(node.Spec.Taints, m.owned)
		removed = drop
		if len(drop) == 0 {
			return nil
		}
		patch, err := nodepatch.Taints(node.ResourceVersion, keep)
		if err != nil {
			return err
		}
		_, err = patch.Apply(cctx, m.cfg.Client, m.cfg.NodeName)
		return err
	})
	if err != nil {
		m.removals.WithLabelValues("error").Inc()
		m.cfg.Logger.Warn("remove startup taints failed", "node", m.cfg.NodeName, "err", err)
		if !m.failing {
			m.cfg.Recorder.Eventf(m.nodeRef, v1.EventTypeWarning, ReasonTaintRemovalFailed, "Removing startup taints failed, will retry: %v", err)
		}
		m.failing = true
		return fmt.Errorf("remove startup taints from node %s: %w", m.cfg.NodeName, err)
	}
	m.failing = false
	if len(removed) == 0 {
		if !m.released {
			m.cfg.Logger.Info("no owned startup taints on node", "node", m.cfg.NodeName)
		}
		m.removals.WithLabelValues("noop").Inc()
		return nil
	}
	m.removals.WithLabelValues("success").Inc()
	sinceStart := now.Sub(m.cfg.StartTime).Round(time.Second)
	msg := fmt.Sprintf("Removed startup taints %s after %s healthy for %s; %s since agent start",
		strings.Join(removed, ", "), joinChecks(m.cfg.GatingChecks), now.Sub(m.stableSince).Round(time.Second), sinceStart)
	if !created.IsZero() {
		msg += fmt.Sprintf(", %s since node creation", now.Sub(created).Round(time.Second))
	}
	m.cfg.Logger.Info("startup taints removed", "node", m.cfg.NodeName, "taint", strings.Join(removed, ","), "duration", sinceStart.String())
	m.cfg.Recorder.Event(m.nodeRef, v1.EventTypeNormal, ReasonTaintsRemoved, msg)
	return nil
}

// readd puts the first owned key back as a NoSchedule taint, unless an owned taint is already
// there.
func (m *Manager) readd(ctx context.Context, cause collectors.Result) error {
	key := m.cfg.OwnedKeys[0]
	added := false
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
		defer cancel()
		node, err := m.cfg.Client.Get(cctx, m.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if _, drop := Split(node.Spec.Taints, m.owned); len(drop) > 0 {
			added = false
			return nil
		}
		taints := append(slices.Clone(node.Spec.Taints), v1.Taint{Key: key, Effect: v1.TaintEffectNoSchedule})
		patch, err := nodepatch.Taints(node.ResourceVersion, taints)
		if err != nil {
			return err
		}
		_, err = patch.Apply(cctx, m.cfg.Client, m.cfg.NodeName)
		added = err == nil
		return err
	})
	if err != nil {
		m.readds.WithLabelValues("error").Inc()
		m.cfg.Logger.Warn("re-add startup taint failed", "node", m.cfg.NodeName, "taint", key, "err", err)
		return fmt.Errorf("re-add taint %s to node %s: %w", key, m.cfg.NodeName, err)
	}
	m.released = false
	if added {
		m.readds.WithLabelValues("success").Inc()
		m.cfg.Logger.Warn("startup taint re-added", "node", m.cfg.NodeName, "taint", key, "check", cause.Check, "reason", cause.Reason)
		m.cfg.Recorder.Eventf(m.nodeRef, v1.EventTypeWarning, ReasonTaintReadded, "Re-added taint %s:NoSchedule because check %s is unhealthy (%s)", key, cause.Check, cause.Reason)
	}
	return nil
}

// discard is the default EventRecorder: it drops every Event.
type discard struct{}

func (discard) Event(runtime.Object, string, string, string)          {}
func (discard) Eventf(runtime.Object, string, string, string, ...any) {}

// Split partitions taints into those to keep and the keys of those owned. It never
// reorders the kept taints.
func Split(taints []v1.Taint, owned func(key string) bool) (keep []v1.Taint, removed []string) {
	keep = make([]v1.Taint, 0, len(taints))
	for _, t := range taints {
		if owned(t.Key) {
			removed = append(removed, t.Key)
			continue
		}
		keep = append(keep, t)
	}
	return keep, removed
}

// TaintsPatch returns the body of the JSON merge patch that sets spec.taints to taints,
// guarded by resourceVersion (nodepatch.Taints).
func TaintsPatch(resourceVersion string, taints []v1.Taint) ([]byte, error) {
	p, err := nodepatch.Taints(resourceVersion, taints)
	return p.Body, err
}

func joinChecks(cs []collectors.CheckName) string {
	s := make([]string, len(cs))
	for i, c := range cs {
		s[i] = string(c)
	}
	return strings.Join(s, ", ")
}
