package scenarios_test

import (
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevigil/nodevigil/integration/fleet"
	"github.com/nodevigil/nodevigil/integration/timeline"
)

// User problem 2 in make run's fleet: AWS's own events, decided per pool. At once, the general
// pool's spot node (real agent) gets a spot notice, and a general and a kafka node each get a
// scheduled reboot (EC2 only: simulated agents read no metadata). General drains the spot node
// before AWS reclaims it — nodevigil terminates nothing, AWS does — and the replacement joins;
// general cordons its node for the reboot (scheduledReboot CordonOnly, inside the lead time);
// kafka (Notify) never cordons. Canceling the reboots uncordons general's node.
func TestAWSEventsDecidedPerPoolInTheFleet(t *testing.T) {
	const warning = 20 * time.Second
	w := newWorld(t, "aws", []fleet.PoolSpec{
		{Name: "aws-general", Size: 3, RealAgents: 1, Spot: true},
		{Name: "aws-kafka", Size: 2, DoNotDisrupt: true},
	}, func(c *fleet.Config) { c.SpotNoticeWarning = warning })
	w.startRemediator("remediator-a")
	spot, rebootG, rebootK := w.node("aws-general", true), w.node("aws-general", false), w.node("aws-kafka", false)

	noticed := time.Now()
	w.inject("spot-notice", spot.Name)
	w.inject("maintenance", rebootG.Name)
	w.inject("maintenance", rebootK.Name)

	// The spot node: cordoned and its pod evicted before AWS's deadline.
	pod := "app-" + spot.Name
	w.eventually(spot.Name+" cordoned and its pod evicted (spot notice, Drain)", warning, func() bool {
		p, err := w.client.CoreV1().Pods(fleet.WorkloadNamespace).Get(t.Context(), pod, metav1.GetOptions{})
		gone := apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil)
		return w.seen.get(spot.Name).cordoned && gone
	})
	t.Logf("spot notice → %s cordoned after %s, drained after %s (AWS reclaims at %s)", spot.Name,
		w.seen.get(spot.Name).cordonedAt.Sub(noticed).Round(100*time.Millisecond), time.Since(noticed).Round(100*time.Millisecond), warning)
	w.eventually(rebootG.Name+" cordoned for its scheduled reboot (general: CordonOnly)", 30*time.Second, func() bool {
		return w.seen.get(rebootG.Name).cordoned
	})

	// AWS keeps its deadline; the autoscaler replaces the node; nodevigil asked for nothing.
	r := w.replacement(spot, warning+30*time.Second)
	if n := w.emu.Terminations(spot.InstanceID); n != 0 {
		t.Errorf("nodevigil terminated %s's instance %d times; a spot notice is AWS's to carry out", spot.Name, n)
	}
	if calls := w.emu.TerminateCalls(); len(calls) != 0 {
		t.Errorf("TerminateInstances calls %v, want none", calls)
	}
	points, err := timeline.Collect(t.Context(), w.client, spot.Name)
	if err != nil {
		t.Fatal(err)
	}
	var story []string
	for _, p := range points {
		story = append(story, p.Reason)
	}
	for _, want := range []string{"InterruptionCordoned", "InterruptionDrained", fleet.EventInstanceReclaimed, fleet.EventReplacementJoined} {
		if !containsString(story, want) {
			t.Errorf("the spot node's story lacks %s: %v", want, story)
		}
	}
	t.Logf("%s reclaimed by AWS and replaced by %s", spot.Name, r.Name)

	// Kafka only reports: by now its reboot has been seen for several polls.
	if h := w.seen.get(rebootK.Name); h.cordoned {
		t.Errorf("%s (kafka, scheduledReboot Notify) was cordoned", rebootK.Name)
	}

	// The reboots are called off: general's node comes back, kafka's was never touched.
	for _, n := range []string{rebootG.Name, rebootK.Name} {
		if err := w.fleet.Heal(t.Context(), n); err != nil {
			t.Fatal(err)
		}
	}
	w.eventually(rebootG.Name+" uncordoned once its reboot is canceled", 30*time.Second, func() bool {
		n, err := w.client.CoreV1().Nodes().Get(t.Context(), rebootG.Name, metav1.GetOptions{})
		return err == nil && !n.Spec.Unschedulable
	})
	if h := w.seen.get(rebootK.Name); h.cordoned {
		t.Errorf("%s (kafka, scheduledReboot Notify) was cordoned", rebootK.Name)
	}
}
