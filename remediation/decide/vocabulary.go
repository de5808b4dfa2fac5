package decide

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/nodevigil/nodevigil/remediation/config"
)

// Annotations and the taint the remediator reads and writes on Nodes. The remediation record
// lives on the Node itself so that any leader, after any restart, resumes from what is written
// there and nothing is done twice.
const (
	// AnnotationDoNotRemediate, set by an operator to any value but "false", forbids every
	// remediation step on the node (short of a termination already requested).
	AnnotationDoNotRemediate = "nodevigil.io/do-not-remediate"
	// AnnotationState holds the pipeline Phase. It is written before the step it names is taken.
	AnnotationState = "nodevigil.io/remediation-state"
	// AnnotationReason is the decision Reason that started the remediation.
	AnnotationReason = "nodevigil.io/remediation-reason"
	// AnnotationPolicy is the name of the policy the remediation runs under.
	AnnotationPolicy = "nodevigil.io/remediation-policy"
	// AnnotationStartedAt is when the node was marked (RFC 3339).
	AnnotationStartedAt = "nodevigil.io/remediation-started-at"
	// AnnotationWasUnschedulable records that the node was already cordoned before the
	// remediator marked it, so a release does not uncordon what an operator cordoned.
	AnnotationWasUnschedulable = "nodevigil.io/was-unschedulable"
	// AnnotationDrainStartedAt is when the drain began; the drain timeout runs from it.
	AnnotationDrainStartedAt = "nodevigil.io/drain-started-at"
	// AnnotationTerminationRequestedAt is when the instance termination was first requested;
	// the NotFound confirm delay runs from it.
	AnnotationTerminationRequestedAt = "nodevigil.io/termination-requested-at"
	// AnnotationTerminatedAt is when EC2 confirmed the instance shutting down or gone.
	AnnotationTerminatedAt = "nodevigil.io/terminated-at"
	// AnnotationDryRunDecision records, in dry-run mode only, what would have been done.
	AnnotationDryRunDecision = "nodevigil.io/dry-run-decision"
	// AnnotationFirstReady is when the remediator first observed the node ready (RFC 3339, the
	// remediator's clock): Ready=True, the kubelet Lease fresh, the agent alive (or never
	// seen) and none of the policy's startup taints. It is written once, kept forever and read
	// by every later leader: the startup deadline applies only to a node without it, so a
	// startup taint that comes back on a node that was ready is never mistaken for a node
	// that never booted.
	AnnotationFirstReady = "nodevigil.io/first-ready-at"

	// TaintRemediating keeps new pods off a node being remediated. It is added together with
	// the cordon so a scheduler that ignores unschedulable (DaemonSets tolerate it) still
	// sees why.
	TaintRemediating = "nodevigil.io/remediating"

	// AnnotationDoNotDisrupt on a Pod (Karpenter's) keeps it from being evicted when the
	// policy honours it.
	AnnotationDoNotDisrupt = "karpenter.sh/do-not-disrupt"
)

// Condition types the agent writes (positive polarity: True is healthy).
const (
	// ConditionKubeletHealthy is the agent's verdict on the kubelet (unit, restarts, /healthz).
	ConditionKubeletHealthy corev1.NodeConditionType = "KubeletHealthy"
	// ConditionNetworkingReady is the agent's CNI verdict (the EKS node monitoring agent's name).
	ConditionNetworkingReady corev1.NodeConditionType = "NetworkingReady"
	// ConditionMemoryHealthy is the agent's memory pressure verdict.
	ConditionMemoryHealthy corev1.NodeConditionType = "MemoryHealthy"
)

// Phase is the step of the remediation pipeline recorded on the Node in AnnotationState.
type Phase string

const (
	// PhaseNone means no remediation is recorded.
	PhaseNone Phase = ""
	// PhaseMarked: the node was chosen; nothing has been done to it yet.
	PhaseMarked Phase = "Marked"
	// PhaseCordoned: the node is unschedulable and carries TaintRemediating.
	PhaseCordoned Phase = "Cordoned"
	// PhaseDraining: evictions are being requested.
	PhaseDraining Phase = "Draining"
	// PhaseTerminating: the instance termination is (about to be) requested. This is the point
	// of no return: a leader that finds it resumes the termination whatever the node looks like.
	PhaseTerminating Phase = "Terminating"
	// PhaseTerminated: EC2 confirmed the instance shutting down or gone; the Node object is
	// deleted next.
	PhaseTerminated Phase = "Terminated"
)

// Releasable reports whether a node in phase p can still be handed back (uncordoned) when it
// recovers: every phase before the termination request.
func (p Phase) Releasable() bool {
	return p == PhaseMarked || p == PhaseCordoned || p == PhaseDraining
}

// PastPointOfNoReturn reports whether the termination has been requested.
func (p Phase) PastPointOfNoReturn() bool {
	return p == PhaseTerminating || p == PhaseTerminated
}

// HoldsSlot reports whether a node in phase p counts against its pool's maxInFlight under a
// policy with action a: marked, cordoned, draining (however long the drain waits) or
// terminating. A CordonOnly node that is cordoned has finished its pipeline: counting it would
// let a CordonOnly pool cordon one node ever.
func (p Phase) HoldsSlot(a config.Action) bool {
	switch p {
	case PhaseMarked, PhaseTerminating:
		return true
	case PhaseCordoned, PhaseDraining:
		return a != config.ActionCordonOnly
	}
	return false
}

// PhaseOf reads the recorded phase of node. An unknown value is reported as Marked so that the
// pipeline starts over from the cordon (which is idempotent) instead of ignoring the record.
func PhaseOf(node *corev1.Node) Phase {
	v, ok := node.Annotations[AnnotationState]
	if !ok || v == "" {
		return PhaseNone
	}
	switch p := Phase(v); p {
	case PhaseMarked, PhaseCordoned, PhaseDraining, PhaseTerminating, PhaseTerminated:
		return p
	}
	return PhaseMarked
}

// DoNotRemediate reports whether an operator forbade remediating node.
func DoNotRemediate(node *corev1.Node) bool {
	v, ok := node.Annotations[AnnotationDoNotRemediate]
	return ok && v != "false"
}

// The Blocked record, written by the pipeline (not by Decide) when remediation of a node hit
// an obstacle retrying cannot remove — the instance is not the cluster's, the IAM policy
// refuses, the providerID is not an EC2 one, the instance does not exist. A Blocked node has
// been handed back (no phase, no cordon or taint of ours) so it holds no in-flight slot; the
// pipeline looks at it again only after its recheck interval, or at once when its providerID
// changes.
const (
	// AnnotationBlocked holds the block reason (a CamelCase word, e.g. InstanceNotOwned).
	AnnotationBlocked = "nodevigil.io/remediation-blocked"
	// AnnotationBlockedAt is when the node was blocked (RFC 3339); the recheck runs from it.
	AnnotationBlockedAt = "nodevigil.io/remediation-blocked-at"
	// AnnotationBlockedProviderID is the spec.providerID the block was judged on, so a fixed
	// providerID is rechecked at once.
	AnnotationBlockedProviderID = "nodevigil.io/remediation-blocked-provider-id"
)
