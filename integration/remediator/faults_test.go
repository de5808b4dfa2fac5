package remediator_test

// The fault suite of issue 10 (item 9) on the real control plane: real remediator processes,
// the real AWS SDK against the EC2 emulator's fault injection, the controller manager running.
// Each test has a cluster of its own (newEnv) and runs in parallel with the others.

import (
	"context"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevigil/nodevigil/integration/ec2emu"
	"github.com/nodevigil/nodevigil/remediation/config"
)

// faultPolicy judges quickly and lets judgement alone decide: no drain, and caps that never
// bind, so a wrong verdict shows as a termination instead of being hidden by a rail.
const faultPolicy = `action: Terminate
startupGrace: 1s
tolerations:
  silentNode: 3s
drain:
  enabled: false
maxUnhealthy: 100%
maxInFlight: 10`

const (
	intentKey   = "nodevigil.io/termination-requested-at"
	blockedKey  = "nodevigil.io/remediation-blocked"
	silentNodeT = 3 * time.Second // faultPolicy's silentNode toleration
)

// metrics scrapes r, retrying for up to 30 s: one scrape can miss clusterenv.Get's 2 s limit
// on a loaded machine, and a missed scrape must not read as a metric's absence (-1).
func (e *env) metrics(r *replica) string {
	e.t.Helper()
	var body string
	e.eventually(r.name+" /metrics answering", 30*time.Second, func(ctx context.Context) (bool, error) {
		var code int
		code, body = httpGet(ctx, r.metrics+"/metrics")
		return code == http.StatusOK, nil
	})
	return body
}

// TestLeaderKilledAroundTerminateInstances: the remediator process is SIGKILLed while its
// TerminateInstances call is held by the emulator — before EC2 accepted it (nothing happens to
// the instance), and after EC2 accepted it but before the response (the instance is going, the
// process never learns it). In both, the intent is on the Node and the Terminating record is
// not; a new process resolves it, and exactly one carried-out TerminateInstances names the
// instance.
//
// The new process resolves the intent by describing the instance before anything else
// (remediation/terminate.go, "describe before terminate"): after EC2 accepted, it sees the
// instance going and records it terminated without asking EC2 again — its
// terminations_total stays 0 and the emulator receives no second TerminateInstances. (The ec2
// client also describes before it sends, so without the pipeline's Describe the emulator would
// still carry out one termination only; the new process's own record — a second "requested
// termination … AlreadyTerminated" counted and announced — is what shows the pipeline's guard
// gone, and this test fails on it.) Before EC2 accepted, the Describe shows the instance
// running, and the new process terminates it: terminations_total{result=Terminating} 1.
func TestLeaderKilledAroundTerminateInstances(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		mode ec2emu.HoldMode
		// what the new process counts in terminations_total{result}: the TerminateInstances
		// requests it made
		want map[string]float64
	}{
		{"before EC2 accepted", ec2emu.HoldBeforeAccept, map[string]float64{"Terminating": 1}},
		{"after EC2 accepted", ec2emu.HoldAfterAccept, map[string]float64{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			dead := e.addNode("us-east-1a")
			others := []*simNode{e.addNode("us-east-1a"), e.addNode("us-east-1a")}
			arrived := e.emu.HoldTerminate(dead.instanceID, tc.mode)
			t.Cleanup(func() { e.emu.ReleaseHold(dead.instanceID) })
			cfg := e.config(false, faultPolicy)
			r1 := e.startReplica("replica-a", cfg)
			e.waitReady(r1)
			e.waitFirstReady(append(others, dead)...)
			dead.set(false, false)
			select {
			case <-arrived:
			case <-time.After(90 * time.Second):
				t.Fatalf("TerminateInstances for the dead node never reached the emulator\n%s", r1.proc.LogTail(40))
			}
			obj, err := e.node(dead.name)
			if err != nil {
				t.Fatal(err)
			}
			if obj.Annotations[intentKey] == "" || obj.Annotations[stateKey] == "Terminating" {
				t.Fatalf("while EC2 holds the call: intent %q, state %q; want the intent recorded and not Terminating", obj.Annotations[intentKey], obj.Annotations[stateKey])
			}
			r1.proc.Kill()
			r2 := e.startReplica("replica-b", cfg)
			if tc.mode == ec2emu.HoldAfterAccept {
				// Carried out already; the killed process never learnt it.
				e.emu.ReleaseHold(dead.instanceID)
				if got := e.terminations(dead.instanceID); got != 1 {
					t.Fatalf("after the kill: %d terminations carried out, want 1", got)
				}
			} else {
				// The killed call is abandoned (its connection is gone); the hold stays until
				// the new process's own call arrives, so the old one cannot slip through.
				e.eventually("the new process's TerminateInstances", 90*time.Second, func(context.Context) (bool, error) {
					return e.emu.Calls("TerminateInstances") >= 2, nil
				})
				if got := e.terminations(dead.instanceID); got != 0 {
					t.Fatalf("before the hold was released: %d terminations carried out, want 0", got)
				}
				e.emu.ReleaseHold(dead.instanceID)
			}
			e.waitReady(r2)
			e.terminatedOnce(dead, 90*time.Second)
			m := e.metrics(r2)
			for _, result := range []string{"Terminating", "AlreadyTerminated", "NotFound", "NotOwned", "Unauthorized", "Failed"} {
				if got := max(metricSum(m, "nodevigil_remediator_terminations_total", `result="`+result+`"`), 0); got != tc.want[result] {
					t.Errorf("the new process counted %v termination requests with result %s, want %v (it must resolve the intent by describing the instance first)", got, result, tc.want[result])
				}
			}
			wantCalls := 2 // the killed process's held call, then the new process's
			if tc.mode == ec2emu.HoldAfterAccept {
				wantCalls = 1
			}
			if got := e.emu.Calls("TerminateInstances"); got != wantCalls {
				t.Errorf("the emulator received %d TerminateInstances requests, want %d", got, wantCalls)
			}
			e.expectEvent(dead.name, "InstanceTerminated")
			for _, n := range others {
				if why := e.touched(n); why != "" {
					t.Errorf("healthy node %s: %s", n.name, why)
				}
			}
		})
	}
}

// throttlePolicy is faultPolicy with a short drain that proceeds at its timeout: the storm must
// not be mistaken for a reason to wait for ever, nor the drain's Proceed for one to skip EC2's
// answer.
const throttlePolicy = `action: Terminate
startupGrace: 1s
tolerations:
  silentNode: 3s
drain:
  enabled: true
  timeout: 5s
  onTimeout: Proceed
maxUnhealthy: 100%
maxInFlight: 10`

// TestThrottlingStormThenTerminations: every EC2 call is answered RequestLimitExceeded for 60 s
// while two nodes die. Nothing is terminated during the storm; the pipeline's calls fail after
// the SDK's own retries, are counted as Throttled and retried with per-node backoff; once the
// storm ends both instances are terminated, each exactly once, and no healthy node is touched.
func TestThrottlingStormThenTerminations(t *testing.T) {
	t.Parallel()
	const storm = 60 * time.Second
	e := newEnv(t)
	a, b := e.addNode("us-east-1a"), e.addNode("us-east-1a")
	others := []*simNode{e.addNode("us-east-1a"), e.addNode("us-east-1a")}
	r := e.startReplica("replica-a", e.config(false, throttlePolicy))
	e.waitReady(r)
	e.waitFirstReady(a, b, others[0], others[1])

	e.emu.ThrottleFor("", storm)
	start := time.Now()
	a.set(false, false)
	b.set(false, false)
	e.eventually("a Throttled cloud error counted by the pipeline", storm, func(ctx context.Context) (bool, error) {
		_, m := httpGet(ctx, r.metrics+"/metrics")
		return metricSum(m, "nodevigil_remediator_cloud_errors_total", `kind="Throttled"`) >= 1, nil
	})
	for _, n := range []*simNode{a, b} {
		if got := e.terminations(n.instanceID); got != 0 && time.Since(start) < storm {
			t.Fatalf("%s terminated during the storm", n.name)
		}
	}
	e.terminatedOnce(a, storm+2*time.Minute)
	e.terminatedOnce(b, time.Minute)
	if took := time.Since(start); took < storm {
		t.Errorf("terminations done %s after the storm began, before it ended (%s)", took, storm)
	}
	m := e.metrics(r)
	throttled := metricSum(m, "nodevigil_remediator_cloud_errors_total", `kind="Throttled"`)
	attempts := metricSum(m, "nodevigil_ec2_requests_total", `code="RequestLimitExceeded"`)
	t.Logf("storm %s: %v pipeline calls failed Throttled, %v SDK attempts answered RequestLimitExceeded; done %s after it began",
		storm, throttled, attempts, time.Since(start).Round(time.Second))
	if throttled < 2 || attempts <= throttled {
		t.Errorf("backoff not visible: cloud_errors_total{kind=Throttled} = %v (want ≥ 2: retried after backing off), ec2_requests_total{code=RequestLimitExceeded} = %v (want more: the SDK retries each call)", throttled, attempts)
	}
	for _, n := range others {
		if why := e.touched(n); why != "" {
			t.Errorf("healthy node %s: %s", n.name, why)
		}
	}
}

// TestDoNotDisruptPodProceedsAtDrainTimeout: a pod annotated karpenter.sh/do-not-disrupt holds
// the drain only until the drain timeout; with onTimeout Proceed the node is then terminated,
// the pod never evicted. (TestDoNotDisruptHoldsTheDrain is the Wait variant.)
func TestDoNotDisruptPodProceedsAtDrainTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 8 * time.Second
	e := newEnv(t)
	a := e.addNode("us-east-1a")
	e.addNode("us-east-1a")
	pod := e.podOn(a.name, true)
	policy := strings.Replace(terminatePolicy, "timeout: 20s", "timeout: "+timeout.String(), 1)
	if !strings.Contains(policy, "onTimeout: Proceed") {
		t.Fatal("terminatePolicy no longer proceeds on timeout")
	}
	r := e.startReplica("replica-a", e.config(false, policy))
	e.waitReady(r)
	e.waitFirstReady(a)
	a.set(false, false)

	e.waitState(a, "Draining", 60*time.Second)
	draining := time.Now()
	// The drain started before it was seen; half the timeout is safely inside it.
	e.never("termination before the drain timeout", timeout/2, func(context.Context) bool {
		return e.terminations(a.instanceID) > 0
	})
	e.eventually("termination once the drain timed out", 60*time.Second, func(context.Context) (bool, error) {
		return e.terminations(a.instanceID) > 0, nil
	})
	if took := time.Since(draining); took < timeout/2 {
		t.Errorf("terminated %s after the drain was seen, inside its %s timeout", took, timeout)
	}
	if got, err := e.client.CoreV1().Pods(e.ns).Get(t.Context(), pod.Name, metav1.GetOptions{}); err != nil || got.DeletionTimestamp != nil {
		t.Errorf("do-not-disrupt pod was evicted: %v", err)
	}
	e.expectEvent(a.name, "DoNotDisrupt", "DrainTimedOut")
	e.terminatedOnce(a, time.Minute)
}

// TestUnauthorizedInstanceIsBlockedAndDoesNotHoldThePool: the IAM policy refuses
// TerminateInstances for one instance (UnauthorizedOperation). Its node is Blocked and handed
// back (uncordoned, untainted), its in-flight slot released, and a second dead node of the same
// pool is terminated under the shipped maxInFlight of 1.
func TestUnauthorizedInstanceIsBlockedAndDoesNotHoldThePool(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var nodes []*simNode
	for range 5 {
		nodes = append(nodes, e.addNode("us-east-1a"))
	}
	denied, second := nodes[0], nodes[1]
	e.emu.SetUnauthorizedInstance(denied.instanceID, true)
	r := e.startReplica("replica-a", e.config(false, defaultCapsPolicy))
	e.waitReady(r)
	e.waitFirstReady(nodes...)

	denied.set(false, false)
	e.eventually("the denied node Blocked", 90*time.Second, func(ctx context.Context) (bool, error) {
		obj, err := e.node(denied.name)
		return err == nil && obj.Annotations[blockedKey] == "Unauthorized", nil
	})
	obj, err := e.node(denied.name)
	if err != nil {
		t.Fatal(err)
	}
	tainted := false
	for _, tn := range obj.Spec.Taints {
		tainted = tainted || tn.Key == remediateTaint
	}
	if obj.Spec.Unschedulable || tainted || obj.Annotations[stateKey] != "" {
		t.Errorf("Blocked node not handed back: unschedulable %v, tainted %v, state %q", obj.Spec.Unschedulable, tainted, obj.Annotations[stateKey])
	}
	e.expectEvent(denied.name, "Unauthorized")

	second.set(false, false)
	e.terminatedOnce(second, 90*time.Second)
	if n := e.terminations(denied.instanceID); n != 0 {
		t.Errorf("denied instance terminated %d times", n)
	}
	if v := metricValue(e.metrics(r), `nodevigil_remediator_blocked_nodes{reason="Unauthorized"}`); v != 1 {
		t.Errorf("blocked_nodes{reason=Unauthorized} = %v, want 1", v)
	}
}

// stormPolicy takes every cap from the shipped defaults.
const stormPolicy = `action: Terminate
startupGrace: 1s
tolerations:
  silentNode: 3s
drain:
  enabled: false`

// TestZoneSilenceWithShippedDefaultsPauses: more nodes of one zone go silent than the shipped
// zonePauseThreshold allows, while the cluster-wide share and the pool's share stay within the
// shipped clusterPauseThreshold and maxUnhealthy (node counts computed from the config
// package's defaults). The zone is paused and nothing is terminated; when the nodes renew
// again the pause is lifted with no termination, and a node that dies afterwards is terminated
// — the pause is really gone. Its cluster is its own, so the cluster-wide count is this test's
// nodes.
func TestZoneSilenceWithShippedDefaultsPauses(t *testing.T) {
	t.Parallel()
	const zone, otherZone = "us-east-1c", "us-east-1d"
	zoneNodes := 4
	silent := config.PauseAllowed(config.DefaultZonePauseThreshold, zoneNodes) + 1
	for silent >= zoneNodes {
		zoneNodes++
		silent = config.PauseAllowed(config.DefaultZonePauseThreshold, zoneNodes) + 1
	}
	pool := config.Policy{MaxUnhealthy: config.DefaultMaxUnhealthy}
	otherNodes := 0
	for config.PauseAllowed(config.DefaultClusterPauseThreshold, zoneNodes+otherNodes) < silent || pool.AllowedUnhealthy(zoneNodes+otherNodes) < silent {
		otherNodes++
		if otherNodes > 40 {
			t.Fatalf("the shipped defaults (zone %s, cluster %s, maxUnhealthy %s) need more than 40 healthy nodes to isolate a zone pause",
				config.DefaultZonePauseThreshold.String(), config.DefaultClusterPauseThreshold.String(), config.DefaultMaxUnhealthy.String())
		}
	}
	t.Logf("shipped defaults: zone %s, cluster %s, maxUnhealthy %s → %d of %d nodes in %s silent, %d healthy in %s",
		config.DefaultZonePauseThreshold.String(), config.DefaultClusterPauseThreshold.String(), config.DefaultMaxUnhealthy.String(),
		silent, zoneNodes, zone, otherNodes, otherZone)

	e := newEnv(t)
	var inZone, all []*simNode
	for range zoneNodes {
		inZone = append(inZone, e.addNode(zone))
	}
	all = append(all, inZone...)
	for range otherNodes {
		all = append(all, e.addNode(otherZone))
	}
	// The shipped thresholds: the test config's overrides removed.
	path := e.config(false, stormPolicy)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.NewReplacer("zonePauseThreshold: 100%\n", "", "clusterPauseThreshold: 100%\n", "").Replace(string(b))
	if strings.Contains(cfg, "PauseThreshold") {
		t.Fatal("could not remove the pause threshold overrides from the test config")
	}
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	r := e.startReplica("replica-a", path)
	e.waitReady(r)
	e.waitFirstReady(all...)

	zonePaused := `nodevigil_remediator_zone_paused{zone="` + zone + `"}`
	start := time.Now()
	for _, n := range inZone[:silent] {
		n.set(false, false)
	}
	// The census counts the zone over its threshold (the gauge); the valve is what then keeps
	// each node's steps from being taken. Watch past staleness + toleration three times over:
	// nothing is taken away. Without the valve in checkRails the silent nodes are terminated
	// one by one, within the shipped maxUnhealthy and clusterPauseThreshold (checked by
	// removing it).
	e.eventually("the zone counted over its threshold", time.Minute, func(ctx context.Context) (bool, error) {
		_, m := httpGet(ctx, r.metrics+"/metrics")
		return metricValue(m, zonePaused) == 1, nil
	})
	e.untouchedUntil(start.Add(3*(staleAfter+silentNodeT)), time.Minute, func() bool { return true }, all...)
	paused := 0
	for _, n := range inZone[:silent] {
		if e.hasEvent(n.name, "ZonePaused") {
			paused++
		}
	}
	if paused == 0 {
		t.Errorf("no ZonePaused event on any silent node of %s", zone)
	}
	if v := metricValue(e.metrics(r), "nodevigil_remediator_cluster_paused"); v != 0 {
		t.Errorf("cluster_paused = %v: the test meant to isolate the zone pause", v)
	}

	// Healed: the nodes renew again; the pause ends with no termination.
	for _, n := range inZone[:silent] {
		n.set(true, true)
	}
	e.eventually("the zone pause lifted", time.Minute, func(ctx context.Context) (bool, error) {
		_, m := httpGet(ctx, r.metrics+"/metrics")
		return metricValue(m, zonePaused) == 0, nil
	})
	healed := time.Now()
	e.untouchedUntil(healed.Add(staleAfter+silentNodeT), time.Minute, func() bool { return true }, all...)

	// Lifted for real: one node dying now is terminated.
	dies := inZone[0]
	dies.set(false, false)
	e.terminatedOnce(dies, 90*time.Second)
	for _, n := range all[1:] {
		if why := e.touched(n); why != "" {
			t.Errorf("healthy node %s: %s", n.name, why)
		}
	}
}

// TestOnlyNodeOfAQuietClusterIsRemediated: the test's node is the only one renewing Leases in
// the cluster; when it dies, no kubelet or agent Lease changes any more, exactly as when the
// remediator cannot observe. The remediator asks the API server, finds its cache current, and
// remediates the node — a quiet cluster is not mistaken for blindness for ever.
func TestOnlyNodeOfAQuietClusterIsRemediated(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	only := e.addNode("us-east-1a")
	r := e.startReplica("replica-a", e.config(false, faultPolicy), "--leader-elect=false")
	e.waitReady(r)
	e.waitFirstReady(only)
	leases, err := e.client.CoordinationV1().Leases("kube-node-lease").List(t.Context(), metav1.ListOptions{})
	if err != nil || len(leases.Items) != 1 {
		t.Fatalf("this test's kubelet Lease should be the only one in its cluster: %v, %d Leases", err, len(leases.Items))
	}
	only.set(false, false)
	e.terminatedOnce(only, 2*time.Minute)
	if v := metricSum(e.metrics(r), "nodevigil_remediator_observation_verifications_total", `result="current"`); v < 1 {
		t.Errorf("observation_verifications_total{result=current} = %v, want ≥ 1", v)
	}
}
