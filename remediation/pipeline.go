package remediation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/decide"
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
// verify → mark → cordon → drain → request termination → confirm → delete the Node.
//
// Before the point of no return (EC2 accepting the termination) every step is taken only
// after the decision was recomputed from the freshest node object and the caches, and the
// safety rails (pauses, the pool's maxUnhealthy) were checked again: a node that recovered,
// got nodevigil.io/do-not-remediate, or whose zone is now in a storm, is not moved on from
// stale judgement. The node patches are guarded by its resourceVersion, so a node changed
// since it was read (an annotation added) makes the step fail and the reconcile start over.
func (c *Controller) remediate(ctx context.Context, node *corev1.Node, p *config.Policy, d decide.Decision, now time.Time) (time.Duration, error) {
	verified := false // the instance was described in this reconcile, just before marking
	if decide.PhaseOf(node) == decide.PhaseNone {
		if wait, held := c.blockedHold(node, now); held {
			return wait, nil
		}
		n, requeue, err := c.mark(ctx, node, p, d, now)
		if n == nil {
			return requeue, err
		}
		node, verified = n, true
	}
	fresh := false // the termination intent was recorded in this reconcile
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
					c.recorder.Eventf(n, corev1.EventTypeNormal, EventDrainStarted, "draining through the Eviction API (timeout %s, on timeout %s, honour %s: %v); the node counts against maxInFlight until it is terminated or released",
						p.Drain.Timeout, p.Drain.OnTimeout, decide.AnnotationDoNotDisrupt, p.Drain.HonorDoNotDisrupt)
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

// mark applies the safety rails, verifies the instance and records the decision on the node.
// It returns a nil node when the node was not marked.
func (c *Controller) mark(ctx context.Context, node *corev1.Node, p *config.Policy, d decide.Decision, now time.Time) (*corev1.Node, time.Duration, error) {
	if p.Action == config.ActionTerminate {
		if _, _, err := c.parseID(node.Spec.ProviderID); err != nil {
			return c.blockAndRelease(ctx, node, BlockInvalidProviderID, fmt.Sprintf("not remediating: %v; only EC2 instances named by an aws:/// provider ID are terminated", err))
		}
	}
	// The rails and the in-flight reservation are decided under gateMu; the Describe and the
	// patch are sent after releasing it, so that marking many nodes at once (a zone losing
	// power) does not serialise every worker behind API round trips. Every way out but a
	// successful mark gives the slot back.
	key := c.poolKey(node, p)
	c.gateMu.Lock()
	if reason, msg := c.checkRails(node, p, stepMark, now); reason != "" {
		c.gateMu.Unlock()
		c.blocked(node, reason, msg)
		return nil, c.cfg.BlockedRequeue, nil
	}
	c.reserveLocked(node.Name, key, now)
	c.gateMu.Unlock()
	marked := false
	defer func() {
		if !marked {
			c.unreserve(node.Name)
		}
	}()
	if p.Action == config.ActionTerminate {
		ok, requeue, err := c.verify(ctx, node)
		if !ok {
			return nil, requeue, err
		}
		// The Describe took time: judge again on what the caches say now.
		now = c.clock.Now()
		if nd := decide.Decide(c.input(node, p, now)); nd.Action != decide.ActionRemediate {
			return nil, nd.RequeueAfter, nil
		}
	}
	ann := map[string]*string{
		decide.AnnotationState:     ptr.To(string(decide.PhaseMarked)),
		decide.AnnotationReason:    ptr.To(d.Reason),
		decide.AnnotationPolicy:    ptr.To(p.Name),
		decide.AnnotationStartedAt: ptr.To(ts(now)),
	}
	for _, k := range blockedAnnotations {
		if _, ok := node.Annotations[k]; ok {
			ann[k] = nil
		}
	}
	if node.Spec.Unschedulable {
		ann[decide.AnnotationWasUnschedulable] = ptr.To("true")
	}
	n, err := c.patchNode(ctx, node, nodePatch{annotations: ann})
	if err != nil {
		return nil, 0, err
	}
	marked = true
	c.unblocked(node.Name)
	c.recorder.Eventf(n, corev1.EventTypeWarning, EventRemediationStarted, "remediating under policy %s (action %s) for %s: %s", p.Name, p.Action, d.Reason, d.Message)
	c.log.Warn("remediation started", "node", node.Name, "reason", d.Reason, "policy", p.Name, "action", string(p.Action))
	return n, 0, nil
}

// verify describes the node's instance before the first disruptive step: it must exist and
// carry the cluster ownership tag. Outcomes retrying cannot fix block the node (see
// blockAndRelease); a NotFound is taken as final only when it persists for the termination
// confirm delay (EC2 is eventually consistent about new instances); transient failures are
// retried with backoff. ok is true when the pipeline may go on.
func (c *Controller) verify(ctx context.Context, node *corev1.Node) (ok bool, requeue time.Duration, err error) {
	_, id, perr := c.parseID(node.Spec.ProviderID)
	if perr != nil {
		_, requeue, err := c.blockAndRelease(ctx, node, BlockInvalidProviderID, fmt.Sprintf("not remediating: %v; only EC2 instances named by an aws:/// provider ID are terminated", perr))
		return false, requeue, err
	}
	inst, found, derr := c.cloud.Describe(ctx, id)
	now := c.clock.Now()
	switch {
	case derr != nil && cloudErrorKind(derr) == CloudErrorUnauthorized:
		c.countCloudError("Describe", derr)
		_, requeue, err := c.blockAndRelease(ctx, node, BlockUnauthorized, fmt.Sprintf("not allowed to describe instance %s (check the IAM policy: ec2:DescribeInstances): %v", id, derr))
		return false, requeue, err
	case derr != nil:
		return false, c.retryLater(node, "Describe", derr), nil
	case !found:
		first := c.notFoundSince(node.Name, now)
		if wait := first.Add(c.cfg.TerminationConfirmDelay).Sub(now); wait > 0 {
			c.log.Info("instance not found; confirming before blocking", "node", node.Name, "instance_id", id, "duration", wait)
			return false, wait, nil
		}
		_, requeue, err := c.blockAndRelease(ctx, node, BlockNotFound, fmt.Sprintf("instance %s does not exist in EC2 (not found since %s); nothing to terminate", id, ts(first)))
		return false, requeue, err
	case !inst.Owned:
		_, requeue, err := c.blockAndRelease(ctx, node, BlockNotOwned, fmt.Sprintf("instance %s lacks the cluster ownership tag; it is never terminated", id))
		return false, requeue, err
	}
	c.cloudSucceeded(node.Name)
	return true, 0, nil
}

// cordon makes the node unschedulable and adds TaintRemediating, recording Cordoned in the same
// patch.
func (c *Controller) cordon(ctx context.Context, node *corev1.Node) (*corev1.Node, error) {
	taints := withTaint(node.Spec.Taints)
	n, err := c.patchNode(ctx, node, nodePatch{
		annotations:   map[string]*string{decide.AnnotationState: ptr.To(string(decide.PhaseCordoned))},
		unschedulable: ptr.To(true),
		taints:        &taints,
	})
	if err != nil {
		return nil, err
	}
	c.recorder.Eventf(n, corev1.EventTypeNormal, EventCordoned, "cordoned and tainted %s:NoSchedule", decide.TaintRemediating)
	c.log.Info("node cordoned", "node", node.Name, "taint", decide.TaintRemediating)
	return n, nil
}

// beginTermination applies the rails again (the world may have changed during the drain),
// takes a rate limiter token and records the intent to terminate
// (AnnotationTerminationRequestedAt, the phase unchanged). The phase becomes Terminating only
// once EC2 accepted the call; a leader that finds the intent without it looks at EC2 before
// asking again. It returns a nil node when blocked.
func (c *Controller) beginTermination(ctx context.Context, node *corev1.Node, p *config.Policy, now time.Time) (*corev1.Node, time.Duration, error) {
	if _, _, err := c.parseID(node.Spec.ProviderID); err != nil {
		return c.blockAndRelease(ctx, node, BlockInvalidProviderID, fmt.Sprintf("not terminating: %v", err))
	}
	if c.railsBlock(node, p, stepTerminate, now) {
		return nil, c.cfg.BlockedRequeue, nil
	}
	r, wait := c.takeTermination(now)
	if r == nil {
		rl := c.rc.TerminationRateLimit
		c.blocked(node, BlockRateLimited, fmt.Sprintf("termination rate limit (%g per minute, burst %d) reached; next slot in %s", rl.PerMinute, rl.Burst, wait.Round(time.Millisecond)))
		return nil, wait, nil
	}
	n, err := c.patchNode(ctx, node, nodePatch{annotations: map[string]*string{decide.AnnotationTerminationRequestedAt: ptr.To(ts(now))}})
	if err != nil {
		r.CancelAt(now)
		return nil, 0, err
	}
	c.unblocked(node.Name)
	return n, 0, nil
}

// terminate requests the termination of the node's instance and confirms it. fresh says the
// intent was recorded in this reconcile (EC2 was not asked yet); otherwise EC2 is described
// first, so a request another leader made is never repeated needlessly. It returns the node in
// PhaseTerminating once EC2 accepted, PhaseTerminated once EC2 shows the instance shutting
// down or gone, or a nil node and when to look again.
//
// Before EC2 accepted, a refusal retrying cannot fix blocks the node and hands it back; after,
// the node is past the point of no return and the termination is only ever finished.
func (c *Controller) terminate(ctx context.Context, node *corev1.Node, d decide.Decision, fresh bool, now time.Time) (*corev1.Node, time.Duration, error) {
	accepted := decide.PhaseOf(node) == decide.PhaseTerminating
	refuse := func(reason, msg string) (*corev1.Node, time.Duration, error) {
		if !accepted {
			return c.blockAndRelease(ctx, node, reason, msg)
		}
		c.blocked(node, reason, msg)
		return nil, c.cfg.BlockedRequeue, nil
	}
	_, id, err := c.parseID(node.Spec.ProviderID)
	if err != nil {
		return refuse(BlockInvalidProviderID, fmt.Sprintf("not terminating: %v", err))
	}
	requestedAt, ok := parseTS(node.Annotations[decide.AnnotationTerminationRequestedAt])
	if !ok {
		requestedAt = now
	}
	notFoundProofAt := requestedAt.Add(c.cfg.TerminationConfirmDelay)

	if !fresh {
		// Resuming (a requeue or a new leader): look before asking again.
		inst, found, err := c.cloud.Describe(ctx, id)
		switch {
		case err != nil && cloudErrorKind(err) == CloudErrorUnauthorized:
			c.countCloudError("Describe", err)
			return refuse(BlockUnauthorized, fmt.Sprintf("not allowed to describe instance %s (check the IAM policy): %v", id, err))
		case err != nil:
			return nil, c.retryLater(node, "Describe", err), nil
		case found && instanceGone(inst.State):
			return c.confirmed(ctx, node, id, inst.State)
		case found && !inst.Owned:
			return refuse(BlockNotOwned, fmt.Sprintf("instance %s lacks the cluster ownership tag; it is never terminated", id))
		case !found && !now.Before(notFoundProofAt):
			return c.confirmed(ctx, node, id, "not found")
		case !found:
			// Our own earlier request may have been accepted and EC2 not show it yet.
			return nil, notFoundProofAt.Sub(now), nil
		}
	}

	if !accepted && !d.EligibleAt.IsZero() && d.EligibleAt.After(c.observingSinceTime()) {
		c.metrics.terminateLatency.Observe(now.Sub(d.EligibleAt).Seconds())
	}
	out, err := c.cloud.Terminate(ctx, id)
	if out.Result == "" {
		out.Result = ResultFailed
	}
	c.metrics.terminations.WithLabelValues(string(out.Result)).Inc()
	log := c.log.With("node", node.Name, "instance_id", id)
	switch out.Result {
	case ResultTerminating, ResultAlreadyTerminated:
		c.cloudSucceeded(node.Name)
		c.unblocked(node.Name)
		c.recorder.Eventf(node, corev1.EventTypeWarning, EventTerminationRequested, "requested termination of instance %s (%s: %s → %s)", id, out.Result, out.PreviousState, out.CurrentState)
		log.Warn("instance termination requested", "result", string(out.Result))
		if !accepted {
			// EC2 accepted: record the point of no return. The patch is not guarded by the
			// resourceVersion — whatever changed on the node since, the instance is going.
			unguarded := node.DeepCopy()
			unguarded.ResourceVersion = ""
			n, err := c.setPhase(ctx, unguarded, decide.PhaseTerminating, nil)
			if err != nil {
				// The next attempt finds the intent, describes the instance and carries on.
				return nil, 0, err
			}
			node, accepted = n, true
		}
	case ResultNotFound:
		if !now.Before(notFoundProofAt) {
			return c.confirmed(ctx, node, id, "not found")
		}
		log.Info("instance not found yet; waiting before taking it as gone", "duration", notFoundProofAt.Sub(now))
		return nil, notFoundProofAt.Sub(now), nil
	case ResultNotOwned:
		return refuse(BlockNotOwned, fmt.Sprintf("instance %s lacks the cluster ownership tag; it is never terminated: %v", id, out.Err))
	case ResultUnauthorized:
		c.countCloudError("Terminate", &CloudError{Kind: CloudErrorUnauthorized, Err: out.Err})
		return refuse(BlockUnauthorized, fmt.Sprintf("not allowed to terminate instance %s (check the IAM policy): %v", id, out.Err))
	default:
		return nil, c.retryLater(node, "Terminate", errors.Join(err, out.Err)), nil
	}

	inst, found, err := c.cloud.Describe(ctx, id)
	if err != nil {
		c.countCloudError("Describe", err)
		log.Info("confirming termination failed; retrying", "err", err)
		return nil, c.cfg.ConfirmPollInterval, nil
	}
	if found && instanceGone(inst.State) {
		return c.confirmed(ctx, node, id, inst.State)
	}
	return nil, c.cfg.ConfirmPollInterval, nil
}

// confirmed records that the instance is gone.
func (c *Controller) confirmed(ctx context.Context, node *corev1.Node, id, state string) (*corev1.Node, time.Duration, error) {
	n, err := c.setPhase(ctx, node, decide.PhaseTerminated, map[string]*string{decide.AnnotationTerminatedAt: ptr.To(ts(c.clock.Now()))})
	if err != nil {
		return nil, 0, err
	}
	c.recorder.Eventf(n, corev1.EventTypeNormal, EventInstanceTerminated, "instance %s is %s", id, state)
	c.log.Info("instance terminated", "node", node.Name, "instance_id", id, "state", state)
	return n, 0, nil
}

// deleteNode deletes the Node object of a terminated instance, if it is still there. The UID
// precondition keeps a new Node that reuses the name safe.
func (c *Controller) deleteNode(ctx context.Context, node *corev1.Node) (time.Duration, error) {
	opts := metav1.DeleteOptions{}
	if node.UID != "" {
		uid := node.UID
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	err := c.client.CoreV1().Nodes().Delete(ctx, node.Name, opts)
	switch {
	case err == nil:
		c.recorder.Event(node, corev1.EventTypeNormal, EventNodeDeleted, "instance gone; deleted the Node object")
		c.log.Info("node deleted", "node", node.Name)
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		// Already gone, or the name now belongs to another Node.
	default:
		return 0, fmt.Errorf("delete node %s: %w", node.Name, err)
	}
	c.forget(node.Name)
	return 0, nil
}

// releasePatch hands a node back: taint and remediation record removed, the cordon removed only
// if the remediator set it.
func releasePatch(node *corev1.Node) nodePatch {
	patch := nodePatch{annotations: map[string]*string{}}
	for _, k := range pipelineAnnotations {
		if _, ok := node.Annotations[k]; ok {
			patch.annotations[k] = nil
		}
	}
	if hasTaint(node.Spec.Taints) {
		t := withoutTaint(node.Spec.Taints)
		patch.taints = &t
	}
	phase := decide.PhaseOf(node)
	cordonedByUs := phase != decide.PhaseNone && phase != decide.PhaseMarked && node.Annotations[decide.AnnotationWasUnschedulable] != "true"
	if node.Spec.Unschedulable && cordonedByUs {
		patch.unschedulable = ptr.To(false)
	}
	return patch
}

// release hands a recovered node back: taint and cordon removed (the cordon only if the
// remediator set it), remediation record removed.
func (c *Controller) release(ctx context.Context, node *corev1.Node, d decide.Decision) (time.Duration, error) {
	if c.rc.DryRun {
		c.log.Info("dry-run: would release node", "node", node.Name, "reason", d.Reason)
		return d.RequeueAfter, nil
	}
	if _, pending := node.Annotations[decide.AnnotationTerminationRequestedAt]; pending {
		// A termination may have been accepted by EC2 without the acceptance being recorded
		// (a leader died in between): make sure the instance is not going before handing the
		// node back.
		if _, id, err := c.parseID(node.Spec.ProviderID); err == nil {
			inst, found, err := c.cloud.Describe(ctx, id)
			if err != nil {
				return c.retryLater(node, "Describe", err), nil
			}
			if found && instanceGone(inst.State) {
				n, requeue, err := c.confirmed(ctx, node, id, inst.State)
				if n == nil {
					return requeue, err
				}
				return c.deleteNode(ctx, n)
			}
		}
	}
	n, err := c.patchNode(ctx, node, releasePatch(node))
	if err != nil {
		return 0, err
	}
	c.unreserve(node.Name)
	c.unblocked(node.Name)
	c.recorder.Event(n, corev1.EventTypeNormal, EventReleased, d.Message)
	c.log.Info("node released", "node", node.Name, "reason", d.Reason)
	return d.RequeueAfter, nil
}

// blockAndRelease records an obstacle retrying cannot fix — the instance is not the cluster's,
// the IAM policy refuses, the providerID is not an EC2 one, the instance does not exist — and
// hands the node back in the same patch: remediation record, taint and (our) cordon removed,
// decide.AnnotationBlocked* set. The node then holds no in-flight slot and does not count
// against its pool's maxUnhealthy; an Event, blocked_total{reason} and the
// blocked_nodes{reason} gauge show it. It is looked at again after Config.BlockedRecheck, or at
// once when its providerID changes. It always returns a nil node.
func (c *Controller) blockAndRelease(ctx context.Context, node *corev1.Node, reason, msg string) (*corev1.Node, time.Duration, error) {
	patch := releasePatch(node)
	now := c.clock.Now()
	patch.annotations[decide.AnnotationBlocked] = ptr.To(reason)
	patch.annotations[decide.AnnotationBlockedAt] = ptr.To(ts(now))
	patch.annotations[decide.AnnotationBlockedProviderID] = ptr.To(node.Spec.ProviderID)
	if _, err := c.patchNode(ctx, node, patch); err != nil {
		return nil, 0, err
	}
	c.unreserve(node.Name)
	c.clearNotFound(node.Name)
	c.blocked(node, reason, fmt.Sprintf("%s; node Blocked and handed back (looked at again in %s or when its providerID changes)", msg, c.cfg.BlockedRecheck))
	return nil, c.cfg.BlockedRecheck, nil
}

// blockedHold reports whether a node recorded Blocked is still to be left alone, and for how
// long. It is rechecked (verified again from the start) once BlockedRecheck has passed since
// it was blocked, or at once when its providerID is no longer the one it was blocked on.
func (c *Controller) blockedHold(node *corev1.Node, now time.Time) (time.Duration, bool) {
	reason := node.Annotations[decide.AnnotationBlocked]
	if reason == "" {
		return 0, false
	}
	if node.Spec.ProviderID != node.Annotations[decide.AnnotationBlockedProviderID] {
		return 0, false
	}
	at, ok := parseTS(node.Annotations[decide.AnnotationBlockedAt])
	if !ok {
		return 0, false
	}
	wait := at.Add(c.cfg.BlockedRecheck).Sub(now)
	if wait <= 0 {
		return 0, false
	}
	c.blocked(node, reason, fmt.Sprintf("node Blocked since %s (%s); looked at again in %s or when its providerID changes", ts(at), reason, wait.Round(time.Second)))
	return wait, true
}

// clearBlocked removes the Blocked record of a node that no longer needs remediation.
func (c *Controller) clearBlocked(ctx context.Context, node *corev1.Node) error {
	patch := nodePatch{annotations: map[string]*string{}}
	for _, k := range blockedAnnotations {
		if _, ok := node.Annotations[k]; ok {
			patch.annotations[k] = nil
		}
	}
	if len(patch.annotations) == 0 {
		return nil
	}
	_, err := c.patchNode(ctx, node, patch)
	return err
}

// retryLater counts a transient cloud failure and returns when to try again: exponential
// backoff per node (DefaultCloudBackoffBase doubling up to DefaultCloudBackoffMax) with ±20%
// jitter, so that many nodes failing together (a throttling storm) do not retry in lockstep.
func (c *Controller) retryLater(node *corev1.Node, op string, err error) time.Duration {
	kind := c.countCloudError(op, err)
	c.mu.Lock()
	m := c.memoryLocked(node.Name)
	n := m.cloudFailures
	m.cloudFailures++
	c.mu.Unlock()
	delay := DefaultCloudBackoffMax
	if n < 16 {
		delay = min(DefaultCloudBackoffBase<<n, DefaultCloudBackoffMax)
	}
	delay = time.Duration(float64(delay) * (0.8 + 0.4*rand.Float64()))
	c.log.Warn("cloud call failed; retrying with backoff", "node", node.Name, "operation", op, "reason", kind, "err", err, "retry_in", delay.Round(time.Millisecond))
	return delay
}

// countCloudError counts a failed cloud call and returns its kind.
func (c *Controller) countCloudError(op string, err error) string {
	kind := cloudErrorKind(err)
	c.metrics.cloudErrors.WithLabelValues(op, kind).Inc()
	return kind
}

// cloudSucceeded resets the node's backoff and NotFound confirmation.
func (c *Controller) cloudSucceeded(name string) {
	c.mu.Lock()
	if m, ok := c.memory[name]; ok {
		m.cloudFailures = 0
		m.notFoundSince = time.Time{}
	}
	c.mu.Unlock()
}

// notFoundSince returns since when the node's instance has been seen NotFound, starting now.
func (c *Controller) notFoundSince(name string, now time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.memoryLocked(name)
	if m.notFoundSince.IsZero() {
		m.notFoundSince = now
	}
	return m.notFoundSince
}

func (c *Controller) clearNotFound(name string) {
	c.mu.Lock()
	if m, ok := c.memory[name]; ok {
		m.notFoundSince = time.Time{}
	}
	c.mu.Unlock()
}

// dryRun decides as the real pipeline would and records "would terminate" once per decision:
// an Event, the terminations_total{result="DryRun"} counter, a log line and the
// nodevigil.io/dry-run-decision annotation. Nothing else changes.
func (c *Controller) dryRun(ctx context.Context, node *corev1.Node, p *config.Policy, d decide.Decision, now time.Time) (time.Duration, error) {
	if decide.PhaseOf(node) != decide.PhaseNone {
		c.log.Debug("dry-run: not advancing a remediation recorded on the node", "node", node.Name, "reason", d.Reason)
		return 0, nil
	}
	verb, event := "Terminate", EventWouldTerminate
	if p.Action == config.ActionCordonOnly {
		verb, event = "Cordon", EventWouldCordon
	}
	if p.Action == config.ActionTerminate {
		if _, _, err := c.parseID(node.Spec.ProviderID); err != nil {
			c.blocked(node, BlockInvalidProviderID, fmt.Sprintf("dry-run: would not remediate: %v", err))
			return c.cfg.BlockedRequeue, nil
		}
	}
	c.gateMu.Lock()
	reason, msg := c.checkRails(node, p, stepDryRun, now)
	c.gateMu.Unlock()
	if reason != "" {
		c.blocked(node, reason, "dry-run: "+msg)
		return c.cfg.BlockedRequeue, nil
	}
	c.unblocked(node.Name)
	prefix := verb + " " + d.Reason + " "
	if strings.HasPrefix(node.Annotations[decide.AnnotationDryRunDecision], prefix) {
		return 0, nil
	}
	if _, err := c.patchNode(ctx, node, nodePatch{annotations: map[string]*string{decide.AnnotationDryRunDecision: ptr.To(prefix + ts(now))}}); err != nil {
		return 0, err
	}
	if verb == "Terminate" {
		c.metrics.terminations.WithLabelValues(string(ResultDryRun)).Inc()
	}
	c.recorder.Eventf(node, corev1.EventTypeWarning, event, "dry-run: would %s under policy %s: %s", strings.ToLower(verb), p.Name, d.Message)
	c.log.Warn("dry-run: would remediate", "node", node.Name, "reason", d.Reason, "policy", p.Name, "action", verb)
	return 0, nil
}

// clearDryRun removes a stale dry-run record from a node that no longer needs remediation.
func (c *Controller) clearDryRun(ctx context.Context, node *corev1.Node) error {
	if _, ok := node.Annotations[decide.AnnotationDryRunDecision]; !ok {
		return nil
	}
	_, err := c.patchNode(ctx, node, nodePatch{annotations: map[string]*string{decide.AnnotationDryRunDecision: nil}})
	return err
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
