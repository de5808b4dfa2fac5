// Package awsevents runs AWS interruptions end to end on a real control plane: real
// nodevigil-agent processes, each reading its own instance's metadata service from the EC2
// emulator (IMDSv2 token flow, one loopback listener per instance) against a fake host root of
// its own, and one real nodevigil-remediator process talking to the same emulator's EC2 API.
// Nothing in between is simulated: a spot notice published in the emulator travels through the
// agent's IMDS watcher, its Node status patch and the remediator's informer to a cordon, as it
// would on AWS.
//
// It is shared by the end-to-end tests in this directory and by the interruption latency
// benchmark (integration/bench/interruptlatency), which is why it is not a _test file. Several
// Worlds share one control plane: each has its own namespace (agent Leases, the remediator's
// leader Lease), its own emulator and its own nodes, labelled with the namespace; a World's
// remediator is scoped to that label (its nodeSelector), so it never sees another World's
// nodes, and CatchAllIgnore leaves alone its own nodes of pools no policy names.
package awsevents

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodevigil/nodevigil/integration/clusterenv"
	"github.com/nodevigil/nodevigil/integration/ec2emu"
	"github.com/nodevigil/nodevigil/integration/testbin"
)

// Labels, taints and tags of the nodes a World creates.
const (
	// WorldLabel carries the World's namespace on each of its nodes; the World's remediator is
	// scoped to it (nodeSelector) so parallel Worlds never see each other's nodes.
	WorldLabel = "nodevigil.test/world"
	// PoolLabel names the node's pool within its World ("general", "kafka").
	PoolLabel = "nodevigil.test/awspool"
	// ZoneLabel is the well-known zone label; every node is in Zone.
	ZoneLabel = "topology.kubernetes.io/zone"
	// Zone is the availability zone of every instance.
	Zone = "us-east-1a"
	// ClusterTag is the tag the remediator's --cluster-tag-key expects on its instances.
	ClusterTag = "kubernetes.io/cluster/itest"
	// InterruptionTaint and InterruptionMark are what the remediator puts on a node it
	// cordons for an AWS event.
	InterruptionTaint = "nodevigil.io/interruption"
	InterruptionMark  = "nodevigil.io/interruption"
	// SpotCondition is the agent's condition for spot/instance-action.
	SpotCondition = "NoSpotInterruption"
	// RebalanceCondition is the agent's condition for events/recommendations/rebalance.
	RebalanceCondition = "NoRebalanceRecommendation"
	// spotPath is the metadata path whose first answered read after a notice ends the
	// "poll wait" part of the latency.
	spotPath = "/latest/meta-data/spot/instance-action"
)

// Cluster is what every World shares: the control plane and the two binaries.
type Cluster struct {
	Client        kubernetes.Interface
	Kubeconfig    string
	AgentBin      string
	RemediatorBin string
}

// World is one test's (or one benchmark's) AWS: an EC2 emulator, nodes each with a real agent
// reading its own metadata service, and at most one remediator.
type World struct {
	cl      *Cluster
	NS      string
	EC2     *ec2emu.Server
	dir     string
	healthz *httptest.Server

	// AgentLease is the agents' --lease-duration and the remediator's agentLeaseDuration
	// (also its observe period after start).
	AgentLease time.Duration
	// RemediatorLogLevel is the remediator's --log-level ("debug" unless set): a benchmark
	// with thousands of nodes keeps its log in memory and wants "info".
	RemediatorLogLevel string

	mu         sync.Mutex
	nodes      []*Node
	remediator *testbin.Process
	remAddr    string
	closers    []func()
	seq        int
	bulk       []string // pools of AddBulkNodes, deleted by label on Close
}

// NewWorld starts an emulator for a World in namespace ns (which must exist), keeping files
// under dir.
func NewWorld(cl *Cluster, ns, dir string) (*World, error) {
	emu := ec2emu.New(ec2emu.Config{ShutdownDelay: time.Second})
	if err := emu.Start(); err != nil {
		return nil, fmt.Errorf("start ec2 emulator: %w", err)
	}
	w := &World{cl: cl, NS: ns, EC2: emu, dir: dir, AgentLease: 6 * time.Second}
	w.healthz = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(rw, "ok") }))
	return w, nil
}

// Close stops the remediator, the agents, the kubelet Lease renewers and the emulator.
func (w *World) Close() {
	w.mu.Lock()
	rem, closers, nodes := w.remediator, w.closers, w.nodes
	w.mu.Unlock()
	if rem != nil {
		_ = rem.Stop(10 * time.Second)
	}
	var wg sync.WaitGroup
	for _, n := range nodes {
		if n.Agent != nil {
			wg.Add(1)
			go func() { defer wg.Done(); _ = n.Agent.Stop(10 * time.Second) }()
		}
	}
	wg.Wait()
	for _, c := range slices.Backward(closers) {
		c()
	}
	w.healthz.Close()
	_ = w.EC2.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range nodes {
		_ = w.cl.Client.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{})
	}
	w.mu.Lock()
	bulk := w.bulk
	w.mu.Unlock()
	for _, pool := range bulk {
		_ = w.cl.Client.CoreV1().Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: WorldLabel + "=" + w.NS + "," + PoolLabel + "=" + pool})
	}
}

// AgentOptions shape one node's agent.
type AgentOptions struct {
	// SpotInterval is the agent's imds.spotInterval, and its imds.rebalanceInterval too (at
	// least 1s) so the scenarios wait on neither; zero leaves the agent's defaults.
	SpotInterval time.Duration
	// Unreachable points the agent at a loopback port nobody listens on instead of its
	// instance's metadata service, as a pod cut off from 169.254.169.254 sees it.
	Unreachable bool
	// CheckInterval is the agent's --check-interval; zero leaves its default.
	CheckInterval time.Duration
}

// Node is one node: its Node object, its EC2 instance and metadata service, and its agent.
type Node struct {
	Name       string
	InstanceID string
	Pool       string
	Agent      *testbin.Process
	w          *World

	mu        sync.Mutex
	spotSince time.Time // reads of spotPath answered 200 at or after this time count
	spotRead  time.Time // the first such read
}

// AddNode creates instance, metadata service, Node (Ready, in pool, kubelet Lease renewed
// until ctx ends) and starts the node's agent. lifecycle is ec2emu.LifecycleSpot or "".
func (w *World) AddNode(ctx context.Context, pool, lifecycle string, opts AgentOptions) (*Node, error) {
	w.mu.Lock()
	w.seq++
	seq := w.seq
	w.mu.Unlock()
	n := &Node{
		Name:       fmt.Sprintf("%s-%s-%d", w.NS, pool, seq),
		InstanceID: fmt.Sprintf("i-%017x", time.Now().UnixNano()&0xffffffffffff<<8|int64(seq&0xff)),
		Pool:       pool,
		w:          w,
	}
	imdsURL := ""
	if opts.Unreachable {
		addr, release, err := testbin.RefusedAddr() // held: nothing can start listening there
		if err != nil {
			return nil, err
		}
		w.addCloser(release)
		imdsURL = "http://" + addr
	} else {
		srv := httptest.NewServer(n.timedIMDS(w.EC2.IMDSHandler(n.InstanceID)))
		w.addCloser(srv.Close)
		imdsURL = srv.URL
	}
	created, err := clusterenv.CreateNode(ctx, w.cl.Client, w.EC2, clusterenv.NodeSpec{
		Name: n.Name, InstanceID: n.InstanceID, Zone: Zone, Lifecycle: lifecycle, ClusterTag: ClusterTag,
		Labels: map[string]string{WorldLabel: w.NS, PoolLabel: pool},
	})
	if created != nil {
		w.mu.Lock()
		w.nodes = append(w.nodes, n)
		w.mu.Unlock()
	}
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The kubelet's node Lease (the agent renews its own).
		clusterenv.RenewLease(rctx, w.cl.Client, clusterenv.Lease{Namespace: clusterenv.KubeletLeaseNamespace, Node: created, Duration: 40 * time.Second, Interval: 5 * time.Second})
	}()
	w.addCloser(func() { cancel(); <-done })
	if err := n.startAgent(imdsURL, opts); err != nil {
		return nil, err
	}
	return n, nil
}

func (w *World) addCloser(f func()) {
	w.mu.Lock()
	w.closers = append(w.closers, f)
	w.mu.Unlock()
}

// timedIMDS wraps the instance's metadata service to note when the agent first read a spot
// notice (status 200 on spotPath) since the last MarkNotice.
func (n *Node) timedIMDS(h http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: rw, status: http.StatusOK}
		h.ServeHTTP(sw, r)
		if r.URL.Path == spotPath && sw.status == http.StatusOK {
			now := time.Now()
			n.mu.Lock()
			if !n.spotSince.IsZero() && n.spotRead.IsZero() && !now.Before(n.spotSince) {
				n.spotRead = now
			}
			n.mu.Unlock()
		}
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// SpotNotice publishes a spot interruption notice (terminate in two minutes) in the node's
// metadata and returns the moment it became readable; SpotRead then reports when the agent
// first read it.
func (n *Node) SpotNotice() time.Time {
	now := time.Now()
	n.mu.Lock()
	n.spotSince, n.spotRead = now, time.Time{}
	n.mu.Unlock()
	n.w.EC2.SetSpotInstanceAction(n.InstanceID, "terminate", now.Add(2*time.Minute))
	return now
}

// WithdrawSpotNotice makes spot/instance-action answer 404 again.
func (n *Node) WithdrawSpotNotice() {
	n.mu.Lock()
	n.spotSince = time.Time{}
	n.mu.Unlock()
	n.w.EC2.SetSpotInstanceAction(n.InstanceID, "", time.Time{})
}

// SpotRead is when the agent first read the current spot notice (zero: not yet).
func (n *Node) SpotRead() time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.spotRead
}

// writeHost writes a healthy host root: memory pressure files and an installed CNI.
func writeHost(root string) error {
	files := map[string]string{
		"proc/pressure/memory":           "some avg10=0.00 avg60=0.00 avg300=0.00 total=1000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=500\n",
		"proc/meminfo":                   "MemTotal:       8000000 kB\nMemFree:        4000000 kB\nMemAvailable:   6000000 kB\nBuffers:          10000 kB\nCached:         1000000 kB\n",
		"opt/cni/bin/bridge":             "#!/bin/sh\n",
		"opt/cni/bin/portmap":            "#!/bin/sh\n",
		"etc/cni/net.d/10-test.conflist": `{"cniVersion":"1.0.0","name":"test","plugins":[{"type":"bridge"},{"type":"portmap","capabilities":{"portMappings":true}}]}`,
	}
	for name, data := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if strings.HasPrefix(name, "opt/cni/bin/") {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(data), mode); err != nil {
			return err
		}
	}
	return nil
}

func (n *Node) startAgent(imdsURL string, opts AgentOptions) error {
	w := n.w
	dir := filepath.Join(w.dir, n.Name)
	root := filepath.Join(dir, "host")
	if err := writeHost(root); err != nil {
		return fmt.Errorf("host root of %s: %w", n.Name, err)
	}
	cfg := "apiVersion: nodevigil.io/v1alpha1\nkind: AgentConfig\nimds:\n  eventInterval: 10s\n  timeout: 1s\n"
	if opts.SpotInterval > 0 {
		cfg += "  spotInterval: " + opts.SpotInterval.String() + "\n"
		cfg += "  rebalanceInterval: " + max(opts.SpotInterval, time.Second).String() + "\n"
	}
	cfgPath := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return err
	}
	args := []string{"run",
		"--node-name", n.Name,
		"--namespace", w.NS,
		"--pod-name", "nodevigil-agent-" + n.Name,
		"--kubeconfig", w.cl.Kubeconfig,
		"--host-root", root,
		"--listen-address", "127.0.0.1:0", // a port the agent picks at bind time; nothing here scrapes it
		"--kubelet-healthz-url", w.healthz.URL + "/healthz",
		"--lease-duration", w.AgentLease.String(),
		"--lease-renew-interval", (w.AgentLease / 6).String(),
		"--lease-renew-timeout", (w.AgentLease / 8).String(),
		"--imds-endpoint", imdsURL,
		"--config", cfgPath,
		"--log-format", "text",
	}
	if opts.CheckInterval > 0 {
		args = append(args, "--check-interval", opts.CheckInterval.String())
	}
	p, err := testbin.Start("agent-"+n.Name, w.cl.AgentBin, args)
	if err != nil {
		return err
	}
	n.Agent = p
	return nil
}

// PolicyFor returns a remediator policy (YAML list item) selecting this World's nodes of pool,
// with remediation off, a quick drain, and body (more policy fields, YAML, may be empty).
func (w *World) PolicyFor(pool, body string) string {
	p := fmt.Sprintf("- name: %s\n  nodeSelector: %s=%s,%s=%s\n  action: None\n  drain: {timeout: 20s, honorDoNotDisrupt: true}\n",
		pool, WorldLabel, w.NS, PoolLabel, pool)
	for _, l := range strings.Split(strings.TrimSpace(body), "\n") {
		if l != "" {
			p += "  " + l + "\n"
		}
	}
	return p
}

// CatchAllIgnore is the last policy of every World's remediator: the World's nodes of a pool
// no policy names are left alone, interruptions included. (Other Worlds' nodes are outside
// the remediator's nodeSelector.)
const CatchAllIgnore = `- name: others
  nodeSelector: ""
  action: None
  interruptions: {spotInterruption: Ignore, rebalanceRecommendation: Ignore, scheduledReboot: Ignore, scheduledRetirement: Ignore, asgTermination: Ignore}
`

// StartRemediator writes a RemediatorConfig with policies (from PolicyFor) followed by
// CatchAllIgnore, starts the remediator against the World's emulator and waits for /readyz.
func (w *World) StartRemediator(ctx context.Context, policies string, extra ...string) error {
	cfg := fmt.Sprintf("apiVersion: nodevigil.io/v1alpha1\nkind: RemediatorConfig\ndryRun: false\nagentNamespace: %s\nagentLeaseDuration: %s\n"+
		"nodeSelector: %s=%s\nzonePauseThreshold: 100%%\nclusterPauseThreshold: 100%%\npolicies:\n%s%s", w.NS, w.AgentLease, WorldLabel, w.NS, policies, CatchAllIgnore)
	path := filepath.Join(w.dir, "remediator.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return err
	}
	p, addr, err := clusterenv.StartRemediator(ctx, clusterenv.Remediator{
		Name: "remediator-" + w.NS, Bin: w.cl.RemediatorBin, Kubeconfig: w.cl.Kubeconfig, Namespace: w.NS, Config: path,
		EC2URL: w.EC2.URL(), ClusterTag: ClusterTag, LogLevel: w.RemediatorLogLevel,
		Flags: append([]string{"--leader-elect=false"}, extra...),
	})
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.remediator, w.remAddr = p, addr
	w.mu.Unlock()
	return clusterenv.WaitReady(ctx, "remediator-"+w.NS, p, addr, 10*time.Minute)
}

// Remediator is the World's remediator process (nil before StartRemediator).
func (w *World) Remediator() *testbin.Process {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.remediator
}

// Get reads the node.
func (w *World) Get(ctx context.Context, n *Node) (*corev1.Node, error) {
	return w.cl.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
}

// CordonedForInterruption says whether the remediator holds obj cordoned and tainted for an
// AWS event.
func CordonedForInterruption(obj *corev1.Node) bool {
	return obj.Spec.Unschedulable && slices.ContainsFunc(obj.Spec.Taints, func(t corev1.Taint) bool { return t.Key == InterruptionTaint })
}

// Condition returns obj's condition of type typ, or nil.
func Condition(obj *corev1.Node, typ string) *corev1.NodeCondition {
	for i := range obj.Status.Conditions {
		if string(obj.Status.Conditions[i].Type) == typ {
			return &obj.Status.Conditions[i]
		}
	}
	return nil
}

// HasEvent says whether an Event with reason (and type, when not empty) names the node.
func (w *World) HasEvent(ctx context.Context, node, typ, reason string) (bool, error) {
	return clusterenv.HasEvent(ctx, w.cl.Client, node, typ, reason)
}

// ErrAgentExited is returned by the waits when a node's agent died.
var ErrAgentExited = errors.New("agent exited")

// AgentAlive returns ErrAgentExited (with its log tail) when the node's agent process ended.
func (n *Node) AgentAlive() error {
	if exited, err := n.Agent.Exited(); exited {
		return fmt.Errorf("%w: %s: %v\n%s", ErrAgentExited, n.Name, err, n.Agent.LogTail(30))
	}
	return nil
}

// RemediatorMetric returns the value of the remediator's metric sample whose line starts with
// series (name and labels exactly as exposed, e.g.
// `nodevigil_remediator_scheduled_event_polls_total{result="ok"}`), read from its /metrics.
func (w *World) RemediatorMetric(ctx context.Context, series string) (float64, error) {
	w.mu.Lock()
	addr := w.remAddr
	w.mu.Unlock()
	code, body := clusterenv.Get(ctx, "http://"+addr+"/metrics")
	if code != http.StatusOK {
		return 0, fmt.Errorf("read remediator metrics: status %d", code)
	}
	if v := clusterenv.MetricValue(body, series); v >= 0 {
		return v, nil
	}
	return 0, fmt.Errorf("remediator metrics have no %s", series)
}
