package remediation

// This file is the drain of a node AWS is about to interrupt. It is remediation's drain
// (drain.go's drainPass: the Eviction API, so PodDisruptionBudgets are honoured by the API
// server; DaemonSet, mirror and finished pods skipped), with two differences that come from
// the clock being AWS's:
//
//   - Pods annotated karpenter.sh/do-not-disrupt=true are evicted last (dndLast): only once
//     every other pod has left (its eviction accepted and its grace period over), or at the
//     latest their own grace period before the deadline, so that they still end before AWS
//     acts. With the policy's interruptions.doNotDisruptPods Keep they are never evicted
//     (dndKeep).
//   - The deadline is the event's (the spot action time; a scheduled event's NotBefore minus
//     interruptions.margin), not drain.timeout. When it passes with pods still on the node, a
//     Warning Event InterruptionDeadlineReached says which and what happens next: nodevigil
//     keeps evicting what it may until AWS acts; kept do-not-disrupt pods stay.

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

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

// drainForInterruption is one pass of the drain of a node cordoned for gov.
func (c *Controller) drainForInterruption(ctx context.Context, node *corev1.Node, p *config.Policy, gov InterruptionPlan, now time.Time) (interruptionDrainResult, error) {
	opts := drainOptions{doNotDisrupt: dndLast, deadline: gov.FinishBy}
	if p.Interruptions.DoNotDisruptPods == config.DoNotDisruptKeep {
		opts.doNotDisrupt = dndKeep
	}
	s, err := c.drainPass(ctx, node, opts, now)
	if err != nil {
		return interruptionDrainResult{}, err
	}
	if len(s.lastEvicted) > 0 && c.intr.note(node.Name, "dnd/"+gov.Interruption.ID) {
		why := "every other pod has left"
		if s.early {
			why = fmt.Sprintf("the deadline %s is one grace period away", ts(opts.deadline))
		}
		dnd := append(append([]string(nil), s.lastEvicted...), s.deferred...)
		c.recorder.Eventf(node, corev1.EventTypeNormal, EventInterruptionEvictingDND, "evicting %d pod(s) annotated %s=true last (%s): %s",
			len(dnd), decide.AnnotationDoNotDisrupt, why, list(dnd))
	}
	if s.done {
		return interruptionDrainResult{done: true, kept: s.kept}, nil
	}
	if s.pastDeadline && c.intr.note(node.Name, "deadline/"+gov.Interruption.ID) {
		waiting := s.waiting()
		msg := fmt.Sprintf("the drain for %s (%s) did not finish by %s (the event's deadline minus the margin): %d pod(s) still leaving or refused (%s); nodevigil keeps evicting until AWS acts at %s",
			gov.Interruption.Code, gov.Interruption.ID, ts(opts.deadline), len(waiting), list(waiting), ts(gov.Interruption.NotBefore))
		if len(s.kept) > 0 {
			msg += fmt.Sprintf("; %d do-not-disrupt pod(s) are kept by interruptions.doNotDisruptPods Keep and will be interrupted with the instance (%s)", len(s.kept), list(s.kept))
		}
		c.recorder.Event(node, corev1.EventTypeWarning, EventInterruptionDeadline, msg)
		c.log.Warn("interruption drain missed its deadline", "node", node.Name, "reason", gov.Interruption.Code)
	}
	return interruptionDrainResult{kept: s.kept, requeue: s.requeue}, nil
}
