package install_test

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
)

// TestInstallManifestAppliesTwice applies install.yaml with server-side apply (as
// `kubectl apply --server-side -f install.yaml` does) and then again: the second apply must
// succeed and change nothing, so re-running an install is safe.
func TestInstallManifestAppliesTwice(t *testing.T) {
	ctx := t.Context()
	objs := manifestObjects(t)
	a, err := newApplier(cp.Config())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.apply(ctx, objs); err != nil {
		t.Fatalf("first apply: %v", err)
	}
	// Controllers write status after an apply (here the admission policy status controller's
	// type check); wait for that, then take the state the second apply must leave unchanged.
	first := make([]*unstructured.Unstructured, len(objs))
	for i, o := range objs {
		ri, err := a.resource(o)
		if err != nil {
			t.Fatal(err)
		}
		err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			got, err := ri.Get(ctx, o.GetName(), metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			first[i] = got
			if o.GetKind() != "ValidatingAdmissionPolicy" {
				return true, nil
			}
			observed, _, _ := unstructured.NestedInt64(got.Object, "status", "observedGeneration")
			return observed == got.GetGeneration(), nil
		})
		if err != nil {
			t.Fatalf("%s did not settle after the first apply: %v", describe(o), err)
		}
	}
	second, err := a.apply(ctx, objs)
	if err != nil {
		t.Fatalf("second apply: %v", err)
	}
	if len(second) != len(objs) {
		t.Fatalf("second apply returned %d objects, want %d", len(second), len(objs))
	}
	for i := range objs {
		if first[i].GetUID() != second[i].GetUID() {
			t.Errorf("%s was re-created by the second apply (uid %s → %s)", describe(objs[i]), first[i].GetUID(), second[i].GetUID())
		}
		if objs[i].GetKind() == "ValidatingAdmissionPolicy" {
			// The admission policy status controller may write status (type checking) again
			// after observedGeneration caught up, which moves resourceVersion with nothing of
			// ours changed. A change by apply shows in the generation (spec) or the metadata.
			if first[i].GetGeneration() != second[i].GetGeneration() ||
				!equality.Semantic.DeepEqual(first[i].GetLabels(), second[i].GetLabels()) ||
				!equality.Semantic.DeepEqual(first[i].GetAnnotations(), second[i].GetAnnotations()) {
				t.Errorf("%s changed on the second apply (generation %d → %d, or its labels or annotations): the manifest is not a fixed point of apply",
					describe(objs[i]), first[i].GetGeneration(), second[i].GetGeneration())
			}
			continue
		}
		if first[i].GetResourceVersion() != second[i].GetResourceVersion() {
			t.Errorf("%s changed on the second apply (resourceVersion %s → %s): the manifest is not a fixed point of apply",
				describe(objs[i]), first[i].GetResourceVersion(), second[i].GetResourceVersion())
		}
	}

	// Every kind the install promises is in the manifest (a chart change that drops one, e.g.
	// the admission policy, must fail here rather than pass silently).
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
	}
	for kind, min := range map[string]int{
		"Namespace": 1, "ServiceAccount": 2, "ConfigMap": 2, "ClusterRole": 2, "ClusterRoleBinding": 2,
		"Role": 4, "RoleBinding": 4, "DaemonSet": 1, "Deployment": 1, "PodDisruptionBudget": 1,
		"ValidatingAdmissionPolicy": 3, "ValidatingAdmissionPolicyBinding": 3,
	} {
		if kinds[kind] < min {
			t.Errorf("install.yaml has %d %s objects, want at least %d", kinds[kind], kind, min)
		}
	}
	for _, kind := range []string{"ServiceMonitor", "PodMonitor", "Secret"} {
		if kinds[kind] > 0 {
			t.Errorf("install.yaml has %d %s objects, want none by default", kinds[kind], kind)
		}
	}
}
