package remediation

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// seenRenewing waits until the controller's Lease observer has seen l (the informer delivers
// asynchronously), then makes it remember the change at l's renewTime: the fixtures say "renewed
// at t" and mean that this remediator saw it renew then, with no clock skew.
func (h *harness) seenRenewing(l *coordinationv1.Lease) {
	h.t.Helper()
	obs := h.c.agentObs
	if l.Namespace == DefaultKubeletLeaseNamespace {
		obs = h.c.kubeletObs
	}
	fp := fingerprint(l)
	deadline := time.Now().Add(5 * time.Second)
	for {
		obs.mu.Lock()
		ob, ok := obs.seen[l.Name]
		if ok && ob.fp == fp {
			if l.Spec.RenewTime != nil {
				ob.at = l.Spec.RenewTime.UnixNano()
				obs.seen[l.Name] = ob
			}
			obs.mu.Unlock()
			return
		}
		obs.mu.Unlock()
		if time.Now().After(deadline) {
			h.t.Fatalf("lease %s/%s never observed", l.Namespace, l.Name)
		}
		time.Sleep(time.Millisecond)
	}
}

func obsLease(name, rv string, renew time.Time) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv},
		Spec:       coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: renew}, LeaseDurationSeconds: ptr.To[int32](40)},
	}
}

// TestLeaseObserver: a Lease's last change is the observer's time of the first event that
// showed a new resourceVersion or renewTime; repeats (resyncs, relists) change nothing,
// whatever time the node's clock wrote.
func TestLeaseObserver(t *testing.T) {
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	type step struct {
		rv      string
		renew   time.Time
		now     int // seconds after t0
		changed bool
		last    int // expected lastChange after the step, seconds after t0
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"first sight is a change", []step{{"1", at(0), 0, true, 0}}},
		{"resync of the same object is no change", []step{{"1", at(0), 0, true, 0}, {"1", at(0), 30, false, 0}}},
		{"renewal seen later", []step{{"1", at(0), 0, true, 0}, {"2", at(10), 12, true, 12}}},
		{"node clock 10 min ahead: the observer's time counts", []step{{"1", at(600), 0, true, 0}, {"2", at(610), 10, true, 10}}},
		{"node clock 10 min behind: the observer's time counts", []step{{"1", at(-600), 0, true, 0}, {"2", at(-590), 10, true, 10}}},
		{"renewTime stepping backwards is a change", []step{{"1", at(100), 0, true, 0}, {"2", at(50), 10, true, 10}}},
		{"same renewTime, new resourceVersion: a write, a change", []step{{"1", at(0), 0, true, 0}, {"2", at(0), 10, true, 10}}},
		{"renewTime claims a renewal the resourceVersion denies: still a change", []step{{"1", at(0), 0, true, 0}, {"1", at(10), 10, true, 10}}},
		{"nothing new for an hour", []step{{"1", at(0), 0, true, 0}, {"1", at(0), 3600, false, 0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := newLeaseObserver()
			for i, s := range tt.steps {
				changed, _ := o.observe(obsLease("n", s.rv, s.renew), at(s.now))
				if changed != s.changed {
					t.Errorf("step %d: changed = %v, want %v", i, changed, s.changed)
				}
				if got := o.lastChange("n"); !got.Equal(at(s.last)) {
					t.Errorf("step %d: lastChange = %s, want %s", i, got, at(s.last))
				}
			}
		})
	}
}

func TestLeaseObserverForget(t *testing.T) {
	o := newLeaseObserver()
	o.observe(obsLease("a", "1", t0), t0)
	o.observe(obsLease("b", "1", t0), t0)
	if o.size() != 2 {
		t.Fatalf("size = %d, want 2", o.size())
	}
	o.forget("a")
	o.forget("never-seen")
	if o.size() != 1 || !o.lastChange("a").IsZero() {
		t.Errorf("after forget: size %d, lastChange(a) %s", o.size(), o.lastChange("a"))
	}
	// A Lease re-created after its deletion is a first sight again.
	if changed, prev := o.observe(obsLease("a", "1", t0), t0.Add(time.Minute)); !changed || !prev.IsZero() {
		t.Errorf("re-created lease: changed %v prev %s, want a first sight", changed, prev)
	}
}
