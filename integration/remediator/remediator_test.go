// Package remediator_test runs real nodevigil-remediator processes against a real control
// plane (with the node lifecycle controller and garbage collector running) and the EC2
// emulator, with simulated kubelets and agents renewing their Leases from the test.
//
// Every test has a control plane, an emulator and remediators of its own (newEnv), so the tests
// run in parallel: a remediator watches every Node of its cluster — and must, since a pause
// counts the whole cluster and a node no policy selects any more is handed back — so two tests
// sharing one cluster would act on each other's nodes. The tests mostly wait on tolerations;
// how many run at once is -parallel (defaultParallel unless given), each control plane costing
// about 400 MB.
package remediator_test

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/nodevigil/nodevigil/integration/clusterenv"
	"github.com/nodevigil/nodevigil/integration/controlplane"
	"github.com/nodevigil/nodevigil/integration/ec2emu"
	"github.com/nodevigil/nodevigil/integration/testbin"
)

// bins are the control plane's and the remediator's binaries, built by TestMain.
var bins clusterenv.Binaries

// defaultParallel is how many tests run at once when -parallel is not given: the tests mostly
// wait (tolerations, lease expiry, a throttling storm), so more than GOMAXPROCS (go test's
// default) pays off even on 2 cores; each one runs etcd, kube-apiserver and
// kube-controller-manager (~400 MB together).
const defaultParallel = 4

const (
	clusterTag     = "kubernetes.io/cluster/itest"
	stateKey       = "nodevigil.io/remediation-state"
	remediateTaint = "nodevigil.io/remediating"
	poolLabel      = "nodevigil.test/pool"
	zoneLabel      = "topology.kubernetes.io/zone"
	heartbeat      = 500 * time.Millisecond
	leaseSeconds   = 3
)

func TestMain(m *testing.M) {
	os.Exit(clusterenv.Main(m, clusterenv.MainConfig{OwnPlanes: true, Remediator: true, Parallel: defaultParallel}, &bins))
}

// env is one test's world: a namespace for agent Leases and the leader Lease, a pool label
// value, an EC2 emulator, simulated nodes and remediator replicas.
type env struct {
	t        *testing.T
	cp       *controlplane.ControlPlane
	client   kubernetes.Interface
	ns       string
	pool     string
	emu      *ec2emu.Server
	mu       sync.Mutex
	nodes    map[string]*simNode
	replicas []*replica
}

type replica struct {
	name    string
	proc    *testbin.Process
	metrics string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	cp := clusterenv.StartControlPlane(t, bins.Plane)
	c, err := cp.Client()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := cp.Namespace(t.Context(), "rem")
	if err != nil {
		t.Fatal(err)
	}
	emu := clusterenv.StartEmulator(t)
	return &env{t: t, cp: cp, client: c, ns: ns, pool: ns, emu: emu, nodes: map[string]*simNode{}}
}

// config writes a RemediatorConfig whose first policy selects this test's pool; every other
// node in the cluster falls to a final policy that does nothing.
func (e *env) config(dryRun bool, policyYAML string) string {
	e.t.Helper()
	return clusterenv.WriteConfig(e.t, clusterenv.Config{
		DryRun: dryRun, AgentNamespace: e.ns, AgentLeaseSeconds: leaseSeconds,
		Extra:    "terminationRateLimit:\n  perMinute: 600\n  burst: 20\n",
		Policies: clusterenv.PoolPolicy(poolLabel, e.pool, policyYAML) + "- name: others\n  nodeSelector: \"\"\n  action: None\n",
	})
}

// startReplica runs one remediator process; extra flags follow the defaults (a repeated flag
// takes the last value).
func (e *env) startReplica(name, configPath string, extra ...string) *replica {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 60*time.Second)
	defer cancel()
	p, addr, err := clusterenv.StartRemediator(ctx, clusterenv.Remediator{
		Name: name, Bin: bins.Remediator, Kubeconfig: e.cp.KubeconfigPath(), Namespace: e.ns, Config: configPath,
		EC2URL: e.emu.URL(), ClusterTag: clusterTag,
		Flags: append([]string{
			// A leader that cannot renew within the deadline exits (a Deployment would restart
			// it; here nobody does), so the deadline must outlast an API server stalled by a
			// loaded CI machine; a killed leader's successor waits out the lease duration.
			"--leader-elect-lease-duration", "15s",
			"--leader-elect-renew-deadline", "10s",
			"--leader-elect-retry-period", "1s",
			"--resync-period", "10s",
			"--termination-confirm-delay", "2s",
		}, extra...),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	r := &replica{name: name, proc: p, metrics: "http://" + addr}
	e.replicas = append(e.replicas, r)
	e.t.Cleanup(func() {
		_ = p.Stop(10 * time.Second)
		if e.t.Failed() {
			e.t.Logf("%s log:\n%s", name, p.LogTail(60))
		}
	})
	return r
}

// simNode is a Node with a simulated kubelet and agent renewing their Leases.
type simNode struct {
	name       string
	instanceID string
	mu         sync.Mutex
	kubeletOn  bool
	agentOn    bool
	skew       time.Duration // added to the renewTime the node's "clock" writes
	taints     []string      // NoSchedule taint keys the Node is created with
	pool       string        // the pool label's value when not the test's own
}

func (n *simNode) clock() time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	return time.Now().Add(n.skew)
}

func (n *simNode) set(kubelet, agent bool) {
	n.mu.Lock()
	n.kubeletOn, n.agentOn = kubelet, agent
	n.mu.Unlock()
}

func (n *simNode) state() (bool, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.kubeletOn, n.agentOn
}

// addNode creates a Node in the pool (zone us-east-1a), its EC2 instance, and starts its
// simulated kubelet and agent; opts adjust the simulated node before anything renews.
func (e *env) addNode(zone string, opts ...func(*simNode)) *simNode {
	e.t.Helper()
	ctx := e.t.Context()
	seq := clusterenv.NextSeq()
	id := clusterenv.InstanceID(seq)
	n := &simNode{name: fmt.Sprintf("%s-n%d", e.pool, seq), instanceID: id, kubeletOn: true, agentOn: true}
	for _, o := range opts {
		o(n)
	}
	created, err := clusterenv.CreateNode(ctx, e.client, e.emu, clusterenv.NodeSpec{
		Name: n.name, InstanceID: id, Zone: zone, ClusterTag: clusterTag,
		Labels: map[string]string{poolLabel: cmp.Or(n.pool, e.pool)}, Taints: n.taints, Conditions: []string{"KubeletHealthy"},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = e.client.CoreV1().Nodes().Delete(context.Background(), n.name, metav1.DeleteOptions{})
	})
	lease := func(ns string, on func() bool) {
		clusterenv.RenewLease(ctx, e.client, clusterenv.Lease{Namespace: ns, Node: created, Duration: leaseSeconds * time.Second, Interval: heartbeat, On: on, Clock: n.clock})
	}
	go lease(clusterenv.KubeletLeaseNamespace, func() bool { k, _ := n.state(); return k })
	go lease(e.ns, func() bool { _, a := n.state(); return a })
	e.mu.Lock()
	e.nodes[n.name] = n
	e.mu.Unlock()
	return n
}

func (e *env) node(name string) (*corev1.Node, error) {
	return e.client.CoreV1().Nodes().Get(e.t.Context(), name, metav1.GetOptions{})
}

// eventually polls cond until it holds or timeout passes.
func (e *env) eventually(what string, timeout time.Duration, cond func(ctx context.Context) (bool, error)) {
	e.t.Helper()
	e.judge().Eventually(what, timeout, cond)
}

// never asserts that cond stays false for the whole of d.
func (e *env) never(what string, d time.Duration, cond func(ctx context.Context) bool) {
	e.t.Helper()
	e.judge().Never(what, d, cond)
}

// judge is the shared checks of clusterenv on this test's cluster.
func (e *env) judge() clusterenv.Judge {
	return clusterenv.Judge{T: e.t, Client: e.client, EC2: e.emu}
}

func (e *env) terminations(id string) int { return e.emu.Terminations(id) }

func (e *env) hasEvent(node, reason string) bool {
	ok, _ := clusterenv.HasEvent(e.t.Context(), e.client, node, "", reason)
	return ok
}

func (e *env) eventReasons(node string) []string {
	return clusterenv.EventReasons(context.Background(), e.client, node)
}

// expectEvent waits for Events with every one of reasons about node. The recorder writes
// Events through a queue after the state they report, so checking once, right after that
// state was seen, races with it (session 6 CI failed on exactly that).
func (e *env) expectEvent(node string, reasons ...string) {
	e.t.Helper()
	const timeout = 30 * time.Second
	err := wait.PollUntilContextTimeout(e.t.Context(), 250*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		for _, r := range reasons {
			if !e.hasEvent(node, r) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		e.t.Errorf("no %v Event about %s within %v; events %v", reasons, node, timeout, e.eventReasons(node))
	}
}

func (e *env) waitReady(r *replica) {
	e.t.Helper()
	if err := clusterenv.WaitReady(e.t.Context(), r.name, r.proc, strings.TrimPrefix(r.metrics, "http://"), 60*time.Second); err != nil {
		e.t.Fatal(err)
	}
}

const terminatePolicy = `action: Terminate
startupGrace: 1s
startupDeadline: 10m
tolerations:
  silentNode: 3s
  kubeletUnhealthy: 30s
drain:
  enabled: true
  timeout: 20s
  honorDoNotDisrupt: true
  onTimeout: Proceed
maxUnhealthy: 50%
maxInFlight: 2`

func TestSilentNodeIsTerminatedAfterToleration(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a, b, c := e.addNode("us-east-1a"), e.addNode("us-east-1a"), e.addNode("us-east-1b")
	r := e.startReplica("replica-a", e.config(false, terminatePolicy))
	e.waitReady(r)
	// Once synced, the remediator collects at GOGC 50 (steadyGCPercent in its main.go: the
	// steady RSS at 10,000 nodes depends on it), unless the environment sets GOGC.
	wantGOGC := 50.0
	if v, ok := os.LookupEnv("GOGC"); ok {
		if n, err := strconv.Atoi(v); err == nil {
			wantGOGC = float64(n)
		}
	}
	e.eventually(fmt.Sprintf("go_gc_gogc_percent %v after the sync", wantGOGC), 30*time.Second, func(context.Context) (bool, error) {
		return clusterenv.MetricValue(e.metrics(r), "go_gc_gogc_percent") == wantGOGC, nil
	})
	time.Sleep(2 * leaseSeconds * time.Second) // past the new leader's observe period

	silencedAt := time.Now()
	a.set(false, false)
	e.eventually("TerminateInstances for the silent node", 60*time.Second, func(context.Context) (bool, error) {
		return e.terminations(a.instanceID) > 0, nil
	})
	took := time.Since(silencedAt)
	// Both Leases expire 3 s after the last renewal, then the 3 s toleration runs.
	if took < 5*time.Second {
		t.Errorf("terminated %s after silence: earlier than lease expiry + toleration (6s)", took)
	}
	t.Logf("silence → TerminateInstances: %s (lease %ds + toleration 3s)", took.Round(100*time.Millisecond), leaseSeconds)
	e.eventually("the Node object deleted once the instance is gone", 60*time.Second, func(ctx context.Context) (bool, error) {
		_, err := e.node(a.name)
		return apierrors.IsNotFound(err), nil
	})
	if got := e.terminations(a.instanceID); got != 1 {
		t.Errorf("instance terminated %d times, want exactly 1", got)
	}
	for _, n := range []*simNode{b, c} {
		obj, err := e.node(n.name)
		if err != nil {
			t.Fatal(err)
		}
		if obj.Spec.Unschedulable || obj.Annotations[stateKey] != "" || e.terminations(n.instanceID) != 0 {
			t.Errorf("healthy node %s was touched: unschedulable=%v state=%q terminations=%d",
				n.name, obj.Spec.Unschedulable, obj.Annotations[stateKey], e.terminations(n.instanceID))
		}
	}
}

func TestAgentSilentAloneNeverTerminates(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.addNode("us-east-1a")
	e.addNode("us-east-1a")
	r := e.startReplica("replica-a", e.config(false, terminatePolicy))
	e.waitReady(r)
	time.Sleep(2 * leaseSeconds * time.Second)

	a.set(true, false) // the kubelet keeps renewing; only the agent goes quiet
	e.eventually("an AgentSilent event", 30*time.Second, func(context.Context) (bool, error) {
		return e.hasEvent(a.name, "AgentSilent"), nil
	})
	e.never("any remediation of a node whose kubelet is fresh", 15*time.Second, func(ctx context.Context) bool {
		obj, err := e.node(a.name)
		return err != nil || obj.Spec.Unschedulable || obj.Annotations[stateKey] != "" || e.terminations(a.instanceID) > 0
	})
}

func TestMaxUnhealthyBlocksMassSilence(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var nodes []*simNode
	for range 4 {
		nodes = append(nodes, e.addNode("us-east-1a"))
	}
	// 25% of 4 nodes = 1: three silent nodes at once are more than the pool may lose.
	policy := strings.Replace(terminatePolicy, "maxUnhealthy: 50%", "maxUnhealthy: 25%", 1)
	r := e.startReplica("replica-a", e.config(false, policy))
	e.waitReady(r)
	time.Sleep(2 * leaseSeconds * time.Second)
	for _, n := range nodes[:3] {
		n.set(false, false)
	}
	e.eventually("a MaxUnhealthyExceeded event", 40*time.Second, func(context.Context) (bool, error) {
		for _, n := range nodes[:3] {
			if e.hasEvent(n.name, "MaxUnhealthyExceeded") {
				return true, nil
			}
		}
		return false, nil
	})
	e.never("a termination during a mass silence", 10*time.Second, func(context.Context) bool {
		for _, n := range nodes {
			if e.terminations(n.instanceID) > 0 {
				return true
			}
		}
		return false
	})
}

// podOn creates a pod bound to the node, optionally annotated do-not-disrupt.
func (e *env) podOn(node string, doNotDisrupt bool) *corev1.Pod {
	e.t.Helper()
	ctx := e.t.Context()
	e.eventually("the default ServiceAccount", 30*time.Second, func(ctx context.Context) (bool, error) {
		_, err := e.client.CoreV1().ServiceAccounts(e.ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "workload-", Namespace: e.ns},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}},
		},
	}
	if doNotDisrupt {
		pod.Annotations = map[string]string{"karpenter.sh/do-not-disrupt": "true"}
	}
	created, err := e.client.CoreV1().Pods(e.ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create pod: %v", err)
	}
	return created
}

func (e *env) forceDelete(pod *corev1.Pod) {
	e.t.Helper()
	zero := int64(0)
	if err := e.client.CoreV1().Pods(pod.Namespace).Delete(e.t.Context(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		e.t.Fatalf("delete pod: %v", err)
	}
}

func (e *env) waitState(n *simNode, state string, timeout time.Duration) {
	e.t.Helper()
	e.eventually(n.name+" in state "+state, timeout, func(ctx context.Context) (bool, error) {
		obj, err := e.node(n.name)
		return err == nil && obj.Annotations[stateKey] == state, nil
	})
}

func TestDoNotDisruptHoldsTheDrain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.addNode("us-east-1a")
	e.addNode("us-east-1a")
	pod := e.podOn(a.name, true)
	// The drain timeout bounds a do-not-disrupt pod too; with onTimeout Wait it keeps holding.
	r := e.startReplica("replica-a", e.config(false, strings.Replace(terminatePolicy, "onTimeout: Proceed", "onTimeout: Wait", 1)))
	e.waitReady(r)
	time.Sleep(2 * leaseSeconds * time.Second)
	a.set(false, false)

	e.waitState(a, "Draining", 40*time.Second)
	obj, err := e.node(a.name)
	if err != nil {
		t.Fatal(err)
	}
	if !obj.Spec.Unschedulable || !slices.ContainsFunc(obj.Spec.Taints, func(t corev1.Taint) bool { return t.Key == remediateTaint }) {
		t.Errorf("draining node should be cordoned and tainted %s: unschedulable=%v taints=%v", remediateTaint, obj.Spec.Unschedulable, obj.Spec.Taints)
	}
	// The drain timeout is 20 s with onTimeout Wait: the do-not-disrupt pod holds it past that.
	e.never("termination while a do-not-disrupt pod runs", 25*time.Second, func(context.Context) bool {
		return e.terminations(a.instanceID) > 0
	})
	e.expectEvent(a.name, "DoNotDisrupt")
	if _, err := e.client.CoreV1().Pods(e.ns).Get(t.Context(), pod.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("do-not-disrupt pod was evicted: %v", err)
	}
	e.forceDelete(pod)
	e.eventually("termination once the pod is gone", 40*time.Second, func(context.Context) (bool, error) {
		return e.terminations(a.instanceID) == 1, nil
	})
}

func TestLeaderKilledMidRemediationResumesExactlyOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.addNode("us-east-1a")
	e.addNode("us-east-1a")
	pod := e.podOn(a.name, true) // holds the pipeline in Draining while the leader dies
	cfg := e.config(false, terminatePolicy)
	r1 := e.startReplica("replica-a", cfg)
	r2 := e.startReplica("replica-b", cfg)
	e.waitReady(r1)
	e.waitReady(r2)
	time.Sleep(2 * leaseSeconds * time.Second)
	a.set(false, false)
	e.waitState(a, "Draining", 40*time.Second)

	lease, err := e.client.CoordinationV1().Leases(e.ns).Get(t.Context(), "nodevigil-remediator", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("leader lease: %v", err)
	}
	holder := ptr(lease.Spec.HolderIdentity)
	var leader, follower *replica
	for _, r := range []*replica{r1, r2} {
		if strings.HasPrefix(holder, r.name) {
			leader = r
		} else {
			follower = r
		}
	}
	if leader == nil {
		t.Fatalf("leader lease holder %q is neither replica", holder)
	}
	leader.proc.Kill()
	e.forceDelete(pod)

	e.eventually("the surviving replica terminates the instance", 60*time.Second, func(context.Context) (bool, error) {
		return e.terminations(a.instanceID) > 0, nil
	})
	e.eventually("the Node deleted", 60*time.Second, func(ctx context.Context) (bool, error) {
		_, err := e.node(a.name)
		return apierrors.IsNotFound(err), nil
	})
	if got := e.terminations(a.instanceID); got != 1 {
		t.Errorf("instance terminated %d times across the leader change, want exactly 1", got)
	}
	lease, err = e.client.CoordinationV1().Leases(e.ns).Get(t.Context(), "nodevigil-remediator", metav1.GetOptions{})
	if err != nil || !strings.HasPrefix(ptr(lease.Spec.HolderIdentity), follower.name) {
		t.Errorf("leadership did not pass to %s: %v %v", follower.name, ptr(lease.Spec.HolderIdentity), err)
	}
}

func TestDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.addNode("us-east-1a")
	e.addNode("us-east-1a")
	r := e.startReplica("replica-a", e.config(true, terminatePolicy))
	e.waitReady(r)
	time.Sleep(2 * leaseSeconds * time.Second)
	a.set(false, false)
	e.eventually("a WouldTerminate event", 40*time.Second, func(context.Context) (bool, error) {
		return e.hasEvent(a.name, "WouldTerminate"), nil
	})
	time.Sleep(5 * time.Second)
	after, err := e.node(a.name)
	if err != nil {
		t.Fatalf("dry-run deleted the node: %v", err)
	}
	if after.Spec.Unschedulable || slices.ContainsFunc(after.Spec.Taints, func(t corev1.Taint) bool { return t.Key == remediateTaint }) {
		t.Errorf("dry-run cordoned or tainted the node: unschedulable=%v taints=%v", after.Spec.Unschedulable, after.Spec.Taints)
	}
	if after.Annotations[stateKey] != "" {
		t.Errorf("dry-run started the pipeline: %s=%q", stateKey, after.Annotations[stateKey])
	}
	if n := e.emu.Calls("TerminateInstances"); n != 0 {
		t.Errorf("dry-run called TerminateInstances %d times", n)
	}
}

func TestRecoveringNodeIsReleased(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.addNode("us-east-1a")
	e.addNode("us-east-1a")
	e.podOn(a.name, true) // keeps the pipeline in Draining long enough to recover
	r := e.startReplica("replica-a", e.config(false, terminatePolicy))
	e.waitReady(r)
	time.Sleep(2 * leaseSeconds * time.Second)
	a.set(false, false)
	e.waitState(a, "Draining", 40*time.Second)

	a.set(true, true) // both heartbeats come back
	e.eventually("the node released", 40*time.Second, func(ctx context.Context) (bool, error) {
		obj, err := e.node(a.name)
		if err != nil {
			return false, nil
		}
		tainted := slices.ContainsFunc(obj.Spec.Taints, func(t corev1.Taint) bool { return t.Key == remediateTaint })
		return !obj.Spec.Unschedulable && !tainted && obj.Annotations[stateKey] == "", nil
	})
	e.expectEvent(a.name, "Released")
	if got := e.terminations(a.instanceID); got != 0 {
		t.Errorf("recovered node's instance terminated %d times", got)
	}
}

func ptr(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
