package remediation

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/nodevigil/nodevigil/remediation/decide"
)

// fullNode is a Node as a kubelet registers it, with the parts stripNode drops.
func fullNode(name string) *corev1.Node {
	n := newNode(name)
	n.ResourceVersion = "1"
	n.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate}}
	n.Annotations = map[string]string{"node.alpha.kubernetes.io/ttl": "0", decide.AnnotationFirstReady: "2026-01-01T00:00:00Z"}
	n.Status.Images = []corev1.ContainerImage{{Names: []string{"registry.example/app@sha256:0123"}, SizeBytes: 1 << 20}}
	n.Status.NodeInfo = corev1.NodeSystemInfo{BootID: "boot-1", KernelVersion: "6.1"}
	return n
}

func stripped(n *corev1.Node) error {
	switch {
	case n.Status.Images != nil:
		return fmt.Errorf("%s keeps its %d images", n.Name, len(n.Status.Images))
	case n.ManagedFields != nil:
		return fmt.Errorf("%s keeps its managed fields", n.Name)
	case n.Annotations["node.alpha.kubernetes.io/ttl"] != "":
		return fmt.Errorf("%s keeps a foreign annotation", n.Name)
	case n.Annotations[decide.AnnotationFirstReady] == "" || n.Status.NodeInfo.BootID != "boot-1":
		return fmt.Errorf("%s lost what the remediator reads: %v, %+v", n.Name, n.Annotations, n.Status.NodeInfo)
	}
	return nil
}

// TestInitialListIsStrippedAsItStreams: with streaming lists (as the binary runs), each Node of
// the initial list is stripped as it arrives, not when the list ends — at 10,000 nodes that was
// the difference between 147 MB and 30 MB live at the end of start-up (client-go's temporary
// store of the stream does not apply the informer's transform; transform.go). The list's end
// (a bookmark whose news is an annotation) still reaches the reflector, so the informer syncs.
func TestInitialListIsStrippedAsItStreams(t *testing.T) {
	clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, true)
	client := fake.NewClientset()
	streams := make(chan *watch.FakeWatcher, 1)
	client.PrependWatchReactor("nodes", func(a k8stesting.Action) (bool, watch.Interface, error) {
		w := watch.NewFake() // unbuffered: Add returns once the event is taken
		streams <- w
		return true, w, nil
	})
	client.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		t.Error("the Node informer listed: the streaming list was not used")
		return false, nil, nil
	})
	c, err := New(Config{Client: client, Clock: testingclock.NewFakeClock(t0), Recorder: record.NewFakeRecorder(10), Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		c.factories[0].Shutdown()
	})
	c.factories[0].Start(ctx.Done()) // the Node informer alone

	var w *watch.FakeWatcher
	select {
	case w = <-streams:
	case <-time.After(30 * time.Second):
		t.Fatal("the Node informer never watched")
	}
	sent := make([]*corev1.Node, 5)
	for i := range sent {
		sent[i] = fullNode(fmt.Sprintf("n%d", i))
		w.Add(sent[i])
	}
	// Each Add returned once the previous event was stripped and passed on (one goroutine, one
	// event at a time), so every Node but the last has been stripped by now — while the stream
	// is still open and nothing has reached the informer's cache.
	for _, n := range sent[:len(sent)-1] {
		if err := stripped(n); err != nil {
			t.Errorf("before the initial list ended: %v", err)
		}
	}
	if c.synced[0]() {
		t.Fatal("synced before the initial list ended")
	}
	w.Action(watch.Bookmark, &corev1.Node{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "2",
		Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}})
	if !cache.WaitForCacheSync(waitCtx(t, 30*time.Second).Done(), c.synced[0]) {
		t.Fatal("the informer did not sync after the bookmark that ends the initial list")
	}
	cached, err := c.nodes.List(labels.Everything())
	if err != nil || len(cached) != len(sent) {
		t.Fatalf("cache holds %d Nodes (%v), want %d", len(cached), err, len(sent))
	}
	for _, n := range cached {
		if err := stripped(n); err != nil {
			t.Errorf("in the cache: %v", err)
		}
	}
	// Later events are stripped too.
	late := fullNode("late")
	late.ResourceVersion = "3"
	w.Modify(late)
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := c.nodes.Get("late")
		if err == nil {
			if err := stripped(n); err != nil {
				t.Error(err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the modified Node never reached the cache")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestStrippingWatch: Bookmarks and errors pass untouched, the result closes when the watch
// underneath ends, and Stop ends the goroutine even while nobody reads.
func TestStrippingWatch(t *testing.T) {
	for _, tc := range []struct {
		name  string
		event watch.Event
		// stripped says whether the event's object must come out stripped.
		stripped bool
	}{
		{"added", watch.Event{Type: watch.Added, Object: fullNode("a")}, true},
		{"modified", watch.Event{Type: watch.Modified, Object: fullNode("m")}, true},
		{"deleted", watch.Event{Type: watch.Deleted, Object: fullNode("d")}, true},
		{"bookmark", watch.Event{Type: watch.Bookmark, Object: &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			ResourceVersion: "9", Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}}, false},
		{"error", watch.Event{Type: watch.Error, Object: &metav1.Status{Message: "gone"}}, false},
		{"lease", watch.Event{Type: watch.Added, Object: &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
			Name: "l", Annotations: map[string]string{"x": "y"}}}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := watch.NewFakeWithChanSize(1, false)
			strip := func(o any) (any, error) {
				if _, ok := o.(*coordinationv1.Lease); ok {
					return stripLease(o)
				}
				return stripNode(o)
			}
			w := newStrippingWatch(in, strip)
			in.Action(tc.event.Type, tc.event.Object)
			var got watch.Event
			select {
			case got = <-w.ResultChan():
			case <-time.After(30 * time.Second):
				t.Fatal("no event passed on")
			}
			if got.Type != tc.event.Type || got.Object != tc.event.Object {
				t.Fatalf("passed on %v %T, want %v %T", got.Type, got.Object, tc.event.Type, tc.event.Object)
			}
			switch o := got.Object.(type) {
			case *corev1.Node:
				if tc.stripped {
					if err := stripped(o); err != nil {
						t.Error(err)
					}
				} else if o.Annotations[metav1.InitialEventsAnnotationKey] != "true" {
					t.Errorf("bookmark annotations %v: the end of the initial list was stripped", o.Annotations)
				}
			case *coordinationv1.Lease:
				if o.Annotations != nil {
					t.Errorf("lease annotations %v kept", o.Annotations)
				}
			}
			in.Stop()
			select {
			case _, open := <-w.ResultChan():
				if open {
					t.Fatal("an event after the watch underneath ended")
				}
			case <-time.After(30 * time.Second):
				t.Fatal("result not closed after the watch underneath ended")
			}
		})
	}
	t.Run("stop while nobody reads", func(t *testing.T) {
		in := watch.NewFakeWithChanSize(1, false)
		w := newStrippingWatch(in, stripNode)
		in.Add(fullNode("unread")) // taken by the goroutine, which then waits to pass it on
		w.Stop()
		if !in.IsStopped() {
			t.Error("the watch underneath was not stopped")
		}
		select {
		case <-drained(w.ResultChan()):
		case <-time.After(30 * time.Second):
			t.Fatal("the goroutine did not end after Stop")
		}
		w.Stop() // twice is harmless
	})
}

// drained returns a channel closed once ch is closed (reading and dropping whatever is left).
func drained(ch <-chan watch.Event) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		for range ch {
		}
		close(done)
	}()
	return done
}

// TestStripLease: what the remediator reads of a Lease stays, the rest goes.
func TestStripLease(t *testing.T) {
	renewed := metav1.NewMicroTime(t0)
	for _, tc := range []struct {
		name string
		in   *coordinationv1.Lease
		// acquire says whether acquireTime must stay (quoted in messages when renewTime is unset).
		acquire bool
	}{
		{"renewed", fullLease(&renewed), false},
		{"never renewed", fullLease(nil), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := stripLease(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			l := out.(*coordinationv1.Lease)
			if l.UID != "" || l.Labels != nil || l.Annotations != nil || l.OwnerReferences != nil || l.ManagedFields != nil ||
				l.Spec.HolderIdentity != nil || l.Spec.LeaseTransitions != nil {
				t.Errorf("kept what nothing reads: %+v", l)
			}
			if l.Name != "n1" || l.Namespace != DefaultKubeletLeaseNamespace || l.ResourceVersion != "7" ||
				l.Spec.LeaseDurationSeconds == nil || (l.Spec.RenewTime == nil) != (tc.in.Spec.RenewTime == nil) {
				t.Errorf("dropped what the remediator reads: %+v", l)
			}
			if (l.Spec.AcquireTime != nil) != tc.acquire {
				t.Errorf("acquireTime kept = %v, want %v", l.Spec.AcquireTime != nil, tc.acquire)
			}
		})
	}
	if x, _ := stripLease("not a lease"); x != "not a lease" {
		t.Error("non-Lease object changed")
	}
}

func fullLease(renewed *metav1.MicroTime) *coordinationv1.Lease {
	acquired := metav1.NewMicroTime(t0.Add(-time.Hour))
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Namespace: DefaultKubeletLeaseNamespace, ResourceVersion: "7", UID: "u-1",
			Labels: map[string]string{LabelAgentNode: "n1"}, Annotations: map[string]string{"a": "b"},
			OwnerReferences: []metav1.OwnerReference{{Kind: "Node", Name: "n1"}},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("n1"), LeaseDurationSeconds: ptr.To[int32](40),
			AcquireTime: &acquired, RenewTime: renewed, LeaseTransitions: ptr.To[int32](3)},
	}
}
