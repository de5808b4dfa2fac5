// Package scenarios_test plays the seed scenarios of the design brief (§1, S000–S004), one test
// per user problem, on the simulated fleet `make run` uses (integration/fleet): a real control
// plane, kwok as the kubelets, real nodevigil-agent processes on fake host roots, the real
// nodevigil-remediator process, instances in the EC2 emulator and the replacement loop playing
// the autoscaler. docs/scenarios.md walks a user through the same scenarios in `make run`.
package scenarios_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/nodevigil/nodevigil/integration/controlplane"
	"github.com/nodevigil/nodevigil/integration/ec2emu"
	"github.com/nodevigil/nodevigil/integration/fleet"
	"github.com/nodevigil/nodevigil/integration/testbin"
	"github.com/nodevigil/nodevigil/integration/timeline"
	"github.com/nodevigil/nodevigil/remediation/decide"
)

var (
	cp            *controlplane.ControlPlane
	agentBin      string
	remediatorBin string
	kwokBin       string
)

const (
	clusterTag = "kubernetes.io/cluster/scenarios"
	zone       = "us-east-1a"
)

// timings are the scenarios' tolerations: short, so each scenario takes tens of seconds.
var timings = fleet.Timings{
	SilentNode:       5 * time.Second,
	KubeletUnhealthy: 8 * time.Second,
	NetworkingReady:  10 * time.Second,
	StartupGrace:     5 * time.Second,
	StartupDeadline:  2 * time.Minute,
	DrainTimeout:     20 * time.Second,
}

func TestMain(m *testing.M) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "nodevigil-scenarios-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		for pkg, dst := range map[string]*string{
			"github.com/nodevigil/nodevigil/agent/cmd/nodevigil-agent":            &agentBin,
			"github.com/nodevigil/nodevigil/remediation/cmd/nodevigil-remediator": &remediatorBin,
		} {
			if *dst, err = testbin.Build(ctx, pkg, dir, false); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		if kwokBin, err = controlplane.FindOrBuildKwok(ctx, controlplane.BuildConfig{}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return controlplane.RunTests(m, controlplane.Config{}, &cp)
	}()
	os.Exit(code)
}

// world is one scenario's fleet: its own pools (named after the scenario), its own kwok, EC2
// emulator, agent namespace and remediator, on the package's control plane.
type world struct {
	t      *testing.T
	client kubernetes.Interface
	ns     string
	emu    *ec2emu.Server
	fleet  *fleet.Fleet
	cfg    string
	out    *syncBuffer
	rems   []*testbin.Process
	// metrics are the remediator replicas' /metrics URLs, in start order.
	metrics []string
	seen    *tracker
}

// newWorld starts a fleet of pools (all in one zone, so one silent node never pauses it) and
// waits until every node is ready and has shed its startup taint.
func newWorld(t *testing.T, id string, pools []fleet.PoolSpec, tweaks ...func(*fleet.Config)) *world {
	t.Helper()
	c, err := cp.Client()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := cp.Namespace(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	emu := ec2emu.New(ec2emu.Config{ShutdownDelay: time.Second})
	if err := emu.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emu.Close() })
	w := &world{t: t, client: c, ns: ns, emu: emu, out: &syncBuffer{}}
	cfg := fleet.Config{
		Client: c, Kubeconfig: cp.KubeconfigPath(), EC2: emu, ClusterTag: clusterTag,
		AgentBin: agentBin, KwokBin: kwokBin, AgentNamespace: ns, Dir: t.TempDir(), ID: id,
		Zones: []string{zone}, Pools: pools, KubeletLeaseSeconds: 8,
		AgentLeaseDuration: 6 * time.Second, AgentRenewInterval: time.Second, CheckInterval: time.Second,
		StabilityWindow: 3 * time.Second, AgentLogLevel: "info", Output: w.out,
	}
	for _, tw := range tweaks {
		tw(&cfg)
	}
	f, err := fleet.Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	w.fleet = f
	t.Cleanup(func() {
		f.Stop()
		if t.Failed() {
			t.Logf("fleet output (kwok, agents):\n%s", tail(w.out.String(), 80))
		}
		// Leave nothing silent behind for the next scenario's zone and cluster counts.
		_ = c.CoreV1().Nodes().DeleteCollection(context.Background(), metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: fleet.FleetLabel + "=" + id})
	})
	w.seen = newTracker(t, c, id)
	if err := f.WaitReady(t.Context(), 60*time.Second); err != nil {
		t.Fatal(err)
	}
	w.cfg = filepath.Join(t.TempDir(), "remediator.yaml")
	if err := os.WriteFile(w.cfg, []byte(fleet.RemediatorConfig(f.Config(), timings)), 0o600); err != nil {
		t.Fatal(err)
	}
	return w
}

// startRemediator runs one remediator replica and waits until it is ready.
func (w *world) startRemediator(name string) *testbin.Process {
	w.t.Helper()
	p, err := testbin.Start(name, remediatorBin, []string{
		"--kubeconfig", cp.KubeconfigPath(), "--namespace", w.ns, "--config", w.cfg,
		"--listen-address", "127.0.0.1:0", "--metrics-secure=false", "--ec2-endpoint", w.emu.URL(), "--aws-region", "us-east-1",
		"--cluster-tag-key", clusterTag,
		// Generous enough that a leader survives an API server stalled by a loaded machine
		// (a lost lease ends the process, and nothing restarts it here).
		"--leader-elect-lease-duration", "15s", "--leader-elect-renew-deadline", "10s", "--leader-elect-retry-period", "1s",
		"--resync-period", "10s", "--termination-confirm-delay", "2s", "--scheduled-events-interval", "10s",
		"--log-format", "text",
	}, "POD_NAME="+name, "AWS_ACCESS_KEY_ID=scenario", "AWS_SECRET_ACCESS_KEY=scenario", "AWS_CA_BUNDLE=")
	if err != nil {
		w.t.Fatal(err)
	}
	w.rems = append(w.rems, p)
	w.t.Cleanup(func() {
		_ = p.Stop(10 * time.Second)
		if w.t.Failed() {
			w.t.Logf("%s log:\n%s", name, p.LogTail(60))
		}
	})
	// The port the replica bound itself is read back: no other process can take it first.
	ctx, cancel := context.WithTimeout(w.t.Context(), 60*time.Second)
	defer cancel()
	addr, err := p.ListenAddr(ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	w.metrics = append(w.metrics, "http://"+addr+"/metrics")
	w.eventually(name+" serving /healthz", 30*time.Second, func() bool {
		if exited, err := p.Exited(); exited {
			w.t.Fatalf("%s exited: %v\n%s", name, err, p.LogTail(20))
		}
		return testbin.HTTPStatus(w.t.Context(), "http://"+addr+"/healthz") == 200
	})
	return p
}

// node returns a live node of pool with a real (or a simulated) agent.
func (w *world) node(pool string, real bool) *fleet.Node {
	w.t.Helper()
	for _, n := range w.fleet.Nodes() {
		if n.Pool == pool && n.Real == real {
			return n
		}
	}
	w.t.Fatalf("no node in pool %s with real agent=%v", pool, real)
	return nil
}

func (w *world) inject(kind, target string) {
	w.t.Helper()
	if err := w.fleet.Inject(w.t.Context(), kind, target); err != nil {
		w.t.Fatal(err)
	}
}

// eventually polls cond until it holds.
func (w *world) eventually(what string, timeout time.Duration, cond func() bool) {
	w.t.Helper()
	err := wait.PollUntilContextTimeout(w.t.Context(), 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		w.t.Fatalf("waiting %s for %s: %v", timeout, what, err)
	}
}

// condition returns the node's condition of type typ, or nil.
func (w *world) condition(name, typ string) *corev1.NodeCondition {
	obj, err := w.client.CoreV1().Nodes().Get(w.t.Context(), name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	for i := range obj.Status.Conditions {
		if string(obj.Status.Conditions[i].Type) == typ {
			return &obj.Status.Conditions[i]
		}
	}
	return nil
}

// replacement waits for the replacement loop to join a node for name, in its pool and zone,
// and for that node to shed its startup taint.
func (w *world) replacement(old *fleet.Node, timeout time.Duration) *fleet.Node {
	w.t.Helper()
	var r *fleet.Node
	w.eventually("a replacement for "+old.Name, timeout, func() bool {
		name, ok := w.fleet.ReplacementOf(old.Name)
		if ok {
			r, _ = w.fleet.Node(name)
		}
		return r != nil
	})
	if r.Pool != old.Pool || r.Zone != old.Zone || r.Real != old.Real {
		w.t.Errorf("replacement %s is pool %s zone %s real %v; want those of %s: %s %s %v",
			r.Name, r.Pool, r.Zone, r.Real, old.Name, old.Pool, old.Zone, old.Real)
	}
	w.eventually(r.Name+" ready without its startup taint", timeout, func() bool {
		return w.seen.get(r.Name).taintGoneAt != (time.Time{})
	})
	return r
}

// tracker records, every 200 ms, what happened to each node of a fleet: the remediation
// reasons and states it went through, when it was cordoned, when its startup taint went.
type tracker struct {
	mu    sync.Mutex
	nodes map[string]*history
}

type history struct {
	reasons     []string
	states      []string
	cordoned    bool
	cordonedAt  time.Time // first seen cordoned
	readyAt     time.Time
	taintGoneAt time.Time
	deleted     bool
}

func newTracker(t *testing.T, c kubernetes.Interface, id string) *tracker {
	tr := &tracker{nodes: map[string]*history{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			list, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: fleet.FleetLabel + "=" + id})
			if err == nil {
				tr.observe(list.Items)
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return tr
}

func (tr *tracker) observe(nodes []corev1.Node) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	live := map[string]bool{}
	for _, n := range nodes {
		live[n.Name] = true
		h := tr.nodes[n.Name]
		if h == nil {
			h = &history{}
			tr.nodes[n.Name] = h
		}
		if r := n.Annotations[decide.AnnotationReason]; r != "" && (len(h.reasons) == 0 || h.reasons[len(h.reasons)-1] != r) {
			h.reasons = append(h.reasons, r)
		}
		if s := n.Annotations[decide.AnnotationState]; s != "" && (len(h.states) == 0 || h.states[len(h.states)-1] != s) {
			h.states = append(h.states, s)
		}
		h.cordoned = h.cordoned || n.Spec.Unschedulable
		if n.Spec.Unschedulable && h.cordonedAt.IsZero() {
			h.cordonedAt = time.Now()
		}
		ready := false
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				ready = true
			}
		}
		if ready && h.readyAt.IsZero() {
			h.readyAt = time.Now()
		}
		tainted := false
		for _, t := range n.Spec.Taints {
			tainted = tainted || t.Key == fleet.StartupTaint
		}
		if !tainted && h.taintGoneAt.IsZero() {
			h.taintGoneAt = time.Now()
		}
	}
	for name, h := range tr.nodes {
		if !live[name] {
			h.deleted = true
		}
	}
}

func (tr *tracker) get(name string) history {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if h := tr.nodes[name]; h != nil {
		return *h
	}
	return history{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// S000: memory grows and the kernel OOM-kills the kubelet. The agent, alive, says so at once
// (KubeletHealthy=False, KubeletOOMKilled) and restarts the unit itself (local repair): the
// kubelet is back before its Lease goes stale and the remediator cordons and terminates
// nothing, although the agent's condition stays False for minutes (two signals, strictly). When the kubelet dies again at every restart, local repair cannot help: the
// remediator sees the kubelet's Lease go stale while the agent's stays fresh
// (KubeletUnhealthy), waits its toleration, and replaces the node — once; the autoscaler's
// replacement joins the same pool and zone and its agent removes the startup taint.
func TestS000KubeletOOMKilledNodeIsReplaced(t *testing.T) {
	w := newWorld(t, "s000", []fleet.PoolSpec{{Name: "s000-general", Size: 3, RealAgents: 1}},
		func(c *fleet.Config) { c.LocalRepair = true })
	w.startRemediator("remediator-a")
	victim := w.node("s000-general", true)
	// The remediator's metrics through the run, for the timeline beside the Events.
	sampler, err := timeline.NewSampler(timeline.SamplerConfig{URLs: w.metrics, Interval: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sampling, stopSampling := context.WithCancel(t.Context())
	defer stopSampling()
	go sampler.Run(sampling)

	// Local repair first.
	oom := time.Now()
	w.inject("kubelet-oom", victim.Name)
	w.eventually("the agent reporting KubeletHealthy=False (KubeletOOMKilled)", 15*time.Second, func() bool {
		c := w.condition(victim.Name, "KubeletHealthy")
		return c != nil && c.Status == corev1.ConditionFalse && c.Reason == "KubeletOOMKilled"
	})
	w.eventually("the agent restarting the kubelet unit", 15*time.Second, func() bool { return victim.KubeletRestarts() > 0 })
	// The agent keeps KubeletHealthy=False for its OOM-kill memory (10 minutes) although the
	// kubelet is back: that condition alone must start no clock while the kubelet's Lease is
	// fresh. Past the moment the Lease would have gone stale plus the whole toleration, the
	// repaired node is neither judged nor touched.
	for watch := oom.Add(time.Duration(w.fleet.Config().KubeletLeaseSeconds)*time.Second*5/4 + timings.KubeletUnhealthy + 3*time.Second); time.Now().Before(watch); {
		if n := w.emu.Terminations(victim.InstanceID); n != 0 {
			t.Fatalf("%s was terminated %d times although its agent had restarted the kubelet", victim.Name, n)
		}
		if h := w.seen.get(victim.Name); h.cordoned || containsString(h.reasons, "KubeletUnhealthy") {
			t.Fatalf("%s (kubelet restarted locally) was judged %v, cordoned=%v", victim.Name, h.reasons, h.cordoned)
		}
		time.Sleep(250 * time.Millisecond)
	}
	if c := w.condition(victim.Name, "KubeletHealthy"); c == nil || c.Status != corev1.ConditionFalse {
		t.Errorf("KubeletHealthy %+v after the restart; want it still False (the OOM kill is remembered), the case this half is about", c)
	}
	t.Logf("S000: kubelet of %s OOM-killed and restarted by its agent (%d restart), untouched for %s",
		victim.Name, victim.KubeletRestarts(), time.Since(oom).Round(time.Second))

	// Then a kubelet that local repair cannot bring back.
	injected := time.Now()
	w.inject("kubelet-dead", victim.Name)
	w.eventually("the agent reporting KubeletHealthy=False", 15*time.Second, func() bool {
		c := w.condition(victim.Name, "KubeletHealthy")
		return c != nil && c.Status == corev1.ConditionFalse
	})
	w.eventually("the instance terminated", 90*time.Second, func() bool { return w.emu.Terminations(victim.InstanceID) > 0 })
	if took := time.Since(injected); took < timings.KubeletUnhealthy {
		t.Errorf("terminated %s after the kubelet died, before the %s toleration", took, timings.KubeletUnhealthy)
	}
	r := w.replacement(victim, 60*time.Second)
	w.eventually(victim.Name+" deleted", 30*time.Second, func() bool { return w.seen.get(victim.Name).deleted })
	h := w.seen.get(victim.Name)
	if !containsString(h.reasons, "KubeletUnhealthy") {
		t.Errorf("%s went through reasons %v, want KubeletUnhealthy (agent alive, kubelet dead)", victim.Name, h.reasons)
	}
	if n := w.emu.Terminations(victim.InstanceID); n != 1 {
		t.Errorf("instance terminated %d times, want 1", n)
	}
	if got := len(w.emu.TerminateCalls()); got != 1 {
		t.Errorf("%d TerminateInstances calls, want 1 (only %s): %v", got, victim.Name, w.emu.TerminateCalls())
	}
	t.Logf("S000: %s OOM-killed at %s, replaced by %s, total %s", victim.Name, injected.Format(time.TimeOnly), r.Name, time.Since(injected).Round(time.Second))

	// The run's story, from the cluster's Events and the remediator's metrics; `make timeline`
	// keeps the picture in docs/.
	w.eventually("the remediator's in-flight gauge back to 0", 15*time.Second, func() bool {
		sampler.Scrape(t.Context())
		s := sampler.Sampled().Samples
		return len(s) > 0 && s[len(s)-1].Values[1] == 0
	})
	stopSampling()
	points, err := timeline.Collect(t.Context(), w.client, victim.Name)
	if err != nil {
		t.Fatal(err)
	}
	var reasons []string
	at := map[string]time.Time{}
	for _, p := range points {
		reasons = append(reasons, p.Reason)
		if _, ok := at[p.Reason]; !ok {
			at[p.Reason] = p.At
		}
	}
	for _, want := range []string{fleet.EventFaultInjected, "RemediationStarted", "Cordoned", "TerminationRequested", "InstanceTerminated", fleet.EventReplacementJoined, "StartupTaintsRemoved"} {
		if !containsString(reasons, want) {
			t.Fatalf("the timeline lacks %s: %v", want, reasons)
		}
	}
	checkMetricsStory(t, sampler.Sampled(), at["RemediationStarted"], at["TerminationRequested"])
	if out := os.Getenv("NODEVIGIL_TIMELINE_SVG"); out != "" {
		m := sampler.Sampled()
		if err := os.WriteFile(out, timeline.SVG("S000: a kubelet OOM-killed, its node replaced (general pool, make test timings)", victim.Name, points, &m), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// checkMetricsStory holds the remediator's metrics, sampled through S000, to the Events' story:
// one node in flight, from no earlier than the decision's Event; exactly one termination
// accepted, counted when the TerminationRequested Event says; all back to 0 at the end. Events
// may be stamped in whole seconds, hence a second's slack.
func checkMetricsStory(t *testing.T, m timeline.Sampled, decided, requested time.Time) {
	t.Helper()
	const unhealthy, inFlight, terms = 0, 1, 3 // indexes into timeline.RemediatorSeries
	if len(m.Samples) < 10 {
		t.Fatalf("%d metric samples (%d scrapes failed); want the whole run sampled", len(m.Samples), m.Failed)
	}
	first, last := m.Samples[0], m.Samples[len(m.Samples)-1]
	if first.Values[terms] != 0 || last.Values[terms] != 1 {
		t.Errorf("terminations accepted went %g → %g over the run, want 0 → 1", first.Values[terms], last.Values[terms])
	}
	if last.Values[inFlight] != 0 || last.Values[unhealthy] != 0 {
		t.Errorf("at the end in flight %g, unhealthy %g; want 0 and 0 (the node replaced)", last.Values[inFlight], last.Values[unhealthy])
	}
	var peak float64
	for _, s := range m.Samples {
		peak = max(peak, s.Values[inFlight])
		if s.Values[inFlight] > 0 && s.At.Before(decided.Add(-time.Second)) {
			t.Errorf("in flight %g at %s, before the decision's Event at %s", s.Values[inFlight], s.At.Format(time.StampMilli), decided.Format(time.StampMilli))
		}
		if s.Values[terms] > 0 && s.At.Before(requested.Add(-time.Second)) {
			t.Errorf("a termination counted at %s, before the TerminationRequested Event at %s", s.At.Format(time.StampMilli), requested.Format(time.StampMilli))
		}
		if s.Values[terms] == 0 && s.At.After(requested.Add(2*time.Second)) {
			t.Errorf("no termination counted at %s, after the TerminationRequested Event at %s", s.At.Format(time.StampMilli), requested.Format(time.StampMilli))
		}
	}
	if peak != 1 {
		t.Errorf("in flight peaked at %g, want 1 (one node remediated)", peak)
	}
}

// S001: one fleet, two pools, two policies. The same failure (a whole node silent) in the
// general pool is cordoned, drained and terminated, then replaced; in the kafka pool
// (CordonOnly, drain honouring karpenter.sh/do-not-disrupt) the node is cordoned and left
// standing with its do-not-disrupt pod, however long it waits.
func TestS001PerPoolPoliciesDecideWhatADeadNodeMeans(t *testing.T) {
	w := newWorld(t, "s001", []fleet.PoolSpec{
		{Name: "s001-general", Size: 3},
		{Name: "s001-kafka", Size: 3, DoNotDisrupt: true},
	})
	w.startRemediator("remediator-a")
	general, kafka := w.node("s001-general", false), w.node("s001-kafka", false)
	// Simulated agents report the agent's conditions as real ones do, so every node of the
	// fleet reads alike in `kubectl nodevigil status`.
	for _, n := range []string{general.Name, kafka.Name} {
		for _, ct := range []string{"MemoryHealthy", "KubeletHealthy", "NetworkingReady"} {
			w.eventually(n+" (simulated agent) reporting "+ct+"=True", 15*time.Second, func() bool {
				c := w.condition(n, ct)
				return c != nil && c.Status == corev1.ConditionTrue
			})
		}
	}
	w.inject("node-silent", general.Name)
	w.inject("node-silent", kafka.Name)

	w.eventually("the general node terminated", 90*time.Second, func() bool { return w.emu.Terminations(general.InstanceID) > 0 })
	w.replacement(general, 60*time.Second)
	w.eventually("the kafka node cordoned", 30*time.Second, func() bool { return w.seen.get(kafka.Name).cordoned })
	// Past every toleration and the drain timeout: CordonOnly never terminates, and the
	// do-not-disrupt pod is never evicted.
	deadline := time.Now().Add(timings.SilentNode + timings.DrainTimeout)
	for time.Now().Before(deadline) {
		if n := w.emu.Terminations(kafka.InstanceID); n != 0 {
			t.Fatalf("kafka node %s (CordonOnly) terminated %d times", kafka.Name, n)
		}
		time.Sleep(500 * time.Millisecond)
	}
	pod, err := w.client.CoreV1().Pods(fleet.WorkloadNamespace).Get(t.Context(), "app-"+kafka.Name, metav1.GetOptions{})
	if err != nil || pod.DeletionTimestamp != nil {
		t.Errorf("the kafka node's do-not-disrupt pod was evicted: %v", err)
	}
	if h := w.seen.get(kafka.Name); h.deleted || !containsString(h.reasons, "NodeSilent") {
		t.Errorf("kafka node %s: deleted=%v reasons=%v; want it kept, judged NodeSilent", kafka.Name, h.deleted, h.reasons)
	}
	if h := w.seen.get(general.Name); !containsString(h.reasons, "NodeSilent") {
		t.Errorf("general node %s reasons %v, want NodeSilent", general.Name, h.reasons)
	}
}

// S002: a new node's kubelet restarts while it bootstraps. The agent keeps the startup taint
// until the kubelet has been healthy for the whole stability window after the restart — not
// earlier — and the remediator, within the node's startup grace and deadline, launches
// nothing: one node, one instance, no duplicate.
func TestS002KubeletRestartDuringBootstrapNeitherUntaintsEarlyNorDuplicates(t *testing.T) {
	const window = 8 * time.Second
	w := newWorld(t, "s002", []fleet.PoolSpec{{Name: "s002-general", Size: 2}},
		func(c *fleet.Config) { c.StabilityWindow = window })
	w.startRemediator("remediator-a")
	instances := len(w.emu.Instances())

	n, err := w.fleet.Join(t.Context(), "s002-general", zone, true)
	if err != nil {
		t.Fatal(err)
	}
	w.eventually(n.Name+" Ready", 20*time.Second, func() bool { return !w.seen.get(n.Name).readyAt.IsZero() })
	w.inject("kubelet-oom", n.Name) // the kubelet goes away mid-bootstrap...
	if !w.seen.get(n.Name).taintGoneAt.IsZero() {
		t.Fatalf("the startup taint was gone before the kubelet restart; the stability window (%s) did not hold", window)
	}
	w.eventually("the agent seeing the kubelet down", 15*time.Second, func() bool {
		c := w.condition(n.Name, "KubeletHealthy")
		return c != nil && c.Status == corev1.ConditionFalse
	})
	time.Sleep(2 * time.Second) // ...for a couple of seconds, then comes back
	if err := w.fleet.Heal(t.Context(), n.Name); err != nil {
		t.Fatal(err)
	}
	healed := time.Now()
	w.eventually("the startup taint removed", 60*time.Second, func() bool { return !w.seen.get(n.Name).taintGoneAt.IsZero() })
	if early := w.seen.get(n.Name).taintGoneAt.Sub(healed); early < window-time.Second {
		t.Errorf("startup taint removed %s after the kubelet came back, before the %s stability window", early, window)
	}
	if got := len(w.emu.Instances()); got != instances+1 {
		t.Errorf("%d instances, want %d: the bootstrap hiccup launched a duplicate", got, instances+1)
	}
	if calls := w.emu.TerminateCalls(); len(calls) != 0 {
		t.Errorf("terminations during bootstrap: %v", calls)
	}
	if h := w.seen.get(n.Name); len(h.states) != 0 || h.cordoned {
		t.Errorf("the bootstrapping node was remediated: states %v cordoned %v", h.states, h.cordoned)
	}
}

// S003: the leader dies in the middle of a remediation (draining, held by a do-not-disrupt
// pod). The other replica takes over from the state recorded on the Node, terminates the
// instance exactly once, the autoscaler replaces it exactly once, and the dead node's Leases
// (agent and kubelet) are garbage-collected with it.
func TestS003LeaderRestartMidRemediationResumesOnceAndLeasesAreCollected(t *testing.T) {
	w := newWorld(t, "s003", []fleet.PoolSpec{{Name: "s003-general", Size: 3}})
	victim := w.node("s003-general", false)
	holdPod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hold-" + victim.Name, Namespace: fleet.WorkloadNamespace,
			Annotations: map[string]string{fleet.DoNotDisrupt: "true"}},
		Spec: corev1.PodSpec{NodeName: victim.Name, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}},
	}
	if _, err := w.client.CoreV1().Pods(fleet.WorkloadNamespace).Create(t.Context(), holdPod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a, b := w.startRemediator("remediator-a"), w.startRemediator("remediator-b")
	instances := len(w.emu.Instances())
	w.inject("node-silent", victim.Name)
	w.eventually(victim.Name+" draining", 60*time.Second, func() bool {
		obj, err := w.client.CoreV1().Nodes().Get(t.Context(), victim.Name, metav1.GetOptions{})
		return err == nil && obj.Annotations[decide.AnnotationState] == "Draining"
	})
	lease, err := w.client.CoordinationV1().Leases(w.ns).Get(t.Context(), "nodevigil-remediator", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		t.Fatalf("leader lease: %v", err)
	}
	leader := a
	if strings.HasPrefix(*lease.Spec.HolderIdentity, "remediator-b") {
		leader = b
	}
	leader.Kill()
	zero := int64(0)
	if err := w.client.CoreV1().Pods(fleet.WorkloadNamespace).Delete(t.Context(), holdPod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}

	w.eventually("the surviving replica terminating the instance", 90*time.Second, func() bool { return w.emu.Terminations(victim.InstanceID) > 0 })
	w.replacement(victim, 60*time.Second)
	w.eventually(victim.Name+" deleted", 30*time.Second, func() bool { return w.seen.get(victim.Name).deleted })
	w.eventually("the dead node's Leases garbage-collected", 60*time.Second, func() bool {
		_, errA := w.client.CoordinationV1().Leases(w.ns).Get(t.Context(), victim.Name, metav1.GetOptions{})
		_, errK := w.client.CoordinationV1().Leases("kube-node-lease").Get(t.Context(), victim.Name, metav1.GetOptions{})
		return errA != nil && errK != nil
	})
	if n := w.emu.Terminations(victim.InstanceID); n != 1 {
		t.Errorf("instance terminated %d times across the leader change, want 1", n)
	}
	time.Sleep(2 * time.Second) // a second replacement would have joined by now
	if got := len(w.emu.Instances()); got != instances+1 {
		t.Errorf("%d instances, want %d (one replacement)", got, instances+1)
	}
}

// S004: a custom image's bootstrap mis-quotes --register-with-taints; the kubelet drops the
// taint. The node's own agent reads the kubelet's unit files and says exactly what is wrong —
// file, line, the entry, and the line to write instead — within seconds, instead of the node
// being killed 15 minutes later with "missing required startup taint".
func TestS004MisquotedTaintFlagIsExplainedWithinSeconds(t *testing.T) {
	w := newWorld(t, "s004", []fleet.PoolSpec{{Name: "s004-general", Size: 1, RealAgents: 1}})
	n := w.node("s004-general", true)
	if c := w.condition(n.Name, "KubeletConfigValid"); c == nil || c.Status != corev1.ConditionTrue {
		t.Fatalf("before the fault KubeletConfigValid = %+v, want True", c)
	}
	injected := time.Now()
	w.inject("bad-taint", n.Name)
	var c *corev1.NodeCondition
	w.eventually("KubeletConfigValid=False", 10*time.Second, func() bool {
		c = w.condition(n.Name, "KubeletConfigValid")
		return c != nil && c.Status == corev1.ConditionFalse
	})
	t.Logf("S004: reported %s after the flag went bad: %s", time.Since(injected).Round(100*time.Millisecond), c.Message)
	if c.Reason != "StartupTaintMalformed" {
		t.Errorf("reason %q, want StartupTaintMalformed", c.Reason)
	}
	for _, want := range []string{
		`/etc/systemd/system/kubelet.service.d/30-kubelet-extra-args.conf:2`,
		`"node.cilium.io/agent-not-ready=true:noExecute" has effect "noExecute"`,
		`write: Environment='KUBELET_EXTRA_ARGS=`,
	} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("message\n  %s\nwant it to contain\n  %s", c.Message, want)
		}
	}
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
