// Package outage_test stops kube-apiserver under a running nodevigil-remediator, for 20 s and
// for the 10 minutes issue 10 names, and checks that the outage terminates no healthy node
// and that a node that died during it is terminated once afterwards.
//
// It is a package of its own so that the 10-minute case, which mostly waits, runs beside the
// other integration packages (make test runs them in parallel) instead of lengthening one of
// them. Each case has a control plane of its own: stopping the API server would stop every
// other test sharing it.
package outage_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/nodevigil/nodevigil/integration/clusterenv"
	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

// bins are the control plane's and the remediator's binaries, built by TestMain.
var bins clusterenv.Binaries

const (
	clusterTag   = "kubernetes.io/cluster/itest"
	poolLabel    = "nodevigil.test/pool"
	zone         = "us-east-1a"
	heartbeat    = 500 * time.Millisecond
	leaseSeconds = 3
	// staleAfter is when a Lease the remediator stops seeing change is stale: its duration
	// plus a quarter.
	staleAfter = leaseSeconds * time.Second * 5 / 4
	// silentNodeT is policy's silentNode toleration.
	silentNodeT = 3 * time.Second
)

// policy judges quickly and lets judgement alone decide: no drain, and caps that never bind,
// so a wrong verdict shows as a termination instead of being hidden by a rail.
const policy = `action: Terminate
startupGrace: 1s
tolerations: {silentNode: 3s}
drain: {enabled: false}
maxUnhealthy: 100%
maxInFlight: 10`

func TestMain(m *testing.M) {
	os.Exit(clusterenv.Main(m, clusterenv.MainConfig{OwnPlanes: true, Remediator: true}, &bins))
}

// simNode is a node whose kubelet and agent Leases the test renews until it dies.
type simNode struct {
	clusterenv.NodeRef
	mu    sync.Mutex
	alive bool
}

func (n *simNode) on() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.alive
}

// die stops both heartbeats: the node's kubelet and agent are gone.
func (n *simNode) die() {
	n.mu.Lock()
	n.alive = false
	n.mu.Unlock()
}

// addNode creates a Ready node in the pool and renews its kubelet and agent Leases (in ns)
// until it dies or the test ends.
func addNode(t *testing.T, c kubernetes.Interface, emu *ec2emu.Server, ns string) *simNode {
	t.Helper()
	seq := clusterenv.NextSeq()
	n := &simNode{NodeRef: clusterenv.NodeRef{Name: fmt.Sprintf("%s-n%d", ns, seq), InstanceID: clusterenv.InstanceID(seq)}, alive: true}
	created, err := clusterenv.CreateNode(t.Context(), c, emu, clusterenv.NodeSpec{
		Name: n.Name, InstanceID: n.InstanceID, Zone: zone, ClusterTag: clusterTag,
		Labels: map[string]string{poolLabel: ns}, Conditions: []string{"KubeletHealthy"},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, lns := range []string{clusterenv.KubeletLeaseNamespace, ns} {
		go clusterenv.RenewLease(t.Context(), c, clusterenv.Lease{Namespace: lns, Node: created, Duration: leaseSeconds * time.Second, Interval: heartbeat, On: n.on})
	}
	return n
}

// TestAPIServerOutageTerminatesNothing: kube-apiserver is stopped for the outage and started
// again on the same port with the same etcd; the remediator reaches it through
// clusterenv.APIProxy, which also refuses its connections meanwhile. When the API server is
// back the proxy lets everything through but the remediator's Lease lists and watches, until
// its Node informer is back and staleness + toleration have passed twice: that is where
// client-go leaves a process after a long outage (each reflector backs off on its own, up to
// 30 s doubled by jitter), with Node writes and EC2 calls working while the Lease cache is
// still from before the outage. Only the blindness guard (remediation/observe.go) keeps the
// healthy nodes then: their Leases have not been seen changing for the whole outage. Without
// it they are terminated (checked by removing it, for both outages).
//
// 20 s is the Lease duration plus grace plus toleration on the remediator's clock (3 s + 0.75 s
// + 3 s here) three times over, so every Lease has gone "unobserved for longer than it may";
// 10 minutes is the outage issue 10 names, with client-go's real backoff after it, and every
// renewal of the nodes' kubelets failing for that long. The two cases run in parallel, each on
// its own control plane; the 10-minute one sets the package's time (about 12 minutes, mostly
// waiting). The remediator runs without leader election (with it, the outage would end its
// term and a restarted process would observe from zero anyway). The node that died during the
// outage is terminated exactly once afterwards, and no healthy node is touched.
func TestAPIServerOutageTerminatesNothing(t *testing.T) {
	for _, outage := range []time.Duration{20 * time.Second, 10 * time.Minute} {
		t.Run(outage.String(), func(t *testing.T) {
			t.Parallel()
			runOutage(t, outage)
		})
	}
}

func runOutage(t *testing.T, outage time.Duration) {
	cp := clusterenv.StartControlPlane(t, bins.Plane)
	c, err := cp.Client()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := cp.Namespace(t.Context(), "outage")
	if err != nil {
		t.Fatal(err)
	}
	emu := clusterenv.StartEmulator(t)
	j := clusterenv.Judge{T: t, Client: c, EC2: emu}

	var healthy []clusterenv.NodeRef
	for range 4 {
		healthy = append(healthy, addNode(t, c, emu, ns).NodeRef)
	}
	dies := addNode(t, c, emu, ns)

	cfgPath := clusterenv.WriteConfig(t, clusterenv.Config{AgentNamespace: ns, AgentLeaseSeconds: leaseSeconds, Policies: clusterenv.PoolPolicy(poolLabel, ns, policy)})
	proxy := clusterenv.NewAPIProxy(t, cp.Config())
	r, addr, err := clusterenv.StartRemediator(t.Context(), clusterenv.Remediator{
		Name: "remediator", Bin: bins.Remediator, Kubeconfig: proxy.Kubeconfig(), Namespace: ns, Config: cfgPath,
		EC2URL: emu.URL(), ClusterTag: clusterTag, Flags: []string{"--leader-elect=false", "--resync-period", "10s", "--termination-confirm-delay", "2s"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("remediator log:\n%s", r.LogTail(80))
		}
	})
	if err := clusterenv.WaitReady(t.Context(), "remediator", r, addr, time.Minute); err != nil {
		t.Fatal(err)
	}
	metrics := func(ctx context.Context) string { _, b := clusterenv.Get(ctx, "http://"+addr+"/metrics"); return b }
	j.WaitFirstReady(append(healthy, dies.NodeRef)...)

	proxy.Down()
	if err := cp.StopAPIServer(); err != nil {
		t.Fatalf("stop kube-apiserver: %v", err)
	}
	up := false
	t.Cleanup(func() {
		if !up {
			_ = cp.StartAPIServer(context.Background())
		}
	})
	stopped := time.Now()
	dies.die()
	// The remediator's own endpoint works without the API server: it reports itself blind.
	j.Eventually("observation_blind on /metrics during the outage", min(outage, time.Minute), func(ctx context.Context) (bool, error) {
		return clusterenv.MetricValue(metrics(ctx), "nodevigil_remediator_observation_blind") == 1, nil
	})
	for time.Since(stopped) < outage {
		if exited, err := r.Exited(); exited {
			t.Fatalf("remediator exited during the outage: %v\n%s", err, r.LogTail(30))
		}
		time.Sleep(time.Second)
	}
	if err := cp.StartAPIServer(t.Context()); err != nil {
		t.Fatalf("start kube-apiserver again: %v", err)
	}
	up = true
	proxy.NodeWatches.Store(0)
	proxy.Up(true)
	back := time.Now()
	t.Logf("kube-apiserver down for %s", back.Sub(stopped).Round(100*time.Millisecond))

	// The Lease lag: Node informer back, Lease cache frozen. Every node's Leases look
	// unobserved since before the outage; nothing may be touched, the dead node included
	// (the remediator cannot tell it from the others yet).
	if !proxy.WaitNodeWatch(t.Context(), 2*time.Minute) {
		t.Fatalf("the remediator's Node informer did not come back within 2m\n%s", r.LogTail(30))
	}
	lag := 2 * (staleAfter + silentNodeT)
	j.UntouchedUntil(time.Now().Add(lag), time.Minute, func() bool { return true }, append(healthy, dies.NodeRef)...)
	if v := clusterenv.MetricValue(metrics(t.Context()), "nodevigil_remediator_observation_blind"); v != 1 {
		t.Errorf("observation_blind = %v while the Lease watch is down after the outage, want 1", v)
	}
	proxy.Up(false)
	t.Logf("Lease watch refused for %s after the API server was back", time.Since(back).Round(100*time.Millisecond))

	// After: observe period + staleness + toleration is ~7 s; watch 20 s and until the dead
	// node is gone.
	j.UntouchedUntil(time.Now().Add(20*time.Second), 2*time.Minute, func() bool {
		return emu.Terminations(dies.InstanceID) > 0
	}, healthy...)
	j.TerminatedOnce(dies.NodeRef, time.Minute)
	m := metrics(t.Context())
	if v := clusterenv.MetricValue(m, "nodevigil_remediator_observation_gaps_total"); v < 1 {
		t.Errorf("observation_gaps_total = %v after the outage, want ≥ 1", v)
	}
	if v := clusterenv.MetricValue(m, "nodevigil_remediator_observation_blind"); v != 0 {
		t.Errorf("observation_blind = %v after the outage, want 0", v)
	}
}
