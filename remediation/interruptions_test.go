package remediation

import (
	"net/http/httptest"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevigil/nodevigil/collectors"
	"github.com/nodevigil/nodevigil/collectors/imds"
	"github.com/nodevigil/nodevigil/integration/ec2emu"
	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/ec2"
)

var intrNow = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// agentConditions runs the agent's real AWS event collector against an emulated instance and
// returns the conditions the agent would write, so the remediator's parsing is tested against
// the messages the agent really produces.
func agentConditions(t *testing.T, script func(*ec2emu.Server, string)) []corev1.NodeCondition {
	t.Helper()
	const id = "i-0123456789abcdef0"
	emu := ec2emu.New(ec2emu.Config{})
	if err := emu.AddInstance(ec2emu.Instance{ID: id}); err != nil {
		t.Fatal(err)
	}
	script(emu, id)
	hs := httptest.NewServer(emu.IMDSHandler(id))
	defer hs.Close()
	w, err := imds.New(imds.Config{Endpoint: hs.URL, OneShot: true})
	if err != nil {
		t.Fatal(err)
	}
	types := map[collectors.CheckName]corev1.NodeConditionType{
		collectors.CheckSpotInterruption: ConditionNoSpotInterruption, collectors.CheckRebalanceRecommendation: ConditionNoRebalanceRecommendation,
		collectors.CheckScheduledEvents: ConditionNoScheduledEvent, collectors.CheckASGLifecycle: ConditionNoASGTermination,
	}
	var out []corev1.NodeCondition
	for _, c := range w.Checks() {
		r := c.Check(t.Context())
		st := corev1.ConditionTrue
		switch r.Status {
		case collectors.StatusWarning, collectors.StatusUnhealthy: // one-shot reports pending events as Warning
			if r.Reason != imds.ReasonNoEvent {
				st = corev1.ConditionFalse
			}
		case collectors.StatusUnknown:
			st = corev1.ConditionUnknown
		}
		out = append(out, corev1.NodeCondition{Type: types[c.Name()], Status: st, Reason: r.Reason, Message: r.Message,
			LastTransitionTime: metav1.NewTime(intrNow)})
	}
	return out
}

func TestInterruptionsFromAgentConditions(t *testing.T) {
	nb := time.Date(2026, 1, 9, 9, 0, 0, 0, time.UTC)
	conds := agentConditions(t, func(s *ec2emu.Server, id string) {
		s.SetSpotInstanceAction(id, "terminate", intrNow.Add(2*time.Minute))
		s.SetRebalanceRecommendation(id, intrNow)
		s.SetTargetLifecycleState(id, "InService")
		for i, ev := range []ec2emu.ScheduledEvent{
			{ID: "instance-event-00000000000000001", Code: ec2emu.EventSystemReboot, Description: "scheduled reboot", NotBefore: nb, NotAfter: nb.Add(2 * time.Hour)},
			{ID: "instance-event-00000000000000002", Code: ec2emu.EventInstanceStop, Description: "The instance is scheduled for stop", NotBefore: nb.Add(24 * time.Hour)},
			{ID: "instance-event-00000000000000003", Code: ec2emu.EventInstanceReboot, Description: "done", NotBefore: nb, State: ec2emu.EventStateCompleted},
		} {
			if err := s.AddScheduledEvent(id, ev); err != nil {
				t.Fatal(i, err)
			}
		}
	})
	got := InterruptionsFromNode(&corev1.Node{Status: corev1.NodeStatus{Conditions: conds}})
	want := map[string]Interruption{
		"spotInterruption":                 {Kind: KindSpotInterruption, Code: "SpotTerminate", NotBefore: intrNow.Add(2 * time.Minute)},
		"rebalanceRecommendation":          {Kind: KindRebalanceRecommendation, Code: "RebalanceRecommendation"},
		"instance-event-00000000000000001": {Kind: KindScheduledReboot, Code: "system-reboot", NotBefore: nb, NotAfter: nb.Add(2 * time.Hour)},
		"instance-event-00000000000000002": {Kind: KindScheduledRetirement, Code: "instance-stop", NotBefore: nb.Add(24 * time.Hour)},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d interruptions %+v, want %d", len(got), got, len(want))
	}
	for _, in := range got {
		w, ok := want[in.ID]
		if !ok || in.Kind != w.Kind || in.Code != w.Code || !in.NotBefore.Equal(w.NotBefore) || !in.NotAfter.Equal(w.NotAfter) {
			t.Errorf("%s: got %+v, want %+v", in.ID, in, w)
		}
	}

	// An agent that cannot read the metadata service reports nothing to act on.
	unknown := agentConditions(t, func(s *ec2emu.Server, id string) { s.SetIMDSMode(id, ec2emu.IMDSHopLimitExceeded) })
	if got := InterruptionsFromNode(&corev1.Node{Status: corev1.NodeStatus{Conditions: unknown}}); len(got) != 0 {
		t.Errorf("IMDS unreachable gave interruptions %+v", got)
	}
}

func TestMergeInterruptionsByEventID(t *testing.T) {
	nb := time.Date(2026, 1, 9, 9, 0, 0, 0, time.UTC)
	fromNode := []Interruption{
		{Kind: KindScheduledReboot, ID: "instance-event-00000000000000001", Code: "system-reboot", NotBefore: nb.Add(time.Minute), Sources: []string{SourceAgent}},
		{Kind: KindSpotInterruption, ID: "spotInterruption", Code: "SpotTerminate", NotBefore: intrNow.Add(2 * time.Minute), Sources: []string{SourceAgent}},
	}
	fromEC2 := []ec2.ScheduledEvent{
		{ID: "instance-event-00000000000000001", Code: "system-reboot", NotBefore: nb},                                  // same event, EC2's time
		{ID: "instance-event-00000000000000002", Code: "instance-retirement", NotBefore: nb.Add(48 * time.Hour)},        // only EC2 sees it
		{ID: "instance-event-00000000000000003", Code: "instance-stop", Description: "[Completed] stop", NotBefore: nb}, // finished
	}
	got := MergeInterruptions(fromNode, fromEC2)
	if len(got) != 3 {
		t.Fatalf("got %+v, want 3 interruptions (one per event ID, the finished one dropped)", got)
	}
	if got[0].ID != "spotInterruption" || got[1].ID != "instance-event-00000000000000001" || got[2].ID != "instance-event-00000000000000002" {
		t.Errorf("order: %s, %s, %s", got[0].ID, got[1].ID, got[2].ID)
	}
	if r := got[1]; !r.NotBefore.Equal(nb) || len(r.Sources) != 2 {
		t.Errorf("merged reboot: %+v, want EC2's NotBefore and both sources", r)
	}
}

func TestPlanInterruption(t *testing.T) {
	def := config.DefaultInterruptions()
	kafka := config.Interruptions{SpotInterruption: config.InterruptionNotify, RebalanceRecommendation: config.InterruptionNotify,
		ScheduledReboot: config.InterruptionNotify, ScheduledRetirement: config.InterruptionNotify, ASGTermination: config.InterruptionNotify}
	nb := intrNow.Add(11 * 24 * time.Hour)
	spot := Interruption{Kind: KindSpotInterruption, NotBefore: intrNow.Add(2 * time.Minute)}
	stop := Interruption{Kind: KindScheduledRetirement, Code: "instance-stop", NotBefore: nb}
	reboot := Interruption{Kind: KindScheduledReboot, Code: "system-reboot", NotBefore: nb}
	tests := []struct {
		name      string
		pol       config.Interruptions
		in        Interruption
		action    config.InterruptionAction
		startAt   time.Time
		finishBy  time.Time
		holdsSlot bool
		pausable  bool
	}{
		{"spot drains at once, no slot, no pause", def, spot, config.InterruptionDrain, intrNow, spot.NotBefore, false, false},
		{"kafka spot notifies", kafka, spot, config.InterruptionNotify, intrNow, spot.NotBefore, false, false},
		{"stop eleven days out waits for the lead time", def, stop, config.InterruptionDrain, nb.Add(-time.Hour), nb.Add(-10 * time.Minute), true, false},
		{"reboot cordons at the lead time", def, reboot, config.InterruptionCordonOnly, nb.Add(-time.Hour), nb.Add(-10 * time.Minute), true, false},
		{"rebalance notifies", def, Interruption{Kind: KindRebalanceRecommendation}, config.InterruptionNotify, intrNow, time.Time{}, true, true},
		{"asg termination drains at once", def, Interruption{Kind: KindASGTermination}, config.InterruptionDrain, intrNow, time.Time{}, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := PlanInterruption(tc.pol, tc.in, intrNow)
			if p.Action != tc.action || !p.StartAt.Equal(tc.startAt) || !p.FinishBy.Equal(tc.finishBy) || p.HoldsSlot != tc.holdsSlot || p.Pausable != tc.pausable {
				t.Errorf("got %s start %s finish %s slot %v pausable %v", p.Action, p.StartAt, p.FinishBy, p.HoldsSlot, p.Pausable)
			}
		})
	}
	if p := PlanInterruption(def, stop, intrNow); p.Due(intrNow) {
		t.Error("an instance-stop eleven days out is due today")
	}
}

func TestGoverningPlanEscalates(t *testing.T) {
	def := config.DefaultInterruptions()
	rebalance := PlanInterruption(def, Interruption{Kind: KindRebalanceRecommendation}, intrNow)
	if p, ok := GoverningPlan([]InterruptionPlan{rebalance}, intrNow); !ok || p.Action != config.InterruptionNotify {
		t.Fatalf("rebalance alone: %+v %v", p, ok)
	}
	spot := PlanInterruption(def, Interruption{Kind: KindSpotInterruption, NotBefore: intrNow.Add(2 * time.Minute)}, intrNow)
	if p, ok := GoverningPlan([]InterruptionPlan{rebalance, spot}, intrNow); !ok || p.Action != config.InterruptionDrain || p.Interruption.Kind != KindSpotInterruption {
		t.Fatalf("rebalance then spot: %+v %v, want the spot notice's Drain", p, ok)
	}
	later := PlanInterruption(def, Interruption{Kind: KindScheduledRetirement, NotBefore: intrNow.Add(72 * time.Hour)}, intrNow)
	if _, ok := GoverningPlan([]InterruptionPlan{later}, intrNow); ok {
		t.Fatal("a retirement three days out governs now")
	}
}
