// Package install_test applies manifests/install.yaml to a real control plane (etcd,
// kube-apiserver, kube-controller-manager from the project's harness) and checks what the
// manifest promises: it applies cleanly and idempotently with server-side apply, its
// ValidatingAdmissionPolicies confine the agent to its own Node, condition types, owned taints
// and Lease, and its RBAC gives each ServiceAccount what its component needs and nothing more.
package install_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"

	"github.com/nodevigil/nodevigil/integration/controlplane"
)

// Names install.yaml is rendered with (manifests/render.sh: release nodevigil in
// nodevigil-system). The tests read them from the manifest where it matters and fail when the
// manifest disagrees.
const (
	namespace       = "nodevigil-system"
	agentSA         = "nodevigil-agent"
	remediatorSA    = "nodevigil-remediator"
	nodePolicy      = "nodevigil-agent-own-node"
	leasePolicy     = "nodevigil-agent-own-lease"
	eventPolicy     = "nodevigil-agent-own-events"
	ownedTaint      = "readiness.k8s.io/nodevigil-agent-not-ready"
	fieldManager    = "nodevigil-install-test"
	manifestRelPath = "../../manifests/install.yaml"
)

var cp *controlplane.ControlPlane

func TestMain(m *testing.M) {
	// The ValidatingAdmissionPolicy status controller type-checks the policies' CEL against the
	// Node and Lease schemas; the tests assert it finds nothing to warn about. Node lifecycle
	// is left out: its taints would only add noise to the taint tests.
	cfg := controlplane.Config{Controllers: []string{
		"serviceaccount", "namespace", "garbagecollector", "validatingadmissionpolicy-status-controller",
	}}
	os.Exit(controlplane.RunTests(m, cfg, &cp))
}

// uniq returns a name unique within this test binary's control plane.
var uniqCounter atomic.Int64

func uniq(prefix string) string {
	return prefix + "-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36) + "-" + strconv.FormatInt(uniqCounter.Add(1), 10)
}

func adminClient(t *testing.T) kubernetes.Interface {
	t.Helper()
	c, err := cp.Client()
	if err != nil {
		t.Fatalf("admin client: %v", err)
	}
	return c
}

// readManifest parses install.yaml into its objects, skipping documents that hold only
// comments.
func readManifest(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	return decodeManifest(data, path)
}

// decodeManifest decodes the objects of a multi-document YAML stream; path names it in errors.
func decodeManifest(data []byte, path string) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		var raw map[string]any
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("decode %s document %d: %w", path, len(objs)+1, err)
		}
		if len(raw) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: raw}
		if u.GetKind() == "" || u.GetAPIVersion() == "" || u.GetName() == "" {
			return nil, fmt.Errorf("%s: document %d has no apiVersion, kind or name: %v", path, len(objs)+1, raw)
		}
		objs = append(objs, u)
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("%s holds no objects", path)
	}
	return objs, nil
}

func manifestObjects(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	objs, err := readManifest(filepath.FromSlash(manifestRelPath))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// applier applies objects with server-side apply, the way `kubectl apply --server-side` does:
// the REST mapping comes from discovery, every object is sent whole under one field manager.
type applier struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func newApplier(cfg *rest.Config) (*applier, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("discovery client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	return &applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}, nil
}

func (a *applier) resource(obj *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := obj.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", gvk, err)
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		if obj.GetNamespace() == "" {
			return nil, fmt.Errorf("%s %s is namespaced but has no namespace in the manifest", gvk.Kind, obj.GetName())
		}
		return a.dyn.Resource(m.Resource).Namespace(obj.GetNamespace()), nil
	}
	return a.dyn.Resource(m.Resource), nil
}

// apply server-side applies each object in order and returns the applied objects.
func (a *applier) apply(ctx context.Context, objs []*unstructured.Unstructured) ([]*unstructured.Unstructured, error) {
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, obj := range objs {
		ri, err := a.resource(obj)
		if err != nil {
			return nil, err
		}
		data, err := obj.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("encode %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
		got, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{
			FieldManager: fieldManager, Force: ptr.To(true),
		})
		if err != nil {
			return nil, fmt.Errorf("apply %s %s/%s: %w", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
		}
		out = append(out, got)
	}
	return out, nil
}

var (
	installOnce sync.Once
	installErr  error
)

// ensureInstalled applies install.yaml once per test binary; tests that need the installed
// RBAC and policies call it first, in whatever order they run.
func ensureInstalled(t *testing.T) {
	t.Helper()
	installOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		objs, err := readManifest(filepath.FromSlash(manifestRelPath))
		if err != nil {
			installErr = err
			return
		}
		a, err := newApplier(cp.Config())
		if err != nil {
			installErr = err
			return
		}
		_, installErr = a.apply(ctx, objs)
	})
	if installErr != nil {
		t.Fatalf("install manifest: %v", installErr)
	}
}

// describe names an object for messages.
func describe(o *unstructured.Unstructured) string {
	if o.GetNamespace() != "" {
		return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
	}
	return o.GetKind() + " " + o.GetName()
}

// createNode creates a Node with the given taints and returns it.
func createNode(ctx context.Context, t *testing.T, c kubernetes.Interface, prefix string, taints ...corev1.Taint) *corev1.Node {
	t.Helper()
	n, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: uniq(prefix), Labels: map[string]string{"nodevigil.io/test": "install"}},
		Spec:       corev1.NodeSpec{Taints: taints},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node: %v", err)
	}
	t.Cleanup(func() { _ = c.CoreV1().Nodes().Delete(context.Background(), n.Name, metav1.DeleteOptions{}) })
	return n
}

// createPod creates a pod that will never run (there is no kubelet) in namespace ns, on
// nodeName when given, using serviceAccount.
func createPod(ctx context.Context, t *testing.T, c kubernetes.Interface, ns, serviceAccount, nodeName string) *corev1.Pod {
	t.Helper()
	if serviceAccount == "" {
		// Admission refuses a pod whose ServiceAccount does not exist yet; the serviceaccount
		// controller creates "default" in a new namespace a moment after the namespace.
		serviceAccount = "default"
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := c.CoreV1().ServiceAccounts(ns).Get(ctx, serviceAccount, metav1.GetOptions{})
			return err == nil, nil
		})
		if err != nil {
			t.Fatalf("service account %s/default never appeared: %v", ns, err)
		}
	}
	p, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: uniq("pod"), Namespace: ns},
		Spec: corev1.PodSpec{
			ServiceAccountName: serviceAccount,
			NodeName:           nodeName,
			Containers:         []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod: %v", err)
	}
	t.Cleanup(func() {
		_ = c.CoreV1().Pods(ns).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	return p
}

// saClient returns a clientset authenticated as namespace/name with a token bound to pod (nil
// for an unbound token).
func saClient(ctx context.Context, t *testing.T, ns, name string, pod *corev1.Pod) kubernetes.Interface {
	t.Helper()
	cfg, err := cp.ServiceAccountConfig(ctx, ns, name, controlplane.TokenOptions{BoundPod: pod})
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// errText is err's message, or "<nil>".
func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// deniedBy reports whether err is the admission denial of the named policy.
func deniedBy(err error, policy string) bool {
	return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policy+"'")
}
