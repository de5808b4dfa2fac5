package remediation

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevigil/nodevigil/remediation/decide"
)

const interruptionPolicies = `policies:
- name: kafka
  nodeSelector: karpenter.sh/nodepool=kafka
  interruptions: {spotInterruption: Notify, scheduledReboot: Notify, scheduledRetirement: Notify, asgTermination: Notify}
- name: general
  nodeSelector: karpenter.sh/nodepool=general
`

// withCondition sets an agent AWS event condition as the agent writes it.
func withCondition(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) nodeOpt {
	return func(n *corev1.Node) {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg,
			LastTransitionTime: metav1.NewTime(t0)})
	}
}

func spotNotice() nodeOpt {
	at := t0.Add(2 * time.Minute).UTC().Format(time.RFC3339)
	return withCondition(ConditionNoSpotInterruption, corev1.ConditionFalse, "SpotTerminate",
		"spot interruption notice: AWS will terminate this instance at "+at+"; deadline "+at)
}

func setCondition(h *harness, name string, c corev1.NodeCondition) {
	h.t.Helper()
	n := h.node(name)
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == c.Type {
			n.Status.Conditions[i] = c
		}
	}
	if _, err := h.client.CoreV1().Nodes().UpdateStatus(h.ctx, n, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// syncN reconciles name n times without moving the clock (the fixtures' leases do not renew,
// so stepping the clock would make the node silent and remediation would take it).
func syncN(h *harness, name string, n int) {
	h.t.Helper()
	for range n {
		if _, err := h.sync(name); err != nil {
			h.t.Fatalf("sync %s: %v", name, err)
		}
	}
}

// spot makes the nodes' instances spot instances, as EC2 will report them to the cross-check.
func (h *harness) spot(names ...string) {
	h.t.Helper()
	h.cloud.mu.Lock()
	defer h.cloud.mu.Unlock()
	for _, name := range names {
		h.cloud.lifecycle[instanceOf(h.node(name))] = "spot"
	}
}

func hasTaintKey(n *corev1.Node, key string) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == key })
}

// TestSpotNoticeDrainsGeneralThenUndoes: a spot notice on a general node cordons, taints and
// drains it at once; the notice withdrawn uncordons and untaints it.
func TestSpotNoticeDrainsGeneralThenUndoes(t *testing.T) {
	h := newHarness(t, liveConfig(t, interruptionPolicies))
	h.healthy(newNode("g1", inPool("general"), spotNotice()))
	h.spot("g1")
	h.add(newPod("app", "web-1", "g1"))
	syncN(h, "g1", 5)
	n := h.node("g1")
	if !n.Spec.Unschedulable || !hasTaintKey(n, TaintInterruption) || n.Annotations[AnnotationInterruption] != "spotInterruption/Drain" {
		t.Fatalf("after a spot notice: unschedulable=%v taints=%v annotations=%v", n.Spec.Unschedulable, n.Spec.Taints, n.Annotations)
	}
	if !slices.Contains(h.Steps(), "evict app/web-1") {
		t.Errorf("pod not evicted; steps %v", h.Steps())
	}
	evs := h.events()
	if !hasEvent(evs, EventInterruptionCordoned) {
		t.Errorf("events %v", evs)
	}

	setCondition(h, "g1", corev1.NodeCondition{Type: ConditionNoSpotInterruption, Status: corev1.ConditionTrue, Reason: "NoEvent", Message: "no spot interruption notice"})
	syncN(h, "g1", 3)
	n = h.node("g1")
	if n.Spec.Unschedulable || hasTaintKey(n, TaintInterruption) || n.Annotations[AnnotationInterruption] != "" {
		t.Fatalf("after the notice cleared: unschedulable=%v taints=%v annotations=%v", n.Spec.Unschedulable, n.Spec.Taints, n.Annotations)
	}
	if !hasEvent(h.events(), EventInterruptionUndone) {
		t.Error("no InterruptionUndone event")
	}
}

// TestInterruptionNotifyAndNoAction: kafka (Notify), IMDS unreachable (Unknown) and an
// instance-stop eleven days out are never cordoned; a node already cordoned by someone else
// stays cordoned after nodevigil's undo.
func TestInterruptionNotifyAndNoAction(t *testing.T) {
	h := newHarness(t, liveConfig(t, interruptionPolicies))
	nb := t0.Add(11 * 24 * time.Hour).UTC().Format(time.RFC3339)
	h.healthy(newNode("k1", inPool("kafka"), spotNotice()))
	h.healthy(newNode("g2", inPool("general"), withCondition(ConditionNoSpotInterruption, corev1.ConditionUnknown, "IMDSHopLimitExceeded",
		"the response hop limit (HttpPutResponseHopLimit=1) is too low; run the agent with hostNetwork: true")))
	h.healthy(newNode("g3", inPool("general"), withCondition(ConditionNoScheduledEvent, corev1.ConditionFalse, "InstanceStop",
		"instance-stop instance-event-0123456789abcdef0: The instance is scheduled for stop; not before "+nb)))
	for _, name := range []string{"k1", "g2", "g3"} {
		h.drive(name, 3)
		if n := h.node(name); n.Spec.Unschedulable || hasTaintKey(n, TaintInterruption) {
			t.Errorf("%s cordoned: %v", name, n.Spec.Taints)
		}
	}
	if steps := h.Steps(); len(steps) != 0 {
		t.Errorf("steps taken: %v", steps)
	}

	// g3's stop becomes due at NotBefore minus the lead time (1h): cordon... and drain.
	h.clock.Step(11*24*time.Hour - time.Hour)
	h.renew(DefaultKubeletLeaseNamespace, "g3", h.clock.Now())
	h.renew(h.c.rc.AgentNamespace, "g3", h.clock.Now())
	syncN(h, "g3", 3)
	if n := h.node("g3"); !n.Spec.Unschedulable || !strings.HasPrefix(n.Annotations[AnnotationInterruption], "instance-event-0123456789abcdef0/") {
		t.Errorf("g3 at the lead time: unschedulable=%v annotations=%v", n.Spec.Unschedulable, n.Annotations)
	}
}

func TestInterruptionUndoKeepsForeignCordon(t *testing.T) {
	h := newHarness(t, liveConfig(t, interruptionPolicies))
	h.healthy(newNode("g4", inPool("general"), spotNotice(), func(n *corev1.Node) { n.Spec.Unschedulable = true }))
	h.spot("g4")
	syncN(h, "g4", 3)
	setCondition(h, "g4", corev1.NodeCondition{Type: ConditionNoSpotInterruption, Status: corev1.ConditionTrue, Reason: "NoEvent"})
	syncN(h, "g4", 3)
	if n := h.node("g4"); !n.Spec.Unschedulable || hasTaintKey(n, TaintInterruption) {
		t.Errorf("undo of a node cordoned before: unschedulable=%v taints=%v", n.Spec.Unschedulable, n.Spec.Taints)
	}
}

func TestInterruptionDryRun(t *testing.T) {
	h := newHarness(t, liveConfig(t, "dryRun: true\n"+interruptionPolicies))
	h.healthy(newNode("g5", inPool("general"), spotNotice()))
	h.add(newPod("app", "web-5", "g5"))
	syncN(h, "g5", 3)
	n := h.node("g5")
	if n.Spec.Unschedulable || n.Annotations[AnnotationInterruptionDryRun] != "spotInterruption/Drain" || slices.Contains(h.Steps(), "evict app/web-5") {
		t.Errorf("dry run acted: unschedulable=%v annotations=%v steps=%v", n.Spec.Unschedulable, n.Annotations, h.Steps())
	}
	if !hasEvent(h.events(), EventInterruptionDryRun) {
		t.Error("no dry-run event")
	}
}

// TestOperatorHoldAndInterruptions: an operator's hold (do-not-remediate) holds what a policy
// chooses to do ahead of time — a scheduled event is not cordoned for, one already cordoned for
// is handed back — while a spot notice, AWS's own decision, is still drained.
func TestOperatorHoldAndInterruptions(t *testing.T) {
	h := newHarness(t, liveConfig(t, interruptionPolicies))
	nb := t0.Add(30 * time.Minute).UTC().Format(time.RFC3339) // inside the 1 h lead time: due now
	stop := withCondition(ConditionNoScheduledEvent, corev1.ConditionFalse, "InstanceStop",
		"instance-stop instance-event-0123456789abcdef1: The instance is scheduled for stop; not before "+nb)
	hold := withAnnotation(decide.AnnotationDoNotRemediate, "kernel debugging")
	h.healthy(newNode("held", inPool("general"), stop, hold))
	h.healthy(newNode("free", inPool("general"), stop))
	h.healthy(newNode("spot", inPool("general"), spotNotice(), hold))
	h.spot("spot")
	h.add(newPod("app", "web-s", "spot"))

	syncN(h, "held", 3)
	if n := h.node("held"); n.Spec.Unschedulable || hasTaintKey(n, TaintInterruption) || n.Annotations[AnnotationInterruption] != "" {
		t.Errorf("held node cordoned for a scheduled event: unschedulable=%v taints=%v annotations=%v", n.Spec.Unschedulable, n.Spec.Taints, n.Annotations)
	}
	if evs := h.events(); !hasEvent(evs, EventInterruptionHeld) {
		t.Errorf("no %s event for the held node; events %v", EventInterruptionHeld, evs)
	}

	syncN(h, "free", 3)
	if n := h.node("free"); !n.Spec.Unschedulable || !hasTaintKey(n, TaintInterruption) {
		t.Fatalf("unheld node not cordoned for its due event: unschedulable=%v taints=%v", n.Spec.Unschedulable, n.Spec.Taints)
	}
	h.events()
	n := h.node("free")
	n.Annotations[decide.AnnotationDoNotRemediate] = "true"
	if _, err := h.client.CoreV1().Nodes().Update(h.ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	syncN(h, "free", 3)
	if n := h.node("free"); n.Spec.Unschedulable || hasTaintKey(n, TaintInterruption) || n.Annotations[AnnotationInterruption] != "" {
		t.Errorf("hold did not hand the node back: unschedulable=%v taints=%v annotations=%v", n.Spec.Unschedulable, n.Spec.Taints, n.Annotations)
	}
	evs := h.events()
	if !hasEvent(evs, EventInterruptionUndone) || !slices.ContainsFunc(evs, func(e string) bool { return strings.Contains(e, "an operator holds the node") }) {
		t.Errorf("want an InterruptionUndone event naming the hold; events %v", evs)
	}

	syncN(h, "spot", 5)
	if n := h.node("spot"); !n.Spec.Unschedulable || n.Annotations[AnnotationInterruption] != "spotInterruption/Drain" {
		t.Errorf("held node with a spot notice not drained: unschedulable=%v annotations=%v", n.Spec.Unschedulable, n.Annotations)
	}
	if !slices.Contains(h.Steps(), "evict app/web-s") {
		t.Errorf("spot notice on a held node: pod not evicted; steps %v", h.Steps())
	}
}
