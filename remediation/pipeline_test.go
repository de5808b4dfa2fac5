package remediation

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/nodevigil/nodevigil/remediation/decide"
)

// TestPipelineRecordsEachStepBeforeTakingIt drives a silent node through the whole pipeline and
// checks the order of what reached the API server and EC2.
func TestPipelineRecordsEachStepBeforeTakingIt(t *testing.T) {
	h := newHarness(t, nil)
	n := h.silent(newNode("dead"))
	h.add(
		newPod("app", "web-1", "dead"),
		newPod("kube-system", "ds-1", "dead", func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "ds", Controller: ptr.To(true), APIVersion: appsv1.SchemeGroupVersion.String()}}
		}),
		newPod("kube-system", "static-1", "dead", func(p *corev1.Pod) { p.Annotations[mirrorPodAnnotation] = "x" }),
		newPod("app", "done-1", "dead", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }),
		newPod("app", "elsewhere", "other-node"),
	)
	// Every eviction must happen while the node records Draining.
	h.onEvict = func(ns, pod string) {
		got, _ := h.client.Tracker().Get(nodesGVR, "", "dead")
		if s := got.(*corev1.Node).Annotations[decide.AnnotationState]; s != string(decide.PhaseDraining) {
			t.Errorf("evicting %s/%s while the node records %q, want Draining", ns, pod, s)
		}
	}

	h.drive("dead", 10)

	want := []string{
		"patch dead mark+Draining", // the decision, the cordon, the taint and the drain's start in one patch
		"evict app/web-1",
		"patch dead intent",
		"patch dead Terminating",
		"patch dead Terminated",
		"delete dead",
	}
	if got := h.Steps(); !slices.Equal(got, want) {
		t.Errorf("steps:\n got %q\nwant %q", got, want)
	}
	if got := h.cloud.Terminates(); !slices.Equal(got, []string{instanceOf(n)}) {
		t.Errorf("Terminate calls = %v, want one for %s", got, instanceOf(n))
	}
	// Terminating is the point of no return: recorded only once EC2 accepted.
	if !slices.Equal(h.cloud.stateAtTerminate, []string{string(decide.PhaseDraining)}) {
		t.Errorf("state recorded at Terminate = %v, want [Draining]", h.cloud.stateAtTerminate)
	}
	if got := h.cloud.Describes(); len(got) != 2 {
		t.Errorf("Describe calls = %v, want two (the ownership check before the mark, the confirmation)", got)
	}
	if !h.nodeGone("dead") {
		t.Error("node object still exists")
	}
	ev := h.events()
	for _, r := range []string{decide.ReasonNodeSilent, EventRemediationStarted, EventCordoned, EventDrainStarted, EventDrainCompleted, EventTerminationRequested, EventInstanceTerminated, EventNodeDeleted} {
		if !hasEvent(ev, r) {
			t.Errorf("no %s event in %q", r, ev)
		}
	}
	if got := testutil.ToFloat64(h.c.metrics.terminations.WithLabelValues(string(ResultTerminating))); got != 1 {
		t.Errorf("terminations_total{Terminating} = %v, want 1", got)
	}
	if got := testutil.CollectAndCount(h.c.metrics.terminateLatency); got != 1 {
		t.Errorf("termination latency observations = %d, want 1", got)
	}
}

func TestCordonedStateCarriesTaintAndCordon(t *testing.T) {
	h := newHarness(t, liveConfig(t, "policies:\n- name: db\n  nodeSelector: karpenter.sh/nodepool=db\n  action: CordonOnly\n"))
	h.silent(newNode("db-1", inPool("db")))
	h.add(newPod("app", "pg-0", "db-1"))
	h.drive("db-1", 5)

	n := h.node("db-1")
	if !n.Spec.Unschedulable || !hasTaint(n.Spec.Taints) || decide.PhaseOf(n) != decide.PhaseCordoned {
		t.Errorf("CordonOnly node: unschedulable %v, taint %v, state %q; want cordoned, tainted, Cordoned", n.Spec.Unschedulable, hasTaint(n.Spec.Taints), decide.PhaseOf(n))
	}
	if got := h.Steps(); !slices.Equal(got, []string{"patch db-1 mark+Cordoned"}) {
		t.Errorf("steps = %q: CordonOnly must stop after the cordon", got)
	}
	if len(h.cloud.Terminates()) != 0 {
		t.Error("CordonOnly terminated an instance")
	}
	// Running again changes nothing: the pipeline is finished for this policy.
	if _, err := h.sync("db-1"); err != nil {
		t.Fatal(err)
	}
	if got := len(h.Steps()); got != 1 {
		t.Errorf("a second reconcile of a cordoned CordonOnly node wrote again (%d steps)", got)
	}
}

// TestResumeFromEachRecordedState starts from every phase a previous leader may have left on
// the node and checks that the new leader finishes the job without repeating a step.
func TestResumeFromEachRecordedState(t *testing.T) {
	tests := []struct {
		phase         decide.Phase
		instanceState string // EC2's view when the new leader arrives
		wantSteps     []string
		wantTerminate int
	}{
		{decide.PhaseMarked, "running", []string{"patch n Cordoned", "patch n Draining", "patch n intent", "patch n Terminating", "patch n Terminated", "delete n"}, 1},
		{decide.PhaseCordoned, "running", []string{"patch n Draining", "patch n intent", "patch n Terminating", "patch n Terminated", "delete n"}, 1},
		{decide.PhaseDraining, "running", []string{"patch n intent", "patch n Terminating", "patch n Terminated", "delete n"}, 1},
		// The old leader recorded Terminating and died before (or after) calling EC2.
		{decide.PhaseTerminating, "running", []string{"patch n Terminated", "delete n"}, 1},
		{decide.PhaseTerminating, "shutting-down", []string{"patch n Terminated", "delete n"}, 0},
		{decide.PhaseTerminating, "terminated", []string{"patch n Terminated", "delete n"}, 0},
		{decide.PhaseTerminated, "terminated", []string{"delete n"}, 0},
	}
	for _, tt := range tests {
		t.Run(string(tt.phase)+"/"+tt.instanceState, func(t *testing.T) {
			h := newHarness(t, nil)
			n := h.silent(newNode("n", inPhase(tt.phase)))
			h.cloud.addInstance(n, tt.instanceState)
			h.drive("n", 10)
			if got := h.Steps(); !slices.Equal(got, tt.wantSteps) {
				t.Errorf("steps:\n got %q\nwant %q", got, tt.wantSteps)
			}
			if got := len(h.cloud.Terminates()); got != tt.wantTerminate {
				t.Errorf("Terminate called %d times, want %d", got, tt.wantTerminate)
			}
			if !h.nodeGone("n") {
				t.Error("node not deleted")
			}
		})
	}
}

// TestTerminatingResumesEvenIfNodeLooksHealthy: the termination request is the point of no
// return; a leader finding it finishes it.
func TestTerminatingResumesEvenIfNodeLooksHealthy(t *testing.T) {
	h := newHarness(t, nil)
	n := h.healthy(newNode("n", inPhase(decide.PhaseTerminating)))
	h.cloud.addInstance(n, "shutting-down")
	h.drive("n", 5)
	if !h.nodeGone("n") {
		t.Errorf("node in Terminating not finished; steps %q", h.Steps())
	}
}

func TestTerminateIsIdempotentAcrossRequeues(t *testing.T) {
	h := newHarness(t, nil)
	n := h.silent(newNode("n"))
	id := instanceOf(n)
	// EC2 accepts the termination but keeps reporting running for a while.
	h.cloud.keepRunning = true
	requeue, err := h.sync("n") // mark … terminate; the confirmation is not possible yet
	if err != nil {
		t.Fatal(err)
	}
	if requeue != DefaultConfirmPollInterval || decide.PhaseOf(h.node("n")) != decide.PhaseTerminating {
		t.Fatalf("requeue %s, state %q: want to poll for the confirmation in Terminating", requeue, decide.PhaseOf(h.node("n")))
	}
	h.clock.Step(requeue)
	if _, err := h.sync("n"); err != nil { // re-describes: running → requests again
		t.Fatal(err)
	}
	if got := h.cloud.Terminates(); !slices.Equal(got, []string{id, id}) {
		t.Fatalf("Terminate calls = %v, want 2 (one re-request while EC2 still shows running)", got)
	}
	h.cloud.mu.Lock()
	h.cloud.instances[id] = "shutting-down" // EC2 caught up
	h.cloud.mu.Unlock()
	h.clock.Step(requeue)
	if _, err := h.sync("n"); err != nil { // describes: shutting-down → confirmed, deleted
		t.Fatal(err)
	}
	if !h.nodeGone("n") {
		t.Errorf("node not deleted; steps %q", h.Steps())
	}
	if got := h.cloud.Terminates(); len(got) != 2 {
		t.Errorf("Terminate calls after confirmation = %d, want still 2", len(got))
	}
	if got := strings.Count(strings.Join(h.Steps(), ","), "patch n Terminating"); got != 1 {
		t.Errorf("Terminating recorded %d times, want once", got)
	}
}

// TestNotFoundIsProofOnlyAfterTheConfirmDelay: EC2 forgetting an instance right after it was
// terminated may be eventual consistency; only after the confirm delay is it taken as gone.
func TestNotFoundIsProofOnlyAfterTheConfirmDelay(t *testing.T) {
	h := newHarness(t, liveConfig(t, "policies:\n- name: p\n  nodeSelector: \"\"\n  drain: {enabled: false}\n"))
	h.cloud.hideAfterTerminate = true
	h.silent(newNode("n"))
	requeue, err := h.sync("n")
	if err != nil {
		t.Fatal(err)
	}
	if h.nodeGone("n") || decide.PhaseOf(h.node("n")) != decide.PhaseTerminating {
		t.Fatalf("after a NotFound describe right after terminating: state %q, want still Terminating", decide.PhaseOf(h.node("n")))
	}
	// Polls while the confirm delay runs.
	for elapsed := time.Duration(0); elapsed < DefaultTerminationConfirmDelay-requeue; elapsed += requeue {
		h.clock.Step(requeue)
		if requeue, err = h.sync("n"); err != nil {
			t.Fatal(err)
		}
		if h.nodeGone("n") {
			t.Fatalf("node deleted %s after the termination request, before the confirm delay %s", elapsed+requeue, DefaultTerminationConfirmDelay)
		}
	}
	h.clock.Step(DefaultTerminationConfirmDelay)
	h.drive("n", 3)
	if !h.nodeGone("n") {
		t.Errorf("node not deleted after the confirm delay; steps %q", h.Steps())
	}
}

func TestReleaseOnRecovery(t *testing.T) {
	for _, tt := range []struct {
		name             string
		wasUnschedulable bool
		phase            decide.Phase
		wantUnsched      bool
	}{
		{"cordoned by us", false, decide.PhaseDraining, false},
		{"cordoned by an operator before", true, decide.PhaseCordoned, true},
		{"only marked", false, decide.PhaseMarked, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, nil)
			opts := []nodeOpt{inPhase(tt.phase), func(n *corev1.Node) {
				n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "other", Effect: corev1.TaintEffectNoSchedule})
			}}
			if tt.wasUnschedulable {
				opts = append(opts, withAnnotation(decide.AnnotationWasUnschedulable, "true"))
			}
			h.healthy(newNode("n", opts...))
			if _, err := h.sync("n"); err != nil {
				t.Fatal(err)
			}
			n := h.node("n")
			for _, k := range pipelineAnnotations {
				if _, ok := n.Annotations[k]; ok {
					t.Errorf("annotation %s still present after release", k)
				}
			}
			if hasTaint(n.Spec.Taints) {
				t.Error("remediating taint still present")
			}
			if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != "other" {
				t.Errorf("taints = %v, want only the foreign one kept", n.Spec.Taints)
			}
			if n.Spec.Unschedulable != tt.wantUnsched {
				t.Errorf("unschedulable = %v, want %v", n.Spec.Unschedulable, tt.wantUnsched)
			}
			if !hasEvent(h.events(), EventReleased) {
				t.Error("no Released event")
			}
			if len(h.cloud.Terminates()) != 0 {
				t.Error("a recovered node's instance was terminated")
			}
		})
	}
}

func TestDryRunChangesNothing(t *testing.T) {
	h := newHarness(t, liveConfig(t, "dryRun: true\n"))
	h.silent(newNode("dead"))
	h.add(newPod("app", "web-1", "dead"))
	for range 3 {
		if _, err := h.sync("dead"); err != nil {
			t.Fatal(err)
		}
	}
	if got := h.Steps(); !slices.Equal(got, []string{"patch dead dry-run"}) {
		t.Errorf("dry-run wrote %q, want only the dry-run-decision annotation, once", got)
	}
	n := h.node("dead")
	if n.Spec.Unschedulable || hasTaint(n.Spec.Taints) || decide.PhaseOf(n) != decide.PhaseNone {
		t.Error("dry-run cordoned, tainted or marked the node")
	}
	if v := n.Annotations[decide.AnnotationDryRunDecision]; !strings.HasPrefix(v, "Terminate NodeSilent ") {
		t.Errorf("dry-run decision = %q", v)
	}
	if len(h.cloud.Terminates()) != 0 {
		t.Error("dry-run terminated an instance")
	}
	if !hasEvent(h.events(), EventWouldTerminate) {
		t.Error("no WouldTerminate event")
	}
	if got := testutil.ToFloat64(h.c.metrics.terminations.WithLabelValues(string(ResultDryRun))); got != 1 {
		t.Errorf("terminations_total{DryRun} = %v, want 1", got)
	}

	// Recovery removes the dry-run record and nothing else.
	h.renew(DefaultKubeletLeaseNamespace, "dead", t0)
	h.renew(h.c.rc.AgentNamespace, "dead", t0)
	if _, err := h.sync("dead"); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.node("dead").Annotations[decide.AnnotationDryRunDecision]; ok {
		t.Error("dry-run decision kept after recovery")
	}
}

func TestDryRunDoesNotAdvanceRecordedPipeline(t *testing.T) {
	h := newHarness(t, liveConfig(t, "dryRun: true\n"))
	h.silent(newNode("n", inPhase(decide.PhaseDraining)))
	h.add(newPod("app", "web-1", "n"))
	if _, err := h.sync("n"); err != nil {
		t.Fatal(err)
	}
	if got := h.Steps(); len(got) != 0 {
		t.Errorf("dry-run advanced a recorded pipeline: %q", got)
	}
}

func TestMalformedProviderIDIsBlocked(t *testing.T) {
	for _, id := range []string{"", "gce://project/zone/vm", "aws:///us-east-1a/not-an-instance", "aws:///us-east-1a/i-0123/extra"} {
		t.Run(id, func(t *testing.T) {
			h := newHarness(t, nil)
			h.silent(newNode("n", withProviderID(id)))
			requeue, err := h.sync("n")
			if err != nil {
				t.Fatal(err)
			}
			if got := h.Steps(); !slices.Equal(got, []string{"patch n Blocked:" + BlockInvalidProviderID}) {
				t.Errorf("steps %q for provider ID %q, want only the Blocked record", got, id)
			}
			if n := h.node("n"); n.Spec.Unschedulable || n.Annotations[decide.AnnotationBlocked] != BlockInvalidProviderID {
				t.Errorf("node: unschedulable %v, blocked %q", n.Spec.Unschedulable, n.Annotations[decide.AnnotationBlocked])
			}
			if !hasEvent(h.events(), BlockInvalidProviderID) {
				t.Error("no InvalidProviderID event")
			}
			if requeue != DefaultBlockedRecheck {
				t.Errorf("requeue %s, want the blocked recheck %s", requeue, DefaultBlockedRecheck)
			}
			if got := testutil.ToFloat64(h.c.metrics.blocked.WithLabelValues(BlockInvalidProviderID)); got != 1 {
				t.Errorf("blocked_total{InvalidProviderID} = %v, want 1", got)
			}
			if len(h.cloud.Describes()) != 0 {
				t.Error("described an instance of an invalid provider ID")
			}
		})
	}
}

func TestAgentSilentNeverActs(t *testing.T) {
	h := newHarness(t, nil)
	n := newNode("n")
	h.add(n, newLease(DefaultKubeletLeaseNamespace, "n", t0), newLease(h.c.rc.AgentNamespace, "n", t0.Add(-24*time.Hour)))
	h.cloud.addInstance(n, "running")
	for range 3 {
		if _, err := h.sync("n"); err != nil {
			t.Fatal(err)
		}
		h.clock.Step(time.Hour)
		h.renew(DefaultKubeletLeaseNamespace, "n", h.clock.Now())
	}
	if got := h.Steps(); len(got) != 0 {
		t.Errorf("acted on a node whose kubelet is alive: %q", got)
	}
	if ev := h.events(); !hasEvent(ev, decide.ReasonAgentSilent) {
		t.Errorf("no AgentSilent event in %q", ev)
	}
}

// TestDoNotDisruptBoundedByTheDrainTimeout: a do-not-disrupt pod is never evicted and holds
// the drain, but only until the drain timeout; then onTimeout decides.
func TestDoNotDisruptBoundedByTheDrainTimeout(t *testing.T) {
	const cfg = "policies:\n- name: p\n  nodeSelector: \"\"\n  drain: {timeout: 1m, onTimeout: %s, honorDoNotDisrupt: %v}\n"
	for _, tt := range []struct {
		onTimeout     string
		honour        bool
		wantTerminate bool
		wantEvicted   bool
	}{
		{"Proceed", true, true, false},
		{"Wait", true, false, false},
		{"Proceed", false, true, true},
	} {
		t.Run(fmt.Sprintf("%s/honour=%v", tt.onTimeout, tt.honour), func(t *testing.T) {
			h := newHarness(t, liveConfig(t, fmt.Sprintf(cfg, tt.onTimeout, tt.honour)))
			h.silent(newNode("n"))
			h.add(newPod("app", "precious", "n", func(p *corev1.Pod) { p.Annotations[decide.AnnotationDoNotDisrupt] = "true" }))
			h.add(newPod("app", "web", "n"))
			requeue, err := h.sync("n")
			if err != nil {
				t.Fatal(err)
			}
			if tt.honour {
				if len(h.cloud.Terminates()) != 0 || decide.PhaseOf(h.node("n")) != decide.PhaseDraining {
					t.Fatalf("before the timeout: state %q, terminations %d; want Draining, none", decide.PhaseOf(h.node("n")), len(h.cloud.Terminates()))
				}
				if requeue <= 0 || requeue > time.Minute {
					t.Errorf("requeue %s: a held drain is looked at again within its timeout", requeue)
				}
				if !hasEvent(h.events(), BlockDoNotDisrupt) {
					t.Error("no DoNotDisrupt event on entering the wait")
				}
				if got := testutil.ToFloat64(h.c.metrics.blocked.WithLabelValues(BlockDoNotDisrupt)); got != 1 {
					t.Errorf("blocked_total{DoNotDisrupt} = %v, want 1", got)
				}
			}
			for range 20 {
				if h.nodeGone("n") {
					break
				}
				h.clock.Step(max(requeue, 10*time.Second))
				if requeue, err = h.sync("n"); err != nil {
					t.Fatal(err)
				}
			}
			steps := h.Steps()
			if got := slices.Contains(steps, "evict app/precious"); got != tt.wantEvicted {
				t.Errorf("do-not-disrupt pod evicted = %v, want %v; steps %q", got, tt.wantEvicted, steps)
			}
			if !slices.Contains(steps, "evict app/web") {
				t.Error("other pods were not evicted")
			}
			if got := len(h.cloud.Terminates()) > 0; got != tt.wantTerminate {
				t.Errorf("terminated = %v, want %v past the timeout with onTimeout %s; steps %q", got, tt.wantTerminate, tt.onTimeout, steps)
			}
			if !tt.wantTerminate {
				if decide.PhaseOf(h.node("n")) != decide.PhaseDraining || !hasEvent(h.events(), BlockDrainTimeout) {
					t.Errorf("onTimeout Wait: state %q, want Draining with a DrainTimedOut event", decide.PhaseOf(h.node("n")))
				}
			}
		})
	}
}

func TestDrainWaitsForPDBThenFollowsOnTimeout(t *testing.T) {
	for _, tt := range []struct {
		onTimeout     string
		wantTerminate bool
	}{{"Proceed", true}, {"Wait", false}} {
		t.Run(tt.onTimeout, func(t *testing.T) {
			h := newHarness(t, liveConfig(t, "policies:\n- name: p\n  nodeSelector: \"\"\n  drain: {timeout: 2m, onTimeout: "+tt.onTimeout+"}\n"))
			h.silent(newNode("n"))
			h.add(newPod("app", "guarded", "n"))
			h.pdb["app/guarded"] = true

			requeue, err := h.sync("n")
			if err != nil {
				t.Fatal(err)
			}
			if requeue != DefaultDrainRetryInterval {
				t.Errorf("requeue after a 429 = %s, want the drain retry interval", requeue)
			}
			if decide.PhaseOf(h.node("n")) != decide.PhaseDraining || !hasEvent(h.events(), BlockEvictionRefused) {
				t.Fatal("a refused eviction must hold the node in Draining with an EvictionBlocked event")
			}
			// Retry until past the timeout.
			for h.clock.Since(t0) <= 2*time.Minute+requeue {
				h.clock.Step(requeue)
				if requeue, err = h.sync("n"); err != nil {
					t.Fatal(err)
				}
				if requeue == 0 {
					break
				}
			}
			h.drive("n", 3)
			if got := len(h.cloud.Terminates()) > 0; got != tt.wantTerminate {
				t.Errorf("terminated = %v, want %v (onTimeout %s); steps %q", got, tt.wantTerminate, tt.onTimeout, h.Steps())
			}
			if !tt.wantTerminate && !hasEvent(h.events(), BlockDrainTimeout) {
				t.Error("no DrainTimedOut event")
			}
		})
	}
}

func TestDrainWaitsForGracePeriod(t *testing.T) {
	h := newHarness(t, nil)
	h.silent(newNode("n"))
	h.add(newPod("app", "slow", "n"))
	h.grace["app/slow"] = true
	requeue, err := h.sync("n")
	if err != nil {
		t.Fatal(err)
	}
	if requeue != 30*time.Second || len(h.cloud.Terminates()) != 0 {
		t.Fatalf("requeue %s, terminations %d: want to wait the pod's 30s grace period", requeue, len(h.cloud.Terminates()))
	}
	h.clock.Step(requeue)
	h.drive("n", 3)
	if !h.nodeGone("n") {
		t.Errorf("not finished after the grace period; steps %q", h.Steps())
	}
	if got := strings.Count(strings.Join(h.Steps(), ","), "evict app/slow"); got != 1 {
		t.Errorf("pod evicted %d times, want once (a terminating pod is not evicted again)", got)
	}
}

func TestConflictRecordsNothing(t *testing.T) {
	h := newHarness(t, nil)
	h.silent(newNode("n"))
	h.conflict = true
	if _, err := h.sync("n"); err == nil {
		t.Fatal("sync succeeded although the mark patch conflicted")
	}
	if len(h.Steps()) != 0 || decide.PhaseOf(h.node("n")) != decide.PhaseNone {
		t.Errorf("steps %q after a conflict, want none", h.Steps())
	}
	// The retry on fresh state succeeds.
	h.drive("n", 5)
	if !h.nodeGone("n") {
		t.Errorf("not remediated after the retry; steps %q", h.Steps())
	}
}

func TestNotOwnedInstanceIsNeverTerminated(t *testing.T) {
	h := newHarness(t, liveConfig(t, "policies:\n- name: p\n  nodeSelector: \"\"\n  drain: {enabled: false}\n"))
	n := h.silent(newNode("n"))
	h.cloud.mu.Lock()
	h.cloud.owned[instanceOf(n)] = false
	h.cloud.mu.Unlock()
	for range 3 {
		requeue, err := h.sync("n")
		if err != nil {
			t.Fatal(err)
		}
		h.clock.Step(requeue)
	}
	h.cloud.mu.Lock()
	state := h.cloud.instances[instanceOf(n)]
	h.cloud.mu.Unlock()
	if state != "running" || h.nodeGone("n") {
		t.Errorf("not-owned instance state %q, node gone %v", state, h.nodeGone("n"))
	}
	if !hasEvent(h.events(), BlockNotOwned) {
		t.Error("no InstanceNotOwned event")
	}
}

// TestUnauthorizedBlocksAndReleases: an IAM refusal at the termination is not retried in a
// loop: the node is handed back (uncordoned, untainted) and recorded Blocked, and looked at
// again after the recheck interval, when it goes through once authorised.
func TestUnauthorizedBlocksAndReleases(t *testing.T) {
	h := newHarness(t, liveConfig(t, "policies:\n- name: p\n  nodeSelector: \"\"\n  drain: {enabled: false}\n"))
	n := h.silent(newNode("n"))
	h.cloud.override[instanceOf(n)] = ResultUnauthorized
	requeue, err := h.sync("n")
	if err != nil {
		t.Fatal(err)
	}
	if requeue != DefaultBlockedRecheck || !hasEvent(h.events(), BlockUnauthorized) {
		t.Errorf("requeue %s; want the blocked recheck and an Unauthorized event", requeue)
	}
	got := h.node("n")
	if got.Spec.Unschedulable || hasTaint(got.Spec.Taints) || decide.PhaseOf(got) != decide.PhaseNone || got.Annotations[decide.AnnotationBlocked] != BlockUnauthorized {
		t.Fatalf("after Unauthorized: unschedulable %v, taint %v, state %q, blocked %q; want handed back and Blocked",
			got.Spec.Unschedulable, hasTaint(got.Spec.Taints), decide.PhaseOf(got), got.Annotations[decide.AnnotationBlocked])
	}
	if _, ok := got.Annotations[decide.AnnotationTerminationRequestedAt]; ok {
		t.Error("the termination intent survived the release")
	}
	// Before the recheck: nothing is tried.
	calls := len(h.cloud.Terminates()) + len(h.cloud.Describes())
	h.clock.Step(time.Minute)
	if r, err := h.sync("n"); err != nil || r != DefaultBlockedRecheck-time.Minute {
		t.Errorf("inside the recheck interval: requeue %s, err %v; want the rest of the interval", r, err)
	}
	if got := len(h.cloud.Terminates()) + len(h.cloud.Describes()); got != calls {
		t.Errorf("a Blocked node was retried inside its recheck interval (%d cloud calls, was %d)", got, calls)
	}
	delete(h.cloud.override, instanceOf(n))
	h.clock.Step(DefaultBlockedRecheck)
	h.drive("n", 5)
	if !h.nodeGone("n") {
		t.Errorf("not finished once authorised; steps %q", h.Steps())
	}
}

// roundTrips counts the API requests the controller sent (informer lists and watches excluded)
// and the cloud calls, since the given marks.
func (h *harness) roundTrips(apiFrom, describeFrom, terminateFrom int) (api, cloud int) {
	for _, a := range h.client.Actions()[apiFrom:] {
		if v := a.GetVerb(); v != "watch" && !(v == "list" && a.GetResource().Resource != "pods") {
			api++
		}
	}
	return api, len(h.cloud.Describes()) - describeFrom + len(h.cloud.Terminates()) - terminateFrom
}

// A policy without a drain has nothing to do between the cordon and the termination request,
// so one Node write comes before TerminateInstances, not two: the marking patch records the
// decision, cordons, taints and records the intent to terminate, after the ownership Describe,
// the recomputed decision, the rails and the rate limiter's token, exactly what the separate
// intent patch came after. When 50 nodes are due at once behind 16 workers, the API server's
// Node writes are what the last one waits for: each write a worker holds delays the nodes
// queued behind it (docs/benchmarks.md, session 9). Fails with the intent back in its own patch
// (3 writes, 2 of them before TerminateInstances).
func TestDueNodeWithoutDrainWritesOnceBeforeTerminate(t *testing.T) {
	h := newHarness(t, liveConfig(t, defaultCaps+"  drain: {enabled: false}\n"))
	h.silent(newNode("dead"))
	for i := range 8 {
		h.healthy(newNode(fmt.Sprintf("ok-%d", i)))
	}
	h.settle("dead")
	api0 := len(h.client.Actions())
	if _, err := h.sync("dead"); err != nil {
		t.Fatal(err)
	}
	want := []string{"patch dead mark+Cordoned+intent", "patch dead Terminating"}
	if got := h.Steps(); !slices.Equal(got, want) {
		t.Fatalf("first reconcile steps:\n got %q\nwant %q", got, want)
	}
	if got := h.cloud.Terminates(); len(got) != 1 {
		t.Fatalf("TerminateInstances calls = %q, want one", got)
	}
	api, cloud := h.roundTrips(api0, 0, 0)
	if api != 2 || cloud != 2 {
		t.Errorf("first reconcile: %d API + %d cloud round trips, want 2 (mark+cordon+intent, Terminating) + 2 (Describe, Terminate)", api, cloud)
	}
	// The intent is the marking patch's own timestamp, from which the NotFound confirmation
	// runs, and a replay finds it (TestTerminationIntentIsSafeToReplay).
	if got := h.node("dead").Annotations[decide.AnnotationTerminationRequestedAt]; got == "" {
		t.Error("no termination intent on the node")
	}
}

// TestDueNodeWithoutDrainAndNoTokenIsMarkedAlone: without a rate limiter token the node is
// cordoned at once (the decision is recorded), but no intent is recorded: the termination waits
// for its token in beginTermination, which reports it, and is requested once a token comes.
func TestDueNodeWithoutDrainAndNoTokenIsMarkedAlone(t *testing.T) {
	h := newHarness(t, liveConfig(t, "clusterPauseThreshold: 100%\nzonePauseThreshold: 100%\nterminationRateLimit: {perMinute: 1, burst: 1}\npolicies:\n- name: p\n  nodeSelector: \"\"\n  maxUnhealthy: 100%\n  maxInFlight: 10\n  drain: {enabled: false}\n"))
	h.silent(newNode("a"))
	h.silent(newNode("b"))
	for i := range 8 {
		h.healthy(newNode(fmt.Sprintf("ok-%d", i)))
	}
	h.settle("a")
	h.settle("b")
	if _, err := h.sync("a"); err != nil {
		t.Fatal(err)
	}
	requeue, err := h.sync("b")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"patch a mark+Cordoned+intent", "patch a Terminating", "patch b mark+Cordoned"}
	if got := h.Steps(); !slices.Equal(got, want) {
		t.Fatalf("steps:\n got %q\nwant %q", got, want)
	}
	if got := h.cloud.Terminates(); len(got) != 1 {
		t.Errorf("TerminateInstances calls = %q, want only a's", got)
	}
	if !hasEvent(h.events(), BlockRateLimited) {
		t.Errorf("no %s Event for b; events %q", BlockRateLimited, h.events())
	}
	if requeue <= 0 || requeue > time.Minute {
		t.Errorf("b requeued after %s, want when the next token comes (≤ 1m)", requeue)
	}
	h.clock.Step(requeue)
	h.drive("b", 3)
	if got := len(h.cloud.Terminates()); got != 2 {
		t.Errorf("TerminateInstances calls after the token came = %d, want 2", got)
	}
}

// A node due for termination holds its worker only up to the point of no return, and for as
// few round trips as the safety order allows: the ownership Describe, one patch that records
// the decision and cordons, taints and starts the drain, the pod list of the drain, the intent,
// TerminateInstances, and Terminating once EC2 accepted. The confirmation and the Node's
// deletion come in a later reconcile (the patch's own watch event queues it). With 50 nodes
// due at once behind a few workers, each round trip a worker holds delays every node queued
// behind it, and every API request takes a token of the client's burst (docs/benchmarks.md,
// sessions 6 and 7). Session 5 held 11 round trips (confirm and delete in the same
// reconcile), session 6 held 8 (Marked, Cordoned and Draining were three patches); now 6.
func TestDueNodeFreesItsWorkerAtThePointOfNoReturn(t *testing.T) {
	h := newHarness(t, nil)
	n := h.silent(newNode("dead"))
	for i := range 5 {
		h.healthy(newNode(fmt.Sprintf("ok-%d", i)))
	}
	h.settle("dead")
	api0 := len(h.client.Actions())
	requeue, err := h.sync("dead")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"patch dead mark+Draining", "patch dead intent", "patch dead Terminating"}
	if got := h.Steps(); !slices.Equal(got, want) {
		t.Fatalf("first reconcile steps:\n got %q\nwant %q", got, want)
	}
	if requeue <= 0 {
		t.Errorf("requeue after Terminating = %s, want a later confirmation", requeue)
	}
	api, cloud := h.roundTrips(api0, 0, 0)
	t.Logf("round trips held by the worker until the node is past the point of no return: %d API + %d cloud", api, cloud)
	if api != 4 || cloud != 2 {
		t.Errorf("first reconcile: %d API + %d cloud round trips, want 4 (mark+cordon+drain start, list pods, intent, Terminating) + 2 (Describe, Terminate)", api, cloud)
	}
	// The marking patch is the cordon: unschedulable and tainted in the same request, and sent
	// only after the ownership Describe.
	var first k8stesting.PatchAction
	for _, a := range h.client.Actions()[api0:] {
		if p, ok := a.(k8stesting.PatchAction); ok {
			first = p
			break
		}
	}
	var body struct {
		Spec struct {
			Unschedulable bool           `json:"unschedulable"`
			Taints        []corev1.Taint `json:"taints"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(first.GetPatch(), &body); err != nil {
		t.Fatal(err)
	}
	if !body.Spec.Unschedulable || !hasTaint(body.Spec.Taints) {
		t.Errorf("the marking patch does not cordon and taint: %s", first.GetPatch())
	}
	if got := h.cloud.Describes(); len(got) != 1 || !slices.Equal(h.cloud.stateAtTerminate, []string{string(decide.PhaseDraining)}) {
		t.Errorf("Describes %v, state at Terminate %v; want one Describe before the mark and Terminate from Draining", got, h.cloud.stateAtTerminate)
	}

	h.drive("dead", 5)
	if got, want := h.Steps()[len(want):], []string{"patch dead Terminated", "delete dead"}; !slices.Equal(got, want) {
		t.Errorf("later reconcile steps %q, want %q", got, want)
	}
	if got := h.cloud.Terminates(); !slices.Equal(got, []string{instanceOf(n)}) {
		t.Errorf("Terminate calls = %v, want one", got)
	}
}

// TestNodeIsDeletedOnceWhenTheCacheLags: recording Terminated queues the node again, and that
// reconcile may run after the DELETE and before the informer delivers it, finding the Node
// still Terminated in the cache. It must not send a second DELETE (session 6 counted 63 Node
// DELETEs for 50 terminated nodes with 16 workers). A new Node reusing the name (another UID) is
// judged afresh, not taken for the deleted one.
func TestNodeIsDeletedOnceWhenTheCacheLags(t *testing.T) {
	h := newHarness(t, nil)
	h.silent(newNode("dead"))
	h.drive("dead", 10)
	if !h.nodeGone("dead") {
		t.Fatalf("not deleted; steps %q", h.Steps())
	}
	h.settle("dead")
	// The cache lags: it still holds the Node as it was recorded Terminated.
	stale := newNode("dead", inPhase(decide.PhaseTerminated))
	stale.ResourceVersion = "1"
	store := h.c.factories[0].Core().V1().Nodes().Informer().GetStore()
	if err := store.Add(stale); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := h.c.syncNode(h.ctx, "dead"); err != nil {
			t.Fatal(err)
		}
	}
	deletes := 0
	for _, a := range h.client.Actions() {
		if a.GetVerb() == "delete" && a.GetResource() == nodesGVR {
			deletes++
		}
	}
	if deletes != 1 {
		t.Errorf("%d Node DELETEs for one terminated node, want 1; steps %q", deletes, h.Steps())
	}

	// Another Node with the same name and a new UID, also recorded Terminated: deleted.
	other := newNode("dead", inPhase(decide.PhaseTerminated))
	other.UID = "uid-dead-2"
	h.add(other)
	h.cloud.addInstance(other, "terminated")
	h.drive("dead", 5)
	if !h.nodeGone("dead") {
		t.Errorf("the new Node reusing the name was taken for the deleted one; steps %q", h.Steps())
	}
}
