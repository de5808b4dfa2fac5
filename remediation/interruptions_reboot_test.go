package remediation

import (
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevigil/nodevigil/remediation/ec2"
)

func setBootID(h *harness, name, bootID string, ready corev1.ConditionStatus) {
	h.t.Helper()
	n := h.node(name)
	n.Status.NodeInfo.BootID = bootID
	found := false
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			n.Status.Conditions[i].Status, found = ready, true
		}
	}
	if !found {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeReady, Status: ready})
	}
	n.ResourceVersion = strconv.FormatInt(h.rv.Add(1), 10) // so the cache's catch-up is observable
	if _, err := h.client.CoreV1().Nodes().UpdateStatus(h.ctx, n, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// TestUndoAfterRebootByBootID: a node cordoned for a scheduled reboot is uncordoned once its
// boot ID changed and it is Ready again, though EC2 still lists the event, with one Event, and
// is not cordoned again for that event; a changed boot ID while not Ready, or the same boot ID,
// keeps the cordon. Once EC2 stops listing the event its record goes.
func TestUndoAfterRebootByBootID(t *testing.T) {
	// Remediation off: a node not Ready while it reboots is this test's subject, not a
	// remediation's.
	h := newHarness(t, liveConfig(t, "policies:\n- name: general\n  nodeSelector: karpenter.sh/nodepool=general\n  action: None\n"))
	src := &fakeEvents{known: map[string]bool{}, events: map[string][]ec2.ScheduledEvent{}}
	h.c.cfg.ScheduledEvents = src
	h.healthy(newNode("r", inPool("general")))
	setBootID(h, "r", "boot-1", corev1.ConditionTrue)
	ev := ec2.ScheduledEvent{ID: "instance-event-00000000000000004", Code: "system-reboot", Description: "scheduled reboot", NotBefore: t0.Add(30 * time.Minute)}
	src.set(instanceOf(h.node("r")), ev)
	h.c.pollScheduledEvents(h.ctx)
	syncN(h, "r", 2)
	if len(cordoned(h, "r")) != 1 || h.node("r").Annotations[AnnotationInterruptionBootID] != "boot-1" {
		t.Fatalf("not cordoned with the boot ID recorded: %v", h.node("r").Annotations)
	}
	// Rebooting, not Ready yet: kept.
	setBootID(h, "r", "boot-2", corev1.ConditionFalse)
	syncN(h, "r", 2)
	if len(cordoned(h, "r")) != 1 {
		t.Fatal("uncordoned before the node was Ready again")
	}
	// Ready on a new boot, EC2 still listing the event: uncordoned once, and stays so.
	setBootID(h, "r", "boot-2", corev1.ConditionTrue)
	for range 3 {
		syncN(h, "r", 1)
		stepAlive(h, 2*interruptionCensusMaxAge, "r")
	}
	if len(cordoned(h, "r")) != 0 {
		t.Fatal("still cordoned after the reboot")
	}
	n := 0
	for _, e := range h.events() {
		if strings.Contains(e, EventInterruptionUndone) && strings.Contains(e, "boot ID boot-1 → boot-2") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d reboot undo events, want 1: %v", n, h.events())
	}
	if got := h.node("r").Annotations[AnnotationInterruptionRebootedFor]; got != ev.ID {
		t.Errorf("rebooted-for %q, want %q", got, ev.ID)
	}
	// The event completes: its record goes.
	src.set(instanceOf(h.node("r")))
	h.c.pollScheduledEvents(h.ctx)
	syncN(h, "r", 1)
	if _, ok := h.node("r").Annotations[AnnotationInterruptionRebootedFor]; ok {
		t.Error("rebooted-for record kept after the event left EC2's list")
	}
}
