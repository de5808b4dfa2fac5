package remediation

import (
	"strings"
	"testing"
	"time"

	"github.com/nodevigil/nodevigil/remediation/decide"
	"github.com/nodevigil/nodevigil/remediation/ec2"
)

// replacePolicies: the general pool replaces nodes AWS will retire.
const replacePolicies = `policies:
- name: general
  nodeSelector: karpenter.sh/nodepool=general
  interruptions: {scheduledRetirement: Replace}
`

// TestReplaceTerminatesEarlyThroughThePipeline: a scheduled retirement on a Replace pool is
// drained, then its instance terminated once, through remediation's terminate step (the
// Terminating phase recorded after EC2 accepted, the Node deleted once the instance is gone);
// in dryRun nothing is terminated; an instance without the ownership tag is never terminated
// and the node is recorded blocked (Event, counter), with no retries.
func TestReplaceTerminatesEarlyThroughThePipeline(t *testing.T) {
	for _, tc := range []struct {
		name       string
		dryRun     bool
		notOwned   bool
		terminates int
	}{
		{name: "live", terminates: 1},
		{name: "dry run", dryRun: true},
		{name: "not owned", notOwned: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := replacePolicies
			if tc.dryRun {
				doc = "dryRun: true\n" + doc
			}
			h := newHarness(t, liveConfig(t, doc))
			src := &fakeEvents{known: map[string]bool{}, events: map[string][]ec2.ScheduledEvent{}}
			h.c.cfg.ScheduledEvents = src
			h.healthy(newNode("old", inPool("general")))
			h.add(newPod("app", "web-1", "old"))
			id := instanceOf(h.node("old"))
			if tc.notOwned {
				h.cloud.owned[id] = false
			}
			src.set(id, ec2.ScheduledEvent{ID: "instance-event-00000000000000003", Code: "instance-retirement",
				Description: "The instance is scheduled for retirement", NotBefore: t0.Add(30 * time.Minute)})
			h.c.pollScheduledEvents(h.ctx)
			for range 8 {
				if h.nodeGone("old") {
					break
				}
				if _, err := h.sync("old"); err != nil {
					t.Fatal(err)
				}
				if h.nodeGone("old") {
					break
				}
				stepAlive(h, time.Second, "old")
			}
			if n := len(h.cloud.Terminates()); n != tc.terminates {
				t.Fatalf("%d terminations, want %d; steps %q", n, tc.terminates, h.Steps())
			}
			steps := strings.Join(h.Steps(), ",")
			switch {
			case tc.terminates == 1:
				if !strings.Contains(steps, "evict app/web-1") || !h.nodeGone("old") {
					t.Errorf("want drained then the Node deleted; steps %q", steps)
				}
				if i, j := strings.Index(steps, "evict app/web-1"), strings.Index(steps, string(decide.PhaseTerminating)); j < 0 || i > j {
					t.Errorf("not drained before the termination was recorded: %q", steps)
				}
				if !hasEvent(h.events(), EventInterruptionReplacing) {
					t.Error("no InterruptionReplacing event")
				}
			case tc.notOwned:
				n := h.node("old")
				if !strings.HasSuffix(n.Annotations[AnnotationInterruptionReplaceBlocked], "/"+BlockNotOwned) || !n.Spec.Unschedulable {
					t.Errorf("annotations %v unschedulable %v; want replace blocked (NotOwned) and still cordoned", n.Annotations, n.Spec.Unschedulable)
				}
				if !hasEvent(h.events(), BlockNotOwned) {
					t.Errorf("no %s event: %v", BlockNotOwned, h.events())
				}
				if d := strings.Count(strings.Join(h.cloud.Describes(), ","), id); d != 1 {
					t.Errorf("instance described %d times, want 1 (no retries after a terminal outcome)", d)
				}
			}
		})
	}
}
