package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestExplainScheduledReboot: general-a-2 of the golden fleet has been silent 10 minutes; with a
// system-reboot pending in the agent's NoScheduledEvent condition whose window holds that
// silence, explain says how long policy general tolerates it (tolerations.scheduledReboot) and
// judges by it.
func TestExplainScheduledReboot(t *testing.T) {
	tests := []struct {
		name   string
		reboot time.Duration // tolerations.scheduledReboot of policy general; 0: the default
		want   []string
	}{
		{name: "default 20m", want: []string{
			"policy general tolerates that 20m0s (tolerations.scheduledReboot) rather than silentNode 3m0s",
			"so tolerated 20m0s from", "The toleration ends 2026-11-23T12:10:50Z"}},
		{name: "custom 45m", reboot: 45 * time.Minute, want: []string{
			"policy general tolerates that 45m0s (tolerations.scheduledReboot) rather than silentNode 3m0s",
			"so tolerated 45m0s from", "The toleration ends 2026-11-23T12:35:50Z"}},
		{name: "equal to silentNode", reboot: 3 * time.Minute, want: []string{
			"Policy general gives a silence inside the window of system-reboot instance-event-0123456789abcdef0 no extra time (tolerations.scheduledReboot 3m0s, silentNode 3m0s)",
			"The toleration ended 6m10s ago"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := goldenSnapshot(t)
			for i := range s.cfg.Policies {
				if p := &s.cfg.Policies[i]; p.Name == "general" && tc.reboot != 0 {
					p.Tolerations.ScheduledReboot = tc.reboot
				}
			}
			found := false
			for i := range s.nodes {
				if n := &s.nodes[i]; n.Name == "general-a-2" {
					found = true
					n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{
						Type: "NoScheduledEvent", Status: corev1.ConditionFalse, Reason: "system-reboot",
						Message: "system-reboot instance-event-0123456789abcdef0: The instance is scheduled for a reboot; not before " +
							stamp(goldenNow.Add(-15*time.Minute)) + ", not after " + stamp(goldenNow.Add(time.Hour)),
						LastTransitionTime: metav1.NewTime(goldenNow.Add(-2 * time.Hour)),
					})
				}
			}
			if !found {
				t.Fatal("general-a-2 is not in the fleet")
			}
			views := s.views()
			var b bytes.Buffer
			for _, v := range views {
				if v.Name == "general-a-2" {
					explain(&b, s, views, v, nil)
				}
			}
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("explain lacks %q:\n%s", w, b.String())
				}
			}
		})
	}
}
