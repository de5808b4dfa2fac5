package interruptions_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

// TestSpotNoticeDrainsThenUndoes: a spot notice (the agent's NoSpotInterruption=False) on a
// spot instance of a pool with the default interruptions policy: cordoned, tainted and drained
// at once; when the notice goes, uncordoned and untainted.
func TestSpotNoticeDrainsThenUndoes(t *testing.T) {
	e := newEnv(t)
	a := e.addNode(ec2emu.LifecycleSpot)
	e.addNode(ec2emu.LifecycleSpot)
	pod := e.podOn(a.name, false)
	e.start("")

	e.spotNotice(a)
	e.eventually("node cordoned for the spot notice", 30*time.Second, func(ctx context.Context) (bool, error) {
		n, err := e.node(a.name)
		return err == nil && cordonedForInterruption(n), nil
	})
	e.eventually("pod evicted", 30*time.Second, func(ctx context.Context) (bool, error) { return e.evicted(ctx, pod), nil })
	e.eventually("an InterruptionCordoned event", 10*time.Second, func(context.Context) (bool, error) { return e.hasEvent(a.name, "InterruptionCordoned"), nil })
	e.setCondition(a, "NoSpotInterruption", "True", "NoEvent", "no spot interruption notice")
	e.eventually("node uncordoned once the notice is gone", 30*time.Second, func(ctx context.Context) (bool, error) {
		n, err := e.node(a.name)
		return err == nil && !n.Spec.Unschedulable && !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == interruptionTaint }), nil
	})
	if e.emu.Terminations(a.instanceID) != 0 {
		t.Error("an interruption terminated the instance")
	}
}

// TestSpotNoticeNotifyNeverCordons: a kafka-style pool (Notify for every kind) and a node whose
// agent cannot read IMDS (Unknown) are never cordoned.
func TestSpotNoticeNotifyNeverCordons(t *testing.T) {
	e := newEnv(t)
	a := e.addNode(ec2emu.LifecycleSpot)
	b := e.addNode(ec2emu.LifecycleSpot)
	e.start(`interruptions: {spotInterruption: Notify, rebalanceRecommendation: Notify, scheduledReboot: Notify, scheduledRetirement: Notify, asgTermination: Notify}`)
	e.spotNotice(a)
	e.setCondition(b, "NoSpotInterruption", "Unknown", "IMDSHopLimitExceeded", "hop limit")
	e.never("a cordon", 8*time.Second, func(context.Context) bool { return len(e.cordoned(a, b)) > 0 })
}

// TestSpotNoticeOnOnDemandInstanceIsNotActedOn: an agent reporting a spot notice on an
// on-demand instance (a bug: EC2 never sends one) is contradicted by DescribeInstances and not
// acted on, with a Warning Event; the same notice on a spot instance of the pool drains it
// (positive control, same remediator, same moment).
func TestSpotNoticeOnOnDemandInstanceIsNotActedOn(t *testing.T) {
	e := newEnv(t)
	od := e.addNode("")
	sp := e.addNode(ec2emu.LifecycleSpot)
	e.addNode(ec2emu.LifecycleSpot)
	e.addNode(ec2emu.LifecycleSpot)
	e.start("")
	e.spotNotice(od)
	e.spotNotice(sp)
	e.eventually("the spot instance cordoned", 30*time.Second, func(context.Context) (bool, error) { return len(e.cordoned(sp)) == 1, nil })
	e.eventually("InterruptionNotCorroborated on the on-demand node", 30*time.Second, func(context.Context) (bool, error) {
		return e.hasEvent(od.name, "InterruptionNotCorroborated"), nil
	})
	e.never("the on-demand node cordoned", 6*time.Second, func(context.Context) bool { return len(e.cordoned(od)) > 0 })
}

// TestNoticesOnEveryNodeAreCappedToMaxInFlight: a buggy agent release reports a spot notice on
// every node of a 4-node spot pool. Without the valve all four would be drained within a
// second. The pool's maxImmediate (default 50%: 2 nodes) bounds the immediate drains; the rest
// wait for a maxInFlight (1) slot, with an InterruptionCapped Event, so never more than 2 of
// the 4 are cordoned. When the cordoned nodes go (AWS terminated them), a waiting one is taken.
func TestNoticesOnEveryNodeAreCappedToMaxInFlight(t *testing.T) {
	e := newEnv(t)
	var nodes []*simNode
	for range 4 {
		nodes = append(nodes, e.addNode(ec2emu.LifecycleSpot))
	}
	e.start("maxInFlight: 1")
	for _, n := range nodes {
		e.spotNotice(n)
	}
	const bound = 2 // maxImmediate 50% of 4
	e.eventually("a node cordoned", 30*time.Second, func(context.Context) (bool, error) { return len(e.cordoned(nodes...)) >= 1, nil })
	e.never("more than maxImmediate nodes cordoned", 6*time.Second, func(context.Context) bool { return len(e.cordoned(nodes...)) > bound })
	e.eventually("an InterruptionCapped event", 10*time.Second, func(context.Context) (bool, error) {
		for _, n := range nodes {
			if e.hasEvent(n.name, "InterruptionCapped") {
				return true, nil
			}
		}
		return false, nil
	})
	// AWS terminates the drained nodes: their slots free and a waiting node is taken.
	held := e.cordoned(nodes...)
	for _, n := range held {
		if err := e.client.CoreV1().Nodes().Delete(e.t.Context(), n.name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	rest := slices.DeleteFunc(slices.Clone(nodes), func(n *simNode) bool { return slices.Contains(held, n) })
	e.eventually("a waiting node taken", 30*time.Second, func(context.Context) (bool, error) { return len(e.cordoned(rest...)) >= 1, nil })
	e.never("more than maxImmediate nodes cordoned", 3*time.Second, func(context.Context) bool { return len(e.cordoned(rest...)) > bound })
}

func eventID(n int) string { return fmt.Sprintf("instance-event-%017x", n) }

// TestRebootSeenOnlyInEC2ThenCanceled: a system-reboot that only DescribeInstanceStatus lists
// (no agent reports anything for the node) is handled per the pool's policy (the default
// scheduledReboot: CordonOnly, due at once: NotBefore is within the lead time); EC2 canceling
// it uncordons the node. A completed event EC2 keeps listing ("[Completed] …") on another node
// is not acted on.
func TestRebootSeenOnlyInEC2ThenCanceled(t *testing.T) {
	e := newEnv(t)
	a := e.addNode("")
	b := e.addNode("")
	nb := time.Now().Add(30 * time.Minute)
	if err := e.emu.AddScheduledEvent(a.instanceID, ec2emu.ScheduledEvent{ID: eventID(1), Code: ec2emu.EventSystemReboot,
		Description: "The instance is scheduled for a reboot", NotBefore: nb}); err != nil {
		t.Fatal(err)
	}
	if err := e.emu.AddScheduledEvent(b.instanceID, ec2emu.ScheduledEvent{ID: eventID(2), Code: ec2emu.EventSystemReboot,
		Description: "The instance is scheduled for a reboot", NotBefore: nb, State: ec2emu.EventStateCompleted}); err != nil {
		t.Fatal(err)
	}
	e.start("")
	e.eventually("node cordoned for the EC2-only reboot", 30*time.Second, func(context.Context) (bool, error) { return len(e.cordoned(a)) == 1, nil })
	if n, _ := e.node(a.name); !strings.HasPrefix(n.Annotations[interruptionMark], eventID(1)+"/CordonOnly") {
		t.Errorf("mark %q", n.Annotations[interruptionMark])
	}
	if len(e.cordoned(b)) != 0 {
		t.Error("a completed event cordoned its node")
	}
	if err := e.emu.SetScheduledEventState(a.instanceID, eventID(1), ec2emu.EventStateCanceled); err != nil {
		t.Fatal(err)
	}
	e.eventually("node uncordoned after the cancel", 30*time.Second, func(context.Context) (bool, error) {
		n, err := e.node(a.name)
		return err == nil && !n.Spec.Unschedulable && n.Annotations[interruptionMark] == "", nil
	})
	// The Event is recorded after the patch, through the recorder's queue: wait for it.
	e.eventually("an InterruptionUndone event", 10*time.Second, func(context.Context) (bool, error) {
		return e.hasEvent(a.name, "InterruptionUndone"), nil
	})
}

// TestMaintenanceWaveDrainsOneAtATime: five nodes of one pool get a scheduled reboot each, all
// due (policy: drain for reboots). They are drained one at a time (maxInFlight 1): never two
// cordoned at once; each completed reboot uncordons its node and lets the next one go, until all
// five were drained.
func TestMaintenanceWaveDrainsOneAtATime(t *testing.T) {
	e := newEnv(t)
	var nodes []*simNode
	pods := map[string]*corev1.Pod{}
	nb := time.Now().Add(30 * time.Minute)
	for i := range 5 {
		n := e.addNode("")
		nodes = append(nodes, n)
		if err := e.emu.AddScheduledEvent(n.instanceID, ec2emu.ScheduledEvent{ID: eventID(10 + i), Code: ec2emu.EventInstanceReboot,
			Description: "The instance is scheduled for a reboot", NotBefore: nb}); err != nil {
			t.Fatal(err)
		}
		pods[n.name] = e.podOn(n.name, false)
	}
	e.start("maxInFlight: 1\ninterruptions: {scheduledReboot: Drain}")
	done := map[string]bool{}
	for round := range 5 {
		var cur *simNode
		e.eventually(fmt.Sprintf("round %d: a node cordoned", round), 40*time.Second, func(context.Context) (bool, error) {
			c := e.cordoned(nodes...)
			if len(c) > 1 {
				return false, fmt.Errorf("%d nodes cordoned at once", len(c))
			}
			if len(c) == 1 {
				cur = c[0]
			}
			return cur != nil, nil
		})
		if done[cur.name] {
			t.Fatalf("round %d: %s cordoned again after its reboot", round, cur.name)
		}
		e.eventually(cur.name+"'s pod evicted", 30*time.Second, func(ctx context.Context) (bool, error) { return e.evicted(ctx, pods[cur.name]), nil })
		// AWS reboots it: the event completes.
		idx := slices.Index(nodes, cur)
		if err := e.emu.SetScheduledEventState(cur.instanceID, eventID(10+idx), ec2emu.EventStateCompleted); err != nil {
			t.Fatal(err)
		}
		e.eventually(cur.name+" uncordoned", 40*time.Second, func(context.Context) (bool, error) {
			c := e.cordoned(nodes...)
			if len(c) > 1 {
				return false, fmt.Errorf("%d nodes cordoned at once", len(c))
			}
			return !slices.Contains(c, cur), nil
		})
		done[cur.name] = true
	}
	if len(done) != 5 {
		t.Errorf("%d nodes drained, want 5", len(done))
	}
}
