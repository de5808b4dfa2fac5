package taints

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nodevigil/nodevigil/collectors"
)

const (
	nodeName  = "node-a"
	ciliumKey = "node.cilium.io/agent-not-ready"
)

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

var (
	ownTaint    = v1.Taint{Key: DefaultOwnedKey, Effect: v1.TaintEffectNoSchedule}
	ciliumTaint = v1.Taint{Key: ciliumKey, Value: "true", Effect: v1.TaintEffectNoExecute}
	// foreign taints the agent must never touch.
	foreign = []v1.Taint{
		{Key: "dedicated", Value: "kafka", Effect: v1.TaintEffectNoSchedule},
		{Key: "node.kubernetes.io/not-ready", Effect: v1.TaintEffectNoSchedule},
		{Key: "readiness.k8s.io/other-agent-not-ready", Effect: v1.TaintEffectNoSchedule},
	}
)

type harness struct {
	client   *fake.Clientset
	clock    *clocktesting.FakePassiveClock
	recorder *record.FakeRecorder
	m        *Manager
}

func newHarness(t *testing.T, cfg Config, taints ...v1.Taint) *harness {
	t.Helper()
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName, ResourceVersion: "7", CreationTimestamp: metav1.NewTime(t0.Add(-2 * time.Minute))},
		Spec:       v1.NodeSpec{Taints: taints},
	}
	h := &harness{
		client:   fake.NewClientset(node),
		clock:    clocktesting.NewFakePassiveClock(t0),
		recorder: record.NewFakeRecorder(10),
	}
	cfg.Client = h.client.CoreV1().Nodes()
	cfg.NodeName = nodeName
	cfg.Clock = h.clock
	cfg.Recorder = h.recorder
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.m = m
	return h
}

func (h *harness) taints(t *testing.T) []v1.Taint {
	t.Helper()
	n, err := h.client.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get node: %v", err)
	}
	return n.Spec.Taints
}

func (h *harness) step(t *testing.T, d time.Duration, results []collectors.Result) {
	t.Helper()
	h.clock.SetTime(h.clock.Now().Add(d))
	if err := h.m.Reconcile(context.Background(), results); err != nil {
		t.Fatalf("Reconcile at %s: %v", h.clock.Now().Sub(t0), err)
	}
}

func gating(kubelet, cni collectors.Status) []collectors.Result {
	return []collectors.Result{
		{Check: "kubelet", Status: kubelet, Reason: "K"},
		{Check: "cni", Status: cni, Reason: "C"},
		{Check: "memory", Status: collectors.StatusUnhealthy, Reason: "MemoryPressure"}, // not gating
	}
}

func keys(ts []v1.Taint) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Key)
	}
	return out
}

func hasKey(ts []v1.Taint, key string) bool {
	for _, t := range ts {
		if t.Key == key {
			return true
		}
	}
	return false
}

// tstep advances the clock by d and reports kubelet status k (cni healthy).
type tstep struct {
	d time.Duration
	k collectors.Status
}

func TestRemovedOnlyAfterStabilityWindow(t *testing.T) {
	tests := []struct {
		name string
		// steps are (advance, kubelet status); cni is healthy throughout.
		steps       []tstep
		wantRemoved bool
	}{
		{
			name: "healthy for the full window releases",
			steps: []tstep{
				{0, collectors.StatusHealthy}, {5 * time.Second, collectors.StatusHealthy}, {5 * time.Second, collectors.StatusHealthy},
			},
			wantRemoved: true,
		},
		{
			name: "healthy for less than the window keeps the taints",
			steps: []tstep{
				{0, collectors.StatusHealthy}, {5 * time.Second, collectors.StatusHealthy}, {4 * time.Second, collectors.StatusHealthy},
			},
		},
		{
			name: "a kubelet restart in the middle resets the window",
			steps: []tstep{
				{0, collectors.StatusHealthy}, {8 * time.Second, collectors.StatusUnhealthy},
				{1 * time.Second, collectors.StatusHealthy}, {9 * time.Second, collectors.StatusHealthy},
			},
		},
		{
			name: "Unknown also resets the window",
			steps: []tstep{
				{0, collectors.StatusHealthy}, {8 * time.Second, collectors.StatusUnknown},
				{1 * time.Second, collectors.StatusHealthy}, {9 * time.Second, collectors.StatusHealthy},
			},
		},
		{
			name: "after a reset a full window releases",
			steps: []tstep{
				{0, collectors.StatusHealthy}, {8 * time.Second, collectors.StatusUnhealthy},
				{1 * time.Second, collectors.StatusHealthy}, {10 * time.Second, collectors.StatusHealthy},
			},
			wantRemoved: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{}, append([]v1.Taint{ownTaint}, foreign...)...)
			for _, s := range tc.steps {
				h.step(t, s.d, gating(s.k, collectors.StatusHealthy))
			}
			if got := !hasKey(h.taints(t), DefaultOwnedKey); got != tc.wantRemoved {
				t.Fatalf("removed = %v, want %v (taints %v)", got, tc.wantRemoved, keys(h.taints(t)))
			}
			if h.m.Released() != tc.wantRemoved {
				t.Errorf("Released() = %v, want %v", h.m.Released(), tc.wantRemoved)
			}
		})
	}
}

func TestMissingGatingResultBlocks(t *testing.T) {
	h := newHarness(t, Config{}, ownTaint)
	only := []collectors.Result{{Check: "kubelet", Status: collectors.StatusHealthy}}
	h.step(t, 0, only)
	h.step(t, time.Minute, only)
	if !hasKey(h.taints(t), DefaultOwnedKey) {
		t.Fatal("released without a cni result")
	}
}

func TestForeignTaintsUntouchedAndEventRecorded(t *testing.T) {
	reg := prometheus.NewRegistry()
	start := t0.Add(-30 * time.Second)
	h := newHarness(t, Config{OwnedKeys: []string{DefaultOwnedKey, ciliumKey}, StartTime: start, Registerer: reg},
		append([]v1.Taint{foreign[0], ownTaint, foreign[1], ciliumTaint}, foreign[2])...)
	healthy := gating(collectors.StatusHealthy, collectors.StatusHealthy)
	h.step(t, 0, healthy)
	h.step(t, 10*time.Second, healthy)

	got := h.taints(t)
	if strings.Join(keys(got), ",") != strings.Join(keys(foreign), ",") {
		t.Fatalf("taints after removal = %v, want exactly the foreign ones in order %v", keys(got), keys(foreign))
	}
	for i := range foreign {
		if got[i] != foreign[i] {
			t.Errorf("foreign taint %d changed: %+v, want %+v", i, got[i], foreign[i])
		}
	}
	select {
	case ev := <-h.recorder.Events:
		for _, want := range []string{"Normal", ReasonTaintsRemoved, DefaultOwnedKey, ciliumKey, "40s since agent start", "2m10s since node creation"} {
			if !strings.Contains(ev, want) {
				t.Errorf("event %q lacks %q", ev, want)
			}
		}
	default:
		t.Fatal("no event recorded")
	}
	if v := testutil.ToFloat64(h.m.removals.WithLabelValues("success")); v != 1 {
		t.Errorf("success removals = %v, want 1", v)
	}
}

func TestRemovalIsIdempotent(t *testing.T) {
	h := newHarness(t, Config{}, foreign[0])
	healthy := gating(collectors.StatusHealthy, collectors.StatusHealthy)
	h.step(t, 0, healthy)
	h.step(t, 10*time.Second, healthy)
	h.step(t, 10*time.Second, healthy) // within the recheck interval: no API call
	if !h.m.Released() {
		t.Fatal("not released although no owned taint was present")
	}
	patches := 0
	for _, a := range h.client.Actions() {
		if a.GetVerb() == "patch" {
			patches++
		}
	}
	if patches != 0 {
		t.Errorf("patches = %d, want 0 when nothing is owned", patches)
	}
	if got := keys(h.taints(t)); len(got) != 1 || got[0] != foreign[0].Key {
		t.Errorf("taints = %v", got)
	}
	select {
	case ev := <-h.recorder.Events:
		t.Errorf("unexpected event %q", ev)
	default:
	}
}

func TestRecheckRemovesTaintThatCameBack(t *testing.T) {
	h := newHarness(t, Config{}, ownTaint)
	healthy := gating(collectors.StatusHealthy, collectors.StatusHealthy)
	h.step(t, 0, healthy)
	h.step(t, 10*time.Second, healthy)
	if hasKey(h.taints(t), DefaultOwnedKey) {
		t.Fatal("not removed")
	}
	// Someone (a re-registering kubelet) puts it back.
	n, _ := h.client.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
	n.Spec.Taints = []v1.Taint{ownTaint}
	if _, err := h.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.step(t, time.Minute, healthy)
	if !hasKey(h.taints(t), DefaultOwnedKey) {
		t.Fatal("re-checked before the recheck interval")
	}
	h.step(t, DefaultRecheckInterval, healthy)
	if hasKey(h.taints(t), DefaultOwnedKey) {
		t.Fatal("taint that came back not removed at the recheck")
	}
}

func TestConflictIsRetried(t *testing.T) {
	h := newHarness(t, Config{}, ownTaint, foreign[0])
	conflicts := 2
	var bodies []string
	h.client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		bodies = append(bodies, string(a.(k8stesting.PatchAction).GetPatch()))
		if conflicts > 0 {
			conflicts--
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, nodeName, nil)
		}
		return false, nil, nil
	})
	healthy := gating(collectors.StatusHealthy, collectors.StatusHealthy)
	h.step(t, 0, healthy)
	h.step(t, 10*time.Second, healthy)
	if len(bodies) != 3 {
		t.Fatalf("patch attempts = %d, want 3 (two conflicts then success)", len(bodies))
	}
	var body struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Spec struct {
			Taints []v1.Taint `json:"taints"`
		} `json:"spec"`
	}
	if err := json.Unmarshal([]byte(bodies[2]), &body); err != nil {
		t.Fatal(err)
	}
	if body.Metadata.ResourceVersion != "7" {
		t.Errorf("patch not guarded by resourceVersion: %s", bodies[2])
	}
	if len(body.Spec.Taints) != 1 || body.Spec.Taints[0] != foreign[0] {
		t.Errorf("patch taints = %+v, want only the foreign one", body.Spec.Taints)
	}
	if hasKey(h.taints(t), DefaultOwnedKey) {
		t.Error("owned taint still present after retried removal")
	}
}

func TestReaddOnFailure(t *testing.T) {
	healthy := gating(collectors.StatusHealthy, collectors.StatusHealthy)
	for _, tc := range []struct {
		name      string
		enabled   bool
		failure   collectors.Status
		wantTaint bool
	}{
		{"disabled by default", false, collectors.StatusUnhealthy, false},
		{"unhealthy re-adds when enabled", true, collectors.StatusUnhealthy, true},
		{"unknown does not re-add", true, collectors.StatusUnknown, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{ReaddOnFailure: tc.enabled}, ownTaint, foreign[0])
			h.step(t, 0, healthy)
			h.step(t, 10*time.Second, healthy)
			if hasKey(h.taints(t), DefaultOwnedKey) {
				t.Fatal("not removed")
			}
			<-h.recorder.Events
			h.step(t, 10*time.Second, gating(tc.failure, collectors.StatusHealthy))
			h.step(t, 10*time.Second, gating(tc.failure, collectors.StatusHealthy)) // no duplicate
			got := h.taints(t)
			if hasKey(got, DefaultOwnedKey) != tc.wantTaint {
				t.Fatalf("owned taint present = %v, want %v (%v)", hasKey(got, DefaultOwnedKey), tc.wantTaint, keys(got))
			}
			if !tc.wantTaint {
				return
			}
			if len(got) != 2 || got[0] != foreign[0] || got[1].Effect != v1.TaintEffectNoSchedule {
				t.Errorf("taints = %+v, want the foreign one kept and one NoSchedule owned taint", got)
			}
			if ev := <-h.recorder.Events; !strings.Contains(ev, ReasonTaintReadded) {
				t.Errorf("event = %q, want %s", ev, ReasonTaintReadded)
			}
			// Recovery releases again after a new window.
			h.step(t, 10*time.Second, healthy)
			h.step(t, 10*time.Second, healthy)
			if hasKey(h.taints(t), DefaultOwnedKey) {
				t.Error("re-added taint not removed after recovery")
			}
		})
	}
}

func TestSplit(t *testing.T) {
	owned := func(k string) bool { return k == "a" || k == "c" }
	keep, removed := Split([]v1.Taint{{Key: "a"}, {Key: "b"}, {Key: "c"}, {Key: "d"}}, owned)
	if strings.Join(keys(keep), ",") != "b,d" || strings.Join(removed, ",") != "a,c" {
		t.Errorf("Split = %v, %v", keys(keep), removed)
	}
	if keep, removed := Split(nil, owned); len(keep) != 0 || len(removed) != 0 {
		t.Errorf("Split(nil) = %v, %v", keep, removed)
	}
}

func TestTaintsPatchEmptyListClears(t *testing.T) {
	b, err := TaintsPatch("42", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), `{"metadata":{"resourceVersion":"42"},"spec":{"taints":[]}}`; got != want {
		t.Errorf("patch = %s, want %s", got, want)
	}
}

// Without a Recorder the Manager still removes taints; Events go nowhere.
func TestNilRecorderDiscardsEvents(t *testing.T) {
	client := fake.NewClientset(&v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName},
		Spec:       v1.NodeSpec{Taints: []v1.Taint{{Key: DefaultOwnedKey, Effect: v1.TaintEffectNoSchedule}}},
	})
	m, err := New(Config{Client: client.CoreV1().Nodes(), NodeName: nodeName, StabilityWindow: -1,
		Clock: clocktesting.NewFakePassiveClock(t0), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Reconcile(context.Background(), gating(collectors.StatusHealthy, collectors.StatusHealthy)); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	n, err := client.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Spec.Taints) != 0 || !m.Released() {
		t.Errorf("taints = %v released = %v, want none and released", n.Spec.Taints, m.Released())
	}
}

// TestWindowResetsBetweenChecks: a kubelet restart that a gating check saw between two runs
// (Result.Disrupted, from systemd's signals) and a Ready flap of the Node (its
// lastTransitionTime) restart the window although every sampled result was Healthy.
func TestWindowResetsBetweenChecks(t *testing.T) {
	t.Run("disruption seen between checks", func(t *testing.T) {
		h := newHarness(t, Config{}, ownTaint)
		h.step(t, 0, gating(collectors.StatusHealthy, collectors.StatusHealthy))
		r := gating(collectors.StatusHealthy, collectors.StatusHealthy)
		r[0].Disrupted = t0.Add(7 * time.Second) // restarted and recovered between samples
		h.step(t, 8*time.Second, r)
		h.step(t, 8*time.Second, r) // 16s after the first sample, 9s after the restart
		if !hasKey(h.taints(t), DefaultOwnedKey) {
			t.Fatal("taint removed 9s after a kubelet restart with a 10s window")
		}
		h.step(t, 2*time.Second, r)
		if hasKey(h.taints(t), DefaultOwnedKey) {
			t.Fatal("taint kept a full window after the restart")
		}
	})
	t.Run("Ready flapped between checks", func(t *testing.T) {
		h := newHarness(t, Config{}, ownTaint)
		setReady := func(s v1.ConditionStatus, at time.Time) {
			n, err := h.client.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: s, LastTransitionTime: metav1.NewTime(at)}}
			if _, err := h.client.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		setReady(v1.ConditionTrue, t0.Add(-time.Minute))
		h.step(t, 0, gating(collectors.StatusHealthy, collectors.StatusHealthy))
		setReady(v1.ConditionTrue, t0.Add(6*time.Second)) // False and back between samples
		h.step(t, 10*time.Second, gating(collectors.StatusHealthy, collectors.StatusHealthy))
		if !hasKey(h.taints(t), DefaultOwnedKey) {
			t.Fatal("taint removed 4s after a Ready flap")
		}
		setReady(v1.ConditionFalse, t0.Add(12*time.Second))
		h.step(t, 10*time.Second, gating(collectors.StatusHealthy, collectors.StatusHealthy))
		if !hasKey(h.taints(t), DefaultOwnedKey) {
			t.Fatal("taint removed while Ready is False")
		}
		setReady(v1.ConditionTrue, t0.Add(21*time.Second))
		h.step(t, 5*time.Second, gating(collectors.StatusHealthy, collectors.StatusHealthy))
		h.step(t, 6*time.Second, gating(collectors.StatusHealthy, collectors.StatusHealthy))
		if hasKey(h.taints(t), DefaultOwnedKey) {
			t.Fatal("taint kept a full window after Ready settled")
		}
	})
}
