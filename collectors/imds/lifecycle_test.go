package imds

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nodevigil/nodevigil/collectors"
	"github.com/nodevigil/nodevigil/collectors/wakeup"
	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

// runWatcher runs w until the test ends.
func runWatcher(t *testing.T, w *Watcher) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { w.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// stepper advances clk by d once the Watcher waits on it, n times.
func stepper(t *testing.T, clk *clocktesting.FakeClock) func(d time.Duration, n int) {
	return func(d time.Duration, n int) {
		t.Helper()
		for range n {
			deadline := time.Now().Add(10 * time.Second)
			for !clk.HasWaiters() {
				if time.Now().After(deadline) {
					t.Fatal("watcher never waits on the clock")
				}
				time.Sleep(time.Millisecond)
			}
			clk.Step(d)
		}
	}
}

// waitLatest polls the Watcher's latest result of kind until ok holds.
func waitLatest(t *testing.T, w *Watcher, kind collectors.CheckName, ok func(collectors.Result) bool) collectors.Result {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.mu.Lock()
		r, seen := w.latest[kind]
		w.mu.Unlock()
		if seen && ok(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: last %s/%s (%s)", kind, r.Status, r.Reason, r.Message)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func reason(want string) func(collectors.Result) bool {
	return func(r collectors.Result) bool { return r.Reason == want }
}

// TestSpotPathsPolledOnlyOnSpotInstances: the life cycle is read once; a spot instance has its
// spot path read every SpotInterval (default 2 s) and its rebalance path every
// RebalanceInterval (default 10 s, on the same wake-ups), any other instance neither, its spot
// kinds Healthy "not a spot instance", while scheduled events keep their one-minute interval.
func TestSpotPathsPolledOnlyOnSpotInstances(t *testing.T) {
	tests := []struct {
		name      string
		lifecycle string
		spotReads int // reads of the spot path over one minute of 2 s steps (plus the first)
		// rebalanceReads: of the rebalance path, every 10 s (plus the first)
		rebalanceReads int
		reason         string
	}{
		{"spot", ec2emu.LifecycleSpot, 31, 7, ReasonNoEvent},
		{"on-demand", "", 0, 0, ReasonNotSpot},
		{"scheduled", "scheduled", 0, 0, ReasonNotSpot},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, url, clk := emulated(t, tc.lifecycle)
			w := newWatcher(t, Config{Endpoint: url, Clock: clk}) // default intervals
			runWatcher(t, w)
			step := stepper(t, clk)
			for _, k := range []collectors.CheckName{collectors.CheckSpotInterruption, collectors.CheckRebalanceRecommendation} {
				r := waitLatest(t, w, k, reason(tc.reason))
				if r.Status != collectors.StatusHealthy {
					t.Errorf("%s: %s/%s, want Healthy", k, r.Status, r.Reason)
				}
			}
			waitLatest(t, w, collectors.CheckScheduledEvents, reason(ReasonNoEvent))
			step(2*time.Second, 30) // one minute
			waitLatest(t, w, collectors.CheckASGLifecycle, func(collectors.Result) bool {
				return s.IMDSPathReads(instanceID, PathLifecycle) == 2
			})
			if tc.spotReads > 0 {
				waitLatest(t, w, collectors.CheckSpotInterruption, func(collectors.Result) bool {
					return s.IMDSPathReads(instanceID, PathSpot) >= tc.spotReads
				})
			}
			for p, want := range map[string]int{PathSpot: tc.spotReads, PathRebalance: tc.rebalanceReads} {
				if got := s.IMDSPathReads(instanceID, p); got != want {
					t.Errorf("%s read %d times in a minute, want %d", p, got, want)
				}
			}
			if got := s.IMDSPathReads(instanceID, PathInstanceLifeCycle); got != 1 {
				t.Errorf("instance-life-cycle read %d times, want once", got)
			}
			if got := s.IMDSPathReads(instanceID, PathScheduled); got != 2 {
				t.Errorf("scheduled events read %d times in a minute, want 2 (at start and after 1m)", got)
			}
		})
	}
}

// TestLifeCycleReadAgainAfterFailure: after the service failed, the life cycle is read again
// once it answers, and the spot kinds follow what it says then.
func TestLifeCycleReadAgainAfterFailure(t *testing.T) {
	s, url, clk := emulated(t, "")
	w := newWatcher(t, Config{Endpoint: url, Clock: clk, EventInterval: 10 * time.Second, MaxBackoff: 10 * time.Second})
	runWatcher(t, w)
	step := stepper(t, clk)
	waitLatest(t, w, collectors.CheckSpotInterruption, reason(ReasonNotSpot))
	s.SetIMDSMode(instanceID, ec2emu.IMDSDisabled)
	step(10*time.Second, 1)
	waitLatest(t, w, collectors.CheckScheduledEvents, reason(ReasonIMDSDisabled))
	// The spot kinds learn the failure with the life cycle's own read, when the group retries.
	step(10*time.Second, 1)
	waitLatest(t, w, collectors.CheckSpotInterruption, reason(ReasonIMDSDisabled))
	s.SetIMDSMode(instanceID, ec2emu.IMDSv2Required)
	step(10*time.Second, 3)
	waitLatest(t, w, collectors.CheckSpotInterruption, reason(ReasonNotSpot))
	if got := s.IMDSPathReads(instanceID, PathInstanceLifeCycle); got < 2 {
		t.Errorf("instance-life-cycle read %d times, want again after the failure", got)
	}
	if got := s.IMDSPathReads(instanceID, PathSpot); got != 0 {
		t.Errorf("spot path read %d times on an on-demand instance", got)
	}
}

// TestOneShotNotSpot: `check` on an on-demand instance says so for the spot kinds, and still
// shows a posted notice.
func TestOneShotNotSpot(t *testing.T) {
	s, url, clk := emulated(t, "")
	w := newWatcher(t, Config{Endpoint: url, OneShot: true, Clock: clk})
	r := check(t, w, collectors.CheckRebalanceRecommendation)
	if r.Status != collectors.StatusHealthy || r.Reason != ReasonNotSpot {
		t.Fatalf("rebalance: %s/%s (%s)", r.Status, r.Reason, r.Message)
	}
	s.SetSpotInstanceAction(instanceID, "terminate", epoch.Add(2*time.Minute))
	if r := check(t, w, collectors.CheckSpotInterruption); r.Reason != "SpotTerminate" {
		t.Fatalf("posted notice: %s/%s (%s)", r.Status, r.Reason, r.Message)
	}
}

// TestRebalanceReadOnItsOwnInterval: a rebalance recommendation is seen at the first spot poll
// due RebalanceInterval after the last read, and a spot notice posted at the same time at the
// next spot poll; after a failed read both paths are read as soon as the service answers.
func TestRebalanceReadOnItsOwnInterval(t *testing.T) {
	s, url, clk := emulated(t, ec2emu.LifecycleSpot)
	w := newWatcher(t, Config{Endpoint: url, Clock: clk, MaxBackoff: 2 * time.Second}) // default intervals
	runWatcher(t, w)
	step := stepper(t, clk)
	waitLatest(t, w, collectors.CheckRebalanceRecommendation, reason(ReasonNoEvent))
	step(2*time.Second, 1) // t=2s
	waitLatest(t, w, collectors.CheckSpotInterruption, func(collectors.Result) bool {
		return s.IMDSPathReads(instanceID, PathSpot) == 2
	})
	s.SetRebalanceRecommendation(instanceID, epoch)
	s.SetSpotInstanceAction(instanceID, "terminate", epoch.Add(2*time.Minute))
	step(2*time.Second, 1) // t=4s: the spot path sees its notice, the rebalance path is not read
	waitLatest(t, w, collectors.CheckSpotInterruption, reason("SpotTerminate"))
	if got := s.IMDSPathReads(instanceID, PathRebalance); got != 1 {
		t.Fatalf("rebalance path read %d times in 4s, want once (at start)", got)
	}
	step(2*time.Second, 3) // t=10s
	waitLatest(t, w, collectors.CheckRebalanceRecommendation, reason(ReasonRebalanceRecommendation))

	// A failure, then recovery: both paths at once.
	s.SetIMDSMode(instanceID, ec2emu.IMDSDisabled)
	step(2*time.Second, 1) // t=12s
	waitLatest(t, w, collectors.CheckSpotInterruption, reason(ReasonIMDSDisabled))
	s.SetIMDSMode(instanceID, ec2emu.IMDSv2Required)
	before := s.IMDSPathReads(instanceID, PathRebalance)
	step(2*time.Second, 1) // t=14s, 4s before the rebalance path would be due
	waitLatest(t, w, collectors.CheckRebalanceRecommendation, func(collectors.Result) bool {
		return s.IMDSPathReads(instanceID, PathRebalance) > before
	})
	waitLatest(t, w, collectors.CheckRebalanceRecommendation, reason(ReasonRebalanceRecommendation))
}

// TestPollsFollowTheGrid: with a Grid the spot group's next poll after a success is the
// Grid's next point, not an interval after the last poll, so it shares its wake-up with the
// agent's other periodic jobs on the same Grid.
func TestPollsFollowTheGrid(t *testing.T) {
	s, url, clk := emulated(t, ec2emu.LifecycleSpot)
	w := newWatcher(t, Config{Endpoint: url, Clock: clk, Timeout: 5 * time.Second,
		Grid: wakeup.Grid{Origin: epoch.Add(-500 * time.Millisecond)}})
	runWatcher(t, w)
	reads := func() int { return s.IMDSPathReads(instanceID, PathSpot) }
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s (%d spot reads)", what, reads())
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitFor("the first poll", func() bool { return reads() == 1 && clk.HasWaiters() })
	for _, st := range []struct {
		at    time.Duration // after epoch
		reads int
	}{
		{1500*time.Millisecond - time.Millisecond, 1}, // the Grid's point is origin+2s = epoch+1.5s
		{1500 * time.Millisecond, 2},
		{3500*time.Millisecond - time.Millisecond, 2},
		{3500 * time.Millisecond, 3},
	} {
		clk.SetTime(epoch.Add(st.at))
		if st.reads > reads() {
			waitFor(fmt.Sprintf("read %d", st.reads), func() bool { return reads() >= st.reads })
		}
		waitFor("the watcher to wait", clk.HasWaiters)
		if got := reads(); got != st.reads {
			t.Fatalf("at epoch+%v: %d spot reads, want %d", st.at, got, st.reads)
		}
	}
}
