package remediation

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/decide"
)

// mirrorPodAnnotation marks static pods' API mirrors; they cannot be evicted.
const mirrorPodAnnotation = "kubernetes.io/config.mirror"

// drainResult says whether the drain is finished and, if not, when to try again.
type drainResult struct {
	done    bool
	requeue time.Duration
	err     error
}

// drain evicts the node's pods through the Eviction API, so PodDisruptionBudgets are honoured
// by the API server itself. It is one pass; the pipeline calls it again until it is done.
//
// Skipped: DaemonSet pods (the DaemonSet controller would recreate them on the node, and they
// tolerate unschedulable), mirror pods (static pods cannot be evicted) and finished pods. With
// honorDoNotDisrupt, pods annotated karpenter.sh/do-not-disrupt=true are not evicted: they hold
// the drain until they leave on their own or the drain timeout passes, like PDB-refused
// evictions. The timeout bounds everything; then onTimeout decides — Proceed terminates the
// node with them still on it (it is judged dead, so they are not serving), Wait keeps waiting
// (and keeps the node's in-flight slot).
//
// A pod counts as drained once its eviction was accepted and its deletion grace period (its
// deletionTimestamp) has passed. Waiting for the object to disappear would wait forever on a
// dead node, whose kubelet never confirms; the pod's replacement is already scheduled
// elsewhere once the eviction was accepted.
//
// Pods are listed with a spec.nodeName field selector at drain time rather than cached: a
// cluster-wide pod informer would cost the remediator far more memory than the rare drains.
func (c *Controller) drain(ctx context.Context, node *corev1.Node, p *config.Policy, now time.Time) drainResult {
	pods, err := c.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node.Name).String(),
	})
	if err != nil {
		return drainResult{err: fmt.Errorf("list pods on node %s: %w", node.Name, err)}
	}
	var (
		refused, vetoed, failed []string
		terminatingUntil        time.Time
		evicted                 int
	)
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.Spec.NodeName != node.Name || skipDrain(pod) {
			continue
		}
		ref := pod.Namespace + "/" + pod.Name
		if pod.DeletionTimestamp != nil {
			if t := pod.DeletionTimestamp.Time; t.After(now) && t.After(terminatingUntil) {
				terminatingUntil = t
			}
			continue
		}
		if p.Drain.HonorDoNotDisrupt && pod.Annotations[decide.AnnotationDoNotDisrupt] == "true" {
			vetoed = append(vetoed, ref)
			continue
		}
		err := c.client.PolicyV1().Evictions(pod.Namespace).Evict(ctx, &policyv1.Eviction{
			ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		})
		switch {
		case err == nil:
			evicted++
			// The pod now terminates; look again once its grace period has passed.
			grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
			if pod.Spec.TerminationGracePeriodSeconds != nil {
				grace = *pod.Spec.TerminationGracePeriodSeconds
			}
			if t := now.Add(time.Duration(grace) * time.Second); t.After(terminatingUntil) {
				terminatingUntil = t
			}
		case apierrors.IsNotFound(err):
		case apierrors.IsTooManyRequests(err):
			refused = append(refused, ref)
		default:
			if ctx.Err() != nil {
				return drainResult{err: ctx.Err()}
			}
			failed = append(failed, fmt.Sprintf("%s: %v", ref, err))
		}
	}
	if evicted > 0 {
		c.log.Info("pods evicted", "node", node.Name, "count", evicted)
	}

	if len(refused) == 0 && len(failed) == 0 && len(vetoed) == 0 && !terminatingUntil.After(now) {
		c.unblocked(node.Name)
		c.recorder.Event(node, corev1.EventTypeNormal, EventDrainCompleted, "every evictable pod was evicted")
		return drainResult{done: true}
	}

	started, ok := parseTS(node.Annotations[decide.AnnotationDrainStartedAt])
	if !ok {
		started = now
	}
	deadline := started.Add(p.Drain.Timeout)
	if !now.Before(deadline) {
		msg := fmt.Sprintf("drain did not finish within %s: %d pod(s) annotated %s=true (%s), %d eviction(s) refused by a PodDisruptionBudget (%s), %d failed (%s), pods terminating until %s",
			p.Drain.Timeout, len(vetoed), decide.AnnotationDoNotDisrupt, list(vetoed), len(refused), list(refused), len(failed), list(failed), ts(terminatingUntil))
		if p.Drain.OnTimeout == config.OnTimeoutProceed {
			c.recorder.Event(node, corev1.EventTypeWarning, BlockDrainTimeout, msg+"; proceeding (onTimeout Proceed)")
			c.log.Warn("drain timed out; proceeding", "node", node.Name, "duration", p.Drain.Timeout)
			return drainResult{done: true}
		}
		c.blocked(node, BlockDrainTimeout, msg+"; waiting (onTimeout Wait): the node keeps its in-flight slot until the drain finishes, the node recovers or an operator steps in")
		return drainResult{requeue: c.cfg.DrainRetryInterval}
	}

	requeue := c.cfg.DrainRetryInterval
	if len(refused) == 0 && len(failed) == 0 && len(vetoed) == 0 {
		requeue = terminatingUntil.Sub(now)
	}
	switch {
	case len(vetoed) > 0:
		c.blocked(node, BlockDoNotDisrupt, fmt.Sprintf("drain waiting for %d pod(s) annotated %s=true to leave (%s) until %s, then onTimeout %s decides",
			len(vetoed), decide.AnnotationDoNotDisrupt, list(vetoed), ts(deadline), p.Drain.OnTimeout))
	case len(refused) > 0:
		c.blocked(node, BlockEvictionRefused, fmt.Sprintf("%d eviction(s) refused by a PodDisruptionBudget, retrying until %s, then onTimeout %s decides: %s",
			len(refused), ts(deadline), p.Drain.OnTimeout, list(refused)))
	}
	if len(failed) > 0 {
		c.log.Info("evictions failed; retrying", "node", node.Name, "err", list(failed))
	}
	return drainResult{requeue: min(requeue, deadline.Sub(now))}
}

// skipDrain reports whether a pod is left alone by the drain.
func skipDrain(pod *corev1.Pod) bool {
	if _, ok := pod.Annotations[mirrorPodAnnotation]; ok {
		return true
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return true
	}
	for _, o := range pod.OwnerReferences {
		if o.Controller != nil && *o.Controller && o.Kind == "DaemonSet" {
			return true
		}
	}
	return false
}

// list shortens a list of pod references for a message.
func list(refs []string) string {
	const max = 5
	if len(refs) == 0 {
		return "none"
	}
	if len(refs) <= max {
		return strings.Join(refs, ", ")
	}
	return strings.Join(refs[:max], ", ") + fmt.Sprintf(" and %d more", len(refs)-max)
}
