package fleet

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevigil/nodevigil/agent/conditions"
	"github.com/nodevigil/nodevigil/collectors/cni"
	kubeletcheck "github.com/nodevigil/nodevigil/collectors/kubelet"
	"github.com/nodevigil/nodevigil/collectors/memory"
	"github.com/nodevigil/nodevigil/integration/fakesystemd"
	"github.com/nodevigil/nodevigil/integration/testbin"
)

// Host fixtures (collectors/kubelet/testdata/hosts): every real node starts as an AL2 node
// whose bootstrap quoted its taint flag right; the S004 fault swaps in the mis-quoted one.
const (
	hostOK       = "al2-dropin-quoted-ok"
	hostBadTaint = "al2-dropin-bad-effect"
)

// Node is one node of the fleet.
type Node struct {
	Name       string
	Pool       string
	Zone       string
	InstanceID string
	// Real says whether a real nodevigil-agent process runs for the node.
	Real bool

	fleet    *Fleet
	spec     PoolSpec
	uid      types.UID
	joined   time.Time
	hostRoot string

	mu        sync.Mutex
	kubeletUp bool // the kubelet /healthz answers ok
	agentUp   bool // the agent runs (real process, or simulated heartbeat)
	agent     *child
	// broken says the kubelet dies again at every restart (fault kubelet-dead): local repair
	// cannot help, only replacement can.
	broken bool
	// systemd is the real agent's system bus with its kubelet unit (Config.LocalRepair).
	systemd *fakesystemd.Systemd
	// imds is the base URL of the instance's own metadata service in the EC2 emulator, which
	// the real agent watches for AWS events.
	imds string
}

// restartedByAgent is the kubelet unit's restart, asked for by the agent's local repair: the
// kubelet comes back (kwok resumes its Lease and status, /healthz answers) unless the node is
// broken.
func (n *Node) restartedByAgent() bool {
	n.mu.Lock()
	broken := n.broken
	n.mu.Unlock()
	if broken {
		n.fleet.cfg.Logger.Info("kubelet restart failed: it dies again at once", "node", n.Name)
		return false
	}
	n.setKubelet(true)
	if err := n.fleet.setKwok(n.fleet.ctx, n, true); err != nil {
		n.fleet.cfg.Logger.Warn("kubelet restart: resume kwok failed", "node", n.Name, "err", err)
		return false
	}
	n.fleet.cfg.Logger.Info("kubelet restarted by the agent's local repair", "node", n.Name)
	return true
}

// KubeletRestarts counts the restarts of the node's kubelet unit its agent asked systemd for
// (0 without Config.LocalRepair).
func (n *Node) KubeletRestarts() int {
	if n.systemd == nil {
		return 0
	}
	return n.systemd.Restarts()
}

func (n *Node) stopSystemd() {
	if n.systemd != nil {
		_ = n.systemd.Close()
	}
}

func (n *Node) kubeletHealthy() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.kubeletUp
}

func (n *Node) setKubelet(up bool) {
	n.mu.Lock()
	n.kubeletUp = up
	n.mu.Unlock()
}

func (n *Node) agentRunning() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.agentUp
}

// HostRoot is the fake host root a real agent reads ("" for a simulated one).
func (n *Node) HostRoot() string { return n.hostRoot }

// setupHost lays out the node's host root: an EKS AL2 node (unit files, kubelet command
// line), calm memory, a working CNI.
func (n *Node) setupHost() error {
	if err := copyTree(filepath.Join(n.fleet.cfg.HostFixtures, hostOK), n.hostRoot); err != nil {
		return fmt.Errorf("fleet: host root of %s: %w", n.Name, err)
	}
	if err := n.writeMemory(false); err != nil {
		return err
	}
	return n.writeCNI(true)
}

func (n *Node) writeMemory(pressure bool) error {
	psi := "some avg10=0.00 avg60=0.00 avg300=0.00 total=1000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=500\n"
	avail := "6000000"
	if pressure {
		psi = "some avg10=85.00 avg60=80.00 avg300=60.00 total=900000000\nfull avg10=70.00 avg60=65.00 avg300=50.00 total=800000000\n"
		avail = "90000"
	}
	meminfo := "MemTotal:       8000000 kB\nMemFree:          50000 kB\nMemAvailable:   " + avail + " kB\nBuffers:          10000 kB\nCached:          100000 kB\n"
	if err := writeFile(filepath.Join(n.hostRoot, "proc/pressure/memory"), psi, 0o644); err != nil {
		return err
	}
	return writeFile(filepath.Join(n.hostRoot, "proc/meminfo"), meminfo, 0o644)
}

func (n *Node) writeCNI(ok bool) error {
	conf := filepath.Join(n.hostRoot, "etc/cni/net.d/10-fleet.conflist")
	if !ok {
		if err := os.Remove(conf); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("fleet: break CNI on %s: %w", n.Name, err)
		}
		return os.MkdirAll(filepath.Dir(conf), 0o755)
	}
	for _, p := range []string{"bridge", "portmap"} {
		if err := writeFile(filepath.Join(n.hostRoot, "opt/cni/bin", p), "#!/bin/sh\n", 0o755); err != nil {
			return err
		}
	}
	return writeFile(conf, `{"cniVersion":"1.0.0","name":"fleet","plugins":[{"type":"bridge"},{"type":"portmap","capabilities":{"portMappings":true}}]}`, 0o644)
}

// startAgent runs the real agent binary for the node.
func (n *Node) startAgent() error {
	c := n.fleet.cfg
	args := []string{"run",
		"--node-name", n.Name,
		"--namespace", c.AgentNamespace,
		"--pod-name", "nodevigil-agent-" + n.Name,
		"--kubeconfig", c.Kubeconfig,
		"--host-root", n.hostRoot,
		"--listen-address", "127.0.0.1:0",
		"--kubelet-healthz-url", "http://" + n.fleet.hzAddr + "/healthz/" + n.Name,
		"--owned-taints", StartupTaint,
		"--check-interval", c.CheckInterval.String(),
		"--lease-duration", c.AgentLeaseDuration.String(),
		"--lease-renew-interval", c.AgentRenewInterval.String(),
		"--condition-heartbeat", "1m",
		"--taint-stability-window", c.StabilityWindow.String(),
		"--log-format", "text",
		"--log-level", c.AgentLogLevel,
	}
	if n.systemd != nil {
		args = append(args, "--kubelet-repair=true")
	}
	if n.imds != "" {
		args = append(args, "--imds-endpoint", n.imds)
	}
	ch, err := n.fleet.startChild("agent "+n.Name, c.AgentBin, args)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.agent, n.agentUp = ch, true
	n.mu.Unlock()
	return nil
}

// stopAgent stops the node's agent: the real process (SIGKILL, as an OOM kill or a crash
// would), or the simulated heartbeat.
func (n *Node) stopAgent() {
	n.mu.Lock()
	a := n.agent
	n.agent, n.agentUp = nil, false
	n.mu.Unlock()
	if a != nil {
		a.kill()
	}
}

// simulateAgent renews the node's agent Lease while the agent is "up", and removes the startup
// taint once the stability window has passed with the kubelet up, as a real agent would.
func (n *Node) simulateAgent(ctx context.Context) {
	defer n.fleet.wg.Done()
	c := n.fleet.cfg
	leases := c.Client.CoordinationV1().Leases(c.AgentNamespace)
	dur := int32(c.AgentLeaseDuration / time.Second)
	holder := "nodevigil-agent-" + n.Name
	owner := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.uid}}
	taintGone := false
	var reported *bool // the kubelet health last written as KubeletHealthy, nil before the first write
	t := time.NewTicker(c.AgentRenewInterval)
	defer t.Stop()
	for {
		n.mu.Lock()
		up := n.agentUp
		n.mu.Unlock()
		if _, live := n.fleet.Node(n.Name); !live && time.Since(n.joined) > time.Second {
			return // retired
		}
		if up {
			now := metav1.NewMicroTime(time.Now())
			l, err := leases.Get(ctx, n.Name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				_, _ = leases.Create(ctx, &coordinationv1.Lease{
					ObjectMeta: metav1.ObjectMeta{Name: n.Name, Namespace: c.AgentNamespace,
						Labels: map[string]string{"nodevigil.io/node": n.Name}, OwnerReferences: owner},
					Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &dur, RenewTime: &now, AcquireTime: &now},
				}, metav1.CreateOptions{})
			case err == nil:
				l.Spec.RenewTime = &now
				_, _ = leases.Update(ctx, l, metav1.UpdateOptions{})
			}
			if kubelet := n.kubeletHealthy(); reported == nil || *reported != kubelet {
				if err := n.reportConditions(ctx, kubelet); err == nil {
					reported = &kubelet
				}
			}
			if !taintGone && time.Since(n.joined) >= c.StabilityWindow && n.kubeletHealthy() {
				taintGone = n.removeStartupTaint(ctx) == nil
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reportConditions writes the agent's own Node conditions as a real agent on a healthy host
// would, with KubeletHealthy following the simulated kubelet: memory and CNI have nothing to
// read on a simulated node, so they are reported healthy with a message that says so. Written
// only on change, like the real agent, so `kubectl nodevigil status` and the remediator see the
// same kinds of conditions on every node of the fleet.
func (n *Node) reportConditions(ctx context.Context, kubeletHealthy bool) error {
	now := metav1.NewTime(time.Now())
	cond := func(t corev1.NodeConditionType, ok bool, reason, msg string) corev1.NodeCondition {
		s := corev1.ConditionTrue
		if !ok {
			s = corev1.ConditionFalse
		}
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	kubelet := cond(conditions.TypeKubeletHealthy, true, kubeletcheck.ReasonKubeletHealthy, "simulated agent: the simulated kubelet answers /healthz")
	if !kubeletHealthy {
		kubelet = cond(conditions.TypeKubeletHealthy, false, kubeletcheck.ReasonKubeletNotRunning,
			"simulated agent: the simulated kubelet is dead (fault injected); no process, /healthz refuses connections")
	}
	conds := []corev1.NodeCondition{
		cond(conditions.TypeMemoryHealthy, true, memory.ReasonNoMemoryPressure, "simulated agent: no host to read; reported healthy"),
		kubelet,
		cond(conditions.TypeNetworkingReady, true, cni.ReasonCNIReady, "simulated agent: no host to read; reported ready"),
	}
	body, err := conditions.BuildPatch(conds)
	if err != nil {
		return err
	}
	_, err = n.fleet.cfg.Client.CoreV1().Nodes().Patch(ctx, n.Name, conditions.PatchType, body, metav1.PatchOptions{}, "status")
	return err
}

func (n *Node) removeStartupTaint(ctx context.Context) error {
	nodes := n.fleet.cfg.Client.CoreV1().Nodes()
	obj, err := nodes.Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if !ready(obj) {
		return fmt.Errorf("not ready yet")
	}
	var kept []corev1.Taint
	for _, t := range obj.Spec.Taints {
		if t.Key != StartupTaint {
			kept = append(kept, t)
		}
	}
	if len(kept) == len(obj.Spec.Taints) {
		return nil
	}
	obj.Spec.Taints = kept
	_, err = nodes.Update(ctx, obj, metav1.UpdateOptions{})
	return err
}

func ready(obj *corev1.Node) bool {
	for _, c := range obj.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// child is a process whose output is copied line by line, prefixed with its name (or handed
// to Config.Writer).
type child struct {
	name   string
	cmd    *exec.Cmd
	exited chan error
	done   chan struct{}
}

func (f *Fleet) startChild(name, path string, args []string) (*child, error) {
	if f.cfg.Writer != nil {
		w := f.cfg.Writer(name)
		cmd := exec.Command(path, args...)
		cmd.Stdout, cmd.Stderr = w, w
		if err := testbin.StartTied(cmd); err != nil {
			return nil, fmt.Errorf("fleet: start %s: %w", name, err)
		}
		c := &child{name: name, cmd: cmd, exited: make(chan error, 1), done: make(chan struct{})}
		go func() {
			err := cmd.Wait()
			_ = w.Close()
			c.exited <- err
			close(c.done)
		}()
		return c, nil
	}
	out := f.cfg.Output
	cmd := exec.Command(path, args...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := testbin.StartTied(cmd); err != nil {
		return nil, fmt.Errorf("fleet: start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, exited: make(chan error, 1), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			fmt.Fprintf(out, "%-24s | %s\n", name, sc.Text())
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		err := cmd.Wait()
		pw.Close()
		c.exited <- err
		close(c.done)
	}()
	return c, nil
}

func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	<-c.done
}

func (c *child) stop(timeout time.Duration) {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(timeout):
		c.kill()
	}
}

func writeFile(path, data string, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), mode); err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	return nil
}

// copyTree copies src over dst (files, directories and symlinks), replacing what dst holds at
// the same paths.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(to, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			_ = os.Remove(to)
			return os.Symlink(target, to)
		default:
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return writeFile(to, string(data), 0o644)
		}
	})
}
