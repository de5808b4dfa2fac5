package interruptions_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// podWithGrace creates a pod bound to node with a short termination grace period, optionally
// annotated do-not-disrupt. With no kubelet, an evicted pod keeps its deletionTimestamp
// (eviction time + grace) for the test to read.
func (e *env) podWithGrace(node string, doNotDisrupt bool, grace int64) *corev1.Pod {
	e.t.Helper()
	e.eventually("the default ServiceAccount", 30*time.Second, func(ctx context.Context) (bool, error) {
		_, err := e.client.CoreV1().ServiceAccounts(e.ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "workload-", Namespace: e.ns},
		Spec: corev1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: ptr.To(grace),
			Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}}},
	}
	if doNotDisrupt {
		pod.Annotations = map[string]string{"karpenter.sh/do-not-disrupt": "true"}
	}
	created, err := e.client.CoreV1().Pods(e.ns).Create(e.t.Context(), pod, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create pod: %v", err)
	}
	return created
}

// deletionAt returns the pod's deletionTimestamp as the API server set it, zero if none.
func (e *env) deletionAt(ctx context.Context, pod *corev1.Pod) time.Time {
	p, err := e.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil || p.DeletionTimestamp == nil {
		return time.Time{}
	}
	return p.DeletionTimestamp.Time
}

// TestSpotNoticeEvictsDoNotDisruptLast: a spot notice on a general node with two plain pods
// and one annotated karpenter.sh/do-not-disrupt=true. With the default
// interruptions.doNotDisruptPods (EvictLast) the plain pods are evicted first and the annotated
// one only after their grace period ended — read from the API server's deletionTimestamps
// (eviction time + grace), not from logs; with Keep it is never evicted. The pool's
// drain.honorDoNotDisrupt is true in both: it governs remediation's drains, not AWS's.
func TestSpotNoticeEvictsDoNotDisruptLast(t *testing.T) {
	for _, tc := range []struct {
		name, policy string
		evictDND     bool
	}{
		{"EvictLast", "", true},
		{"Keep", "interruptions: {doNotDisruptPods: Keep}", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			n := e.addNode("spot")
			const grace = 2
			plain := []*corev1.Pod{e.podWithGrace(n.name, false, grace), e.podWithGrace(n.name, false, grace)}
			dnd := e.podWithGrace(n.name, true, grace)
			e.start(tc.policy)
			e.spotNotice(n)
			var plainAt []time.Time
			e.eventually("both plain pods evicted", 40*time.Second, func(ctx context.Context) (bool, error) {
				plainAt = plainAt[:0]
				for _, p := range plain {
					if at := e.deletionAt(ctx, p); !at.IsZero() {
						plainAt = append(plainAt, at)
					}
				}
				return len(plainAt) == 2, nil
			})
			if !tc.evictDND {
				e.eventually("the drain reported done", 40*time.Second, func(context.Context) (bool, error) {
					return e.hasEvent(n.name, "InterruptionDrained"), nil
				})
				if at := e.deletionAt(t.Context(), dnd); !at.IsZero() {
					t.Fatalf("do-not-disrupt pod evicted (deletionTimestamp %s) with doNotDisruptPods Keep", at)
				}
				return
			}
			var dndAt time.Time
			e.eventually("the do-not-disrupt pod evicted", 40*time.Second, func(ctx context.Context) (bool, error) {
				dndAt = e.deletionAt(ctx, dnd)
				return !dndAt.IsZero(), nil
			})
			for _, at := range plainAt {
				// Evicted after the plain pod's grace ended: its deletionTimestamp is at least a
				// grace period later (timestamps have whole seconds).
				if !dndAt.After(at) {
					t.Errorf("do-not-disrupt pod's deletionTimestamp %s is not after a plain pod's %s: not evicted last", dndAt, at)
				}
			}
			t.Logf("plain pods' deletionTimestamps %v, the do-not-disrupt pod's %s", plainAt, dndAt)
		})
	}
}
