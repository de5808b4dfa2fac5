package interruptions_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

// TestRetirementReplaced: a scheduled retirement (reported by the agent's condition and listed
// by EC2) on a pool whose policy says Replace. Live: the node is drained, then its instance is
// terminated early — exactly one TerminateInstances, long before NotBefore — and the Node is
// deleted once EC2 shows the instance gone. Dry run: an InterruptionDryRun Event and no
// TerminateInstances at all.
func TestRetirementReplaced(t *testing.T) {
	for _, tc := range []struct {
		name   string
		dryRun bool
	}{{"live", false}, {"dry run", true}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			n := e.addNode("")
			pod := e.podWithGrace(n.name, false, 1)
			notBefore := time.Now().Add(30 * time.Minute).UTC().Truncate(time.Second)
			evID := eventID(50)
			if err := e.emu.AddScheduledEvent(n.instanceID, ec2emu.ScheduledEvent{ID: evID, Code: ec2emu.EventInstanceRetirement,
				Description: "The instance is scheduled for retirement", NotBefore: notBefore}); err != nil {
				t.Fatal(err)
			}
			e.startPolicyMode(tc.dryRun, `action: None
interruptions: {scheduledRetirement: Replace}`)
			// The agent's report (dry run does not poll DescribeInstanceStatus).
			e.setCondition(n, "NoScheduledEvent", "False", "instance-retirement",
				fmt.Sprintf("instance-retirement %s: The instance is scheduled for retirement; not before %s", evID, notBefore.Format(time.RFC3339)))
			if tc.dryRun {
				e.eventually("the dry-run Event", 40*time.Second, func(context.Context) (bool, error) {
					return e.hasEvent(n.name, "InterruptionDryRun"), nil
				})
				e.never("a TerminateInstances call in dry run", 5*time.Second, func(context.Context) bool {
					return e.emu.Calls("TerminateInstances") > 0
				})
				if obj, err := e.node(n.name); err != nil || obj.Spec.Unschedulable {
					t.Errorf("dry run: node %v, err %v; want it untouched", obj.Spec.Unschedulable, err)
				}
				return
			}
			e.eventually("the instance terminated", 60*time.Second, func(ctx context.Context) (bool, error) {
				if e.emu.Terminations(n.instanceID) == 0 {
					return false, nil
				}
				if !e.evicted(ctx, pod) {
					return false, fmt.Errorf("instance terminated before its pod was evicted")
				}
				return true, nil
			})
			if time.Now().After(notBefore) {
				t.Fatalf("terminated after NotBefore %s", notBefore)
			}
			e.eventually("the Node deleted", 60*time.Second, func(context.Context) (bool, error) {
				_, err := e.node(n.name)
				return err != nil, nil
			})
			if c := e.emu.Terminations(n.instanceID); c != 1 {
				t.Errorf("%d TerminateInstances for the instance, want 1", c)
			}
		})
	}
}
