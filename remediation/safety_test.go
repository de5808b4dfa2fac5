package remediation

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nodevigil/nodevigil/remediation/decide"
)

func TestMaxUnhealthyBlocksThePool(t *testing.T) {
	// Pool of 5, maxUnhealthy 1: one dead node is remediated, two are a pattern.
	h := newHarness(t, liveConfig(t, "clusterPauseThreshold: 100%\nzonePauseThreshold: 100%\npolicies:\n- name: p\n  nodeSelector: \"\"\n  maxUnhealthy: 1\n  maxInFlight: 5\n"))
	for i := range 3 {
		h.healthy(newNode(fmt.Sprintf("ok-%d", i)))
	}
	h.silent(newNode("dead-1"))
	h.silent(newNode("dead-2"))
	for _, n := range []string{"dead-1", "dead-2"} {
		requeue, err := h.sync(n)
		if err != nil {
			t.Fatal(err)
		}
		if requeue != DefaultBlockedRequeue {
			t.Errorf("%s: requeue %s, want the blocked requeue", n, requeue)
		}
	}
	if got := h.Steps(); len(got) != 0 {
		t.Errorf("remediated while 2 of 5 nodes are unhealthy and maxUnhealthy is 1: %q", got)
	}
	ev := h.events()
	if !hasEvent(ev, BlockMaxUnhealthy) {
		t.Errorf("no %s event in %q", BlockMaxUnhealthy, ev)
	}
	if got := testutil.ToFloat64(h.c.metrics.blocked.WithLabelValues(BlockMaxUnhealthy)); got != 2 {
		t.Errorf("blocked_total{%s} = %v, want 2", BlockMaxUnhealthy, got)
	}
	// One of them comes back: the other is now within the cap.
	h.renew(DefaultKubeletLeaseNamespace, "dead-2", t0)
	h.renew(h.c.rc.AgentNamespace, "dead-2", t0)
	h.clock.Step(DefaultCensusMaxAge)
	h.synced("dead-2")
	h.drive("dead-1", 5)
	if !h.nodeGone("dead-1") {
		t.Errorf("dead-1 not remediated once the pool was back under its cap; steps %q", h.Steps())
	}
}

func TestMaxInFlight(t *testing.T) {
	h := newHarness(t, liveConfig(t, "clusterPauseThreshold: 100%\nzonePauseThreshold: 100%\npolicies:\n- name: p\n  nodeSelector: \"\"\n  maxUnhealthy: 100%\n  maxInFlight: 1\n"))
	h.silent(newNode("a"))
	h.silent(newNode("b"))
	// a's drain is held by a PDB, so a stays in flight.
	h.add(newPod("app", "guarded", "a"))
	h.pdb["app/guarded"] = true
	if _, err := h.sync("a"); err != nil {
		t.Fatal(err)
	}
	if decide.PhaseOf(h.node("a")) != decide.PhaseDraining {
		t.Fatalf("a is %q, want Draining", decide.PhaseOf(h.node("a")))
	}
	// b is blocked at once, even before the census has seen a's mark (the reservation counts).
	if _, err := h.c.syncNode(h.ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if decide.PhaseOf(h.node("b")) != decide.PhaseNone || !hasEvent(h.events(), BlockMaxInFlight) {
		t.Fatalf("b is %q; want unmarked and a %s event", decide.PhaseOf(h.node("b")), BlockMaxInFlight)
	}
	// And still after the census caught up.
	h.clock.Step(time.Second)
	if _, err := h.sync("b"); err != nil {
		t.Fatal(err)
	}
	if decide.PhaseOf(h.node("b")) != decide.PhaseNone {
		t.Fatal("b marked while a is in flight")
	}
	// a finishes; b may go.
	delete(h.pdb, "app/guarded")
	h.drive("a", 5)
	if !h.nodeGone("a") {
		t.Fatalf("a not finished: %q", h.Steps())
	}
	h.synced("a") // the cache has seen a go
	h.clock.Step(time.Second)
	h.drive("b", 5)
	if !h.nodeGone("b") {
		t.Errorf("b not remediated after a finished: %q", h.Steps())
	}
}

func TestConcurrentMarksRespectMaxInFlight(t *testing.T) {
	h := newHarness(t, liveConfig(t, "clusterPauseThreshold: 100%\nzonePauseThreshold: 100%\npolicies:\n- name: p\n  nodeSelector: \"\"\n  maxUnhealthy: 100%\n  maxInFlight: 2\n  drain: {timeout: 1h, onTimeout: Wait}\n"))
	var names []string
	for i := range 8 {
		n := fmt.Sprintf("n-%d", i)
		names = append(names, n)
		h.silent(newNode(n))
		h.add(newPod("app", "guarded-"+n, n))
		h.pdb["app/guarded-"+n] = true
	}
	h.settle(names[0])
	done := make(chan error, len(names))
	for _, n := range names {
		go func() {
			_, err := h.c.syncNode(h.ctx, n)
			done <- err
		}()
	}
	for range names {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	marked := 0
	for _, n := range names {
		if decide.PhaseOf(h.node(n)) != decide.PhaseNone {
			marked++
		}
	}
	if marked != 2 {
		t.Errorf("%d nodes marked concurrently, want maxInFlight 2", marked)
	}
}

func TestTerminationRateLimit(t *testing.T) {
	h := newHarness(t, liveConfig(t, "clusterPauseThreshold: 100%\nzonePauseThreshold: 100%\nterminationRateLimit: {perMinute: 1, burst: 1}\npolicies:\n- name: p\n  nodeSelector: \"\"\n  maxUnhealthy: 100%\n  maxInFlight: 10\n  drain: {enabled: false}\n"))
	h.silent(newNode("a"))
	h.silent(newNode("b"))
	h.drive("a", 3)
	if !h.nodeGone("a") {
		t.Fatalf("a not terminated: %q", h.Steps())
	}
	requeue, err := h.sync("b")
	if err != nil {
		t.Fatal(err)
	}
	if len(h.cloud.Terminates()) != 1 || decide.PhaseOf(h.node("b")) != decide.PhaseCordoned {
		t.Fatalf("b: state %q, %d terminations; want held in Cordoned by the rate limit", decide.PhaseOf(h.node("b")), len(h.cloud.Terminates()))
	}
	if requeue <= 0 || requeue > time.Minute {
		t.Errorf("requeue %s, want the time until the next token (≤ 1m)", requeue)
	}
	if !hasEvent(h.events(), BlockRateLimited) {
		t.Error("no RateLimited event")
	}
	h.clock.Step(requeue)
	h.drive("b", 3)
	if !h.nodeGone("b") {
		t.Errorf("b not terminated once a token was available: %q", h.Steps())
	}
}

func TestZonePause(t *testing.T) {
	// Zone a: 2 of 4 silent (threshold 30% of 4 → 2 allowed; 3 silent pauses). Zone b: 1 of 4.
	h := newHarness(t, liveConfig(t, "zonePauseThreshold: 30%\nclusterPauseThreshold: 100%\npolicies:\n- name: p\n  nodeSelector: \"\"\n  maxUnhealthy: 100%\n  maxInFlight: 10\n  drain: {enabled: false}\n"))
	for i := range 4 {
		h.healthy(newNode(fmt.Sprintf("b-ok-%d", i), inZone("us-east-1b")))
	}
	h.silent(newNode("b-dead", inZone("us-east-1b")))
	for i := range 1 {
		h.healthy(newNode(fmt.Sprintf("a-ok-%d", i), inZone("us-east-1a")))
	}
	for i := range 3 {
		h.silent(newNode(fmt.Sprintf("a-dead-%d", i), inZone("us-east-1a")))
	}
	for i := range 3 {
		if _, err := h.sync(fmt.Sprintf("a-dead-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range h.Steps() {
		if strings.Contains(s, "a-dead") {
			t.Errorf("acted in a paused zone: %s", s)
		}
	}
	if ev := h.events(); !hasEvent(ev, BlockZonePaused) {
		t.Errorf("no ZonePaused event in %q", ev)
	}
	if got := testutil.ToFloat64(h.c.metrics.zonePaused.WithLabelValues("us-east-1a")); got != 1 {
		t.Errorf("zone_paused{us-east-1a} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(h.c.metrics.silentNodes.WithLabelValues("us-east-1a")); got != 3 {
		t.Errorf("silent_nodes{us-east-1a} = %v, want 3", got)
	}
	if got := testutil.ToFloat64(h.c.metrics.nodes.WithLabelValues(decide.ReasonNodeSilent)); got != 4 {
		t.Errorf("nodes{NodeSilent} = %v, want 4", got)
	}
	if got := testutil.ToFloat64(h.c.metrics.nodes.WithLabelValues(decide.ReasonHealthy)); got != 5 {
		t.Errorf("nodes{Healthy} = %v, want 5", got)
	}
	// The other zone is not paused.
	h.drive("b-dead", 3)
	if !h.nodeGone("b-dead") {
		t.Errorf("b-dead not remediated in an unpaused zone: %q", h.Steps())
	}
}

func TestClusterPause(t *testing.T) {
	h := newHarness(t, liveConfig(t, "zonePauseThreshold: 100%\nclusterPauseThreshold: 20%\npolicies:\n- name: p\n  nodeSelector: \"\"\n  maxUnhealthy: 100%\n  maxInFlight: 10\n"))
	zones := []string{"us-east-1a", "us-east-1b", "us-east-1c"}
	for i := range 7 {
		h.healthy(newNode(fmt.Sprintf("ok-%d", i), inZone(zones[i%3])))
	}
	for i := range 3 { // 3 of 10 silent > 20% of 10 = 2
		h.silent(newNode(fmt.Sprintf("dead-%d", i), inZone(zones[i])))
	}
	for i := range 3 {
		if _, err := h.sync(fmt.Sprintf("dead-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := h.Steps(); len(got) != 0 {
		t.Errorf("acted during a cluster-wide silence: %q", got)
	}
	if !hasEvent(h.events(), BlockClusterPaused) {
		t.Error("no ClusterPaused event")
	}
	if got := testutil.ToFloat64(h.c.metrics.clusterPaused); got != 1 {
		t.Errorf("cluster_paused = %v, want 1", got)
	}
}

func TestPauseAlsoHoldsTermination(t *testing.T) {
	// A node already draining is not terminated once its zone goes quiet.
	h := newHarness(t, liveConfig(t, "zonePauseThreshold: 1\nclusterPauseThreshold: 100%\npolicies:\n- name: p\n  nodeSelector: \"\"\n  maxUnhealthy: 100%\n  maxInFlight: 10\n"))
	h.silent(newNode("draining", inPhase(decide.PhaseDraining)))
	h.healthy(newNode("ok"))
	h.silent(newNode("other-dead"))
	if _, err := h.sync("draining"); err != nil {
		t.Fatal(err)
	}
	if len(h.cloud.Terminates()) != 0 || slices.Contains(h.Steps(), "patch draining Terminating") {
		t.Errorf("terminated in a paused zone: %q", h.Steps())
	}
}

func TestNewLeaderObservesBeforeActing(t *testing.T) {
	h := newHarness(t, nil)
	h.silent(newNode("n"))
	h.c.observingSince.Store(h.clock.Now().UnixNano()) // just elected
	requeue, err := h.sync("n")
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Steps()) != 0 || requeue != h.c.observe {
		t.Fatalf("new leader acted or requeued at %s (steps %q); want to wait the observe period %s", requeue, h.Steps(), h.c.observe)
	}
	h.clock.Step(requeue)
	h.drive("n", 5)
	if !h.nodeGone("n") {
		t.Errorf("not remediated after the observe period: %q", h.Steps())
	}
}

func TestDetectionLatencyObserved(t *testing.T) {
	h := newHarness(t, nil)
	n := h.healthy(newNode("n"))
	if _, err := h.sync(n.Name); err != nil {
		t.Fatal(err)
	}
	// The kubelet Lease seen renewing at t0 is stale at t0+50s (40s + grace); the requeue lands
	// exactly there.
	h.clock.Step(decide.StaleAfter(40*time.Second) + 500*time.Millisecond)
	h.renew(h.c.rc.AgentNamespace, "n", h.clock.Now())
	if _, err := h.sync(n.Name); err != nil {
		t.Fatal(err)
	}
	if got := testutil.CollectAndCount(h.c.metrics.detection); got != 1 {
		t.Fatalf("detection latency series = %d, want 1", got)
	}
	if !hasEvent(h.events(), decide.ReasonKubeletUnhealthy) {
		t.Error("no KubeletUnhealthy event")
	}
	if got := testutil.ToFloat64(h.c.metrics.decisions.WithLabelValues(decide.ReasonKubeletUnhealthy)); got != 1 {
		t.Errorf("decisions_total{KubeletUnhealthy} = %v, want 1", got)
	}
}

// TestPauseEndSettlesBeforeActing: a zone goes silent (paused), then heals. The pause ends as
// soon as enough nodes are seen renewing, but a healed node renews on its own schedule and can
// still look silent — past its toleration, since its silence began with the storm — for up to
// one heartbeat period. Nothing is remediated in the zone until that period passed; a node
// still silent after it is remediated.
func TestPauseEndSettlesBeforeActing(t *testing.T) {
	h := newHarness(t, liveConfig(t, "zonePauseThreshold: 30%\nclusterPauseThreshold: 100%\npolicies:\n- name: p\n  nodeSelector: \"\"\n  maxUnhealthy: 100%\n  maxInFlight: 10\n  drain: {enabled: false}\n"))
	h.healthy(newNode("ok", inZone("us-east-1a")))
	for i := range 3 {
		h.silent(newNode(fmt.Sprintf("dead-%d", i), inZone("us-east-1a")))
	}
	if _, err := h.sync("dead-0"); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(h.c.metrics.zonePaused.WithLabelValues("us-east-1a")); got != 1 {
		t.Fatalf("zone_paused = %v with 3 of 4 silent, want 1", got)
	}
	renew := func(names ...string) {
		for _, n := range names {
			h.renew(DefaultKubeletLeaseNamespace, n, h.clock.Now())
			h.renew(h.c.rc.AgentNamespace, n, h.clock.Now())
		}
	}
	// dead-1 and dead-2 heal: 1 of 4 silent is within the threshold, the pause ends. dead-0
	// has not been seen renewing yet.
	renew("ok", "dead-1", "dead-2")
	h.settle("dead-0")
	h.c.refreshCensus(h.clock.Now())
	h.events()
	if _, err := h.sync("dead-0"); err != nil {
		t.Fatal(err)
	}
	if steps := h.Steps(); len(steps) != 0 {
		t.Errorf("acted the moment the zone's pause ended: %q", steps)
	}
	if msg, ok := h.c.settling("us-east-1a", h.clock.Now()); !ok || !strings.Contains(msg, "ended at") {
		t.Errorf("settling(us-east-1a) = %q, %v; want the reason steps are held", msg, ok)
	}
	if got := testutil.ToFloat64(h.c.metrics.zonePaused.WithLabelValues("us-east-1a")); got != 1 {
		t.Errorf("zone_paused = %v while settling, want 1", got)
	}

	// One heartbeat period later the healed nodes were seen renewing; dead-0 was not.
	h.clock.Step(h.c.pauseSettle())
	renew("ok", "dead-1", "dead-2")
	h.drive("dead-0", 5)
	if !h.nodeGone("dead-0") {
		t.Errorf("dead-0 not remediated after the settle period: %q", h.Steps())
	}
	if got := testutil.ToFloat64(h.c.metrics.zonePaused.WithLabelValues("us-east-1a")); got != 0 {
		t.Errorf("zone_paused = %v after settling, want 0", got)
	}
}
