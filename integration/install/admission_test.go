package install_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/nodevigil/nodevigil/agent/conditions"
	"github.com/nodevigil/nodevigil/agent/taints"
)

// agentConditionPatch is the strategic-merge patch the agent sends for one of its condition
// types, built by the agent's own code.
func agentConditionPatch(t *testing.T, typ corev1.NodeConditionType, status corev1.ConditionStatus) []byte {
	t.Helper()
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	body, err := conditions.BuildPatch([]corev1.NodeCondition{{
		Type: typ, Status: status, Reason: "InstallTest", Message: "written by the install test",
		LastHeartbeatTime: now, LastTransitionTime: now,
	}})
	if err != nil {
		t.Fatalf("build condition patch: %v", err)
	}
	return body
}

// foreignConditionPatch is a strategic-merge patch of a condition the agent does not own.
func foreignConditionPatch(t *testing.T, typ corev1.NodeConditionType, status corev1.ConditionStatus) []byte {
	t.Helper()
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	body, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{
		Type: typ, Status: status, Reason: "InstallTest", LastHeartbeatTime: now, LastTransitionTime: now,
	}}}})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

func patchStatus(ctx context.Context, c kubernetes.Interface, node string, body []byte) error {
	_, err := c.CoreV1().Nodes().PatchStatus(ctx, node, body)
	return err
}

// setTaints replaces the Node's taints with keep(current taints) the way the agent does: a
// merge patch guarded by the resourceVersion it read, retried on conflict.
func setTaints(ctx context.Context, c kubernetes.Interface, node string, keep func([]corev1.Taint) []corev1.Taint) error {
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		body, err := taints.TaintsPatch(n.ResourceVersion, keep(n.Spec.Taints))
		if err != nil {
			return err
		}
		_, err = c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{})
		return err
	})
}

func withoutKey(key string) func([]corev1.Taint) []corev1.Taint {
	return func(ts []corev1.Taint) []corev1.Taint {
		return slices.DeleteFunc(slices.Clone(ts), func(t corev1.Taint) bool { return t.Key == key })
	}
}

// wantDenied fails unless err is a Forbidden admission denial by policy whose message contains
// want.
func wantDenied(t *testing.T, what string, err error, policy, want string) {
	t.Helper()
	if !apierrors.IsForbidden(err) {
		t.Errorf("%s: want Forbidden from %s, got %s", what, policy, errText(err))
		return
	}
	if !deniedBy(err, policy) {
		t.Errorf("%s: Forbidden, but not by ValidatingAdmissionPolicy %s: %v", what, policy, err)
		return
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("%s: denial message %q does not say %q", what, err.Error(), want)
	}
}

// TestAgentConfinedToOwnNode runs the agent's ServiceAccount with a token bound to a pod on
// node A, as the kubelet would mount it, and checks the admission policy: writes to A's own
// conditions and owned taints pass, anything on node B, any foreign condition or taint, and
// any other field is denied with the policy's message.
func TestAgentConfinedToOwnNode(t *testing.T) {
	ensureInstalled(t)
	ctx := t.Context()
	admin := adminClient(t)

	foreign := corev1.Taint{Key: "example.com/foreign", Value: "x", Effect: corev1.TaintEffectNoSchedule}
	owned := corev1.Taint{Key: ownedTaint, Effect: corev1.TaintEffectNoSchedule}
	nodeA := createNode(ctx, t, admin, "vap-a", owned, foreign)
	nodeB := createNode(ctx, t, admin, "vap-b", owned, foreign)
	canary := createNode(ctx, t, admin, "vap-canary")
	pod := createPod(ctx, t, admin, namespace, agentSA, nodeA.Name)
	agent := saClient(ctx, t, namespace, agentSA, pod)

	// Policies and bindings reach the admission plugin through an informer, and the RBAC
	// bindings through the authorizer's: wait until a write to a canary node is refused by the
	// policy (not by RBAC, not allowed) before asserting anything that could pass by accident.
	// Writes that got through before enforcement land on the canary, never on node B.
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := patchStatus(ctx, agent, canary.Name, agentConditionPatch(t, conditions.TypeKubeletHealthy, corev1.ConditionTrue))
		if ctx.Err() == nil {
			last = err // keep the last answer of the server, not the poll's own deadline
		}
		return deniedBy(err, nodePolicy), nil
	})
	if err != nil {
		t.Fatalf("policy %s never denied the agent on %s writing %s: last result %s", nodePolicy, nodeA.Name, canary.Name, errText(last))
	}

	t.Run("own condition on own node allowed", func(t *testing.T) {
		if err := patchStatus(ctx, agent, nodeA.Name, agentConditionPatch(t, conditions.TypeKubeletHealthy, corev1.ConditionTrue)); err != nil {
			t.Fatalf("agent patching KubeletHealthy on its own node %s: %v", nodeA.Name, err)
		}
		n, err := admin.CoreV1().Nodes().Get(ctx, nodeA.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool {
			return c.Type == conditions.TypeKubeletHealthy && c.Status == corev1.ConditionTrue
		}) {
			t.Errorf("patch allowed but KubeletHealthy=True not on node %s: %+v", nodeA.Name, n.Status.Conditions)
		}
	})

	t.Run("own condition on other node denied", func(t *testing.T) {
		err := patchStatus(ctx, agent, nodeB.Name, agentConditionPatch(t, conditions.TypeKubeletHealthy, corev1.ConditionFalse))
		wantDenied(t, "KubeletHealthy on "+nodeB.Name, err, nodePolicy, "may write only its own Node, not "+nodeB.Name)
		n, gerr := admin.CoreV1().Nodes().Get(ctx, nodeB.Name, metav1.GetOptions{})
		if gerr != nil {
			t.Fatal(gerr)
		}
		if slices.ContainsFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == conditions.TypeKubeletHealthy }) {
			t.Errorf("node %s carries KubeletHealthy although every agent write to it was denied", nodeB.Name)
		}
	})

	t.Run("kubelet condition on own node denied", func(t *testing.T) {
		err := patchStatus(ctx, agent, nodeA.Name, foreignConditionPatch(t, corev1.NodeReady, corev1.ConditionFalse))
		wantDenied(t, "Ready on own node", err, nodePolicy, "may change only the Node conditions")
	})

	t.Run("taints", func(t *testing.T) {
		// Order matters: the foreign taint is tried first, while the owned one is still there,
		// so that the denial cannot come from anything but the foreign key.
		err := setTaints(ctx, agent, nodeA.Name, withoutKey(foreign.Key))
		wantDenied(t, "removing a foreign taint", err, nodePolicy, "may add or remove only the taints "+ownedTaint)

		if err := setTaints(ctx, agent, nodeA.Name, withoutKey(ownedTaint)); err != nil {
			t.Fatalf("agent removing its owned taint from its own node: %v", err)
		}
		n, err := admin.CoreV1().Nodes().Get(ctx, nodeA.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == ownedTaint }) {
			t.Errorf("owned taint still on node %s: %+v", nodeA.Name, n.Spec.Taints)
		}
		if !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t == foreign }) {
			t.Errorf("foreign taint lost from node %s: %+v", nodeA.Name, n.Spec.Taints)
		}

		// Re-adding the owned taint (--readd-taint-on-failure) is allowed too.
		readd := func(ts []corev1.Taint) []corev1.Taint { return append(slices.Clone(ts), owned) }
		if err := setTaints(ctx, agent, nodeA.Name, readd); err != nil {
			t.Errorf("agent re-adding its owned taint: %v", err)
		}
		err = setTaints(ctx, agent, nodeB.Name, withoutKey(ownedTaint))
		wantDenied(t, "removing the owned taint from another node", err, nodePolicy, "may write only its own Node")
	})

	t.Run("owned taint only NoSchedule without value", func(t *testing.T) {
		if err := setTaints(ctx, agent, nodeA.Name, withoutKey(ownedTaint)); err != nil {
			t.Fatalf("agent removing its owned taint: %v", err)
		}
		for _, bad := range []corev1.Taint{
			{Key: ownedTaint, Effect: corev1.TaintEffectNoExecute},
			{Key: ownedTaint, Effect: corev1.TaintEffectPreferNoSchedule},
			{Key: ownedTaint, Value: "x", Effect: corev1.TaintEffectNoSchedule},
		} {
			add := func(ts []corev1.Taint) []corev1.Taint { return append(slices.Clone(ts), bad) }
			err := setTaints(ctx, agent, nodeA.Name, add)
			wantDenied(t, "adding "+bad.ToString(), err, nodePolicy, "may add its owned taints only as <key>:NoSchedule without a value, not "+ownedTaint+"="+bad.Value+":"+string(bad.Effect))
		}
		n, err := admin.CoreV1().Nodes().Get(ctx, nodeA.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == ownedTaint }) {
			t.Fatalf("a denied taint reached node %s: %+v", nodeA.Name, n.Spec.Taints)
		}
		readd := func(ts []corev1.Taint) []corev1.Taint { return append(slices.Clone(ts), owned) }
		if err := setTaints(ctx, agent, nodeA.Name, readd); err != nil {
			t.Errorf("agent re-adding %s: %v", owned.ToString(), err)
		}
	})

	t.Run("status fields other than conditions denied", func(t *testing.T) {
		for name, body := range map[string]string{
			"capacity":        `{"status":{"capacity":{"example.com/gpu":"8"}}}`,
			"allocatable":     `{"status":{"allocatable":{"cpu":"64"}}}`,
			"runtimeHandlers": `{"status":{"runtimeHandlers":[{"name":"evil","features":{"recursiveReadOnlyMounts":true}}]}}`,
			"features":        `{"status":{"features":{"supplementalGroupsPolicy":true}}}`,
			"nodeInfo":        `{"status":{"nodeInfo":{"kubeletVersion":"v9.9.9"}}}`,
		} {
			_, err := agent.CoreV1().Nodes().Patch(ctx, nodeA.Name, types.MergePatchType, []byte(body), metav1.PatchOptions{}, "status")
			wantDenied(t, "status."+name, err, nodePolicy, "may change only its own condition types and owned taints")
		}
	})

	t.Run("events", func(t *testing.T) {
		events := agent.CoreV1().Events(metav1.NamespaceDefault)
		event := func(kind, name, component string) *corev1.Event {
			return &corev1.Event{
				ObjectMeta:     metav1.ObjectMeta{Name: uniq("ev"), Namespace: metav1.NamespaceDefault},
				InvolvedObject: corev1.ObjectReference{Kind: kind, Name: name, APIVersion: "v1"},
				Reason:         "InstallTest", Message: "written by the install test", Type: corev1.EventTypeNormal,
				Source:              corev1.EventSource{Component: component, Host: nodeA.Name},
				ReportingController: component, ReportingInstance: nodeA.Name,
			}
		}
		own, err := events.Create(ctx, event("Node", nodeA.Name, "nodevigil-agent"), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("agent recording an Event about its own node: %v", err)
		}
		t.Cleanup(func() {
			_ = admin.CoreV1().Events(metav1.NamespaceDefault).Delete(context.Background(), own.Name, metav1.DeleteOptions{})
		})
		// Bumping the count (what the recorder does for a repeated Event) is allowed too.
		if _, err := events.Patch(ctx, own.Name, types.MergePatchType, []byte(`{"count":2}`), metav1.PatchOptions{}); err != nil {
			t.Errorf("agent bumping its own Event: %v", err)
		}
		_, err = events.Create(ctx, event("Node", nodeB.Name, "nodevigil-agent"), metav1.CreateOptions{})
		wantDenied(t, "Event about another node", err, eventPolicy, "may record Events only about its own Node, not about Node "+nodeB.Name)
		_, err = events.Create(ctx, event("Pod", "victim", "nodevigil-agent"), metav1.CreateOptions{})
		wantDenied(t, "Event about a Pod", err, eventPolicy, "may record Events only about its own Node")
		_, err = events.Create(ctx, event("Node", nodeA.Name, "nodevigil-remediator"), metav1.CreateOptions{})
		wantDenied(t, "Event as the remediator", err, eventPolicy, "may record Events only as nodevigil-agent")
		spoof := event("Node", nodeA.Name, "nodevigil-agent")
		spoof.ReportingController = "nodevigil-remediator"
		_, err = events.Create(ctx, spoof, metav1.CreateOptions{})
		wantDenied(t, "Event reported as the remediator", err, eventPolicy, "may record Events only as nodevigil-agent")
	})

	t.Run("other fields denied", func(t *testing.T) {
		for name, body := range map[string]string{
			"label":         `{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}}}`,
			"annotation":    `{"metadata":{"annotations":{"example.com/x":"y"}}}`,
			"unschedulable": `{"spec":{"unschedulable":true}}`,
			"providerID":    `{"spec":{"providerID":"aws:///us-east-1a/i-0123456789abcdef0"}}`,
		} {
			_, err := agent.CoreV1().Nodes().Patch(ctx, nodeA.Name, types.MergePatchType, []byte(body), metav1.PatchOptions{})
			wantDenied(t, name, err, nodePolicy, "may change only its own condition types and owned taints")
		}
		_, err := agent.CoreV1().Nodes().Patch(ctx, nodeA.Name, types.MergePatchType,
			[]byte(`{"status":{"addresses":[{"type":"InternalIP","address":"10.9.9.9"}]}}`), metav1.PatchOptions{}, "status")
		wantDenied(t, "status.addresses", err, nodePolicy, "may change only its own condition types and owned taints")
	})

	t.Run("token not bound to a pod denied", func(t *testing.T) {
		unbound := saClient(ctx, t, namespace, agentSA, nil)
		err := patchStatus(ctx, unbound, nodeA.Name, agentConditionPatch(t, conditions.TypeKubeletHealthy, corev1.ConditionTrue))
		wantDenied(t, "unbound token", err, nodePolicy, "no node name")
	})

	t.Run("lease", func(t *testing.T) {
		leases := agent.CoordinationV1().Leases(namespace)
		own := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
			Name: nodeA.Name, Namespace: namespace,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: nodeA.Name, UID: nodeA.UID}},
		}}
		created, err := leases.Create(ctx, own, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("agent creating its own Lease %s: %v", own.Name, err)
		}
		t.Cleanup(func() {
			_ = admin.CoordinationV1().Leases(namespace).Delete(context.Background(), own.Name, metav1.DeleteOptions{})
		})
		now := metav1.NewMicroTime(time.Now())
		created.Spec.RenewTime = &now
		if created, err = leases.Update(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("agent renewing its own Lease: %v", err)
		}

		// The owner must be the Node with its real UID (from the pod-bound token), on create
		// and whenever the references change.
		wrongUID := created.DeepCopy()
		wrongUID.OwnerReferences[0].UID = "00000000-0000-0000-0000-000000000000"
		_, err = leases.Update(ctx, wrongUID, metav1.UpdateOptions{})
		wantDenied(t, "Lease owner with a wrong UID", err, leasePolicy, "may be owned only by its own Node "+nodeA.Name+" (uid "+string(nodeA.UID)+")")
		otherOwner := created.DeepCopy()
		otherOwner.OwnerReferences[0].Name, otherOwner.OwnerReferences[0].UID = nodeB.Name, nodeB.UID
		_, err = leases.Update(ctx, otherOwner, metav1.UpdateOptions{})
		wantDenied(t, "Lease owned by another node", err, leasePolicy, "may be owned only by its own Node "+nodeA.Name)

		other := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: nodeB.Name, Namespace: namespace}}
		_, err = leases.Create(ctx, other, metav1.CreateOptions{})
		wantDenied(t, "Lease of another node", err, leasePolicy, "may write only the Lease named after its node, not "+nodeB.Name)

		stolen := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
			Name: nodeA.Name + "-x", Namespace: namespace,
		}}
		_, err = leases.Create(ctx, stolen, metav1.CreateOptions{})
		wantDenied(t, "Lease with another name", err, leasePolicy, "may write only the Lease named after its node")
	})
}

// TestAdmissionPoliciesTypeCheck waits for the policy status controller to type-check the
// installed policies against the Node and Lease schemas and fails on any warning: a CEL
// expression naming a field that does not exist would otherwise fail only at admission time
// (and, with failurePolicy Fail, deny the agent everything).
func TestAdmissionPoliciesTypeCheck(t *testing.T) {
	ensureInstalled(t)
	ctx := t.Context()
	admin := adminClient(t)
	for _, name := range []string{nodePolicy, leasePolicy, eventPolicy} {
		var p *admissionv1.ValidatingAdmissionPolicy
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			p = got
			return got.Status.ObservedGeneration == got.Generation && got.Status.TypeChecking != nil, nil
		})
		if err != nil {
			t.Fatalf("policy %s was never type-checked: %v (status %+v)\nkube-controller-manager log:\n%s",
				name, err, p.Status, cp.LogTail("kube-controller-manager", 20))
		}
		for _, w := range p.Status.TypeChecking.ExpressionWarnings {
			t.Errorf("policy %s: %s: %s", name, w.FieldRef, w.Warning)
		}
	}

	// Control: the same controller does flag a policy that names a field Nodes do not have, so
	// an empty warning list above means the expressions were checked, not skipped.
	bad := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: uniq("typecheck-control")},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Update},
					Rule:       admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"nodes"}},
				},
			}}},
			Validations: []admissionv1.Validation{{Expression: "object.spec.noSuchField == 'x'"}},
		},
	}
	if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create control policy: %v", err)
	}
	t.Cleanup(func() {
		_ = admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(context.Background(), bad.Name, metav1.DeleteOptions{})
	})
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, bad.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return got.Status.TypeChecking != nil && len(got.Status.TypeChecking.ExpressionWarnings) > 0, nil
	})
	if err != nil {
		t.Errorf("the type checker never flagged object.spec.noSuchField on Nodes: %v", err)
	}
}
