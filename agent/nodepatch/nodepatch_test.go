package nodepatch

import (
	"context"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// recorder is a NodeClient that records the patch it is sent.
type recorder struct {
	name string
	pt   types.PatchType
	body string
	sub  []string
}

func (r *recorder) Get(context.Context, string, metav1.GetOptions) (*v1.Node, error) {
	return &v1.Node{}, nil
}

func (r *recorder) Patch(_ context.Context, name string, pt types.PatchType, data []byte, _ metav1.PatchOptions, sub ...string) (*v1.Node, error) {
	r.name, r.pt, r.body, r.sub = name, pt, string(data), sub
	return &v1.Node{}, nil
}

func TestPatches(t *testing.T) {
	at := metav1.Unix(1700000000, 0).Rfc3339Copy()
	for _, tc := range []struct {
		name  string
		build func() (Patch, error)
		pt    types.PatchType
		body  string
		sub   []string
	}{
		{"conditions: status subresource, strategic merge by type",
			func() (Patch, error) {
				return Conditions([]v1.NodeCondition{{Type: "KubeletHealthy", Status: v1.ConditionTrue, Reason: "KubeletHealthy", LastHeartbeatTime: at, LastTransitionTime: at}})
			},
			types.StrategicMergePatchType,
			`{"status":{"conditions":[{"type":"KubeletHealthy","status":"True","lastHeartbeatTime":"2023-11-14T22:13:20Z","lastTransitionTime":"2023-11-14T22:13:20Z","reason":"KubeletHealthy"}]}}`,
			[]string{"status"}},
		{"taints: merge patch guarded by resourceVersion",
			func() (Patch, error) {
				return Taints("42", []v1.Taint{{Key: "example.com/other", Effect: v1.TaintEffectNoSchedule}})
			},
			types.MergePatchType,
			`{"metadata":{"resourceVersion":"42"},"spec":{"taints":[{"key":"example.com/other","effect":"NoSchedule"}]}}`,
			nil},
		{"taints: nil clears the list (null would delete the field, [] sets it empty)",
			func() (Patch, error) { return Taints("7", nil) },
			types.MergePatchType,
			`{"metadata":{"resourceVersion":"7"},"spec":{"taints":[]}}`,
			nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := tc.build()
			if err != nil {
				t.Fatal(err)
			}
			var r recorder
			if _, err := p.Apply(context.Background(), &r, "node-a"); err != nil {
				t.Fatal(err)
			}
			if r.name != "node-a" || r.pt != tc.pt || r.body != tc.body || !slices.Equal(r.sub, tc.sub) {
				t.Errorf("sent %s %s %s %v\nwant %s %s %v", r.name, r.pt, r.body, r.sub, tc.pt, tc.body, tc.sub)
			}
		})
	}
}
