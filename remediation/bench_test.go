package remediation

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	testingclock "k8s.io/utils/clock/testing"
)

// populate fills the controller's caches directly (no API server) with n nodes, three zones,
// and both Leases per node, a tenth of them silent.
func populate(b *testing.B, c *Controller, n int) {
	b.Helper()
	nodeStore := c.factories[0].Core().V1().Nodes().Informer().GetStore()
	kubeletStore := c.factories[1].Coordination().V1().Leases().Informer().GetStore()
	agentStore := c.factories[2].Coordination().V1().Leases().Informer().GetStore()
	zones := []string{"us-east-1a", "us-east-1b", "us-east-1c"}
	for i := range n {
		name := fmt.Sprintf("ip-10-0-%d-%d", i/250, i%250)
		node := newNode(name, inZone(zones[i%3]), inPool(fmt.Sprintf("pool-%d", i%5)))
		obj, _ := stripNode(node)
		if err := nodeStore.Add(obj); err != nil {
			b.Fatal(err)
		}
		renewed := t0
		if i%10 == 0 {
			renewed = t0.Add(-10 * time.Minute)
		}
		if err := kubeletStore.Add(newLease(DefaultKubeletLeaseNamespace, name, renewed)); err != nil {
			b.Fatal(err)
		}
		if err := agentStore.Add(newLease(c.rc.AgentNamespace, name, renewed)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCensus10k measures one census pass (Decide on every node) at 10,000 nodes: the
// cost of a safety-rail check when the cached census is older than a second.
func BenchmarkCensus10k(b *testing.B) {
	c, err := New(Config{Client: fake.NewClientset(), Clock: testingclock.NewFakeClock(t0), Recorder: record.NewFakeRecorder(1), Logger: discardLogger()})
	if err != nil {
		b.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	populate(b, c, 10000)
	runtime.GC()
	runtime.ReadMemStats(&after)
	cacheMiB := float64(after.HeapAlloc-before.HeapAlloc) / (1 << 20)
	for b.Loop() {
		c.gateMu.Lock()
		cs := c.computeCensus(t0)
		c.gateMu.Unlock()
		if cs.cluster.total != 10000 || cs.cluster.silent != 1000 {
			b.Fatalf("census = %+v", cs.cluster)
		}
	}
	b.ReportMetric(cacheMiB, "cache-MiB")
}

// BenchmarkSyncHealthyNode measures the reconcile of a healthy node, the steady-state work:
// about one per node per Lease duration.
func BenchmarkSyncHealthyNode(b *testing.B) {
	c, err := New(Config{Client: fake.NewClientset(), Clock: testingclock.NewFakeClock(t0), Recorder: record.NewFakeRecorder(1), Logger: discardLogger()})
	if err != nil {
		b.Fatal(err)
	}
	populate(b, c, 1000)
	ctx := b.Context()
	for b.Loop() {
		if _, err := c.syncNode(ctx, "ip-10-0-0-1"); err != nil {
			b.Fatal(err)
		}
	}
}
