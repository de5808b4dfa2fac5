package remediation

// This file is the first act step: mark (rails, in-flight slot, the instance verified, the
// decision recorded), verify (DescribeInstances before anything disruptive) and cordon.

import (
	"context"
	"fmt"
	"time"

	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/decide"
	"github.com/nodevigil/nodevigil/remediation/providerid"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// mark applies the safety rails, verifies the instance and records the decision on the node.
// It returns a nil node when the node was not marked.
func (c *Controller) mark(ctx context.Context, node *corev1.Node, p *config.Policy, d decide.Decision, now time.Time) (*corev1.Node, time.Duration, error) {
	if p.Action == config.ActionTerminate {
		if _, _, err := providerid.Parse(node.Spec.ProviderID); err != nil {
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
	_, id, perr := providerid.Parse(node.Spec.ProviderID)
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
