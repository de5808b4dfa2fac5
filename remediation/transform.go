package remediation

import (
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
)

// annotationPrefix is the prefix of the annotations the remediator reads on Nodes.
const annotationPrefix = "nodevigil.io/"

// stripNode is the Node informer's transform. It drops what the remediator never reads so the
// cache stays small at 10,000 nodes: managed fields, the image list (often the largest part of
// a Node), attached volumes, addresses, capacities, system info and every annotation that is
// not nodevigil's. Labels, taints, providerID, unschedulable, conditions and the boot ID stay.
//
// Because cached Nodes are incomplete, the controller never Updates a Node from the cache: it
// only sends merge patches of the fields it owns, guarded by the resourceVersion.
func stripNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	n.ManagedFields = nil
	for k := range n.Annotations {
		if !strings.HasPrefix(k, annotationPrefix) {
			delete(n.Annotations, k)
		}
	}
	n.Status.Images = nil
	n.Status.VolumesAttached = nil
	n.Status.VolumesInUse = nil
	n.Status.Addresses = nil
	n.Status.Capacity = nil
	n.Status.Allocatable = nil
	// Only the boot ID of the system info is kept: it tells a reboot for an AWS event
	// (interruptions_act.go), about 40 bytes a node.
	n.Status.NodeInfo = corev1.NodeSystemInfo{BootID: n.Status.NodeInfo.BootID}
	n.Status.DaemonEndpoints = corev1.NodeDaemonEndpoints{}
	n.Status.Config = nil
	n.Status.RuntimeHandlers = nil
	n.Status.Features = nil
	return n, nil
}

// stripLease is the Lease informers' transform: only the spec and identity are read.
func stripLease(obj any) (any, error) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return obj, nil
	}
	l.ManagedFields = nil
	l.Annotations = nil
	l.OwnerReferences = nil
	return l, nil
}
