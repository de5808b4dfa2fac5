package remediation

// This file acts on the interruption plans (interruptions.go) for one node: cordon and drain
// per the pool's interruptions policy, and undo — uncordon and untaint, only what nodevigil
// did — once no due plan asks for it any more (the event was withdrawn, canceled or
// completed). Interruptions are handled only for nodes the remediation pipeline leaves alone
// (no remediation phase recorded); they use their own annotation and taint, so the two never
// undo each other's work.

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/decide"
)

// Interruption bookkeeping on the Node.
const (
	// AnnotationInterruption records, while nodevigil holds a node cordoned for an AWS event,
	// "<event ID>/<action>". Its presence is what undo acts on: a node cordoned by anyone else
	// is never uncordoned.
	AnnotationInterruption = "nodevigil.io/interruption"
	// AnnotationInterruptionWasUnschedulable records that the node was already cordoned when
	// nodevigil cordoned it for an event, so undo leaves it cordoned.
	AnnotationInterruptionWasUnschedulable = "nodevigil.io/interruption-was-unschedulable"
	// AnnotationInterruptionDryRun records what dryRun would have done for an event.
	AnnotationInterruptionDryRun = "nodevigil.io/interruption-dry-run"
	// AnnotationInterruptionBootID records the node's boot ID when nodevigil cordoned it, so
	// a reboot for the event can be told from the node's own report.
	AnnotationInterruptionBootID = "nodevigil.io/interruption-boot-id"
	// AnnotationInterruptionRebootedFor records the scheduled event a node was cordoned for and
	// has since rebooted for (its boot ID changed): nodevigil uncordoned it and does not act on
	// that event again, though EC2 may list it for a while yet. Removed once no source reports
	// the event.
	AnnotationInterruptionRebootedFor = "nodevigil.io/interruption-rebooted-for"
	// TaintInterruption keeps new pods off a node AWS is about to interrupt.
	TaintInterruption = "nodevigil.io/interruption"
)

// Event reasons of interruption handling.
const (
	EventInterruptionCordoned = "InterruptionCordoned"
	EventInterruptionDraining = "InterruptionDraining"
	EventInterruptionDrained  = "InterruptionDrained"
	EventInterruptionUndone   = "InterruptionUndone"
	EventInterruptionDryRun   = "InterruptionDryRun"
	// EventInterruptionNotified tells, once per event, an event only EC2 lists whose policy
	// action is Notify: on a node with no agent (or whose agent has not read it yet) nothing
	// else would say it.
	EventInterruptionNotified = "InterruptionNotified"
)

// interruptionRecheck is how often a node with a pending interruption is reconsidered while
// its action is running or not yet due (the agent's conditions requeue it on change anyway).
const interruptionRecheck = 5 * time.Second

// syncInterruptions plans and carries out the node's interruptions; it returns when to look
// again (0: nothing pending).
func (c *Controller) syncInterruptions(ctx context.Context, node *corev1.Node, p *config.Policy, now time.Time) (time.Duration, error) {
	if !c.leading.Load() {
		return 0, nil
	}
	fromEC2, described := c.intr.eventsOf(instanceIDOf(node))
	ins := MergeInterruptions(InterruptionsFromNode(node), fromEC2)
	marked, isMarked := node.Annotations[AnnotationInterruption]
	// Like every undo, this needs a source that can see the instance's scheduled events (EC2
	// described it, or the agent's condition is known): a replica that sees neither knows
	// nothing of the event.
	sees := described || conditionKnown(node, ConditionNoScheduledEvent)
	if isMarked && sees && rebootedForEvent(node, marked) {
		return interruptionRecheck, c.undoAfterReboot(ctx, node, marked)
	}
	// An event the instance already rebooted for is over for nodevigil, even while EC2 still
	// lists it (its state lags); its record goes once no source reports it and one that could
	// does not (positive knowledge, as for undo).
	done, hasDone := node.Annotations[AnnotationInterruptionRebootedFor]
	// An operator's hold (do-not-remediate) holds nodevigil's own choices: the scheduled
	// events and rebalance recommendations a policy acts on ahead of time. Spot notices and
	// ASG terminations are AWS's decision, not nodevigil's: the instance goes whatever the
	// hold says, so their drain still runs.
	held := decide.DoNotRemediate(node)
	plans := make([]InterruptionPlan, 0, len(ins))
	var heldPlans []InterruptionPlan
	var next time.Duration
	stillListed := false
	for _, in := range ins {
		if hasDone && in.ID == done {
			stillListed = true
			continue
		}
		pl := PlanInterruption(p.Interruptions, in, now)
		if held && pl.HoldsSlot {
			heldPlans = append(heldPlans, pl)
			continue
		}
		plans = append(plans, pl)
		if d := pl.StartAt.Sub(now); d > 0 && (next == 0 || d < next) {
			next = d
		}
	}
	if hasDone && !stillListed && sees {
		n, err := c.patchNode(ctx, node, nodePatch{annotations: map[string]*string{AnnotationInterruptionRebootedFor: nil}})
		if err != nil {
			return 0, err
		}
		node = n
	}
	c.notifyEC2Only(node, p, plans)
	gov, due := GoverningPlan(plans, now)
	acts := due && acting(gov.Action)
	if isMarked && held && !immediateKind(markedKind(marked)) {
		// Cordoned for a scheduled event or a recommendation before the hold: hand the node
		// back, as a hold does for remediation (uncordoned only if nodevigil cordoned it).
		return interruptionRecheck, c.undo(ctx, node, marked, fmt.Sprintf(
			"an operator holds the node (%s=%q): what nodevigil did for %s is undone, and the event is not acted on while the hold lasts",
			decide.AnnotationDoNotRemediate, node.Annotations[decide.AnnotationDoNotRemediate], marked), nil)
	}
	if !acts && !isMarked {
		c.noteHeld(node, p, heldPlans, now)
	}

	if !acts {
		if isMarked {
			if markedEventGone(node, marked, ins, described) {
				return next, c.undoInterruption(ctx, node, marked)
			}
			// The event is still pending (the policy changed, or a source went Unknown):
			// nodevigil keeps what it did until the event is positively gone.
			return interruptionRequeue(next, interruptionRecheck), nil
		}
		if _, ok := node.Annotations[AnnotationInterruptionDryRun]; ok && !due {
			_, err := c.patchNode(ctx, node, nodePatch{annotations: map[string]*string{AnnotationInterruptionDryRun: nil}})
			return next, err
		}
		return next, nil
	}
	record := gov.Interruption.ID + "/" + string(gov.Action)
	if c.rc.DryRun {
		if node.Annotations[AnnotationInterruptionDryRun] == record {
			return next, nil
		}
		if _, err := c.patchNode(ctx, node, nodePatch{annotations: map[string]*string{AnnotationInterruptionDryRun: ptr.To(record)}}); err != nil {
			return 0, err
		}
		c.recorder.Eventf(node, corev1.EventTypeNormal, EventInterruptionDryRun, "dry run: would %s for %s (%s): %s",
			gov.Action, gov.Interruption.Code, gov.Interruption.ID, gov.Interruption.Message)
		c.log.Info("interruption dry run", "node", node.Name, "reason", gov.Interruption.Code, "action", string(gov.Action))
		return next, nil
	}
	if !isMarked {
		// Admission: how far the event is trusted, and whether it waits for a slot
		// (interruptions_trust.go). A node already marked holds what it took.
		capped := gov.HoldsSlot
		if !capped {
			switch c.admitImmediate(ctx, node, p, gov, now) {
			case verdictRefuted:
				return interruptionRecheck, nil
			case verdictCapped:
				capped = true
			}
		}
		if capped {
			if ok, inFlight := c.takeInterruptionSlot(node, p, now); !ok {
				if c.intr.note(node.Name, "waiting/"+record) {
					c.recorder.Eventf(node, corev1.EventTypeNormal, EventInterruptionWaiting,
						"%s (%s) waits for a slot: %d nodes of pool %s are already cordoned for interruptions or being remediated (maxInFlight %d)",
						gov.Interruption.Code, gov.Interruption.ID, inFlight, c.poolKey(node, p), p.MaxInFlight)
					c.log.Info("interruption waiting for a slot", "node", node.Name, "reason", gov.Interruption.Code, "in_flight", inFlight)
				}
				return interruptionRecheck, nil
			}
		}
	}
	if !isMarked || marked != record {
		ann := map[string]*string{AnnotationInterruption: ptr.To(record)}
		if !isMarked && node.Spec.Unschedulable {
			ann[AnnotationInterruptionWasUnschedulable] = ptr.To("true")
		}
		if !isMarked && node.Status.NodeInfo.BootID != "" {
			ann[AnnotationInterruptionBootID] = ptr.To(node.Status.NodeInfo.BootID)
		}
		taints := withInterruptionTaint(node.Spec.Taints)
		n, err := c.patchNode(ctx, node, nodePatch{annotations: ann, unschedulable: ptr.To(true), taints: &taints})
		if err != nil {
			c.intr.mu.Lock()
			delete(c.intr.reserved, node.Name)
			c.intr.mu.Unlock()
			c.unreserve(node.Name)
			return 0, err
		}
		node = n
		c.recorder.Eventf(node, corev1.EventTypeWarning, EventInterruptionCordoned, "cordoned for %s (%s, policy %s: %s); %s",
			gov.Interruption.Code, gov.Interruption.ID, p.Name, gov.Action, gov.Interruption.Message)
		c.log.Info("node cordoned for an interruption", "node", node.Name, "reason", gov.Interruption.Code, "action", string(gov.Action))
	}
	if gov.Action == config.InterruptionCordonOnly {
		return interruptionRecheck, nil
	}
	// Drain (interruptions_drain.go); Replace drains the same way first.
	res, err := c.drainForInterruption(ctx, node, p, gov, now)
	if err != nil {
		return 0, err
	}
	if res.done {
		if node.Annotations[AnnotationInterruption+"-drained"] != record {
			n, err := c.patchNode(ctx, node, nodePatch{annotations: map[string]*string{AnnotationInterruption + "-drained": ptr.To(record)}})
			if err != nil {
				return 0, err
			}
			node = n
			msg := fmt.Sprintf("drained for %s (%s)", gov.Interruption.Code, gov.Interruption.ID)
			if len(res.kept) > 0 {
				msg += fmt.Sprintf("; %d pod(s) annotated %s=true kept by interruptions.doNotDisruptPods Keep stay until AWS interrupts the instance (%s)",
					len(res.kept), decide.AnnotationDoNotDisrupt, list(res.kept))
			}
			c.recorder.Event(node, corev1.EventTypeNormal, EventInterruptionDrained, msg)
		}
		if gov.Action == config.InterruptionReplace {
			return c.replaceInstance(ctx, node, p, gov, now)
		}
		return interruptionRecheck, nil
	}
	return min(max(res.requeue, time.Second), interruptionRecheck), nil
}

// EventInterruptionHeld says, once per event, that a due scheduled event or rebalance
// recommendation is not acted on because an operator holds the node (do-not-remediate).
const EventInterruptionHeld = "InterruptionHeld"

// immediateKind reports whether an interruption kind is AWS's decision (a spot notice, an ASG
// termination), acted on whatever an operator's hold says.
func immediateKind(k InterruptionKind) bool {
	return k == KindSpotInterruption || k == KindASGTermination
}

// markedKind is the kind of the event an interruption mark ("<event ID>/<action>") names.
func markedKind(marked string) InterruptionKind {
	id, _, _ := strings.Cut(marked, "/")
	if strings.HasPrefix(id, "instance-event-") {
		return KindScheduledReboot // or a retirement: either way a scheduled event
	}
	return InterruptionKind(id)
}

// noteHeld records, once per event, the due plans an operator's hold keeps nodevigil from
// acting on: without it a held node with a retirement next week would look forgotten.
func (c *Controller) noteHeld(node *corev1.Node, p *config.Policy, held []InterruptionPlan, now time.Time) {
	gov, due := GoverningPlan(held, now)
	if !due || !acting(gov.Action) || !c.intr.note(node.Name, "held/"+gov.Interruption.ID) {
		return
	}
	c.recorder.Eventf(node, corev1.EventTypeNormal, EventInterruptionHeld,
		"%s (%s) is not acted on: an operator holds the node (%s=%q); policy %s would %s. Clearing the hold (kubectl nodevigil release %s) lets it act",
		gov.Interruption.Code, gov.Interruption.ID, decide.AnnotationDoNotRemediate, node.Annotations[decide.AnnotationDoNotRemediate], p.Name, gov.Action, node.Name)
	c.log.Info("interruption held by an operator", "node", node.Name, "reason", gov.Interruption.Code, "action", string(gov.Action))
}

// markedEventGone reports whether the event a node was cordoned for is positively over: no
// source reports it any more and at least one source that could report it says so — the
// agent's condition for its kind is known (True, or False listing other events), or EC2
// described the instance. An agent gone Unknown, or an instance EC2 was not asked about, is
// not proof: the cordon stays rather than being lifted from a blind spot.
func markedEventGone(node *corev1.Node, marked string, pending []Interruption, described bool) bool {
	id, _, _ := strings.Cut(marked, "/")
	for _, in := range pending {
		if in.ID == id {
			return false
		}
	}
	known := func(t corev1.NodeConditionType) bool { return conditionKnown(node, t) }
	switch InterruptionKind(id) {
	case KindSpotInterruption:
		return known(ConditionNoSpotInterruption)
	case KindRebalanceRecommendation:
		return known(ConditionNoRebalanceRecommendation)
	case KindASGTermination:
		return known(ConditionNoASGTermination)
	}
	return described || known(ConditionNoScheduledEvent)
}

// rebootedForEvent reports whether a node nodevigil cordoned for a scheduled event has rebooted
// since (node.status.nodeInfo.bootID differs from the one recorded at cordon time) and is
// Ready again: the reboot was the event, whatever DescribeInstanceStatus still says. Spot
// notices, rebalance recommendations and ASG terminations are not ended by a reboot.
func rebootedForEvent(node *corev1.Node, marked string) bool {
	id, _, _ := strings.Cut(marked, "/")
	if !strings.HasPrefix(id, "instance-event-") {
		return false
	}
	was, cur := node.Annotations[AnnotationInterruptionBootID], node.Status.NodeInfo.BootID
	if was == "" || cur == "" || was == cur {
		return false
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// undoAfterReboot uncordons a node that rebooted for the event it was cordoned for and records
// the event as done, so it is not acted on again while EC2 still lists it.
func (c *Controller) undoAfterReboot(ctx context.Context, node *corev1.Node, marked string) error {
	id, _, _ := strings.Cut(marked, "/")
	msg := fmt.Sprintf("the node rebooted for %s (boot ID %s → %s) and is Ready; uncordoned and untainted, and the event is not acted on again",
		marked, node.Annotations[AnnotationInterruptionBootID], node.Status.NodeInfo.BootID)
	return c.undo(ctx, node, marked, msg, map[string]*string{AnnotationInterruptionRebootedFor: ptr.To(id)})
}

// conditionKnown reports whether the agent's condition t is True or False on node (not absent,
// not Unknown).
func conditionKnown(node *corev1.Node, t corev1.NodeConditionType) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == t {
			return c.Status == corev1.ConditionTrue || c.Status == corev1.ConditionFalse
		}
	}
	return false
}

// undoInterruption uncordons and untaints a node nodevigil cordoned for an event that no
// longer asks for it; a node that was already cordoned before stays cordoned.
func (c *Controller) undoInterruption(ctx context.Context, node *corev1.Node, marked string) error {
	return c.undo(ctx, node, marked, fmt.Sprintf("the AWS event behind %s is no longer pending; uncordoned and untainted", marked), nil)
}

// undo lifts what nodevigil did for marked, with an Event saying why; extra annotations are
// set in the same patch.
func (c *Controller) undo(ctx context.Context, node *corev1.Node, marked, msg string, extra map[string]*string) error {
	taints := withoutInterruptionTaint(node.Spec.Taints)
	p := nodePatch{
		annotations: map[string]*string{AnnotationInterruption: nil, AnnotationInterruptionWasUnschedulable: nil, AnnotationInterruption + "-drained": nil,
			AnnotationInterruptionBootID: nil, AnnotationInterruptionReplaceBlocked: nil},
		taints: &taints,
	}
	if node.Annotations[AnnotationInterruptionWasUnschedulable] != "true" {
		p.unschedulable = ptr.To(false)
	}
	for k, v := range extra {
		p.annotations[k] = v
	}
	n, err := c.patchNode(ctx, node, p)
	if err != nil {
		return err
	}
	c.intr.forget(node.Name)
	c.unreserve(node.Name)
	c.recorder.Event(n, corev1.EventTypeNormal, EventInterruptionUndone, msg)
	c.log.Info("interruption undone", "node", node.Name, "reason", marked)
	return nil
}

func withInterruptionTaint(taints []corev1.Taint) []corev1.Taint {
	for _, t := range taints {
		if t.Key == TaintInterruption {
			return taints
		}
	}
	out := make([]corev1.Taint, 0, len(taints)+1)
	out = append(out, taints...)
	return append(out, corev1.Taint{Key: TaintInterruption, Effect: corev1.TaintEffectNoSchedule})
}

func withoutInterruptionTaint(taints []corev1.Taint) []corev1.Taint {
	out := make([]corev1.Taint, 0, len(taints))
	for _, t := range taints {
		if t.Key != TaintInterruption {
			out = append(out, t)
		}
	}
	return out
}

// interruptionRequeue merges the interruption requeue into the decision's.
func interruptionRequeue(a, b time.Duration) time.Duration {
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	}
	return min(a, b)
}

// notifyEC2Only records an InterruptionNotified Event for each event of plans that only EC2
// reports and that the policy only reports (Notify): where an agent reports an event, its
// condition and Event already tell it.
func (c *Controller) notifyEC2Only(node *corev1.Node, p *config.Policy, plans []InterruptionPlan) {
	for _, pl := range plans {
		in := pl.Interruption
		if pl.Action != config.InterruptionNotify || contains(in.Sources, SourceAgent) {
			continue
		}
		if !c.intr.note(node.Name, "notified/"+in.ID) {
			continue
		}
		when := "at an unknown time"
		if !in.NotBefore.IsZero() {
			when = "not before " + ts(in.NotBefore)
		}
		c.recorder.Eventf(node, corev1.EventTypeNormal, EventInterruptionNotified, "EC2 lists %s %s for instance %s, %s; policy %s says Notify: nothing is done",
			in.Code, in.ID, instanceIDOf(node), when, p.Name)
		c.log.Info("interruption notified", "node", node.Name, "reason", in.Code, "instance_id", instanceIDOf(node))
	}
}
