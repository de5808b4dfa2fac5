package heartbeat

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/nodevigil/nodevigil/collectors/wakeup"
)

const (
	nodeName = "node-a"
	ns       = "nodevigil-system"
	pod      = "nodevigil-agent-x7k2p"
	nodeUID  = types.UID("0b8f6c1e-uid")
)

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func newNode() *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: nodeUID}}
}

func newRenewer(t *testing.T, client *fake.Clientset, clk *clocktesting.FakeClock) *Renewer {
	t.Helper()
	r, err := New(Config{
		Leases: client.CoordinationV1().Leases(ns), Nodes: client.CoreV1().Nodes(), NodeName: nodeName, Namespace: ns, HolderIdentity: pod,
		Clock: clk, Rand: func() float64 { return 0 },
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return r
}

func getLease(t *testing.T, client *fake.Clientset) *coordinationv1.Lease {
	t.Helper()
	l, err := client.CoordinationV1().Leases(ns).Get(context.Background(), nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get lease: %v", err)
	}
	return l
}

// leaseActions returns the verbs sent for leases, in order.
func leaseActions(client *fake.Clientset) []string {
	var out []string
	for _, a := range client.Actions() {
		if a.GetResource().Resource == "leases" {
			out = append(out, a.GetVerb())
		}
	}
	return out
}

func TestCreatesLeaseWithOwnerThenUpdates(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(newNode())
	clk := clocktesting.NewFakeClock(t0)
	r := newRenewer(t, client, clk)

	if err := r.Renew(ctx); err != nil {
		t.Fatalf("first Renew: %v", err)
	}
	l := getLease(t, client)
	if l.Labels[NodeLabel] != nodeName {
		t.Errorf("label %s = %q, want %q", NodeLabel, l.Labels[NodeLabel], nodeName)
	}
	want := metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: nodeName, UID: nodeUID}
	if len(l.OwnerReferences) != 1 || l.OwnerReferences[0] != want {
		t.Errorf("ownerReferences = %+v, want [%+v]", l.OwnerReferences, want)
	}
	if ptr.Deref(l.Spec.HolderIdentity, "") != pod || ptr.Deref(l.Spec.LeaseDurationSeconds, 0) != 40 {
		t.Errorf("spec = holder %v duration %v, want %s 40", l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, pod)
	}
	if l.Spec.RenewTime == nil || !l.Spec.RenewTime.Time.Equal(t0) {
		t.Errorf("renewTime = %v, want %v", l.Spec.RenewTime, t0)
	}

	client.ClearActions()
	for i := 1; i <= 3; i++ {
		clk.Step(10 * time.Second)
		if err := r.Renew(ctx); err != nil {
			t.Fatalf("Renew %d: %v", i, err)
		}
	}
	if got := leaseActions(client); len(got) != 3 || got[0] != "update" || got[1] != "update" || got[2] != "update" {
		t.Errorf("lease calls for 3 renewals = %v, want exactly 3 updates (no get)", got)
	}
	for _, a := range client.Actions() {
		if a.GetResource().Resource == "nodes" {
			t.Errorf("node read again on renewal: %v", a)
		}
	}
	l = getLease(t, client)
	if !l.Spec.RenewTime.Time.Equal(t0.Add(30 * time.Second)) {
		t.Errorf("renewTime = %v, want t0+30s", l.Spec.RenewTime)
	}
	if !l.Spec.AcquireTime.Time.Equal(t0) {
		t.Errorf("acquireTime moved to %v", l.Spec.AcquireTime)
	}
	if got := testutil.ToFloat64(r.renewals.WithLabelValues(ResultSuccess)); got != 4 {
		t.Errorf("successful renewals = %v, want 4", got)
	}
}

func TestAdoptsExistingLeaseFromPreviousPod(t *testing.T) {
	old := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName, Namespace: ns, Labels: map[string]string{"team": "infra"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: nodeName, UID: "old-uid"}}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("nodevigil-agent-old"), LeaseTransitions: ptr.To[int32](2)},
	}
	client := fake.NewClientset(newNode(), old)
	r := newRenewer(t, client, clocktesting.NewFakeClock(t0))
	if err := r.Renew(context.Background()); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	l := getLease(t, client)
	if ptr.Deref(l.Spec.HolderIdentity, "") != pod || ptr.Deref(l.Spec.LeaseTransitions, 0) != 3 {
		t.Errorf("holder %v transitions %v, want %s 3", l.Spec.HolderIdentity, l.Spec.LeaseTransitions, pod)
	}
	if len(l.OwnerReferences) != 1 || l.OwnerReferences[0].UID != nodeUID {
		t.Errorf("owner = %+v, want the current Node UID only", l.OwnerReferences)
	}
	if l.Labels["team"] != "infra" || l.Labels[NodeLabel] != nodeName {
		t.Errorf("labels = %v, want foreign label kept and %s set", l.Labels, NodeLabel)
	}
}

func TestConflictAndNotFoundRecoverWithinRenewal(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  func() error
		// deleteLease simulates the garbage collector having removed it.
		deleteLease bool
	}{
		{"conflict re-reads and updates", func() error {
			return apierrors.NewConflict(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, nodeName, errors.New("changed"))
		}, false},
		{"not found re-creates", func() error {
			return apierrors.NewNotFound(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, nodeName)
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			client := fake.NewClientset(newNode())
			clk := clocktesting.NewFakeClock(t0)
			r := newRenewer(t, client, clk)
			if err := r.Renew(ctx); err != nil {
				t.Fatal(err)
			}
			if tc.deleteLease {
				if err := client.CoordinationV1().Leases(ns).Delete(ctx, nodeName, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			failOnce := true
			client.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
				if failOnce {
					failOnce = false
					return true, nil, tc.err()
				}
				return false, nil, nil
			})
			client.ClearActions()
			clk.Step(10 * time.Second)
			if err := r.Renew(ctx); err != nil {
				t.Fatalf("Renew after %s: %v", tc.name, err)
			}
			if l := getLease(t, client); !l.Spec.RenewTime.Time.Equal(t0.Add(10 * time.Second)) {
				t.Errorf("renewTime = %v, want t0+10s", l.Spec.RenewTime)
			}
			got := leaseActions(client)
			if len(got) < 3 || got[0] != "update" || got[1] != "get" {
				t.Errorf("lease calls = %v, want update, get, then a write", got)
			}
		})
	}
}

func TestFailuresAreCountedByResult(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(newNode())
	r := newRenewer(t, client, clocktesting.NewFakeClock(t0))
	errs := []error{context.DeadlineExceeded, errors.New("connection refused")}
	client.PrependReactor("*", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if len(errs) > 0 {
			e := errs[0]
			errs = errs[1:]
			return true, nil, e
		}
		return false, nil, nil
	})
	for range 2 {
		if err := r.Renew(ctx); err == nil {
			t.Fatal("Renew succeeded through a failing apiserver")
		}
	}
	if err := r.Renew(ctx); err != nil {
		t.Fatalf("Renew after recovery: %v", err)
	}
	for res, want := range map[string]float64{ResultTimeout: 1, ResultError: 1, ResultSuccess: 1} {
		if got := testutil.ToFloat64(r.renewals.WithLabelValues(res)); got != want {
			t.Errorf("renewals{result=%s} = %v, want %v", res, got, want)
		}
	}
}

func TestRenewsWithoutNodeWhenNodeReadFails(t *testing.T) {
	client := fake.NewClientset(newNode())
	client.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("forbidden")
	})
	r := newRenewer(t, client, clocktesting.NewFakeClock(t0))
	if err := r.Renew(context.Background()); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if l := getLease(t, client); l.Spec.RenewTime == nil || len(l.OwnerReferences) != 0 {
		t.Errorf("lease = %+v, want renewed without owner", l)
	}
}

func TestRunRenewsOnScheduleAndBacksOffOnFailure(t *testing.T) {
	client := fake.NewClientset(newNode())
	clk := clocktesting.NewFakeClock(t0)
	r := newRenewer(t, client, clk)

	var mu sync.Mutex
	failing := false
	writes := 0
	client.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if a.GetVerb() == "get" {
			return false, nil, nil
		}
		writes++
		if failing {
			return true, nil, errors.New("apiserver down")
		}
		return false, nil, nil
	})
	getWrites := func() int { mu.Lock(); defer mu.Unlock(); return writes }

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()

	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	// Step advances the fake clock once Run is waiting on it.
	step := func(d time.Duration) {
		t.Helper()
		waitFor("run to wait", clk.HasWaiters)
		clk.Step(d)
	}

	waitFor("first write", func() bool { return getWrites() == 1 })
	step(9 * time.Second)
	if getWrites() != 1 {
		t.Fatal("renewed before the interval")
	}
	step(time.Second)
	waitFor("second write", func() bool { return getWrites() == 2 })

	// A failing apiserver is retried quickly: 0.5s, then 1s, not 10s.
	mu.Lock()
	failing = true
	mu.Unlock()
	step(10 * time.Second)
	waitFor("failing write", func() bool { return getWrites() == 3 })
	step(500 * time.Millisecond)
	waitFor("first retry", func() bool { return getWrites() == 4 })
	mu.Lock()
	failing = false
	mu.Unlock()
	step(time.Second)
	waitFor("second retry", func() bool { return getWrites() == 5 })
	if got := testutil.ToFloat64(r.renewals.WithLabelValues(ResultError)); got != 2 {
		t.Errorf("error renewals = %v, want 2", got)
	}

	waitFor("run to wait", clk.HasWaiters)
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestNewRejectsBadTiming(t *testing.T) {
	client := fake.NewClientset()
	base := Config{Leases: client.CoordinationV1().Leases(ns), Nodes: client.CoreV1().Nodes(), NodeName: nodeName, Namespace: ns, HolderIdentity: pod}
	for _, tc := range []struct {
		name string
		mut  func(*Config)
	}{
		{"renew interval not below duration", func(c *Config) { c.RenewInterval = 50 * time.Second }},
		{"timeout not below interval", func(c *Config) { c.RenewTimeout = 10 * time.Second }},
		{"no holder", func(c *Config) { c.HolderIdentity = "" }},
		{"no lease client", func(c *Config) { c.Leases = nil }},
		{"no node client", func(c *Config) { c.Nodes = nil }},
	} {
		c := base
		tc.mut(&c)
		if _, err := New(c); err == nil {
			t.Errorf("%s: New accepted it", tc.name)
		}
	}
}

// TestRunRenewsOnTheGrid: with a Grid, a renewal after a success falls on the Grid's next
// point (shared with the agent's other periodic jobs) with no jitter; a retry after a failure
// keeps its backoff and the renewal after it returns to the Grid.
func TestRunRenewsOnTheGrid(t *testing.T) {
	client := fake.NewClientset(newNode())
	clk := clocktesting.NewFakeClock(t0)
	r, err := New(Config{
		Leases: client.CoordinationV1().Leases(ns), Nodes: client.CoreV1().Nodes(), NodeName: nodeName, Namespace: ns, HolderIdentity: pod,
		Grid:  wakeup.Grid{Origin: t0.Add(-3 * time.Second)},
		Clock: clk, Rand: func() float64 { return 0.99 }, // jitter, were it applied, would be ~1 s
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	failing := false
	var writes []time.Time
	client.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if a.GetVerb() == "get" {
			return false, nil, nil
		}
		writes = append(writes, clk.Now())
		if failing {
			return true, nil, errors.New("apiserver down")
		}
		return false, nil, nil
	})
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(writes) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	stepTo := func(at time.Duration) {
		t.Helper()
		waitFor("run to wait", clk.HasWaiters)
		clk.SetTime(t0.Add(at))
	}
	waitFor("first write", func() bool { return count() == 1 })
	for _, s := range []struct {
		at      time.Duration
		writes  int
		failing bool // the API server during the step
	}{
		{7*time.Second - time.Millisecond, 1, false}, // the Grid's point is origin+10s = t0+7s
		{7 * time.Second, 2, false},
		{17*time.Second - time.Millisecond, 2, false},
		{17 * time.Second, 3, true},                       // fails
		{17*time.Second + 600*time.Millisecond, 4, false}, // the retry's own backoff (0.5 s + jitter), off the Grid
		{27*time.Second - time.Millisecond, 4, false},     // then back on the Grid, no jitter
		{27 * time.Second, 5, false},
	} {
		mu.Lock()
		failing = s.failing
		mu.Unlock()
		stepTo(s.at)
		waitFor("run to wait again", clk.HasWaiters)
		if s.writes > count() {
			waitFor(fmt.Sprintf("write %d at t0+%v", s.writes, s.at), func() bool { return count() >= s.writes })
		}
		if got := count(); got != s.writes {
			t.Fatalf("at t0+%v: %d writes, want %d", s.at, got, s.writes)
		}
	}
}
