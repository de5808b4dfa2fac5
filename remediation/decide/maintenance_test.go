package decide

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// scheduled is the agent's NoScheduledEvent condition listing one event, as the agent writes it.
func scheduled(code string, notBefore, notAfter time.Duration) nodeOpt {
	return func(n *corev1.Node) {
		msg := code + " instance-event-0123456789abcdef0: The instance is scheduled for maintenance; not before " + ts(at(notBefore))
		if notAfter != 0 {
			msg += ", not after " + ts(at(notAfter))
		}
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: ConditionNoScheduledEvent, Status: corev1.ConditionFalse,
			Reason: code, Message: msg, LastTransitionTime: metav1.NewTime(at(-48 * time.Hour))})
	}
}

// TestScheduledRebootIsToleratedLonger: AWS reboots an instance inside its scheduled event's
// window; the node goes silent for minutes and comes back. The silentNode toleration (3 min)
// must not terminate it then: a silence that began inside the window of a reboot (from the
// agent's condition or EC2's list) is tolerated the policy's tolerations.scheduledReboot
// (default 20 min; rows with reboot set use their own).
func TestScheduledRebootIsToleratedLonger(t *testing.T) {
	// Both Leases last changed at now+silentAt: stale 50 s later (40 s + 10 s grace).
	tests := []struct {
		name     string
		node     *corev1.Node
		ec2      []ScheduledEvent
		silentAt time.Duration // when the Leases last changed
		agentUp  bool          // the agent is back, the kubelet is not
		reboot   time.Duration // the policy's tolerations.scheduledReboot; 0: the default
		action   Action
		reason   string
		requeue  time.Duration
		msg      string
		notMsg   string // must not be in the message, when set
	}{
		{name: "silent 10 min, no event: remediated after silentNode", node: node(), silentAt: -10 * time.Minute,
			action: ActionRemediate, reason: ReasonNodeSilent},
		{name: "silent 10 min inside a system-reboot window: tolerated 20 min", node: node(scheduled("system-reboot", -15*time.Minute, 105*time.Minute)), silentAt: -10 * time.Minute,
			action: ActionWait, reason: ReasonNodeSilent, requeue: 20*time.Minute - 10*time.Minute + 50*time.Second, msg: "AWS is rebooting the instance"},
		{name: "instance-reboot without NotAfter: tolerated", node: node(scheduled("instance-reboot", -15*time.Minute, 0)), silentAt: -10 * time.Minute,
			action: ActionWait, reason: ReasonNodeSilent, requeue: 10*time.Minute + 50*time.Second},
		{name: "silent 25 min inside the window: the reboot did not bring it back", node: node(scheduled("system-reboot", -30*time.Minute, 90*time.Minute)), silentAt: -25 * time.Minute,
			action: ActionRemediate, reason: ReasonNodeSilent},
		{name: "a retirement does not bring the instance back", node: node(scheduled("instance-retirement", -15*time.Minute, 0)), silentAt: -10 * time.Minute,
			action: ActionRemediate, reason: ReasonNodeSilent},
		{name: "silent since before the window opened", node: node(scheduled("system-reboot", 60*time.Minute, 180*time.Minute)), silentAt: -10 * time.Minute,
			action: ActionRemediate, reason: ReasonNodeSilent},
		{name: "silent since after the window closed", node: node(scheduled("system-reboot", -5*time.Hour, -3*time.Hour)), silentAt: -10 * time.Minute,
			action: ActionRemediate, reason: ReasonNodeSilent},
		{name: "listed by EC2 only", node: node(), ec2: []ScheduledEvent{{Code: "system-maintenance", ID: "instance-event-1", NotBefore: at(-15 * time.Minute), NotAfter: at(time.Hour)}}, silentAt: -10 * time.Minute,
			action: ActionWait, reason: ReasonNodeSilent, requeue: 10*time.Minute + 50*time.Second},
		{name: "agent back first, kubelet still down inside the window", node: node(scheduled("system-reboot", -15*time.Minute, 105*time.Minute)), silentAt: -10 * time.Minute, agentUp: true,
			action: ActionWait, reason: ReasonKubeletUnhealthy, msg: "AWS is rebooting the instance"},
		{name: "custom 45m: silent 30 min inside the window is still tolerated", node: node(scheduled("system-reboot", -35*time.Minute, 85*time.Minute)), silentAt: -30 * time.Minute, reboot: 45 * time.Minute,
			action: ActionWait, reason: ReasonNodeSilent, requeue: 15*time.Minute + 50*time.Second, msg: "tolerated 45m0s"},
		{name: "custom 45m: silent 50 min inside the window is remediated", node: node(scheduled("system-reboot", -55*time.Minute, 65*time.Minute)), silentAt: -50 * time.Minute, reboot: 45 * time.Minute,
			action: ActionRemediate, reason: ReasonNodeSilent, msg: "tolerated 45m0s"},
		{name: "custom 8m: silent 10 min inside the window is remediated", node: node(scheduled("system-reboot", -15*time.Minute, 105*time.Minute)), silentAt: -10 * time.Minute, reboot: 8 * time.Minute,
			action: ActionRemediate, reason: ReasonNodeSilent, msg: "tolerated 8m0s"},
		{name: "custom equal to silentNode: no extension", node: node(scheduled("system-reboot", -15*time.Minute, 105*time.Minute)), silentAt: -2 * time.Minute, reboot: 3 * time.Minute,
			action: ActionWait, reason: ReasonNodeSilent, requeue: time.Minute + 50*time.Second, msg: "silentNode toleration 3m0s", notMsg: "AWS is rebooting"},
		{name: "custom 45m applies to the kubelet toleration too", node: node(scheduled("system-reboot", -35*time.Minute, 85*time.Minute)), silentAt: -30 * time.Minute, agentUp: true, reboot: 45 * time.Minute,
			action: ActionWait, reason: ReasonKubeletUnhealthy, msg: "tolerated 45m0s"},
		{name: "healthy node with a reboot pending: nothing to tolerate", node: node(scheduled("system-reboot", time.Hour, 3*time.Hour)), silentAt: -5 * time.Second, agentUp: true,
			action: ActionNone, reason: ReasonHealthy},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			kub := lease(tc.silentAt)
			agent := lease(tc.silentAt)
			if tc.agentUp {
				agent = freshAgent
			}
			p := policy()
			if tc.reboot != 0 {
				p.Tolerations.ScheduledReboot = tc.reboot
			}
			d := Decide(Input{
				Node: tc.node, Policy: p, Now: now, ObservingSince: at(-48 * time.Hour), ObservePeriod: time.Minute,
				KubeletLease: kub, KubeletObserved: kub.Spec.RenewTime.Time,
				AgentLease: agent, AgentObserved: agent.Spec.RenewTime.Time,
				ScheduledEvents: tc.ec2,
			})
			if d.Action != tc.action || d.Reason != tc.reason {
				t.Fatalf("got %s %s (%s), want %s %s", d.Action, d.Reason, d.Message, tc.action, tc.reason)
			}
			if tc.requeue != 0 && d.RequeueAfter != tc.requeue {
				t.Errorf("requeue %v, want %v (%s)", d.RequeueAfter, tc.requeue, d.Message)
			}
			if !strings.Contains(d.Message, tc.msg) {
				t.Errorf("message %q lacks %q", d.Message, tc.msg)
			}
			if tc.notMsg != "" && strings.Contains(d.Message, tc.notMsg) {
				t.Errorf("message %q has %q", d.Message, tc.notMsg)
			}
		})
	}
}

func TestParseScheduledEvents(t *testing.T) {
	msg := "system-reboot instance-event-0aa: The instance is scheduled for a reboot; not before 2019-01-21T09:00:43Z, not after 2019-01-21T11:00:43Z; " +
		"instance-stop instance-event-0bb: The instance is scheduled for stop; not before 2019-01-22T09:00:00Z"
	got := ParseScheduledEvents(msg)
	if len(got) != 2 {
		t.Fatalf("parsed %d events from %q: %+v", len(got), msg, got)
	}
	if got[0].Code != "system-reboot" || got[0].ID != "instance-event-0aa" || got[0].NotAfter.IsZero() || got[0].NotBefore.Hour() != 9 {
		t.Errorf("first event %+v", got[0])
	}
	if got[1].Code != "instance-stop" || got[1].ID != "instance-event-0bb" || !got[1].NotAfter.IsZero() {
		t.Errorf("second event %+v", got[1])
	}
	if got := ParseScheduledEvents("no scheduled events"); len(got) != 0 {
		t.Errorf("parsed %+v from a message without events", got)
	}
}
