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

// doNotDisruptMode says what a drain does with pods annotated karpenter.sh/do-not-disrupt=true.
// It is the one thing the drain of a node judged dead and the drain of a node AWS is about to
// interrupt order differently; everything else (listing, skipping, evicting, waiting out grace
// periods, the deadline) is the same drain.
type doNotDisruptMode int

const (
	// dndEvict evicts them like any other pod (remediation, drain.honorDoNotDisrupt false).
	dndEvict doNotDisruptMode = iota
	// dndHold never evicts them: they hold the drain until they leave on their own or the
	// deadline passes (remediation, drain.honorDoNotDisrupt true).
	dndHold
	// dndLast evicts them once every other pod has left (its eviction accepted and its grace
	// period over), or at the latest their own grace period before the deadline, so that they
	// still end before AWS acts (interruptions, doNotDisruptPods EvictLast).
	dndLast
	// dndKeep never evicts them and does not wait for them (interruptions, doNotDisruptPods Keep).
	dndKeep
)

// drainOptions are what the caller of drainPass decides.
type drainOptions struct {
	doNotDisrupt doNotDisruptMode
	// deadline bounds the wait: a pass never asks to be called again after it, pastDeadline
	// says it has passed, and with dndLast the annotated pods are evicted at the latest their
	// grace period before it. What happens past it is the caller's: remediation's onTimeout,
	// or an interruption's Event while evicting on until AWS acts. Zero: no deadline.
	deadline time.Time
}

// drainState is what one pass of the drain found and did.
type drainState struct {
	// done: every pod the drain must see leave has left.
	done bool
	// requeue is when to look again if not done: at the end of the grace periods when only
	// terminating pods are left, else the retry interval, never past the deadline.
	requeue time.Duration
	// pastDeadline: the deadline is set and has passed.
	pastDeadline bool

	evicted          int       // evictions accepted in this pass
	terminatingUntil time.Time // the latest end of a pod's deletion grace period
	terminating      []string  // pods whose deletion grace period has not passed (evicted in this pass included)
	refused          []string  // evictions refused by a PodDisruptionBudget (429)
	failed           []string  // "ns/name: error" of other failed evictions, retried
	held             []string  // dndHold: annotated pods holding the drain
	deferred         []string  // dndLast: annotated pods waiting for the others to leave
	lastEvicted      []string  // dndLast: annotated pods evicted in this pass
	early            bool      // dndLast: some were evicted because the deadline is one grace period away
	kept             []string  // dndKeep: annotated pods left on the node
}

// waiting lists every pod the drain still waits for, for a message.
func (s drainState) waiting() []string {
	out := append([]string(nil), s.terminating...)
	for _, r := range s.refused {
		out = append(out, r+" (refused by a PodDisruptionBudget)")
	}
	out = append(out, s.failed...)
	for _, r := range s.held {
		out = append(out, r+" (do-not-disrupt)")
	}
	for _, r := range s.deferred {
		out = append(out, r+" (do-not-disrupt, evicted last)")
	}
	return out
}

// podGrace is the pod's termination grace period.
func podGrace(pod *corev1.Pod) time.Duration {
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		return time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return time.Duration(corev1.DefaultTerminationGracePeriodSeconds) * time.Second
}

// drainPass is one pass of a node's drain: it evicts the node's pods through the Eviction API,
// so PodDisruptionBudgets are honoured by the API server itself, and says what is left. Its
// callers call it again until it is done or their deadline decides: drain (remediation) and
// drainForInterruption (interruptions_drain.go).
//
// Skipped: DaemonSet pods (the DaemonSet controller would recreate them on the node, and they
// tolerate unschedulable), mirror pods (static pods cannot be evicted) and finished pods. Pods
// annotated karpenter.sh/do-not-disrupt=true are treated as opts.doNotDisrupt says.
//
// A pod counts as drained once its eviction was accepted and its deletion grace period (its
// deletionTimestamp) has passed. Waiting for the object to disappear would wait forever on a
// dead node, whose kubelet never confirms; the pod's replacement is already scheduled
// elsewhere once the eviction was accepted.
//
// Pods are listed with a spec.nodeName field selector at drain time rather than cached: a
// cluster-wide pod informer would cost the remediator far more memory than the rare drains.
func (c *Controller) drainPass(ctx context.Context, node *corev1.Node, opts drainOptions, now time.Time) (drainState, error) {
	pods, err := c.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node.Name).String(),
	})
	if err != nil {
		return drainState{}, fmt.Errorf("list pods on node %s: %w", node.Name, err)
	}
	var (
		s               drainState
		plain, lastPods []*corev1.Pod
		// othersLeft: no pod other than the annotated ones is on the node or terminating.
		othersLeft = true
	)
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.Spec.NodeName != node.Name || skipDrain(pod) {
			continue
		}
		ref := pod.Namespace + "/" + pod.Name
		dnd := pod.Annotations[decide.AnnotationDoNotDisrupt] == "true"
		if pod.DeletionTimestamp != nil {
			if t := pod.DeletionTimestamp.Time; t.After(now) {
				s.terminatingUntil = later(s.terminatingUntil, t)
				s.terminating = append(s.terminating, ref)
				othersLeft = othersLeft && dnd
			}
			continue
		}
		switch {
		case !dnd || opts.doNotDisrupt == dndEvict:
			plain = append(plain, pod)
			othersLeft = false
		case opts.doNotDisrupt == dndHold:
			s.held = append(s.held, ref)
		case opts.doNotDisrupt == dndKeep:
			s.kept = append(s.kept, ref)
		default:
			lastPods = append(lastPods, pod)
		}
	}
	var nextLast time.Time // the earliest time a deferred pod must be evicted
	for _, pod := range lastPods {
		ref := pod.Namespace + "/" + pod.Name
		var latest time.Time
		if !opts.deadline.IsZero() {
			latest = opts.deadline.Add(-podGrace(pod))
		}
		switch {
		case othersLeft:
		case !latest.IsZero() && !now.Before(latest):
			s.early = true
		default:
			if !latest.IsZero() && (nextLast.IsZero() || latest.Before(nextLast)) {
				nextLast = latest
			}
			s.deferred = append(s.deferred, ref)
			continue
		}
		s.lastEvicted = append(s.lastEvicted, ref)
		plain = append(plain, pod)
	}
	for _, pod := range plain {
		ref := pod.Namespace + "/" + pod.Name
		err := c.client.PolicyV1().Evictions(pod.Namespace).Evict(ctx, &policyv1.Eviction{
			ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		})
		switch {
		case err == nil:
			s.evicted++
			// The pod now terminates; look again once its grace period has passed.
			if t := now.Add(podGrace(pod)); t.After(now) {
				s.terminatingUntil = later(s.terminatingUntil, t)
				s.terminating = append(s.terminating, ref)
			}
		case apierrors.IsNotFound(err):
		case apierrors.IsTooManyRequests(err):
			s.refused = append(s.refused, ref)
		default:
			if ctx.Err() != nil {
				return drainState{}, ctx.Err()
			}
			s.failed = append(s.failed, fmt.Sprintf("%s: %v", ref, err))
		}
	}
	if s.evicted > 0 {
		c.log.Info("pods evicted", "node", node.Name, "count", s.evicted)
	}
	if len(s.failed) > 0 {
		c.log.Info("evictions failed; retrying", "node", node.Name, "err", list(s.failed))
	}

	blocked := len(s.refused) + len(s.failed) + len(s.held) + len(s.deferred)
	if blocked == 0 && !s.terminatingUntil.After(now) {
		s.done = true
		return s, nil
	}
	s.requeue = c.cfg.DrainRetryInterval
	if blocked == 0 {
		s.requeue = s.terminatingUntil.Sub(now)
	}
	if !nextLast.IsZero() {
		s.requeue = min(s.requeue, nextLast.Sub(now))
	}
	if !opts.deadline.IsZero() {
		if now.Before(opts.deadline) {
			s.requeue = min(s.requeue, opts.deadline.Sub(now))
		} else {
			s.pastDeadline = true
		}
	}
	s.requeue = max(s.requeue, 0)
	return s, nil
}

// drainResult says whether a remediation drain is finished and, if not, when to try again.
type drainResult struct {
	done    bool
	requeue time.Duration
	err     error
}

// drain is one pass of the drain of a node judged dead (drainPass); the pipeline calls it
// again until it is done.
//
// With drain.honorDoNotDisrupt, pods annotated karpenter.sh/do-not-disrupt=true are not
// evicted: they hold the drain until they leave on their own or the drain timeout passes, like
// PDB-refused evictions. The timeout bounds everything; then onTimeout decides — Proceed
// terminates the node with them still on it (it is judged dead, so they are not serving), Wait
// keeps waiting (and keeps the node's in-flight slot).
func (c *Controller) drain(ctx context.Context, node *corev1.Node, p *config.Policy, now time.Time) drainResult {
	started, ok := parseTS(node.Annotations[decide.AnnotationDrainStartedAt])
	if !ok {
		started = now
	}
	deadline := started.Add(p.Drain.Timeout)
	opts := drainOptions{doNotDisrupt: dndEvict, deadline: deadline}
	if p.Drain.HonorDoNotDisrupt {
		opts.doNotDisrupt = dndHold
	}
	s, err := c.drainPass(ctx, node, opts, now)
	if err != nil {
		return drainResult{err: err}
	}
	if s.done {
		c.unblocked(node.Name)
		c.recorder.Event(node, corev1.EventTypeNormal, EventDrainCompleted, "every evictable pod was evicted")
		return drainResult{done: true}
	}
	if s.pastDeadline {
		msg := fmt.Sprintf("drain did not finish within %s: %d pod(s) annotated %s=true (%s), %d eviction(s) refused by a PodDisruptionBudget (%s), %d failed (%s), pods terminating until %s",
			p.Drain.Timeout, len(s.held), decide.AnnotationDoNotDisrupt, list(s.held), len(s.refused), list(s.refused), len(s.failed), list(s.failed), ts(s.terminatingUntil))
		if p.Drain.OnTimeout == config.OnTimeoutProceed {
			c.recorder.Event(node, corev1.EventTypeWarning, BlockDrainTimeout, msg+"; proceeding (onTimeout Proceed)")
			c.log.Warn("drain timed out; proceeding", "node", node.Name, "duration", p.Drain.Timeout)
			return drainResult{done: true}
		}
		c.blocked(node, BlockDrainTimeout, msg+"; waiting (onTimeout Wait): the node keeps its in-flight slot until the drain finishes, the node recovers or an operator steps in")
		return drainResult{requeue: c.cfg.DrainRetryInterval}
	}
	switch {
	case len(s.held) > 0:
		c.blocked(node, BlockDoNotDisrupt, fmt.Sprintf("drain waiting for %d pod(s) annotated %s=true to leave (%s) until %s, then onTimeout %s decides",
			len(s.held), decide.AnnotationDoNotDisrupt, list(s.held), ts(deadline), p.Drain.OnTimeout))
	case len(s.refused) > 0:
		c.blocked(node, BlockEvictionRefused, fmt.Sprintf("%d eviction(s) refused by a PodDisruptionBudget, retrying until %s, then onTimeout %s decides: %s",
			len(s.refused), ts(deadline), p.Drain.OnTimeout, list(s.refused)))
	}
	return drainResult{requeue: s.requeue}
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

// later is the later of two times.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
