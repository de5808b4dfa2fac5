package remediation

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/decide"
)

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestNewValidates(t *testing.T) {
	live := liveConfig(t, "")
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no client", Config{}, "Config.Client is required"},
		{"no cloud when acting", Config{Client: fake.NewClientset(), Remediator: live}, "Config.Cloud is required"},
		{"bad leader election timing", Config{Client: fake.NewClientset(), LeaderElection: LeaderElectionConfig{Enabled: true, LeaseDuration: time.Second, RenewDeadline: 2 * time.Second}}, "must be longer than the renew deadline"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New = %v, want an error containing %q", err, tt.want)
			}
		})
	}
	// Dry-run needs no cloud, and the zero values take their defaults.
	c, err := New(Config{Client: fake.NewClientset(), Logger: discardLogger()})
	if err != nil {
		t.Fatalf("New(dry-run, no cloud): %v", err)
	}
	if c.cfg.Workers != DefaultWorkers || c.observe != decide.StaleAfter(config.DefaultAgentLeaseDuration) || c.Identity() == "" || !c.rc.DryRun {
		t.Errorf("defaults not filled: workers %d, observe %s, identity %q, dry-run %v", c.cfg.Workers, c.observe, c.Identity(), c.rc.DryRun)
	}
}

func TestStripNode(t *testing.T) {
	n := newNode("n", withAnnotation(decide.AnnotationState, "Marked"), withAnnotation("kubectl.kubernetes.io/last-applied-configuration", strings.Repeat("x", 4096)))
	n.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	n.Status.Images = []corev1.ContainerImage{{Names: []string{"big"}, SizeBytes: 1 << 30}}
	n.Status.VolumesAttached = []corev1.AttachedVolume{{Name: "v"}}
	n.Status.Capacity = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")}
	n.Status.NodeInfo.KernelVersion = "6.1"
	n.Spec.Taints = []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectNoSchedule}}
	n.Spec.Unschedulable = true
	n.Spec.PodCIDR, n.Spec.PodCIDRs = "10.0.0.0/24", []string{"10.0.0.0/24"}

	out, err := stripNode(n)
	if err != nil {
		t.Fatal(err)
	}
	s := out.(*corev1.Node)
	if s.ManagedFields != nil || s.Status.Images != nil || s.Status.VolumesAttached != nil || s.Status.Capacity != nil || s.Status.NodeInfo.KernelVersion != "" || s.Spec.PodCIDR != "" || s.Spec.PodCIDRs != nil {
		t.Error("bulky fields kept")
	}
	if _, ok := s.Annotations["kubectl.kubernetes.io/last-applied-configuration"]; ok {
		t.Error("foreign annotation kept")
	}
	if s.Annotations[decide.AnnotationState] != "Marked" || s.Labels[corev1.LabelTopologyZone] == "" || len(s.Spec.Taints) != 1 ||
		!s.Spec.Unschedulable || s.Spec.ProviderID == "" || len(s.Status.Conditions) != 1 || s.UID == "" || s.CreationTimestamp.IsZero() {
		t.Errorf("a field the remediator reads was dropped: %+v", s)
	}
	// Idempotent: client-go may apply it more than once.
	again, _ := stripNode(s.DeepCopy())
	if again.(*corev1.Node).Annotations[decide.AnnotationState] != "Marked" {
		t.Error("second pass changed the node")
	}
	if x, _ := stripNode("not a node"); x != "not a node" {
		t.Error("non-Node object changed")
	}
}

// TestRunEndToEnd runs the controller as the binary does (without leader election) on a fake
// clock: nothing happens during the observe period, then the dead node is taken away and the
// healthy one left alone.
func TestRunEndToEnd(t *testing.T) {
	h := newHarness(t, liveConfig(t, "policies:\n- name: p\n  nodeSelector: \"\"\n  maxUnhealthy: 100%\n  drain: {enabled: false}\n"))
	// A fresh controller over the same fake cluster, run through Run.
	clk := testingclock.NewFakeClock(t0)
	rec := record.NewFakeRecorder(100)
	c, err := New(Config{Client: h.client, Cloud: h.cloud, Remediator: h.c.rc, Clock: clk, Recorder: rec, Logger: discardLogger(), Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	h.silent(newNode("dead"))
	ok := h.healthy(newNode("ok"))
	keepAlive := func() {
		h.renew(DefaultKubeletLeaseNamespace, ok.Name, clk.Now())
		h.renew(h.c.rc.AgentNamespace, ok.Name, clk.Now())
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(60 * time.Second)
	for !c.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("controller never started acting")
		}
		time.Sleep(time.Millisecond)
	}
	// During the observe period: nothing, however long the workers get.
	time.Sleep(100 * time.Millisecond)
	if got := h.Steps(); len(got) != 0 {
		t.Fatalf("acted during the observe period: %q", got)
	}
	for !h.nodeGone("dead") {
		if time.Now().After(deadline) {
			t.Fatalf("dead node not remediated; steps %q", h.Steps())
		}
		clk.Step(time.Second)
		keepAlive()
		time.Sleep(5 * time.Millisecond)
	}
	if clk.Since(t0) < c.observe {
		t.Errorf("remediated %s after leading, before the observe period %s ended", clk.Since(t0), c.observe)
	}
	for _, s := range h.Steps() {
		if strings.Contains(s, " ok") {
			t.Errorf("touched the healthy node: %s", s)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v, want nil after cancel", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if c.IsLeader() {
		t.Error("still leading after Run returned")
	}
}

func TestLeaderElection(t *testing.T) {
	client := fake.NewClientset()
	// Enforce optimistic concurrency on Leases as the API server does; without it a deposed
	// leader's blind update would silently win.
	var rv atomic.Int64
	client.PrependReactor("*", "leases", func(action k8stesting.Action) (bool, runtime.Object, error) {
		switch a := action.(type) {
		case k8stesting.CreateActionImpl:
			a.Object.(metav1.Object).SetResourceVersion(strconv.FormatInt(rv.Add(1), 10))
		case k8stesting.UpdateActionImpl:
			l := a.Object.(*coordinationv1.Lease)
			cur, err := client.Tracker().Get(leasesGVR, l.Namespace, l.Name)
			if err != nil {
				return true, nil, err
			}
			if cur.(metav1.Object).GetResourceVersion() != l.ResourceVersion {
				return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, l.Name, errors.New("stale"))
			}
			l.ResourceVersion = strconv.FormatInt(rv.Add(1), 10)
		}
		return false, nil, nil
	})
	newReplica := func(id string) *Controller {
		c, err := New(Config{
			Client: client, Logger: discardLogger(), Clock: testingclock.NewFakeClock(t0), Recorder: record.NewFakeRecorder(100),
			LeaderElection: LeaderElectionConfig{Enabled: true, Identity: id, LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 100 * time.Millisecond},
		})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b := newReplica("a"), newReplica("b")
	ctxA, cancelA := context.WithCancel(context.Background())
	ctxB, cancelB := context.WithCancel(context.Background())
	defer cancelB()
	doneA, doneB := make(chan error, 1), make(chan error, 1)
	go func() { doneA <- a.Run(ctxA) }()
	waitFor(t, "a to lead", a.IsLeader)
	go func() { doneB <- b.Run(ctxB) }()
	time.Sleep(500 * time.Millisecond)
	if b.IsLeader() {
		t.Fatal("two leaders")
	}
	lease := getLease(t, client)
	if ptr.Deref(lease.Spec.HolderIdentity, "") != "a" {
		t.Fatalf("lease holder %q, want a", ptr.Deref(lease.Spec.HolderIdentity, ""))
	}

	// a stops: it releases the Lease on its way out and b takes over promptly.
	cancelA()
	if err := <-doneA; err != nil {
		t.Errorf("a.Run after cancel = %v, want nil", err)
	}
	waitFor(t, "b to lead", b.IsLeader)

	// Someone else takes the Lease from b: b stops acting and Run reports the loss.
	lease = getLease(t, client)
	lease.Spec.HolderIdentity = ptr.To("thief")
	lease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	lease.Spec.LeaseDurationSeconds = ptr.To[int32](3600)
	if _, err := client.CoordinationV1().Leases(DefaultNamespace).Update(context.Background(), lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-doneB:
		if !errors.Is(err, ErrLostLeadership) {
			t.Errorf("b.Run after losing the lease = %v, want ErrLostLeadership", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("b did not notice it lost the lease")
	}
	if b.IsLeader() {
		t.Error("b still acting after losing the lease")
	}
}

func getLease(t *testing.T, client *fake.Clientset) *coordinationv1.Lease {
	t.Helper()
	l, err := client.CoordinationV1().Leases(DefaultNamespace).Get(context.Background(), Component, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get leader lease: %v", err)
	}
	return l
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestHandler(t *testing.T) {
	c, err := New(Config{Client: fake.NewClientset(), Logger: discardLogger(), Recorder: record.NewFakeRecorder(10)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c.Handler())
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz before sync = %d, want 503", code)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d, want 200", code)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	waitFor(t, "ready", c.Ready)
	if code, _ := get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after sync = %d, want 200", code)
	}
	code, body := get("/metrics")
	for _, name := range []string{
		"nodevigil_remediator_is_leader", "nodevigil_remediator_decisions_total", "nodevigil_remediator_terminations_total",
		"nodevigil_remediator_blocked_total", "nodevigil_remediator_in_flight",
	} {
		if code != http.StatusOK || !strings.Contains(body, name) {
			t.Errorf("/metrics (%d) lacks %s", code, name)
		}
	}
	cancel()
	<-done
}

// TestNodeSelectorMatchingNothingIsLoud: a nodeSelector that matches no Node (a typo) makes
// /readyz carry a warning instead of a remediator that silently watches nothing.
func TestNodeSelectorMatchingNothingIsLoud(t *testing.T) {
	for _, tc := range []struct {
		selector string
		warn     bool
	}{
		{"pool=general", false},
		{"pool=genral", true},
		{"", false},
	} {
		t.Run(tc.selector, func(t *testing.T) {
			rc, err := config.Parse([]byte("apiVersion: nodevigil.io/v1alpha1\nkind: RemediatorConfig\nnodeSelector: \"" + tc.selector + "\"\n"))
			if err != nil {
				t.Fatal(err)
			}
			client := fake.NewClientset(newNode("n-1", func(n *corev1.Node) { n.Labels["pool"] = "general" }))
			c, err := New(Config{Client: client, Remediator: rc, Logger: discardLogger(), Recorder: record.NewFakeRecorder(10)})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			defer func() { cancel(); <-done }()
			waitFor(t, "ready", c.Ready)
			rec := httptest.NewRecorder()
			c.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			warned := strings.Contains(rec.Body.String(), "matches no node")
			if rec.Code != http.StatusOK || warned != tc.warn {
				t.Errorf("/readyz = %d %q; want 200 and a 'matches no node' warning = %v", rec.Code, rec.Body.String(), tc.warn)
			}
		})
	}
}

// TestRunListsOneInformerAfterTheOther: Run lists Nodes first and each Lease informer only once
// the previous informer has synced, so the garbage of the initial lists never coincides, and it
// collects with Config.StartupGCPercent until then, restoring the previous setting after.
func TestRunListsOneInformerAfterTheOther(t *testing.T) {
	client := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 3 {
		name := "n-" + strconv.Itoa(i)
		if _, err := client.CoreV1().Nodes().Create(ctx, newNode(name), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := client.CoordinationV1().Leases(DefaultKubeletLeaseNamespace).Create(ctx, newLease(DefaultKubeletLeaseNamespace, name, t0), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	readGC := func() int {
		p := debug.SetGCPercent(-1)
		debug.SetGCPercent(p)
		return p
	}
	before := readGC()
	var c *Controller
	type listed struct {
		resource    string
		nodesCached int
		gcPercent   int
	}
	lists := make(chan listed, 10)
	client.PrependReactor("list", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		n := 0
		if c != nil {
			nodes, _ := c.nodes.List(labels.Everything())
			n = len(nodes)
		}
		lists <- listed{a.GetResource().Resource, n, readGC()}
		return false, nil, nil
	})
	var err error
	c, err = New(Config{Client: client, Clock: testingclock.NewFakeClock(t0), Recorder: record.NewFakeRecorder(100), Logger: discardLogger(), StartupGCPercent: 7})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(60 * time.Second)
	for !c.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("controller never started acting")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	close(lists)
	var got []listed
	for l := range lists {
		got = append(got, l)
	}
	if len(got) != 3 || got[0].resource != "nodes" || got[1].resource != "leases" || got[2].resource != "leases" {
		t.Fatalf("lists %+v, want nodes then the two Lease informers", got)
	}
	for _, l := range got[1:] {
		if l.nodesCached != 3 {
			t.Errorf("a Lease informer listed with %d of 3 Nodes cached: not after the Node informer synced", l.nodesCached)
		}
	}
	for _, l := range got {
		if l.gcPercent != 7 {
			t.Errorf("GOGC %d while listing %s, want StartupGCPercent 7", l.gcPercent, l.resource)
		}
	}
	if after := readGC(); after != before {
		t.Errorf("GOGC %d after the sync, want %d restored", after, before)
	}
}
