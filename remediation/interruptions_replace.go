package remediation

// This file is Replace, the scheduledRetirement action that does not wait for AWS: once the
// node is drained, its instance is terminated early so the autoscaler replaces it on the pool's
// schedule instead of AWS's. The termination goes through remediation's own terminate step
// (terminate.go), with its guarantees: the instance is described first and never terminated
// without the cluster ownership tag; the point of no return ("terminating") is recorded only
// once EC2 accepted; after that the remediation pipeline finishes it (confirm, delete the
// Node). The rails apply as to a remediation's termination (storm pauses, maxUnhealthy, the
// termination rate limit); the node already holds one of the pool's maxInFlight slots (its
// interruption mark). dryRun never gets here (syncInterruptions only records what it would do).
//
// A terminal outcome (not owned, not allowed, not found, a providerID that is not EC2's) is
// recorded on the node (nodevigil.io/interruption-replace-blocked) with a Warning Event and
// blocked_total{reason}: the node stays drained and cordoned for AWS to retire, and no further
// termination is attempted for this event.

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/decide"
	"github.com/nodevigil/nodevigil/remediation/providerid"
)

// AnnotationInterruptionReplaceBlocked records why Replace will not terminate the instance
// ("<event ID>/<block reason>"); the node stays cordoned for AWS to retire.
const AnnotationInterruptionReplaceBlocked = "nodevigil.io/interruption-replace-blocked"

// ReasonInterruptionReplace is the remediation reason recorded on a node Replace terminates.
const ReasonInterruptionReplace = "InterruptionReplace"

// EventInterruptionReplacing says Replace is terminating the drained node's instance early.
const EventInterruptionReplacing = "InterruptionReplacing"

// replaceInstance terminates the instance of a node drained for gov (a Replace plan). It
// returns when to look again.
func (c *Controller) replaceInstance(ctx context.Context, node *corev1.Node, p *config.Policy, gov InterruptionPlan, now time.Time) (time.Duration, error) {
	if _, blocked := node.Annotations[AnnotationInterruptionReplaceBlocked]; blocked {
		return interruptionRecheck, nil
	}
	block := func(reason, msg string) (time.Duration, error) {
		if _, err := c.patchNode(ctx, node, nodePatch{annotations: map[string]*string{
			AnnotationInterruptionReplaceBlocked: ptr.To(gov.Interruption.ID + "/" + reason)}}); err != nil {
			return 0, err
		}
		c.blocked(node, reason, fmt.Sprintf("Replace for %s (%s): %s; the node stays drained and cordoned for AWS to retire", gov.Interruption.Code, gov.Interruption.ID, msg))
		return interruptionRecheck, nil
	}
	_, id, err := providerid.Parse(node.Spec.ProviderID)
	if err != nil {
		return block(BlockInvalidProviderID, fmt.Sprintf("not terminating: %v", err))
	}
	// Ownership before the point of no return.
	inst, found, err := c.cloud.Describe(ctx, id)
	switch {
	case err != nil && cloudErrorKind(err) == CloudErrorUnauthorized:
		c.countCloudError("Describe", err)
		return block(BlockUnauthorized, fmt.Sprintf("not allowed to describe instance %s (check the IAM policy: ec2:DescribeInstances): %v", id, err))
	case err != nil:
		return c.retryLater(node, "Describe", err), nil
	case !found:
		return block(BlockNotFound, fmt.Sprintf("instance %s does not exist in EC2", id))
	case !inst.Owned:
		return block(BlockNotOwned, fmt.Sprintf("instance %s lacks the cluster ownership tag; it is never terminated", id))
	}
	// The rails (pauses, maxUnhealthy), the rate limiter and the recorded intent.
	n, requeue, err := c.beginTermination(ctx, node, p, now)
	if n == nil {
		return max(requeue, time.Second), err
	}
	n, err = c.patchNode(ctx, n, nodePatch{annotations: map[string]*string{
		decide.AnnotationReason: ptr.To(ReasonInterruptionReplace), decide.AnnotationPolicy: ptr.To(p.Name)}})
	if err != nil {
		return 0, err
	}
	c.recorder.Eventf(n, corev1.EventTypeWarning, EventInterruptionReplacing,
		"drained for %s (%s, AWS acts at %s); terminating instance %s early (policy %s: Replace) so the autoscaler replaces it first",
		gov.Interruption.Code, gov.Interruption.ID, ts(gov.Interruption.NotBefore), id, p.Name)
	c.log.Warn("replacing node ahead of a scheduled retirement", "node", node.Name, "instance_id", id, "reason", gov.Interruption.Code)
	done, requeue, err := c.terminate(ctx, n, decide.Decision{}, true, c.clock.Now())
	if err != nil || done != nil {
		// Accepted (the pipeline finishes it from the recorded phase), or an error to retry.
		return max(requeue, time.Second), err
	}
	// Not accepted: a terminal refusal blocks and hands back (terminate.go); remember it so
	// the next pass does not ask again.
	cur, gerr := c.client.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
	if gerr == nil {
		if reason := cur.Annotations[decide.AnnotationBlocked]; reason != "" && decide.PhaseOf(cur) == decide.PhaseNone {
			if _, err := c.patchNode(ctx, cur, nodePatch{annotations: map[string]*string{
				AnnotationInterruptionReplaceBlocked: ptr.To(gov.Interruption.ID + "/" + reason)}}); err != nil {
				return 0, err
			}
		}
	}
	return max(requeue, time.Second), nil
}
