package conditions

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nodevigil/nodevigil/collectors"
)

const nodeName = "node-a"

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// kubeletConditions are what the kubelet owns; the manager must never change them.
func kubeletConditions() []v1.NodeCondition {
	at := metav1.NewTime(t0.Add(-time.Hour))
	var out []v1.NodeCondition
	for _, c := range []struct {
		t v1.NodeConditionType
		s v1.ConditionStatus
	}{
		{v1.NodeReady, v1.ConditionTrue},
		{v1.NodeMemoryPressure, v1.ConditionFalse},
		{v1.NodeDiskPressure, v1.ConditionFalse},
		{v1.NodePIDPressure, v1.ConditionFalse},
		{v1.NodeNetworkUnavailable, v1.ConditionFalse},
	} {
		out = append(out, v1.NodeCondition{Type: c.t, Status: c.s, Reason: "KubeletSays", Message: "kubelet message",
			LastHeartbeatTime: at, LastTransitionTime: at})
	}
	return out
}

func newNode(extra ...v1.NodeCondition) *v1.Node {
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName},
		Status:     v1.NodeStatus{Conditions: append(kubeletConditions(), extra...)},
	}
}

type harness struct {
	client *fake.Clientset
	clock  *clocktesting.FakePassiveClock
	reg    *prometheus.Registry
	m      *Manager
}

func newHarness(t *testing.T, node *v1.Node) *harness {
	t.Helper()
	h := &harness{
		client: fake.NewClientset(node),
		clock:  clocktesting.NewFakePassiveClock(t0),
		reg:    prometheus.NewRegistry(),
	}
	h.m = h.newManager(t)
	return h
}

func (h *harness) newManager(t *testing.T) *Manager {
	t.Helper()
	m, err := New(Config{
		Client:     h.client.CoreV1().Nodes(),
		NodeName:   nodeName,
		Clock:      h.clock,
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return m
}

func (h *harness) patches() []k8stesting.PatchAction {
	var out []k8stesting.PatchAction
	for _, a := range h.client.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok {
			out = append(out, p)
		}
	}
	return out
}

func (h *harness) node(t *testing.T) *v1.Node {
	t.Helper()
	n, err := h.client.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get node: %v", err)
	}
	return n
}

func condition(t *testing.T, n *v1.Node, ct v1.NodeConditionType) v1.NodeCondition {
	t.Helper()
	for _, c := range n.Status.Conditions {
		if c.Type == ct {
			return c
		}
	}
	t.Fatalf("condition %s not on node; have %v", ct, n.Status.Conditions)
	return v1.NodeCondition{}
}

func result(check collectors.CheckName, s collectors.Status, reason, msg string) collectors.Result {
	return collectors.Result{Check: check, Status: s, Reason: reason, Message: msg}
}

func allHealthy() []collectors.Result {
	return []collectors.Result{
		result("memory", collectors.StatusHealthy, "MemoryOK", "psi some avg10=0.00"),
		result("kubelet", collectors.StatusHealthy, "KubeletActive", "unit active"),
		result("cni", collectors.StatusHealthy, "CNIReady", "10-aws.conflist valid"),
		result("kubelet-config", collectors.StatusHealthy, "StartupTaintsRegistered", "all expected taints registered"),
		result("spot-interruption", collectors.StatusHealthy, "NoEvent", "no spot interruption notice"),
		result("rebalance-recommendation", collectors.StatusHealthy, "NoEvent", "no rebalance recommendation"),
		result("scheduled-events", collectors.StatusHealthy, "NoEvent", "no active scheduled event"),
		result("asg-lifecycle", collectors.StatusHealthy, "NoEvent", "the instance is not in an Auto Scaling group"),
	}
}

func TestStatusFor(t *testing.T) {
	for _, tc := range []struct {
		in   collectors.Status
		want v1.ConditionStatus
	}{
		{collectors.StatusHealthy, v1.ConditionTrue},
		{collectors.StatusUnhealthy, v1.ConditionFalse},
		{collectors.StatusUnknown, v1.ConditionUnknown},
		{"", v1.ConditionUnknown},
	} {
		if got := StatusFor(tc.in); got != tc.want {
			t.Errorf("StatusFor(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestTypeForCheck(t *testing.T) {
	for check, want := range map[collectors.CheckName]v1.NodeConditionType{
		"memory": "MemoryHealthy", "kubelet": "KubeletHealthy", "cni": "NetworkingReady", "kubelet-config": "KubeletConfigValid",
	} {
		if got, ok := TypeForCheck(check); !ok || got != want {
			t.Errorf("TypeForCheck(%q) = %q, %v; want %q", check, got, ok, want)
		}
	}
	if _, ok := TypeForCheck("disk"); ok {
		t.Error("TypeForCheck(disk) is owned, want not")
	}
	for _, k := range []v1.NodeConditionType{v1.NodeReady, v1.NodeMemoryPressure, v1.NodeDiskPressure, v1.NodePIDPressure, v1.NodeNetworkUnavailable} {
		if IsOwned(k) {
			t.Errorf("IsOwned(%s) = true; kubelet-owned types must never be owned", k)
		}
	}
}

func TestBuildPatchOnlyOwnedTypes(t *testing.T) {
	c := v1.NodeCondition{Type: TypeKubeletHealthy, Status: v1.ConditionTrue, Reason: "KubeletActive"}
	b, err := BuildPatch([]v1.NodeCondition{c})
	if err != nil {
		t.Fatalf("BuildPatch: %v", err)
	}
	var got map[string]map[string][]map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("patch is not JSON: %v: %s", err, b)
	}
	if len(got) != 1 || len(got["status"]) != 1 || len(got["status"]["conditions"]) != 1 {
		t.Fatalf("patch = %s, want only status.conditions with one entry", b)
	}
	if got["status"]["conditions"][0]["type"] != "KubeletHealthy" {
		t.Errorf("patched type = %v", got["status"]["conditions"][0]["type"])
	}
	if _, err := BuildPatch([]v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionFalse}}); err == nil {
		t.Error("BuildPatch accepted the kubelet's Ready condition")
	}
}

func TestPatchesOnlyOnChangePlusHeartbeat(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, newNode())
	if h.m.Reported() {
		t.Fatal("Reported before any sync")
	}

	// First sync writes all four types.
	if err := h.m.Sync(ctx, allHealthy()); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if n := len(h.patches()); n != 1 {
		t.Fatalf("patches after first sync = %d, want 1", n)
	}
	if !h.m.Reported() {
		t.Error("not Reported after a successful patch")
	}
	n := h.node(t)
	for _, ct := range OwnedTypes() {
		c := condition(t, n, ct)
		if c.Status != v1.ConditionTrue || !c.LastTransitionTime.Time.Equal(t0) || !c.LastHeartbeatTime.Time.Equal(t0) {
			t.Errorf("%s = %+v, want True with transition and heartbeat at t0", ct, c)
		}
	}

	steps := []struct {
		name        string
		advance     time.Duration
		mutate      func([]collectors.Result)
		wantPatches int
		check       func(t *testing.T, n *v1.Node, now time.Time)
	}{
		{
			name:        "unchanged results do not patch",
			advance:     10 * time.Second,
			wantPatches: 1,
		},
		{
			name:        "message-only change waits for the heartbeat",
			advance:     10 * time.Second,
			mutate:      func(r []collectors.Result) { r[0].Message = "psi some avg10=1.50" },
			wantPatches: 1,
			check: func(t *testing.T, n *v1.Node, _ time.Time) {
				if c := condition(t, n, TypeMemoryHealthy); c.Message != "psi some avg10=0.00" {
					t.Errorf("message written early: %q", c.Message)
				}
			},
		},
		{
			name:        "heartbeat carries the new message and refreshes LastHeartbeatTime only",
			advance:     5 * time.Minute,
			mutate:      func(r []collectors.Result) { r[0].Message = "psi some avg10=1.50" },
			wantPatches: 2,
			check: func(t *testing.T, n *v1.Node, now time.Time) {
				c := condition(t, n, TypeMemoryHealthy)
				if c.Message != "psi some avg10=1.50" {
					t.Errorf("message = %q, want the new one", c.Message)
				}
				if !c.LastHeartbeatTime.Time.Equal(now) {
					t.Errorf("LastHeartbeatTime = %v, want %v", c.LastHeartbeatTime, now)
				}
				if !c.LastTransitionTime.Time.Equal(t0) {
					t.Errorf("LastTransitionTime = %v, want unchanged %v", c.LastTransitionTime, t0)
				}
			},
		},
		{
			name:    "reason change patches at once without a transition",
			advance: 10 * time.Second,
			mutate: func(r []collectors.Result) {
				r[0].Message = "psi some avg10=1.50"
				r[1].Reason = "KubeletHealthzOK"
			},
			wantPatches: 3,
			check: func(t *testing.T, n *v1.Node, _ time.Time) {
				c := condition(t, n, TypeKubeletHealthy)
				if c.Reason != "KubeletHealthzOK" || !c.LastTransitionTime.Time.Equal(t0) {
					t.Errorf("kubelet condition = %+v, want new reason and transition at t0", c)
				}
			},
		},
		{
			name:    "status change patches and moves LastTransitionTime",
			advance: 10 * time.Second,
			mutate: func(r []collectors.Result) {
				r[0].Message = "psi some avg10=1.50"
				r[1] = result("kubelet", collectors.StatusUnhealthy, "KubeletUnitFailed", "unit failed (oom-kill)")
			},
			wantPatches: 4,
			check: func(t *testing.T, n *v1.Node, now time.Time) {
				c := condition(t, n, TypeKubeletHealthy)
				if c.Status != v1.ConditionFalse || c.Reason != "KubeletUnitFailed" || !c.LastTransitionTime.Time.Equal(now) {
					t.Errorf("kubelet condition = %+v, want False/KubeletUnitFailed at %v", c, now)
				}
				if c := condition(t, n, TypeNetworkingReady); !c.LastTransitionTime.Time.Equal(t0) {
					t.Errorf("unrelated condition transition moved: %+v", c)
				}
			},
		},
		{
			name:    "unknown maps to Unknown",
			advance: 10 * time.Second,
			mutate: func(r []collectors.Result) {
				r[0].Message = "psi some avg10=1.50"
				r[1] = result("kubelet", collectors.StatusUnhealthy, "KubeletUnitFailed", "unit failed (oom-kill)")
				r[2] = result("cni", collectors.StatusUnknown, "CNIConfUnreadable", "permission denied")
			},
			wantPatches: 5,
			check: func(t *testing.T, n *v1.Node, _ time.Time) {
				if c := condition(t, n, TypeNetworkingReady); c.Status != v1.ConditionUnknown || c.Reason != "CNIConfUnreadable" {
					t.Errorf("NetworkingReady = %+v, want Unknown/CNIConfUnreadable", c)
				}
			},
		},
	}
	for _, st := range steps {
		h.clock.SetTime(h.clock.Now().Add(st.advance))
		res := allHealthy()
		if st.mutate != nil {
			st.mutate(res)
		}
		if err := h.m.Sync(ctx, res); err != nil {
			t.Fatalf("%s: Sync: %v", st.name, err)
		}
		if got := len(h.patches()); got != st.wantPatches {
			t.Fatalf("%s: patches = %d, want %d", st.name, got, st.wantPatches)
		}
		if st.check != nil {
			st.check(t, h.node(t), h.clock.Now())
		}
	}
}

func TestKubeletConditionsUntouched(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, newNode())
	res := allHealthy()
	res[1] = result("kubelet", collectors.StatusUnhealthy, "KubeletUnitFailed", "dead")
	if err := h.m.Sync(ctx, res); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	// Every patch body names only owned types, and goes to the status subresource.
	for _, p := range h.patches() {
		if p.GetSubresource() != "status" || p.GetPatchType() != PatchType {
			t.Errorf("patch to subresource %q type %q, want status / strategic merge", p.GetSubresource(), p.GetPatchType())
		}
		var body struct {
			Status struct {
				Conditions []v1.NodeCondition `json:"conditions"`
			} `json:"status"`
		}
		if err := json.Unmarshal(p.GetPatch(), &body); err != nil {
			t.Fatalf("patch body: %v", err)
		}
		for _, c := range body.Status.Conditions {
			if !IsOwned(c.Type) {
				t.Errorf("patch carries foreign condition %s", c.Type)
			}
		}
	}
	// The kubelet's conditions survive the merge byte for byte.
	n := h.node(t)
	for _, want := range kubeletConditions() {
		got := condition(t, n, want.Type)
		if got.Status != want.Status || got.Reason != want.Reason || got.Message != want.Message ||
			!got.LastHeartbeatTime.Equal(&want.LastHeartbeatTime) || !got.LastTransitionTime.Equal(&want.LastTransitionTime) {
			t.Errorf("%s changed: got %+v, want %+v", want.Type, got, want)
		}
	}
	if got, want := len(n.Status.Conditions), len(kubeletConditions())+len(OwnedTypes()); got != want {
		t.Errorf("node has %d conditions, want %d", got, want)
	}
}

func TestAdoptsConditionsAfterRestart(t *testing.T) {
	ctx := context.Background()
	transition := metav1.NewTime(t0.Add(-3 * time.Hour))
	heartbeat := metav1.NewTime(t0.Add(-time.Minute))
	var existing []v1.NodeCondition
	for _, r := range allHealthy() {
		ct, _ := TypeForCheck(r.Check)
		existing = append(existing, v1.NodeCondition{Type: ct, Status: v1.ConditionTrue, Reason: r.Reason, Message: r.Message,
			LastHeartbeatTime: heartbeat, LastTransitionTime: transition})
	}
	h := newHarness(t, newNode(existing...))

	// A fresh manager (the agent restarted) sees the same health: no write, but ready.
	if err := h.m.Sync(ctx, allHealthy()); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if n := len(h.patches()); n != 0 {
		t.Fatalf("patches after restart with unchanged health = %d, want 0", n)
	}
	if !h.m.Reported() {
		t.Error("not Reported although the Node already shows the current results")
	}

	// The heartbeat is due 5m after the adopted heartbeat, and keeps the old transition.
	h.clock.SetTime(heartbeat.Add(DefaultHeartbeatPeriod))
	if err := h.m.Sync(ctx, allHealthy()); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if n := len(h.patches()); n != 1 {
		t.Fatalf("patches at heartbeat = %d, want 1", n)
	}
	c := condition(t, h.node(t), TypeMemoryHealthy)
	if !c.LastTransitionTime.Equal(&transition) {
		t.Errorf("LastTransitionTime = %v, want adopted %v", c.LastTransitionTime, transition)
	}
	if !c.LastHeartbeatTime.Time.Equal(h.clock.Now()) {
		t.Errorf("LastHeartbeatTime = %v, want %v", c.LastHeartbeatTime, h.clock.Now())
	}
}

func TestAdoptedStatusChangeMovesTransition(t *testing.T) {
	ctx := context.Background()
	transition := metav1.NewTime(t0.Add(-3 * time.Hour))
	h := newHarness(t, newNode(v1.NodeCondition{Type: TypeKubeletHealthy, Status: v1.ConditionTrue, Reason: "KubeletActive",
		LastHeartbeatTime: transition, LastTransitionTime: transition}))
	res := []collectors.Result{result("kubelet", collectors.StatusUnhealthy, "KubeletUnitFailed", "dead")}
	if err := h.m.Sync(ctx, res); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	c := condition(t, h.node(t), TypeKubeletHealthy)
	if c.Status != v1.ConditionFalse || !c.LastTransitionTime.Time.Equal(t0) {
		t.Errorf("condition = %+v, want False with transition at %v", c, t0)
	}
}

func TestPatchFailureBacksOffAndCounts(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, newNode())
	reg := prometheus.NewRegistry()
	m, err := New(Config{Client: h.client.CoreV1().Nodes(), NodeName: nodeName, Clock: h.clock, Registerer: reg,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	fail := 2
	h.client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if fail > 0 {
			fail--
			return true, nil, errors.New("apiserver unavailable")
		}
		return false, nil, nil
	})

	if err := m.Sync(ctx, allHealthy()); err == nil {
		t.Fatal("Sync succeeded through a failing apiserver")
	}
	// Within the backoff nothing is attempted.
	h.clock.SetTime(t0.Add(5 * time.Second))
	if err := m.Sync(ctx, allHealthy()); err != nil {
		t.Fatalf("Sync during backoff: %v", err)
	}
	if n := len(h.patches()); n != 1 {
		t.Fatalf("patch attempts during backoff = %d, want 1", n)
	}
	// First retry after 10s fails again; the next waits 20s more.
	h.clock.SetTime(t0.Add(10 * time.Second))
	if err := m.Sync(ctx, allHealthy()); err == nil {
		t.Fatal("second attempt should fail")
	}
	h.clock.SetTime(t0.Add(25 * time.Second))
	_ = m.Sync(ctx, allHealthy())
	if n := len(h.patches()); n != 2 {
		t.Fatalf("patch attempts = %d, want 2 (still backing off)", n)
	}
	h.clock.SetTime(t0.Add(30 * time.Second))
	if err := m.Sync(ctx, allHealthy()); err != nil {
		t.Fatalf("retry after backoff: %v", err)
	}
	if m.Reported() != true {
		t.Error("not Reported after a successful retry")
	}
	if got := testutil.ToFloat64(m.patches.WithLabelValues("error")); got != 2 {
		t.Errorf("error patches = %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.patches.WithLabelValues("success")); got != 1 {
		t.Errorf("success patches = %v, want 1", got)
	}
	// The transition time is when the state was first observed, not when the patch landed.
	if c := condition(t, h.node(t), TypeKubeletHealthy); !c.LastTransitionTime.Time.Equal(t0) {
		t.Errorf("LastTransitionTime = %v, want %v", c.LastTransitionTime, t0)
	}
}

func TestTruncate(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"0123456789abc", 10, "0123456..."},
		{"ééééé", 8, "éé..."}, // never splits a rune
	} {
		if got := truncate(tc.in, tc.n); got != tc.want {
			t.Errorf("truncate(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}
