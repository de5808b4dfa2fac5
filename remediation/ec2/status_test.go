package ec2

import (
	"context"
	"fmt"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

// TestScheduledEventsBatchedAndActiveOnly: 250 instances take three DescribeInstanceStatus
// calls (100 per call), plus one more for the batch holding an unknown ID; completed and
// canceled events, which EC2 keeps listing, are dropped.
func TestScheduledEventsBatchedAndActiveOnly(t *testing.T) {
	f := newFixture(t, Config{})
	ids := f.addOwned(t, 250)
	nb := time.Date(2026, 1, 9, 9, 0, 0, 0, time.UTC)
	add := func(id string, n int, code, state string, at time.Time) {
		t.Helper()
		if err := f.emu.AddScheduledEvent(id, ec2emu.ScheduledEvent{ID: fmt.Sprintf("instance-event-%017x", n), Code: code,
			Description: "scheduled", NotBefore: at, State: state}); err != nil {
			t.Fatal(err)
		}
	}
	add(ids[0], 1, ec2emu.EventSystemReboot, "", nb.Add(time.Hour))
	add(ids[0], 2, ec2emu.EventInstanceStop, "", nb) // earlier: listed first
	add(ids[150], 3, ec2emu.EventInstanceRetirement, ec2emu.EventStateCompleted, nb)
	add(ids[249], 4, ec2emu.EventInstanceReboot, ec2emu.EventStateCanceled, nb)
	add(ids[249], 5, ec2emu.EventSystemMaintenance, "", nb)

	got, err := f.client.ScheduledEvents(context.Background(), append(ids, idUnknown, "not-an-id"), rate.NewLimiter(rate.Inf, 1))
	if err != nil {
		t.Fatal(err)
	}
	if len(got[ids[0]]) != 2 || len(got[ids[249]]) != 1 {
		t.Fatalf("events: %+v", got)
	}
	// Every instance EC2 described is listed, the ones without an active event with none
	// (positive knowledge that nothing is scheduled); the unknown and malformed IDs are absent.
	if len(got) != 250 {
		t.Errorf("%d instances listed, want the 250 EC2 knows", len(got))
	}
	if evs, ok := got[ids[150]]; !ok || len(evs) != 0 {
		t.Errorf("instance with only a completed event: %v (listed %v), want listed with no event", evs, ok)
	}
	if _, ok := got[idUnknown]; ok {
		t.Errorf("unknown instance listed")
	}
	if e := got[ids[0]][0]; e.Code != ec2emu.EventInstanceStop || !e.NotBefore.Equal(nb) || e.ID != "instance-event-00000000000000002" {
		t.Errorf("first event of %s: %+v", ids[0], e)
	}
	if e := got[ids[249]][0]; e.Code != ec2emu.EventSystemMaintenance {
		t.Errorf("active event of %s: %+v", ids[249], e)
	}
	// 251 valid IDs: 3 batches; the unknown ID fails its batch once, which is repeated without it.
	if n := f.emu.Calls(ec2emu.ActionDescribeInstanceStatus); n != 4 {
		t.Errorf("%d DescribeInstanceStatus calls, want 4", n)
	}
}

// TestScheduledEventsRateLimited: the limiter paces the calls.
func TestScheduledEventsRateLimited(t *testing.T) {
	f := newFixture(t, Config{})
	ids := f.addOwned(t, 300)
	lim := rate.NewLimiter(rate.Every(50*time.Millisecond), 1)
	start := time.Now()
	if _, err := f.client.ScheduledEvents(context.Background(), ids, lim); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 90*time.Millisecond {
		t.Errorf("3 calls at one per 50ms took %s", d)
	}
}
