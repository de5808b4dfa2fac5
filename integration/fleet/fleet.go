// Package fleet runs a small simulated fleet of EC2 nodes on a real control plane, for `make
// run` and the scenario tests: kwok plays the kubelets (Ready, kube-node-lease Leases, pods),
// the EC2 emulator holds the instances (providerIDs match), several nodes run a real
// nodevigil-agent process each against a fake host root of their own, the others renew a
// simulated agent Lease, and a replacement loop plays the autoscaler: when an instance is
// terminated a new node joins the same pool and zone with the startup taint, which its agent
// removes after the stability window. Faults (Fleet.Fault) break one node, or one zone, the
// way real nodes break, so that the real remediator and agents can be watched handling them.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/nodevigil/nodevigil/integration/ec2emu"
	"github.com/nodevigil/nodevigil/integration/fakesystemd"
)

// Labels, annotations and taints the fleet puts on its Nodes.
const (
	// KwokLabel marks the Nodes the fleet's kwok manages; its value is the fleet's ID, so
	// several fleets on one control plane (parallel tests) never drive each other's nodes.
	// Removing it is how a kubelet "dies": kwok selects nodes with it server-side, so the node
	// leaves kwok's watch (a DELETED event) and kwok stops renewing its Lease and status. (An
	// annotation would not do: kwok filters annotations client-side and keeps renewing the
	// Lease of a node that no longer matches.)
	KwokLabel = "kwok.x-k8s.io/node"
	// AgentLabel says whether a node's agent is a real process ("real") or a simulated
	// heartbeat ("simulated"), so `kubectl get nodes -L` shows which is which.
	AgentLabel = "dev.nodevigil.io/agent"
	// FleetLabel carries the fleet's ID.
	FleetLabel = "dev.nodevigil.io/fleet"
	// ZoneLabel is the well-known topology label the remediator groups zones by.
	ZoneLabel = "topology.kubernetes.io/zone"
	// DefaultPoolLabel is the label naming a node's pool (Karpenter's).
	DefaultPoolLabel = "karpenter.sh/nodepool"
	// StartupTaint is the CNI startup taint every joining node registers (Cilium's, as on the
	// EKS host roots the real agents read) and the agents own.
	StartupTaint = "node.cilium.io/agent-not-ready"
	// DoNotDisrupt is Karpenter's pod annotation; the fleet puts it on the kafka pool's pods.
	DoNotDisrupt = "karpenter.sh/do-not-disrupt"
	// WorkloadNamespace holds the fleet's pods (one per node).
	WorkloadNamespace = "fleet-workloads"
)

// PoolSpec is one node pool of the fleet.
type PoolSpec struct {
	// Name is the pool's label value, e.g. "general".
	Name string
	// Size is the number of nodes, spread over the zones round-robin.
	Size int
	// RealAgents is how many of them run a real nodevigil-agent process (the first ones).
	RealAgents int
	// DoNotDisrupt puts karpenter.sh/do-not-disrupt on the pool's pods.
	DoNotDisrupt bool
	// Spot launches the pool's instances as spot instances (instanceLifecycle spot), the only
	// kind AWS sends spot interruption notices to.
	Spot bool
}

// Config describes a fleet. Client, Kubeconfig, EC2, AgentBin and KwokBin are required.
type Config struct {
	Client     kubernetes.Interface
	Kubeconfig string
	EC2        *ec2emu.Server
	// ClusterTag is the EC2 tag key marking the cluster's instances (value "owned").
	ClusterTag string
	AgentBin   string
	KwokBin    string
	// AgentNamespace holds the agents' Leases (and must exist).
	AgentNamespace string
	// Dir holds the host roots; a temporary directory when empty.
	Dir string
	// ID names the fleet (node names, the kwok annotation value). Default "fleet".
	ID string
	// Zones default to us-east-1a, us-east-1b and us-east-1c.
	Zones []string
	Pools []PoolSpec
	// PoolLabel defaults to DefaultPoolLabel.
	PoolLabel string
	// KubeletLeaseSeconds is the kube-node-lease duration kwok writes. Default 40 (the kubelet's).
	KubeletLeaseSeconds int
	// Agent timings. Defaults: lease 10s, renewal 2s, checks 2s, stability window 5s.
	AgentLeaseDuration time.Duration
	AgentRenewInterval time.Duration
	CheckInterval      time.Duration
	StabilityWindow    time.Duration
	// AgentLogLevel is the real agents' --log-level. Default "warn": a fleet's agents would
	// drown the remediator's story.
	AgentLogLevel string
	// Output receives the children's logs (kwok, agents), each line prefixed with its name.
	// Default os.Stderr. Ignored when Writer is set.
	Output io.Writer
	// Writer, when set, returns the writer for one child's output (named "kwok" or
	// "agent <node>"), for a caller that prefixes and serialises lines itself (devcluster's
	// terminal). The fleet closes it when the child exits.
	Writer func(name string) io.WriteCloser
	// HostFixtures is the directory of EKS host roots (collectors/kubelet/testdata/hosts).
	// Default: found next to this package's source.
	HostFixtures string
	// Logger receives the fleet's own story (joins, faults, replacements). Default slog.Default().
	Logger *slog.Logger
	// LocalRepair gives every real agent a system bus (a dbus-daemon with a systemd stand-in
	// for its kubelet unit, package fakesystemd) and turns its local kubelet repair on, so a
	// kubelet-oom is restarted by the agent before the remediator's toleration runs out.
	// Needs dbus-daemon on the machine.
	LocalRepair bool
	// SpotNoticeWarning is how long after a spot-notice fault AWS reclaims the instance.
	// Default DefaultSpotNoticeWarning, AWS's two minutes; tests shorten it.
	SpotNoticeWarning time.Duration
}

func (c *Config) defaults() error {
	switch {
	case c.Client == nil:
		return errors.New("fleet: Config.Client is required")
	case c.Kubeconfig == "":
		return errors.New("fleet: Config.Kubeconfig is required")
	case c.EC2 == nil:
		return errors.New("fleet: Config.EC2 is required")
	case c.AgentBin == "" || c.KwokBin == "":
		return errors.New("fleet: Config.AgentBin and Config.KwokBin are required")
	case c.AgentNamespace == "":
		return errors.New("fleet: Config.AgentNamespace is required")
	case len(c.Pools) == 0:
		return errors.New("fleet: Config.Pools is empty; give at least one pool")
	}
	if c.ID == "" {
		c.ID = "fleet"
	}
	if len(c.Zones) == 0 {
		c.Zones = []string{"us-east-1a", "us-east-1b", "us-east-1c"}
	}
	if c.PoolLabel == "" {
		c.PoolLabel = DefaultPoolLabel
	}
	if c.ClusterTag == "" {
		c.ClusterTag = "kubernetes.io/cluster/" + c.ID
	}
	if c.KubeletLeaseSeconds == 0 {
		c.KubeletLeaseSeconds = 40
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.AgentLeaseDuration, 10*time.Second)
	def(&c.AgentRenewInterval, 2*time.Second)
	def(&c.CheckInterval, 2*time.Second)
	def(&c.StabilityWindow, 5*time.Second)
	def(&c.SpotNoticeWarning, DefaultSpotNoticeWarning)
	if c.AgentLogLevel == "" {
		c.AgentLogLevel = "warn"
	}
	if c.Output == nil {
		c.Output = os.Stderr
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.HostFixtures == "" {
		_, file, _, ok := runtime.Caller(0)
		if !ok {
			return errors.New("fleet: cannot locate the host fixtures; set Config.HostFixtures")
		}
		c.HostFixtures = filepath.Join(filepath.Dir(file), "..", "..", "collectors", "kubelet", "testdata", "hosts")
	}
	if c.Dir == "" || (c.LocalRepair && len(filepath.Join(c.Dir, longestNodeName, fakesystemd.SocketPath)) > maxSocketPath) {
		// A host root deeper than this could not hold its system bus's socket (a unix socket
		// path is at most 107 bytes).
		d, err := os.MkdirTemp("", "nodevigil-fleet-")
		if err != nil {
			return fmt.Errorf("fleet: create host-root directory: %w", err)
		}
		c.Dir = d
	}
	return nil
}

// longestNodeName stands for a node name when checking that host roots are short enough.
const longestNodeName = "a-pool-name-of-twenty-a-1000"

const maxSocketPath = 107

// Fleet is a running simulated fleet.
type Fleet struct {
	cfg     Config
	ctx     context.Context
	cancel  context.CancelFunc
	kwok    *child
	healthz *http.Server
	hzAddr  string
	wg      sync.WaitGroup

	mu    sync.Mutex
	seq   int
	nodes map[string]*Node // live nodes by name
	order []string         // live node names in join order
	// replaced maps a retired node to the node that replaced it.
	replaced map[string]string
}

// Start creates the fleet's instances and Nodes, starts kwok, the real agents and the
// simulated heartbeats, and the replacement loop. It returns once every node has joined (not
// once they are ready: see WaitReady). Stop undoes it.
func Start(ctx context.Context, cfg Config) (*Fleet, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	fctx, cancel := context.WithCancel(context.Background())
	f := &Fleet{cfg: cfg, ctx: fctx, cancel: cancel, nodes: map[string]*Node{}, replaced: map[string]string{}}
	if err := f.startHealthz(); err != nil {
		cancel()
		return nil, err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: WorkloadNamespace}}
	if _, err := cfg.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		f.Stop()
		return nil, fmt.Errorf("fleet: create namespace %s: %w", WorkloadNamespace, err)
	}
	kwok, err := f.startChild("kwok", cfg.KwokBin, []string{
		"--kubeconfig", cfg.Kubeconfig,
		"--manage-all-nodes=false",
		"--manage-nodes-with-label-selector", KwokLabel + "=" + cfg.ID,
		"--node-lease-duration-seconds", fmt.Sprint(cfg.KubeletLeaseSeconds),
		"--cidr", "10.244.0.1/16",
		"--node-ip", "10.0.0.1",
		"--server-address", "",
		"--v", "WARN",
	})
	if err != nil {
		f.Stop()
		return nil, err
	}
	f.kwok = kwok
	for _, p := range cfg.Pools {
		for i := 0; i < p.Size; i++ {
			zone := cfg.Zones[i%len(cfg.Zones)]
			if _, err := f.join(ctx, p, zone, i < p.RealAgents); err != nil {
				f.Stop()
				return nil, err
			}
		}
	}
	f.wg.Add(1)
	go f.replacementLoop()
	return f, nil
}

// Stop stops every agent, heartbeat, kwok and the replacement loop. Nodes and instances are
// left as they are (the control plane and emulator go away with their owners).
func (f *Fleet) Stop() {
	f.cancel()
	f.mu.Lock()
	nodes := make([]*Node, 0, len(f.nodes))
	for _, n := range f.nodes {
		nodes = append(nodes, n)
	}
	f.mu.Unlock()
	for _, n := range nodes {
		n.stopAgent()
		n.stopSystemd()
	}
	if f.kwok != nil {
		f.kwok.stop(10 * time.Second)
	}
	if f.healthz != nil {
		_ = f.healthz.Close()
	}
	f.wg.Wait()
}

// KwokExited reports kwok's exit, for a caller that supervises its children.
func (f *Fleet) KwokExited() <-chan error { return f.kwok.exited }

// Nodes returns the live nodes, in join order.
func (f *Fleet) Nodes() []*Node {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*Node, 0, len(f.order))
	for _, name := range f.order {
		out = append(out, f.nodes[name])
	}
	return out
}

// Node returns the live node called name.
func (f *Fleet) Node(name string) (*Node, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := f.nodes[name]
	return n, ok
}

// ReplacementOf returns the node that replaced name, once the replacement loop has joined it.
func (f *Fleet) ReplacementOf(name string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.replaced[name]
	return r, ok
}

// Config returns the fleet's configuration with its defaults filled in.
func (f *Fleet) Config() Config { return f.cfg }

// join creates one node: its instance, its Node (startup taint, providerID, pool and zone),
// its workload pod, and its agent (a real process or a simulated heartbeat).
func (f *Fleet) join(ctx context.Context, pool PoolSpec, zone string, real bool, replaces ...string) (*Node, error) {
	f.mu.Lock()
	f.seq++
	seq := f.seq
	f.mu.Unlock()
	name := fmt.Sprintf("%s-%s-%d", pool.Name, zone[len(zone)-1:], seq)
	id := fmt.Sprintf("i-0f1ee7%011x", int64(seq)+time.Now().UnixNano()%(1<<36)<<8)
	n := &Node{Name: name, Pool: pool.Name, Zone: zone, InstanceID: id, Real: real, fleet: f, spec: pool,
		joined: time.Now(), kubeletUp: true, agentUp: true}
	inst := ec2emu.Instance{ID: id, Zone: zone, Tags: map[string]string{f.cfg.ClusterTag: "owned"}}
	if pool.Spot {
		inst.Lifecycle = ec2emu.LifecycleSpot
	}
	if err := f.cfg.EC2.AddInstance(inst); err != nil {
		return nil, fmt.Errorf("fleet: add instance for %s: %w", name, err)
	}
	agentKind := "simulated"
	if real {
		agentKind = "real"
	}
	obj := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			Labels: map[string]string{
				f.cfg.PoolLabel: pool.Name, ZoneLabel: zone, AgentLabel: agentKind, FleetLabel: f.cfg.ID,
				"kubernetes.io/hostname": name, "type": "kwok", KwokLabel: f.cfg.ID,
			},
			Annotations: map[string]string{},
		},
		Spec: corev1.NodeSpec{
			ProviderID: "aws:///" + zone + "/" + id,
			Taints:     []corev1.Taint{{Key: StartupTaint, Value: "true", Effect: corev1.TaintEffectNoExecute}},
		},
	}
	if len(replaces) > 0 {
		obj.Annotations[ReplacesAnnotation] = replaces[0]
	}
	created, err := f.cfg.Client.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("fleet: create node %s: %w", name, err)
	}
	n.uid = created.UID
	if err := f.createPod(ctx, n); err != nil {
		return nil, err
	}
	if real {
		n.hostRoot = filepath.Join(f.cfg.Dir, name) // set once, before anything reads it
		if err := n.setupHost(); err != nil {
			return nil, err
		}
		if n.imds, err = f.cfg.EC2.StartIMDS(id); err != nil {
			return nil, fmt.Errorf("fleet: metadata service of %s: %w", name, err)
		}
		if f.cfg.LocalRepair {
			sd, err := fakesystemd.Start(fakesystemd.Config{HostRoot: n.hostRoot, OnRestart: n.restartedByAgent})
			if err != nil {
				return nil, fmt.Errorf("fleet: system bus of %s: %w", name, err)
			}
			n.systemd = sd
		}
		if err := n.startAgent(); err != nil {
			return nil, err
		}
	} else {
		f.wg.Add(1)
		go n.simulateAgent(f.ctx)
	}
	f.mu.Lock()
	f.nodes[name] = n
	f.order = append(f.order, name)
	f.mu.Unlock()
	if len(replaces) > 0 {
		f.record(ctx, n, EventReplacementJoined, "joined pool "+pool.Name+" in "+zone+" with the startup taint, replacing "+replaces[0])
	}
	f.cfg.Logger.Info("node joined", "node", name, "pool", pool.Name, "zone", zone, "instance_id", id, "agent", agentKind)
	return n, nil
}

func (f *Fleet) createPod(ctx context.Context, n *Node) error {
	ann := map[string]string{}
	if n.spec.DoNotDisrupt {
		ann[DoNotDisrupt] = "true"
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app-" + n.Name, Namespace: WorkloadNamespace, Annotations: ann,
			Labels: map[string]string{"app": n.Pool}},
		Spec: corev1.PodSpec{
			NodeName:    n.Name,
			Containers:  []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}},
			Tolerations: []corev1.Toleration{{Key: StartupTaint, Operator: corev1.TolerationOpExists}},
		},
	}
	if _, err := f.cfg.Client.CoreV1().Pods(WorkloadNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("fleet: create pod on %s: %w", n.Name, err)
	}
	return nil
}

// replacementLoop plays the autoscaler: an instance that is shutting down or terminated is
// replaced by a new node in the same pool and zone; once terminated, its Node is deleted if
// the remediator has not done it (as the cloud node controller would).
func (f *Fleet) replacementLoop() {
	defer f.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-f.ctx.Done():
			return
		case <-t.C:
		}
		for _, n := range f.Nodes() {
			inst, ok := f.cfg.EC2.Instance(n.InstanceID)
			if !ok || (inst.State != ec2emu.StateShuttingDown && inst.State != ec2emu.StateTerminated) {
				continue
			}
			f.retire(n)
			f.cfg.Logger.Info("instance terminated; launching a replacement", "node", n.Name, "instance_id", n.InstanceID, "pool", n.Pool)
			r, err := f.join(f.ctx, n.spec, n.Zone, n.Real, n.Name)
			if err != nil {
				if f.ctx.Err() == nil {
					f.cfg.Logger.Error("replacement failed", "node", n.Name, "err", err)
				}
				continue
			}
			f.mu.Lock()
			f.replaced[n.Name] = r.Name
			f.mu.Unlock()
			f.wg.Add(1)
			go f.deleteWhenTerminated(n)
		}
	}
}

// retire takes a node out of the live set and stops whatever ran on it: the machine is gone.
func (f *Fleet) retire(n *Node) {
	f.mu.Lock()
	delete(f.nodes, n.Name)
	for i, name := range f.order {
		if name == n.Name {
			f.order = append(f.order[:i], f.order[i+1:]...)
			break
		}
	}
	f.mu.Unlock()
	n.setKubelet(false)
	n.stopAgent()
	n.stopSystemd()
}

func (f *Fleet) deleteWhenTerminated(n *Node) {
	defer f.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		inst, ok := f.cfg.EC2.Instance(n.InstanceID)
		if !ok || inst.State == ec2emu.StateTerminated {
			err := f.cfg.Client.CoreV1().Nodes().Delete(f.ctx, n.Name, metav1.DeleteOptions{
				Preconditions: &metav1.Preconditions{UID: &n.uid}})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) && f.ctx.Err() == nil {
				f.cfg.Logger.Warn("delete terminated node", "node", n.Name, "err", err)
			}
			return
		}
		select {
		case <-f.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// setKwok makes kwok manage the node (its "kubelet" runs) or not (it died): without the
// label kwok stops renewing the node's Lease and status.
func (f *Fleet) setKwok(ctx context.Context, n *Node, on bool) error {
	val := "null"
	if on {
		val = fmt.Sprintf("%q", f.cfg.ID)
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, KwokLabel, val)
	_, err := f.cfg.Client.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("fleet: switch kubelet of %s: %w", n.Name, err)
	}
	return nil
}

// startHealthz serves every real node's kubelet /healthz at /healthz/<node>.
func (f *Fleet) startHealthz() error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("fleet: listen for kubelet healthz: %w", err)
	}
	f.hzAddr = l.Addr().String()
	f.healthz = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, ok := f.Node(strings.TrimPrefix(r.URL.Path, "/healthz/"))
		if ok && n.kubeletHealthy() {
			_, _ = io.WriteString(w, "ok")
			return
		}
		http.Error(w, "[-]syncloop failed: kubelet is not running", http.StatusInternalServerError)
	})}
	go func() { _ = f.healthz.Serve(l) }()
	return nil
}

// Summary is one line per pool: how many nodes, which run a real agent.
func (f *Fleet) Summary() string {
	byPool := map[string][]*Node{}
	for _, n := range f.Nodes() {
		byPool[n.Pool] = append(byPool[n.Pool], n)
	}
	pools := make([]string, 0, len(byPool))
	for p := range byPool {
		pools = append(pools, p)
	}
	sort.Strings(pools)
	var b strings.Builder
	for _, p := range pools {
		var real, sim []string
		for _, n := range byPool[p] {
			if n.Real {
				real = append(real, n.Name)
			} else {
				sim = append(sim, n.Name)
			}
		}
		fmt.Fprintf(&b, "  pool %-8s %2d nodes; real agents: %s; simulated agent leases: %s\n",
			p, len(byPool[p]), strings.Join(real, " "), strings.Join(sim, " "))
	}
	return b.String()
}

// WaitReady waits until every live node is Ready and has shed its startup taint.
func (f *Fleet) WaitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	var pending []string
	for {
		pending = pending[:0]
		for _, n := range f.Nodes() {
			obj, err := f.cfg.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil || !ready(obj) || hasTaint(obj, StartupTaint) {
				pending = append(pending, n.Name)
			}
		}
		if len(pending) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("fleet: nodes not ready (or still carrying %s) after %s: %s", StartupTaint, timeout, strings.Join(pending, ", "))
		case <-t.C:
		}
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

// Join adds one node to the pool called pool, in zone, as the autoscaler would launch it (with
// the startup taint), with a real agent or a simulated one.
func (f *Fleet) Join(ctx context.Context, pool, zone string, real bool) (*Node, error) {
	for _, p := range f.cfg.Pools {
		if p.Name == pool {
			return f.join(ctx, p, zone, real)
		}
	}
	return nil, fmt.Errorf("fleet: no pool %q", pool)
}
