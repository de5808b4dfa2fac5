package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	goruntime "runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nodevigil/nodevigil/agent/conditions"
	"github.com/nodevigil/nodevigil/agent/taints"
	"github.com/nodevigil/nodevigil/collectors"
	"github.com/nodevigil/nodevigil/collectors/wakeup"
)

const nodeName = "node-a"

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// fakeCheck returns a settable result; when block is set, Check waits on it and ignores ctx,
// like a misbehaving collector would.
type fakeCheck struct {
	name  collectors.CheckName
	mu    sync.Mutex
	res   collectors.Result
	block chan struct{}
	panic bool
}

func (f *fakeCheck) Name() collectors.CheckName { return f.name }

func (f *fakeCheck) Check(context.Context) collectors.Result {
	f.mu.Lock()
	block, res, p := f.block, f.res, f.panic
	f.mu.Unlock()
	if p {
		panic("boom")
	}
	if block != nil {
		<-block
	}
	return res
}

func (f *fakeCheck) set(s collectors.Status, reason string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.res = collectors.Result{Check: f.name, Status: s, Reason: reason, Message: reason + " message", Err: err}
}

type fakeRepairer struct {
	out   RepairOutcome
	err   error
	calls int
}

func (f *fakeRepairer) Repair(context.Context, collectors.Result) (RepairOutcome, error) {
	f.calls++
	return f.out, f.err
}

// setClients points cfg's API clients at a fake clientset, through client-go's typed clients
// (which satisfy the agent's interfaces as the binary's kubeclient does).
func setClients(cfg *Config, client *fake.Clientset) {
	cfg.Nodes = client.CoreV1().Nodes()
	cfg.Leases = client.CoordinationV1().Leases(cfg.Namespace)
	cfg.Events = client.CoreV1().Events(metav1.NamespaceDefault)
}

type harness struct {
	client   *fake.Clientset
	clock    *clocktesting.FakeClock
	recorder *record.FakeRecorder
	reg      *prometheus.Registry
	checks   map[collectors.CheckName]*fakeCheck
	agent    *Agent
}

func newHarness(t *testing.T, mut func(*Config)) *harness {
	t.Helper()
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: "uid-1", CreationTimestamp: metav1.NewTime(t0.Add(-time.Minute))},
		Spec: v1.NodeSpec{Taints: []v1.Taint{
			{Key: taints.DefaultOwnedKey, Effect: v1.TaintEffectNoSchedule},
			{Key: "dedicated", Value: "db", Effect: v1.TaintEffectNoSchedule},
		}},
		Status: v1.NodeStatus{Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady"}}},
	}
	h := &harness{
		client:   fake.NewClientset(node),
		clock:    clocktesting.NewFakeClock(t0),
		recorder: record.NewFakeRecorder(20),
		reg:      prometheus.NewRegistry(),
		checks:   map[collectors.CheckName]*fakeCheck{},
	}
	var checks []Checker
	for _, n := range append([]collectors.CheckName{"memory", "kubelet", "cni", "kubelet-config"}, collectors.AWSEventChecks()...) {
		c := &fakeCheck{name: n}
		c.set(collectors.StatusHealthy, "OK", nil)
		h.checks[n] = c
		checks = append(checks, c)
	}
	cfg := Config{
		NodeName: nodeName, Namespace: "nodevigil-system", PodName: "agent-pod", Version: "v0.1.0-test",
		Checks: checks, CheckTimeout: 100 * time.Millisecond,
		Registry: h.reg, Recorder: h.recorder, Clock: h.clock,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	setClients(&cfg, h.client)
	if mut != nil {
		mut(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.agent = a
	return h
}

func (h *harness) node(t *testing.T) *v1.Node {
	t.Helper()
	n, err := h.client.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (h *harness) get(t *testing.T, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.agent.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

func hasTaint(n *v1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

func TestCycleReportsConditionsThenReleasesTaints(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, nil)
	if code, _ := h.get(t, "/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz before reporting = %d, want 503", code)
	}

	h.agent.cycle(ctx)
	n := h.node(t)
	for _, ct := range conditions.OwnedTypes() {
		found := false
		for _, c := range n.Status.Conditions {
			if c.Type == ct && c.Status == v1.ConditionTrue {
				found = true
			}
		}
		if !found {
			t.Errorf("condition %s not True on node: %+v", ct, n.Status.Conditions)
		}
	}
	if !hasTaint(n, taints.DefaultOwnedKey) {
		t.Fatal("startup taint removed before the stability window")
	}
	if code, _ := h.get(t, "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after reporting = %d, want 200", code)
	}

	h.clock.Step(10 * time.Second)
	h.agent.cycle(ctx)
	n = h.node(t)
	if hasTaint(n, taints.DefaultOwnedKey) || !hasTaint(n, "dedicated") {
		t.Fatalf("taints after window = %+v, want only the foreign one", n.Spec.Taints)
	}
	select {
	case ev := <-h.recorder.Events:
		if !strings.Contains(ev, taints.ReasonTaintsRemoved) {
			t.Errorf("event = %q, want %s", ev, taints.ReasonTaintsRemoved)
		}
	default:
		t.Error("no event for the taint removal")
	}
}

func TestGatingFailureKeepsTaints(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, nil)
	h.agent.cycle(ctx)
	h.checks["cni"].set(collectors.StatusUnhealthy, "NoCNIConfig", nil)
	h.clock.Step(5 * time.Second)
	h.agent.cycle(ctx)
	h.checks["cni"].set(collectors.StatusHealthy, "OK", nil)
	h.clock.Step(5 * time.Second)
	h.agent.cycle(ctx)
	if !hasTaint(h.node(t), taints.DefaultOwnedKey) {
		t.Fatal("taint removed although cni failed inside the window")
	}
}

func TestRunChecksTimeoutStillRunningAndPanic(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, nil)
	release := make(chan struct{})
	h.checks["kubelet"].mu.Lock()
	h.checks["kubelet"].block = release
	h.checks["kubelet"].mu.Unlock()
	h.checks["memory"].mu.Lock()
	h.checks["memory"].panic = true
	h.checks["memory"].mu.Unlock()

	byName := func(rs []collectors.Result) map[collectors.CheckName]collectors.Result {
		m := map[collectors.CheckName]collectors.Result{}
		for _, r := range rs {
			m[r.Check] = r
		}
		return m
	}
	first := byName(h.agent.RunChecks(ctx))
	if r := first["kubelet"]; r.Status != collectors.StatusUnknown || r.Reason != "CheckTimeout" || r.Err == nil {
		t.Errorf("stuck check = %+v, want Unknown/CheckTimeout with Err", r)
	}
	if r := first["memory"]; r.Status != collectors.StatusUnknown || r.Reason != "CheckPanicked" {
		t.Errorf("panicking check = %+v, want Unknown/CheckPanicked", r)
	}
	if r := first["cni"]; r.Status != collectors.StatusHealthy {
		t.Errorf("healthy check = %+v, want Healthy despite its neighbours", r)
	}
	second := byName(h.agent.RunChecks(ctx))
	if r := second["kubelet"]; r.Reason != "CheckStillRunning" {
		t.Errorf("second run of stuck check = %+v, want CheckStillRunning", r)
	}
	close(release)
	deadline := time.Now().Add(5 * time.Second)
	for h.agent.running["kubelet"].Load() {
		if time.Now().After(deadline) {
			t.Fatal("stuck check never finished")
		}
		time.Sleep(time.Millisecond)
	}
	h.checks["kubelet"].mu.Lock()
	h.checks["kubelet"].block = nil
	h.checks["kubelet"].mu.Unlock()
	if r := byName(h.agent.RunChecks(ctx))["kubelet"]; r.Status != collectors.StatusHealthy {
		t.Errorf("recovered check = %+v, want Healthy", r)
	}
}

func TestCheckMetrics(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, nil)
	h.checks["memory"].set(collectors.StatusUnknown, "PSIUnsupported", fmt.Errorf("read psi: %w", collectors.ErrNotSupported))
	h.checks["cni"].set(collectors.StatusUnknown, "CNIConfUnreadable", errors.New("permission denied"))
	h.checks["kubelet"].set(collectors.StatusUnhealthy, "KubeletUnitFailed", nil)
	h.agent.cycle(ctx)
	h.agent.cycle(ctx)

	for _, tc := range []struct {
		check, status string
		want          float64
	}{
		{"kubelet", "Unhealthy", 1}, {"kubelet", "Healthy", 0}, {"kubelet", "Unknown", 0},
		{"cni", "Unknown", 1}, {"kubelet-config", "Healthy", 1},
	} {
		if got := testutil.ToFloat64(h.agent.checkStatus.WithLabelValues(tc.check, tc.status)); got != tc.want {
			t.Errorf("check_status{check=%s,status=%s} = %v, want %v", tc.check, tc.status, got, tc.want)
		}
	}
	if got := testutil.ToFloat64(h.agent.checkErrors.WithLabelValues("cni")); got != 2 {
		t.Errorf("cni errors = %v, want 2", got)
	}
	if got := testutil.ToFloat64(h.agent.checkErrors.WithLabelValues("memory")); got != 0 {
		t.Errorf("memory errors = %v, want 0 (not supported is not an error)", got)
	}

	code, body := h.get(t, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics = %d", code)
	}
	for _, want := range []string{
		`nodevigil_build_info{goversion="go`,
		`version="v0.1.0-test"} 1`,
		`nodevigil_agent_check_duration_seconds_bucket{check="memory"`,
		`nodevigil_agent_condition_patches_total{result="success"} 1`,
		`nodevigil_agent_taint_removals_total{result="success"} 0`,
		`nodevigil_agent_lease_renewals_total{result="success"} 0`,
		`go_goroutines`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestHealthzDoesNotDependOnAPIServer(t *testing.T) {
	h := newHarness(t, nil)
	h.client.PrependReactor("*", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	h.agent.cycle(context.Background())
	if code, _ := h.get(t, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz with API down = %d, want 200", code)
	}
	if code, _ := h.get(t, "/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz with API down = %d, want 503", code)
	}
}

func TestRepairRecordsEventsAndMetrics(t *testing.T) {
	ctx := context.Background()
	rep := &fakeRepairer{}
	h := newHarness(t, func(c *Config) { c.Repairer = rep })
	h.checks["kubelet"].set(collectors.StatusUnhealthy, "KubeletUnitFailed", nil)
	drain := func() []string {
		var out []string
		for {
			select {
			case ev := <-h.recorder.Events:
				out = append(out, ev)
			default:
				return out
			}
		}
	}

	steps := []struct {
		out        RepairOutcome
		err        error
		wantEvents []string
	}{
		{RepairOutcome{Attempted: true, Reason: RepairRestarted, Attempt: 1}, nil, []string{"Normal " + ReasonKubeletRestarted}},
		{RepairOutcome{Reason: RepairBackoffActive, Attempt: 1}, nil, nil},
		{RepairOutcome{Attempted: true, Reason: RepairRestartFailed, Attempt: 2}, nil, []string{"Warning " + ReasonKubeletRestartFailed}},
		{RepairOutcome{Reason: RepairHourlyCapReached, Attempt: 3}, nil, []string{"Warning " + ReasonKubeletRepairCapReached}},
		{RepairOutcome{Reason: RepairHourlyCapReached, Attempt: 3}, nil, nil}, // once per episode
		{RepairOutcome{}, errors.New("dbus: connection refused"), []string{"Warning " + ReasonKubeletRestartFailed}},
		{RepairOutcome{Reason: RepairNotNeeded}, nil, nil},
		{RepairOutcome{Reason: RepairOperatorStopped}, nil, []string{"Warning " + ReasonKubeletStoppedByOperator}},
		{RepairOutcome{Reason: RepairOperatorStopped}, nil, nil}, // once per episode
	}
	for i, st := range steps {
		rep.out, rep.err = st.out, st.err
		h.agent.cycle(ctx)
		select {
		case r := <-h.agent.repairCh: // what the repair worker would take
			h.agent.repair(ctx, r)
		default:
			t.Fatalf("step %d: the cycle queued no kubelet result for repair", i)
		}
		got := drain()
		if len(got) != len(st.wantEvents) {
			t.Fatalf("step %d: events %q, want %q", i, got, st.wantEvents)
		}
		for j, w := range st.wantEvents {
			if !strings.HasPrefix(got[j], w) {
				t.Errorf("step %d: event %q, want prefix %q", i, got[j], w)
			}
		}
	}
	if rep.calls != len(steps) {
		t.Errorf("repairer called %d times, want %d", rep.calls, len(steps))
	}
	for res, want := range map[string]float64{RepairRestarted: 1, RepairBackoffActive: 1, RepairRestartFailed: 1, RepairHourlyCapReached: 2, RepairOperatorStopped: 2, "error": 1} {
		if got := testutil.ToFloat64(h.agent.repairs.WithLabelValues(res)); got != want {
			t.Errorf("repair_attempts{result=%s} = %v, want %v", res, got, want)
		}
	}
}

// blockingRepairer blocks in Repair until release is closed, like a restart job waiting out
// systemd's start timeout.
type blockingRepairer struct {
	started chan struct{}
	release chan struct{}
	calls   atomic.Int32
}

func (b *blockingRepairer) Repair(ctx context.Context, _ collectors.Result) (RepairOutcome, error) {
	if b.calls.Add(1) == 1 {
		close(b.started)
	}
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return RepairOutcome{Attempted: true, Reason: RepairRestarted, Attempt: 1}, nil
}

// TestRepairDoesNotStallTheLoop: a restart that takes minutes runs beside the check loop; the
// cycles (conditions, taints) go on, and the worker then repairs from the latest result.
func TestRepairDoesNotStallTheLoop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rep := &blockingRepairer{started: make(chan struct{}), release: make(chan struct{})}
	h := newHarness(t, func(c *Config) { c.Repairer = rep })
	h.checks["kubelet"].set(collectors.StatusUnhealthy, "KubeletUnitFailed", nil)
	done := make(chan struct{})
	go func() { defer close(done); h.agent.repairLoop(ctx) }()

	h.agent.cycle(ctx)
	select {
	case <-rep.started:
	case <-time.After(10 * time.Second):
		t.Fatal("repair worker never called the repairer")
	}
	finished := make(chan struct{})
	go func() {
		for range 3 {
			h.agent.cycle(ctx)
		}
		close(finished)
	}()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		t.Fatal("check cycles stalled behind a running kubelet restart")
	}
	close(rep.release)
	deadline := time.Now().Add(10 * time.Second)
	for rep.calls.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := rep.calls.Load(); got != 2 {
		t.Errorf("repairer called %d times, want 2 (the running one, then the latest queued result once)", got)
	}
	cancel()
	<-done
}

func TestNewRejectsGatingCheckWithoutChecker(t *testing.T) {
	cfg := Config{NodeName: nodeName, Namespace: "ns", PodName: "p",
		Checks: []Checker{&fakeCheck{name: "kubelet"}}, GatingChecks: []collectors.CheckName{"kubelet", "cni"}}
	setClients(&cfg, fake.NewClientset())
	_, err := New(cfg)
	if err == nil || !strings.Contains(err.Error(), `"cni"`) {
		t.Fatalf("New = %v, want an error naming cni", err)
	}
	cfg = Config{Namespace: "ns", PodName: "p"}
	setClients(&cfg, fake.NewClientset())
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "--node-name") {
		t.Fatalf("New without node = %v, want a hint to --node-name", err)
	}
}

func TestRunServesAndStopsPromptly(t *testing.T) {
	// Real clock and the real event recorder; release taints on the first healthy cycle so
	// an Event goes through the recorder to the API.
	h := newHarness(t, func(c *Config) {
		c.Clock = nil
		c.Recorder = nil
		c.TaintStabilityWindow = -1
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.agent.serve(ctx, ln) }()

	url := "http://" + ln.Addr().String()
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get(url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent never became ready (last err %v)", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The heartbeat runs beside the check loop on purpose (a slow API server must not delay
	// it, nor it the conditions), so readiness says nothing about the Lease: wait for it.
	for {
		_, err := h.client.CoordinationV1().Leases("nodevigil-system").Get(context.Background(), nodeName, metav1.GetOptions{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("heartbeat lease never created: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}

	for {
		evs, err := h.client.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
		if err == nil && len(evs.Items) > 0 {
			ev := evs.Items[0]
			if ev.Reason != taints.ReasonTaintsRemoved || ev.Source.Component != Component || ev.InvolvedObject.Kind != "Node" || ev.InvolvedObject.Name != nodeName {
				t.Errorf("event = reason %s source %s object %+v", ev.Reason, ev.Source.Component, ev.InvolvedObject)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no Event written through the recorder")
		}
		time.Sleep(10 * time.Millisecond)
	}

	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("agent did not stop within 5s of cancel")
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("shutdown took %s", d)
	}
	if _, err := http.Get(url + "/healthz"); err == nil {
		t.Error("server still answering after shutdown")
	}
}

func TestRunFailsOnTakenAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	h := newHarness(t, func(c *Config) { c.ListenAddress = ln.Addr().String() })
	if err := h.agent.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "listen") {
		t.Fatalf("Run = %v, want a listen error", err)
	}
}

func TestMetricsRegistered(t *testing.T) {
	h := newHarness(t, nil)
	h.agent.repairs.WithLabelValues(RepairRestarted)
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, want := range []string{
		"nodevigil_build_info", "nodevigil_agent_kubelet_repair_attempts_total", "nodevigil_agent_condition_patches_total",
		"nodevigil_agent_taint_removals_total", "nodevigil_agent_lease_renewals_total", "go_goroutines",
	} {
		if !names[want] {
			t.Errorf("metric %s not registered", want)
		}
	}
}

func TestNewRequiresClients(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(*Config)
		want string
	}{
		{"no node client", func(c *Config) { c.Nodes = nil }, "Nodes"},
		{"no lease client", func(c *Config) { c.Leases = nil }, "Leases"},
		{"no event sink nor recorder", func(c *Config) { c.Events, c.Recorder = nil, nil }, "Events"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{NodeName: nodeName, Namespace: "ns", PodName: "p"}
			setClients(&cfg, fake.NewClientset())
			tc.mut(&cfg)
			if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New = %v, want an error naming %s", err, tc.want)
			}
		})
	}
	// A Recorder stands in for the event sink.
	cfg := Config{NodeName: nodeName, Namespace: "ns", PodName: "p", Recorder: record.NewFakeRecorder(1),
		Checks: []Checker{&fakeCheck{name: "kubelet"}, &fakeCheck{name: "cni"}}}
	setClients(&cfg, fake.NewClientset())
	cfg.Events = nil
	if _, err := New(cfg); err != nil {
		t.Errorf("New with Recorder and no Events: %v", err)
	}
}

// seedingCheck is a fakeCheck that records what it was seeded with.
type seedingCheck struct {
	*fakeCheck
	priors []collectors.Prior
}

func (s *seedingCheck) Seed(p collectors.Prior) { s.priors = append(s.priors, p) }

// TestSeedsChecksFromNodeConditions: before the first check runs, a restarted agent hands each
// stateful check the condition a previous agent left on the Node, once.
func TestSeedsChecksFromNodeConditions(t *testing.T) {
	ctx := context.Background()
	since := metav1.NewTime(t0.Add(-17 * time.Minute))
	mem := &seedingCheck{fakeCheck: &fakeCheck{name: "memory"}}
	mem.set(collectors.StatusUnhealthy, "MemoryPressure", nil)
	h := newHarness(t, func(c *Config) { c.Checks[0] = mem })
	n := h.node(t)
	n.Status.Conditions = append(n.Status.Conditions, v1.NodeCondition{
		Type: conditions.TypeMemoryHealthy, Status: v1.ConditionFalse, Reason: "MemoryPressure", LastTransitionTime: since,
	})
	if _, err := h.client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.agent.cycle(ctx)
	h.agent.cycle(ctx)
	want := collectors.Prior{Status: collectors.StatusUnhealthy, Reason: "MemoryPressure", Since: since.Time}
	if len(mem.priors) != 1 || mem.priors[0].Status != want.Status || mem.priors[0].Reason != want.Reason || !mem.priors[0].Since.Equal(want.Since) {
		t.Fatalf("seeded with %+v, want once with %+v", mem.priors, want)
	}
	c := conditionOf(h.node(t), conditions.TypeMemoryHealthy)
	if c == nil || c.Status != v1.ConditionFalse || !c.LastTransitionTime.Equal(&since) {
		t.Errorf("MemoryHealthy after restart = %+v, want False since %v", c, since)
	}
}

func conditionOf(n *v1.Node, t v1.NodeConditionType) *v1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == t {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// TestStartedOnceConditionsReported: Config.Started (where the command releases its start-up
// memory) is called once, after the first cycle whose conditions reached the Node, and not
// before: while the API refuses the patch, start-up is not over.
func TestStartedOnceConditionsReported(t *testing.T) {
	tests := []struct {
		name          string
		failedPatches int // node patches refused before the API accepts them
	}{
		{"first cycle reports", 0},
		{"API refuses the first patches", 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int32
			h := newHarness(t, func(c *Config) { c.Started = func() { calls.Add(1) } })
			refused := 0
			h.client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
				if refused < tc.failedPatches {
					refused++
					return true, nil, errors.New("apiserver unavailable")
				}
				return false, nil, nil
			})
			ctx := context.Background()
			for i := 0; !h.agent.conditions.Reported(); i++ {
				if calls.Load() != 0 {
					t.Fatalf("Started called before the conditions were reported (cycle %d)", i)
				}
				if i > 20 {
					t.Fatal("conditions never reported")
				}
				h.agent.cycle(ctx)
				h.clock.Step(time.Minute) // past the condition manager's backoff
			}
			for range 5 {
				h.agent.cycle(ctx)
				h.clock.Step(10 * time.Second)
			}
			if got := calls.Load(); got != 1 {
				t.Errorf("Started called %d times, want once", got)
			}
		})
	}
}

// countingCheck counts its runs.
type countingCheck struct {
	fakeCheck
	runs atomic.Int32
}

func (c *countingCheck) Check(ctx context.Context) collectors.Result {
	c.runs.Add(1)
	return c.fakeCheck.Check(ctx)
}

// TestLoopFollowsTheGrid: with a Grid, check cycles fall on its points (shared with the Lease
// renewal and the AWS event watcher) rather than CheckInterval after the loop started, and a
// cycle woken early (Wake) leaves the next scheduled one where it was.
func TestLoopFollowsTheGrid(t *testing.T) {
	counter := &countingCheck{fakeCheck: fakeCheck{name: "memory"}}
	counter.set(collectors.StatusHealthy, "OK", nil)
	wake := make(chan struct{}, 1)
	h := newHarness(t, func(c *Config) {
		c.Checks = []Checker{counter}
		c.GatingChecks = []collectors.CheckName{"memory"}
		c.Grid = wakeup.Grid{Origin: t0.Add(-3 * time.Second)}
		c.Wake = wake
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.agent.loop(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s (%d cycles)", what, counter.runs.Load())
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitFor("the first cycle", func() bool { return counter.runs.Load() == 1 && h.clock.HasWaiters() })
	for _, st := range []struct {
		at     time.Duration // after t0
		wake   bool
		cycles int32
	}{
		{7*time.Second - time.Millisecond, false, 1}, // the Grid's point is origin+10s = t0+7s
		{7 * time.Second, false, 2},
		{8 * time.Second, true, 3}, // woken early
		{17*time.Second - time.Millisecond, false, 3},
		{17 * time.Second, false, 4}, // the scheduled cycle stayed on the Grid
	} {
		h.clock.SetTime(t0.Add(st.at))
		if st.wake {
			wake <- struct{}{}
		}
		if st.cycles > counter.runs.Load() {
			waitFor(fmt.Sprintf("cycle %d", st.cycles), func() bool { return counter.runs.Load() >= st.cycles })
		}
		waitFor("the loop to wait", h.clock.HasWaiters)
		if got := counter.runs.Load(); got != st.cycles {
			t.Fatalf("at t0+%v: %d cycles, want %d", st.at, got, st.cycles)
		}
	}
}

// goroutineCheck records the ID of the goroutine each Check call runs on.
type goroutineCheck struct {
	fakeCheck
	mu  sync.Mutex
	ids []string
}

func (c *goroutineCheck) Check(ctx context.Context) collectors.Result {
	buf := make([]byte, 64)
	buf = buf[:goruntime.Stack(buf, false)]
	id, _, _ := strings.Cut(strings.TrimPrefix(string(buf), "goroutine "), " ")
	c.mu.Lock()
	c.ids = append(c.ids, id)
	c.mu.Unlock()
	return c.fakeCheck.Check(ctx)
}

// TestChecksRunOnLongLivedWorkers: every cycle runs a check on the same goroutine, also after
// the check panicked, so its grown stack is reused instead of grown again every cycle.
func TestChecksRunOnLongLivedWorkers(t *testing.T) {
	ctx := context.Background()
	gc := &goroutineCheck{fakeCheck: fakeCheck{name: "memory"}}
	gc.set(collectors.StatusHealthy, "OK", nil)
	h := newHarness(t, func(cfg *Config) {
		for i, c := range cfg.Checks {
			if c.Name() == "memory" {
				cfg.Checks[i] = gc
			}
		}
	})
	for range 3 {
		if r := h.agent.RunChecks(ctx)[0]; r.Check != "memory" || r.Status != collectors.StatusHealthy {
			t.Fatalf("memory result = %+v, want Healthy", r)
		}
	}
	gc.fakeCheck.mu.Lock()
	gc.panic = true
	gc.fakeCheck.mu.Unlock()
	if r := h.agent.RunChecks(ctx)[0]; r.Reason != "CheckPanicked" {
		t.Fatalf("panicking memory check = %+v, want CheckPanicked", r)
	}
	gc.fakeCheck.mu.Lock()
	gc.panic = false
	gc.fakeCheck.mu.Unlock()
	if r := h.agent.RunChecks(ctx)[0]; r.Status != collectors.StatusHealthy {
		t.Fatalf("memory after its panic = %+v, want Healthy", r)
	}
	gc.mu.Lock()
	defer gc.mu.Unlock()
	if len(gc.ids) != 5 {
		t.Fatalf("memory check ran %d times, want 5", len(gc.ids))
	}
	for i, id := range gc.ids {
		if id != gc.ids[0] {
			t.Fatalf("cycle %d ran the check on goroutine %s, cycle 0 on %s (all goroutines: %v); want one long-lived worker", i, id, gc.ids[0], gc.ids)
		}
	}
}
