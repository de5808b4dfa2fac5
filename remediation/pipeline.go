package remediation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
// mark → cordon → drain → terminate → confirm → delete the Node.
func (c *Controller) remediate(ctx context.Context, node *corev1.Node, p *config.Policy, d decide.Decision, now time.Time) (time.Duration, error) {
	if decide.PhaseOf(node) == decide.PhaseNone {
		n, requeue, err := c.mark(ctx, node, p, d, now)
		if n == nil {
			return requeue, err
		}
		node = n
	}
	fresh := false // the termination was requested in this reconcile
	for {
		switch decide.PhaseOf(node) {
		case decide.PhaseMarked:
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
			if decide.PhaseOf(node) == decide.PhaseCordoned && p.Drain.Enabled {
				n, err := c.setPhase(ctx, node, decide.PhaseDraining, map[string]*string{decide.AnnotationDrainStartedAt: ptr.To(ts(now))})
				if err != nil {
					return 0, err
				}
				c.recorder.Eventf(n, corev1.EventTypeNormal, EventDrainStarted, "draining through the Eviction API (timeout %s, on timeout %s, honour %s: %v)",
					p.Drain.Timeout, p.Drain.OnTimeout, decide.AnnotationDoNotDisrupt, p.Drain.HonorDoNotDisrupt)
				node = n
			}
			if decide.PhaseOf(node) == decide.PhaseDraining && p.Drain.Enabled {
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

// mark applies the safety rails and records the decision on the node. It returns a nil node
// when the node was not marked.
func (c *Controller) mark(ctx context.Context, node *corev1.Node, p *config.Policy, d decide.Decision, now time.Time) (*corev1.Node, time.Duration, error) {
	if p.Action == config.ActionTerminate {
		if _, _, err := c.parseID(node.Spec.ProviderID); err != nil {
			c.blocked(node, BlockInvalidProviderID, fmt.Sprintf("not remediating: %v; only EC2 instances named by an aws:/// provider ID are terminated", err))
			return nil, c.cfg.BlockedRequeue, nil
		}
	}
	// The rails and the in-flight reservation are decided under gateMu; the patch is sent
	// after releasing it, so that marking many nodes at once (a zone losing power) does not
	// serialise every worker behind one API round trip each. A failed patch gives the slot back.
	c.gateMu.Lock()
	if reason, msg := c.checkRails(node, p, stepMark, now); reason != "" {
		c.gateMu.Unlock()
		c.blocked(node, reason, msg)
		return nil, c.cfg.BlockedRequeue, nil
	}
	c.reserveLocked(node.Name, p.Name, now)
	c.gateMu.Unlock()
	ann := map[string]*string{
		decide.AnnotationState:     ptr.To(string(decide.PhaseMarked)),
		decide.AnnotationReason:    ptr.To(d.Reason),
		decide.AnnotationPolicy:    ptr.To(p.Name),
		decide.AnnotationStartedAt: ptr.To(ts(now)),
	}
	if node.Spec.Unschedulable {
		ann[decide.AnnotationWasUnschedulable] = ptr.To("true")
	}
	n, err := c.patchNode(ctx, node, nodePatch{annotations: ann})
	if err != nil {
		c.gateMu.Lock()
		delete(c.reservations, node.Name)
		c.gateMu.Unlock()
		return nil, 0, err
	}
	c.unblocked(node.Name)
	c.recorder.Eventf(n, corev1.EventTypeWarning, EventRemediationStarted, "remediating under policy %s (action %s) for %s: %s", p.Name, p.Action, d.Reason, d.Message)
	c.log.Warn("remediation started", "node", node.Name, "reason", d.Reason, "policy", p.Name, "action", string(p.Action))
	return n, 0, nil
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
// takes a rate limiter token and records Terminating. It returns a nil node when blocked.
func (c *Controller) beginTermination(ctx context.Context, node *corev1.Node, p *config.Policy, now time.Time) (*corev1.Node, time.Duration, error) {
	if _, _, err := c.parseID(node.Spec.ProviderID); err != nil {
		c.blocked(node, BlockInvalidProviderID, fmt.Sprintf("not terminating: %v", err))
		return nil, c.cfg.BlockedRequeue, nil
	}
	c.gateMu.Lock()
	reason, msg := c.checkRails(node, p, stepTerminate, now)
	c.gateMu.Unlock()
	if reason != "" {
		c.blocked(node, reason, msg)
		return nil, c.cfg.BlockedRequeue, nil
	}
	r, wait := c.takeTermination(now)
	if r == nil {
		rl := c.rc.TerminationRateLimit
		c.blocked(node, BlockRateLimited, fmt.Sprintf("termination rate limit (%g per minute, burst %d) reached; next slot in %s", rl.PerMinute, rl.Burst, wait.Round(time.Millisecond)))
		return nil, wait, nil
	}
	n, err := c.setPhase(ctx, node, decide.PhaseTerminating, map[string]*string{decide.AnnotationTerminationRequestedAt: ptr.To(ts(now))})
	if err != nil {
		r.CancelAt(now)
		return nil, 0, err
	}
	c.unblocked(node.Name)
	return n, 0, nil
}

// terminate requests the termination of the node's instance and confirms it. It returns the
// node in PhaseTerminated once EC2 shows the instance shutting down or gone, or a nil node and
// when to look again.
func (c *Controller) terminate(ctx context.Context, node *corev1.Node, d decide.Decision, fresh bool, now time.Time) (*corev1.Node, time.Duration, error) {
	_, id, err := c.parseID(node.Spec.ProviderID)
	if err != nil {
		c.blocked(node, BlockInvalidProviderID, fmt.Sprintf("not terminating: %v", err))
		return nil, c.cfg.BlockedRequeue, nil
	}
	requestedAt, ok := parseTS(node.Annotations[decide.AnnotationTerminationRequestedAt])
	if !ok {
		requestedAt = now
	}
	notFoundProofAt := requestedAt.Add(c.cfg.TerminationConfirmDelay)

	if !fresh {
		// Resuming (a requeue or a new leader): look before asking again.
		inst, found, err := c.cloud.Describe(ctx, id)
		if err != nil {
			return nil, 0, fmt.Errorf("describe instance %s: %w", id, err)
		}
		switch {
		case found && instanceGone(inst.State):
			return c.confirmed(ctx, node, id, inst.State)
		case found && !inst.Owned:
			c.blocked(node, BlockNotOwned, fmt.Sprintf("instance %s lacks the cluster ownership tag; it is never terminated", id))
			return nil, c.cfg.BlockedRequeue, nil
		case !found && !now.Before(notFoundProofAt):
			return c.confirmed(ctx, node, id, "not found")
		}
	}

	if fresh && !d.EligibleAt.IsZero() && d.EligibleAt.After(c.observingSinceTime()) {
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
		c.unblocked(node.Name)
		c.recorder.Eventf(node, corev1.EventTypeWarning, EventTerminationRequested, "requested termination of instance %s (%s: %s → %s)", id, out.Result, out.PreviousState, out.CurrentState)
		log.Warn("instance termination requested", "result", string(out.Result))
	case ResultNotFound:
		if !now.Before(notFoundProofAt) {
			return c.confirmed(ctx, node, id, "not found")
		}
		log.Info("instance not found yet; waiting before taking it as gone", "duration", notFoundProofAt.Sub(now))
		return nil, notFoundProofAt.Sub(now), nil
	case ResultNotOwned:
		c.blocked(node, BlockNotOwned, fmt.Sprintf("instance %s lacks the cluster ownership tag; it is never terminated: %v", id, out.Err))
		return nil, c.cfg.BlockedRequeue, nil
	case ResultUnauthorized:
		c.blocked(node, BlockUnauthorized, fmt.Sprintf("not allowed to terminate instance %s (check the IAM policy): %v", id, out.Err))
		return nil, c.cfg.BlockedRequeue, nil
	default:
		return nil, 0, fmt.Errorf("terminate instance %s: %w", id, errors.Join(err, out.Err))
	}

	inst, found, err := c.cloud.Describe(ctx, id)
	if err != nil {
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

// release hands a recovered node back: taint and cordon removed (the cordon only if the
// remediator set it), remediation record removed.
func (c *Controller) release(ctx context.Context, node *corev1.Node, d decide.Decision) (time.Duration, error) {
	if c.rc.DryRun {
		c.log.Info("dry-run: would release node", "node", node.Name, "reason", d.Reason)
		return d.RequeueAfter, nil
	}
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
	cordonedByUs := decide.PhaseOf(node) != decide.PhaseMarked && node.Annotations[decide.AnnotationWasUnschedulable] != "true"
	if node.Spec.Unschedulable && cordonedByUs {
		patch.unschedulable = ptr.To(false)
	}
	n, err := c.patchNode(ctx, node, patch)
	if err != nil {
		return 0, err
	}
	c.gateMu.Lock()
	delete(c.reservations, node.Name)
	c.gateMu.Unlock()
	c.unblocked(node.Name)
	c.recorder.Event(n, corev1.EventTypeNormal, EventReleased, d.Message)
	c.log.Info("node released", "node", node.Name, "reason", d.Reason)
	return d.RequeueAfter, nil
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
