// Package clusterenv is the test environment that the integration packages running the real
// nodevigil-remediator share (integration/remediator, integration/interruptions,
// integration/awsevents, integration/outage): simulated nodes on a real control plane (a Node,
// its instance in the EC2 emulator, and Leases renewed the way a kubelet and an agent renew
// them), the remediator process started with the flags every test gives it, an API-server
// proxy that can cut the remediator off (apiproxy.go), and the lookups the tests judge by:
// Events, metrics, and whether the remediator has touched a node. Main (main.go) is those
// packages' TestMain: it builds the binaries they run, once.
//
// It holds what is the same in every package; what differs (a package's policies, its nodes'
// labels, real agents or simulated ones) stays in the package.
package clusterenv

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/nodevigil/nodevigil/integration/controlplane"
	"github.com/nodevigil/nodevigil/integration/ec2emu"
	"github.com/nodevigil/nodevigil/integration/testbin"
)

// Well-known names the remediator and the tests agree on.
const (
	// ZoneLabel is the well-known zone label.
	ZoneLabel = "topology.kubernetes.io/zone"
	// KubeletLeaseNamespace holds the kubelets' node Leases.
	KubeletLeaseNamespace = "kube-node-lease"
	// AgentNodeLabel names the node on an agent's Lease.
	AgentNodeLabel = "nodevigil.io/node"
	// StateAnnotation is the remediator's record of a node's remediation step.
	StateAnnotation = "nodevigil.io/remediation-state"
	// FirstReadyAnnotation is the remediator's record of when it first saw a node ready.
	FirstReadyAnnotation = "nodevigil.io/first-ready-at"
)

var seq atomic.Int64

// NextSeq returns a number unique in the test process, for node names.
func NextSeq() int { return int(seq.Add(1)) }

// InstanceID returns an EC2-shaped instance ID unique to seq and the moment.
func InstanceID(seq int) string {
	return fmt.Sprintf("i-%017x", time.Now().UnixNano()&0xffffffffffff<<8|int64(seq&0xff))
}

// NodeSpec describes a simulated node.
type NodeSpec struct {
	Name       string
	InstanceID string
	Zone       string
	// Lifecycle is the instance's lifecycle in the emulator: ec2emu.LifecycleSpot or "".
	Lifecycle string
	// ClusterTag is the tag key (value "owned") the remediator's --cluster-tag-key expects.
	ClusterTag string
	Labels     map[string]string
	// Taints are NoSchedule taint keys the Node is created with.
	Taints []string
	// Conditions are condition types reported True at creation besides Ready (reason: the
	// type), e.g. the agent's KubeletHealthy.
	Conditions []string
}

// CreateNode adds the instance to the emulator and creates the Node with its providerID and
// the kubelet's first status report (Ready=True and s.Conditions), written as a strategic
// merge keyed by condition type so that it does not race the node lifecycle controller.
func CreateNode(ctx context.Context, c kubernetes.Interface, emu *ec2emu.Server, s NodeSpec) (*corev1.Node, error) {
	if err := emu.AddInstance(ec2emu.Instance{ID: s.InstanceID, Zone: s.Zone, Lifecycle: s.Lifecycle, Tags: map[string]string{s.ClusterTag: "owned"}}); err != nil {
		return nil, fmt.Errorf("add instance %s: %w", s.InstanceID, err)
	}
	labels := map[string]string{ZoneLabel: s.Zone}
	for k, v := range s.Labels {
		labels[k] = v
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Labels: labels},
		Spec:       corev1.NodeSpec{ProviderID: "aws:///" + s.Zone + "/" + s.InstanceID},
	}
	for _, k := range s.Taints {
		node.Spec.Taints = append(node.Spec.Taints, corev1.Taint{Key: k, Effect: corev1.TaintEffectNoSchedule})
	}
	created, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create node %s: %w", s.Name, err)
	}
	now := time.Now().UTC().Format(time.RFC3339)
	conds := []string{fmt.Sprintf(`{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":%[1]q,"lastTransitionTime":%[1]q}`, now)}
	for _, t := range s.Conditions {
		conds = append(conds, fmt.Sprintf(`{"type":%[2]q,"status":"True","reason":%[2]q,"lastHeartbeatTime":%[1]q,"lastTransitionTime":%[1]q}`, now, t))
	}
	status := `{"status":{"conditions":[` + strings.Join(conds, ",") + `]}}`
	if _, err := c.CoreV1().Nodes().PatchStatus(ctx, s.Name, []byte(status)); err != nil {
		return created, fmt.Errorf("set node %s status: %w", s.Name, err)
	}
	return created, nil
}

// Lease describes a node's Lease renewed by RenewLease: the kubelet's (in
// KubeletLeaseNamespace) or the agent's (in the agents' namespace, labelled with the node).
type Lease struct {
	Namespace string
	// Node owns the Lease (garbage-collected with it) and names it.
	Node     *corev1.Node
	Duration time.Duration
	// Interval is how often it is renewed.
	Interval time.Duration
	// On says whether the holder is alive; nil: always. While it returns false the Lease is
	// left alone, as by a dead kubelet or agent.
	On func() bool
	// Clock is the holder's clock, written as renewTime; nil: time.Now.
	Clock func() time.Time
}

// RenewLease creates and renews the Lease until ctx ends, ignoring errors (an API server
// that is down is retried at the next tick, as a kubelet does).
func RenewLease(ctx context.Context, c kubernetes.Interface, l Lease) {
	leases := c.CoordinationV1().Leases(l.Namespace)
	name := l.Node.Name
	dur := int32(l.Duration / time.Second)
	labels := map[string]string{}
	if l.Namespace != KubeletLeaseNamespace {
		labels[AgentNodeLabel] = name
	}
	owner := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: name, UID: l.Node.UID}}
	clock := l.Clock
	if clock == nil {
		clock = time.Now
	}
	t := time.NewTicker(l.Interval)
	defer t.Stop()
	for {
		if l.On == nil || l.On() {
			now := metav1.NewMicroTime(clock())
			cur, err := leases.Get(ctx, name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				_, _ = leases.Create(ctx, &coordinationv1.Lease{
					ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: l.Namespace, Labels: labels, OwnerReferences: owner},
					Spec:       coordinationv1.LeaseSpec{HolderIdentity: &name, LeaseDurationSeconds: &dur, RenewTime: &now},
				}, metav1.CreateOptions{})
			case err == nil:
				cur.Spec.RenewTime = &now
				_, _ = leases.Update(ctx, cur, metav1.UpdateOptions{})
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Remediator is how a test runs the real remediator.
type Remediator struct {
	// Name names the process in logs and is its POD_NAME.
	Name       string
	Bin        string
	Kubeconfig string
	// Namespace is its --namespace (leader Lease, Events' own namespace).
	Namespace string
	// Config is the path of its RemediatorConfig.
	Config     string
	EC2URL     string
	ClusterTag string
	// LogLevel is its --log-level; "" is debug.
	LogLevel string
	// Flags follow the common ones; a repeated flag takes the last value.
	Flags []string
}

// StartRemediator starts the remediator process with the flags every test uses (plain-HTTP
// metrics, the emulator as EC2 in us-east-1, text logs) and returns it with its listen address:
// it binds 127.0.0.1:0 and the port it bound is read back (testbin.Process.ListenAddr, within
// ctx), so no other process can take the port first.
func StartRemediator(ctx context.Context, r Remediator) (*testbin.Process, string, error) {
	level := r.LogLevel
	if level == "" {
		level = "debug"
	}
	p, err := testbin.Start(r.Name, r.Bin, append([]string{
		"--kubeconfig", r.Kubeconfig,
		"--namespace", r.Namespace,
		"--config", r.Config,
		"--listen-address", "127.0.0.1:0",
		"--metrics-secure=false", // these tests scrape plain HTTP; integration/install tests the secure server
		"--ec2-endpoint", r.EC2URL,
		"--aws-region", "us-east-1",
		"--cluster-tag-key", r.ClusterTag,
		"--log-format", "text",
		"--log-level", level,
	}, r.Flags...), "POD_NAME="+r.Name, "AWS_ACCESS_KEY_ID=itest", "AWS_SECRET_ACCESS_KEY=itest", "AWS_CA_BUNDLE=")
	if err != nil {
		return nil, "", err
	}
	addr, err := p.ListenAddr(ctx)
	if err != nil {
		_ = p.Stop(10 * time.Second)
		return nil, "", err
	}
	return p, addr, nil
}

// WaitReady waits until the process (named name) at addr answers /readyz with 200, failing
// early when it exits.
func WaitReady(ctx context.Context, name string, p *testbin.Process, addr string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if exited, err := p.Exited(); exited {
			return fmt.Errorf("%s exited: %v\n%s", name, err, p.LogTail(30))
		}
		if testbin.HTTPStatus(ctx, "http://"+addr+"/readyz") == http.StatusOK {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w\n%s", name, ctx.Err(), p.LogTail(30))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Events returns the Events naming node (in the default namespace, where the remediator's
// recorder writes Node Events).
func Events(ctx context.Context, c kubernetes.Interface, node string) ([]corev1.Event, error) {
	evs, err := c.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", node).String()})
	if err != nil {
		return nil, err
	}
	return evs.Items, nil
}

// HasEvent says whether an Event with reason (and type, when not empty) names the node.
func HasEvent(ctx context.Context, c kubernetes.Interface, node, typ, reason string) (bool, error) {
	evs, err := Events(ctx, c, node)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(evs, func(e corev1.Event) bool { return e.Reason == reason && (typ == "" || e.Type == typ) }), nil
}

// EventReasons lists the distinct reasons of the Events naming node, sorted; on error, the
// error's text.
func EventReasons(ctx context.Context, c kubernetes.Interface, node string) []string {
	evs, err := Events(ctx, c, node)
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, e := range evs {
		out = append(out, e.Reason)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Get reads url within two seconds; status 0 and "" when it cannot.
func Get(ctx context.Context, url string) (int, string) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, ""
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// MetricValue returns the value of the first sample whose name (with labels, as exposed)
// equals series, or -1.
func MetricValue(body, series string) float64 {
	for _, l := range strings.Split(body, "\n") {
		name, val, ok := strings.Cut(l, " ")
		if !ok || name != series {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			return -1
		}
		return v
	}
	return -1
}

// MetricSum adds up every sample of the metric name whose label set contains all of labels
// (each `key="value"`); -1 if the metric has no such sample.
func MetricSum(body, name string, labels ...string) float64 {
	sum, found := 0.0, false
	for _, l := range strings.Split(body, "\n") {
		series, val, ok := strings.Cut(l, " ")
		if !ok || (series != name && !strings.HasPrefix(series, name+"{")) {
			continue
		}
		match := true
		for _, lb := range labels {
			match = match && strings.Contains(series, lb)
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(val), 64); match && err == nil {
			sum, found = sum+v, true
		}
	}
	if !found {
		return -1
	}
	return sum
}

// Touched reports why the remediator has acted on the node, or "": its instance terminated,
// the Node deleted, a remediation state recorded, or a cordon.
func Touched(ctx context.Context, c kubernetes.Interface, emu *ec2emu.Server, node, instanceID string) string {
	if got := emu.Terminations(instanceID); got > 0 {
		return fmt.Sprintf("instance terminated %d times", got)
	}
	obj, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "node deleted"
	case err != nil:
		return ""
	case obj.Annotations[StateAnnotation] != "":
		return "remediation state " + obj.Annotations[StateAnnotation]
	case obj.Spec.Unschedulable:
		return "cordoned"
	}
	return ""
}

// NodeRef names a simulated node and its instance.
type NodeRef struct {
	Name       string
	InstanceID string
}

// Judge checks, within one test, what the remediator did to the test's nodes.
type Judge struct {
	T      testing.TB
	Client kubernetes.Interface
	EC2    *ec2emu.Server
}

// Eventually polls cond every 250 ms until it holds, fails or timeout passes.
func (j Judge) Eventually(what string, timeout time.Duration, cond func(ctx context.Context) (bool, error)) {
	j.T.Helper()
	if err := wait.PollUntilContextTimeout(j.T.Context(), 250*time.Millisecond, timeout, true, cond); err != nil {
		j.T.Fatalf("waiting for %s: %v", what, err)
	}
}

// WaitFirstReady waits until the remediator has recorded each node ready once
// (FirstReadyAnnotation).
func (j Judge) WaitFirstReady(nodes ...NodeRef) {
	j.T.Helper()
	for _, n := range nodes {
		j.Eventually(n.Name+" recorded first ready", 60*time.Second, func(ctx context.Context) (bool, error) {
			obj, err := j.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			return err == nil && obj.Annotations[FirstReadyAnnotation] != "", nil
		})
	}
}

// UntouchedUntil fails the test if the remediator acts on any of nodes (Touched) before
// deadline, and meanwhile polls progress (the positive control) until it reports done. It
// returns when both the window is over and progress is done.
func (j Judge) UntouchedUntil(deadline time.Time, progressTimeout time.Duration, progress func() bool, nodes ...NodeRef) {
	j.T.Helper()
	giveUp := time.Now().Add(progressTimeout)
	done := false
	for {
		for _, n := range nodes {
			if why := Touched(j.T.Context(), j.Client, j.EC2, n.Name, n.InstanceID); why != "" {
				j.T.Fatalf("node %s was remediated: %s; events: %v", n.Name, why, EventReasons(context.Background(), j.Client, n.Name))
			}
		}
		if !done && progress() {
			done = true
		}
		if done && !time.Now().Before(deadline) {
			return
		}
		if !done && time.Now().After(giveUp) {
			j.T.Fatalf("positive control did not happen within %s", progressTimeout)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TerminatedOnce waits until n's instance was terminated and its Node deleted, then checks
// that exactly one TerminateInstances named it.
func (j Judge) TerminatedOnce(n NodeRef, timeout time.Duration) {
	j.T.Helper()
	j.Eventually("TerminateInstances for "+n.Name, timeout, func(context.Context) (bool, error) {
		return j.EC2.Terminations(n.InstanceID) > 0, nil
	})
	j.Eventually("the Node "+n.Name+" deleted", timeout, func(ctx context.Context) (bool, error) {
		_, err := j.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if got := j.EC2.Terminations(n.InstanceID); got != 1 {
		j.T.Errorf("%s: instance terminated %d times, want exactly 1", n.Name, got)
	}
}

// planeStarts bounds how many control planes start at once: starting kube-apiserver is the
// heaviest moment of a test (its bootstrap controllers).
var planeStarts = make(chan struct{}, 2)

// StartControlPlane starts a control plane of the test's own (etcd, kube-apiserver,
// kube-controller-manager, ~400 MB), at most two starting at once, stopped when the test ends.
func StartControlPlane(t testing.TB, bins controlplane.Binaries) *controlplane.ControlPlane {
	t.Helper()
	planeStarts <- struct{}{}
	cp, err := controlplane.Start(t.Context(), controlplane.Config{Binaries: bins, Progress: io.Discard, StartTimeout: 3 * time.Minute})
	<-planeStarts
	if err != nil {
		t.Fatalf("start the control plane: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-apiserver log:\n%s", cp.LogTail("kube-apiserver", 20))
		}
		if err := cp.Stop(); err != nil {
			t.Errorf("stop the control plane: %v", err)
		}
	})
	return cp
}

// Never fails the test if cond holds at any poll (every 250 ms) during d.
func (j Judge) Never(what string, d time.Duration, cond func(ctx context.Context) bool) {
	j.T.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond(j.T.Context()) {
			j.T.Fatalf("%s happened", what)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// StartEmulator starts an EC2 emulator of the test's own (instances shut down in a second),
// closed when the test ends.
func StartEmulator(t testing.TB) *ec2emu.Server {
	t.Helper()
	emu := ec2emu.New(ec2emu.Config{ShutdownDelay: time.Second})
	if err := emu.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emu.Close() })
	return emu
}

// Config is a test's RemediatorConfig: the storm valves opened (zonePauseThreshold and
// clusterPauseThreshold 100%, each on a line of its own so a test can remove them) unless
// the test says otherwise, then its policies.
type Config struct {
	DryRun            bool
	AgentNamespace    string
	AgentLeaseSeconds int
	// NodeSelector scopes the remediator to the test's own nodes ("" every node). Tests that
	// share a cluster must set it: a remediator that sees another test's nodes judges them
	// without their agent Leases (another namespace) and releases what the other remediator is
	// remediating.
	NodeSelector string
	// Extra is more top-level YAML, before the policies.
	Extra string
	// Policies is the policies list (PoolPolicy and others).
	Policies string
}

// WriteConfig writes c into the test's temporary folder and returns its path.
func WriteConfig(t testing.TB, c Config) string {
	t.Helper()
	cfg := fmt.Sprintf("apiVersion: nodevigil.io/v1alpha1\nkind: RemediatorConfig\ndryRun: %t\nagentNamespace: %s\nagentLeaseDuration: %ds\nnodeSelector: %q\n%s"+
		"zonePauseThreshold: 100%%\nclusterPauseThreshold: 100%%\npolicies:\n%s", c.DryRun, c.AgentNamespace, c.AgentLeaseSeconds, c.NodeSelector, c.Extra, c.Policies)
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// PoolPolicy is a policy list item named "pool" selecting label=value, with body (more policy
// fields, YAML at the left margin).
func PoolPolicy(label, value, body string) string {
	return fmt.Sprintf("- name: pool\n  nodeSelector: %s=%s\n%s\n", label, value, Indent(body, "  "))
}

// Indent prefixes every line of s (trimmed) with prefix.
func Indent(s, prefix string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n")
}
