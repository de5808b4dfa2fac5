package remediation

// This file is the first act step: mark (rails, in-flight slot, the instance verified, the
// decision recorded together with the cordon and, when the policy drains, the start of the
// drain), verify (DescribeInstances before anything disruptive) and cordon (resuming a node
// another leader left Marked).

import (
	"context"
	"fmt"
	"time"

	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/decide"
	"github.com/nodevigil/nodevigil/remediation/providerid"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// mark applies the safety rails, verifies the instance, and records the decision on the node in
// the same patch as the first disruptive step: the node is cordoned and tainted (phase
// Cordoned) and, when the policy terminates after a drain, the drain begins (phase Draining,
// AnnotationDrainStartedAt). It returns a nil node when the node was not marked.
//
// One patch instead of three (Marked, Cordoned, Draining) matters when many nodes are due at
// once: a zone of 50 nodes cost 150 patches before the first eviction, most of the API
// client's burst, and every round trip a worker holds delays the nodes queued behind it
// (docs/benchmarks.md, session 7). Nothing is taken earlier than before: the instance is
// described first, the decision is recomputed and the rails of the cordon and the drain are
// checked after the Describe, immediately before the patch, exactly as the separate steps did.
//
// A policy that terminates without a drain has nothing to do between the cordon and the
// termination request, so the marking patch also records the intent to terminate
// (AnnotationTerminationRequestedAt, as beginTermination would) when the rails of the
// termination pass and the rate limiter has a token: intent reports that, and the caller
// goes straight to TerminateInstances. When many nodes are due at once the API server's Node
// writes are what the last of them waits for (a worker holds each node for its writes, and 16
// workers share 50 nodes): a separate intent patch was one of the two writes between a node's
// toleration ending and its TerminateInstances, and one of three per node in all
// (docs/benchmarks.md, session 9). Nothing is taken earlier than before: the instance was
// described, the decision recomputed and the rails checked just before this one patch, as they
// were before the intent patch. Without a token, or with the termination's rails closed, the
// node is marked alone and beginTermination waits and reports as before.
func (c *Controller) mark(ctx context.Context, node *corev1.Node, p *config.Policy, d decide.Decision, now time.Time) (n *corev1.Node, intent bool, requeue time.Duration, err error) {
	if p.Action == config.ActionTerminate {
		if _, _, err := providerid.Parse(node.Spec.ProviderID); err != nil {
			n, requeue, err := c.blockAndRelease(ctx, node, BlockInvalidProviderID, fmt.Sprintf("not remediating: %v; only EC2 instances named by an aws:/// provider ID are terminated", err))
			return n, false, requeue, err
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
		return nil, false, c.cfg.BlockedRequeue, nil
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
			return nil, false, requeue, err
		}
		// The Describe took time: judge again on what the caches say now, and apply the
		// rails of the cordon (and the drain) as their own step would.
		now = c.clock.Now()
		if nd := decide.Decide(c.input(node, p, now)); nd.Action != decide.ActionRemediate {
			return nil, false, nd.RequeueAfter, nil
		}
		if c.railsBlock(node, p, stepCordon, now) {
			return nil, false, c.cfg.BlockedRequeue, nil
		}
	}
	phase := decide.PhaseCordoned
	drains := p.Action == config.ActionTerminate && p.Drain.Enabled
	if drains {
		phase = decide.PhaseDraining
	}
	ann := map[string]*string{
		decide.AnnotationState:     ptr.To(string(phase)),
		decide.AnnotationReason:    ptr.To(d.Reason),
		decide.AnnotationPolicy:    ptr.To(p.Name),
		decide.AnnotationStartedAt: ptr.To(ts(now)),
	}
	if drains {
		ann[decide.AnnotationDrainStartedAt] = ptr.To(ts(now))
	}
	var token *rate.Reservation
	if p.Action == config.ActionTerminate && !drains {
		c.gateMu.Lock()
		if reason, _ := c.checkRails(node, p, stepTerminate, now); reason == "" {
			token, _ = c.takeTermination(now)
		}
		c.gateMu.Unlock()
		if token != nil {
			ann[decide.AnnotationTerminationRequestedAt] = ptr.To(ts(now))
		}
	}
	for _, k := range blockedAnnotations {
		if _, ok := node.Annotations[k]; ok {
			ann[k] = nil
		}
	}
	if node.Spec.Unschedulable {
		ann[decide.AnnotationWasUnschedulable] = ptr.To("true")
	}
	taints := withTaint(node.Spec.Taints)
	n, err = c.patchNode(ctx, node, nodePatch{annotations: ann, unschedulable: ptr.To(true), taints: &taints})
	if err != nil {
		if token != nil {
			token.CancelAt(now)
		}
		return nil, false, 0, err
	}
	marked = true
	c.unblocked(node.Name)
	c.recorder.Eventf(n, corev1.EventTypeWarning, EventRemediationStarted, "remediating under policy %s (action %s) for %s: %s", p.Name, p.Action, d.Reason, d.Message)
	c.log.Warn("remediation started", "node", node.Name, "reason", d.Reason, "policy", p.Name, "action", string(p.Action))
	c.cordoned(n)
	if drains {
		c.drainStarted(n, p)
	}
	return n, token != nil, 0, nil
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
	c.cordoned(n)
	return n, nil
}

// cordoned reports a cordon: an Event and a log line.
func (c *Controller) cordoned(n *corev1.Node) {
	c.recorder.Eventf(n, corev1.EventTypeNormal, EventCordoned, "cordoned and tainted %s:NoSchedule", decide.TaintRemediating)
	c.log.Info("node cordoned", "node", n.Name, "taint", decide.TaintRemediating)
}

// drainStarted reports the start of a drain with an Event.
func (c *Controller) drainStarted(n *corev1.Node, p *config.Policy) {
	c.recorder.Eventf(n, corev1.EventTypeNormal, EventDrainStarted, "draining through the Eviction API (timeout %s, on timeout %s, honour %s: %v); the node counts against maxInFlight until it is terminated or released",
		p.Drain.Timeout, p.Drain.OnTimeout, decide.AnnotationDoNotDisrupt, p.Drain.HonorDoNotDisrupt)
}
