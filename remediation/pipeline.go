package remediation

// This file is the act step: remediate, the state machine that moves a node along
// mark → cordon → drain → request termination → confirm → delete, and the guarded Node patch
// every step is recorded with. The steps live in cordon.go (mark, verify, cordon), drain.go,
// terminate.go (intent, TerminateInstances, confirm, delete the Node), release.go (release,
// Blocked) and dryrun.go; the safety rails each step checks are in safety.go.

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/decide"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// Event reasons of the pipeline steps (decision and block reasons are Events too).
const (
	EventRemediationStarted   = "RemediationStarted"
	EventCordoned             = "Cordoned"
	EventDrainStarted         = "DrainStarted"
	EventDrainCompleted       = "DrainCompleted"
	EventTerminationRequested = "TerminationRequested"
	EventInstanceTerminated   = "InstanceTerminated"
	EventNodeDeleted          = "NodeDeleted"
	EventReleased             = "Released"
	EventWouldTerminate       = "WouldTerminate"
	EventWouldCordon          = "WouldCordon"
)

// pipelineAnnotations are removed when a node is released.
var pipelineAnnotations = []string{
	decide.AnnotationState, decide.AnnotationReason, decide.AnnotationPolicy, decide.AnnotationStartedAt,
	decide.AnnotationWasUnschedulable, decide.AnnotationDrainStartedAt, decide.AnnotationTerminationRequestedAt,
	decide.AnnotationTerminatedAt, decide.AnnotationDryRunDecision,
}

// blockedAnnotations are the Blocked record; removed when the node is marked again or needs no
// remediation any more.
var blockedAnnotations = []string{decide.AnnotationBlocked, decide.AnnotationBlockedAt, decide.AnnotationBlockedProviderID}

// nodePatch is a JSON merge patch of the Node fields the remediator owns.
type nodePatch struct {
	annotations   map[string]*string // a nil value removes the annotation
	unschedulable *bool
	taints        *[]corev1.Taint // replaces the whole list
}

// patchNode sends p, guarded by node's resourceVersion: if the Node changed since it was read,
// the API server answers Conflict and the reconcile is retried on fresh state. So a step is
// never recorded on the strength of a stale view, and two leaders (for the instant both think
// they lead) cannot both record the same step.
func (c *Controller) patchNode(ctx context.Context, node *corev1.Node, p nodePatch) (*corev1.Node, error) {
	meta := map[string]any{}
	if node.ResourceVersion != "" {
		meta["resourceVersion"] = node.ResourceVersion
	}
	if len(p.annotations) > 0 {
		meta["annotations"] = p.annotations
	}
	body := map[string]any{"metadata": meta}
	spec := map[string]any{}
	if p.unschedulable != nil {
		spec["unschedulable"] = *p.unschedulable
	}
	if p.taints != nil {
		spec["taints"] = *p.taints
	}
	if len(spec) > 0 {
		body["spec"] = spec
	}
	data, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encode node patch: %w", err)
	}
	out, err := c.client.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, data, metav1.PatchOptions{FieldManager: Component})
	if err != nil {
		return nil, fmt.Errorf("patch node %s: %w", node.Name, err)
	}
	return out, nil
}

func (c *Controller) setPhase(ctx context.Context, node *corev1.Node, phase decide.Phase, extra map[string]*string) (*corev1.Node, error) {
	ann := map[string]*string{decide.AnnotationState: ptr.To(string(phase))}
	for k, v := range extra {
		ann[k] = v
	}
	return c.patchNode(ctx, node, nodePatch{annotations: ann})
}

// remediate runs the pipeline from the phase recorded on the node as far as it can go now:
// verify → mark → cordon → drain → request termination → confirm → delete the Node. A node
// marked by this version is cordoned (and its drain started) in the marking patch itself
// (mark); the Marked and Cordoned cases below resume what an earlier version or a CordonOnly
// policy turned Terminate left behind.
//
// Before the point of no return (EC2 accepting the termination) every step is taken only
// after the decision was recomputed from the freshest node object and the caches, and the
// safety rails (pauses, the pool's maxUnhealthy) were checked again: a node that recovered,
// got nodevigil.io/do-not-remediate, or whose zone is now in a storm, is not moved on from
// stale judgement. The node patches are guarded by its resourceVersion, so a node changed
// since it was read (an annotation added) makes the step fail and the reconcile start over.
func (c *Controller) remediate(ctx context.Context, node *corev1.Node, p *config.Policy, d decide.Decision, now time.Time) (time.Duration, error) {
	verified := false // the instance was described in this reconcile, just before marking
	fresh := false    // the termination intent was recorded in this reconcile
	if decide.PhaseOf(node) == decide.PhaseNone {
		if wait, held := c.blockedHold(node, now); held {
			return wait, nil
		}
		n, intent, requeue, err := c.mark(ctx, node, p, d, now)
		if n == nil {
			return requeue, err
		}
		// With intent, the marking patch recorded the intent to terminate too (a policy
		// without a drain): straight on to TerminateInstances, as after beginTermination.
		node, verified, fresh = n, true, intent
	}
	for {
		phase := decide.PhaseOf(node)
		if !phase.PastPointOfNoReturn() && !fresh {
			now = c.clock.Now()
			p = c.rc.PolicyFor(node.Labels)
			nd := decide.Decide(c.input(node, p, now))
			if nd.Action != decide.ActionRemediate {
				if nd.Action == decide.ActionRelease {
					return c.release(ctx, node, nd)
				}
				return nd.RequeueAfter, nil
			}
			d = nd
		}
		switch phase {
		case decide.PhaseMarked:
			if c.railsBlock(node, p, stepCordon, now) {
				return c.cfg.BlockedRequeue, nil
			}
			if p.Action == config.ActionTerminate && !verified {
				// Resuming a mark another leader (or an earlier reconcile) made: the instance is
				// verified again before the first disruptive step.
				ok, requeue, err := c.verify(ctx, node)
				if !ok {
					return requeue, err
				}
			}
			n, err := c.cordon(ctx, node)
			if err != nil {
				return 0, err
			}
			node = n
		case decide.PhaseCordoned, decide.PhaseDraining:
			if p.Action != config.ActionTerminate {
				// CordonOnly stops here (and so does a node whose policy changed under it).
				return 0, nil
			}
			if _, pending := node.Annotations[decide.AnnotationTerminationRequestedAt]; pending && !fresh {
				// A termination was about to be requested (or was) when the previous attempt
				// stopped: resume it, looking at EC2 before asking again.
				n, requeue, err := c.terminate(ctx, node, d, false, now)
				if n == nil {
					return requeue, err
				}
				node = n
				continue
			}
			if !fresh {
				if phase == decide.PhaseCordoned && p.Drain.Enabled {
					if c.railsBlock(node, p, stepDrain, now) {
						return c.cfg.BlockedRequeue, nil
					}
					n, err := c.setPhase(ctx, node, decide.PhaseDraining, map[string]*string{decide.AnnotationDrainStartedAt: ptr.To(ts(now))})
					if err != nil {
						return 0, err
					}
					c.drainStarted(n, p)
					node = n
				}
				if decide.PhaseOf(node) == decide.PhaseDraining && p.Drain.Enabled {
					if c.railsBlock(node, p, stepDrain, now) {
						return c.cfg.BlockedRequeue, nil
					}
					res := c.drain(ctx, node, p, now)
					if !res.done {
						return res.requeue, res.err
					}
				}
				n, requeue, err := c.beginTermination(ctx, node, p, now)
				if n == nil {
					return requeue, err
				}
				node, fresh = n, true
				continue
			}
			n, requeue, err := c.terminate(ctx, node, d, true, now)
			if n == nil {
				return requeue, err
			}
			node = n
		case decide.PhaseTerminating:
			n, requeue, err := c.terminate(ctx, node, d, fresh, now)
			if n == nil {
				return requeue, err
			}
			node = n
		case decide.PhaseTerminated:
			return c.deleteNode(ctx, node)
		default:
			return 0, nil
		}
	}
}

func withTaint(taints []corev1.Taint) []corev1.Taint {
	if hasTaint(taints) {
		return taints
	}
	out := make([]corev1.Taint, 0, len(taints)+1)
	out = append(out, taints...)
	return append(out, corev1.Taint{Key: decide.TaintRemediating, Effect: corev1.TaintEffectNoSchedule})
}

func withoutTaint(taints []corev1.Taint) []corev1.Taint {
	out := make([]corev1.Taint, 0, len(taints))
	for _, t := range taints {
		if t.Key != decide.TaintRemediating {
			out = append(out, t)
		}
	}
	return out
}

func hasTaint(taints []corev1.Taint) bool {
	for _, t := range taints {
		if t.Key == decide.TaintRemediating {
			return true
		}
	}
	return false
}

func ts(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func parseTS(s string) (time.Time, bool) {
	t, err := time.Parse(time.RFC3339Nano, s)
	return t, err == nil
}
