package remediation

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/decide"
)

// notRecordedReady removes the first-ready record newNode gives every node.
func notRecordedReady(n *corev1.Node) { delete(n.Annotations, decide.AnnotationFirstReady) }

// firstReadyPatches counts the first-ready annotation patches sent so far.
func (h *harness) firstReadyPatches() int {
	n := 0
	for _, s := range h.Steps() {
		if strings.HasSuffix(s, " first-ready") {
			n++
		}
	}
	return n
}

// waitFor polls cond with a deadline (the writer runs on its own goroutine).
func (h *harness) waitFor(what string, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out waiting for %s; steps %v", what, h.Steps())
		}
		time.Sleep(time.Millisecond)
	}
}

// startFirstReadyWriter runs the paced writer until the test ends, and waits for it to return
// before the test completes: a writer still logging its last record after the test ended
// panicked ("Write called after ... has completed"), one of the ways
// TestFirstReadyRecordsArePacedNotStormed failed under load.
func (h *harness) startFirstReadyWriter() {
	ctx, cancel := context.WithCancel(h.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.c.runFirstReadyWriter(ctx)
	}()
	h.t.Cleanup(func() {
		cancel()
		h.c.firstReadyQueue.ShutDown()
		<-done
	})
}

// A new leader of many ready nodes that carry no first-ready record (a first install) judges
// them as ready at once, from memory, and writes the records paced by their own token bucket:
// no PATCH storm competing with remediation. Before, every node was patched inside its first
// reconcile.
func TestFirstReadyRecordsArePacedNotStormed(t *testing.T) {
	h := newHarness(t, nil)
	const n = 30
	for i := range n {
		h.healthy(newNode(fmt.Sprintf("node-%02d", i), notRecordedReady))
	}
	for i := range n {
		name := fmt.Sprintf("node-%02d", i)
		if _, err := h.sync(name); err != nil {
			t.Fatal(err)
		}
		if at := h.c.readyMem.seen(name); !at.Equal(t0) {
			t.Fatalf("%s: seen ready at %s, want %s", name, at, t0)
		}
	}
	if got := h.firstReadyPatches(); got != 0 {
		t.Fatalf("%d first-ready patches sent inside the reconciles, want 0 (queued for the paced writer)", got)
	}
	if got := testutil.ToFloat64(h.c.metrics.firstReadyQueued); got != n {
		t.Fatalf("first_ready_queued = %v, want %d", got, n)
	}

	h.startFirstReadyWriter()
	h.waitFor("the burst", func() bool { return h.firstReadyPatches() == DefaultFirstReadyBurst && h.clock.HasWaiters() })
	// Out of tokens: the writer waits on the clock, sending nothing more.
	if got := h.firstReadyPatches(); got != DefaultFirstReadyBurst {
		t.Fatalf("%d first-ready patches before the clock moved, want the burst %d", got, DefaultFirstReadyBurst)
	}
	for want := DefaultFirstReadyBurst; want < n; {
		h.clock.Step(time.Second)
		want = min(n, want+int(DefaultFirstReadyRate))
		h.waitFor(fmt.Sprintf("%d records", want), func() bool { return h.firstReadyPatches() == want })
	}
	h.waitFor("first_ready_queued back to 0", func() bool { return testutil.ToFloat64(h.c.metrics.firstReadyQueued) == 0 })
	for i := range n {
		node := h.node(fmt.Sprintf("node-%02d", i))
		if got := node.Annotations[decide.AnnotationFirstReady]; got != t0.Format(time.RFC3339) {
			t.Errorf("%s: first-ready-at %q, want the time it was first seen ready %s", node.Name, got, t0.Format(time.RFC3339))
		}
	}
}

// stepWhileArming is the harness's fake clock, except that the first timer armed once armNext
// is set finds the clock already moved by step: a test's Step landing between the writer's
// reading of the clock and its arming of the timer, which is what made
// TestFirstReadyRecordsArePacedNotStormed fail under load.
type stepWhileArming struct {
	*testingclock.FakeClock
	step    time.Duration
	armNext atomic.Bool
}

func (s *stepWhileArming) before() {
	if s.armNext.CompareAndSwap(true, false) {
		s.FakeClock.Step(s.step)
	}
}

func (s *stepWhileArming) NewTimer(d time.Duration) clock.Timer {
	s.before()
	return s.FakeClock.NewTimer(d)
}

func (s *stepWhileArming) After(d time.Duration) <-chan time.Time {
	s.before()
	return s.FakeClock.After(d)
}

// The paced writer out of tokens reads the clock, the clock moves past the next token, then
// the writer arms its timer: the record is written without waiting for another step. Before,
// the timer was armed for the delay read before the step, from the time after it, and fired a
// whole step late.
func TestFirstReadyWriterWaitsFromTheClockItArmedOn(t *testing.T) {
	var clk *stepWhileArming
	h := newHarness(t, nil, func(h *harness, c *Config) {
		clk = &stepWhileArming{FakeClock: h.clock, step: time.Second}
		c.Clock = clk
		c.FirstReadyBurst = 1
	})
	for _, name := range []string{"a", "b"} {
		h.healthy(newNode(name, notRecordedReady))
		if _, err := h.sync(name); err != nil {
			t.Fatal(err)
		}
	}
	clk.armNext.Store(true)
	h.startFirstReadyWriter()
	// a takes the one token; b's is due 0.5 s later, and the clock moves 1 s while the writer
	// arms its timer: b is due, and no further step comes.
	h.waitFor("both records without another step", func() bool { return h.firstReadyPatches() == 2 })
	if clk.armNext.Load() {
		t.Fatal("the writer never armed a timer: the test proves nothing")
	}
}

// A node this leader saw ready, whose record is still queued, gets its startup taint
// back: the record is written at once (it now matters, and must outlive this leader) and the
// node is not treated as one that never became ready.
func TestFirstReadyPersistedWhenTheStartupTaintComesBack(t *testing.T) {
	h := newHarness(t, nil)
	// Created after this leader began observing (t0-1h), past its startup deadline (20m): its
	// memory is all that says the node was ready (without it the node would be "watched since
	// its creation and never seen ready", not presumed ready).
	n := h.healthy(newNode("back", notRecordedReady, func(n *corev1.Node) { n.CreationTimestamp = metav1.NewTime(t0.Add(-30 * time.Minute)) }))
	h.healthy(newNode("other"))
	if _, err := h.sync(n.Name); err != nil {
		t.Fatal(err)
	}
	if got := h.firstReadyPatches(); got != 0 {
		t.Fatalf("%d first-ready patches, want 0 while the node looks ready", got)
	}

	h.clock.Step(time.Minute)
	for _, name := range []string{n.Name, "other"} {
		for _, ns := range []string{DefaultKubeletLeaseNamespace, h.c.rc.AgentNamespace} {
			h.renew(ns, name, h.clock.Now())
		}
	}
	cur := h.node(n.Name)
	cur.Spec.Taints = append(cur.Spec.Taints, corev1.Taint{Key: config.DefaultStartupTaint, Effect: corev1.TaintEffectNoSchedule})
	if _, err := h.client.CoreV1().Nodes().Update(h.ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.sync(n.Name); err != nil {
		t.Fatal(err)
	}
	if got := h.node(n.Name).Annotations[decide.AnnotationFirstReady]; got != t0.Format(time.RFC3339) {
		t.Fatalf("first-ready-at %q after the taint came back, want %s (when first seen ready)", got, t0.Format(time.RFC3339))
	}
	h.drive(n.Name, 5)
	for _, s := range h.Steps() {
		if strings.HasPrefix(s, "patch back ") && !strings.HasSuffix(s, " first-ready") {
			t.Errorf("node judged as never ready: step %q", s)
		}
	}
	if len(h.cloud.Terminates()) != 0 {
		t.Errorf("terminated %v", h.cloud.Terminates())
	}
}

// A change of leader lost the record of a day-old node (it was still queued when the old
// leader died) and the node got its startup taint back before this leader saw it ready: no
// record, no memory. This leader has not watched it since its creation and its startup
// deadline is long past, so it is presumed ready, said once in a FirstReadyPresumed Event, and
// left to the normal tolerations. A node created after this leader began observing that never
// shed its taint is still replaced at its deadline. Before, the day-old node was terminated
// for StartupDeadlineExceeded.
func TestRecordLostOnLeaderChangeIsPresumedReady(t *testing.T) {
	h := newHarness(t, nil) // leading since t0-1h
	taint := func(n *corev1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: config.DefaultStartupTaint, Effect: corev1.TaintEffectNoSchedule})
	}
	lost := h.healthy(newNode("lost", notRecordedReady, taint))
	stuck := h.healthy(newNode("stuck", notRecordedReady, taint, func(n *corev1.Node) {
		n.CreationTimestamp = metav1.NewTime(t0.Add(-30 * time.Minute))
	}))
	h.healthy(newNode("other"))

	for range 3 {
		if _, err := h.sync(lost.Name); err != nil {
			t.Fatal(err)
		}
	}
	events := h.events()
	presumed := 0
	for _, e := range events {
		if strings.Contains(e, EventFirstReadyPresumed) {
			presumed++
			if !strings.Contains(e, "presumed ready: no first-ready record, not watched by this leader since its creation") {
				t.Errorf("event does not name the rule: %q", e)
			}
		}
	}
	if presumed != 1 {
		t.Errorf("%d FirstReadyPresumed events, want exactly 1: %v", presumed, events)
	}
	if st := h.node(lost.Name).Annotations[decide.AnnotationState]; st != "" || hasEvent(events, decide.ReasonStartupDeadlineExceeded) {
		t.Fatalf("node presumed ready was remediated: state %q, events %v", st, events)
	}

	// The positive control: watched since its creation, never ready, past its deadline.
	if _, err := h.sync(stuck.Name); err != nil {
		t.Fatal(err)
	}
	events = h.events()
	if got := h.cloud.Terminates(); len(got) != 1 || got[0] != instanceOf(stuck) || !hasEvent(events, decide.ReasonStartupDeadlineExceeded) {
		t.Fatalf("terminates %v, want only the never-ready node %s; events %v", got, instanceOf(stuck), events)
	}
	if !strings.Contains(strings.Join(events, "\n"), "never ready: watched by this leader since its creation") {
		t.Errorf("StartupDeadlineExceeded does not name the rule: %v", events)
	}
}

// countingClock is the real clock, counting the timers armed.
type countingClock struct {
	clock.RealClock
	timers atomic.Int64
}

func (c *countingClock) NewTimer(d time.Duration) clock.Timer {
	c.timers.Add(1)
	return c.RealClock.NewTimer(d)
}

// TestWaitForSleepsOnARealClock: on a real clock, which always moves a little between two
// readings, waiting for a token arms a timer and sleeps. Re-arming on any move spun the loop
// until the token was due (session 6): hundreds of thousands of timers for a 2/s bucket, and
// three quarters of the remediator's CPU while 50 nodes were being terminated.
func TestWaitForSleepsOnARealClock(t *testing.T) {
	clk := &countingClock{}
	c := &Controller{clock: clk}
	lim := rate.NewLimiter(rate.Every(300*time.Millisecond), 1)
	lim.ReserveN(time.Now(), 1) // the burst is spent: the next token is 300 ms away
	r := lim.ReserveN(time.Now(), 1)
	start := time.Now()
	if !c.waitFor(context.Background(), r) {
		t.Fatal("waitFor gave up")
	}
	if waited := time.Since(start); waited < 200*time.Millisecond {
		t.Errorf("waited %s for a token 300 ms away", waited)
	}
	// One timer, and a few more if the machine is so loaded that the clock moves more than
	// armSlack between two readings.
	if n := clk.timers.Load(); n > 5 {
		t.Errorf("armed %d timers to wait for one token, want about 1 (a busy loop)", n)
	}
}
