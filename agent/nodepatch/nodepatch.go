// Package nodepatch is how the agent writes its own Node: the one NodeClient interface through
// which the agent, its condition manager and its taint manager read and patch the Node, and
// the patches they send.
//
// The interface lives here because this package consumes it (Patch.Apply) and both managers
// and the agent import this package; declaring it in each consumer had left three copies that
// could drift. It is not taken from client-go so the binary can pass a client that links only
// the API groups the agent uses (package kubeclient); client-go's typed
// clientset.CoreV1().Nodes() satisfies it as well.
//
// Both patches carry only what the agent owns, so nothing else on the Node is overwritten:
//
//   - Conditions: a strategic-merge patch of nodes/status. Node conditions merge by type, so
//     the kubelet's conditions (Ready, MemoryPressure, ...) are left as they are.
//   - Taints: a JSON merge patch of spec.taints guarded by metadata.resourceVersion. Taints
//     have no merge key, so the whole list is sent; the resourceVersion makes the API server
//     refuse it with a Conflict if someone changed the Node since it was read, so a taint added
//     concurrently is never lost. A patch (rather than an Update) also keeps fields this client
//     version does not know.
package nodepatch

import (
	"context"
	"encoding/json"
	"fmt"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// NodeClient reads and patches Nodes: the subset of client-go's typed NodeInterface the agent
// uses.
type NodeClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*v1.Node, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*v1.Node, error)
}

// Patch is one write to a Node: its type, body and subresource ("" for the Node itself).
type Patch struct {
	Type        types.PatchType
	Body        []byte
	Subresource string
}

// Conditions returns the strategic-merge patch of nodes/status that sets exactly conds:
// {"status":{"conditions":[...]}}. Which condition types may be written is the caller's rule
// (package conditions refuses types the agent does not own).
func Conditions(conds []v1.NodeCondition) (Patch, error) {
	var body struct {
		Status struct {
			Conditions []v1.NodeCondition `json:"conditions"`
		} `json:"status"`
	}
	body.Status.Conditions = conds
	return encode(types.StrategicMergePatchType, "status", body)
}

// Taints returns the JSON merge patch that sets spec.taints to taints (an empty list clears
// them), guarded by resourceVersion.
func Taints(resourceVersion string, taints []v1.Taint) (Patch, error) {
	if taints == nil {
		taints = []v1.Taint{}
	}
	var body struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Spec struct {
			Taints []v1.Taint `json:"taints"`
		} `json:"spec"`
	}
	body.Metadata.ResourceVersion = resourceVersion
	body.Spec.Taints = taints
	return encode(types.MergePatchType, "", body)
}

func encode(pt types.PatchType, subresource string, body any) (Patch, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return Patch{}, fmt.Errorf("nodepatch: encode %s patch: %w", pt, err)
	}
	return Patch{Type: pt, Body: b, Subresource: subresource}, nil
}

// Apply sends the patch for the Node name.
func (p Patch) Apply(ctx context.Context, c NodeClient, name string) (*v1.Node, error) {
	var sub []string
	if p.Subresource != "" {
		sub = []string{p.Subresource}
	}
	return c.Patch(ctx, name, p.Type, p.Body, metav1.PatchOptions{}, sub...)
}
