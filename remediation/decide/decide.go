// Package decide is the remediator's judgement, as one pure function: given a Node, its
// kubelet's Lease, its agent's Lease, when the remediator last saw each of them change, the
// policy that applies and the time, Decide says whether to do nothing, wait, remediate or
// release the node, why, and when to look again.
//
// It implements the two-signal liveness model of the design brief (§3, §8):
//
//	agent Lease  kubelet Lease / Ready     verdict                   action
//	fresh        fresh / True              Healthy                   none
//	fresh        stale, or Ready=False     KubeletUnhealthy          remediate after tolerations.kubeletUnhealthy
//	             after first ready                                   (the agent repairs locally meanwhile)
//	stale        fresh / True              AgentSilent               never remediate; event + metric
//	stale        stale / Unknown           NodeSilent                remediate after tolerations.silentNode
//	never seen   any, before first ready   StartupGrace/AgentNotSeen wait; only the startup deadline applies
//	                                       StartupDeadlineExceeded   remediate, unless the node is serving
//	never seen   after first ready         AgentNeverSeen            never (one signal), unless liveness: SingleSignal:
//	                                       KubeletUnhealthy          then after tolerations.singleSignal (30m class)
//	none at all  any                       NoAgentLeases             never: a misconfiguration, reported loudly
//	fresh        agent condition False     ConditionUnhealthy        remediate after tolerations.conditions[type]
//	fresh        startup taint kept,       StartupDeadlineExceeded   remediate once the startup deadline passed
//	             never ready
//
// Two signals, strictly: an agent condition alone — KubeletHealthy=False after a kubelet the
// agent restarted successfully, say — never starts the kubelet toleration while the kubelet
// Lease is fresh and Ready is True. Agent conditions count only through their own entry in
// tolerations.conditions.
//
// Time is the observer's. A Lease's renewTime is written with the node's clock, which may be
// minutes off, so it is never compared with the remediator's clock. A Lease is stale when the
// remediator has not seen it change (Input.KubeletObserved, Input.AgentObserved: its own clock,
// kept by the controller from the informer's events) for leaseDurationSeconds plus LeaseGrace,
// measured from no earlier than ObservingSince: a new leader starts observing from zero and
// judges no Lease stale before one duration and grace have passed under its own eyes. The
// kubelet's signal is its Lease when there is one; without a Lease, Ready=Unknown (set by the
// node lifecycle controller with the control plane's clock) is the kubelet's silence.
//
// Every toleration is measured from the earliest moment its evidence was corroborated and the
// node is requeued for exactly the moment it expires:
//   - NodeSilent runs from the later of the two moments the Leases went stale: only from then
//     on have both independent heartbeats been missing.
//   - KubeletUnhealthy runs from the kubelet Lease going stale, or from Ready turning False on
//     a node that was ready before, whichever is earlier, while the agent itself is alive.
//   - ConditionUnhealthy runs from the condition's LastTransitionTime. Only False counts:
//     Unknown means the agent could not tell, which is never evidence of ill health. A
//     condition with no LastTransitionTime cannot be measured and is ignored.
//
// The startup deadline is for nodes that never became ready. The controller remembers the first
// moment it sees a node ready (Decision RecordFirstReady asks for it; Input.SeenReadyAt hands it
// back) and writes it to the nodevigil.io/first-ready-at annotation, at the latest when the node
// stops looking ready (Decision PersistFirstReady); after that a startup taint coming back is no
// startup failure:
// the node is judged by its heartbeats, Ready and the agent conditions the policy names (the
// agent re-adds its taint because one of its checks failed, and that check's condition carries
// the time and the toleration), and the taint is only mentioned in the message. Without a record
// or memory, "never ready" needs evidence (everReady): the kubelet never posted status, or this
// leader has watched the node since its creation; otherwise, past its startup deadline, the
// node is presumed ready (a change of leader may have lost the record) and the message says so.
//
// Gates applied after the verdict: the do-not-remediate annotation (never act); a policy whose
// action is None (report only); the startup grace (no remediation of a node younger than
// startupGrace, except for the startup deadline itself); and the leader's observe period (a new
// leader judges nothing during its first ObservePeriod, which covers the verdicts that do not
// rest on a Lease). A node already past the point of no return (termination requested) is
// always driven to the end; a node earlier in the pipeline whose verdict no longer calls for
// remediation is released.
//
// A node whose agent was never seen and that never became ready is booting: nothing applies
// until its startup deadline. Past it, the node is replaced (StartupDeadlineExceeded) unless it
// is demonstrably serving — Ready=True, a live kubelet and none of the policy's startup taints —
// in which case only the agent is missing (AgentNeverSeen) and, as with AgentSilent, that alone
// never kills a node. So installing nodevigil on a running cluster never condemns the nodes
// that predate it.
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
	ReasonNoAgentLeases           = "NoAgentLeases"
)

// Reasons lists every reason Decide can return, for pre-initialising metrics.
var Reasons = []string{
	ReasonHealthy, ReasonKubeletUnhealthy, ReasonAgentSilent, ReasonNodeSilent, ReasonConditionUnhealthy,
	ReasonStartupGrace, ReasonAgentNotSeen, ReasonAgentNeverSeen, ReasonStartupDeadlineExceeded,
	ReasonDoNotRemediate, ReasonRemediationDisabled, ReasonLeaderObserving, ReasonTerminationInProgress,
	ReasonNodeGone, ReasonNoAgentLeases,
}

// DefaultKubeletLeaseDuration is the kubelet's Lease duration, used when a kubelet Lease does
// not state its own.
const DefaultKubeletLeaseDuration = 40 * time.Second

// LeaseGrace is how long past its duration a Lease may go unseen before it is stale: a quarter
// of the duration (10 s for the kubelet's 40 s, as kube-controller-manager's 50 s grace). It
// absorbs the jitter of renewals and of watch delivery; the remediator's own observation time
// already includes the delivery delay.
func LeaseGrace(duration time.Duration) time.Duration { return duration / 4 }

// StaleAfter is how long after its last observed change a Lease of the given duration is
// stale.
func StaleAfter(duration time.Duration) time.Duration { return duration + LeaseGrace(duration) }

// Input is everything a decision depends on. Decide reads nothing else: no clock, no cache.
type Input struct {
	// Node is the node judged (informer-stripped is fine: labels, annotations, spec and
	// conditions are read).
	Node *corev1.Node
	// KubeletLease is the node's Lease in kube-node-lease, nil if there is none.
	KubeletLease *coordinationv1.Lease
	// AgentLease is the node's nodevigil agent Lease, nil if the agent was never seen.
	AgentLease *coordinationv1.Lease
	// KubeletObserved and AgentObserved are when this remediator last saw the respective
	// Lease change (its resourceVersion or renewTime), by its own clock; the first sight of a
	// Lease counts as a change. Zero means not observed: the Lease is then judged from
	// ObservingSince. Staleness is measured from these, never from renewTime.
	KubeletObserved, AgentObserved time.Time
	// NoAgents reports that no agent Lease exists for any node: the agents are missing or the
	// remediator looks in the wrong place. Under liveness TwoSignal nothing is then remediated
	// on the kubelet alone, not even the startup deadline (whose taint only an agent removes).
	NoAgents bool
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
	// SeenReadyAt is when this leader first saw the node ready (Ready=True, a fresh kubelet,
	// no startup taint), from its memory; zero if it has not. It counts as the first-ready
	// record: the annotation is written lazily (see Decision.PersistFirstReady), and until it
	// is, the leader's memory is what keeps the startup deadline off a node once ready.
	SeenReadyAt time.Time
	// ScheduledEvents are the active scheduled events EC2 lists for the node's instance
	// (DescribeInstanceStatus), added to those the agent's NoScheduledEvent condition reports. A
	// node that goes silent inside a scheduled reboot's window is tolerated the policy's
	// tolerations.scheduledReboot: AWS is rebooting it.
	ScheduledEvents []ScheduledEvent
	// NoMessage skips formatting the Lease parts of Decision.Message and the whole message of a
	// healthy node, so the message is empty or incomplete; every other field is the same. The safety rails' census judges every node
	// and reads only the verdict: formatting times and messages for 10,000 healthy nodes was a
	// quarter of a census pass (docs/benchmarks.md).
	NoMessage bool
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
	// RecordFirstReady asks the controller to record, in AnnotationFirstReady, that the node
	// is ready now and was never recorded so: from then on the startup deadline no longer
	// applies to it.
	RecordFirstReady bool
	// PersistFirstReady asks the controller to write AnnotationFirstReady now, with
	// Input.SeenReadyAt: the node was seen ready by this leader only (not recorded yet) and no
	// longer looks ready — its startup taint is back, Ready is not True or the kubelet is
	// silent — which is when the record starts to matter, so it must survive a change of
	// leader.
	PersistFirstReady bool
	// PresumedReady reports that the node does not look ready, has no first-ready record,
	// and was judged as having been ready by presumption (everReady's rule 5): the startup
	// deadline did not apply to it. The controller says so in an Event, once.
	PresumedReady bool
}

var defaultPolicy = func() *config.Policy {
	c := config.Default()
	return &c.Policies[len(c.Policies)-1]
}()

// Decide judges one node. It is pure: the same Input always gives the same Decision.
func Decide(in Input) Decision {
	d := decideNode(in)
	if in.Node == nil || FirstReady(in.Node) {
		return d
	}
	if in.Policy == nil {
		in.Policy = defaultPolicy
	}
	switch {
	case !in.SeenReadyAt.IsZero():
		d.PersistFirstReady = !looksReady(in)
	case everReady(in).rule == rulePresumed:
		d.PresumedReady = !looksReady(in)
	}
	return d
}

// looksReady reports whether the node looks ready now: Ready=True, no startup taint and a live
// kubelet. A node first ready only in the leader's memory that stops looking so must have its
// record persisted (Decision.PersistFirstReady).
func looksReady(in Input) bool {
	p := in.Policy
	ready := condition(in.Node, corev1.NodeReady)
	if ready == nil || ready.Status != corev1.ConditionTrue || startupTaint(in.Node, p.StartupTaints) != "" {
		return false
	}
	brief := in
	brief.NoMessage = true
	return !kubeletSignal(brief).stale
}

// Reason of the Ready condition kube-controller-manager's node lifecycle controller sets on a
// node whose kubelet never posted its status.
const reasonNodeStatusNeverUpdated = "NodeStatusNeverUpdated"

// readiness is what is known of whether a node ever became ready (Ready=True, a live kubelet,
// no startup taint), and by which rule (see everReady).
type readiness struct {
	ready bool // became ready, known or presumed: the startup deadline no longer applies
	known bool // recorded on the node or seen by this leader (the record need not be asked for)
	rule  readinessRule
}

// readinessRule names the rule of everReady that applied.
type readinessRule int

const (
	ruleRecorded readinessRule = iota
	ruleSeen
	ruleNoReadyCondition
	ruleNeverUpdated
	ruleWatchedSinceCreation
	rulePresumed
	ruleNotYet
)

// everReady decides whether the node ever became ready. "Not known" must never mean "never
// ready": a change of leader loses the old leader's memory of nodes whose record was still
// queued (firstready.go in the controller), and a node wrongly judged never ready is killed
// for StartupDeadlineExceeded. The rules, in order:
//
//  1. the first-ready annotation: ready, recorded;
//  2. this leader's memory (SeenReadyAt): ready, seen;
//  3. no Ready condition, or Ready=Unknown with reason NodeStatusNeverUpdated (set by the node
//     lifecycle controller only while the kubelet has never posted the node's status): never
//     ready, whoever leads;
//  4. the node was created after this leader began observing (ObservingSince, which a gap in
//     observation moves forward): its memory covers the node's whole life, so not seen ready
//     means never ready;
//  5. otherwise the evidence is missing. Past the startup deadline the node is presumed ready
//     (an earlier leader may have seen it so): it is judged by its heartbeats, Ready and
//     conditions, which still handle a dead node. Before the deadline nothing is decided
//     yet: the startup deadline only waits.
//
// The rule applied is named in the decision's message (readiness.text). It allocates nothing:
// the census runs it for every node.
func everReady(in Input) readiness {
	node := in.Node
	if FirstReady(node) {
		return readiness{ready: true, known: true, rule: ruleRecorded}
	}
	if !in.SeenReadyAt.IsZero() {
		return readiness{ready: true, known: true, rule: ruleSeen}
	}
	switch ready := condition(node, corev1.NodeReady); {
	case ready == nil:
		return readiness{rule: ruleNoReadyCondition}
	case ready.Status == corev1.ConditionUnknown && ready.Reason == reasonNodeStatusNeverUpdated:
		return readiness{rule: ruleNeverUpdated}
	}
	if watchedSinceCreation(in) {
		return readiness{rule: ruleWatchedSinceCreation}
	}
	if !in.Now.Before(node.CreationTimestamp.Add(in.Policy.StartupDeadline)) {
		return readiness{ready: true, rule: rulePresumed}
	}
	return readiness{rule: ruleNotYet}
}

// text describes the rule that applied, for messages.
func (r readiness) text(in Input) string {
	created := in.Node.CreationTimestamp.Time
	switch r.rule {
	case ruleRecorded:
		return "first ready at " + in.Node.Annotations[AnnotationFirstReady] + " (recorded on the node)"
	case ruleSeen:
		return "first ready at " + ts(in.SeenReadyAt) + " (seen by this leader)"
	case ruleNoReadyCondition:
		return "never ready: the kubelet never posted a Ready condition"
	case ruleNeverUpdated:
		return "never ready: Ready=Unknown (" + reasonNodeStatusNeverUpdated + "), the kubelet never posted the node's status"
	case ruleWatchedSinceCreation:
		return fmt.Sprintf("never ready: watched by this leader since its creation %s (observing since %s) and never seen ready", ts(created), ts(in.ObservingSince))
	case rulePresumed:
		return fmt.Sprintf("presumed ready: no first-ready record, not watched by this leader since its creation %s (observing since %s), startup deadline passed at %s, so an earlier leader may have seen it ready",
			ts(created), tsOrNever(in.ObservingSince), ts(created.Add(in.Policy.StartupDeadline)))
	default:
		return "not seen ready yet, within its startup deadline"
	}
}

// watchedSinceCreation reports whether this leader has observed the node since it was
// created. creationTimestamp has one-second resolution and the control plane's clock, so the
// node must be created in a later second than ObservingSince: a doubt counts as not watched.
func watchedSinceCreation(in Input) bool {
	if in.ObservingSince.IsZero() {
		return false
	}
	return !in.Node.CreationTimestamp.Time.Before(in.ObservingSince.Truncate(time.Second).Add(time.Second))
}

func tsOrNever(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return ts(t)
}

func decideNode(in Input) Decision {
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
		if until := presumedFresh(in); phase.Releasable() && !until.IsZero() {
			// The node looks recovered only because this leader has not watched its Leases
			// for a full duration yet: not seeing them change is no evidence either way, so
			// neither release nor remediate until it is.
			d := v
			d.Action, d.Reason, d.RequeueAfter = ActionWait, ReasonLeaderObserving, until.Sub(now)
			d.Message = fmt.Sprintf("leader observing since %s: a Lease of this node (state %s) has not been watched for its duration yet (until %s); then %s: %s",
				ts(in.ObservingSince), phase, ts(until), v.Reason, v.Message)
			return d
		}
		if v.Action == ActionWait && v.Unhealthy && phase.Releasable() {
			// Mid-pipeline and still unhealthy, only within its toleration — as after a leader
			// change, where tolerations run from the new leader's own observation. Releasing
			// would uncordon a node that is still down and start it all over one toleration
			// later: hold it where it is, neither released nor advanced, until the toleration
			// ends (then the pipeline resumes) or the node recovers (then it is released).
			d := v
			d.Message = fmt.Sprintf("holding node (state %s) within its toleration: %s", phase, v.Message)
			return d
		}
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

// presumedFresh returns when the last Lease of the node that is fresh only by presumption — not
// seen changing since this leader began observing, and not yet StaleAfter its duration past
// that start — stops being so; zero if none is.
func presumedFresh(in Input) time.Time {
	if in.ObservingSince.IsZero() {
		return time.Time{}
	}
	var until time.Time
	check := func(l *coordinationv1.Lease, observed time.Time, fallback time.Duration) {
		if l == nil || observed.After(in.ObservingSince) {
			return
		}
		dur := fallback
		if l.Spec.LeaseDurationSeconds != nil && *l.Spec.LeaseDurationSeconds > 0 {
			dur = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
		}
		if end := in.ObservingSince.Add(StaleAfter(dur)); in.Now.Before(end) && end.After(until) {
			until = end
		}
	}
	agentDur := in.AgentLeaseDuration
	if agentDur <= 0 {
		agentDur = config.DefaultAgentLeaseDuration
	}
	check(in.KubeletLease, in.KubeletObserved, DefaultKubeletLeaseDuration)
	check(in.AgentLease, in.AgentObserved, agentDur)
	return until
}

// signal is one heartbeat's state at the decision time.
type signal struct {
	known bool      // there is any evidence about this heartbeat
	stale bool      // the heartbeat has stopped
	at    time.Time // fresh: when it would go stale (zero if it cannot); stale: since when
	what  string    // human description for messages
}

// FirstReady reports whether the node was recorded ready once (AnnotationFirstReady).
func FirstReady(node *corev1.Node) bool { return node.Annotations[AnnotationFirstReady] != "" }

// leaseSignal judges a Lease from when it was last observed changing: stale once StaleAfter
// its duration has passed since then, or since ObservingSince if that is later. renewTime is
// quoted in messages, never compared with now: it is the node's clock.
func leaseSignal(l *coordinationv1.Lease, observed time.Time, fallback time.Duration, in Input, who string) signal {
	dur := fallback
	if l.Spec.LeaseDurationSeconds != nil && *l.Spec.LeaseDurationSeconds > 0 {
		dur = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	base := later(observed, in.ObservingSince)
	if base.IsZero() {
		// Nothing was ever observed: the Lease can only be judged from now on.
		base = in.Now
	}
	exp := base.Add(StaleAfter(dur))
	s := signal{known: true, stale: !in.Now.Before(exp), at: exp}
	if in.NoMessage {
		return s
	}
	claim := "none"
	switch {
	case l.Spec.RenewTime != nil:
		claim = ts(l.Spec.RenewTime.Time)
	case l.Spec.AcquireTime != nil:
		claim = ts(l.Spec.AcquireTime.Time)
	}
	if s.stale {
		s.what = fmt.Sprintf("%s lease stale since %s (not seen changing since %s; duration %s + grace %s; its renewTime claims %s)", who, ts(exp), ts(base), dur, LeaseGrace(dur), claim)
	} else {
		s.what = fmt.Sprintf("%s lease fresh until %s (seen changing %s)", who, ts(exp), ts(base))
	}
	return s
}

func kubeletSignal(in Input) signal {
	if in.KubeletLease != nil {
		return leaseSignal(in.KubeletLease, in.KubeletObserved, DefaultKubeletLeaseDuration, in, "kubelet")
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
	ag := leaseSignal(in.AgentLease, in.AgentObserved, agentDur, in, "agent")

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
		return due(tolerateReboot(in, Decision{
			Reason:     ReasonNodeSilent,
			Message:    fmt.Sprintf("%s and %s: both heartbeats silent since %s; silentNode toleration %s", ag.what, kub.what, ts(since), tol.SilentNode),
			Since:      since,
			EligibleAt: since.Add(tol.SilentNode),
			Unhealthy:  true,
			Silent:     true,
		}), now)
	}

	// The agent is alive, so its conditions are current.
	rd := everReady(in)
	firstReady := rd.ready
	ready := condition(node, corev1.NodeReady)
	taint := startupTaint(node, in.Policy.StartupTaints)
	var cands []Decision
	var kubSince time.Time
	var evidence []string
	if kub.stale {
		kubSince = kub.at
		evidence = append(evidence, kub.what)
	}
	// Ready=False is the kubelet's own word that it is not working, once the node had been
	// ready: before that, not being ready is the startup deadline's business.
	if firstReady && ready != nil && ready.Status == corev1.ConditionFalse && !ready.LastTransitionTime.IsZero() {
		t := ready.LastTransitionTime.Time
		if kubSince.IsZero() || t.Before(kubSince) {
			kubSince = t
		}
		evidence = append(evidence, fmt.Sprintf("Ready=False since %s (%s)", ts(t), ready.Reason))
	}
	if !kubSince.IsZero() {
		// The agent's KubeletHealthy condition explains but never starts or shortens the
		// toleration: it is one signal, and the kubelet's own is the second.
		if c := condition(node, ConditionKubeletHealthy); c != nil && c.Status == corev1.ConditionFalse {
			evidence = append(evidence, fmt.Sprintf("the agent reports KubeletHealthy=False (%s: %s)", c.Reason, c.Message))
		}
		cands = append(cands, tolerateReboot(in, Decision{
			Reason:     ReasonKubeletUnhealthy,
			Message:    fmt.Sprintf("%s while %s; kubeletUnhealthy toleration %s from %s", strings.Join(evidence, " and "), ag.what, tol.KubeletUnhealthy, ts(kubSince)),
			Since:      kubSince,
			EligibleAt: kubSince.Add(tol.KubeletUnhealthy),
		}))
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

	// A node whose agent is alive but that never became ready still carries a startup taint.
	// Past the startup deadline it is replaced: a stuck startup taint is never left forever.
	// Before the deadline it is just booting and counts as nothing. A node that was ready
	// once is past startup for good: its taint coming back is judged by the rest.
	var startupDeadline time.Time
	note := ""
	switch {
	case taint != "" && firstReady:
		note = fmt.Sprintf("; startup taint %s is on a node past startup (%s): judged by its heartbeats and conditions, not by the startup deadline", taint, rd.text(in))
	case rd.rule == rulePresumed && !in.NoMessage:
		note = "; " + rd.text(in)
	case taint != "":
		created := node.CreationTimestamp.Time
		deadline := created.Add(in.Policy.StartupDeadline)
		if now.Before(deadline) {
			startupDeadline = deadline
		} else {
			cands = append(cands, Decision{
				Reason:     ReasonStartupDeadlineExceeded,
				Message:    fmt.Sprintf("%s but the node still carries startup taint %s: %s; startup deadline %s passed at %s", ag.what, taint, rd.text(in), in.Policy.StartupDeadline, ts(deadline)),
				Since:      created,
				EligibleAt: deadline,
			})
		}
	}
	record := !rd.known && taint == "" && !kub.stale && ready != nil && ready.Status == corev1.ConditionTrue

	// Whatever the verdict, look again when a fresh heartbeat could go stale or the startup
	// deadline arrives.
	next := ag.at
	if kub.known && !kub.stale && !kub.at.IsZero() && kub.at.Before(next) {
		next = kub.at
	}
	if !startupDeadline.IsZero() && startupDeadline.Before(next) {
		next = startupDeadline
	}
	if len(cands) == 0 {
		d := Decision{
			Action:           ActionNone,
			Reason:           ReasonHealthy,
			RequeueAfter:     until(now, next),
			RecordFirstReady: record,
		}
		if !in.NoMessage {
			d.Message = fmt.Sprintf("%s; %s%s", ag.what, kub.what, note)
		}
		return d
	}
	best := cands[0]
	for _, c := range cands[1:] {
		if c.EligibleAt.Before(best.EligibleAt) {
			best = c
		}
	}
	best.Unhealthy, best.Silent = true, kub.stale
	best.Message += note
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
	ready := condition(node, corev1.NodeReady)
	readyTrue := ready != nil && ready.Status == corev1.ConditionTrue
	taint := startupTaint(node, p.StartupTaints)
	rd := everReady(in)
	firstReady := rd.ready
	record := !rd.known && readyTrue && !kub.stale && taint == ""
	single := p.Liveness == config.LivenessSingleSignal

	if in.NoAgents && !single {
		return Decision{
			Action: ActionNone,
			Reason: ReasonNoAgentLeases,
			Message: fmt.Sprintf("no nodevigil agent Lease exists for any node: the agents are not installed or the remediator looks in the wrong agentNamespace or label; "+
				"policy %s has liveness TwoSignal, so nothing is remediated on the kubelet alone (%s)", p.Name, kub.what),
			RequeueAfter:     until(now, kub.at),
			Silent:           kub.stale,
			RecordFirstReady: record,
		}
	}

	if firstReady {
		// Past startup for good: only the kubelet speaks for this node.
		var since time.Time
		var evidence []string
		if kub.stale {
			since = kub.at
			evidence = append(evidence, kub.what)
		}
		if !readyTrue {
			t := created
			if ready != nil && !ready.LastTransitionTime.IsZero() {
				t = ready.LastTransitionTime.Time
			}
			if since.IsZero() || t.Before(since) {
				since = t
			}
			if ready == nil {
				evidence = append(evidence, "no Ready condition")
			} else {
				evidence = append(evidence, fmt.Sprintf("Ready=%s since %s (%s)", ready.Status, ts(t), ready.Reason))
			}
		}
		if since.IsZero() {
			return Decision{
				Action:           ActionNone,
				Reason:           ReasonAgentNeverSeen,
				Message:          fmt.Sprintf("agent never seen, but the node (%s) is Ready and %s: only the agent is missing; never remediated", rd.text(in), kub.what),
				RequeueAfter:     until(now, kub.at),
				RecordFirstReady: record,
			}
		}
		if !single {
			return Decision{
				Action: ActionNone,
				Reason: ReasonAgentNeverSeen,
				Message: fmt.Sprintf("agent never seen and the node (%s) has %s: that is one signal only, and policy %s has liveness TwoSignal; not remediated",
					rd.text(in), strings.Join(evidence, " and "), p.Name),
				RequeueAfter: until(now, kub.at),
				Since:        since,
				Silent:       kub.stale,
			}
		}
		return due(Decision{
			Reason: ReasonKubeletUnhealthy,
			Message: fmt.Sprintf("agent never seen and the node (%s) has %s; policy %s has liveness SingleSignal: singleSignal toleration %s from %s",
				rd.text(in), strings.Join(evidence, " and "), p.Name, p.Tolerations.SingleSignal, ts(since)),
			Since:      since,
			EligibleAt: since.Add(p.Tolerations.SingleSignal),
			Unhealthy:  true,
			Silent:     kub.stale,
		}, now)
	}

	graceEnd, deadline := created.Add(p.StartupGrace), created.Add(p.StartupDeadline)
	switch {
	case now.Before(graceEnd):
		return Decision{
			Action:           ActionWait,
			Reason:           ReasonStartupGrace,
			Message:          fmt.Sprintf("agent not seen yet; node created %s is within its startup grace of %s", ts(created), p.StartupGrace),
			RequeueAfter:     graceEnd.Sub(now),
			Silent:           kub.stale,
			RecordFirstReady: record,
		}
	case now.Before(deadline):
		return Decision{
			Action:           ActionWait,
			Reason:           ReasonAgentNotSeen,
			Message:          fmt.Sprintf("agent not seen yet; node created %s has until its startup deadline %s", ts(created), ts(deadline)),
			RequeueAfter:     deadline.Sub(now),
			Silent:           kub.stale,
			RecordFirstReady: record,
		}
	}

	if taint == "" && readyTrue && !kub.stale {
		return Decision{
			Action:           ActionNone,
			Reason:           ReasonAgentNeverSeen,
			Message:          fmt.Sprintf("agent never seen since the node was created %s, but the node is Ready and %s: only the agent is missing; never remediated", ts(created), kub.what),
			RequeueAfter:     until(now, kub.at),
			RecordFirstReady: record,
		}
	}

	// Never ready and not serving: find since when, from the earliest evidence still present.
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
		Message: fmt.Sprintf("agent never seen and the node %s: it %s; startup deadline %s passed at %s (eligible %s)",
			rd.text(in), strings.Join(evidence, " and "), p.StartupDeadline, ts(deadline), ts(eligible)),
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
