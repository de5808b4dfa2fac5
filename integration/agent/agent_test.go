// Package agent_test runs the real nodevigil-agent binary against a real control plane, with a
// fake host root (procfs text, CNI files) and a fake kubelet /healthz server standing in for
// the node.
package agent_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/nodevigil/nodevigil/agent/timerslack"
	"github.com/nodevigil/nodevigil/integration/controlplane"
	"github.com/nodevigil/nodevigil/integration/testbin"
)

var (
	cp       *controlplane.ControlPlane
	agentBin string
)

const ownedTaint = "readiness.k8s.io/nodevigil-agent-not-ready"

func TestMain(m *testing.M) {
	bin, cleanup, err := testbin.BuildTemp(context.Background(), "github.com/nodevigil/nodevigil/agent/cmd/nodevigil-agent")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentBin = bin
	code := controlplane.RunTests(m, controlplane.Config{}, &cp)
	cleanup()
	os.Exit(code)
}

// node is one simulated node: a Node object, a host root on disk, a kubelet healthz server and
// the agent process for it.
type node struct {
	t         *testing.T
	name      string
	namespace string
	hostRoot  string
	healthz   *httptest.Server
	kubeletOK atomic.Bool
	metrics   string
	agent     *testbin.Process
	client    kubernetes.Interface
	extraArgs []string
}

func newNode(t *testing.T, withCNI bool, taints ...corev1.Taint) *node {
	t.Helper()
	ctx := t.Context()
	c, err := cp.Client()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := cp.Namespace(ctx, "agent")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, name: "node-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36), namespace: ns, client: c}
	n.kubeletOK.Store(true)
	n.healthz = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if n.kubeletOK.Load() {
			io.WriteString(w, "ok")
			return
		}
		http.Error(w, "[-]syncloop failed", http.StatusInternalServerError)
	}))
	t.Cleanup(n.healthz.Close)
	n.hostRoot = t.TempDir()
	writeHost(t, n.hostRoot, withCNI)
	obj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}, Spec: corev1.NodeSpec{Taints: taints}}
	if _, err := c.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node: %v", err)
	}
	t.Cleanup(func() { _ = c.CoreV1().Nodes().Delete(context.Background(), n.name, metav1.DeleteOptions{}) })
	return n
}

func writeHost(t *testing.T, root string, withCNI bool) {
	t.Helper()
	files := map[string]string{
		"proc/pressure/memory": "some avg10=0.00 avg60=0.00 avg300=0.00 total=1000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=500\n",
		"proc/meminfo":         "MemTotal:       8000000 kB\nMemFree:        4000000 kB\nMemAvailable:   6000000 kB\nBuffers:          10000 kB\nCached:         1000000 kB\n",
	}
	for name, data := range files {
		writeFile(t, filepath.Join(root, name), data, 0o644)
	}
	if err := os.MkdirAll(filepath.Join(root, "etc/cni/net.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if withCNI {
		installCNI(t, root)
	}
}

func installCNI(t *testing.T, root string) {
	t.Helper()
	for _, p := range []string{"bridge", "portmap"} {
		writeFile(t, filepath.Join(root, "opt/cni/bin", p), "#!/bin/sh\n", 0o755)
	}
	writeFile(t, filepath.Join(root, "etc/cni/net.d/10-test.conflist"),
		`{"cniVersion":"1.0.0","name":"test","plugins":[{"type":"bridge"},{"type":"portmap","capabilities":{"portMappings":true}}]}`, 0o644)
}

func writeFile(t *testing.T, path, data string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
}

// start runs the agent binary for the node with test-speed intervals.
func (n *node) start() {
	n.t.Helper()
	args := append([]string{"run",
		"--node-name", n.name,
		"--namespace", n.namespace,
		"--pod-name", "nodevigil-agent-" + n.name,
		"--kubeconfig", cp.KubeconfigPath(),
		"--host-root", n.hostRoot,
		"--listen-address", "127.0.0.1:0", // the port it binds is read back: no other process can take it first
		"--kubelet-healthz-url", n.healthz.URL + "/healthz",
		"--check-interval", "1s",
		"--lease-duration", "6s",
		"--lease-renew-interval", "1s",
		"--lease-renew-timeout", "800ms",
		"--check-timeout", "1s",
		"--condition-heartbeat", "1m",
		"--taint-stability-window", "3s",
		"--log-format", "text",
	}, n.extraArgs...)
	p, err := testbin.Start("nodevigil-agent", agentBin, args)
	if err != nil {
		n.t.Fatal(err)
	}
	n.agent = p
	n.t.Cleanup(func() {
		if err := p.Stop(10 * time.Second); err != nil {
			if exited, _ := p.Exited(); !exited || !strings.Contains(err.Error(), "signal: killed") {
				n.t.Errorf("agent did not shut down cleanly: %v\n%s", err, p.LogTail(20))
			}
		}
		if n.t.Failed() {
			n.t.Logf("agent log:\n%s", p.LogTail(60))
		}
	})
	ctx, cancel := context.WithTimeout(n.t.Context(), 60*time.Second)
	defer cancel()
	addr, err := p.ListenAddr(ctx)
	if err != nil {
		n.t.Fatal(err)
	}
	n.metrics = "http://" + addr
}

func (n *node) get(ctx context.Context) (*corev1.Node, error) {
	return n.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
}

// waitFor polls the Node until cond holds.
func (n *node) waitFor(what string, timeout time.Duration, cond func(*corev1.Node) bool) *corev1.Node {
	n.t.Helper()
	var last *corev1.Node
	err := wait.PollUntilContextTimeout(n.t.Context(), 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if n.agent != nil {
			if exited, err := n.agent.Exited(); exited {
				return false, fmt.Errorf("agent exited: %v", err)
			}
		}
		obj, err := n.get(ctx)
		if err != nil {
			return false, nil // API outages are part of some tests
		}
		last = obj
		return cond(obj), nil
	})
	if err != nil {
		var conds []string
		if last != nil {
			for _, c := range last.Status.Conditions {
				conds = append(conds, fmt.Sprintf("%s=%s(%s)", c.Type, c.Status, c.Reason))
			}
		}
		log := ""
		if n.agent != nil {
			log = n.agent.LogTail(40)
		}
		n.t.Fatalf("waiting for %s: %v\nconditions: %v\nagent log:\n%s", what, err, conds, log)
	}
	return last
}

func condition(obj *corev1.Node, t string) *corev1.NodeCondition {
	for i := range obj.Status.Conditions {
		if string(obj.Status.Conditions[i].Type) == t {
			return &obj.Status.Conditions[i]
		}
	}
	return nil
}

func hasStatus(t string, s corev1.ConditionStatus) func(*corev1.Node) bool {
	return func(obj *corev1.Node) bool {
		c := condition(obj, t)
		return c != nil && c.Status == s
	}
}

func hasTaint(obj *corev1.Node, key string) bool {
	for _, t := range obj.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

func TestConditionsAppearAndRecover(t *testing.T) {
	n := newNode(t, true)
	n.start()
	obj := n.waitFor("all agent conditions True", 30*time.Second, func(obj *corev1.Node) bool {
		return hasStatus("KubeletHealthy", corev1.ConditionTrue)(obj) &&
			hasStatus("NetworkingReady", corev1.ConditionTrue)(obj) &&
			hasStatus("MemoryHealthy", corev1.ConditionTrue)(obj)
	})
	if c := condition(obj, "Ready"); c != nil {
		t.Errorf("agent must never write the kubelet's Ready condition, found %+v", c)
	}

	n.kubeletOK.Store(false)
	obj = n.waitFor("KubeletHealthy=False", 20*time.Second, hasStatus("KubeletHealthy", corev1.ConditionFalse))
	if c := condition(obj, "KubeletHealthy"); !strings.Contains(c.Message, "500") && !strings.Contains(strings.ToLower(c.Message), "healthz") {
		t.Errorf("KubeletHealthy=False message should say what failed, got %q", c.Message)
	}
	n.kubeletOK.Store(true)
	n.waitFor("KubeletHealthy=True again", 20*time.Second, hasStatus("KubeletHealthy", corev1.ConditionTrue))

	resp, err := http.Get(n.metrics + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"nodevigil_agent_check_status", "nodevigil_agent_lease_renewals_total", "nodevigil_agent_condition_patches_total", "go_goroutines"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestTransitionTimeSurvivesRestart(t *testing.T) {
	n := newNode(t, true)
	n.start()
	obj := n.waitFor("KubeletHealthy=True", 30*time.Second, hasStatus("KubeletHealthy", corev1.ConditionTrue))
	before := condition(obj, "KubeletHealthy").LastTransitionTime

	if err := n.agent.Stop(10 * time.Second); err != nil {
		t.Fatalf("stop agent: %v", err)
	}
	time.Sleep(1100 * time.Millisecond) // transition times have second precision
	n.start()
	// Wait until the new agent has reported (it is ready once its first report landed).
	err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		resp, err := http.Get(n.metrics + "/readyz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("restarted agent never became ready: %v\n%s", err, n.agent.LogTail(30))
	}
	time.Sleep(2 * time.Second) // a few more cycles, in which a flapping agent would rewrite it
	obj, err = n.get(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	after := condition(obj, "KubeletHealthy")
	if after == nil || after.Status != corev1.ConditionTrue {
		t.Fatalf("KubeletHealthy after restart: %+v", after)
	}
	if !after.LastTransitionTime.Equal(&before) {
		t.Errorf("LastTransitionTime changed across an agent restart without a status change: %v -> %v", before, after.LastTransitionTime)
	}
}

func TestStartupTaintRemovedOnlyWhenReady(t *testing.T) {
	foreign := corev1.Taint{Key: "example.com/someone-else", Effect: corev1.TaintEffectNoSchedule}
	n := newNode(t, false,
		corev1.Taint{Key: ownedTaint, Effect: corev1.TaintEffectNoSchedule},
		foreign)
	n.start()
	n.waitFor("NetworkingReady=False while CNI is missing", 30*time.Second, hasStatus("NetworkingReady", corev1.ConditionFalse))
	// Kubelet is healthy, CNI is not: well past the stability window the taint must still be there.
	time.Sleep(6 * time.Second)
	obj, err := n.get(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !hasTaint(obj, ownedTaint) {
		t.Fatal("owned startup taint removed while CNI was not ready")
	}

	installCNI(t, n.hostRoot)
	obj = n.waitFor("NetworkingReady=True", 20*time.Second, hasStatus("NetworkingReady", corev1.ConditionTrue))
	readySince := condition(obj, "NetworkingReady").LastTransitionTime.Time
	obj = n.waitFor("owned taint removed", 30*time.Second, func(obj *corev1.Node) bool { return !hasTaint(obj, ownedTaint) })
	removedBy := time.Now()
	// The window is 3 s; transition times are truncated to seconds, so allow one second of slack.
	if got := removedBy.Sub(readySince); got < 2*time.Second {
		t.Errorf("taint removed %s after NetworkingReady turned True; want at least the 3s stability window", got)
	}
	if !hasTaint(obj, foreign.Key) {
		t.Errorf("agent removed a taint it does not own: %+v", obj.Spec.Taints)
	}
	// The removal is recorded as an Event on the Node.
	err = wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		evs, err := n.client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + n.name})
		if err != nil {
			return false, nil
		}
		for _, e := range evs.Items {
			if strings.Contains(e.Message, ownedTaint) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("no Event on the Node names the removed taint: %v", err)
	}
}

func TestLeaseRenewedAndCollectedWithNode(t *testing.T) {
	n := newNode(t, true)
	n.start()
	leases := n.client.CoordinationV1().Leases(n.namespace)
	var first *coordinationv1.Lease
	err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := leases.Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		first = l
		return l.Spec.RenewTime != nil, nil
	})
	if err != nil {
		t.Fatalf("no heartbeat lease: %v\n%s", err, n.agent.LogTail(30))
	}
	if len(first.OwnerReferences) != 1 || first.OwnerReferences[0].Kind != "Node" || first.OwnerReferences[0].Name != n.name {
		t.Errorf("lease ownerReferences = %+v, want the Node", first.OwnerReferences)
	}
	if got := ptrString(first.Spec.HolderIdentity); got != "nodevigil-agent-"+n.name {
		t.Errorf("holderIdentity = %q", got)
	}
	if d := first.Spec.LeaseDurationSeconds; d == nil || *d != 6 {
		t.Errorf("leaseDurationSeconds = %v, want 6", d)
	}
	err = wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := leases.Get(ctx, n.name, metav1.GetOptions{})
		return err == nil && l.Spec.RenewTime.After(first.Spec.RenewTime.Time), nil
	})
	if err != nil {
		t.Fatalf("lease not renewed: %v", err)
	}
	// The process renewing it is the one started, executed again in place with the agent's
	// timer slack (package timerslack), which every thread it starts inherits.
	slack, err := os.ReadFile(fmt.Sprintf("/proc/%d/timerslack_ns", n.agent.Pid()))
	if want := strconv.FormatInt(timerslack.Slack.Nanoseconds(), 10); err != nil || strings.TrimSpace(string(slack)) != want {
		t.Errorf("agent PID %d timer slack = %q (%v); want %s ns", n.agent.Pid(), slack, err, want)
	}

	if err := n.agent.Stop(10 * time.Second); err != nil {
		t.Fatalf("stop agent: %v", err)
	}
	if err := n.client.CoreV1().Nodes().Delete(t.Context(), n.name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(t.Context(), 500*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := leases.Get(ctx, n.name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("heartbeat lease not garbage-collected after its Node was deleted: %v", err)
	}
}

// TestSurvivesAPIServerRestart stops the apiserver while the kubelet turns unhealthy: the agent
// must stay alive (and say so on /healthz), then catch up once the API is back.
func TestSurvivesAPIServerRestart(t *testing.T) {
	n := newNode(t, true)
	n.start()
	n.waitFor("KubeletHealthy=True", 30*time.Second, hasStatus("KubeletHealthy", corev1.ConditionTrue))

	if err := cp.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			if err := cp.StartAPIServer(context.Background()); err != nil {
				t.Errorf("restart apiserver: %v", err)
			}
		}
	})
	n.kubeletOK.Store(false)
	time.Sleep(5 * time.Second)
	if exited, err := n.agent.Exited(); exited {
		t.Fatalf("agent exited during the API outage: %v\n%s", err, n.agent.LogTail(30))
	}
	resp, err := http.Get(n.metrics + "/healthz")
	if err != nil {
		t.Fatalf("agent /healthz unreachable during API outage: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("agent /healthz = %d during the API outage; it must not depend on the API server", resp.StatusCode)
	}

	if err := cp.StartAPIServer(t.Context()); err != nil {
		t.Fatalf("restart apiserver: %v", err)
	}
	restarted = true
	n.waitFor("KubeletHealthy=False after the API came back", 45*time.Second, hasStatus("KubeletHealthy", corev1.ConditionFalse))
	if exited, err := n.agent.Exited(); exited {
		t.Fatalf("agent exited: %v", err)
	}
}

func ptrString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
