package remediation

// This file is the terminate act step: record the intent, call TerminateInstances, record the
// point of no return once EC2 accepted, confirm the instance is gone, delete the Node.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/decide"
	"github.com/nodevigil/nodevigil/remediation/providerid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// beginTermination applies the rails again (the world may have changed during the drain),
// takes a rate limiter token and records the intent to terminate
// (AnnotationTerminationRequestedAt, the phase unchanged). The phase becomes Terminating only
// once EC2 accepted the call; a leader that finds the intent without it looks at EC2 before
// asking again. It returns a nil node when blocked.
func (c *Controller) beginTermination(ctx context.Context, node *corev1.Node, p *config.Policy, now time.Time) (*corev1.Node, time.Duration, error) {
	if _, _, err := providerid.Parse(node.Spec.ProviderID); err != nil {
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
	_, id, err := providerid.Parse(node.Spec.ProviderID)
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
			if _, err := c.setPhase(ctx, unguarded, decide.PhaseTerminating, nil); err != nil {
				// The next attempt finds the intent, describes the instance and carries on.
				return nil, 0, err
			}
			// Confirming and deleting the Node are left to a later reconcile (the patch's
			// watch event queues one at once): they are past the point of no return and need
			// no hurry, while the worker is what other nodes due at the same moment wait for
			// (docs/benchmarks.md, session 6).
			return nil, c.cfg.ConfirmPollInterval, nil
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

// deletedTTL is how long the UID of a Node this replica deleted is remembered: far longer than
// the informer takes to deliver the deletion, even on a loaded API server.
const deletedTTL = 10 * time.Minute

// deleteNode deletes the Node object of a terminated instance, if it is still there. The UID
// precondition keeps a new Node that reuses the name safe.
//
// A Node this replica already deleted is not deleted again. Recording Terminated queues the
// node once more (the patch's own watch event), and that reconcile can run after the DELETE and
// before the informer has seen it: the cache still shows the Node Terminated. The repeated
// DELETE was harmless (the UID precondition; NotFound) but it was one request per node in 5 to
// 25 % of the terminations of a mass failure (63 DELETEs for 50 nodes with 16 workers,
// docs/benchmarks.md), each taking a token of the client's burst from nodes still on their way
// to the point of no return.
func (c *Controller) deleteNode(ctx context.Context, node *corev1.Node) (time.Duration, error) {
	if node.UID != "" && c.deletedBefore(node.UID) {
		c.forget(node.Name)
		return 0, nil
	}
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
	if node.UID != "" {
		c.rememberDeleted(node.UID)
	}
	c.forget(node.Name)
	return 0, nil
}

// rememberDeleted records that the Node with uid is gone, and drops records older than
// deletedTTL.
func (c *Controller) rememberDeleted(uid types.UID) {
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for u, at := range c.deleted {
		if now.Sub(at) > deletedTTL {
			delete(c.deleted, u)
		}
	}
	c.deleted[uid] = now
}

// deletedBefore reports whether this replica deleted (or found gone) the Node with uid.
func (c *Controller) deletedBefore(uid types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.deleted[uid]
	return ok && c.clock.Since(at) <= deletedTTL
}
