package interruptions_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

// TestHeldNodeIsNotReplacedUntilReleased: an operator's hold (nodevigil.io/do-not-remediate,
// what `kubectl nodevigil hold` sets) on a node with a scheduled retirement, in a pool whose
// policy says Replace: the real remediator neither cordons, drains nor terminates it and says
// so in an InterruptionHeld Event; once the hold is released the policy acts — drained, then
// exactly one TerminateInstances.
func TestHeldNodeIsNotReplacedUntilReleased(t *testing.T) {
	e := newEnv(t)
	n := e.addNode("")
	pod := e.podWithGrace(n.name, false, 1)
	hold := func(value string) {
		t.Helper()
		patch := fmt.Sprintf(`{"metadata":{"annotations":{"nodevigil.io/do-not-remediate":%s}}}`, value)
		if _, err := e.client.CoreV1().Nodes().Patch(t.Context(), n.name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("set the hold to %s: %v", value, err)
		}
	}
	hold(`"kernel debugging"`)
	notBefore := time.Now().Add(30 * time.Minute).UTC().Truncate(time.Second)
	evID := eventID(60)
	if err := e.emu.AddScheduledEvent(n.instanceID, ec2emu.ScheduledEvent{ID: evID, Code: ec2emu.EventInstanceRetirement,
		Description: "The instance is scheduled for retirement", NotBefore: notBefore}); err != nil {
		t.Fatal(err)
	}
	e.startPolicyMode(false, `action: None
interruptions: {scheduledRetirement: Replace}`)
	e.setCondition(n, "NoScheduledEvent", "False", "instance-retirement",
		fmt.Sprintf("instance-retirement %s: The instance is scheduled for retirement; not before %s", evID, notBefore.Format(time.RFC3339)))

	e.eventually("the InterruptionHeld Event", 40*time.Second, func(context.Context) (bool, error) {
		return e.hasEvent(n.name, "InterruptionHeld"), nil
	})
	e.never("the held node cordoned or its instance terminated", 5*time.Second, func(context.Context) bool {
		obj, err := e.node(n.name)
		return err != nil || obj.Spec.Unschedulable || e.emu.Terminations(n.instanceID) > 0
	})

	hold("null") // kubectl nodevigil release
	e.eventually("the released node's instance terminated", 60*time.Second, func(ctx context.Context) (bool, error) {
		if e.emu.Terminations(n.instanceID) == 0 {
			return false, nil
		}
		if !e.evicted(ctx, pod) {
			return false, fmt.Errorf("instance terminated before its pod was evicted")
		}
		return true, nil
	})
	if c := e.emu.Terminations(n.instanceID); c != 1 {
		t.Errorf("%d TerminateInstances for the instance, want 1", c)
	}
}
