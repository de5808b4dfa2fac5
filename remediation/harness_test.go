package remediation

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/decide"
	"github.com/nodevigil/nodevigil/remediation/providerid"
)

// t0 is the fake clock's start.
var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

var (
	nodesGVR  = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
	podsGVR   = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	leasesGVR = schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
)

// neverBlind is a lease observer gap that is never reached.
const neverBlind = time.Duration(math.MaxInt64)

// harness runs a Controller over a fake clientset that behaves like an API server where it
// matters here: resourceVersions are stamped on every write and a merge patch carrying a stale
// resourceVersion is refused with Conflict.
type harness struct {
	t      *testing.T
	ctx    context.Context
	client *fake.Clientset
	clock  *testingclock.FakeClock
	cloud  *fakeCloud
	rec    *record.FakeRecorder
	c      *Controller
	rv     atomic.Int64

	mu       sync.Mutex
	steps    []string             // node steps in order: "patch <node> [mark+]<state>", "evict <pod>", "delete <node>"
	pdb      map[string]bool      // pod refs whose eviction is refused with 429
	grace    map[string]bool      // pod refs that terminate slowly (deletionTimestamp set, not deleted)
	onEvict  func(ns, pod string) // called before an eviction is carried out
	conflict bool                 // refuse the next node patch with Conflict
}

func newHarness(t *testing.T, rc *config.Config, opts ...func(*harness, *Config)) *harness {
	t.Helper()
	if rc == nil {
		rc = liveConfig(t, "")
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h := &harness{
		t:      t,
		ctx:    ctx,
		client: fake.NewClientset(),
		clock:  testingclock.NewFakeClock(t0),
		cloud:  newFakeCloud(),
		rec:    record.NewFakeRecorder(1000),
		pdb:    map[string]bool{},
		grace:  map[string]bool{},
	}
	h.client.PrependReactor("*", "*", h.react)
	cfg := Config{
		Client:     h.client,
		Cloud:      h.cloud,
		Remediator: rc,
		Clock:      h.clock,
		Recorder:   h.rec,
		Logger:     slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	for _, o := range opts {
		o(h, &cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.c = c
	// The fixtures' healthy nodes do not renew while the fake clock advances, which in a real
	// cluster happens only when this replica cannot observe: the blindness rule (observe.go)
	// would hold every judgement. It has its own tests and is off here.
	c.kubeletObs.gap, c.agentObs.gap = neverBlind, neverBlind
	for _, f := range c.factories {
		f.Start(ctx.Done())
	}
	t.Cleanup(func() {
		cancel()
		for _, f := range c.factories {
			f.Shutdown()
		}
	})
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		t.Fatal("informers did not sync")
	}
	// This replica has led for an hour: the observe period is over.
	c.observingSince.Store(t0.Add(-time.Hour).UnixNano())
	c.leading.Store(true)
	c.cloud.(*fakeCloud).h = h
	return h
}

// liveConfig parses a RemediatorConfig with dryRun false and the given policies YAML.
func liveConfig(t *testing.T, extra string) *config.Config {
	t.Helper()
	doc := "apiVersion: nodevigil.io/v1alpha1\nkind: RemediatorConfig\n" + extra
	if !strings.Contains(extra, "dryRun:") {
		doc += "dryRun: false\n"
	}
	rc, err := config.Parse([]byte(doc))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return rc
}

func (h *harness) step(s string) {
	h.mu.Lock()
	h.steps = append(h.steps, s)
	h.mu.Unlock()
}

func (h *harness) Steps() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.steps)
}

// react stamps resourceVersions, enforces them on node patches and simulates evictions.
func (h *harness) react(action k8stesting.Action) (bool, runtime.Object, error) {
	tracker := h.client.Tracker()
	switch a := action.(type) {
	case k8stesting.CreateActionImpl:
		if a.Subresource == "eviction" {
			return h.evict(a)
		}
		if o, ok := a.Object.(metav1.Object); ok {
			o.SetResourceVersion(strconv.FormatInt(h.rv.Add(1), 10))
		}
	case k8stesting.UpdateActionImpl:
		if o, ok := a.Object.(metav1.Object); ok {
			o.SetResourceVersion(strconv.FormatInt(h.rv.Add(1), 10))
		}
	case k8stesting.PatchActionImpl:
		if a.Resource != nodesGVR {
			return true, nil, fmt.Errorf("unexpected patch of %s", a.Resource)
		}
		obj, err := tracker.Get(nodesGVR, "", a.Name)
		if err != nil {
			return true, nil, err
		}
		cur := obj.(*corev1.Node)
		var body struct {
			Metadata struct {
				ResourceVersion string             `json:"resourceVersion"`
				Annotations     map[string]*string `json:"annotations"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(a.Patch, &body); err != nil {
			return true, nil, err
		}
		h.mu.Lock()
		conflict := h.conflict
		h.conflict = false
		h.mu.Unlock()
		if conflict || (body.Metadata.ResourceVersion != "" && body.Metadata.ResourceVersion != cur.ResourceVersion) {
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, a.Name, fmt.Errorf("resourceVersion %s is stale", body.Metadata.ResourceVersion))
		}
		orig, _ := json.Marshal(cur)
		patched, err := strategicpatch.StrategicMergePatch(orig, a.Patch, corev1.Node{})
		if err != nil {
			return true, nil, err
		}
		n := &corev1.Node{}
		if err := json.Unmarshal(patched, n); err != nil {
			return true, nil, err
		}
		n.ResourceVersion = strconv.FormatInt(h.rv.Add(1), 10)
		if err := tracker.Update(nodesGVR, n, ""); err != nil {
			return true, nil, err
		}
		if b, ok := body.Metadata.Annotations[decide.AnnotationBlocked]; ok && b != nil {
			h.step("patch " + a.Name + " Blocked:" + *b)
		} else if s, ok := body.Metadata.Annotations[decide.AnnotationState]; ok {
			if r := body.Metadata.Annotations[decide.AnnotationReason]; r != nil {
				// The mark: the decision recorded, with the phase it starts in (and, for a
				// policy without a drain, the intent to terminate).
				st := "patch " + a.Name + " mark+" + ptr.Deref(s, "<removed>")
				if i := body.Metadata.Annotations[decide.AnnotationTerminationRequestedAt]; i != nil {
					st += "+intent"
				}
				h.step(st)
			} else {
				h.step("patch " + a.Name + " " + ptr.Deref(s, "<removed>"))
			}
		} else if r, ok := body.Metadata.Annotations[decide.AnnotationTerminationRequestedAt]; ok && r != nil {
			h.step("patch " + a.Name + " intent")
		} else if _, ok := body.Metadata.Annotations[decide.AnnotationDryRunDecision]; ok {
			h.step("patch " + a.Name + " dry-run")
		} else if _, ok := body.Metadata.Annotations[decide.AnnotationFirstReady]; ok {
			h.step("patch " + a.Name + " first-ready")
		} else {
			h.step("patch " + a.Name + " other")
		}
		return true, n, nil
	case k8stesting.DeleteActionImpl:
		if a.Resource == nodesGVR {
			h.step("delete " + a.Name)
		}
	}
	return false, nil, nil
}

func (h *harness) evict(a k8stesting.CreateActionImpl) (bool, runtime.Object, error) {
	ref := a.Namespace + "/" + a.Object.(metav1.Object).GetName()
	h.mu.Lock()
	refused, slow, hook := h.pdb[ref], h.grace[ref], h.onEvict
	h.mu.Unlock()
	if hook != nil {
		hook(a.Namespace, a.Object.(metav1.Object).GetName())
	}
	if refused {
		return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	}
	h.step("evict " + ref)
	tracker := h.client.Tracker()
	name := a.Object.(metav1.Object).GetName()
	if slow {
		obj, err := tracker.Get(podsGVR, a.Namespace, name)
		if err != nil {
			return true, nil, err
		}
		p := obj.(*corev1.Pod).DeepCopy()
		p.DeletionTimestamp = &metav1.Time{Time: h.clock.Now().Add(30 * time.Second)}
		p.ResourceVersion = strconv.FormatInt(h.rv.Add(1), 10)
		return true, nil, tracker.Update(podsGVR, p, a.Namespace)
	}
	return true, nil, tracker.Delete(podsGVR, a.Namespace, name)
}

// add creates objects through the clientset.
func (h *harness) add(objs ...runtime.Object) {
	h.t.Helper()
	for _, o := range objs {
		var err error
		switch x := o.(type) {
		case *corev1.Node:
			_, err = h.client.CoreV1().Nodes().Create(h.ctx, x, metav1.CreateOptions{})
		case *coordinationv1.Lease:
			var l *coordinationv1.Lease
			if l, err = h.client.CoordinationV1().Leases(x.Namespace).Create(h.ctx, x, metav1.CreateOptions{}); err == nil {
				h.seenRenewing(l)
			}
		case *corev1.Pod:
			_, err = h.client.CoreV1().Pods(x.Namespace).Create(h.ctx, x, metav1.CreateOptions{})
		default:
			h.t.Fatalf("add: unexpected %T", o)
		}
		if err != nil {
			h.t.Fatalf("add %T: %v", o, err)
		}
	}
}

// renew sets a Lease's renewTime; the controller is made to have seen the renewal at that time.
func (h *harness) renew(ns, name string, at time.Time) {
	h.t.Helper()
	l, err := h.client.CoordinationV1().Leases(ns).Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatalf("get lease: %v", err)
	}
	l.Spec.RenewTime = &metav1.MicroTime{Time: at}
	l, err = h.client.CoordinationV1().Leases(ns).Update(h.ctx, l, metav1.UpdateOptions{})
	if err != nil {
		h.t.Fatalf("update lease: %v", err)
	}
	h.seenRenewing(l)
}

// synced waits until the informer caches show what the clientset holds for name.
func (h *harness) synced(name string) {
	h.t.Helper()
	rvOf := func(obj runtime.Object, err error) string {
		if err != nil {
			return "absent"
		}
		return obj.(metav1.Object).GetResourceVersion()
	}
	// A deadline, not a wait: it returns as soon as the caches agree. Generous, because under
	// -race on a loaded 2-core CI machine the informers have taken more than 5 s.
	deadline := time.Now().Add(30 * time.Second)
	for {
		tr := h.client.Tracker()
		want := []string{
			rvOf(tr.Get(nodesGVR, "", name)),
			rvOf(tr.Get(leasesGVR, DefaultKubeletLeaseNamespace, name)),
			rvOf(tr.Get(leasesGVR, h.c.rc.AgentNamespace, name)),
		}
		n, err1 := h.c.nodes.Get(name)
		k, err2 := h.c.kubeletLeases.Get(name)
		a, err3 := h.c.agentLeases.Get(name)
		got := []string{rvOf(n, err1), rvOf(k, err2), rvOf(a, err3)}
		if slices.Equal(want, got) {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("cache of %s did not catch up: want %v, got %v", name, want, got)
		}
		time.Sleep(time.Millisecond)
	}
}

// settle waits until the caches show every node the clientset holds (and name, which may be
// gone): the safety rails count the whole cluster, so a census must not see half of it.
func (h *harness) settle(name string) {
	h.t.Helper()
	h.synced(name)
	list, err := h.client.Tracker().List(nodesGVR, corev1.SchemeGroupVersion.WithKind("Node"), "")
	if err != nil {
		h.t.Fatal(err)
	}
	for _, n := range list.(*corev1.NodeList).Items {
		h.synced(n.Name)
	}
}

// sync reconciles one node on up-to-date caches.
func (h *harness) sync(name string) (time.Duration, error) {
	h.t.Helper()
	h.settle(name)
	return h.c.syncNode(h.ctx, name)
}

// drive reconciles name until it needs nothing more or max rounds pass, stepping the fake clock
// by each requeue. It fails the test on a reconcile error unless allowErr.
func (h *harness) drive(name string, max int) {
	h.t.Helper()
	for range max {
		requeue, err := h.sync(name)
		if err != nil {
			h.t.Fatalf("sync %s: %v", name, err)
		}
		if _, err := h.client.Tracker().Get(nodesGVR, "", name); apierrors.IsNotFound(err) {
			return
		}
		if requeue == 0 {
			return
		}
		h.clock.Step(requeue)
	}
}

func (h *harness) node(name string) *corev1.Node {
	h.t.Helper()
	n, err := h.client.CoreV1().Nodes().Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatalf("get node %s: %v", name, err)
	}
	return n
}

func (h *harness) nodeGone(name string) bool {
	_, err := h.client.Tracker().Get(nodesGVR, "", name)
	return apierrors.IsNotFound(err)
}

// events drains the recorded events ("Type Reason message").
func (h *harness) events() []string {
	var out []string
	for {
		select {
		case e := <-h.rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func hasEvent(events []string, reason string) bool {
	for _, e := range events {
		if f := strings.Fields(e); len(f) > 1 && f[1] == reason {
			return true
		}
	}
	return false
}

// --- fixtures ---

var instanceSeq atomic.Int64

type nodeOpt func(*corev1.Node)

func inZone(z string) nodeOpt {
	return func(n *corev1.Node) {
		n.Labels[corev1.LabelTopologyZone] = z
		n.Spec.ProviderID = strings.Replace(n.Spec.ProviderID, "us-east-1a", z, 1)
	}
}
func inPool(p string) nodeOpt {
	return func(n *corev1.Node) { n.Labels["karpenter.sh/nodepool"] = p }
}
func withAnnotation(k, v string) nodeOpt {
	return func(n *corev1.Node) { n.Annotations[k] = v }
}
func withProviderID(id string) nodeOpt {
	return func(n *corev1.Node) { n.Spec.ProviderID = id }
}
func inPhase(p decide.Phase) nodeOpt {
	return func(n *corev1.Node) {
		n.Annotations[decide.AnnotationState] = string(p)
		n.Annotations[decide.AnnotationReason] = decide.ReasonNodeSilent
		n.Annotations[decide.AnnotationPolicy] = config.DefaultPolicyName
		n.Annotations[decide.AnnotationStartedAt] = ts(t0.Add(-10 * time.Minute))
		if p != decide.PhaseMarked {
			n.Spec.Unschedulable = true
			n.Spec.Taints = withTaint(n.Spec.Taints)
		}
		if p == decide.PhaseDraining || p == decide.PhaseTerminating || p == decide.PhaseTerminated {
			n.Annotations[decide.AnnotationDrainStartedAt] = ts(t0.Add(-5 * time.Minute))
		}
		if p == decide.PhaseTerminating || p == decide.PhaseTerminated {
			n.Annotations[decide.AnnotationTerminationRequestedAt] = ts(t0.Add(-time.Minute))
		}
	}
}

// newNode returns a day-old Ready node in us-east-1a with an EC2 provider ID.
func newNode(name string, opts ...nodeOpt) *corev1.Node {
	id := fmt.Sprintf("i-%017x", instanceSeq.Add(1))
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:              name,
			UID:               types.UID("uid-" + name),
			CreationTimestamp: metav1.NewTime(t0.Add(-24 * time.Hour)),
			Labels:            map[string]string{corev1.LabelTopologyZone: "us-east-1a"},
			Annotations:       map[string]string{decide.AnnotationFirstReady: ts(t0.Add(-23 * time.Hour))},
		},
		Spec: corev1.NodeSpec{ProviderID: "aws:///us-east-1a/" + id},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(t0.Add(-23 * time.Hour)),
		}}},
	}
	for _, o := range opts {
		o(n)
	}
	return n
}

func instanceOf(n *corev1.Node) string {
	_, id, _ := providerid.Parse(n.Spec.ProviderID)
	return id
}

func newLease(ns, name string, renewed time.Time) *coordinationv1.Lease {
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(name),
			LeaseDurationSeconds: ptr.To[int32](40),
			RenewTime:            &metav1.MicroTime{Time: renewed},
		},
	}
	if ns != DefaultKubeletLeaseNamespace {
		l.Labels = map[string]string{LabelAgentNode: name}
	}
	return l
}

// healthy adds n with both heartbeats fresh; silent adds it with both stale for ten minutes.
func (h *harness) healthy(n *corev1.Node) *corev1.Node {
	h.add(n, newLease(DefaultKubeletLeaseNamespace, n.Name, t0), newLease(h.c.rc.AgentNamespace, n.Name, t0))
	h.cloud.addInstance(n, "running")
	return n
}

func (h *harness) silent(n *corev1.Node) *corev1.Node {
	old := t0.Add(-10 * time.Minute)
	h.add(n, newLease(DefaultKubeletLeaseNamespace, n.Name, old), newLease(h.c.rc.AgentNamespace, n.Name, old))
	h.cloud.addInstance(n, "running")
	return n
}

func newPod(ns, name, node string, opts ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{}},
		Spec:       corev1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: ptr.To[int64](30)},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

// --- fake EC2 ---

type fakeCloud struct {
	h  *harness
	mu sync.Mutex
	// instances maps ID → state; owned lists IDs carrying the cluster tag.
	instances  map[string]string
	owned      map[string]bool
	override   map[string]TerminateResult
	terminates []string
	describes  []string
	// stateAtTerminate records the node's recorded state when Terminate was called.
	stateAtTerminate []string
	// hideAfterTerminate makes Describe return not-found after a termination (eventual
	// consistency gone wrong).
	hideAfterTerminate bool
	// keepRunning makes EC2 accept terminations but keep reporting the instance running.
	keepRunning bool
	// describeErr and terminateErr fail the next calls for an instance (each entry is used
	// once, in order).
	describeErr  map[string][]error
	terminateErr map[string][]error
	// onDescribe runs (without the lock) before each Describe answers.
	onDescribe func(id string)
	// lifecycle and asg are the instances' instanceLifecycle and Auto Scaling group.
	lifecycle, asg map[string]string
}

func newFakeCloud() *fakeCloud {
	return &fakeCloud{instances: map[string]string{}, owned: map[string]bool{}, override: map[string]TerminateResult{},
		describeErr: map[string][]error{}, terminateErr: map[string][]error{}, lifecycle: map[string]string{}, asg: map[string]string{}}
}

func (f *fakeCloud) addInstance(n *corev1.Node, state string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if id := instanceOf(n); id != "" {
		f.instances[id] = state
		f.owned[id] = true
	}
}

func (f *fakeCloud) Terminate(_ context.Context, id string) (TerminateOutcome, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.terminates = append(f.terminates, id)
	if errs := f.terminateErr[id]; len(errs) > 0 {
		f.terminateErr[id] = errs[1:]
		return TerminateOutcome{Result: ResultFailed, Err: errs[0]}, nil
	}
	if f.h != nil {
		// Which node names this instance, and what does it say about itself right now?
		nodes, _ := f.h.client.Tracker().List(nodesGVR, corev1.SchemeGroupVersion.WithKind("Node"), "")
		for _, n := range nodes.(*corev1.NodeList).Items {
			if instanceOf(&n) == id {
				f.stateAtTerminate = append(f.stateAtTerminate, n.Annotations[decide.AnnotationState])
			}
		}
	}
	if r, ok := f.override[id]; ok {
		return TerminateOutcome{Result: r, Err: fmt.Errorf("fake %s", r)}, nil
	}
	st, ok := f.instances[id]
	switch {
	case !ok:
		return TerminateOutcome{Result: ResultNotFound, Err: fmt.Errorf("not found")}, nil
	case !f.owned[id]:
		return TerminateOutcome{Result: ResultNotOwned, Err: fmt.Errorf("not owned")}, nil
	case instanceGone(st):
		return TerminateOutcome{Result: ResultAlreadyTerminated, PreviousState: st, CurrentState: st}, nil
	}
	if !f.keepRunning {
		f.instances[id] = "shutting-down"
	}
	if f.hideAfterTerminate {
		delete(f.instances, id)
	}
	return TerminateOutcome{Result: ResultTerminating, PreviousState: st, CurrentState: "shutting-down"}, nil
}

func (f *fakeCloud) Describe(_ context.Context, id string) (Instance, bool, error) {
	if f.onDescribe != nil {
		f.onDescribe(id)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.describes = append(f.describes, id)
	if errs := f.describeErr[id]; len(errs) > 0 {
		f.describeErr[id] = errs[1:]
		return Instance{}, false, errs[0]
	}
	st, ok := f.instances[id]
	if !ok {
		return Instance{}, false, nil
	}
	return Instance{ID: id, State: st, Zone: "us-east-1a", Owned: f.owned[id], Lifecycle: f.lifecycle[id], AutoScalingGroup: f.asg[id]}, true, nil
}

func (f *fakeCloud) Terminates() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.terminates)
}

func (f *fakeCloud) Describes() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.describes)
}
