package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodevigil/nodevigil/remediation/decide"
)

const (
	poolLabel        = "nodevigil.bench/pool"
	poolName         = "general"
	zoneLabel        = "topology.kubernetes.io/zone"
	agentNodeLabel   = "nodevigil.io/node"
	kubeletLeaseNS   = "kube-node-lease"
	clusterTag       = "kubernetes.io/cluster/bench"
	firstInstanceHex = 0x0a11ce0000000000
)

var zones = []string{"us-east-1a", "us-east-1b", "us-east-1c"}

// simNode is one simulated node: its Node object, its EC2 instance and the two Leases a kubelet
// and an agent would renew for it.
type simNode struct {
	idx        int
	name       string
	zone       string
	instanceID string
	// silenced nodes have short Leases renewed by their own goroutine until silence is called.
	silenced bool
	batch    int
	kubelet  *leaseSlot
	agent    *leaseSlot

	mu      sync.Mutex // serialises the fast renewer with silence
	stopped bool
}

// expiry is when the remediator judges the later of the node's two Leases stale, from what
// the apiserver stored: its renewTime (taken just before the renewal was sent, so the
// remediator saw the change a little later) plus the duration and the grace
// (decide.StaleAfter). The remediator judges by when it saw a Lease change, not by renewTime;
// on one machine the two clocks are the same, and measuring from renewTime counts the
// renewal's round trip and the watch delivery as latency.
func (n *simNode) expiry() time.Time {
	k, a := n.kubelet.staleAt(), n.agent.staleAt()
	if a.After(k) {
		return a
	}
	return k
}

// leaseSlot is the generator's copy of one Lease: updates are sent from it, so a renewal is one
// request (an Update carrying the last known resourceVersion) instead of a Get and an Update.
type leaseSlot struct {
	mu  sync.Mutex
	obj *coordinationv1.Lease
}

func (s *leaseSlot) expiry() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.obj == nil || s.obj.Spec.RenewTime == nil || s.obj.Spec.LeaseDurationSeconds == nil {
		return time.Time{}
	}
	return s.obj.Spec.RenewTime.Add(time.Duration(*s.obj.Spec.LeaseDurationSeconds) * time.Second)
}

// staleAt is when the remediator judges the Lease stale if it is not renewed again.
func (s *leaseSlot) staleAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.obj == nil || s.obj.Spec.RenewTime == nil || s.obj.Spec.LeaseDurationSeconds == nil {
		return time.Time{}
	}
	return s.obj.Spec.RenewTime.Add(decide.StaleAfter(time.Duration(*s.obj.Spec.LeaseDurationSeconds) * time.Second))
}

// fleet creates the simulated nodes and keeps their Leases fresh.
type fleet struct {
	client  kubernetes.Interface
	agentNS string
	images  int
	nodes   []*simNode

	bulkDur, bulkRenew time.Duration
	fastDur, fastRenew time.Duration

	renewals      atomic.Int64
	renewFailures atomic.Int64
	staleRenewals atomic.Int64 // bulk renewals that found their Lease already expired
	maxAge        atomic.Int64 // longest time between two renewals of a bulk Lease, ns
	maxBacklog    atomic.Int64 // most bulk renewals due but not yet handed to a worker
}

func newFleet(client kubernetes.Interface, agentNS string, n, silence, batches, images int) *fleet {
	f := &fleet{client: client, agentNS: agentNS, images: images}
	chosen := map[int]int{} // index → batch
	step := n / silence
	for j := range silence {
		idx := j * step
		// Zone-spread: the j-th silenced node lives in zone j%3.
		idx += ((j%len(zones) - idx%len(zones)) + len(zones)) % len(zones)
		chosen[idx] = j % batches
	}
	for i := range n {
		node := &simNode{
			idx:        i,
			name:       fmt.Sprintf("ip-10-%d-%d-%d.ec2.internal", 16+i/65536, (i/256)%256, i%256),
			zone:       zones[i%len(zones)],
			instanceID: fmt.Sprintf("i-%017x", firstInstanceHex+i),
			kubelet:    &leaseSlot{},
			agent:      &leaseSlot{},
		}
		if b, ok := chosen[i]; ok {
			node.silenced, node.batch = true, b
		}
		f.nodes = append(f.nodes, node)
	}
	return f
}

func (f *fleet) silenced() []*simNode {
	var out []*simNode
	for _, n := range f.nodes {
		if n.silenced {
			out = append(out, n)
		}
	}
	return out
}

// nodeObject is a Node as a kubelet on EC2 would register it, status included: the remediator's
// informer transform strips the bulky parts, so they have to be there to count.
func (f *fleet) nodeObject(n *simNode) *corev1.Node {
	now := metav1.Now()
	ip := fmt.Sprintf("10.%d.%d.%d", 16+n.idx/65536, (n.idx/256)%256, n.idx%256)
	images := make([]corev1.ContainerImage, 0, f.images)
	for i := range f.images {
		digest := fmt.Sprintf("%064x", uint64(n.idx)*1_000_003+uint64(i)*7919)
		images = append(images, corev1.ContainerImage{
			Names: []string{
				fmt.Sprintf("123456789012.dkr.ecr.us-east-1.amazonaws.com/team-%d/service-%d@sha256:%s", i%7, i, digest),
				fmt.Sprintf("123456789012.dkr.ecr.us-east-1.amazonaws.com/team-%d/service-%d:v1.%d.%d", i%7, i, i%13, n.idx%17),
			},
			SizeBytes: int64(50_000_000 + i*3_100_000),
		})
	}
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: n.name,
			Labels: map[string]string{
				poolLabel:                          poolName,
				zoneLabel:                          n.zone,
				"topology.kubernetes.io/region":    "us-east-1",
				"kubernetes.io/hostname":           n.name,
				"kubernetes.io/os":                 "linux",
				"kubernetes.io/arch":               "amd64",
				"node.kubernetes.io/instance-type": "m6i.xlarge",
			},
			Annotations: map[string]string{
				"node.alpha.kubernetes.io/ttl":                           "0",
				"volumes.kubernetes.io/controller-managed-attach-detach": "true",
			},
		},
		Spec: corev1.NodeSpec{ProviderID: "aws:///" + n.zone + "/" + n.instanceID, PodCIDR: ""},
		Status: corev1.NodeStatus{
			Capacity: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("16005076Ki"),
				corev1.ResourcePods: resource.MustParse("58"), corev1.ResourceEphemeralStorage: resource.MustParse("104845292Ki"),
			},
			Allocatable: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("3920m"), corev1.ResourceMemory: resource.MustParse("15317972Ki"),
				corev1.ResourcePods: resource.MustParse("58"), corev1.ResourceEphemeralStorage: resource.MustParse("95551679124"),
			},
			Conditions: []corev1.NodeCondition{
				cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
				cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
				cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
				cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "kubelet is posting ready status"),
			},
			Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: ip},
				{Type: corev1.NodeHostName, Address: n.name},
				{Type: corev1.NodeInternalDNS, Address: n.name},
			},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}},
			NodeInfo: corev1.NodeSystemInfo{
				MachineID:               fmt.Sprintf("ec2%029x", n.idx),
				SystemUUID:              fmt.Sprintf("ec2%05x-0000-0000-0000-%012x", n.idx%0xfffff, n.idx),
				BootID:                  fmt.Sprintf("%08x-1111-2222-3333-%012x", n.idx, n.idx),
				KernelVersion:           "6.1.112-124.190.amzn2023.x86_64",
				OSImage:                 "Amazon Linux 2023.6.20241010",
				ContainerRuntimeVersion: "containerd://1.7.22",
				KubeletVersion:          "v1.34.2-eks-7f9249a",
				OperatingSystem:         "linux",
				Architecture:            "amd64",
			},
			Images: images,
		},
	}
}

func (f *fleet) leaseObject(n *simNode, ns string, owner metav1.OwnerReference, now time.Time) *coordinationv1.Lease {
	dur := int32(f.bulkDur / time.Second)
	if n.silenced {
		dur = int32(f.fastDur / time.Second)
	}
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: n.name, Namespace: ns, OwnerReferences: []metav1.OwnerReference{owner}},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: &n.name, LeaseDurationSeconds: &dur,
			AcquireTime: &metav1.MicroTime{Time: now}, RenewTime: &metav1.MicroTime{Time: now},
		},
	}
	if ns != kubeletLeaseNS {
		l.Labels = map[string]string{agentNodeLabel: n.name}
	}
	return l
}

// retry runs op until it succeeds, a few times with backoff: a loaded apiserver on two shared
// cores answers the odd 429 or timeout during the bulk load.
func retry(ctx context.Context, what string, op func() error) error {
	var err error
	delay := 200 * time.Millisecond
	for range 6 {
		if err = op(); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay *= 2
	}
	return fmt.Errorf("%s: %w", what, err)
}

// load creates every Node and its two Leases with a bounded pool of creators.
func (f *fleet) load(ctx context.Context, creators int, progress func(done int)) error {
	work := make(chan *simNode)
	var done atomic.Int64
	errs := make(chan error, creators)
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range creators {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range work {
				if err := f.create(ctx, n); err != nil {
					errs <- err
					cancel()
					return
				}
				if d := done.Add(1); d%1000 == 0 {
					progress(int(d))
				}
			}
		}()
	}
feed:
	for _, n := range f.nodes {
		select {
		case work <- n:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return ctx.Err()
	}
}

func (f *fleet) create(ctx context.Context, n *simNode) error {
	nodes := f.client.CoreV1().Nodes()
	var created *corev1.Node
	err := retry(ctx, "create node "+n.name, func() error {
		var err error
		created, err = nodes.Create(ctx, f.nodeObject(n), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			created, err = nodes.Get(ctx, n.name, metav1.GetOptions{})
		}
		return err
	})
	if err != nil {
		return err
	}
	owner := metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: created.Name, UID: created.UID}
	for _, l := range []struct {
		ns   string
		slot *leaseSlot
	}{{kubeletLeaseNS, n.kubelet}, {f.agentNS, n.agent}} {
		leases := f.client.CoordinationV1().Leases(l.ns)
		err := retry(ctx, "create lease "+l.ns+"/"+n.name, func() error {
			obj, err := leases.Create(ctx, f.leaseObject(n, l.ns, owner, time.Now()), metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				obj, err = leases.Get(ctx, n.name, metav1.GetOptions{})
			}
			if err == nil {
				l.slot.obj = obj
			}
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// renew writes RenewTime=at into the Lease. On a conflict it re-reads the Lease and tries again.
func (f *fleet) renew(ctx context.Context, s *leaseSlot, at time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	leases := f.client.CoordinationV1().Leases(s.obj.Namespace)
	l := s.obj.DeepCopy()
	l.Spec.RenewTime = &metav1.MicroTime{Time: at}
	up, err := leases.Update(ctx, l, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		var cur *coordinationv1.Lease
		if cur, err = leases.Get(ctx, l.Name, metav1.GetOptions{}); err == nil {
			cur.Spec.RenewTime = &metav1.MicroTime{Time: at}
			up, err = leases.Update(ctx, cur, metav1.UpdateOptions{})
		}
	}
	f.renewals.Add(1)
	if err != nil {
		f.renewFailures.Add(1)
		return err
	}
	s.obj = up
	return nil
}

// runBulk renews the Leases of the nodes that are never silenced, each once per bulkRenew,
// spread evenly over the interval so the write rate is flat: a wheel walks the Leases in
// creation order and hands the ones due to a pool of workers.
func (f *fleet) runBulk(ctx context.Context, workers int) {
	var slots []*leaseSlot
	for _, n := range f.nodes {
		if !n.silenced {
			slots = append(slots, n.kubelet, n.agent)
		}
	}
	if len(slots) == 0 {
		return
	}
	work := make(chan *leaseSlot, 4*workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range work {
				now := time.Now()
				prev := s.expiry().Add(-f.bulkDur)
				storeMax(&f.maxAge, int64(now.Sub(prev)))
				if now.After(prev.Add(f.bulkDur)) {
					f.staleRenewals.Add(1)
				}
				_ = f.renew(ctx, s, now)
			}
		}()
	}
	defer func() {
		close(work)
		wg.Wait()
	}()
	start := time.Now()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	pos := 0
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			due := int(float64(len(slots)) * now.Sub(start).Seconds() / f.bulkRenew.Seconds())
			storeMax(&f.maxBacklog, int64(due-pos))
			for ; pos < due; pos++ {
				select {
				case work <- slots[pos%len(slots)]:
				case <-ctx.Done():
					return
				}
			}
		}
	}
}

// runFast renews both Leases of every silenced node every fastRenew, with one RenewTime for
// the two so that they expire together, until the node is silenced.
func (f *fleet) runFast(ctx context.Context) {
	var wg sync.WaitGroup
	for _, n := range f.silenced() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(f.fastRenew)
			defer t.Stop()
			for {
				n.mu.Lock()
				if n.stopped {
					n.mu.Unlock()
					return
				}
				now := time.Now()
				_ = f.renew(ctx, n.kubelet, now)
				_ = f.renew(ctx, n.agent, now)
				n.mu.Unlock()
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		}()
	}
	wg.Wait()
}

// silence stops the node's heartbeats: a last renewal of both Leases with the same RenewTime,
// then none. It returns when both Leases expire, from what the apiserver stored.
func (f *fleet) silence(ctx context.Context, n *simNode) (time.Time, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.stopped = true
	now := time.Now()
	var err error
	for _, s := range []*leaseSlot{n.kubelet, n.agent} {
		if e := retry(ctx, "last renewal of "+n.name, func() error { return f.renew(ctx, s, now) }); e != nil {
			err = e
		}
	}
	// Whatever happened, the Leases expire at the last RenewTime the apiserver accepted.
	return n.expiry(), err
}
