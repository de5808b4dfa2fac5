package interruptions_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevigil/nodevigil/integration/ec2emu"
	"github.com/nodevigil/nodevigil/integration/testbin"
)

// startPolicy runs the remediator with policy as the whole of this test's pool policy (name,
// selector and catch-all added here), for tests that need remediation on as well as the
// interruptions block (start keeps remediation off).
func (e *env) startPolicy(policy string, extra ...string) {
	e.t.Helper()
	e.startPolicyMode(false, policy, extra...)
}

// startPolicyMode is startPolicy in dry-run or live mode.
func (e *env) startPolicyMode(dryRun bool, policy string, extra ...string) {
	e.t.Helper()
	cfg := fmt.Sprintf(`apiVersion: nodevigil.io/v1alpha1
kind: RemediatorConfig
dryRun: %t
agentNamespace: %s
agentLeaseDuration: %ds
zonePauseThreshold: 100%%
clusterPauseThreshold: 100%%
policies:
- name: pool
  nodeSelector: %s=%s
%s
- name: others
  nodeSelector: ""
  action: None
  interruptions: {spotInterruption: Ignore, rebalanceRecommendation: Ignore, scheduledReboot: Ignore, scheduledRetirement: Ignore, asgTermination: Ignore}
`, dryRun, e.ns, leaseSeconds, poolLabel, e.pool, indent(policy, "  "))
	path := filepath.Join(e.t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		e.t.Fatal(err)
	}
	p, err := testbin.Start("remediator-"+e.ns, remediatorBin, append([]string{
		"--kubeconfig", cp.KubeconfigPath(),
		"--namespace", e.ns,
		"--config", path,
		"--listen-address", "127.0.0.1:0", // the port it binds is read back: no other process can take it first
		"--metrics-secure=false",
		"--ec2-endpoint", e.emu.URL(),
		"--aws-region", "us-east-1",
		"--cluster-tag-key", clusterTag,
		"--leader-elect=false",
		"--resync-period", "10s",
		"--scheduled-events-interval", "10s",
		"--log-format", "text",
		"--log-level", "debug",
	}, extra...), "POD_NAME=remediator-"+e.ns, "AWS_ACCESS_KEY_ID=itest", "AWS_SECRET_ACCESS_KEY=itest", "AWS_CA_BUNDLE=")
	if err != nil {
		e.t.Fatal(err)
	}
	e.proc = p
	e.t.Cleanup(func() {
		_ = p.Stop(10 * time.Second)
		if e.t.Failed() {
			e.t.Logf("remediator log:\n%s", p.LogTail(120))
		}
	})
	listenCtx, cancel := context.WithTimeout(e.t.Context(), 60*time.Second)
	defer cancel()
	if e.addr, err = p.ListenAddr(listenCtx); err != nil {
		e.t.Fatal(err)
	}
	e.eventually("remediator ready", 60*time.Second, func(ctx context.Context) (bool, error) {
		if exited, err := p.Exited(); exited {
			return false, fmt.Errorf("remediator exited: %v\n%s", err, p.LogTail(30))
		}
		return httpOK(ctx, "http://"+e.addr+"/readyz"), nil
	})
}

// addSilenceableNode is addNode whose heartbeats (kubelet and agent Leases) stop when the
// returned function is called: a node that dies.
func (e *env) addSilenceableNode(lifecycle string) (*simNode, func()) {
	e.t.Helper()
	ctx, stop := context.WithCancel(e.t.Context())
	nodeSeq.Lock()
	nodeSeq.n++
	seq := nodeSeq.n
	nodeSeq.Unlock()
	id := fmt.Sprintf("i-%017x", time.Now().UnixNano()&0xffffffffffff<<8|int64(seq&0xff))
	n := &simNode{name: fmt.Sprintf("%s-n%d", e.pool, seq), instanceID: id}
	const zone = "us-east-1a"
	if err := e.emu.AddInstance(ec2emu.Instance{ID: id, Zone: zone, Lifecycle: lifecycle, Tags: map[string]string{clusterTag: "owned"}}); err != nil {
		e.t.Fatal(err)
	}
	created, err := e.client.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{poolLabel: e.pool, zoneLabel: zone}},
		Spec:       corev1.NodeSpec{ProviderID: "aws:///" + zone + "/" + id},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create node: %v", err)
	}
	now := time.Now().UTC().Format(time.RFC3339)
	status := fmt.Sprintf(`{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":%[1]q,"lastTransitionTime":%[1]q}]}}`, now)
	if _, err := e.client.CoreV1().Nodes().PatchStatus(ctx, n.name, []byte(status)); err != nil {
		e.t.Fatalf("set node status: %v", err)
	}
	e.t.Cleanup(func() {
		stop()
		_ = e.client.CoreV1().Nodes().Delete(context.Background(), n.name, metav1.DeleteOptions{})
	})
	owner := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: created.Name, UID: created.UID}}
	go e.renew(ctx, n, "kube-node-lease", owner)
	go e.renew(ctx, n, e.ns, owner)
	return n, stop
}

// scrapeMetric sums the samples of the remediator's metric name whose labels contain all of
// labels; -1 when none.
func (e *env) scrapeMetric(ctx context.Context, name string, labels ...string) float64 {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.addr+"/metrics", nil)
	if err != nil {
		return -1
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	sum, found := 0.0, false
	for _, l := range strings.Split(string(body), "\n") {
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

// TestDeadNodeWaitsForInterruptionSlot: maxInFlight is one budget per pool for remediation and
// interruptions. With maxInFlight 1, one node cordoned and drained for a scheduled reboot holds
// the pool's slot; another node that dies past its toleration waits (a MaxInFlightReached
// Event and blocked_total), is not terminated while the slot is held, and once the reboot
// completes (the cordon lifted) is terminated exactly once.
func TestDeadNodeWaitsForInterruptionSlot(t *testing.T) {
	e := newEnv(t)
	rebooting := e.addNode("")
	dead, silence := e.addSilenceableNode("")
	if err := e.emu.AddScheduledEvent(rebooting.instanceID, ec2emu.ScheduledEvent{ID: eventID(40), Code: ec2emu.EventSystemReboot,
		Description: "The instance is scheduled for a reboot", NotBefore: time.Now().Add(30 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	e.startPolicy(`action: Terminate
startupGrace: 1s
tolerations: {silentNode: 3s, kubeletUnhealthy: 30s}
drain: {enabled: true, timeout: 20s, onTimeout: Proceed}
maxUnhealthy: 100%
maxInFlight: 1
interruptions: {scheduledReboot: Drain}`)
	e.eventually("the rebooting node cordoned", 40*time.Second, func(context.Context) (bool, error) {
		return len(e.cordoned(rebooting)) == 1, nil
	})
	silence()
	e.eventually("the dead node waiting for the slot (Event and metric)", 60*time.Second, func(ctx context.Context) (bool, error) {
		if n := e.emu.Terminations(dead.instanceID); n > 0 {
			return false, fmt.Errorf("dead node terminated while the pool's slot was held by the interruption")
		}
		return e.hasEvent(dead.name, "MaxInFlightReached") &&
			e.scrapeMetric(ctx, "nodevigil_remediator_blocked_total", `reason="MaxInFlightReached"`) >= 1, nil
	})
	if n := e.emu.Terminations(dead.instanceID); n > 0 {
		t.Fatal("dead node terminated while the slot was held")
	}
	// AWS reboots the instance: the event completes, the cordon is lifted, the slot frees.
	if err := e.emu.SetScheduledEventState(rebooting.instanceID, eventID(40), ec2emu.EventStateCompleted); err != nil {
		t.Fatal(err)
	}
	e.eventually("the rebooting node uncordoned", 40*time.Second, func(context.Context) (bool, error) {
		return len(e.cordoned(rebooting)) == 0, nil
	})
	e.eventually("the dead node terminated", 60*time.Second, func(context.Context) (bool, error) {
		return e.emu.Terminations(dead.instanceID) > 0, nil
	})
	e.eventually("the dead node's Node deleted", 60*time.Second, func(ctx context.Context) (bool, error) {
		_, err := e.node(dead.name)
		return err != nil, nil
	})
	if n := e.emu.Terminations(dead.instanceID); n != 1 {
		t.Errorf("%d TerminateInstances for the dead node, want 1", n)
	}
}
