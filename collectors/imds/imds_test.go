package imds

import (
	"context"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nodevigil/nodevigil/collectors"
	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

const instanceID = "i-0123456789abcdef0"

var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// emulated starts the EC2 emulator's metadata service for one instance over real HTTP;
// lifecycle is its purchasing option ("" on-demand, ec2emu.LifecycleSpot).
func emulated(t testing.TB, lifecycle string) (*ec2emu.Server, string, *clocktesting.FakeClock) {
	t.Helper()
	clk := clocktesting.NewFakeClock(epoch)
	s := ec2emu.New(ec2emu.Config{Clock: clk})
	if err := s.AddInstance(ec2emu.Instance{ID: instanceID, Zone: "us-east-1a", Lifecycle: lifecycle}); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.IMDSHandler(instanceID))
	t.Cleanup(hs.Close)
	return s, hs.URL, clk
}

func newWatcher(t *testing.T, cfg Config) *Watcher {
	t.Helper()
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func check(t *testing.T, w *Watcher, kind collectors.CheckName) collectors.Result {
	t.Helper()
	for _, c := range w.Checks() {
		if c.Name() == kind {
			return c.Check(t.Context())
		}
	}
	t.Fatalf("no check %s", kind)
	return collectors.Result{}
}

// TestOneShotVerdicts reads each kind once per scripted state of the instance.
func TestOneShotVerdicts(t *testing.T) {
	nb := time.Date(2026, 1, 9, 9, 0, 0, 0, time.UTC)
	reboot := ec2emu.ScheduledEvent{ID: "instance-event-0d59937288b749b32", Code: ec2emu.EventSystemReboot,
		Description: "scheduled reboot", NotBefore: nb, NotAfter: nb.Add(2 * time.Hour)}
	tests := []struct {
		name    string
		script  func(*ec2emu.Server)
		kind    collectors.CheckName
		status  collectors.Status
		reason  string
		message []string
	}{
		{"no spot notice", nil, collectors.CheckSpotInterruption, collectors.StatusHealthy, ReasonNoEvent, []string{"no spot interruption notice"}},
		{"spot notice", func(s *ec2emu.Server) { s.SetSpotInstanceAction(instanceID, "terminate", epoch.Add(2*time.Minute)) },
			collectors.CheckSpotInterruption, collectors.StatusWarning, "SpotTerminate", []string{"terminate", "2026-01-02T03:06:05Z", "deadline"}},
		{"rebalance", func(s *ec2emu.Server) { s.SetRebalanceRecommendation(instanceID, epoch) },
			collectors.CheckRebalanceRecommendation, collectors.StatusWarning, ReasonRebalanceRecommendation, []string{"2026-01-02T03:04:05Z"}},
		{"no scheduled event", nil, collectors.CheckScheduledEvents, collectors.StatusHealthy, ReasonNoEvent, nil},
		{"scheduled reboot", func(s *ec2emu.Server) { _ = s.AddScheduledEvent(instanceID, reboot) },
			collectors.CheckScheduledEvents, collectors.StatusWarning, "SystemReboot",
			[]string{"system-reboot", reboot.ID, "not before 2026-01-09T09:00:00Z", "not after 2026-01-09T11:00:00Z"}},
		{"canceled reboot clears", func(s *ec2emu.Server) {
			_ = s.AddScheduledEvent(instanceID, reboot)
			_ = s.SetScheduledEventState(instanceID, reboot.ID, ec2emu.EventStateCanceled)
		}, collectors.CheckScheduledEvents, collectors.StatusHealthy, ReasonNoEvent, nil},
		{"completed reboot clears", func(s *ec2emu.Server) {
			_ = s.AddScheduledEvent(instanceID, reboot)
			_ = s.SetScheduledEventState(instanceID, reboot.ID, ec2emu.EventStateCompleted)
		}, collectors.CheckScheduledEvents, collectors.StatusHealthy, ReasonNoEvent, nil},
		{"not in an ASG", nil, collectors.CheckASGLifecycle, collectors.StatusHealthy, ReasonNoEvent, nil},
		{"in service", func(s *ec2emu.Server) { s.SetTargetLifecycleState(instanceID, "InService") },
			collectors.CheckASGLifecycle, collectors.StatusHealthy, "InService", nil},
		{"asg terminating", func(s *ec2emu.Server) { s.SetTargetLifecycleState(instanceID, "Terminated") },
			collectors.CheckASGLifecycle, collectors.StatusWarning, "Terminated", []string{"terminating"}},
		{"v1 only", func(s *ec2emu.Server) { s.SetIMDSMode(instanceID, ec2emu.IMDSv1Only) },
			collectors.CheckSpotInterruption, collectors.StatusUnknown, ReasonIMDSv1Only, []string{"IMDSv2", "hostNetwork"}},
		{"disabled", func(s *ec2emu.Server) { s.SetIMDSMode(instanceID, ec2emu.IMDSDisabled) },
			collectors.CheckScheduledEvents, collectors.StatusUnknown, ReasonIMDSDisabled, []string{"--http-endpoint enabled"}},
		{"hop limit", func(s *ec2emu.Server) { s.SetIMDSMode(instanceID, ec2emu.IMDSHopLimitExceeded) },
			collectors.CheckSpotInterruption, collectors.StatusUnknown, ReasonIMDSHopLimit, []string{"hop limit", "hostNetwork: true", "--http-put-response-hop-limit 2"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, url, clk := emulated(t, ec2emu.LifecycleSpot)
			if tc.script != nil {
				tc.script(s)
			}
			w := newWatcher(t, Config{Endpoint: url, OneShot: true, Clock: clk, Timeout: 2 * time.Second})
			r := check(t, w, tc.kind)
			if r.Status != tc.status || r.Reason != tc.reason {
				t.Fatalf("got %s/%s (%s), want %s/%s", r.Status, r.Reason, r.Message, tc.status, tc.reason)
			}
			for _, m := range tc.message {
				if !strings.Contains(r.Message, m) {
					t.Errorf("message %q lacks %q", r.Message, m)
				}
			}
		})
	}
}

func TestUnreachable(t *testing.T) {
	hs := httptest.NewServer(nil)
	url := hs.URL
	hs.Close() // nothing listens there any more
	w := newWatcher(t, Config{Endpoint: url, OneShot: true})
	r := check(t, w, collectors.CheckSpotInterruption)
	if r.Status != collectors.StatusUnknown || r.Reason != ReasonIMDSUnreachable || !strings.Contains(r.Message, "could not be reached") ||
		!strings.Contains(r.Message, "hostNetwork") {
		t.Fatalf("got %s/%s: %s", r.Status, r.Reason, r.Message)
	}
}

// TestWatcherScript runs the Watcher on a fake clock against a scripted instance: no event →
// spot notice → withdrawn, and a scheduled event that is later canceled, checking the spot
// group is read on its own short interval and the scheduled group only about once a minute.
func TestWatcherScript(t *testing.T) {
	s, url, clk := emulated(t, ec2emu.LifecycleSpot)
	w := newWatcher(t, Config{Endpoint: url, Clock: clk, SpotInterval: 2 * time.Second, EventInterval: time.Minute})
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { w.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })

	waitFor := func(kind collectors.CheckName, status collectors.Status, reason string) collectors.Result {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			w.mu.Lock()
			r, ok := w.latest[kind]
			w.mu.Unlock()
			if ok && r.Status == status && r.Reason == reason {
				return r
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: got %s/%s (%s), want %s/%s", kind, r.Status, r.Reason, r.Message, status, reason)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// step advances the fake clock once the Watcher waits on it.
	step := func(d time.Duration) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !clk.HasWaiters() {
			if time.Now().After(deadline) {
				t.Fatal("watcher never waits on the clock")
			}
			time.Sleep(time.Millisecond)
		}
		clk.Step(d)
	}
	drain := func() {
		select {
		case <-w.Changed():
		default:
		}
	}
	waitFor(collectors.CheckSpotInterruption, collectors.StatusHealthy, ReasonNoEvent)
	waitFor(collectors.CheckScheduledEvents, collectors.StatusHealthy, ReasonNoEvent)
	drain()

	s.SetSpotInstanceAction(instanceID, "stop", epoch.Add(2*time.Minute))
	step(2 * time.Second)
	r := waitFor(collectors.CheckSpotInterruption, collectors.StatusUnhealthy, "SpotStop")
	if !strings.Contains(r.Message, "stop") {
		t.Errorf("spot message %q", r.Message)
	}
	select {
	case <-w.Changed():
	case <-time.After(5 * time.Second):
		t.Fatal("no change signalled for the spot notice")
	}

	ev := ec2emu.ScheduledEvent{ID: "instance-event-0123456789abcdef0", Code: ec2emu.EventInstanceRetirement,
		Description: "retirement", NotBefore: epoch.Add(72 * time.Hour)}
	if err := s.AddScheduledEvent(instanceID, ev); err != nil {
		t.Fatal(err)
	}
	_, readsBefore := s.IMDSCalls(instanceID)
	step(2 * time.Second) // a spot poll only: the scheduled group is not due for a minute
	waitFor(collectors.CheckSpotInterruption, collectors.StatusUnhealthy, "SpotStop")
	// The spot path's read (the rebalance path is not due either: every 10 s).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, reads := s.IMDSCalls(instanceID); reads >= readsBefore+1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the spot poll made no read")
		}
	}
	w.mu.Lock()
	sched := w.latest[collectors.CheckScheduledEvents]
	w.mu.Unlock()
	if sched.Status != collectors.StatusHealthy {
		t.Fatalf("scheduled group read before its interval: %s/%s", sched.Status, sched.Reason)
	}
	for i := 0; i < 30; i++ {
		step(2 * time.Second)
	}
	waitFor(collectors.CheckScheduledEvents, collectors.StatusUnhealthy, "InstanceRetirement")

	s.SetSpotInstanceAction(instanceID, "", time.Time{})
	if err := s.SetScheduledEventState(instanceID, ev.ID, ec2emu.EventStateCanceled); err != nil {
		t.Fatal(err)
	}
	step(2 * time.Second)
	waitFor(collectors.CheckSpotInterruption, collectors.StatusHealthy, ReasonNoEvent)
	for i := 0; i < 30; i++ {
		step(2 * time.Second)
	}
	waitFor(collectors.CheckScheduledEvents, collectors.StatusHealthy, ReasonNoEvent)
	if tokens, _ := s.IMDSCalls(instanceID); tokens != 1 {
		t.Errorf("%d token requests; one session token should serve every read within its TTL", tokens)
	}
}

// TestWatcherBackoffAndRecovery: a disabled endpoint makes the kinds Unknown, the spot group
// backs off (fewer reads than intervals) and recovers on its own once the endpoint is enabled;
// an expired token (service clock past its TTL) is replaced.
func TestWatcherBackoffAndRecovery(t *testing.T) {
	s, url, clk := emulated(t, ec2emu.LifecycleSpot)
	s.SetIMDSMode(instanceID, ec2emu.IMDSDisabled)
	w := newWatcher(t, Config{Endpoint: url, Clock: clk, SpotInterval: time.Second, EventInterval: time.Hour, MaxBackoff: 16 * time.Second})
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { w.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })

	steps := 0
	stepUntil := func(cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatal("condition not reached")
			}
			if clk.HasWaiters() {
				clk.Step(time.Second)
				steps++
			}
			time.Sleep(time.Millisecond)
		}
	}
	latest := func(k collectors.CheckName) collectors.Result {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.latest[k]
	}
	stepUntil(func() bool { return latest(collectors.CheckSpotInterruption).Reason == ReasonIMDSDisabled })
	tokens0, _ := s.IMDSCalls(instanceID)
	steps = 0
	stepUntil(func() bool { return steps >= 60 })
	tokens1, _ := s.IMDSCalls(instanceID)
	// Without backoff: 2 token attempts per 1 s poll = 120. With backoff capped at 16 s: few.
	if got := tokens1 - tokens0; got > 20 {
		t.Errorf("%d token requests in 60 s of a disabled endpoint; want backoff", got)
	}
	s.SetIMDSMode(instanceID, ec2emu.IMDSv2Required)
	stepUntil(func() bool { return latest(collectors.CheckSpotInterruption).Reason == ReasonNoEvent })

	// The service forgets the token (its clock passes the TTL): one 401, then a new token.
	clk.Step(7 * time.Hour)
	s.SetSpotInstanceAction(instanceID, "terminate", clk.Now().Add(2*time.Minute))
	stepUntil(func() bool { return latest(collectors.CheckSpotInterruption).Reason == "SpotTerminate" })
}

func TestValidate(t *testing.T) {
	tests := []struct {
		cfg  Config
		want string
	}{
		{Config{SpotInterval: -time.Second}, "imds.spotInterval"},
		{Config{SpotInterval: 100 * time.Millisecond}, "imds.spotInterval (100ms) is below 500ms"},
		{Config{SpotInterval: time.Minute}, "a spot notice gives two minutes"},
		{Config{EventInterval: 2 * time.Hour}, "imds.eventInterval"},
		{Config{Endpoint: "169.254.169.254"}, "imds.endpoint"},
		{Config{Timeout: -1}, "imds.timeout"},
	}
	for _, tc := range tests {
		err := tc.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want %q", tc.cfg, err, tc.want)
		}
	}
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

func TestReasonForCode(t *testing.T) {
	for in, want := range map[string]string{"instance-reboot": "InstanceReboot", "system-maintenance": "SystemMaintenance",
		"Warmed:Terminated": "WarmedTerminated", "terminate": "Terminate"} {
		if got := ReasonForCode(in); got != want {
			t.Errorf("%s: got %s, want %s", in, got, want)
		}
	}
}
