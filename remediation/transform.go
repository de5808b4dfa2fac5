package remediation

import (
	"context"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// annotationPrefix is the prefix of the annotations the remediator reads on Nodes.
const annotationPrefix = "nodevigil.io/"

// stripNode is the Node informer's transform. It drops what the remediator never reads so the
// cache stays small at 10,000 nodes: managed fields, the image list (often the largest part of
// a Node), attached volumes, addresses, capacities, system info, pod CIDRs and every annotation
// that is not nodevigil's. Labels, taints, providerID, unschedulable, conditions and the boot ID stay.
//
// Because cached Nodes are incomplete, the controller never Updates a Node from the cache: it
// only sends merge patches of the fields it owns, guarded by the resourceVersion.
func stripNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	n.ManagedFields = nil
	for k := range n.Annotations {
		if !strings.HasPrefix(k, annotationPrefix) {
			delete(n.Annotations, k)
		}
	}
	n.Status.Images = nil
	n.Status.VolumesAttached = nil
	n.Status.VolumesInUse = nil
	n.Status.Addresses = nil
	n.Status.Capacity = nil
	n.Status.Allocatable = nil
	// Only the boot ID of the system info is kept: it tells a reboot for an AWS event
	// (interruptions_act.go), about 40 bytes a node.
	n.Status.NodeInfo = corev1.NodeSystemInfo{BootID: n.Status.NodeInfo.BootID}
	n.Status.DaemonEndpoints = corev1.NodeDaemonEndpoints{}
	n.Status.Config = nil
	n.Status.RuntimeHandlers = nil
	n.Status.Features = nil
	n.Spec.PodCIDR = ""
	n.Spec.PodCIDRs = nil
	return n, nil
}

// stripLease is the Lease informers' transform. The remediator reads a Lease's name,
// resourceVersion, renewTime and duration (and acquireTime, quoted in a message when renewTime
// is unset); everything else goes. At 10,000 nodes there are 20,000 Leases, so each dropped
// allocation counts: the UID, the holder identity, the transition count, the agent Leases' label
// (selected on by the API server; never read from the cache) and the kubelet Leases' owner
// reference.
func stripLease(obj any) (any, error) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return obj, nil
	}
	l.ManagedFields = nil
	l.Annotations = nil
	l.Labels = nil
	l.OwnerReferences = nil
	l.UID = ""
	l.Spec.HolderIdentity = nil
	l.Spec.LeaseTransitions = nil
	l.Spec.Strategy = nil
	l.Spec.PreferredHolder = nil
	if l.Spec.RenewTime != nil {
		l.Spec.AcquireTime = nil
	}
	return l, nil
}

// The transforms above are also applied to every object as it arrives on a watch, before
// client-go stores it anywhere (strippedInformer). The informer's own transform is not enough
// for the initial list: with streaming lists (the WatchListClient feature, on in the binary) the
// reflector collects the whole initial stream in a temporary store and hands it to the informer
// only when the stream ends, and client-go 0.34 applies the informer's transform to that store
// only if the informer's queue is a cache.TransformingStore — which its default queue, RealFIFO
// (the InOrderInformers feature, on by default), is not: it implements no Get or List. So
// every Node stayed whole (~15 KB at 30 images, managed fields and all) until the last one
// arrived, and was stripped only then: at 10,000 nodes, 147 MB live at the end of the stream
// against 30 MB after (docs/benchmarks.md). Stripping in the watch itself bounds the start-up
// heap by the stripped cache, whatever client-go's queue is; the informer's transform still
// runs (on an already stripped object: a few map lookups) and covers a plain LIST, which a
// reflector falls back to when the API server refuses streaming.

// strippedInformer returns an informer of objects of example's type listed by list and watched
// by watch, whose watch events pass through strip before the reflector sees them. It has no
// indexes: the remediator looks Nodes and Leases up by name, and the namespace index client-go's
// generated informers add would cost a map entry per object for nothing (each Lease informer
// watches one namespace; Nodes have none).
func strippedInformer(example runtime.Object, resync time.Duration, strip cache.TransformFunc,
	list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error),
) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: list,
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w, err := watchFn(ctx, o)
			if err != nil {
				return nil, err
			}
			return newStrippingWatch(w, strip), nil
		},
	}
	return cache.NewSharedIndexInformer(lw, example, resync, cache.Indexers{})
}

// nodeInformer returns the constructor (for SharedInformerFactory.InformerFor) of the informer
// of the Nodes that match the label selector (empty: all); see strippedInformer.
func nodeInformer(selector string) func(kubernetes.Interface, time.Duration) cache.SharedIndexInformer {
	return func(client kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		nodes := client.CoreV1().Nodes()
		return strippedInformer(&corev1.Node{}, resync, stripNode,
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				selectBy(&o, selector)
				return nodes.List(ctx, o)
			},
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				selectBy(&o, selector)
				return nodes.Watch(ctx, o)
			})
	}
}

// selectBy sets o's label selector to selector, unless that is empty (everything).
func selectBy(o *metav1.ListOptions, selector string) {
	if selector != "" {
		o.LabelSelector = selector
	}
}

// leaseInformer returns the constructor (for SharedInformerFactory.InformerFor) of an informer of the Leases in namespace
// ns that match the label selector (empty: all); see strippedInformer.
func leaseInformer(ns, selector string) func(kubernetes.Interface, time.Duration) cache.SharedIndexInformer {
	return func(client kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		leases := client.CoordinationV1().Leases(ns)
		return strippedInformer(&coordinationv1.Lease{}, resync, stripLease,
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				selectBy(&o, selector)
				return leases.List(ctx, o)
			},
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				selectBy(&o, selector)
				return leases.Watch(ctx, o)
			})
	}
}

// strippingWatch passes the events of a watch on, applying strip to the object of every
// Added, Modified and Deleted event. Bookmarks pass untouched: the one that ends a streaming
// list carries its news in an annotation (k8s.io/initial-events-end) that stripNode would drop.
// Unlike watch.Filter, its goroutine ends when Stop is called even if nobody reads any more.
type strippingWatch struct {
	in    watch.Interface
	out   chan watch.Event
	strip cache.TransformFunc
	stop  chan struct{}
	once  sync.Once
}

func newStrippingWatch(in watch.Interface, strip cache.TransformFunc) *strippingWatch {
	w := &strippingWatch{in: in, out: make(chan watch.Event), strip: strip, stop: make(chan struct{})}
	go w.run()
	return w
}

func (w *strippingWatch) run() {
	defer close(w.out)
	for {
		var e watch.Event
		select {
		case <-w.stop:
			return
		case ev, ok := <-w.in.ResultChan():
			if !ok {
				return
			}
			e = ev
		}
		switch e.Type {
		case watch.Added, watch.Modified, watch.Deleted:
			// A strip error leaves the object whole; the informer's transform runs again.
			if obj, err := w.strip(e.Object); err == nil {
				if ro, ok := obj.(runtime.Object); ok {
					e.Object = ro
				}
			}
		}
		select {
		case w.out <- e:
		case <-w.stop:
			return
		}
	}
}

// Stop stops the watch underneath and the goroutine passing its events on.
func (w *strippingWatch) Stop() {
	w.once.Do(func() {
		close(w.stop)
		w.in.Stop()
	})
}

// ResultChan returns the stripped events; it is closed when the watch underneath ends or Stop
// is called.
func (w *strippingWatch) ResultChan() <-chan watch.Event { return w.out }
