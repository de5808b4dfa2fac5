package remediator_test

// The remediator's judgement on the real control plane (issue 10, items 1, 2, 3 and 7): an
// agent condition alone never kills a node, node clocks never matter, the startup deadline is
// only for nodes that never became ready, and a cluster without agent Leases is reported and
// left alone. Every negative ("nothing happens") is polled over a window measured against the
// toleration it must outlast, next to a positive control that shows the remediator acting in
// the same run, so each test can fail.

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/nodevigil/nodevigil/integration/clusterenv"
)

const (
	firstReadyKey = "nodevigil.io/first-ready-at"
	startupTaint  = "readiness.k8s.io/nodevigil-agent-not-ready"
	// staleAfter is when a Lease the remediator stops seeing change is stale: its duration
	// plus a quarter.
	staleAfter = leaseSeconds * time.Second * 5 / 4
)

// setCondition writes a Node condition as the agent does: a strategic merge keyed by type.
func (e *env) setCondition(n *simNode, typ, status, reason string) {
	e.t.Helper()
	now := time.Now().UTC().Format(time.RFC3339)
	body := fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":%q,"reason":%q,"message":"set by the test","lastHeartbeatTime":%q,"lastTransitionTime":%q}]}}`,
		typ, status, reason, now, now)
	if _, err := e.client.CoreV1().Nodes().PatchStatus(e.t.Context(), n.name, []byte(body)); err != nil {
		e.t.Fatalf("set condition %s on %s: %v", typ, n.name, err)
	}
}

// addTaint adds a NoSchedule taint with key to the node, as the agent does with its startup
// taint.
func (e *env) addTaint(n *simNode, key string) {
	e.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		obj, err := e.node(n.name)
		if err != nil {
			return err
		}
		obj.Spec.Taints = append(obj.Spec.Taints, corev1.Taint{Key: key, Effect: corev1.TaintEffectNoSchedule})
		_, err = e.client.CoreV1().Nodes().Update(e.t.Context(), obj, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatalf("taint %s: %v", n.name, err)
	}
}

// withStartupTaint creates the node with the agent's startup taint: no remediator ever sees
// it ready.
func withStartupTaint(n *simNode) { n.taints = append(n.taints, startupTaint) }

// waitObserving waits until r leads, then until the clock is in a later second than the one
// it was in when r was seen leading: a Node created after that (creationTimestamp has
// one-second resolution) is one r has watched since its creation, for which "never seen
// ready" means never ready (remediation/decide everReady).
func (e *env) waitObserving(r *replica) {
	e.t.Helper()
	var leading time.Time
	e.eventually(r.name+" leading", 60*time.Second, func(ctx context.Context) (bool, error) {
		v := metricValue(e.metrics(r), "nodevigil_remediator_is_leader")
		leading = time.Now() // after the scrape: r had begun observing by then
		return v == 1, nil
	})
	next := leading.Truncate(time.Second).Add(time.Second)
	e.eventually("the second after "+r.name+" was seen leading", 5*time.Second, func(context.Context) (bool, error) {
		return !time.Now().Before(next), nil
	})
}

// ref names n for clusterenv's checks.
func (n *simNode) ref() clusterenv.NodeRef {
	return clusterenv.NodeRef{Name: n.name, InstanceID: n.instanceID}
}

func refs(nodes []*simNode) []clusterenv.NodeRef {
	out := make([]clusterenv.NodeRef, len(nodes))
	for i, n := range nodes {
		out[i] = n.ref()
	}
	return out
}

// waitFirstReady waits until the remediator has recorded each node ready once.
func (e *env) waitFirstReady(nodes ...*simNode) {
	e.t.Helper()
	e.judge().WaitFirstReady(refs(nodes)...)
}

// touched reports why the remediator has acted on a node, or "".
func (e *env) touched(n *simNode) string {
	return clusterenv.Touched(e.t.Context(), e.client, e.emu, n.name, n.instanceID)
}

// untouchedUntil fails the test if the remediator acts on any of nodes before deadline, and
// meanwhile polls progress (the positive control) until it reports done.
func (e *env) untouchedUntil(deadline time.Time, progressTimeout time.Duration, progress func() bool, nodes ...*simNode) {
	e.t.Helper()
	e.judge().UntouchedUntil(deadline, progressTimeout, progress, refs(nodes)...)
}

// terminatedOnce waits until n's instance was terminated and its Node deleted, then checks
// that exactly one TerminateInstances named it.
func (e *env) terminatedOnce(n *simNode, timeout time.Duration) {
	e.t.Helper()
	e.judge().TerminatedOnce(n.ref(), timeout)
}

// Item 1: a kubelet the agent restarted locally keeps KubeletHealthy=False, but the kubelet
// Lease renews and Ready stays True: two signals are needed, so the kubelet toleration never
// starts. A silent node in the same pool is terminated meanwhile (the positive control).
func TestAgentConditionAloneNeverTerminates(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	restarted, silent := e.addNode("us-east-1a"), e.addNode("us-east-1a")
	others := []*simNode{e.addNode("us-east-1a"), e.addNode("us-east-1a")}
	const toleration = 4 * time.Second
	policy := strings.Replace(terminatePolicy, "kubeletUnhealthy: 30s", "kubeletUnhealthy: "+toleration.String(), 1)
	r := e.startReplica("replica-a", e.config(false, policy))
	e.waitReady(r)
	e.waitFirstReady(append(others, restarted, silent)...)

	e.setCondition(restarted, "KubeletHealthy", "False", "KubeletRestarted")
	start := time.Now()
	silent.set(false, false)
	// On the old judgement the restarted node was terminated one toleration after the
	// condition turned False; watch three times as long, and past the positive control.
	e.untouchedUntil(start.Add(3*toleration+staleAfter), 60*time.Second, func() bool {
		return e.terminations(silent.instanceID) > 0
	}, append(others, restarted)...)
	if e.hasEvent(restarted.name, "KubeletUnhealthy") {
		t.Errorf("KubeletUnhealthy event on a node whose kubelet Lease is fresh and Ready True; events: %v", e.eventReasons(restarted.name))
	}
	obj, err := e.node(restarted.name)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range obj.Status.Conditions {
		if c.Type == "KubeletHealthy" && c.Status != corev1.ConditionFalse {
			t.Errorf("the test's KubeletHealthy=False was overwritten: %+v", c)
		}
	}
	e.terminatedOnce(silent, 60*time.Second)
}

// Item 2: node clocks 10 minutes ahead and behind change nothing while the Leases renew; when
// they stop renewing, each node is terminated exactly once, whatever renewTime claims.
func TestClockSkewNeverMatters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	skewed := func(d time.Duration) func(*simNode) { return func(n *simNode) { n.skew = d } }
	ahead := e.addNode("us-east-1a", skewed(10*time.Minute))
	behind := e.addNode("us-east-1a", skewed(-10*time.Minute))
	others := []*simNode{e.addNode("us-east-1a"), e.addNode("us-east-1a")}
	r := e.startReplica("replica-a", e.config(false, terminatePolicy))
	e.waitReady(r)
	e.waitFirstReady(ahead, behind)
	e.waitFirstReady(others...)

	// The old judgement terminated the node 10 minutes behind as soon as it could: its Leases
	// looked expired for ten minutes. Watch past lease staleness + silentNode toleration (3s),
	// three times over.
	start := time.Now()
	e.untouchedUntil(start.Add(3*(staleAfter+3*time.Second)), time.Minute, func() bool { return true }, ahead, behind, others[0], others[1])

	ahead.set(false, false)
	behind.set(false, false)
	e.terminatedOnce(ahead, 60*time.Second)
	e.terminatedOnce(behind, 60*time.Second)
	for _, n := range others {
		if why := e.touched(n); why != "" {
			t.Errorf("healthy node %s was remediated: %s", n.name, why)
		}
	}
}

// Item 3: a node that was ready once and gets its startup taint back (the agent re-adds it
// after a failed check) is past startup for good: no StartupDeadlineExceeded, however old it
// is. A node that never shed the taint is replaced at its deadline (the positive control).
func TestStartupTaintBackOnReadyNodeIsNoStartupFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const deadline = 6 * time.Second
	policy := strings.Replace(terminatePolicy, "startupDeadline: 10m", "startupDeadline: "+deadline.String(), 1)
	ready := e.addNode("us-east-1a")
	others := []*simNode{e.addNode("us-east-1a"), e.addNode("us-east-1a")}
	r := e.startReplica("replica-a", e.config(false, policy))
	e.waitReady(r)
	// Created tainted once the remediator watches, so it knows the node never became ready
	// (a node it has not watched since its creation would be presumed ready past its deadline).
	e.waitObserving(r)
	neverReady := e.addNode("us-east-1a", withStartupTaint)
	e.waitFirstReady(append(others, ready)...)

	// The never-ready node is replaced once its deadline passed: the deadline is live.
	e.terminatedOnce(neverReady, 60*time.Second)
	e.expectEvent(neverReady.name, "StartupDeadlineExceeded")

	obj, err := e.node(ready.name)
	if err != nil {
		t.Fatal(err)
	}
	if age := time.Since(obj.CreationTimestamp.Time); age < deadline {
		t.Fatalf("node %s is %s old, not past its startup deadline %s: the test proves nothing", ready.name, age, deadline)
	}
	e.addTaint(ready, startupTaint)
	start := time.Now()
	// The old judgement terminated it at once: past its deadline, carrying the taint.
	e.untouchedUntil(start.Add(3*deadline), time.Minute, func() bool { return true }, append(others, ready)...)
	if e.hasEvent(ready.name, "StartupDeadlineExceeded") {
		t.Errorf("StartupDeadlineExceeded on a node that was ready; events: %v", e.eventReasons(ready.name))
	}
}

// Item 3 across a change of leader. The old leader saw a node ready, but its record was still
// queued by the paced writer (--first-ready-rate: one token, then one record per 1000 s) when
// that leader was killed, and the node got its startup taint back before the new leader saw it
// ready: no record, no memory. Unknown must never mean never ready: the new leader has not
// watched the node since its creation and its deadline has passed, so it presumes the node was
// ready, says so (FirstReadyPresumed) and leaves it to the normal tolerations. A node created
// tainted after the new leader began observing is replaced at its deadline (the positive
// control: the deadline is live under the new leader). Before, the day-old node was terminated
// for StartupDeadlineExceeded (checked by removing the presumption).
func TestFirstReadyLostOnLeaderChangeIsNoStartupFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const deadline = 6 * time.Second
	cfg := e.config(false, strings.Replace(terminatePolicy, "startupDeadline: 10m", "startupDeadline: "+deadline.String(), 1))
	a := e.startReplica("replica-a", cfg, "--first-ready-rate", "0.001", "--first-ready-burst", "1")
	e.waitReady(a)
	first := e.addNode("us-east-1a")
	e.waitFirstReady(first) // takes the one token: the writer works
	lost := e.addNode("us-east-1a")
	e.eventually("replica-a saw "+lost.name+" ready, its record queued", 60*time.Second, func(context.Context) (bool, error) {
		return metricValue(e.metrics(a), "nodevigil_remediator_first_ready_queued") == 1, nil
	})
	e.eventually(lost.name+" past its startup deadline", 30*time.Second, func(context.Context) (bool, error) {
		obj, err := e.node(lost.name)
		return err == nil && time.Since(obj.CreationTimestamp.Time) > deadline+time.Second, nil
	})
	a.proc.Kill()
	e.addTaint(lost, startupTaint) // the agent re-adds it after a failed check
	if obj, err := e.node(lost.name); err != nil || obj.Annotations[firstReadyKey] != "" {
		t.Fatalf("%s: record written before the leader died (%v): the test proves nothing", lost.name, err)
	}

	b := e.startReplica("replica-b", cfg)
	e.waitReady(b)
	e.waitObserving(b)
	neverReady := e.addNode("us-east-1a", withStartupTaint)
	e.eventually("FirstReadyPresumed on "+lost.name, 60*time.Second, func(context.Context) (bool, error) {
		if why := e.touched(lost); why != "" {
			return false, fmt.Errorf("node %s was remediated: %s; events: %v", lost.name, why, e.eventReasons(lost.name))
		}
		return e.hasEvent(lost.name, "FirstReadyPresumed"), nil
	})
	// Past the new leader's observe period and the never-ready node's deadline: had the
	// day-old node been judged never ready, it would have been terminated with it.
	start := time.Now()
	e.untouchedUntil(start.Add(2*deadline), 90*time.Second, func() bool {
		return e.terminations(neverReady.instanceID) > 0
	}, lost, first)
	e.terminatedOnce(neverReady, 60*time.Second)
	e.expectEvent(neverReady.name, "StartupDeadlineExceeded")
	if e.hasEvent(lost.name, "StartupDeadlineExceeded") {
		t.Errorf("StartupDeadlineExceeded on a node that was ready; events: %v", e.eventReasons(lost.name))
	}
}

// Item 7: the remediator looks for agent Leases where there are none (a wrong
// agentNamespace). It says so on /readyz and in its metrics, and terminates nothing — neither
// a node whose kubelet went silent nor one that kept its startup taint — instead of falling
// back to single-signal remediation.
func TestNoAgentLeasesIsLoudAndTerminatesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const (
		deadline   = 5 * time.Second
		toleration = 5 * time.Second
	)
	policy := strings.NewReplacer("startupDeadline: 10m", "startupDeadline: "+deadline.String(),
		"kubeletUnhealthy: 30s", "kubeletUnhealthy: "+toleration.String()).Replace(terminatePolicy)
	path := e.config(false, policy)
	cfg, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	wrong := strings.Replace(string(cfg), "agentNamespace: "+e.ns, "agentNamespace: nodevigil-nowhere", 1)
	if wrong == string(cfg) {
		t.Fatal("could not point the config at a wrong agentNamespace")
	}
	if err := os.WriteFile(path, []byte(wrong), 0o600); err != nil {
		t.Fatal(err)
	}

	dead, tainted := e.addNode("us-east-1a"), e.addNode("us-east-1a")
	others := []*simNode{e.addNode("us-east-1a"), e.addNode("us-east-1a")}
	e.addTaint(tainted, startupTaint)
	r := e.startReplica("replica-a", path)
	e.waitReady(r)
	start := time.Now()
	dead.set(false, false)

	// Positive: the misconfiguration is reported, on /readyz (still 200) and in the metrics.
	e.eventually("the misconfiguration on /readyz and in the metrics", 30*time.Second, func(ctx context.Context) (bool, error) {
		code, body := httpGet(ctx, r.metrics+"/readyz")
		if code != http.StatusOK || !strings.Contains(body, "no nodevigil agent Lease seen for any of") || !strings.Contains(body, "nodevigil-nowhere") {
			return false, nil
		}
		_, m := httpGet(ctx, r.metrics+"/metrics")
		return metricValue(m, "nodevigil_remediator_agents_missing") == 1 && metricValue(m, "nodevigil_remediator_agent_leases") == 0, nil
	})
	// Negative: the old judgement terminated both after the startup deadline (and the dead
	// one's kubelet toleration); watch well past both.
	e.untouchedUntil(start.Add(2*(deadline+toleration+staleAfter)), time.Minute, func() bool { return true }, append(others, dead, tainted)...)
	if !strings.Contains(r.proc.LogTail(1<<20), "no agent leases seen") {
		t.Errorf("no log line about the missing agent leases; log:\n%s", r.proc.LogTail(40))
	}
	// Polled: one scrape can miss clusterenv.Get's 2 s limit on a loaded machine (-1).
	e.eventually(`nodevigil_remediator_nodes{reason="NoAgentLeases"} >= 4 (the test's nodes)`, 30*time.Second, func(ctx context.Context) (bool, error) {
		_, m := httpGet(ctx, r.metrics+"/metrics")
		return metricValue(m, `nodevigil_remediator_nodes{reason="NoAgentLeases"}`) >= 4, nil
	})
}

// The remediator's endpoints and metrics, read as clusterenv reads them.
var (
	httpGet     = clusterenv.Get
	metricValue = clusterenv.MetricValue
	metricSum   = clusterenv.MetricSum
)

// TestNodesOutsideTheScopeAreNeverTouched: a remediator scoped to its pool (nodeSelector)
// whose one policy terminates every node it sees leaves alone a node outside the scope — one
// that is silent and that another remediator is draining (state Draining, cordoned): no
// release, no step of its own, no Event — and does not count it in the storm census:
// clusterPauseThreshold 1 pauses the cluster when two nodes are silent, so the silent node in
// scope is terminated (the positive control) only if the outside node is not counted.
func TestNodesOutsideTheScopeAreNeverTouched(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	in, healthy := e.addNode("us-east-1a"), e.addNode("us-east-1a")
	out := e.addNode("us-east-1a", func(n *simNode) { n.pool = e.pool + "-elsewhere" })
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"Draining"}},"spec":{"unschedulable":true}}`, stateKey)
	if _, err := e.client.CoreV1().Nodes().Patch(t.Context(), out.name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	path := clusterenv.WriteConfig(t, clusterenv.Config{
		AgentNamespace: e.ns, AgentLeaseSeconds: leaseSeconds, NodeSelector: poolLabel + "=" + e.pool,
		Policies: "- name: everything\n  nodeSelector: \"\"\n" + clusterenv.Indent(faultPolicy, "  ") + "\n",
	})
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(string(b), "clusterPauseThreshold: 100%\n", "clusterPauseThreshold: 1\n", 1)
	if cfg == string(b) {
		t.Fatal("the config has no clusterPauseThreshold line to replace")
	}
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	r := e.startReplica("replica-a", path, "--leader-elect=false")
	e.waitReady(r)
	e.waitFirstReady(in, healthy)

	out.set(false, false)
	in.set(false, false)
	e.terminatedOnce(in, 2*time.Minute)

	obj, err := e.node(out.name)
	if err != nil {
		t.Fatal(err)
	}
	if obj.Annotations[stateKey] != "Draining" || !obj.Spec.Unschedulable || e.terminations(out.instanceID) != 0 {
		t.Errorf("node %s outside the scope was touched: state %q (want Draining), unschedulable %v, terminations %d",
			out.name, obj.Annotations[stateKey], obj.Spec.Unschedulable, e.terminations(out.instanceID))
	}
	evs, err := clusterenv.Events(t.Context(), e.client, out.name)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if ev.Source.Component == "nodevigil-remediator" {
			t.Errorf("node %s outside the scope got a remediator Event: %s %s", out.name, ev.Reason, ev.Message)
		}
	}
	if why := e.touched(healthy); why != "" {
		t.Errorf("healthy node %s was remediated: %s", healthy.name, why)
	}
}
