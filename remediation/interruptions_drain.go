package remediation

// This file is the drain of a node AWS is about to interrupt. It evicts through the Eviction
// API like remediation's drain (drain.go: PodDisruptionBudgets are honoured by the API server,
// DaemonSet, mirror and finished pods are skipped), with two differences that come from the
// clock being AWS's:
//
//   - Pods annotated karpenter.sh/do-not-disrupt=true are evicted last: only once every other
//     pod has left (its eviction accepted and its grace period over), or at the latest their own
//     grace period before the deadline, so that they still end before AWS acts. With the
//     policy's interruptions.doNotDisruptPods Keep they are never evicted.
//   - The deadline is the event's (the spot action time; a scheduled event's NotBefore minus
//     interruptions.margin), not drain.timeout. When it passes with pods still on the node, a
//     Warning Event InterruptionDeadlineReached says which and what happens next: nodevigil
//     keeps evicting what it may until AWS acts; kept do-not-disrupt pods stay.

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/decide"
)

// Event reasons of interruption drains.
const (
	EventInterruptionDeadline    = "InterruptionDeadlineReached"
	EventInterruptionEvictingDND = "InterruptionEvictingDoNotDisrupt"
)

// interruptionDrainResult is one pass of an interruption drain.
type interruptionDrainResult struct {
	// done: every pod the policy lets nodevigil evict has left.
	done bool
	// kept lists do-not-disrupt pods left on the node by policy (Keep).
	kept    []string
	requeue time.Duration
}

// podGrace is the pod's termination grace period.
func podGrace(pod *corev1.Pod) time.Duration {
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		return time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return time.Duration(corev1.DefaultTerminationGracePeriodSeconds) * time.Second
}

// drainForInterruption is one pass of the drain of a node cordoned for gov.
func (c *Controller) drainForInterruption(ctx context.Context, node *corev1.Node, p *config.Policy, gov InterruptionPlan, now time.Time) (interruptionDrainResult, error) {
	pods, err := c.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node.Name).String(),
	})
	if err != nil {
		return interruptionDrainResult{}, fmt.Errorf("list pods on node %s: %w", node.Name, err)
	}
	keep := p.Interruptions.DoNotDisruptPods == config.DoNotDisruptKeep
	deadline := gov.FinishBy
	var (
		dnd, kept, waiting []string
		plainPods, dndPods []*corev1.Pod
		terminatingUntil   time.Time
		plainTerminating   bool
	)
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.Spec.NodeName != node.Name || skipDrain(pod) {
			continue
		}
		ref := pod.Namespace + "/" + pod.Name
		isDND := pod.Annotations[decide.AnnotationDoNotDisrupt] == "true"
		if pod.DeletionTimestamp != nil {
			if t := pod.DeletionTimestamp.Time; t.After(now) {
				terminatingUntil = later(terminatingUntil, t)
				waiting = append(waiting, ref)
				plainTerminating = plainTerminating || !isDND
			}
			continue
		}
		switch {
		case isDND && keep:
			kept = append(kept, ref)
		case isDND:
			dnd, dndPods = append(dnd, ref), append(dndPods, pod)
		default:
			plainPods = append(plainPods, pod)
		}
	}
	requeue := c.cfg.DrainRetryInterval
	pending := len(plainPods) > 0 || plainTerminating
	evict := func(pod *corev1.Pod) error {
		err := c.client.PolicyV1().Evictions(pod.Namespace).Evict(ctx, &policyv1.Eviction{
			ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		})
		ref := pod.Namespace + "/" + pod.Name
		switch {
		case err == nil:
			terminatingUntil = later(terminatingUntil, now.Add(podGrace(pod)))
			waiting = append(waiting, ref)
		case apierrors.IsNotFound(err):
		case apierrors.IsTooManyRequests(err):
			waiting = append(waiting, ref+" (refused by a PodDisruptionBudget)")
		default:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			waiting = append(waiting, ref)
			c.log.Info("eviction failed; retrying", "node", node.Name, "err", err)
		}
		return nil
	}
	for _, pod := range plainPods {
		if err := evict(pod); err != nil {
			return interruptionDrainResult{}, err
		}
	}
	// Do-not-disrupt pods: after every other pod has left, or their grace period before the
	// deadline at the latest.
	var early []string
	for _, pod := range dndPods {
		latest := time.Time{}
		if !deadline.IsZero() {
			latest = deadline.Add(-podGrace(pod))
		}
		switch {
		case !pending:
		case !latest.IsZero() && !now.Before(latest):
			early = append(early, pod.Namespace+"/"+pod.Name)
		default:
			if !latest.IsZero() {
				requeue = min(requeue, latest.Sub(now))
			}
			waiting = append(waiting, pod.Namespace+"/"+pod.Name+" (do-not-disrupt, evicted last)")
			continue
		}
		if err := evict(pod); err != nil {
			return interruptionDrainResult{}, err
		}
	}
	if len(dndPods) > 0 && (!pending || len(early) > 0) && c.intr.note(node.Name, "dnd/"+gov.Interruption.ID) {
		why := "every other pod has left"
		if len(early) > 0 {
			why = fmt.Sprintf("the deadline %s is one grace period away", ts(deadline))
		}
		c.recorder.Eventf(node, corev1.EventTypeNormal, EventInterruptionEvictingDND, "evicting %d pod(s) annotated %s=true last (%s): %s",
			len(dnd), decide.AnnotationDoNotDisrupt, why, list(dnd))
	}
	if len(waiting) == 0 {
		return interruptionDrainResult{done: true, kept: kept}, nil
	}
	if terminatingUntil.After(now) {
		requeue = min(requeue, terminatingUntil.Sub(now))
	}
	if !deadline.IsZero() {
		if now.Before(deadline) {
			requeue = min(requeue, deadline.Sub(now))
		} else if c.intr.note(node.Name, "deadline/"+gov.Interruption.ID) {
			msg := fmt.Sprintf("the drain for %s (%s) did not finish by %s (the event's deadline minus the margin): %d pod(s) still leaving or refused (%s); nodevigil keeps evicting until AWS acts at %s",
				gov.Interruption.Code, gov.Interruption.ID, ts(deadline), len(waiting), list(waiting), ts(gov.Interruption.NotBefore))
			if len(kept) > 0 {
				msg += fmt.Sprintf("; %d do-not-disrupt pod(s) are kept by interruptions.doNotDisruptPods Keep and will be interrupted with the instance (%s)", len(kept), list(kept))
			}
			c.recorder.Event(node, corev1.EventTypeWarning, EventInterruptionDeadline, msg)
			c.log.Warn("interruption drain missed its deadline", "node", node.Name, "reason", gov.Interruption.Code)
		}
	}
	return interruptionDrainResult{kept: kept, requeue: max(requeue, 0)}, nil
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
