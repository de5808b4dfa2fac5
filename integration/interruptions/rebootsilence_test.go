package interruptions_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

// TestSilenceDuringScheduledRebootIsTolerated: AWS reboots instances inside their scheduled
// event's window, and their kubelet and agent go quiet for minutes. Three nodes of a
// Terminate pool (silentNode 3 s) go silent at once: one whose system-reboot window is open in
// EC2's DescribeInstanceStatus, one whose agent reported it in NoScheduledEvent before going
// down, and one with no event. The real remediator terminates the last (the toleration is
// live) and tolerates the two rebooting ones — no remediation step, an Event that says why.
func TestSilenceDuringScheduledRebootIsTolerated(t *testing.T) {
	e := newEnv(t)
	inEC2, silenceEC2 := e.addSilenceableNode("")
	byAgent, silenceAgent := e.addSilenceableNode("")
	control, silenceControl := e.addSilenceableNode("")
	notBefore := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
	notAfter := notBefore.Add(2 * time.Hour)
	if err := e.emu.AddScheduledEvent(inEC2.instanceID, ec2emu.ScheduledEvent{ID: eventID(70), Code: ec2emu.EventSystemReboot,
		Description: "The instance is scheduled for a reboot", NotBefore: notBefore, NotAfter: notAfter}); err != nil {
		t.Fatal(err)
	}
	e.setCondition(byAgent, "NoScheduledEvent", "False", "system-reboot",
		fmt.Sprintf("system-reboot %s: The instance is scheduled for a reboot; not before %s, not after %s",
			eventID(71), notBefore.Format(time.RFC3339), notAfter.Format(time.RFC3339)))
	e.startPolicy(`action: Terminate
startupGrace: 1s
tolerations: {silentNode: 3s, kubeletUnhealthy: 30s}
drain: {enabled: true, timeout: 20s, onTimeout: Proceed}
maxUnhealthy: 100%
maxInFlight: 3
interruptions: {scheduledReboot: Notify}`)
	// Let the remediator see every node alive and poll EC2 once before the reboots begin.
	e.eventually("EC2's scheduled event seen", 40*time.Second, func(ctx context.Context) (bool, error) {
		return e.scrapeMetric(ctx, "nodevigil_remediator_scheduled_events", `kind="scheduledReboot"`) >= 1, nil
	})
	silenceEC2()
	silenceAgent()
	silenceControl()

	e.eventually("the node without an event terminated", 90*time.Second, func(context.Context) (bool, error) {
		return e.emu.Terminations(control.instanceID) == 1, nil
	})
	e.never("a rebooting node remediated", 10*time.Second, func(context.Context) bool {
		for _, n := range []*simNode{inEC2, byAgent} {
			obj, err := e.node(n.name)
			if err != nil || obj.Annotations["nodevigil.io/remediation-state"] != "" || e.emu.Terminations(n.instanceID) > 0 {
				return true
			}
		}
		return false
	})
	for _, n := range []*simNode{inEC2, byAgent} {
		e.eventually("a NodeSilent Event naming the reboot on "+n.name, 30*time.Second, func(context.Context) (bool, error) {
			return e.eventMessageHas(n.name, "NodeSilent", "AWS is rebooting the instance"), nil
		})
	}
}
