package remediation

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/nodevigil/nodevigil/remediation/decide"
)

// benchController is a Controller over an empty fake clientset whose replica has led for an
// hour (its observe period is over), as in production at steady state.
func benchController(b *testing.B) (*Controller, *testingclock.FakeClock) {
	b.Helper()
	clk := testingclock.NewFakeClock(t0)
	c, err := New(Config{Client: fake.NewClientset(), Clock: clk, Recorder: record.NewFakeRecorder(1), Logger: discardLogger()})
	if err != nil {
		b.Fatal(err)
	}
	c.observingSince.Store(t0.Add(-time.Hour).UnixNano())
	c.leading.Store(true)
	return c, clk
}

// populate fills the controller's caches with n nodes in three zones and five pools, both
// Leases per node, a tenth of the nodes silent. The Leases go through the same event handlers
// the informers call (leaseHandler), so the Lease observers know them exactly as in a running
// remediator: the silent ones were last seen changing ten minutes before t0, the others at t0.
// Filling the stores alone would leave the observers empty, and every node would be judged
// NoAgentLeases — the misconfiguration path, not the one a census runs at scale.
func populate(b *testing.B, c *Controller, clk *testingclock.FakeClock, n int) {
	b.Helper()
	nodeStore := c.factories[0].Core().V1().Nodes().Informer().GetStore()
	kubeletStore := c.factories[1].Coordination().V1().Leases().Informer().GetStore()
	agentStore := c.factories[2].Coordination().V1().Leases().Informer().GetStore()
	kubeletH := c.leaseHandler(c.kubeletObs, decide.DefaultKubeletLeaseDuration)
	agentH := c.leaseHandler(c.agentObs, c.rc.AgentLeaseDuration)
	zones := []string{"us-east-1a", "us-east-1b", "us-east-1c"}
	name := func(i int) string { return fmt.Sprintf("ip-10-0-%d-%d", i/250, i%250) }
	for i := range n {
		node := newNode(name(i), inZone(zones[i%3]), inPool(fmt.Sprintf("pool-%d", i%5)))
		obj, _ := stripNode(node)
		if err := nodeStore.Add(obj); err != nil {
			b.Fatal(err)
		}
	}
	addLeases := func(i int, at time.Time) {
		kl := newLease(DefaultKubeletLeaseNamespace, name(i), at)
		al := newLease(c.rc.AgentNamespace, name(i), at)
		if err := kubeletStore.Add(kl); err != nil {
			b.Fatal(err)
		}
		if err := agentStore.Add(al); err != nil {
			b.Fatal(err)
		}
		kubeletH.OnAdd(kl, true)
		agentH.OnAdd(al, true)
	}
	// The silent nodes' Leases last changed ten minutes ago.
	clk.SetTime(t0.Add(-10 * time.Minute))
	for i := 0; i < n; i += 10 {
		addLeases(i, clk.Now())
	}
	// Meanwhile the healthy fleet kept renewing: one healthy node's renewals every 10 s stand
	// for them, so no observer sees a lease duration without a change. Without them the
	// blindness rule (observe.go) would restart observation at t0 and judge nothing stale.
	for at := t0.Add(-10 * time.Minute).Add(10 * time.Second); at.Before(t0); at = at.Add(10 * time.Second) {
		clk.SetTime(at)
		addLeases(1, at)
	}
	// The healthy nodes' Leases changed at t0.
	clk.SetTime(t0)
	for i := range n {
		if i%10 != 0 {
			addLeases(i, t0)
		}
	}
	// The handlers queued every node; nothing processes the queue here.
	for c.queue.Len() > 0 {
		item, _ := c.queue.Get()
		c.queue.Done(item)
		c.queue.Forget(item)
	}
}

// BenchmarkCensus10k measures one census pass (Decide on every node) at 10,000 nodes: the
// cost of a safety-rail check when the cached census is older than a second. It fails unless
// the census judged the nodes on their Leases (9,000 Healthy, 1,000 NodeSilent).
func BenchmarkCensus10k(b *testing.B) {
	c, clk := benchController(b)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	populate(b, c, clk, 10000)
	runtime.GC()
	runtime.ReadMemStats(&after)
	cacheMiB := float64(after.HeapAlloc-before.HeapAlloc) / (1 << 20)
	for b.Loop() {
		c.gateMu.Lock()
		cs := c.computeCensus(t0)
		c.gateMu.Unlock()
		if cs.cluster.total != 10000 || cs.cluster.silent != 1000 ||
			cs.reasons[decide.ReasonHealthy] != 9000 || cs.reasons[decide.ReasonNodeSilent] != 1000 {
			b.Fatalf("census = %+v, reasons %v; want 9000 Healthy and 1000 NodeSilent", cs.cluster, cs.reasons)
		}
	}
	b.ReportMetric(cacheMiB, "cache-MiB")
}

// BenchmarkSyncHealthyNode measures the reconcile of a healthy node, the steady-state work:
// about one per node per Lease duration.
func BenchmarkSyncHealthyNode(b *testing.B) {
	c, clk := benchController(b)
	populate(b, c, clk, 1000)
	ctx := b.Context()
	for b.Loop() {
		d, err := c.syncNode(ctx, "ip-10-0-0-1")
		if err != nil {
			b.Fatal(err)
		}
		if d <= 0 {
			b.Fatalf("healthy node requeued after %s; want the moment its Leases could go stale", d)
		}
	}
}
