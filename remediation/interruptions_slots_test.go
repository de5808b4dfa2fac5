package remediation

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nodevigil/nodevigil/remediation/decide"
	"github.com/nodevigil/nodevigil/remediation/ec2"
)

// slotPolicies is one pool (maxInFlight 1) whose scheduled reboots are drained and whose dead
// nodes are terminated.
const slotPolicies = `clusterPauseThreshold: 100%
zonePauseThreshold: 100%
policies:
- name: general
  nodeSelector: karpenter.sh/nodepool=general
  maxUnhealthy: 100%
  maxInFlight: 1
  interruptions: {scheduledReboot: Drain}
`

// TestSlotsAreSharedWithRemediation: maxInFlight is one budget for both sides. A node cordoned
// for a scheduled event holds the pool's only slot, so a dead node of the pool waits
// (MaxInFlightReached, counted) until the event is over, and is then terminated once; and a
// node in the remediation pipeline makes a scheduled event wait in turn.
func TestSlotsAreSharedWithRemediation(t *testing.T) {
	for _, tc := range []struct {
		name string
		// censusFirst lets the census see the interruption mark before the dead node is
		// judged (else only the reservation counts).
		censusFirst bool
	}{{"reservation", false}, {"census", true}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, liveConfig(t, slotPolicies))
			src := &fakeEvents{known: map[string]bool{}, events: map[string][]ec2.ScheduledEvent{}}
			h.c.cfg.ScheduledEvents = src
			h.healthy(newNode("rebooting", inPool("general")))
			h.add(newPod("app", "web-1", "rebooting"))
			h.pdb["app/web-1"] = true // the drain is held: the node stays cordoned
			ev := ec2.ScheduledEvent{ID: "instance-event-0000000000000001", Code: "system-reboot", Description: "scheduled reboot", NotBefore: t0.Add(30 * time.Minute)}
			src.set(instanceOf(h.node("rebooting")), ev)
			h.c.pollScheduledEvents(h.ctx)
			if _, err := h.c.syncNode(h.ctx, "rebooting"); err != nil {
				t.Fatal(err)
			}
			if len(cordoned(h, "rebooting")) != 1 {
				t.Fatal("the scheduled reboot was not acted on")
			}
			h.silent(newNode("dead", inPool("general")))
			if tc.censusFirst {
				h.clock.Step(time.Second)
				h.settle("rebooting")
			}
			h.drive("dead", 3)
			if decide.PhaseOf(h.node("dead")) != decide.PhaseNone || !hasEvent(h.events(), BlockMaxInFlight) {
				t.Fatalf("dead is %q with events %v; want it waiting (%s) while the pool's slot is held by the interruption drain",
					decide.PhaseOf(h.node("dead")), h.events(), BlockMaxInFlight)
			}
			if got := testutil.ToFloat64(h.c.metrics.blocked.WithLabelValues(BlockMaxInFlight)); got < 1 {
				t.Errorf("blocked_total{%s} = %v, want at least 1", BlockMaxInFlight, got)
			}
			// AWS rebooted it: EC2 stops listing the event, the cordon is lifted, the slot
			// frees, and the dead node is terminated once.
			src.set(instanceOf(h.node("rebooting")))
			h.c.pollScheduledEvents(h.ctx)
			h.renew(DefaultKubeletLeaseNamespace, "rebooting", h.clock.Now())
			h.renew(h.c.rc.AgentNamespace, "rebooting", h.clock.Now())
			if _, err := h.sync("rebooting"); err != nil {
				t.Fatal(err)
			}
			if len(cordoned(h, "rebooting")) != 0 {
				t.Fatal("still cordoned after the event completed")
			}
			h.clock.Step(time.Second)
			h.settle("rebooting")
			h.drive("dead", 10)
			if !h.nodeGone("dead") {
				t.Fatalf("dead not remediated once the slot freed: %q", h.Steps())
			}
			if n := len(h.cloud.Terminates()); n != 1 {
				t.Errorf("%d terminations, want 1", n)
			}
		})
	}
}

// TestScheduledEventWaitsForRemediation: the other side of the shared budget — a node in the
// remediation pipeline holds the slot, so a due scheduled event waits for it.
func TestScheduledEventWaitsForRemediation(t *testing.T) {
	h := newHarness(t, liveConfig(t, slotPolicies))
	src := &fakeEvents{known: map[string]bool{}, events: map[string][]ec2.ScheduledEvent{}}
	h.c.cfg.ScheduledEvents = src
	h.silent(newNode("dead", inPool("general")))
	h.add(newPod("app", "guarded", "dead"))
	h.pdb["app/guarded"] = true
	if _, err := h.sync("dead"); err != nil {
		t.Fatal(err)
	}
	if decide.PhaseOf(h.node("dead")) != decide.PhaseDraining {
		t.Fatalf("dead is %q, want Draining", decide.PhaseOf(h.node("dead")))
	}
	h.healthy(newNode("rebooting", inPool("general")))
	src.set(instanceOf(h.node("rebooting")), ec2.ScheduledEvent{ID: "instance-event-0000000000000002", Code: "system-reboot",
		Description: "scheduled reboot", NotBefore: t0.Add(30 * time.Minute)})
	h.c.pollScheduledEvents(h.ctx)
	syncN(h, "rebooting", 2)
	if len(cordoned(h, "rebooting")) != 0 || !hasEvent(h.events(), EventInterruptionWaiting) {
		t.Fatalf("rebooting cordoned=%v events %v; want it waiting for the slot", cordoned(h, "rebooting"), h.events())
	}
}
