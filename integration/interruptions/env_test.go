// Package interruptions_test runs the real nodevigil-remediator process against a real control
// plane and the EC2 emulator (DescribeInstances with instanceLifecycle, DescribeInstanceStatus
// with scheduled events) for AWS-initiated interruptions: spot notices, scheduled events seen
// only through EC2, cancels and maintenance waves. Kubelets and agents are simulated by the
// test renewing their Leases and writing the agent's conditions.
//
// The tests run in parallel on one cluster. Each has its own pool label value and emulator, and
// its remediator's nodeSelector is that pool, so no remediator sees, judges or touches another
// test's nodes. (Before the scope existed, a catch-all policy left them alone, but each
// remediator still judged them without their agent Leases, which live in another namespace, and
// released nodes another test's remediator was draining.)
package interruptions_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodevigil/nodevigil/integration/clusterenv"
	"github.com/nodevigil/nodevigil/integration/controlplane"
	"github.com/nodevigil/nodevigil/integration/ec2emu"
	"github.com/nodevigil/nodevigil/integration/testbin"
)

var (
	cp *controlplane.ControlPlane
	// bins holds the remediator's binary, built by TestMain.
	bins clusterenv.Binaries
)

const (
	clusterTag        = "kubernetes.io/cluster/itest"
	poolLabel         = "nodevigil.test/pool"
	zoneLabel         = "topology.kubernetes.io/zone"
	interruptionTaint = "nodevigil.io/interruption"
	interruptionMark  = "nodevigil.io/interruption"
	heartbeat         = time.Second
	leaseSeconds      = 5
)

func TestMain(m *testing.M) {
	os.Exit(clusterenv.Main(m, clusterenv.MainConfig{SharedPlane: &cp, Remediator: true, Parallel: 8}, &bins))
}

// env is one test's world: a namespace for agent Leases and the leader Lease (its name is also
// the pool label value), an EC2 emulator, simulated nodes and one remediator.
type env struct {
	t      *testing.T
	client kubernetes.Interface
	ns     string
	pool   string
	emu    *ec2emu.Server
	proc   *testbin.Process
	addr   string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	t.Parallel()
	c, err := cp.Client()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := cp.Namespace(t.Context(), "intr")
	if err != nil {
		t.Fatal(err)
	}
	emu := clusterenv.StartEmulator(t)
	return &env{t: t, client: c, ns: ns, pool: ns, emu: emu}
}

// start writes a RemediatorConfig whose first policy (remediation off) selects this test's
// pool, with the given interruptions block, and runs the remediator.
func (e *env) start(poolYAML string, extra ...string) {
	e.t.Helper()
	e.startPolicyMode(false, "action: None\ndrain: {timeout: 20s, honorDoNotDisrupt: true}\n"+poolYAML, extra...)
}

// simNode is a Node whose kubelet and agent Leases the test renews.
type simNode struct {
	name       string
	instanceID string
}

// addNode creates a Ready Node in the pool, its EC2 instance (spot when lifecycle is "spot"),
// and renews its kubelet and agent Leases until the test ends.
func (e *env) addNode(lifecycle string) *simNode {
	e.t.Helper()
	n, _ := e.addSilenceableNode(lifecycle)
	return n
}

// addSilenceableNode is addNode whose heartbeats (kubelet and agent Leases) stop when the
// returned function is called: a node that dies.
func (e *env) addSilenceableNode(lifecycle string) (*simNode, func()) {
	e.t.Helper()
	ctx, stop := context.WithCancel(e.t.Context())
	seq := clusterenv.NextSeq()
	n := &simNode{name: fmt.Sprintf("%s-n%d", e.pool, seq), instanceID: clusterenv.InstanceID(seq)}
	created, err := clusterenv.CreateNode(ctx, e.client, e.emu, clusterenv.NodeSpec{
		Name: n.name, InstanceID: n.instanceID, Zone: "us-east-1a", Lifecycle: lifecycle, ClusterTag: clusterTag,
		Labels: map[string]string{poolLabel: e.pool},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		stop()
		_ = e.client.CoreV1().Nodes().Delete(context.Background(), n.name, metav1.DeleteOptions{})
	})
	for _, ns := range []string{clusterenv.KubeletLeaseNamespace, e.ns} {
		go clusterenv.RenewLease(ctx, e.client, clusterenv.Lease{Namespace: ns, Node: created, Duration: leaseSeconds * time.Second, Interval: heartbeat})
	}
	return n, stop
}

// setCondition writes a Node condition as the agent does: a strategic merge keyed by type.
func (e *env) setCondition(n *simNode, typ, status, reason, message string) {
	e.t.Helper()
	now := time.Now().UTC().Format(time.RFC3339)
	body := fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":%q,"reason":%q,"message":%q,"lastHeartbeatTime":%q,"lastTransitionTime":%q}]}}`,
		typ, status, reason, message, now, now)
	if _, err := e.client.CoreV1().Nodes().PatchStatus(e.t.Context(), n.name, []byte(body)); err != nil {
		e.t.Fatalf("set condition %s on %s: %v", typ, n.name, err)
	}
}

// spotNotice writes the agent's NoSpotInterruption=False as it reads spot/instance-action.
func (e *env) spotNotice(n *simNode) {
	at := time.Now().Add(2 * time.Minute).UTC().Format(time.RFC3339)
	e.setCondition(n, "NoSpotInterruption", "False", "SpotTerminate", "spot interruption notice: AWS will terminate this instance at "+at+"; deadline "+at)
}

func (e *env) node(name string) (*corev1.Node, error) {
	return e.client.CoreV1().Nodes().Get(e.t.Context(), name, metav1.GetOptions{})
}

func cordonedForInterruption(n *corev1.Node) bool {
	return n.Spec.Unschedulable && slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == interruptionTaint })
}

// cordoned returns the nodes nodevigil holds cordoned for an interruption.
func (e *env) cordoned(nodes ...*simNode) []*simNode {
	var out []*simNode
	for _, n := range nodes {
		if obj, err := e.node(n.name); err == nil && cordonedForInterruption(obj) {
			out = append(out, n)
		}
	}
	return out
}

// eventually polls cond until it holds or timeout passes.
func (e *env) eventually(what string, timeout time.Duration, cond func(ctx context.Context) (bool, error)) {
	e.t.Helper()
	clusterenv.Judge{T: e.t, Client: e.client, EC2: e.emu}.Eventually(what, timeout, cond)
}

// never asserts that cond stays false for the whole of d.
func (e *env) never(what string, d time.Duration, cond func(ctx context.Context) bool) {
	e.t.Helper()
	clusterenv.Judge{T: e.t, Client: e.client, EC2: e.emu}.Never(what, d, cond)
}

func (e *env) hasEvent(node, reason string) bool {
	ok, _ := clusterenv.HasEvent(e.t.Context(), e.client, node, "", reason)
	return ok
}

// eventMessageHas reports whether an Event with reason about node has a message containing
// text.
func (e *env) eventMessageHas(node, reason, text string) bool {
	evs, err := clusterenv.Events(e.t.Context(), e.client, node)
	return err == nil && slices.ContainsFunc(evs, func(ev corev1.Event) bool { return ev.Reason == reason && strings.Contains(ev.Message, text) })
}

// podOn creates a pod bound to the node, optionally annotated do-not-disrupt.
func (e *env) podOn(node string, doNotDisrupt bool) *corev1.Pod {
	e.t.Helper()
	e.eventually("the default ServiceAccount", 30*time.Second, func(ctx context.Context) (bool, error) {
		_, err := e.client.CoreV1().ServiceAccounts(e.ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "workload-", Namespace: e.ns},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}}},
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

// evicted reports whether the pod is gone or going.
func (e *env) evicted(ctx context.Context, pod *corev1.Pod) bool {
	p, err := e.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	return apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil)
}
