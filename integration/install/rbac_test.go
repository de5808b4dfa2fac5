package install_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// access is one question to the authorizer.
type access struct {
	verb, group, resource, subresource, namespace, name string
	allowed                                             bool
}

func (a access) String() string {
	res := a.resource
	if a.subresource != "" {
		res += "/" + a.subresource
	}
	if a.group != "" {
		res += "." + a.group
	}
	where := "cluster-wide"
	if a.namespace != "" {
		where = "in " + a.namespace
	}
	if a.name != "" {
		res += " " + a.name
	}
	return fmt.Sprintf("%s %s %s", a.verb, res, where)
}

// can asks the API server's authorizer (RBAC here) whether the ServiceAccount ns/name may do a.
func can(ctx context.Context, c kubernetes.Interface, ns, name string, a access) (bool, string, error) {
	sar, err := c.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   "system:serviceaccount:" + ns + ":" + name,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource,
				Namespace: a.namespace, Name: a.name,
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, "", err
	}
	return sar.Status.Allowed, sar.Status.Reason + sar.Status.EvaluationError, nil
}

// checkAccess waits until the first expectation holds (RBAC bindings reach the authorizer
// through an informer) and then checks every expectation.
func checkAccess(t *testing.T, sa string, want []access) {
	t.Helper()
	ctx := t.Context()
	admin := adminClient(t)
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		ok, _, err := can(ctx, admin, namespace, sa, want[0])
		return ok == want[0].allowed, err
	})
	if err != nil {
		t.Fatalf("%s: %v never became %v: %v", sa, want[0], want[0].allowed, err)
	}
	for _, a := range want {
		ok, reason, err := can(ctx, admin, namespace, sa, a)
		if err != nil {
			t.Fatalf("%s: %v: %v", sa, a, err)
		}
		if ok != a.allowed {
			t.Errorf("%s: %v: allowed=%v, want %v (%s)", sa, a, ok, a.allowed, reason)
		}
	}
}

// noSecrets are the secret reads no nodevigil ServiceAccount may do, anywhere.
func noSecrets() []access {
	var out []access
	for _, verb := range []string{"get", "list", "watch"} {
		for _, ns := range []string{"", namespace, "kube-system", "default"} {
			out = append(out, access{verb: verb, resource: "secrets", namespace: ns})
		}
	}
	return out
}

// TestAgentRBAC checks the agent's ServiceAccount against what it needs (its Node, its
// status, its Lease, Events about Nodes) and a list of things it must not do.
func TestAgentRBAC(t *testing.T) {
	ensureInstalled(t)
	want := []access{
		{verb: "get", resource: "nodes", name: "any", allowed: true},
		{verb: "patch", resource: "nodes", allowed: true},
		{verb: "patch", resource: "nodes", subresource: "status", allowed: true},
		{verb: "get", group: "coordination.k8s.io", resource: "leases", namespace: namespace, allowed: true},
		{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: namespace, allowed: true},
		{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: namespace, allowed: true},
		{verb: "create", resource: "events", namespace: "default", allowed: true},
		{verb: "patch", resource: "events", namespace: "default", allowed: true},

		// The agent reads its Node by name and never lists or watches, nor sends whole objects.
		{verb: "list", resource: "nodes"},
		{verb: "watch", resource: "nodes"},
		{verb: "update", resource: "nodes", name: "any"},
		{verb: "get", resource: "nodes", subresource: "status", name: "any"},
		{verb: "delete", resource: "nodes", name: "any"},
		{verb: "create", resource: "nodes"},
		{verb: "create", group: "events.k8s.io", resource: "events", namespace: "default"},
		{verb: "update", resource: "nodes", subresource: "status"},
		{verb: "delete", group: "coordination.k8s.io", resource: "leases", namespace: namespace},
		{verb: "list", group: "coordination.k8s.io", resource: "leases", namespace: namespace},
		{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: "kube-node-lease"},
		{verb: "create", resource: "events", namespace: "kube-system"},
		{verb: "list", resource: "pods"},
		{verb: "create", resource: "pods", subresource: "eviction", namespace: "default"},
		{verb: "get", resource: "configmaps", namespace: "kube-system"},
	}
	checkAccess(t, agentSA, append(want, noSecrets()...))
}

// TestRemediatorRBAC checks the remediator's ServiceAccount against its pipeline: watch Nodes
// and both kinds of Leases, cordon and annotate, evict, delete the Node, elect a leader.
func TestRemediatorRBAC(t *testing.T) {
	ensureInstalled(t)
	want := []access{
		{verb: "create", resource: "pods", subresource: "eviction", namespace: "default", allowed: true},
		{verb: "list", resource: "nodes", allowed: true},
		{verb: "watch", resource: "nodes", allowed: true},
		{verb: "patch", resource: "nodes", name: "any", allowed: true},
		{verb: "delete", resource: "nodes", name: "any", allowed: true},
		{verb: "list", resource: "pods", allowed: true},
		{verb: "list", group: "coordination.k8s.io", resource: "leases", namespace: "kube-node-lease", allowed: true},
		{verb: "watch", group: "coordination.k8s.io", resource: "leases", namespace: "kube-node-lease", allowed: true},
		{verb: "list", group: "coordination.k8s.io", resource: "leases", namespace: namespace, allowed: true},
		{verb: "watch", group: "coordination.k8s.io", resource: "leases", namespace: namespace, allowed: true},
		{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: namespace, allowed: true},
		{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: namespace, name: "nodevigil-remediator", allowed: true},
		{verb: "get", group: "coordination.k8s.io", resource: "leases", namespace: namespace, name: "nodevigil-remediator", allowed: true},
		{verb: "create", resource: "events", namespace: "default", allowed: true},
		{verb: "patch", resource: "events", namespace: "default", allowed: true},
		// The secure metrics endpoint reviews each scraper's token and permission.
		{verb: "create", group: "authentication.k8s.io", resource: "tokenreviews", allowed: true},
		{verb: "create", group: "authorization.k8s.io", resource: "subjectaccessreviews", allowed: true},

		// Verbs the remediator never calls: its informers answer every read of Nodes, Pods
		// and Leases, and it patches rather than updates.
		{verb: "get", resource: "nodes", name: "any"},
		{verb: "update", resource: "nodes", name: "any"},
		{verb: "get", resource: "pods", namespace: "kube-system", name: "any"},
		{verb: "get", group: "coordination.k8s.io", resource: "leases", namespace: "kube-node-lease", name: "some-node"},
		{verb: "get", group: "coordination.k8s.io", resource: "leases", namespace: namespace, name: "some-node"},
		{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: namespace, name: "some-node"},
		{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: "kube-node-lease", name: "some-node"},
		{verb: "delete", group: "coordination.k8s.io", resource: "leases", namespace: namespace},
		{verb: "delete", resource: "pods", namespace: "default", name: "any"},
		{verb: "create", resource: "pods", namespace: "default"},
		{verb: "create", resource: "nodes"},
		{verb: "patch", resource: "nodes", subresource: "status"},
		{verb: "list", resource: "configmaps"},
		{verb: "create", resource: "events", namespace: "kube-system"},
	}
	checkAccess(t, remediatorSA, append(want, noSecrets()...))
}

// TestServiceAccountsWithRealTokens repeats the decisive checks with real tokens through the
// whole request path: the agent cannot delete a Node or read Secrets, the remediator can evict
// a pod but cannot read Secrets.
func TestServiceAccountsWithRealTokens(t *testing.T) {
	ensureInstalled(t)
	ctx := t.Context()
	admin := adminClient(t)

	node := createNode(ctx, t, admin, "rbac")
	agentPod := createPod(ctx, t, admin, namespace, agentSA, node.Name)
	agent := saClient(ctx, t, namespace, agentSA, agentPod)
	remediator := saClient(ctx, t, namespace, remediatorSA, nil)

	// Wait until both bindings are in the authorizer's cache.
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, aerr := agent.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
		_, rerr := remediator.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1})
		return aerr == nil && rerr == nil, nil
	})
	if err != nil {
		t.Fatalf("service accounts never got their read access: %v", err)
	}

	t.Run("agent", func(t *testing.T) {
		err := agent.CoreV1().Nodes().Delete(ctx, node.Name, metav1.DeleteOptions{})
		if !apierrors.IsForbidden(err) || deniedBy(err, nodePolicy) {
			t.Errorf("agent deleting its own node: want Forbidden by RBAC, got %s", errText(err))
		}
		if _, err := admin.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{}); err != nil {
			t.Errorf("node %s should still exist: %v", node.Name, err)
		}
		_, err = agent.CoreV1().Secrets(namespace).List(ctx, metav1.ListOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("agent listing secrets in %s: want Forbidden, got %s", namespace, errText(err))
		}
		_, err = agent.CoreV1().Secrets("kube-system").Get(ctx, "any", metav1.GetOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("agent reading a secret in kube-system: want Forbidden, got %s", errText(err))
		}
	})

	t.Run("remediator", func(t *testing.T) {
		ns, err := cp.Namespace(ctx, "evict")
		if err != nil {
			t.Fatal(err)
		}
		victim := createPod(ctx, t, admin, ns, "", "")
		err = remediator.PolicyV1().Evictions(ns).Evict(ctx, &policyv1.Eviction{
			ObjectMeta: metav1.ObjectMeta{Name: victim.Name, Namespace: ns},
		})
		// Success, or a PodDisruptionBudget's 429, both prove the eviction was authorised.
		if err != nil && !apierrors.IsTooManyRequests(err) {
			t.Errorf("remediator evicting %s/%s: %v", ns, victim.Name, err)
		}
		_, err = remediator.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("remediator listing secrets in %s: want Forbidden, got %s", ns, errText(err))
		}
		_, err = remediator.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("remediator listing secrets cluster-wide: want Forbidden, got %s", errText(err))
		}
		err = remediator.CoreV1().Pods(ns).Delete(ctx, victim.Name, metav1.DeleteOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("remediator deleting a pod directly (bypassing PodDisruptionBudgets): want Forbidden, got %s", errText(err))
		}
	})
}
