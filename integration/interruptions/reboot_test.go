package interruptions_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

// setBootID writes node.status.nodeInfo.bootID as the kubelet does after a boot, with Ready
// True.
func (e *env) setBootID(n *simNode, bootID string) {
	e.t.Helper()
	now := time.Now().UTC().Format(time.RFC3339)
	body := fmt.Sprintf(`{"status":{"nodeInfo":{"bootID":%q},"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":%q,"lastTransitionTime":%q}]}}`,
		bootID, now, now)
	if _, err := e.client.CoreV1().Nodes().PatchStatus(e.t.Context(), n.name, []byte(body)); err != nil {
		e.t.Fatalf("set boot ID of %s: %v", n.name, err)
	}
}

// undoneEvents counts the InterruptionUndone Events of a node.
func (e *env) undoneEvents(ctx context.Context, node string) int {
	evs, err := e.client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + node})
	if err != nil {
		return -1
	}
	n := 0
	for _, ev := range evs.Items {
		if ev.Reason == "InterruptionUndone" {
			n += max(int(ev.Count), 1)
		}
	}
	return n
}

// TestRebootedNodeUncordonedByBootID: a scheduled reboot seen through DescribeInstanceStatus
// cordons the node (CordonOnly, the default). The instance reboots — a new boot ID, Ready —
// while EC2 still lists the event as active: the node is uncordoned once (one
// InterruptionUndone Event) and not cordoned again for that event.
func TestRebootedNodeUncordonedByBootID(t *testing.T) {
	e := newEnv(t)
	n := e.addNode("")
	e.setBootID(n, "2f1c0e0a-0000-4000-8000-000000000001")
	if err := e.emu.AddScheduledEvent(n.instanceID, ec2emu.ScheduledEvent{ID: eventID(60), Code: ec2emu.EventInstanceReboot,
		Description: "The instance is scheduled for a reboot", NotBefore: time.Now().Add(30 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	e.start("")
	e.eventually("the node cordoned for the reboot", 40*time.Second, func(context.Context) (bool, error) {
		return len(e.cordoned(n)) == 1, nil
	})
	obj, err := e.node(n.name)
	if err != nil {
		t.Fatal(err)
	}
	if got := obj.Annotations["nodevigil.io/interruption-boot-id"]; got != "2f1c0e0a-0000-4000-8000-000000000001" {
		t.Fatalf("boot ID recorded at cordon time %q", got)
	}
	e.setBootID(n, "2f1c0e0a-0000-4000-8000-000000000002")
	e.eventually("the node uncordoned after its reboot", 30*time.Second, func(context.Context) (bool, error) {
		return len(e.cordoned(n)) == 0, nil
	})
	// EC2 still lists the event: the node stays uncordoned, with one Event.
	e.never("the node cordoned again for the same event", 12*time.Second, func(context.Context) bool {
		return len(e.cordoned(n)) != 0
	})
	if c := e.undoneEvents(t.Context(), n.name); c != 1 {
		t.Errorf("%d InterruptionUndone events, want 1", c)
	}
}
