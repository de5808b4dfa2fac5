package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

// Fault is one way a node (or a zone) breaks.
type Fault struct {
	// Name is what `fleetctl fault NAME TARGET` takes.
	Name string
	// Zone says the target is a zone, not a node.
	Zone bool
	// RealOnly says the fault needs a real agent reading a host root.
	RealOnly bool
	// Does says what the fault does to the node.
	Does string
}

// Faults lists every fault the fleet can inject.
var Faults = []Fault{
	{Name: "kubelet-oom", Does: "the kubelet is OOM-killed and systemd gives up on it: /healthz fails, its Lease and status stop; the agent lives (and, on real-agent nodes, restarts it)"},
	{Name: "kubelet-dead", Does: "the kubelet is OOM-killed and dies again at every restart: local repair cannot help; the agent lives"},
	{Name: "node-silent", Does: "the whole machine goes silent: kubelet and agent stop at once"},
	{Name: "agent-crash", Does: "only the agent dies; the kubelet keeps posting status"},
	{Name: "cni-break", RealOnly: true, Does: "the CNI conflist disappears from /etc/cni/net.d"},
	{Name: "memory-pressure", RealOnly: true, Does: "memory PSI climbs to 80% and MemAvailable to 90 MB"},
	{Name: "bad-taint", RealOnly: true, Does: "the bootstrap drop-in mis-quotes --register-with-taints (S004)"},
	{Name: "zone-dark", Zone: true, Does: "every node of the zone goes silent at once"},
	{Name: "spot-notice", RealOnly: true, Does: "AWS sends a spot interruption notice (instance-action terminate, 2 minutes) and reclaims the instance at its deadline"},
	{Name: "maintenance", Does: "AWS schedules a system-reboot of the instance 10 minutes out (DescribeInstanceStatus and the instance metadata)"},
}

// Interruption timings of the fleet's AWS-initiated faults.
const (
	// DefaultSpotNoticeWarning is how long AWS gives between a spot notice and the reclaim.
	DefaultSpotNoticeWarning = 2 * time.Minute
	// MaintenanceLead is how far out the maintenance fault schedules its reboot: inside the
	// fleet policies' leadTime, so the general pool acts at once.
	MaintenanceLead = 10 * time.Minute
)

// LookupFault returns the fault called name.
func LookupFault(name string) (Fault, bool) {
	for _, f := range Faults {
		if f.Name == name {
			return f, true
		}
	}
	return Fault{}, false
}

// Inject breaks target (a node name, or a zone for zone-dark) with the fault called kind.
func (f *Fleet) Inject(ctx context.Context, kind, target string) error {
	fault, ok := LookupFault(kind)
	if !ok {
		return fmt.Errorf("unknown fault %q; one of: %s", kind, strings.Join(faultNames(), ", "))
	}
	if fault.Zone {
		nodes := f.zoneNodes(target)
		if len(nodes) == 0 {
			return fmt.Errorf("zone %q has no nodes; zones: %s", target, strings.Join(f.cfg.Zones, ", "))
		}
		for _, n := range nodes {
			if err := f.silence(ctx, n); err != nil {
				return err
			}
			f.record(ctx, n, EventFaultInjected, kind+" "+target+": "+fault.Does)
		}
		f.cfg.Logger.Info("fault injected", "fault", kind, "zone", target, "nodes", len(nodes))
		return nil
	}
	n, ok := f.Node(target)
	if !ok {
		return fmt.Errorf("no live node %q; nodes: %s", target, strings.Join(f.nodeNames(false), ", "))
	}
	if fault.RealOnly && !n.Real {
		return fmt.Errorf("node %s has a simulated agent, which reads no host; fault %s needs one of the real-agent nodes: %s",
			n.Name, kind, strings.Join(f.nodeNames(true), ", "))
	}
	var err error
	switch kind {
	case "kubelet-oom", "kubelet-dead":
		n.mu.Lock()
		n.broken = kind == "kubelet-dead"
		n.mu.Unlock()
		n.setKubelet(false)
		err = f.setKwok(ctx, n, false)
		if n.systemd != nil {
			n.systemd.Fail("oom-kill")
		}
	case "node-silent":
		err = f.silence(ctx, n)
	case "agent-crash":
		n.stopAgent()
	case "cni-break":
		err = n.writeCNI(false)
	case "memory-pressure":
		err = n.writeMemory(true)
	case "bad-taint":
		err = copyTree(filepath.Join(f.cfg.HostFixtures, hostBadTaint), n.hostRoot)
	case "spot-notice":
		err = f.spotNotice(n)
	case "maintenance":
		err = f.scheduleMaintenance(n)
	}
	if err != nil {
		return err
	}
	f.record(ctx, n, EventFaultInjected, kind+": "+fault.Does)
	f.cfg.Logger.Info("fault injected", "fault", kind, "node", n.Name)
	return nil
}

func (f *Fleet) silence(ctx context.Context, n *Node) error {
	n.setKubelet(false)
	n.stopAgent()
	return f.setKwok(ctx, n, false)
}

// Heal undoes every fault on target (a node or a zone): kubelet back, agent restarted, host
// root healthy again, scheduled maintenance canceled. A spot notice cannot be undone: AWS
// never withdraws one.
func (f *Fleet) Heal(ctx context.Context, target string) error {
	nodes := f.zoneNodes(target)
	if n, ok := f.Node(target); ok {
		nodes = []*Node{n}
	}
	if len(nodes) == 0 {
		return fmt.Errorf("no live node or zone %q; nodes: %s", target, strings.Join(f.nodeNames(false), ", "))
	}
	for _, n := range nodes {
		n.mu.Lock()
		n.broken = false
		n.mu.Unlock()
		if n.systemd != nil {
			n.systemd.Running()
		}
		n.setKubelet(true)
		if err := f.setKwok(ctx, n, true); err != nil {
			return err
		}
		if n.Real {
			if err := n.setupHost(); err != nil {
				return err
			}
			if !n.agentRunning() {
				if err := n.startAgent(); err != nil {
					return err
				}
			}
		} else {
			n.mu.Lock()
			n.agentUp = true
			n.mu.Unlock()
		}
		if err := f.cancelMaintenance(n); err != nil {
			return err
		}
		f.cfg.Logger.Info("node healed", "node", n.Name)
	}
	return nil
}

func (f *Fleet) zoneNodes(zone string) []*Node {
	var out []*Node
	for _, n := range f.Nodes() {
		if n.Zone == zone {
			out = append(out, n)
		}
	}
	return out
}

func (f *Fleet) nodeNames(realOnly bool) []string {
	var out []string
	for _, n := range f.Nodes() {
		if !realOnly || n.Real {
			out = append(out, n.Name)
		}
	}
	sort.Strings(out)
	return out
}

func faultNames() []string {
	out := make([]string, len(Faults))
	for i, f := range Faults {
		out[i] = f.Name
	}
	return out
}

// spotNotice posts a spot interruption notice in n's metadata and has AWS reclaim the instance
// at its deadline, whatever nodevigil did in between (a notice is never withdrawn).
func (f *Fleet) spotNotice(n *Node) error {
	if !n.spec.Spot {
		return fmt.Errorf("node %s is in pool %s, whose instances are on-demand: AWS sends spot notices to spot instances only (pools with spot instances: %s)",
			n.Name, n.Pool, strings.Join(f.spotPools(), ", "))
	}
	deadline := time.Now().Add(f.cfg.SpotNoticeWarning)
	f.cfg.EC2.SetSpotInstanceAction(n.InstanceID, "terminate", deadline)
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		select {
		case <-f.ctx.Done():
			return
		case <-t.C:
		}
		if err := f.cfg.EC2.Reclaim(n.InstanceID); err != nil {
			f.cfg.Logger.Warn("spot reclaim failed", "node", n.Name, "instance_id", n.InstanceID, "err", err)
			return
		}
		f.record(f.ctx, n, EventInstanceReclaimed, "AWS reclaimed spot instance "+n.InstanceID+" at the notice's deadline")
		f.cfg.Logger.Info("spot instance reclaimed by AWS", "node", n.Name, "instance_id", n.InstanceID)
	}()
	return nil
}

func (f *Fleet) spotPools() []string {
	var out []string
	for _, p := range f.cfg.Pools {
		if p.Spot {
			out = append(out, p.Name)
		}
	}
	if len(out) == 0 {
		return []string{"none"}
	}
	return out
}

// scheduleMaintenance schedules a system reboot of n's instance MaintenanceLead from now, as
// EC2 does: listed by DescribeInstanceStatus and in the instance's metadata alike. Heal
// cancels it.
func (f *Fleet) scheduleMaintenance(n *Node) error {
	id := make([]byte, 9)
	if _, err := rand.Read(id); err != nil {
		return fmt.Errorf("event id: %w", err)
	}
	notBefore := time.Now().Add(MaintenanceLead).Truncate(time.Second)
	ev := ec2emu.ScheduledEvent{
		ID:   "instance-event-" + hex.EncodeToString(id)[:17],
		Code: ec2emu.EventSystemReboot, Description: "scheduled reboot",
		NotBefore: notBefore, NotAfter: notBefore.Add(2 * time.Hour),
	}
	if err := f.cfg.EC2.AddScheduledEvent(n.InstanceID, ev); err != nil {
		return fmt.Errorf("schedule maintenance of %s: %w", n.Name, err)
	}
	return nil
}

// cancelMaintenance cancels n's active scheduled events, as AWS does when maintenance is
// called off or done early.
func (f *Fleet) cancelMaintenance(n *Node) error {
	for _, ev := range f.cfg.EC2.ScheduledEvents(n.InstanceID) {
		if ev.State != "" && ev.State != ec2emu.EventStateActive {
			continue
		}
		if err := f.cfg.EC2.SetScheduledEventState(n.InstanceID, ev.ID, ec2emu.EventStateCanceled); err != nil {
			return fmt.Errorf("cancel maintenance of %s: %w", n.Name, err)
		}
	}
	return nil
}
