package config

import (
	"strings"
	"testing"
	"time"
)

const interruptionsHead = "apiVersion: nodevigil.io/v1alpha1\nkind: RemediatorConfig\npolicies:\n"

func TestInterruptionsDefaultsAndKafka(t *testing.T) {
	c, err := Parse([]byte(interruptionsHead + `- name: kafka
  nodeSelector: karpenter.sh/nodepool=kafka
  interruptions:
    spotInterruption: Notify
    rebalanceRecommendation: Notify
    scheduledReboot: Notify
    scheduledRetirement: Notify
    asgTermination: Notify
- name: general
  nodeSelector: karpenter.sh/nodepool=general
  interruptions:
    scheduledRetirement: Replace
    leadTime: 2h
    margin: 15m
    doNotDisruptPods: Keep
`))
	if err != nil {
		t.Fatal(err)
	}
	kafka, general, def := c.Policies[0].Interruptions, c.Policies[1].Interruptions, c.Policies[2].Interruptions
	for _, a := range []InterruptionAction{kafka.SpotInterruption, kafka.RebalanceRecommendation, kafka.ScheduledReboot, kafka.ScheduledRetirement, kafka.ASGTermination} {
		if a != InterruptionNotify {
			t.Errorf("kafka: %s, want Notify for every kind", a)
		}
	}
	if general.SpotInterruption != InterruptionDrain || general.ScheduledRetirement != InterruptionReplace ||
		general.LeadTime != 2*time.Hour || general.Margin != 15*time.Minute || general.ScheduledReboot != InterruptionCordonOnly || general.DoNotDisruptPods != DoNotDisruptKeep {
		t.Errorf("general: %+v", general)
	}
	if def != DefaultInterruptions() || def.SpotInterruption != InterruptionDrain || def.RebalanceRecommendation != InterruptionNotify ||
		def.ScheduledReboot != InterruptionCordonOnly || def.ScheduledRetirement != InterruptionDrain || def.LeadTime != time.Hour || def.DoNotDisruptPods != DoNotDisruptEvictLast {
		t.Errorf("default policy: %+v", def)
	}
}

// TestImmediateAllowed: the sanity valve's bound, rounded up, never below one node.
func TestImmediateAllowed(t *testing.T) {
	c, err := Parse([]byte(interruptionsHead + "- name: a\n  nodeSelector: x=y\n  interruptions: {maxImmediate: 3}\n"))
	if err != nil {
		t.Fatal(err)
	}
	def := DefaultInterruptions()
	for _, tc := range []struct {
		in          Interruptions
		total, want int
	}{
		{def, 10, 5}, {def, 5, 3}, {def, 1, 1}, {def, 0, 1},
		{c.Policies[0].Interruptions, 100, 3}, {c.Policies[0].Interruptions, 2, 3},
	} {
		if got := tc.in.ImmediateAllowed(tc.total); got != tc.want {
			t.Errorf("ImmediateAllowed(%s of %d) = %d, want %d", tc.in.MaxImmediate.String(), tc.total, got, tc.want)
		}
	}
}

func TestInterruptionsErrors(t *testing.T) {
	tests := []struct{ name, doc, want string }{
		{"unknown action", "  interruptions: {spotInterruption: Evict}\n", `policies[0].interruptions.spotInterruption: "Evict" is not a choice; use Drain, CordonOnly, Notify or Ignore`},
		{"replace on spot", "  interruptions: {spotInterruption: Replace}\n", "policies[0].interruptions.spotInterruption: Replace applies to scheduledRetirement only"},
		{"unknown field", "  interruptions: {spot: Drain}\n", "policies[0].interruptions.spot: unknown field"},
		{"negative lead time", "  interruptions: {leadTime: -1h}\n", "policies[0].interruptions.leadTime: -1h0m0s is negative"},
		{"bad margin", "  interruptions: {margin: soon}\n", `policies[0].interruptions.margin: "soon" is not a duration`},
		{"zero maxImmediate", "  interruptions: {maxImmediate: 0}\n", "policies[0].interruptions.maxImmediate: 0 must be at least 1"},
		{"unknown doNotDisruptPods", "  interruptions: {doNotDisruptPods: Never}\n", `policies[0].interruptions.doNotDisruptPods: "Never" is not a choice; use EvictLast`},
		{"maxImmediate above 100%", "  interruptions: {maxImmediate: 150%}\n", `policies[0].interruptions.maxImmediate: "150%" is above 100%`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(interruptionsHead + "- name: a\n  nodeSelector: x=y\n" + tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}
