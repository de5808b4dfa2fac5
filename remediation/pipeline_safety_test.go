package remediation

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevigil/nodevigil/remediation/decide"
)

// The tests of this file pin the rules of issue 10's pipeline half: ownership before the point
// of no return, terminal outcomes that release everything, bounded retries, pauses and caps
// per pool, decisions recomputed at each step.

// defaultCaps is a live config with the shipped caps (maxUnhealthy 20%, maxInFlight 1) and
// pause thresholds out of the way.
const defaultCaps = "clusterPauseThreshold: 100%\nzonePauseThreshold: 100%\npolicies:\n- name: p\n  nodeSelector: \"\"\n"

// TestTerminalOutcomesBlockAndFreeThePool: an instance the cluster does not own, a missing
// instance (after confirmation) and a provider ID that is not EC2's are found before the node
// is cordoned; the node is recorded Blocked, holds no slot, and the next dead node of the same
// pool is remediated under the default maxInFlight of 1.
func TestTerminalOutcomesBlockAndFreeThePool(t *testing.T) {
	tests := []struct {
		name   string
		setup  func(h *harness, n *corev1.Node)
		reason string
	}{
		{"not owned", func(h *harness, n *corev1.Node) { h.cloud.owned[instanceOf(n)] = false }, BlockNotOwned},
		{"not found", func(h *harness, n *corev1.Node) { delete(h.cloud.instances, instanceOf(n)) }, BlockNotFound},
		{"not an EC2 provider ID", nil, BlockInvalidProviderID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, liveConfig(t, defaultCaps))
			for i := range 8 {
				h.healthy(newNode(fmt.Sprintf("ok-%d", i)))
			}
			var opts []nodeOpt
			if tt.reason == BlockInvalidProviderID {
				opts = append(opts, withProviderID("gce://project/us-east1-b/vm-1"))
			}
			foreign := h.silent(newNode("foreign", opts...))
			h.cloud.mu.Lock()
			if tt.setup != nil {
				tt.setup(h, foreign)
			}
			h.cloud.mu.Unlock()

			// NotFound is final only after the confirm delay.
			for range 3 {
				requeue, err := h.sync("foreign")
				if err != nil {
					t.Fatal(err)
				}
				if h.node("foreign").Annotations[decide.AnnotationBlocked] != "" {
					break
				}
				if tt.reason != BlockNotFound || requeue > DefaultTerminationConfirmDelay {
					t.Fatalf("not Blocked after one reconcile (requeue %s)", requeue)
				}
				h.clock.Step(requeue)
				for i := range 8 { // the healthy nodes keep renewing
					h.renew(DefaultKubeletLeaseNamespace, fmt.Sprintf("ok-%d", i), h.clock.Now())
					h.renew(h.c.rc.AgentNamespace, fmt.Sprintf("ok-%d", i), h.clock.Now())
				}
			}
			got := h.node("foreign")
			if got.Annotations[decide.AnnotationBlocked] != tt.reason || decide.PhaseOf(got) != decide.PhaseNone || got.Spec.Unschedulable || hasTaint(got.Spec.Taints) {
				t.Fatalf("foreign node: blocked %q, state %q, unschedulable %v; want Blocked %s, never cordoned",
					got.Annotations[decide.AnnotationBlocked], decide.PhaseOf(got), got.Spec.Unschedulable, tt.reason)
			}
			for _, s := range h.Steps() {
				if strings.Contains(s, "mark+") || strings.Contains(s, "Marked") || strings.Contains(s, "Cordoned") || strings.Contains(s, "Draining") {
					t.Errorf("a foreign node went into the pipeline: %q", h.Steps())
				}
			}
			if !hasEvent(h.events(), tt.reason) {
				t.Errorf("no %s event", tt.reason)
			}
			h.settle("foreign")
			h.c.refreshCensus(h.clock.Now())
			if got := testutil.ToFloat64(h.c.metrics.blockedNodes.WithLabelValues(tt.reason)); got != 1 {
				t.Errorf("blocked_nodes{%s} = %v, want 1", tt.reason, got)
			}

			// A second dead node in the same pool goes through: the pool is not held.
			second := h.silent(newNode("second"))
			h.drive("second", 10)
			if !h.nodeGone("second") || !slices.Contains(h.cloud.Terminates(), instanceOf(second)) {
				t.Errorf("second dead node not remediated while the first is Blocked; steps %q, events %q", h.Steps(), h.events())
			}
			if slices.Contains(h.cloud.Terminates(), instanceOf(foreign)) {
				t.Error("the foreign instance was terminated")
			}
		})
	}
}

// TestBlockedNodeIsRecheckedWhenTheSituationChanges: a tag added is picked up at the recheck,
// a fixed providerID at once; nothing is retried in between.
func TestBlockedNodeIsRecheckedWhenTheSituationChanges(t *testing.T) {
	t.Run("tag added", func(t *testing.T) {
		h := newHarness(t, liveConfig(t, defaultCaps+"  drain: {enabled: false}\n"))
		n := h.silent(newNode("n"))
		h.cloud.mu.Lock()
		h.cloud.owned[instanceOf(n)] = false
		h.cloud.mu.Unlock()
		requeue, err := h.sync("n")
		if err != nil || requeue != DefaultBlockedRecheck {
			t.Fatalf("requeue %s, err %v; want Blocked until the recheck", requeue, err)
		}
		describes := len(h.cloud.Describes())
		for range 5 {
			h.clock.Step(time.Minute - time.Second)
			if _, err := h.sync("n"); err != nil {
				t.Fatal(err)
			}
		}
		if got := len(h.cloud.Describes()); got != describes {
			t.Errorf("%d Describe calls inside the recheck interval, want none (no hot loop)", got-describes)
		}
		h.cloud.mu.Lock()
		h.cloud.owned[instanceOf(n)] = true
		h.cloud.mu.Unlock()
		h.clock.Step(time.Minute)
		h.drive("n", 5)
		if !h.nodeGone("n") {
			t.Errorf("not remediated after the tag was added; steps %q", h.Steps())
		}
	})
	t.Run("providerID fixed", func(t *testing.T) {
		h := newHarness(t, liveConfig(t, defaultCaps+"  drain: {enabled: false}\n"))
		good := newNode("n")
		h.silent(newNode("n", withProviderID("aws:///us-east-1a/bogus")))
		if _, err := h.sync("n"); err != nil {
			t.Fatal(err)
		}
		if h.node("n").Annotations[decide.AnnotationBlocked] != BlockInvalidProviderID {
			t.Fatal("not Blocked")
		}
		n := h.node("n")
		n.Spec.ProviderID = good.Spec.ProviderID
		if _, err := h.client.CoreV1().Nodes().Update(h.ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		h.cloud.addInstance(good, "running")
		h.drive("n", 5)
		if !h.nodeGone("n") {
			t.Errorf("not remediated at once after the providerID was fixed; steps %q", h.Steps())
		}
	})
	t.Run("recovered", func(t *testing.T) {
		h := newHarness(t, liveConfig(t, defaultCaps))
		n := h.silent(newNode("n"))
		h.cloud.mu.Lock()
		h.cloud.owned[instanceOf(n)] = false
		h.cloud.mu.Unlock()
		if _, err := h.sync("n"); err != nil {
			t.Fatal(err)
		}
		h.renew(DefaultKubeletLeaseNamespace, "n", h.clock.Now())
		h.renew(h.c.rc.AgentNamespace, "n", h.clock.Now())
		if _, err := h.sync("n"); err != nil {
			t.Fatal(err)
		}
		if _, ok := h.node("n").Annotations[decide.AnnotationBlocked]; ok {
			t.Error("a recovered node keeps its Blocked record")
		}
	})
}

// TestTransientCloudErrorsBackOff: throttling and server errors are retried with growing,
// jittered delays and counted; they never block the node.
func TestTransientCloudErrorsBackOff(t *testing.T) {
	h := newHarness(t, liveConfig(t, defaultCaps+"  drain: {enabled: false}\n"))
	n := h.silent(newNode("n"))
	id := instanceOf(n)
	throttled := &CloudError{Kind: CloudErrorThrottled, Err: errors.New("RequestLimitExceeded")}
	h.cloud.describeErr[id] = []error{throttled, throttled, &CloudError{Kind: CloudErrorServer, Err: errors.New("503")}}
	h.cloud.terminateErr[id] = []error{throttled}
	var delays []time.Duration
	for range 10 {
		requeue, err := h.sync("n")
		if err != nil {
			t.Fatal(err)
		}
		if h.nodeGone("n") {
			break
		}
		delays = append(delays, requeue)
		h.clock.Step(requeue)
	}
	if !h.nodeGone("n") {
		t.Fatalf("not remediated after the errors passed; steps %q", h.Steps())
	}
	if got := h.cloud.Terminates(); len(got) != 2 {
		t.Errorf("Terminate calls %v, want 2 (one throttled, one accepted)", got)
	}
	if slices.ContainsFunc(h.Steps(), func(s string) bool { return strings.Contains(s, "Blocked") }) {
		t.Errorf("a transient error blocked the node: %q", h.Steps())
	}
	// 2s, 4s, 8s (±20%) for the three consecutive Describe failures; the success resets the
	// backoff, so the throttled Terminate waits 2s again.
	if len(delays) < 4 {
		t.Fatalf("delays %v", delays)
	}
	for i, d := range delays[:4] {
		base := DefaultCloudBackoffBase << (i % 3)
		if d < base*8/10 || d > base*12/10 {
			t.Errorf("delay %d = %s, want %s ±20%%", i, d, base)
		}
	}
	if got := testutil.ToFloat64(h.c.metrics.cloudErrors.WithLabelValues("Describe", CloudErrorThrottled)); got != 2 {
		t.Errorf("cloud_errors_total{Describe,Throttled} = %v, want 2", got)
	}
	if got := testutil.ToFloat64(h.c.metrics.cloudErrors.WithLabelValues("Describe", CloudErrorServer)); got != 1 {
		t.Errorf("cloud_errors_total{Describe,ServerError} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(h.c.metrics.cloudErrors.WithLabelValues("Terminate", CloudErrorThrottled)); got != 1 {
		t.Errorf("cloud_errors_total{Terminate,Throttled} = %v, want 1", got)
	}
}

// TestTerminationIntentIsSafeToReplay: the leader records the intent, then calls EC2, then
// records Terminating. A leader that finds the intent without Terminating looks at EC2: it
// finishes a termination EC2 accepted (without asking again), asks once if EC2 never got the
// call, and releases a node that recovered only if EC2 shows the instance not going. The intent
// is found in phase Draining (recorded after a drain) or Cordoned (recorded with the mark by a
// policy without a drain).
func TestTerminationIntentIsSafeToReplay(t *testing.T) {
	tests := []struct {
		name          string
		instanceState string
		recovered     bool
		wantTerminate int
		wantGone      bool
	}{
		{"died before EC2 accepted", "running", false, 1, true},
		{"died after EC2 accepted", "shutting-down", false, 0, true},
		{"recovered, EC2 never asked", "running", true, 0, false},
		{"recovered, but EC2 accepted", "shutting-down", true, 0, true},
	}
	for _, tt := range tests {
		for _, phase := range []decide.Phase{decide.PhaseDraining, decide.PhaseCordoned} {
			t.Run(tt.name+"/"+string(phase), func(t *testing.T) {
				drain := ""
				if phase == decide.PhaseCordoned {
					drain = "  drain: {enabled: false}\n"
				}
				h := newHarness(t, liveConfig(t, defaultCaps+drain))
				for i := range 8 {
					h.healthy(newNode(fmt.Sprintf("ok-%d", i)))
				}
				n := newNode("n", inPhase(phase), withAnnotation(decide.AnnotationTerminationRequestedAt, ts(t0.Add(-time.Second))))
				if tt.recovered {
					h.healthy(n)
				} else {
					h.silent(n)
				}
				h.cloud.addInstance(n, tt.instanceState)
				h.drive("n", 5)
				if got := len(h.cloud.Terminates()); got != tt.wantTerminate {
					t.Errorf("Terminate calls = %d, want %d", got, tt.wantTerminate)
				}
				if h.nodeGone("n") != tt.wantGone {
					t.Errorf("node gone = %v, want %v; steps %q", h.nodeGone("n"), tt.wantGone, h.Steps())
				}
				if !tt.wantGone {
					got := h.node("n")
					if got.Spec.Unschedulable || decide.PhaseOf(got) != decide.PhaseNone {
						t.Errorf("recovered node not released: unschedulable %v, state %q", got.Spec.Unschedulable, decide.PhaseOf(got))
					}
				}
			})
		}
	}
}

// TestDecisionRecomputedAtEachStep: a node that recovers, or is annotated do-not-remediate,
// while a step is under way is not moved on to the next step from the stale decision.
func TestDecisionRecomputedAtEachStep(t *testing.T) {
	// The changes go through the tracker: the eviction hook runs inside the fake clientset's
	// reactor chain, which must not be re-entered.
	bump := func(h *harness, o metav1.Object) { o.SetResourceVersion(strconv.FormatInt(h.rv.Add(1), 10)) }
	recover := func(h *harness) {
		for _, ns := range []string{DefaultKubeletLeaseNamespace, h.c.rc.AgentNamespace} {
			obj, err := h.client.Tracker().Get(leasesGVR, ns, "n")
			if err != nil {
				h.t.Fatal(err)
			}
			l := obj.(*coordinationv1.Lease).DeepCopy()
			l.Spec.RenewTime = &metav1.MicroTime{Time: h.clock.Now()}
			bump(h, l)
			if err := h.client.Tracker().Update(leasesGVR, l, ns); err != nil {
				h.t.Fatal(err)
			}
		}
	}
	doNotRemediate := func(h *harness) {
		obj, err := h.client.Tracker().Get(nodesGVR, "", "n")
		if err != nil {
			h.t.Fatal(err)
		}
		n := obj.(*corev1.Node).DeepCopy()
		n.Annotations[decide.AnnotationDoNotRemediate] = "true"
		bump(h, n)
		if err := h.client.Tracker().Update(nodesGVR, n, ""); err != nil {
			h.t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		name   string
		during string // "describe" (before the mark) or "evict" (during the drain)
		change func(h *harness)
	}{
		{"recovers while verified", "describe", recover},
		{"recovers while draining", "evict", recover},
		{"do-not-remediate while draining", "evict", doNotRemediate},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, liveConfig(t, defaultCaps))
			for i := range 8 {
				h.healthy(newNode(fmt.Sprintf("ok-%d", i)))
			}
			h.silent(newNode("n"))
			h.add(newPod("app", "web", "n"))
			done := false
			hook := func() {
				if !done {
					done = true
					tt.change(h)
					h.synced("n")
				}
			}
			if tt.during == "describe" {
				h.cloud.onDescribe = func(string) { hook() }
			} else {
				h.onEvict = func(string, string) { hook() }
			}
			h.drive("n", 5)
			if len(h.cloud.Terminates()) != 0 {
				t.Errorf("terminated a node that %s; steps %q", tt.name, h.Steps())
			}
			got := h.node("n")
			if got.Spec.Unschedulable || hasTaint(got.Spec.Taints) || decide.PhaseOf(got) != decide.PhaseNone {
				t.Errorf("not handed back: unschedulable %v, taint %v, state %q; steps %q", got.Spec.Unschedulable, hasTaint(got.Spec.Taints), decide.PhaseOf(got), h.Steps())
			}
		})
	}
}

// TestPauseStopsEveryStep: a zone storm that begins while nodes are mid-pipeline stops their
// cordon, their drain and their termination, not only new marks.
func TestPauseStopsEveryStep(t *testing.T) {
	for _, phase := range []decide.Phase{decide.PhaseMarked, decide.PhaseCordoned, decide.PhaseDraining} {
		t.Run(string(phase), func(t *testing.T) {
			h := newHarness(t, liveConfig(t, "zonePauseThreshold: 1\nclusterPauseThreshold: 100%\npolicies:\n- name: p\n  nodeSelector: \"\"\n  maxUnhealthy: 100%\n  maxInFlight: 10\n"))
			h.silent(newNode("n", inPhase(phase)))
			h.silent(newNode("other-dead"))
			h.healthy(newNode("ok"))
			h.add(newPod("app", "web", "n"))
			requeue, err := h.sync("n")
			if err != nil {
				t.Fatal(err)
			}
			if got := h.Steps(); len(got) != 0 || len(h.cloud.Terminates()) != 0 {
				t.Errorf("acted in a paused zone from %s: %q", phase, got)
			}
			if requeue != DefaultBlockedRequeue || !hasEvent(h.events(), BlockZonePaused) {
				t.Errorf("requeue %s; want the blocked requeue and a ZonePaused event", requeue)
			}
		})
	}
}

// TestStormDuringVerifyStopsTheCordon: the marking patch cordons, so the rails of the cordon are
// applied after the ownership Describe, immediately before it: a zone storm that begins while
// EC2 is asked leaves the node untouched.
func TestStormDuringVerifyStopsTheCordon(t *testing.T) {
	h := newHarness(t, liveConfig(t, "zonePauseThreshold: 1\nclusterPauseThreshold: 100%\npolicies:\n- name: p\n  nodeSelector: \"\"\n  maxUnhealthy: 100%\n  maxInFlight: 10\n"))
	h.silent(newNode("n"))
	h.healthy(newNode("ok-1"))
	h.healthy(newNode("ok-2"))
	h.settle("n")
	storm := false
	h.cloud.onDescribe = func(string) {
		if !storm {
			// The other nodes of the zone stop renewing while EC2 answers.
			storm = true
			h.clock.Step(2 * time.Minute)
		}
	}
	requeue, err := h.c.syncNode(h.ctx, "n")
	if err != nil {
		t.Fatal(err)
	}
	if !storm {
		t.Fatal("the instance was not described before the mark")
	}
	if got := h.Steps(); len(got) != 0 {
		t.Errorf("acted after a zone storm began during the ownership check: %q", got)
	}
	if requeue != DefaultBlockedRequeue || !hasEvent(h.events(), BlockZonePaused) {
		t.Errorf("requeue %s; want the blocked requeue and a ZonePaused event", requeue)
	}
	if got := h.node("n"); got.Spec.Unschedulable || decide.PhaseOf(got) != decide.PhaseNone {
		t.Errorf("node unschedulable %v, state %q; want untouched", got.Spec.Unschedulable, decide.PhaseOf(got))
	}
}

// TestCapsCountPerPool: one policy spanning two pools; a node in flight in one pool does not
// use up the other's maxInFlight, and unhealthy nodes of one pool do not pause the other.
func TestCapsCountPerPool(t *testing.T) {
	h := newHarness(t, liveConfig(t, "clusterPauseThreshold: 100%\nzonePauseThreshold: 100%\npolicies:\n- name: p\n  nodeSelector: \"\"\n  maxUnhealthy: 1\n  drain: {timeout: 1h, onTimeout: Wait}\n"))
	h.silent(newNode("a-1", inPool("a")))
	h.add(newPod("app", "guarded", "a-1"))
	h.pdb["app/guarded"] = true
	h.silent(newNode("b-1", inPool("b")))
	h.healthy(newNode("a-2", inPool("a")))
	h.healthy(newNode("b-2", inPool("b")))
	if _, err := h.sync("a-1"); err != nil {
		t.Fatal(err)
	}
	if decide.PhaseOf(h.node("a-1")) != decide.PhaseDraining {
		t.Fatalf("a-1 is %q, want Draining (held by a PDB)", decide.PhaseOf(h.node("a-1")))
	}
	h.drive("b-1", 5)
	if !h.nodeGone("b-1") {
		t.Errorf("pool b's dead node waited for pool a's (maxInFlight per pool); events %q", h.events())
	}
	// A second dead node in pool a is held by pool a's caps.
	h.silent(newNode("a-3", inPool("a")))
	if _, err := h.sync("a-3"); err != nil {
		t.Fatal(err)
	}
	if decide.PhaseOf(h.node("a-3")) != decide.PhaseNone {
		t.Error("pool a exceeded its caps")
	}
}

// TestStormValvesCountUnhealthyByCondition: nodes failing a policy condition count towards
// the zone pause like silent ones.
func TestStormValvesCountUnhealthyByCondition(t *testing.T) {
	h := newHarness(t, liveConfig(t, "zonePauseThreshold: 1\nclusterPauseThreshold: 100%\npolicies:\n- name: p\n  nodeSelector: \"\"\n  maxUnhealthy: 100%\n  maxInFlight: 10\n  tolerations: {conditions: {NetworkingReady: 1m}}\n"))
	netDown := func(n *corev1.Node) {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{
			Type: decide.ConditionNetworkingReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(t0.Add(-time.Hour)),
		})
	}
	h.healthy(newNode("net-1", netDown))
	h.healthy(newNode("net-2", netDown))
	h.healthy(newNode("ok"))
	if _, err := h.sync("net-1"); err != nil {
		t.Fatal(err)
	}
	if got := h.Steps(); len(got) != 0 {
		t.Errorf("acted while 2 of 3 nodes of the zone are unhealthy (threshold 1): %q", got)
	}
	if !hasEvent(h.events(), BlockZonePaused) {
		t.Error("no ZonePaused event")
	}
}

// TestCordonOnlyFreesItsSlotOnceCordoned: a CordonOnly pool with maxInFlight 1 cordons one
// node after the other.
func TestCordonOnlyFreesItsSlotOnceCordoned(t *testing.T) {
	h := newHarness(t, liveConfig(t, "clusterPauseThreshold: 100%\nzonePauseThreshold: 100%\npolicies:\n- name: db\n  nodeSelector: \"\"\n  action: CordonOnly\n  maxUnhealthy: 100%\n"))
	h.silent(newNode("a"))
	h.silent(newNode("b"))
	h.drive("a", 3)
	h.clock.Step(time.Second)
	h.drive("b", 3)
	for _, n := range []string{"a", "b"} {
		if decide.PhaseOf(h.node(n)) != decide.PhaseCordoned {
			t.Errorf("%s is %q, want Cordoned", n, decide.PhaseOf(h.node(n)))
		}
	}
	if len(h.cloud.Describes()) != 0 {
		t.Error("CordonOnly described instances: it never terminates, ownership does not matter")
	}
}
