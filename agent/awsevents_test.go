package agent

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevigil/nodevigil/agent/conditions"
	"github.com/nodevigil/nodevigil/collectors"
)

func nextEvent(t *testing.T, h *harness) string {
	t.Helper()
	for {
		select {
		case ev := <-h.recorder.Events:
			if strings.Contains(ev, "TaintsRemoved") {
				continue
			}
			return ev
		default:
			return ""
		}
	}
}

// TestAWSEventConditionsAndEvents: a spot notice turns NoSpotInterruption False with the
// event code as reason and records a Warning Event; an unreadable metadata service records
// one IMDSUnavailable Event and leaves the condition Unknown; the notice clearing records a
// Normal AWSEventCleared Event.
func TestAWSEventConditionsAndEvents(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, nil)
	spot := h.checks[collectors.CheckSpotInterruption]
	h.agent.cycle(ctx)
	if ev := nextEvent(t, h); ev != "" {
		t.Fatalf("event with no AWS event pending: %q", ev)
	}
	steps := []struct {
		status    collectors.Status
		reason    string
		cond      v1.ConditionStatus
		wantEvent string
	}{
		{collectors.StatusUnhealthy, "SpotTerminate", v1.ConditionFalse, "Warning SpotTerminate spot-interruption: SpotTerminate message"},
		{collectors.StatusUnhealthy, "SpotTerminate", v1.ConditionFalse, ""},
		{collectors.StatusHealthy, "NoEvent", v1.ConditionTrue, "Normal AWSEventCleared"},
		{collectors.StatusUnknown, "IMDSHopLimitExceeded", v1.ConditionUnknown, "Warning IMDSUnavailable"},
		{collectors.StatusUnknown, "IMDSHopLimitExceeded", v1.ConditionUnknown, ""},
	}
	for i, st := range steps {
		spot.set(st.status, st.reason, nil)
		h.clock.Step(time.Second)
		h.agent.cycle(ctx)
		var got *v1.NodeCondition
		for _, c := range h.node(t).Status.Conditions {
			if c.Type == conditions.TypeNoSpotInterruption {
				got = &c
			}
		}
		if got == nil || got.Status != st.cond || got.Reason != st.reason {
			t.Fatalf("step %d: condition %+v, want %s/%s", i, got, st.cond, st.reason)
		}
		ev := nextEvent(t, h)
		if (st.wantEvent == "") != (ev == "") || !strings.HasPrefix(ev, st.wantEvent) {
			t.Fatalf("step %d: event %q, want %q", i, ev, st.wantEvent)
		}
	}
}

// TestWakeRunsACycleAtOnce: a signal on Wake publishes a changed result without waiting for
// the next CheckInterval tick (the fake clock never moves).
func TestWakeRunsACycleAtOnce(t *testing.T) {
	wake := make(chan struct{}, 1)
	h := newHarness(t, func(c *Config) { c.Wake = wake; c.CheckInterval = time.Hour })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.agent.serve(ctx, ln) }()
	defer func() { cancel(); <-done }()

	cond := func() v1.ConditionStatus {
		n, err := h.client.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range n.Status.Conditions {
			if c.Type == conditions.TypeNoSpotInterruption {
				return c.Status
			}
		}
		return ""
	}
	deadline := time.Now().Add(5 * time.Second)
	for cond() != v1.ConditionTrue {
		if time.Now().After(deadline) {
			t.Fatal("first cycle never reported")
		}
		time.Sleep(5 * time.Millisecond)
	}
	h.checks[collectors.CheckSpotInterruption].set(collectors.StatusUnhealthy, "SpotTerminate", nil)
	wake <- struct{}{}
	for cond() != v1.ConditionFalse {
		if time.Now().After(deadline) {
			t.Fatal("wake did not run a cycle")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
