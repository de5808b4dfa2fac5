// Package decide is the remediator's judgement, as one pure function: given a Node, its
// kubelet's Lease, its agent's Lease, the policy that applies and the time, Decide says whether
// to do nothing, wait, remediate or release the node, why, and when to look again.
//
// It implements the two-signal liveness model of the design brief (§3):
//
//	agent Lease  kubelet Lease / Ready   verdict                   action
//	fresh        fresh / True            Healthy                   none
//	fresh        stale / Unknown         KubeletUnhealthy          remediate after tolerations.kubeletUnhealthy
//	             (or agent reports KubeletHealthy=False)           (the agent repairs locally meanwhile)
//	stale        fresh / True            AgentSilent               never remediate; event + metric
//	stale        stale / Unknown         NodeSilent                remediate after tolerations.silentNode
//	never seen   any                     StartupGrace/AgentNotSeen wait; only the startup deadline applies
//	                                     StartupDeadlineExceeded   remediate, unless the node is serving
//	fresh        agent condition False   ConditionUnhealthy        remediate after tolerations.conditions[type]
//	fresh        startup taint kept      StartupDeadlineExceeded   remediate once the startup deadline passed
//
// A Lease is fresh while now is before renewTime + leaseDurationSeconds. The kubelet's signal
// is its Lease when there is one; without a Lease, Ready=Unknown is the kubelet's silence.
//
// Every toleration is measured from the earliest moment its evidence was corroborated and the
// node is requeued for exactly the moment it expires:
//   - NodeSilent runs from the later of the two Lease expiries: only from then on have both
//     independent heartbeats been missing. Ready's LastTransitionTime is not used: the node
//     lifecycle controller sets it 10 s after the kubelet Lease expires, adding nothing but delay.
//   - KubeletUnhealthy runs from the earliest of the kubelet Lease expiry and the
//     LastTransitionTime of the agent's KubeletHealthy=False: either is enough while the agent
//     itself is alive, because the agent is on the machine and sees the kubelet directly.
//   - ConditionUnhealthy runs from the condition's LastTransitionTime. Only False counts:
//     Unknown means the agent could not tell, which is never evidence of ill health. A
//     condition with no LastTransitionTime cannot be measured and is ignored.
//
// Gates applied after the verdict: the do-not-remediate annotation (never act); a policy whose
// action is None (report only); the startup grace (no remediation of a node younger than
// startupGrace, except for the startup deadline itself); and the leader's observe period (a new
// leader judges nothing stale during its first ObservePeriod). A node already past the point of
// no return (termination requested) is always driven to the end; a node earlier in the
// pipeline whose verdict no longer calls for remediation is released.
//
// A node whose agent was never seen is booting: nothing applies until its startup deadline.
// Past it, the node is replaced (StartupDeadlineExceeded) unless it is demonstrably serving —
// Ready=True, a live kubelet and none of the policy's startup taints — in which case only the
// agent is missing (AgentNeverSeen) and, as with AgentSilent, that alone never kills a node. So
// installing nodevigil on a running cluster never condemns the nodes that predate it. Without
// an agent the kubelet's signal stands alone, so it must have persisted for the kubelet-unhealthy
// toleration as well.
package decide

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/nodevigil/nodevigil/remediation/config"
)

// Action is what the controller should do with the node now.
type Action string

const (
	// ActionNone: nothing to do; the node is healthy or must not be touched.
	ActionNone Action = "None"
	// ActionWait: something is wrong but not for long enough (or a gate holds); look again
	// after RequeueAfter.
	ActionWait Action = "Wait"
	// ActionRemediate: run (or resume) the pipeline the policy allows.
	ActionRemediate Action = "Remediate"
	// ActionRelease: the node carries a remediation record from before the termination
	// request but no longer needs remediation; uncordon it and remove the record.
	ActionRelease Action = "Release"
)

// Reasons. They are CamelCase, stable, used as Event reasons and as the outcome label of
// nodevigil_remediator_decisions_total, so the set is closed.
const (
	ReasonHealthy                 = "Healthy"
	ReasonKubeletUnhealthy        = "KubeletUnhealthy"
	ReasonAgentSilent             = "AgentSilent"
	ReasonNodeSilent              = "NodeSilent"
	ReasonConditionUnhealthy      = "ConditionUnhealthy"
	ReasonStartupGrace            = "StartupGrace"
	ReasonAgentNotSeen            = "AgentNotSeen"
	ReasonAgentNeverSeen          = "AgentNeverSeen"
	ReasonStartupDeadlineExceeded = "StartupDeadlineExceeded"
	ReasonDoNotRemediate          = "DoNotRemediate"
	ReasonRemediationDisabled     = "RemediationDisabled"
	ReasonLeaderObserving         = "LeaderObserving"
	ReasonTerminationInProgress   = "TerminationInProgress"
	ReasonNodeGone                = "NodeGone"
)

// Reasons lists every reason Decide can return, for pre-initialising metrics.
var Reasons = []string{
	ReasonHealthy, ReasonKubeletUnhealthy, ReasonAgentSilent, ReasonNodeSilent, ReasonConditionUnhealthy,
	ReasonStartupGrace, ReasonAgentNotSeen, ReasonAgentNeverSeen, ReasonStartupDeadlineExceeded,
	ReasonDoNotRemediate, ReasonRemediationDisabled, ReasonLeaderObserving, ReasonTerminationInProgress,
	ReasonNodeGone,
}

// DefaultKubeletLeaseDuration is the kubelet's Lease duration, used when a kubelet Lease does
// not state its own.
const DefaultKubeletLeaseDuration = 40 * time.Second

// Input is everything a decision depends on. Decide reads nothing else: no clock, no cache.
type Input struct {
	// Node is the node judged (informer-stripped is fine: labels, annotations, spec and
	// conditions are read).
	Node *corev1.Node
	// KubeletLease is the node's Lease in kube-node-lease, nil if there is none.
	KubeletLease *coordinationv1.Lease
	// AgentLease is the node's nodevigil agent Lease, nil if the agent was never seen.
	AgentLease *coordinationv1.Lease
	// Policy is the policy selected for the node; nil means the built-in default.
	Policy *config.Policy
	// Now is the decision time.
	Now time.Time
	// ObservingSince is when this replica became leader (or started, without election).
	ObservingSince time.Time
	// ObservePeriod is how long a new leader waits before judging anything stale: at least one
	// agent Lease duration, so every live agent has renewed at least once while watched.
	ObservePeriod time.Duration
	// AgentLeaseDuration is used for agent Leases without spec.leaseDurationSeconds.
	AgentLeaseDuration time.Duration
}

// Decision is the outcome of Decide.
type Decision struct {
	// Action is what to do now.
	Action Action
	// Reason is a CamelCase word from the Reason* constants.
	Reason string
	// Message explains the decision with the times that led to it, for Events and logs.
	Message string
	// RequeueAfter is when the decision may change by the passing of time alone (a Lease
	// expiring, a toleration or a gate ending); zero means only a new observation can change
	// it.
	RequeueAfter time.Duration
	// Since is when the problem began as judged: a Lease expiry, a condition's transition, the
	// node's creation. Zero for a healthy node. It feeds the detection latency metric.
	Since time.Time
	// EligibleAt is when the toleration ends (or ended). Zero when no toleration runs.
	EligibleAt time.Time
	// Unhealthy marks a node counted against the pool's maxUnhealthy: any verdict that leads
	// to remediation once its toleration runs out.
	Unhealthy bool
	// Silent marks a node at least one of whose heartbeats (agent or kubelet) is stale; the
	// zone and cluster pause thresholds count these.
	Silent bool
}

var defaultPolicy = func() *config.Policy {
	c := config.Default()
	return &c.Policies[len(c.Policies)-1]
}()

// Decide judges one node. It is pure: the same Input always gives the same Decision.
func Decide(in Input) Decision {
	if in.Node == nil {
		return Decision{Action: ActionNone, Reason: ReasonNodeGone, Message: "node no longer exists"}
	}
	if in.Policy == nil {
		in.Policy = defaultPolicy
	}
	node, now := in.Node, in.Now
	phase := PhaseOf(node)
	v := verdict(in)

	if phase.PastPointOfNoReturn() {
		d := v
		d.Action, d.Reason, d.RequeueAfter = ActionRemediate, ReasonTerminationInProgress, 0
		d.Unhealthy = true
		d.Message = fmt.Sprintf("termination already requested (state %s, started for %s under policy %s); finishing it",
			phase, orUnknown(node.Annotations[AnnotationReason]), orUnknown(node.Annotations[AnnotationPolicy]))
		return d
	}

	release := func(d Decision) Decision {
		if phase.Releasable() {
			d.Action = ActionRelease
			d.Message = fmt.Sprintf("releasing node (state %s): %s", phase, d.Message)
		}
		return d
	}

	if DoNotRemediate(node) {
		d := v
		d.Action, d.Reason = ActionNone, ReasonDoNotRemediate
		d.Message = fmt.Sprintf("annotation %s is set; not remediating (verdict %s: %s)", AnnotationDoNotRemediate, v.Reason, v.Message)
		return release(d)
	}
	if in.Policy.Action == config.ActionNone && (v.Action == ActionWait || v.Action == ActionRemediate) && v.Unhealthy {
		d := v
		d.Action, d.Reason = ActionNone, ReasonRemediationDisabled
		d.Message = fmt.Sprintf("policy %s has action None; not remediating (verdict %s: %s)", in.Policy.Name, v.Reason, v.Message)
		return release(d)
	}
	if v.Action != ActionRemediate {
		return release(v)
	}

	// The verdict calls for remediation; the gates decide whether it may happen now.
	var notBefore time.Time
	gate, why := "", ""
	if v.Reason != ReasonStartupDeadlineExceeded {
		if end := node.CreationTimestamp.Add(in.Policy.StartupGrace); now.Before(end) {
			notBefore, gate = end, ReasonStartupGrace
			why = fmt.Sprintf("node created %s is within its startup grace of %s (until %s)", ts(node.CreationTimestamp.Time), in.Policy.StartupGrace, ts(end))
		}
	}
	if end := in.ObservingSince.Add(in.ObservePeriod); now.Before(end) && end.After(notBefore) {
		notBefore, gate = end, ReasonLeaderObserving
		why = fmt.Sprintf("leader observing since %s for %s before judging anything stale (until %s)", ts(in.ObservingSince), in.ObservePeriod, ts(end))
	}
	if gate != "" {
		d := v
		d.Action, d.Reason, d.RequeueAfter = ActionWait, gate, notBefore.Sub(now)
		d.Message = fmt.Sprintf("%s; then %s: %s", why, v.Reason, v.Message)
		return d
	}
	return v
}

// signal is one heartbeat's state at the decision time.
type signal struct {
	known bool      // there is any evidence about this heartbeat
	stale bool      // the heartbeat has stopped
	at    time.Time // fresh: when it would go stale (zero if it cannot); stale: since when
	what  string    // human description for messages
}

func leaseSignal(l *coordinationv1.Lease, fallback time.Duration, now time.Time, who string) signal {
	renew := l.CreationTimestamp.Time
	switch {
	case l.Spec.RenewTime != nil:
		renew = l.Spec.RenewTime.Time
	case l.Spec.AcquireTime != nil:
		renew = l.Spec.AcquireTime.Time
	}
	dur := fallback
	if l.Spec.LeaseDurationSeconds != nil && *l.Spec.LeaseDurationSeconds > 0 {
		dur = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	exp := renew.Add(dur)
	s := signal{known: true, stale: !now.Before(exp), at: exp}
	if s.stale {
		s.what = fmt.Sprintf("%s lease expired at %s (renewed %s, duration %s)", who, ts(exp), ts(renew), dur)
	} else {
		s.what = fmt.Sprintf("%s lease fresh until %s", who, ts(exp))
	}
	return s
}

func kubeletSignal(in Input) signal {
	if in.KubeletLease != nil {
		return leaseSignal(in.KubeletLease, DefaultKubeletLeaseDuration, in.Now, "kubelet")
	}
	ready := condition(in.Node, corev1.NodeReady)
	switch {
	case ready == nil:
		return signal{what: "kubelet has no lease and no Ready condition"}
	case ready.Status == corev1.ConditionUnknown:
		since := ready.LastTransitionTime.Time
		if since.IsZero() {
			since = in.Node.CreationTimestamp.Time
		}
		return signal{known: true, stale: true, at: since, what: fmt.Sprintf("kubelet has no lease and Ready=Unknown since %s (%s)", ts(since), ready.Reason)}
	default:
		return signal{known: true, what: fmt.Sprintf("kubelet has no lease but posts Ready=%s", ready.Status)}
	}
}

// verdict is the health judgement before any gate.
func verdict(in Input) Decision {
	now, node, tol := in.Now, in.Node, in.Policy.Tolerations
	kub := kubeletSignal(in)
	if in.AgentLease == nil {
		return neverSeen(in, kub)
	}
	agentDur := in.AgentLeaseDuration
	if agentDur <= 0 {
		agentDur = config.DefaultAgentLeaseDuration
	}
	ag := leaseSignal(in.AgentLease, agentDur, now, "agent")

	if ag.stale {
		if !kub.stale {
			// The machine answers through its kubelet: only the agent is broken. Never act.
			return Decision{
				Action:       ActionNone,
				Reason:       ReasonAgentSilent,
				Message:      fmt.Sprintf("%s but %s: only the agent is broken; never remediated", ag.what, kub.what),
				RequeueAfter: until(now, kub.at),
				Since:        ag.at,
				Silent:       true,
			}
		}
		since := later(ag.at, kub.at)
		return due(Decision{
			Reason:     ReasonNodeSilent,
			Message:    fmt.Sprintf("%s and %s: both heartbeats silent since %s; silentNode toleration %s", ag.what, kub.what, ts(since), tol.SilentNode),
			Since:      since,
			EligibleAt: since.Add(tol.SilentNode),
			Unhealthy:  true,
			Silent:     true,
		}, now)
	}

	// The agent is alive, so its conditions are current.
	var cands []Decision
	var kubSince time.Time
	var evidence []string
	if kub.stale {
		kubSince = kub.at
		evidence = append(evidence, kub.what)
	}
	if c := condition(node, ConditionKubeletHealthy); c != nil && c.Status == corev1.ConditionFalse && !c.LastTransitionTime.IsZero() {
		if kubSince.IsZero() || c.LastTransitionTime.Time.Before(kubSince) {
			kubSince = c.LastTransitionTime.Time
		}
		evidence = append(evidence, fmt.Sprintf("agent reports KubeletHealthy=False since %s (%s: %s)", ts(c.LastTransitionTime.Time), c.Reason, c.Message))
	}
	if !kubSince.IsZero() {
		cands = append(cands, Decision{
			Reason:     ReasonKubeletUnhealthy,
			Message:    fmt.Sprintf("%s while %s; kubeletUnhealthy toleration %s from %s", strings.Join(evidence, " and "), ag.what, tol.KubeletUnhealthy, ts(kubSince)),
			Since:      kubSince,
			EligibleAt: kubSince.Add(tol.KubeletUnhealthy),
		})
	}
	for _, typ := range sortedKeys(tol.Conditions) {
		c := condition(node, corev1.NodeConditionType(typ))
		if c == nil || c.Status != corev1.ConditionFalse || c.LastTransitionTime.IsZero() {
			continue
		}
		since := c.LastTransitionTime.Time
		cands = append(cands, Decision{
			Reason:     ReasonConditionUnhealthy,
			Message:    fmt.Sprintf("%s=False since %s (%s: %s); toleration %s", typ, ts(since), c.Reason, c.Message, tol.Conditions[typ]),
			Since:      since,
			EligibleAt: since.Add(tol.Conditions[typ]),
		})
	}

	// A node whose agent is alive but never declared it ready still carries a startup taint.
	// Past the startup deadline it is replaced: a stuck startup taint is never left forever.
	// Before the deadline it is just booting and counts as nothing.
	var startupDeadline time.Time
	if taint := startupTaint(node, in.Policy.StartupTaints); taint != "" {
		created := node.CreationTimestamp.Time
		deadline := created.Add(in.Policy.StartupDeadline)
		if now.Before(deadline) {
			startupDeadline = deadline
		} else {
			cands = append(cands, Decision{
				Reason:     ReasonStartupDeadlineExceeded,
				Message:    fmt.Sprintf("%s but the node still carries startup taint %s: it never became ready; startup deadline %s passed at %s", ag.what, taint, in.Policy.StartupDeadline, ts(deadline)),
				Since:      created,
				EligibleAt: deadline,
			})
		}
	}

	// Whatever the verdict, look again when a fresh heartbeat could expire or the startup
	// deadline arrives.
	next := ag.at
	if kub.known && !kub.stale && !kub.at.IsZero() && kub.at.Before(next) {
		next = kub.at
	}
	if !startupDeadline.IsZero() && startupDeadline.Before(next) {
		next = startupDeadline
	}
	if len(cands) == 0 {
		return Decision{
			Action:       ActionNone,
			Reason:       ReasonHealthy,
			Message:      fmt.Sprintf("%s; %s", ag.what, kub.what),
			RequeueAfter: until(now, next),
		}
	}
	best := cands[0]
	for _, c := range cands[1:] {
		if c.EligibleAt.Before(best.EligibleAt) {
			best = c
		}
	}
	best.Unhealthy, best.Silent = true, kub.stale
	d := due(best, now)
	if d.Action == ActionWait {
		d.RequeueAfter = min(d.RequeueAfter, until(now, next))
	}
	return d
}

// neverSeen judges a node whose agent Lease does not exist.
func neverSeen(in Input, kub signal) Decision {
	now, node, p := in.Now, in.Node, in.Policy
	created := node.CreationTimestamp.Time
	graceEnd, deadline := created.Add(p.StartupGrace), created.Add(p.StartupDeadline)
	switch {
	case now.Before(graceEnd):
		return Decision{
			Action:       ActionWait,
			Reason:       ReasonStartupGrace,
			Message:      fmt.Sprintf("agent not seen yet; node created %s is within its startup grace of %s", ts(created), p.StartupGrace),
			RequeueAfter: graceEnd.Sub(now),
			Silent:       kub.stale,
		}
	case now.Before(deadline):
		return Decision{
			Action:       ActionWait,
			Reason:       ReasonAgentNotSeen,
			Message:      fmt.Sprintf("agent not seen yet; node created %s has until its startup deadline %s", ts(created), ts(deadline)),
			RequeueAfter: deadline.Sub(now),
			Silent:       kub.stale,
		}
	}

	ready := condition(node, corev1.NodeReady)
	taint := startupTaint(node, p.StartupTaints)
	if taint == "" && ready != nil && ready.Status == corev1.ConditionTrue && !kub.stale {
		return Decision{
			Action:       ActionNone,
			Reason:       ReasonAgentNeverSeen,
			Message:      fmt.Sprintf("agent never seen since the node was created %s, but the node is Ready and %s: only the agent is missing; never remediated", ts(created), kub.what),
			RequeueAfter: until(now, kub.at),
		}
	}

	// Not serving: find since when, from the earliest evidence still present.
	var since time.Time
	var evidence []string
	add := func(t time.Time, what string) {
		if since.IsZero() || t.Before(since) {
			since = t
		}
		evidence = append(evidence, what)
	}
	if taint != "" {
		add(created, fmt.Sprintf("still carries startup taint %s", taint))
	}
	if kub.stale {
		add(kub.at, kub.what)
	}
	switch {
	case ready == nil:
		add(created, "has no Ready condition")
	case ready.Status != corev1.ConditionTrue:
		t := ready.LastTransitionTime.Time
		if t.IsZero() {
			t = created
		}
		add(t, fmt.Sprintf("Ready=%s since %s (%s)", ready.Status, ts(t), ready.Reason))
	}
	eligible := later(deadline, since.Add(p.Tolerations.KubeletUnhealthy))
	return due(Decision{
		Reason: ReasonStartupDeadlineExceeded,
		Message: fmt.Sprintf("agent never seen and the node %s; startup deadline %s passed at %s (eligible %s)",
			strings.Join(evidence, " and "), p.StartupDeadline, ts(deadline), ts(eligible)),
		Since:      since,
		EligibleAt: eligible,
		Unhealthy:  true,
		Silent:     kub.stale,
	}, now)
}

// due turns a verdict with a toleration into Remediate once EligibleAt is reached, else Wait
// until then.
func due(d Decision, now time.Time) Decision {
	if now.Before(d.EligibleAt) {
		d.Action, d.RequeueAfter = ActionWait, d.EligibleAt.Sub(now)
		return d
	}
	d.Action, d.RequeueAfter = ActionRemediate, 0
	return d
}

func condition(node *corev1.Node, t corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == t {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}

func startupTaint(node *corev1.Node, keys []string) string {
	for _, t := range node.Spec.Taints {
		for _, k := range keys {
			if t.Key == k {
				return k
			}
		}
	}
	return ""
}

func until(now, t time.Time) time.Duration {
	if t.IsZero() || !t.After(now) {
		return 0
	}
	return t.Sub(now)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func ts(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func sortedKeys(m map[string]time.Duration) []string {
	return slices.Sorted(maps.Keys(m))
}
