package remediation

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevigil/nodevigil/remediation/ec2"
)

func cordoned(h *harness, names ...string) []string {
	var out []string
	for _, n := range names {
		if node := h.node(n); node.Spec.Unschedulable && hasTaintKey(node, TaintInterruption) {
			out = append(out, n)
		}
	}
	return out
}

func asgTermination() nodeOpt {
	return withCondition(ConditionNoASGTermination, corev1.ConditionFalse, "Terminated", "the Auto Scaling group is terminating this instance")
}

// TestImmediateInterruptionIsCrossCheckedWithEC2: a spot notice on an on-demand instance and
// an ASG termination of an instance no ASG launched are not acted on (a Warning Event, the
// refuted counter); the same reports on a spot instance and an ASG instance drain at once.
func TestImmediateInterruptionIsCrossCheckedWithEC2(t *testing.T) {
	h := newHarness(t, liveConfig(t, interruptionPolicies))
	h.healthy(newNode("ondemand", inPool("general"), spotNotice()))
	h.healthy(newNode("spot", inPool("general"), spotNotice()))
	h.healthy(newNode("noasg", inPool("general"), asgTermination()))
	h.healthy(newNode("asg", inPool("general"), asgTermination()))
	h.spot("spot")
	h.cloud.asg[instanceOf(h.node("asg"))] = "general-asg"
	// Round one describes each instance once; EC2's answers are cached, and from the next
	// counts on the refuted reports no longer count towards the pool's valve (4 reports of 4
	// nodes would trip it; 2 corroborated ones do not).
	for round := range 2 {
		for _, n := range []string{"ondemand", "spot", "noasg", "asg"} {
			syncN(h, n, 2)
		}
		if round == 0 {
			h.clock.Step(2 * interruptionCensusMaxAge)
			for _, n := range []string{"ondemand", "spot", "noasg", "asg"} {
				h.renew(DefaultKubeletLeaseNamespace, n, h.clock.Now())
				h.renew(h.c.rc.AgentNamespace, n, h.clock.Now())
			}
		}
	}
	if got := cordoned(h, "ondemand", "spot", "noasg", "asg"); strings.Join(got, ",") != "spot,asg" {
		t.Fatalf("cordoned %v, want spot,asg", got)
	}
	evs := h.events()
	n := 0
	for _, e := range evs {
		if strings.Contains(e, EventInterruptionNotCorroborated) {
			n++
		}
	}
	if n != 2 {
		t.Errorf("%d %s events (want one each for ondemand and noasg): %v", n, EventInterruptionNotCorroborated, evs)
	}
	if v := testutil.ToFloat64(h.c.intr.checks.WithLabelValues("spotInterruption", checkRefuted)); v != 1 {
		t.Errorf("refuted spot checks %v, want 1 (the Event and the count once, however often the node is synced)", v)
	}
	// The instance's facts are described once and cached.
	if d := strings.Count(strings.Join(h.cloud.Describes(), ","), instanceOf(h.node("spot"))); d != 1 {
		t.Errorf("spot instance described %d times, want 1", d)
	}
}

// TestUnverifiableNoticeTakesASlot: when EC2 cannot be asked, the notice is still acted on,
// but maxInFlight (1) at a time.
func TestUnverifiableNoticeTakesASlot(t *testing.T) {
	h := newHarness(t, liveConfig(t, interruptionPolicies))
	for _, name := range []string{"a", "b"} {
		h.healthy(newNode(name, inPool("general"), spotNotice()))
		h.cloud.describeErr[instanceOf(h.node(name))] = []error{&CloudError{Kind: CloudErrorThrottled, Err: errors.New("throttled")}, &CloudError{Kind: CloudErrorThrottled, Err: errors.New("throttled")}}
	}
	syncN(h, "a", 2)
	syncN(h, "b", 2)
	if got := cordoned(h, "a", "b"); strings.Join(got, ",") != "a" {
		t.Fatalf("cordoned %v, want a alone", got)
	}
	if !hasEvent(h.events(), EventInterruptionWaiting) {
		t.Error("b waits without an Event")
	}
	if v := testutil.ToFloat64(h.c.intr.capped.WithLabelValues("unverified")); v < 2 {
		t.Errorf("capped{unverified} = %v", v)
	}
}

// TestValveCapsMassNotices: a buggy agent reports notices on every node of a 10-node spot
// pool: more than maxImmediate (50%), so they are drained maxInFlight (1) at a time, loudly.
// In another pool 3 notices of 10 are within the bound and all drain at once; and in a third
// (maxImmediate 2), reports that trickle in after the counts were taken never run more
// immediate drains than the bound: the third waits for a slot.
func TestValveCapsMassNotices(t *testing.T) {
	h := newHarness(t, liveConfig(t, interruptionPolicies+`- name: calm
  nodeSelector: karpenter.sh/nodepool=calm
- name: trickle
  nodeSelector: karpenter.sh/nodepool=trickle
  interruptions: {maxImmediate: 2}
`))
	var general, calm, trickle []string
	for i := range 10 {
		g, c, k := fmt.Sprintf("g%d", i), fmt.Sprintf("c%d", i), fmt.Sprintf("k%d", i)
		h.healthy(newNode(g, inPool("general"), spotNotice()))
		copts := []nodeOpt{inPool("calm")}
		if i < 3 {
			copts = append(copts, spotNotice())
		}
		h.healthy(newNode(c, copts...))
		h.healthy(newNode(k, inPool("trickle")))
		general, calm, trickle = append(general, g), append(calm, c), append(trickle, k)
	}
	all := append(append(append([]string{}, general...), calm...), trickle...)
	h.spot(all...)
	for _, n := range all {
		syncN(h, n, 2)
	}
	if got := cordoned(h, general...); len(got) != 1 {
		t.Errorf("general: %v cordoned, want 1 (maxInFlight) of 10 noticed", got)
	}
	if !hasEvent(h.events(), EventInterruptionCapped) {
		t.Error("no InterruptionCapped event")
	}
	if v := testutil.ToFloat64(h.c.intr.valve.WithLabelValues("general")); v != 1 {
		t.Errorf("valve gauge for general %v, want 1", v)
	}
	if got := cordoned(h, calm...); strings.Join(got, ",") != "c0,c1,c2" {
		t.Errorf("calm: %v cordoned, want c0,c1,c2 (3 of 10, within 50%%)", got)
	}
	// The counts were taken above and the clock stands still: the notices below are not in
	// them yet.
	for _, k := range trickle[:3] {
		n := h.node(k)
		spotNotice()(n)
		if _, err := h.client.CoreV1().Nodes().UpdateStatus(h.ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		syncN(h, k, 2)
	}
	if got := cordoned(h, trickle...); strings.Join(got, ",") != "k0,k1" {
		t.Errorf("trickle: %v cordoned, want k0,k1 (maxImmediate 2; k2 waits for a slot)", got)
	}
}

// fakeEvents is a ScheduledEventSource over a map, as EC2's DescribeInstanceStatus would
// answer: every known instance listed.
type fakeEvents struct {
	mu     sync.Mutex
	known  map[string]bool
	events map[string][]ec2.ScheduledEvent
	calls  int
}

func (f *fakeEvents) ScheduledEvents(_ context.Context, ids []string) (map[string][]ec2.ScheduledEvent, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	out := map[string][]ec2.ScheduledEvent{}
	for _, id := range ids {
		if f.known[id] {
			out[id] = append([]ec2.ScheduledEvent{}, f.events[id]...)
		}
	}
	return out, nil
}

func (f *fakeEvents) set(id string, evs ...ec2.ScheduledEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.known[id] = true
	f.events[id] = evs
}

// TestEC2OnlyScheduledEventsOneSlotAtATime: five nodes with no agent report, each with a
// reboot EC2 lists, due now: cordoned one at a time (maxInFlight 1); each event completing
// (EC2 stops listing it) uncordons its node and lets the next one go.
func TestEC2OnlyScheduledEventsOneSlotAtATime(t *testing.T) {
	h := newHarness(t, liveConfig(t, interruptionPolicies))
	src := &fakeEvents{known: map[string]bool{}, events: map[string][]ec2.ScheduledEvent{}}
	h.c.cfg.ScheduledEvents = src
	var names []string
	for i := range 5 {
		name := fmt.Sprintf("w%d", i)
		h.healthy(newNode(name, inPool("general")))
		names = append(names, name)
		src.set(instanceOf(h.node(name)), ec2.ScheduledEvent{ID: fmt.Sprintf("instance-event-%017x", i+1), Code: "system-reboot",
			Description: "scheduled reboot", NotBefore: t0.Add(30 * time.Minute)})
	}
	// A node EC2 does not list (not polled, unknown): nothing pending, nothing done.
	h.healthy(newNode("other", inPool("general")))
	h.c.pollScheduledEvents(h.ctx)
	for round := range 5 {
		for _, n := range append(names, "other") {
			syncN(h, n, 1)
		}
		got := cordoned(h, names...)
		if len(got) != 1 {
			t.Fatalf("round %d: cordoned %v, want exactly one", round, got)
		}
		// AWS reboots it: the event leaves DescribeInstanceStatus.
		src.set(instanceOf(h.node(got[0])))
		h.c.pollScheduledEvents(h.ctx)
		syncN(h, got[0], 1)
		if c := cordoned(h, got[0]); len(c) != 0 {
			t.Fatalf("round %d: %s still cordoned after its event completed", round, got[0])
		}
		h.clock.Step(2 * interruptionCensusMaxAge)
		for _, n := range names {
			h.renew(DefaultKubeletLeaseNamespace, n, h.clock.Now())
			h.renew(h.c.rc.AgentNamespace, n, h.clock.Now())
		}
	}
	if c := cordoned(h, "other"); len(c) != 0 {
		t.Error("a node without events was cordoned")
	}
	if src.calls != 6 {
		t.Errorf("%d polls", src.calls)
	}
}

// TestCordonKeptWhileTheEventIsNotPositivelyGone: an agent going Unknown after a notice, or an
// instance EC2 does not describe, is no proof that the event is over: the cordon stays.
func TestCordonKeptWhileTheEventIsNotPositivelyGone(t *testing.T) {
	h := newHarness(t, liveConfig(t, interruptionPolicies))
	h.healthy(newNode("s", inPool("general"), spotNotice()))
	h.spot("s")
	syncN(h, "s", 2)
	setCondition(h, "s", corev1.NodeCondition{Type: ConditionNoSpotInterruption, Status: corev1.ConditionUnknown, Reason: "IMDSUnreachable"})
	syncN(h, "s", 2)
	if len(cordoned(h, "s")) != 1 {
		t.Fatal("uncordoned when the agent went Unknown")
	}
	setCondition(h, "s", corev1.NodeCondition{Type: ConditionNoSpotInterruption, Status: corev1.ConditionTrue, Reason: "NoEvent"})
	syncN(h, "s", 2)
	if len(cordoned(h, "s")) != 0 {
		t.Fatal("still cordoned once the agent says the notice is gone")
	}
}

// TestEC2OnlyNotifyIsTold: an event only EC2 lists, on a pool whose policy says Notify, is told
// once in an InterruptionNotified Event (no agent condition tells it), and nothing is done; an
// event the agent also reports is left to the agent's own Event.
func TestEC2OnlyNotifyIsTold(t *testing.T) {
	h := newHarness(t, liveConfig(t, interruptionPolicies))
	src := &fakeEvents{known: map[string]bool{}, events: map[string][]ec2.ScheduledEvent{}}
	h.c.cfg.ScheduledEvents = src
	h.healthy(newNode("k1", inPool("kafka")))
	nb := t0.Add(30 * time.Minute)
	src.set(instanceOf(h.node("k1")), ec2.ScheduledEvent{ID: "instance-event-00000000000000001", Code: "system-reboot", Description: "scheduled reboot", NotBefore: nb})
	h.healthy(newNode("k2", inPool("kafka"), withCondition(ConditionNoScheduledEvent, corev1.ConditionFalse, "SystemReboot",
		"system-reboot instance-event-00000000000000002: scheduled reboot; not before "+nb.UTC().Format(time.RFC3339))))
	src.set(instanceOf(h.node("k2")), ec2.ScheduledEvent{ID: "instance-event-00000000000000002", Code: "system-reboot", Description: "scheduled reboot", NotBefore: nb})
	h.c.pollScheduledEvents(h.ctx)
	h.events()
	for range 3 {
		syncN(h, "k1", 1)
		syncN(h, "k2", 1)
	}
	var told []string
	for _, e := range h.events() {
		if strings.Fields(e)[1] == EventInterruptionNotified {
			told = append(told, e)
		}
	}
	if len(told) != 1 || !strings.Contains(told[0], "instance-event-00000000000000001") || !strings.Contains(told[0], "policy kafka says Notify") {
		t.Errorf("InterruptionNotified events %q, want one, for k1's EC2-only event", told)
	}
	for _, n := range []string{"k1", "k2"} {
		if h.node(n).Spec.Unschedulable {
			t.Errorf("%s cordoned under Notify", n)
		}
	}
}
