package remediation

// This file hands nodes back: release (a node that recovered or may no longer be touched) and
// Blocked (an obstacle retrying cannot fix: the node is released and looked at again later).

import (
	"context"
	"fmt"
	"time"

	"github.com/nodevigil/nodevigil/remediation/decide"
	"github.com/nodevigil/nodevigil/remediation/providerid"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

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
		if _, id, err := providerid.Parse(node.Spec.ProviderID); err == nil {
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
