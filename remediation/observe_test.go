package remediation

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
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
			o := newLeaseObserver(40 * time.Second)
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
	o := newLeaseObserver(40 * time.Second)
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

// TestLeaseObserverBlindness: an observer that knows Leases and has seen none change for its
// gap is blind; the first change after such a gap is a resumption. Shorter quiet spells are
// neither.
func TestLeaseObserverBlindness(t *testing.T) {
	const gap = 40 * time.Second
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	type event struct {
		name, rv string
		now      int
	}
	tests := []struct {
		name        string
		events      []event
		query       int
		wantBlind   bool
		wantResumed int // -1: never
	}{
		{"no leases: never blind", nil, 3600, false, -1},
		{"renewing every 10s", []event{{"a", "1", 0}, {"a", "2", 10}, {"a", "3", 20}}, 30, false, -1},
		{"quiet for less than the gap", []event{{"a", "1", 0}}, 39, false, -1},
		{"quiet for the gap: blind", []event{{"a", "1", 0}}, 40, true, -1},
		{"ten minutes without a change: blind", []event{{"a", "1", 0}, {"b", "1", 5}}, 605, true, -1},
		{"one Lease renewing keeps the observer seeing", []event{{"a", "1", 0}, {"b", "1", 0}, {"a", "2", 30}, {"a", "3", 60}}, 90, false, -1},
		{"changes again after ten minutes: resumed then", []event{{"a", "1", 0}, {"a", "2", 600}}, 601, false, 600},
		{"a 39s pause is no gap", []event{{"a", "1", 0}, {"a", "2", 39}}, 40, false, -1},
		{"repeats (relist, resync) are no change and resume nothing", []event{{"a", "1", 0}, {"a", "1", 600}}, 601, true, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := newLeaseObserver(gap)
			for _, e := range tt.events {
				o.observe(obsLease(e.name, e.rv, t0), at(e.now))
			}
			blind, _, resumed := o.blindness(at(tt.query))
			if blind != tt.wantBlind {
				t.Errorf("blind = %v, want %v", blind, tt.wantBlind)
			}
			want := time.Time{}
			if tt.wantResumed >= 0 {
				want = at(tt.wantResumed)
			}
			if !resumed.Equal(want) {
				t.Errorf("resumed = %s, want %s", resumed, want)
			}
		})
	}
}

// withBlindness turns the blindness rule back on in a harness (newHarness turns it off).
func (h *harness) withBlindness() {
	for _, o := range []*leaseObserver{h.c.kubeletObs, h.c.agentObs} {
		o.mu.Lock()
		o.gap = 40 * time.Second
		o.mu.Unlock()
	}
}

// TestOutageDoesNotCountTowardStaleness: while the API server is unreachable no Lease changes
// in the cache, and after it every Lease has been "unobserved" for the whole outage. Time this
// replica could not observe must not count: during the outage nothing is judged, and after it
// the remediator observes from zero like a new leader — the node that kept renewing is never
// touched, the node that really died is remediated one observe period plus staleness plus
// toleration after observation resumed. On the old judgement both were terminated.
func TestOutageDoesNotCountTowardStaleness(t *testing.T) {
	for _, outage := range []time.Duration{2 * time.Minute, 10 * time.Minute, time.Hour} {
		t.Run(outage.String(), func(t *testing.T) {
			h := newHarness(t, liveConfig(t, "zonePauseThreshold: 100%\nclusterPauseThreshold: 100%\npolicies:\n- name: p\n  nodeSelector: \"\"\n  maxUnhealthy: 100%\n  maxInFlight: 10\n  tolerations: {silentNode: 1m}\n  drain: {enabled: false}\n"))
			h.withBlindness()
			ok, dead := h.healthy(newNode("ok")), h.healthy(newNode("dead"))
			renew := func(n *corev1.Node) {
				h.renew(DefaultKubeletLeaseNamespace, n.Name, h.clock.Now())
				h.renew(h.c.rc.AgentNamespace, n.Name, h.clock.Now())
			}
			h.clock.Step(time.Second)
			renew(ok)
			renew(dead)

			// The outage: nothing changes in the cache while the clock runs.
			h.clock.Step(outage)
			for _, n := range []*corev1.Node{ok, dead} {
				requeue, err := h.sync(n.Name)
				if err != nil {
					t.Fatal(err)
				}
				if len(h.Steps()) != 0 || requeue <= 0 {
					t.Fatalf("acted on %s after %s without observing: steps %q, requeue %s", n.Name, outage, h.Steps(), requeue)
				}
			}
			if got := gathered(t, h.c, "nodevigil_remediator_observation_blind"); got != 1 {
				t.Errorf("observation_blind = %v during the outage, want 1", got)
			}

			// Back: the healthy node renews again; the dead one never does.
			resumed := h.clock.Now()
			renew(ok)
			var gone time.Time
			for i := 0; i < 200 && gone.IsZero(); i++ {
				for _, n := range []string{ok.Name, dead.Name} {
					if h.nodeGone(n) {
						continue
					}
					if _, err := h.sync(n); err != nil {
						t.Fatal(err)
					}
				}
				if h.nodeGone(dead.Name) {
					gone = h.clock.Now()
					break
				}
				h.clock.Step(5 * time.Second)
				renew(ok)
			}
			if gone.IsZero() {
				t.Fatalf("the dead node was never remediated after the outage: %q", h.Steps())
			}
			if earliest := resumed.Add(h.c.observe); gone.Before(earliest) {
				t.Errorf("dead node remediated %s after observation resumed, before the observe period %s", gone.Sub(resumed), h.c.observe)
			}
			for _, s := range h.Steps() {
				if strings.Contains(s, " ok") {
					t.Errorf("touched the node that kept renewing: %s", s)
				}
			}
			if got := gathered(t, h.c, "nodevigil_remediator_observation_blind"); got != 0 {
				t.Errorf("observation_blind = %v after the outage, want 0", got)
			}
		})
	}
}

// gathered returns the value of the unlabelled gauge or counter name in c's registry.
func gathered(t *testing.T, c *Controller, name string) float64 {
	t.Helper()
	mfs, err := c.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name || len(mf.GetMetric()) == 0 {
			continue
		}
		m := mf.GetMetric()[0]
		if m.GetGauge() != nil {
			return m.GetGauge().GetValue()
		}
		return m.GetCounter().GetValue()
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

// TestLeaseObserverVerification: a quiet observer is blind unless a verification against the
// API server found its cache current within verifyMaxAge (a quarter of its gap); the first such
// verification is a resumption, later ones in a row are not, and a failed one makes it blind at
// once.
func TestLeaseObserverVerification(t *testing.T) {
	const gap = 40 * time.Second // verifyMaxAge 10s
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	type check struct {
		now     int
		current bool
	}
	tests := []struct {
		name        string
		renewals    []int // times Lease "a" changed
		checks      []check
		query       int
		wantBlind   bool
		wantResumed int // -1: never
	}{
		{"quiet, never verified: blind", []int{0}, nil, 45, true, -1},
		{"quiet, the API server confirms the cache: seeing, resumed then", []int{0}, []check{{41, true}}, 45, false, 41},
		{"quiet, the verification failed: blind", []int{0}, []check{{41, false}}, 45, true, -1},
		{"verified once, not again within a quarter gap: blind", []int{0}, []check{{41, true}}, 52, true, 41},
		{"verified every 5s: seeing, resumed at the first only", []int{0}, []check{{41, true}, {46, true}, {51, true}, {56, true}}, 60, false, 41},
		{"a failure between successes: resumed again after it", []int{0}, []check{{41, true}, {46, false}, {51, true}}, 52, false, 51},
		{"a failure after success: blind at once", []int{0}, []check{{41, true}, {46, false}}, 47, true, 41},
		{"renewing: never blind, verified or not", []int{0, 10, 20, 30}, []check{{35, false}}, 45, false, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := newLeaseObserver(gap)
			for i, r := range tt.renewals {
				o.observe(obsLease("a", string(rune('1'+i)), t0), at(r))
			}
			for _, c := range tt.checks {
				o.verified(at(c.now), c.current)
			}
			blind, _, resumed := o.blindness(at(tt.query))
			if blind != tt.wantBlind {
				t.Errorf("blind = %v, want %v", blind, tt.wantBlind)
			}
			want := time.Time{}
			if tt.wantResumed >= 0 {
				want = at(tt.wantResumed)
			}
			if !resumed.Equal(want) {
				t.Errorf("resumed = %s, want %s", resumed, want)
			}
		})
	}
}

// TestQuietClusterIsVerifiedAgainstTheAPIServer: a one-node cluster whose only node dies has no
// Lease changing at all, like a remediator that cannot observe. When a direct list of the API
// server's Leases matches the cache, the quiet is real and the dead node is remediated — one
// observe period plus toleration after that verification, never sooner. When the list fails
// (the API server is down) or shows newer Leases than the cache (the watch is behind), nothing
// is judged, however long it lasts.
func TestQuietClusterIsVerifiedAgainstTheAPIServer(t *testing.T) {
	failing := func(*coordinationv1.LeaseList) error { return errors.New("connection refused") }
	newer := func(l *coordinationv1.LeaseList) error {
		for i := range l.Items {
			l.Items[i].ResourceVersion += "0"
		}
		return nil
	}
	tests := []struct {
		name       string
		answer     func(*coordinationv1.LeaseList) error // how the API server answers the list; nil: truthfully
		wantGone   bool
		wantBlind  float64
		wantResult string
	}{
		{"the API server confirms the quiet", nil, true, 0, "current"},
		{"the API server does not answer", failing, false, 1, "failed"},
		{"the API server holds newer Leases than the cache", newer, false, 1, "behind"},
	}
	const toleration = time.Minute
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, liveConfig(t, "zonePauseThreshold: 100%\nclusterPauseThreshold: 100%\npolicies:\n- name: p\n  nodeSelector: \"\"\n  maxUnhealthy: 100%\n  tolerations: {silentNode: 1m}\n  drain: {enabled: false}\n"))
			h.withBlindness()
			only := h.healthy(newNode("only"))
			h.clock.Step(time.Second)
			h.renew(DefaultKubeletLeaseNamespace, only.Name, h.clock.Now())
			h.renew(h.c.rc.AgentNamespace, only.Name, h.clock.Now())
			died := h.clock.Now()
			h.client.PrependReactor("list", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if tt.answer == nil {
					return false, nil, nil
				}
				obj, err := h.client.Tracker().List(leasesGVR, coordinationv1.SchemeGroupVersion.WithKind("Lease"), a.GetNamespace())
				if err != nil {
					return true, nil, err
				}
				list := obj.(*coordinationv1.LeaseList)
				if err := tt.answer(list); err != nil {
					return true, nil, err
				}
				return true, list, nil
			})

			var gone time.Time
			for range 240 { // 20 minutes
				h.clock.Step(5 * time.Second)
				h.c.verifyObservation(h.ctx)
				if _, err := h.sync(only.Name); err != nil {
					t.Fatal(err)
				}
				if h.nodeGone(only.Name) {
					gone = h.clock.Now()
					break
				}
			}
			if got := !gone.IsZero(); got != tt.wantGone {
				t.Fatalf("node remediated = %v, want %v; steps %q", got, tt.wantGone, h.Steps())
			}
			if tt.wantGone {
				_, _, resumed := h.c.kubeletObs.blindness(gone)
				if resumed.Before(died.Add(h.c.kubeletObs.gap)) {
					t.Errorf("resumed at %s, before the Leases were quiet for a lease duration", resumed.Sub(died))
				}
				if earliest := resumed.Add(h.c.observe).Add(toleration); gone.Before(earliest) {
					t.Errorf("remediated %s after the last renewal, before verification + observe period + toleration (%s)", gone.Sub(died), earliest.Sub(died))
				}
				t.Logf("last renewal → node gone: %s", gone.Sub(died))
			} else if got := gathered(t, h.c, "nodevigil_remediator_observation_blind"); got != tt.wantBlind {
				t.Errorf("observation_blind = %v, want %v", got, tt.wantBlind)
			}
			if n := testutil.ToFloat64(h.c.verifications.WithLabelValues("kubelet", tt.wantResult)); n < 1 {
				t.Errorf("observation_verifications_total{leases=kubelet,result=%s} = %v, want ≥ 1", tt.wantResult, n)
			}
		})
	}
}
