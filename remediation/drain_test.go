package remediation

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/nodevigil/nodevigil/remediation/decide"
)

// drainAPI answers a drainPass's evictions over a fake clientset the way the API server does
// for the cases a drain meets: accepted (the pod is deleted), refused by a PodDisruptionBudget
// (429), already gone (404) or failed otherwise (500). It records the evictions asked for.
type drainAPI struct {
	refused, gone, broken map[string]bool // pod refs

	mu    sync.Mutex
	asked []string
}

func (d *drainAPI) react(a k8stesting.Action) (bool, runtime.Object, error) {
	c, ok := a.(k8stesting.CreateActionImpl)
	if !ok || c.Subresource != "eviction" {
		return false, nil, nil
	}
	name := c.Object.(metav1.Object).GetName()
	ref := c.Namespace + "/" + name
	d.mu.Lock()
	d.asked = append(d.asked, ref)
	d.mu.Unlock()
	switch {
	case d.refused[ref]:
		return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	case d.gone[ref]:
		return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, name)
	case d.broken[ref]:
		return true, nil, apierrors.NewInternalError(errors.New("etcd timeout"))
	}
	return true, nil, nil // accepted: the pod now terminates (drainPass does not look at it again in this pass)
}

// TestDrainPass drives one pass of the drain over the pods of node n and checks what it
// evicts and what it reports. now is fixed: drainPass takes the time as an argument.
func TestDrainPass(t *testing.T) {
	const retry = 5 * time.Second
	now := t0
	at := func(d time.Duration) time.Time { return now.Add(d) }
	pod := func(name string, opts ...func(*corev1.Pod)) *corev1.Pod { return newPod("app", name, "n", opts...) }
	dnd := func(p *corev1.Pod) { p.Annotations[decide.AnnotationDoNotDisrupt] = "true" }
	grace := func(s int64) func(*corev1.Pod) {
		return func(p *corev1.Pod) { p.Spec.TerminationGracePeriodSeconds = ptr.To(s) }
	}
	deleting := func(d time.Duration) func(*corev1.Pod) {
		return func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: at(d)} }
	}
	daemon := func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "ds", UID: "u", Controller: ptr.To(true)}}
	}
	mirror := func(p *corev1.Pod) { p.Annotations[mirrorPodAnnotation] = "x" }
	finished := func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }

	tests := []struct {
		name     string
		pods     []*corev1.Pod
		mode     doNotDisruptMode
		deadline time.Duration // from now; 0: none
		refused  []string      // pod names whose eviction a PDB refuses
		gone     []string      // pod names already deleted when evicted
		broken   []string      // pod names whose eviction fails with a 500
		// wantEvict lists the pods evicted, in order; want is the report, failed reduced to the
		// pod references.
		wantEvict []string
		want      drainState
	}{
		{
			name:      "plain pods are evicted and waited for until their grace period ends",
			pods:      []*corev1.Pod{pod("a"), pod("b", grace(60))},
			wantEvict: []string{"a", "b"},
			want:      drainState{requeue: 60 * time.Second, evicted: 2, terminatingUntil: at(60 * time.Second), terminating: []string{"app/a", "app/b"}},
		},
		{
			name: "DaemonSet, mirror and finished pods and other nodes' pods are left alone",
			pods: []*corev1.Pod{pod("ds", daemon), pod("static", mirror), pod("job", finished), newPod("app", "elsewhere", "m")},
			want: drainState{done: true},
		},
		{
			name:      "a pod with no grace period is drained as soon as its eviction is accepted",
			pods:      []*corev1.Pod{pod("a", grace(0))},
			wantEvict: []string{"a"},
			want:      drainState{done: true, evicted: 1},
		},
		{
			name: "a terminating pod is waited for until its deletion timestamp, not evicted again",
			pods: []*corev1.Pod{pod("a", deleting(20*time.Second)), pod("old", deleting(-time.Second))},
			want: drainState{requeue: 20 * time.Second, terminatingUntil: at(20 * time.Second), terminating: []string{"app/a"}},
		},
		{
			name:      "an eviction refused by a PodDisruptionBudget (429) is retried at the retry interval",
			pods:      []*corev1.Pod{pod("a"), pod("b", grace(0))},
			refused:   []string{"a"},
			deadline:  10 * time.Minute,
			wantEvict: []string{"a", "b"},
			want:      drainState{requeue: retry, evicted: 1, refused: []string{"app/a"}},
		},
		{
			name:      "an eviction failing otherwise is retried and reported as failed",
			pods:      []*corev1.Pod{pod("a")},
			broken:    []string{"a"},
			wantEvict: []string{"a"},
			want:      drainState{requeue: retry, failed: []string{"app/a"}},
		},
		{
			name:      "a pod already gone (404) counts as drained",
			pods:      []*corev1.Pod{pod("a")},
			gone:      []string{"a"},
			wantEvict: []string{"a"},
			want:      drainState{done: true},
		},
		{
			name:      "evict mode: a do-not-disrupt pod is evicted like any other",
			pods:      []*corev1.Pod{pod("precious", dnd, grace(0))},
			mode:      dndEvict,
			wantEvict: []string{"precious"},
			want:      drainState{done: true, evicted: 1},
		},
		{
			name:      "hold mode: a do-not-disrupt pod is not evicted and holds the drain",
			pods:      []*corev1.Pod{pod("precious", dnd), pod("a", grace(0))},
			mode:      dndHold,
			deadline:  10 * time.Minute,
			wantEvict: []string{"a"},
			want:      drainState{requeue: retry, evicted: 1, held: []string{"app/precious"}},
		},
		{
			name:      "keep mode: a do-not-disrupt pod is neither evicted nor waited for",
			pods:      []*corev1.Pod{pod("precious", dnd), pod("a", grace(0))},
			mode:      dndKeep,
			deadline:  2 * time.Minute,
			wantEvict: []string{"a"},
			want:      drainState{done: true, evicted: 1, kept: []string{"app/precious"}},
		},
		{
			name:      "last mode: a do-not-disrupt pod waits while other pods are on the node",
			pods:      []*corev1.Pod{pod("precious", dnd), pod("a", grace(0))},
			mode:      dndLast,
			deadline:  2 * time.Minute,
			wantEvict: []string{"a"},
			want:      drainState{requeue: retry, evicted: 1, deferred: []string{"app/precious"}},
		},
		{
			name:     "last mode: a pod of another owner still terminating defers the do-not-disrupt pod",
			pods:     []*corev1.Pod{pod("precious", dnd), pod("a", deleting(10*time.Second))},
			mode:     dndLast,
			deadline: 2 * time.Minute,
			want:     drainState{requeue: retry, terminatingUntil: at(10 * time.Second), terminating: []string{"app/a"}, deferred: []string{"app/precious"}},
		},
		{
			name:      "last mode: the do-not-disrupt pod is evicted once the others have left",
			pods:      []*corev1.Pod{pod("precious", dnd), pod("other", dnd, deleting(10*time.Second))},
			mode:      dndLast,
			deadline:  2 * time.Minute,
			wantEvict: []string{"precious"},
			want: drainState{requeue: 30 * time.Second, evicted: 1, terminatingUntil: at(30 * time.Second),
				terminating: []string{"app/other", "app/precious"}, lastEvicted: []string{"app/precious"}},
		},
		{
			name:      "last mode: the do-not-disrupt pod is evicted early when the deadline is one grace period away",
			pods:      []*corev1.Pod{pod("precious", dnd), pod("a", grace(0)), pod("pdb", grace(0))},
			mode:      dndLast,
			deadline:  20 * time.Second,
			refused:   []string{"pdb"},
			wantEvict: []string{"a", "pdb", "precious"},
			want: drainState{requeue: retry, evicted: 2, terminatingUntil: at(30 * time.Second), terminating: []string{"app/precious"},
				refused: []string{"app/pdb"}, lastEvicted: []string{"app/precious"}, early: true},
		},
		{
			name:      "last mode: the next look is no later than the do-not-disrupt pod's latest eviction",
			pods:      []*corev1.Pod{pod("precious", dnd, grace(118)), pod("slow", grace(300))},
			mode:      dndLast,
			deadline:  2 * time.Minute,
			wantEvict: []string{"slow"},
			want: drainState{requeue: 2 * time.Second, evicted: 1, terminatingUntil: at(300 * time.Second),
				terminating: []string{"app/slow"}, deferred: []string{"app/precious"}},
		},
		{
			name:      "the deadline bounds the wait for a long grace period",
			pods:      []*corev1.Pod{pod("slow", grace(300))},
			deadline:  time.Minute,
			wantEvict: []string{"slow"},
			want:      drainState{requeue: time.Minute, evicted: 1, terminatingUntil: at(300 * time.Second), terminating: []string{"app/slow"}},
		},
		{
			name:      "past the deadline the pass says so and still retries",
			pods:      []*corev1.Pod{pod("a")},
			refused:   []string{"a"},
			deadline:  -time.Second,
			wantEvict: []string{"a"},
			want:      drainState{requeue: retry, pastDeadline: true, refused: []string{"app/a"}},
		},
		{
			name:      "hold mode past the deadline: still not evicted, past the deadline",
			pods:      []*corev1.Pod{pod("precious", dnd)},
			mode:      dndHold,
			deadline:  -time.Second,
			wantEvict: nil,
			want:      drainState{requeue: retry, pastDeadline: true, held: []string{"app/precious"}},
		},
	}
	set := func(names []string) map[string]bool {
		m := map[string]bool{}
		for _, n := range names {
			m["app/"+n] = true
		}
		return m
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset()
			api := &drainAPI{refused: set(tt.refused), gone: set(tt.gone), broken: set(tt.broken)}
			client.PrependReactor("create", "pods", api.react)
			for _, p := range tt.pods {
				if _, err := client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			c := &Controller{client: client, log: discardLogger(), cfg: Config{DrainRetryInterval: retry}}
			opts := drainOptions{doNotDisrupt: tt.mode}
			if tt.deadline != 0 {
				opts.deadline = at(tt.deadline)
			}
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
			got, err := c.drainPass(context.Background(), node, opts, now)
			if err != nil {
				t.Fatalf("drainPass: %v", err)
			}
			// The fake lists pods in no fixed order; the report's lists are compared as sets.
			for i, f := range got.failed {
				got.failed[i], _, _ = strings.Cut(f, ": ")
			}
			for _, l := range [][]string{got.terminating, got.refused, got.failed, got.held, got.deferred, got.lastEvicted, got.kept, api.asked} {
				slices.Sort(l)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("drainPass reports\n %+v\nwant\n %+v", got, tt.want)
			}
			var want []string
			for _, n := range tt.wantEvict {
				want = append(want, "app/"+n)
			}
			if !reflect.DeepEqual(api.asked, want) {
				t.Errorf("evicted %q, want %q", api.asked, want)
			}
		})
	}
}

// TestDrainPassListError: a failed pod list is the pass's error, naming the node, and nothing
// is evicted.
func TestDrainPassListError(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("apiserver restarting")
	})
	c := &Controller{client: client, log: discardLogger(), cfg: Config{DrainRetryInterval: time.Second}}
	_, err := c.drainPass(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}, drainOptions{}, t0)
	if !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), "node n") {
		t.Fatalf("err = %v, want the list's ServiceUnavailable naming node n", err)
	}
}
