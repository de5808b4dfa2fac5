package interruptions_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nodevigil/nodevigil/integration/clusterenv"
	"github.com/nodevigil/nodevigil/integration/ec2emu"
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
	path := clusterenv.WriteConfig(e.t, clusterenv.Config{
		DryRun: dryRun, AgentNamespace: e.ns, AgentLeaseSeconds: leaseSeconds,
		NodeSelector: poolLabel + "=" + e.pool,
		Policies:     clusterenv.PoolPolicy(poolLabel, e.pool, policy),
	})
	listenCtx, cancel := context.WithTimeout(e.t.Context(), 60*time.Second)
	defer cancel()
	p, addr, err := clusterenv.StartRemediator(listenCtx, clusterenv.Remediator{
		Name: "remediator-" + e.ns, Bin: bins.Remediator, Kubeconfig: cp.KubeconfigPath(), Namespace: e.ns, Config: path,
		EC2URL: e.emu.URL(), ClusterTag: clusterTag,
		Flags: append([]string{"--leader-elect=false", "--resync-period", "10s", "--scheduled-events-interval", "10s"}, extra...),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.addr = addr
	e.proc = p
	e.t.Cleanup(func() {
		_ = p.Stop(10 * time.Second)
		if e.t.Failed() {
			e.t.Logf("remediator log:\n%s", p.LogTail(120))
		}
	})
	if err := clusterenv.WaitReady(e.t.Context(), "remediator-"+e.ns, p, e.addr, 60*time.Second); err != nil {
		e.t.Fatal(err)
	}
}

// scrapeMetric sums the samples of the remediator's metric name whose labels contain all of
// labels; -1 when none.
func (e *env) scrapeMetric(ctx context.Context, name string, labels ...string) float64 {
	_, body := clusterenv.Get(ctx, "http://"+e.addr+"/metrics")
	return clusterenv.MetricSum(body, name, labels...)
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
