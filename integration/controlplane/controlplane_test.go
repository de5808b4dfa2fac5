package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/nodevigil/nodevigil/integration/controlplane"
)

var cp *controlplane.ControlPlane

// childEnv makes the test binary, re-executed by TestTeardownLeavesNoProcess, start its own
// control plane and then die in the way the environment variable says.
const childEnv = "NODEVIGIL_HARNESS_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(m.Run()) // the child runs only TestHarnessChild, with its own control plane
	}
	os.Exit(controlplane.RunTests(m, controlplane.Config{}, &cp))
}

func client(t *testing.T) kubernetes.Interface {
	t.Helper()
	c, err := cp.Client()
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	return c
}

func TestNodeWithoutKubeletTurnsUnknownAndUnreachable(t *testing.T) {
	ctx := t.Context()
	c := client(t)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "smoke-silent-" + strconv.FormatInt(time.Now().UnixNano(), 36)}}
	if _, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node: %v", err)
	}
	t.Cleanup(func() { _ = c.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{}) })

	var last *corev1.Node
	err := wait.PollUntilContextTimeout(ctx, time.Second, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := c.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = n
		ready := false
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionUnknown {
				ready = true
			}
		}
		tainted := false
		for _, taint := range n.Spec.Taints {
			if taint.Key == corev1.TaintNodeUnreachable {
				tainted = true
			}
		}
		return ready && tainted, nil
	})
	if err != nil {
		t.Fatalf("node never became Ready=Unknown with the unreachable taint: %v\nconditions: %+v\ntaints: %+v\nkube-controller-manager log:\n%s",
			err, last.Status.Conditions, last.Spec.Taints, cp.LogTail("kube-controller-manager", 20))
	}
}

func TestLeaseOwnedByNodeIsGarbageCollected(t *testing.T) {
	ctx := t.Context()
	c := client(t)
	ns, err := cp.Namespace(ctx, "smoke-gc")
	if err != nil {
		t.Fatal(err)
	}
	node, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{GenerateName: "smoke-gc-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node: %v", err)
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Name: node.Name, Namespace: ns,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}},
	}}
	if _, err := c.CoordinationV1().Leases(ns).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create lease: %v", err)
	}
	// An unowned lease next to it must survive: the test must be able to tell GC from "everything vanished".
	keep := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: node.Name + "-unowned", Namespace: ns}}
	if _, err := c.CoordinationV1().Leases(ns).Create(ctx, keep, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create unowned lease: %v", err)
	}
	if err := c.CoreV1().Nodes().Delete(ctx, node.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete node: %v", err)
	}
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := c.CoordinationV1().Leases(ns).Get(ctx, lease.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	if err != nil {
		t.Fatalf("owned lease not garbage-collected: %v\nkube-controller-manager log:\n%s", err, cp.LogTail("kube-controller-manager", 20))
	}
	if _, err := c.CoordinationV1().Leases(ns).Get(ctx, keep.Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("unowned lease should survive: %v", err)
	}
}

func TestServiceAccountLimitedToItsRole(t *testing.T) {
	ctx := t.Context()
	c := client(t)
	ns, err := cp.Namespace(ctx, "smoke-rbac")
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "read-configmaps", Namespace: ns},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list"}}},
	}
	if _, err := c.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create role: %v", err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "reader", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "reader", Namespace: ns}},
	}
	if _, err := c.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create rolebinding: %v", err)
	}
	cfg, err := cp.ServiceAccountConfig(ctx, ns, "reader", controlplane.TokenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sa, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// RBAC is cached by the authorizer's informers; allow it a moment to see the new binding.
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := sa.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("service account cannot do what its role grants: %v", err)
	}
	for name, call := range map[string]func() error{
		"list secrets": func() error { _, err := sa.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); return err },
		"delete configmap": func() error {
			return sa.CoreV1().ConfigMaps(ns).Delete(ctx, "kube-root-ca.crt", metav1.DeleteOptions{})
		},
		"list nodes": func() error { _, err := sa.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); return err },
	} {
		if err := call(); !apierrors.IsForbidden(err) {
			t.Errorf("%s: want Forbidden, got %v", name, err)
		}
	}
}

func TestAPIServerRestart(t *testing.T) {
	ctx := t.Context()
	c := client(t)
	if err := cp.StopAPIServer(); err != nil {
		t.Fatalf("stop apiserver: %v", err)
	}
	shortCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err := c.CoreV1().Namespaces().Get(shortCtx, "default", metav1.GetOptions{})
	cancel()
	if err == nil {
		t.Fatal("apiserver still answers after StopAPIServer")
	}
	if err := cp.StartAPIServer(ctx); err != nil {
		t.Fatalf("start apiserver: %v", err)
	}
	if _, err := c.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("apiserver does not answer after restart: %v", err)
	}
}

// TestTeardownLeavesNoProcess re-executes this test binary so that a child starts its own
// control plane and then dies: once by returning normally through Stop, once by panicking,
// which skips every deferred teardown. Either way no process the child started may survive.
func TestTeardownLeavesNoProcess(t *testing.T) {
	for _, mode := range []string{"stop", "panic"} {
		t.Run(mode, func(t *testing.T) {
			pidFile := filepath.Join(t.TempDir(), "pids")
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestHarnessChild$", "-test.v")
			cmd.Env = append(os.Environ(), childEnv+"="+mode, "NODEVIGIL_PID_FILE="+pidFile)
			out, err := cmd.CombinedOutput()
			if mode == "panic" && err == nil {
				t.Fatalf("child was meant to panic but exited cleanly:\n%s", out)
			}
			data, rerr := os.ReadFile(pidFile)
			if rerr != nil {
				t.Fatalf("child wrote no pid file (%v); child output:\n%s", rerr, out)
			}
			pids := strings.Fields(string(data))
			if len(pids) != 2 {
				t.Fatalf("want 2 pids (etcd, kube-apiserver), got %q; child output:\n%s", pids, out)
			}
			for _, s := range pids {
				pid, _ := strconv.Atoi(s)
				if err := waitGone(pid, 10*time.Second); err != nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
					t.Errorf("pid %d survived the child's %s: %v", pid, mode, err)
				}
			}
		})
	}
}

// TestHarnessChild only does something inside the child process of TestTeardownLeavesNoProcess.
func TestHarnessChild(t *testing.T) {
	mode := os.Getenv(childEnv)
	if mode == "" {
		return // not the child: nothing to do, and nothing asserted
	}
	child, err := controlplane.Start(t.Context(), controlplane.Config{DisableControllerManager: true})
	if err != nil {
		t.Fatalf("child start: %v", err)
	}
	var b strings.Builder
	for _, pid := range child.Pids() {
		fmt.Fprintf(&b, "%d\n", pid)
	}
	if err := os.WriteFile(os.Getenv("NODEVIGIL_PID_FILE"), []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	switch mode {
	case "panic":
		panic("deliberate panic with a running control plane")
	default:
		if err := child.Stop(); err != nil {
			t.Fatal(err)
		}
	}
}

// waitGone waits until pid no longer exists (or is a zombie awaiting its reaper).
func waitGone(pid int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Kill(pid, 0)
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		if st, rerr := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); rerr == nil {
			if f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+1:])); len(f) > 0 && f[0] == "Z" {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still running after %s", timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
