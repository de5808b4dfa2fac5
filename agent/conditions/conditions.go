// Package conditions publishes the agent's check results as Node conditions.
//
// The agent owns a fixed set of condition types, all of positive polarity (True = healthy) so
// they read like the kubelet's Ready and can be consumed unchanged by Karpenter's and EKS's
// node repair policies (NetworkingReady is the EKS node monitoring agent's name for the same
// meaning). It writes nothing else: the kubelet-owned conditions (Ready, MemoryPressure,
// DiskPressure, PIDPressure, NetworkUnavailable) are never part of a patch.
//
// Writes are cheap on the API server: a strategic-merge patch of nodes/status carrying only
// the agent's types (conditions merge by type), sent only when a status or reason changes, plus
// a slow heartbeat that refreshes LastHeartbeatTime and carries message-only changes. After a
// restart the Manager reads the Node first and adopts what is there, so LastTransitionTime
// survives restarts and an unchanged node causes no write at all.
package conditions

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/nodevigil/nodevigil/agent/nodepatch"
	"github.com/nodevigil/nodevigil/collectors"
)

// The condition types the agent owns, one per check.
const (
	// TypeMemoryHealthy reports the "memory" check (PSI and available memory).
	TypeMemoryHealthy v1.NodeConditionType = "MemoryHealthy"
	// TypeKubeletHealthy reports the "kubelet" check (unit state, restarts, /healthz).
	TypeKubeletHealthy v1.NodeConditionType = "KubeletHealthy"
	// TypeNetworkingReady reports the "cni" check; the name is the EKS node monitoring agent's.
	TypeNetworkingReady v1.NodeConditionType = "NetworkingReady"
	// TypeKubeletConfigValid reports the "kubelet-config" check (startup taints registered).
	TypeKubeletConfigValid v1.NodeConditionType = "KubeletConfigValid"

	// The AWS event conditions (collectors/imds), True while no event of the kind is pending,
	// False with the event code as reason while one is, Unknown when the metadata service
	// cannot be read. They report what AWS decided, not a node fault: the remediator's
	// per-pool interruptions policy decides what each means (docs/interruptions.md).

	// TypeNoSpotInterruption reports the "spot-interruption" check (spot/instance-action).
	TypeNoSpotInterruption v1.NodeConditionType = "NoSpotInterruption"
	// TypeNoRebalanceRecommendation reports the "rebalance-recommendation" check.
	TypeNoRebalanceRecommendation v1.NodeConditionType = "NoRebalanceRecommendation"
	// TypeNoScheduledEvent reports the "scheduled-events" check (events/maintenance/scheduled).
	TypeNoScheduledEvent v1.NodeConditionType = "NoScheduledEvent"
	// TypeNoASGTermination reports the "asg-lifecycle" check (autoscaling/target-lifecycle-state).
	TypeNoASGTermination v1.NodeConditionType = "NoASGTermination"
)

var checkTypes = map[collectors.CheckName]v1.NodeConditionType{
	collectors.CheckMemory:        TypeMemoryHealthy,
	collectors.CheckKubelet:       TypeKubeletHealthy,
	collectors.CheckCNI:           TypeNetworkingReady,
	collectors.CheckKubeletConfig: TypeKubeletConfigValid,

	collectors.CheckSpotInterruption:        TypeNoSpotInterruption,
	collectors.CheckRebalanceRecommendation: TypeNoRebalanceRecommendation,
	collectors.CheckScheduledEvents:         TypeNoScheduledEvent,
	collectors.CheckASGLifecycle:            TypeNoASGTermination,
}

// TypeForCheck returns the condition type a check is published as, and false for a check the
// agent does not publish.
func TypeForCheck(check collectors.CheckName) (v1.NodeConditionType, bool) {
	t, ok := checkTypes[check]
	return t, ok
}

// OwnedTypes returns the condition types the agent owns, sorted. Nothing outside this list is
// ever written.
func OwnedTypes() []v1.NodeConditionType {
	out := make([]v1.NodeConditionType, 0, len(checkTypes))
	for _, t := range checkTypes {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// IsOwned reports whether t is one of the agent's condition types.
func IsOwned(t v1.NodeConditionType) bool {
	for _, o := range checkTypes {
		if o == t {
			return true
		}
	}
	return false
}

// StatusFor maps a check verdict onto a condition status (positive polarity).
func StatusFor(s collectors.Status) v1.ConditionStatus {
	switch s {
	case collectors.StatusHealthy, collectors.StatusWarning:
		return v1.ConditionTrue
	case collectors.StatusUnhealthy:
		return v1.ConditionFalse
	default:
		return v1.ConditionUnknown
	}
}

// CheckStatusFor maps a condition status back onto a check verdict (the inverse of StatusFor,
// Warning folding into Healthy), for seeding checks from the conditions a previous agent wrote.
func CheckStatusFor(s v1.ConditionStatus) collectors.Status {
	switch s {
	case v1.ConditionTrue:
		return collectors.StatusHealthy
	case v1.ConditionFalse:
		return collectors.StatusUnhealthy
	default:
		return collectors.StatusUnknown
	}
}

// MaxMessageLength bounds a condition message so a verbose check cannot bloat the Node object
// every watcher of Nodes in the cluster receives.
const MaxMessageLength = 1024

// Defaults.
const (
	DefaultHeartbeatPeriod = 5 * time.Minute
	DefaultTimeout         = 5 * time.Second
	DefaultInitialBackoff  = 10 * time.Second
	DefaultMaxBackoff      = 30 * time.Second
)

// Config configures a Manager. Zero values are replaced by defaults.
type Config struct {
	// Client reads the Node and patches nodes/status. Required.
	Client nodepatch.NodeClient
	// NodeName is the Node to write. Required.
	NodeName string
	// HeartbeatPeriod is how often unchanged conditions are re-written (default 5m).
	HeartbeatPeriod time.Duration
	// Timeout bounds each API call (default 5s).
	Timeout time.Duration
	// InitialBackoff and MaxBackoff space out retries after a failed read or patch
	// (defaults 10s and 30s): the first retry happens on the first Sync after
	// InitialBackoff, and a recovered API server sees the current state within MaxBackoff.
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	// Clock is the time source (default the real clock).
	Clock clock.PassiveClock
	// Logger logs patches and failures (default slog.Default()).
	Logger *slog.Logger
	// Registerer receives the manager's metrics (default a private throwaway registry).
	Registerer prometheus.Registerer
}

// Manager keeps the agent's Node conditions in line with the latest check results. It is safe
// for concurrent use, though the agent calls Sync from one goroutine.
type Manager struct {
	cfg     Config
	patches *prometheus.CounterVec

	mu sync.Mutex
	// adopted is true once the Node's existing conditions have been read.
	adopted bool
	// desired is what should be on the Node, with LastTransitionTime tracking our own status
	// changes. written is what was last written (or adopted), for change detection.
	desired map[v1.NodeConditionType]v1.NodeCondition
	written map[v1.NodeConditionType]v1.NodeCondition
	// lastWrite is when the last successful patch happened (or the adopted heartbeat time).
	lastWrite time.Time
	// failures counts consecutive failures; retryAt is when the next attempt is allowed.
	failures int
	retryAt  time.Time
	reported bool
}

// New validates cfg, fills defaults and registers the metrics.
func New(cfg Config) (*Manager, error) {
	if cfg.Client == nil {
		return nil, errors.New("conditions: Client is required")
	}
	if cfg.NodeName == "" {
		return nil, errors.New("conditions: NodeName is required")
	}
	if cfg.HeartbeatPeriod <= 0 {
		cfg.HeartbeatPeriod = DefaultHeartbeatPeriod
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.InitialBackoff <= 0 {
		cfg.InitialBackoff = DefaultInitialBackoff
	}
	if cfg.MaxBackoff < cfg.InitialBackoff {
		cfg.MaxBackoff = max(DefaultMaxBackoff, cfg.InitialBackoff)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	m := &Manager{
		cfg: cfg,
		patches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodevigil_agent_condition_patches_total",
			Help: "Patches of the agent's Node conditions, by result (success, error).",
		}, []string{"result"}),
		desired: map[v1.NodeConditionType]v1.NodeCondition{},
		written: map[v1.NodeConditionType]v1.NodeCondition{},
	}
	if err := cfg.Registerer.Register(m.patches); err != nil {
		return nil, fmt.Errorf("conditions: register metrics: %w", err)
	}
	for _, r := range []string{"success", "error"} {
		m.patches.WithLabelValues(r)
	}
	return m, nil
}

// Reported reports whether at least one patch has succeeded (or the Node already carried
// conditions identical to the results at adoption): the agent's readiness signal.
func (m *Manager) Reported() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reported
}

// Sync folds results into the desired conditions and patches the Node when a status or reason
// changed, a type is missing from the Node, or the heartbeat is due. Results of checks that do
// not map to an owned type are ignored. After a failure, Sync does nothing until the backoff
// expires and returns nil in the meantime; the error of an attempted read or patch is returned.
func (m *Manager) Sync(ctx context.Context, results []collectors.Result) error {
	m.mu.Lock()
	defer m.mu.Unlock()

	now := m.cfg.Clock.Now()
	if m.failures > 0 && now.Before(m.retryAt) {
		if m.adopted {
			m.fold(results, now)
		}
		return nil
	}
	if !m.adopted {
		if err := m.adopt(ctx); err != nil {
			m.fail(now)
			return err
		}
	}
	m.fold(results, now)
	if !m.needsPatch(now) {
		// The Node already shows these results (adopted after a restart, or written before).
		if len(results) > 0 {
			m.reported = true
		}
		return nil
	}
	conds := m.patchConditions(now)
	if len(conds) == 0 {
		return nil
	}
	patch, err := buildPatch(conds)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	defer cancel()
	_, err = patch.Apply(cctx, m.cfg.Client, m.cfg.NodeName)
	if err != nil {
		m.patches.WithLabelValues("error").Inc()
		m.fail(now)
		m.cfg.Logger.Warn("patch node conditions failed", "node", m.cfg.NodeName, "attempt", m.failures, "err", err)
		return fmt.Errorf("patch conditions of node %s: %w", m.cfg.NodeName, err)
	}
	m.patches.WithLabelValues("success").Inc()
	for _, c := range conds {
		if prev, ok := m.written[c.Type]; !ok || prev.Status != c.Status || prev.Reason != c.Reason {
			m.cfg.Logger.Info("node condition changed", "node", m.cfg.NodeName, "condition", string(c.Type), "status", string(c.Status), "reason", c.Reason)
		}
		m.written[c.Type] = c
	}
	m.lastWrite = now
	m.failures = 0
	m.reported = true
	return nil
}

// adopt reads the Node and seeds both the desired and the written state with the agent's
// conditions already there, so a restart keeps their LastTransitionTime and, when nothing
// changed, writes nothing until the heartbeat is due.
func (m *Manager) adopt(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	defer cancel()
	node, err := m.cfg.Client.Get(cctx, m.cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		m.cfg.Logger.Warn("read node conditions failed", "node", m.cfg.NodeName, "err", err)
		return fmt.Errorf("read node %s: %w", m.cfg.NodeName, err)
	}
	var oldest time.Time
	for _, c := range node.Status.Conditions {
		if !IsOwned(c.Type) {
			continue
		}
		m.desired[c.Type] = c
		m.written[c.Type] = c
		if hb := c.LastHeartbeatTime.Time; oldest.IsZero() || hb.Before(oldest) {
			oldest = hb
		}
	}
	// The heartbeat is due relative to the stalest adopted condition.
	m.lastWrite = oldest
	m.adopted = true
	return nil
}

// fold turns results into desired conditions; LastTransitionTime moves only when the status
// changes.
func (m *Manager) fold(results []collectors.Result, now time.Time) {
	for _, r := range results {
		t, ok := TypeForCheck(r.Check)
		if !ok {
			continue
		}
		status := StatusFor(r.Status)
		reason := r.Reason
		if reason == "" {
			reason = string(r.Status)
		}
		if reason == "" {
			reason = "Unknown"
		}
		c := v1.NodeCondition{
			Type:               t,
			Status:             status,
			Reason:             reason,
			Message:            truncate(r.Message, MaxMessageLength),
			LastTransitionTime: metav1.NewTime(now),
		}
		if prev, ok := m.desired[t]; ok {
			c.LastHeartbeatTime = prev.LastHeartbeatTime
			if prev.Status == status {
				c.LastTransitionTime = prev.LastTransitionTime
			}
		}
		m.desired[t] = c
	}
}

// needsPatch reports whether a desired condition differs from the written one in status or
// reason (or is missing), or the heartbeat is due.
func (m *Manager) needsPatch(now time.Time) bool {
	if len(m.desired) == 0 {
		return false
	}
	for t, d := range m.desired {
		w, ok := m.written[t]
		if !ok || w.Status != d.Status || w.Reason != d.Reason {
			return true
		}
	}
	return now.Sub(m.lastWrite) >= m.cfg.HeartbeatPeriod
}

// patchConditions returns every desired condition, stamped with the heartbeat time, in a
// stable order.
func (m *Manager) patchConditions(now time.Time) []v1.NodeCondition {
	out := make([]v1.NodeCondition, 0, len(m.desired))
	for _, t := range OwnedTypes() {
		c, ok := m.desired[t]
		if !ok {
			continue
		}
		c.LastHeartbeatTime = metav1.NewTime(now)
		out = append(out, c)
	}
	return out
}

func (m *Manager) fail(now time.Time) {
	m.failures++
	backoff := m.cfg.InitialBackoff
	for i := 1; i < m.failures && backoff < m.cfg.MaxBackoff; i++ {
		backoff *= 2
	}
	m.retryAt = now.Add(min(backoff, m.cfg.MaxBackoff))
}

// BuildPatch returns the body of the strategic-merge patch of nodes/status that sets exactly
// conds (nodepatch.Conditions). Conditions of types the agent does not own are refused, so a
// bug elsewhere cannot overwrite the kubelet's Ready.
func BuildPatch(conds []v1.NodeCondition) ([]byte, error) {
	p, err := buildPatch(conds)
	return p.Body, err
}

func buildPatch(conds []v1.NodeCondition) (nodepatch.Patch, error) {
	for _, c := range conds {
		if !IsOwned(c.Type) {
			return nodepatch.Patch{}, fmt.Errorf("conditions: refusing to patch condition type %q the agent does not own", c.Type)
		}
	}
	return nodepatch.Conditions(conds)
}

// PatchType is the patch type BuildPatch's body is meant for.
const PatchType = types.StrategicMergePatchType

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
