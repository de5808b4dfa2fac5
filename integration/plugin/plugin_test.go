// Package plugin_test runs the real kubectl-nodevigil binary against a real API server (etcd +
// kube-apiserver from the project's harness; no controller manager, so nothing rewrites the
// fleet's conditions): the fleet of kubectl-nodevigil/testdata/fleet.yaml is applied, and
// status and explain must tell exactly the story of the unit golden files, times aside. hold and
// release must change the node, and a missing node, an unreachable cluster, missing RBAC and a
// bad command line must each be one line on stderr and a non-zero exit.
package plugin_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nodevigil/nodevigil/integration/controlplane"
	"github.com/nodevigil/nodevigil/integration/fleetfixture"
	"github.com/nodevigil/nodevigil/integration/testbin"
	"github.com/nodevigil/nodevigil/remediation/decide"
)

const pluginDir = "../../kubectl-nodevigil"

var cp *controlplane.ControlPlane

func TestMain(m *testing.M) {
	os.Exit(controlplane.RunTests(m, controlplane.Config{DisableControllerManager: true}, &cp))
}

var (
	setupOnce sync.Once
	setupErr  error
	binPath   string
)

// setup builds the plugin and applies the fleet once for the package.
func setup(t *testing.T) string {
	t.Helper()
	setupOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		dir, err := os.MkdirTemp("", "kubectl-nodevigil-")
		if err != nil {
			setupErr = err
			return
		}
		if binPath, setupErr = testbin.Build(ctx, "github.com/nodevigil/nodevigil/kubectl-nodevigil", dir, false); setupErr != nil {
			return
		}
		setupErr = applyFleet(ctx)
	})
	if setupErr != nil {
		t.Fatalf("setup: %v", setupErr)
	}
	return binPath
}

// applyFleet creates the fleet's objects as they would exist in a cluster, status included.
func applyFleet(ctx context.Context) error {
	c, err := cp.Client()
	if err != nil {
		return err
	}
	objs, err := fleetfixture.Render(filepath.Join(pluginDir, "testdata", "fleet.yaml"), time.Now())
	if err != nil {
		return err
	}
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nodevigil-system"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.ConfigMap:
			_, err = c.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.Node:
			status := o.Status
			o.CreationTimestamp = metav1.Time{}
			var n *corev1.Node
			if n, err = c.CoreV1().Nodes().Create(ctx, o, metav1.CreateOptions{}); err == nil {
				n.Status = status
				_, err = c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
			}
		case *coordinationv1.Lease:
			_, err = c.CoordinationV1().Leases(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.Event:
			_, err = c.CoreV1().Events(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			err = errors.New("unexpected object in fleet")
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// result is one run of the binary.
type result struct {
	stdout, stderr string
	code           int
}

func runPlugin(t *testing.T, kubeconfig string, args ...string) result {
	t.Helper()
	bin := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	cmd.Env = append(os.Environ(), "NO_COLOR=1")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("run %v: %v", args, err)
	}
	return r
}

var (
	timeRE  = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)
	durRE   = regexp.MustCompile(`\b\d+(\.\d+)?(ms|d|h|m|s)(\d+(\.\d+)?(h|m|s))*\b`)
	spaceRE = regexp.MustCompile(` +`)
)

// normalize removes what differs between a run at a fixed instant and a run now: times,
// durations, and the table padding that depends on their widths.
func normalize(s string) string {
	s = timeRE.ReplaceAllString(s, "<time>")
	s = durRE.ReplaceAllString(s, "<dur>")
	return spaceRE.ReplaceAllString(s, " ")
}

func golden(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(pluginDir, "testdata", name+".golden"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// assertSameStory fails with both texts when they differ beyond times.
func assertSameStory(t *testing.T, what, got, want string) {
	t.Helper()
	if normalize(got) != normalize(want) {
		t.Errorf("%s against the real API server differs from the golden file (times aside)\n--- got\n%s\n--- want (golden)\n%s", what, got, want)
	}
}

func TestStatusTellsTheGoldenStory(t *testing.T) {
	r := runPlugin(t, cp.KubeconfigPath(), "status")
	if r.code != 0 {
		t.Fatalf("status exit %d: %s", r.code, r.stderr)
	}
	assertSameStory(t, "status", r.stdout, golden(t, "status"))

	r = runPlugin(t, cp.KubeconfigPath(), "status", "-o", "wide")
	assertSameStory(t, "status -o wide", r.stdout, golden(t, "status-wide"))
}

func TestStatusJSONIsOneObjectPerNode(t *testing.T) {
	r := runPlugin(t, cp.KubeconfigPath(), "status", "-o", "json")
	if r.code != 0 {
		t.Fatalf("status -o json exit %d: %s", r.code, r.stderr)
	}
	type row struct {
		Name, State, Reason, Pool string
		Verdict                   struct{ Action, Reason string }
	}
	decode := func(s string) []row {
		var rows []row
		sc := bufio.NewScanner(strings.NewReader(s))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var r row
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatalf("line is not one JSON object: %v\n%s", err, sc.Text())
			}
			rows = append(rows, r)
		}
		return rows
	}
	got, want := decode(r.stdout), decode(golden(t, "status-json"))
	if len(got) != len(want) || len(got) == 0 {
		t.Fatalf("got %d JSON objects, want one per node (%d)", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("node %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestExplainTellsTheGoldenStory(t *testing.T) {
	for _, node := range []string{"general-a-2", "general-a-3", "general-b-1", "general-b-2", "general-c-1", "general-c-2", "general-c-3", "kafka-a-1", "kafka-b-1"} {
		t.Run(node, func(t *testing.T) {
			r := runPlugin(t, cp.KubeconfigPath(), "explain", node)
			if r.code != 0 {
				t.Fatalf("explain exit %d: %s", r.code, r.stderr)
			}
			assertSameStory(t, "explain "+node, r.stdout, golden(t, "explain-"+node))
		})
	}
}

func TestHoldAndRelease(t *testing.T) {
	setup(t)
	c, err := cp.Client()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	annotation := func() (string, bool) {
		n, err := c.CoreV1().Nodes().Get(ctx, "general-a-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v, ok := n.Annotations[decide.AnnotationDoNotRemediate]
		return v, ok
	}
	r := runPlugin(t, cp.KubeconfigPath(), "hold", "general-a-1", "--reason", "kernel upgrade")
	if r.code != 0 || !strings.Contains(r.stdout, "node/general-a-1 held") {
		t.Fatalf("hold: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if v, ok := annotation(); !ok || v != "kernel upgrade" {
		t.Fatalf("after hold the annotation is %q (present %v), want the reason", v, ok)
	}
	r = runPlugin(t, cp.KubeconfigPath(), "explain", "general-a-1")
	if !strings.Contains(r.stdout, `Held back: an operator set nodevigil.io/do-not-remediate="kernel upgrade"`) {
		t.Errorf("explain does not tell the hold:\n%s", r.stdout)
	}
	r = runPlugin(t, cp.KubeconfigPath(), "release", "general-a-1")
	if r.code != 0 || !strings.Contains(r.stdout, "node/general-a-1 released") {
		t.Fatalf("release: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if v, ok := annotation(); ok {
		t.Fatalf("after release the annotation is still there: %q", v)
	}
}

// TestErrorsAreOneLine: each way an operator's command can fail says what went wrong on one line
// and exits non-zero.
func TestErrorsAreOneLine(t *testing.T) {
	setup(t)
	dir := t.TempDir()
	unreachable := writeKubeconfig(t, dir, "unreachable", "https://127.0.0.1:1", "", nil)
	viewer := saKubeconfig(t, dir)
	for _, tc := range []struct {
		name, kubeconfig string
		args             []string
		code             int
		want             string
	}{
		{"missing node", cp.KubeconfigPath(), []string{"explain", "no-such-node"}, 1, `error: get node no-such-node: not found`},
		{"hold missing node", cp.KubeconfigPath(), []string{"hold", "no-such-node"}, 1, `error: get node no-such-node: not found`},
		{"unreachable", unreachable, []string{"status"}, 1, `cannot reach the cluster`},
		{"no RBAC for nodes", viewer, []string{"status"}, 1, `error: list nodes: forbidden`},
		{"no RBAC to hold", viewer, []string{"hold", "general-a-1"}, 1, `error: get node general-a-1: forbidden`},
		{"unknown command", cp.KubeconfigPath(), []string{"frobnicate"}, 2, `error: unknown command "frobnicate"`},
		{"bad output", cp.KubeconfigPath(), []string{"status", "-o", "table"}, 2, `error: -o "table" is not an output format`},
		{"explain without node", cp.KubeconfigPath(), []string{"explain"}, 2, `error: explain takes exactly one node name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runPlugin(t, tc.kubeconfig, tc.args...)
			if r.code != tc.code {
				t.Errorf("exit %d, want %d (stderr %q)", r.code, tc.code, r.stderr)
			}
			first := strings.SplitN(r.stderr, "\n", 2)[0]
			if !strings.Contains(first, tc.want) {
				t.Errorf("first stderr line %q does not contain %q", first, tc.want)
			}
			if tc.code == 1 && strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
				t.Errorf("the error takes more than one line:\n%s", r.stderr)
			}
			if r.stdout != "" {
				t.Errorf("a failed command wrote to stdout: %q", r.stdout)
			}
		})
	}
}

// TestWatchEndsCleanlyOnInterrupt: --watch prints the fleet again and again, and Ctrl-C ends it
// with exit 0.
func TestWatchEndsCleanlyOnInterrupt(t *testing.T) {
	bin := setup(t)
	cmd := exec.Command(bin, "--kubeconfig", cp.KubeconfigPath(), "status", "--watch", "--interval", "200ms")
	cmd.Env = append(os.Environ(), "NO_COLOR=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	tables := make(chan int, 16)
	go func() {
		sc := bufio.NewScanner(out)
		n := 0
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "NAME ") {
				n++
				tables <- n
			}
		}
		close(tables)
	}()
	deadline := time.After(30 * time.Second)
	for seen := 0; seen < 2; {
		select {
		case n, ok := <-tables:
			if !ok {
				t.Fatalf("watch ended after %d tables: %s", seen, stderr.String())
			}
			seen = n
		case <-deadline:
			t.Fatalf("watch printed %d tables in 30s, want 2", seen)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	go func() {
		for range tables {
		}
	}()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("watch after SIGINT: %v (want exit 0); stderr %s", err, stderr.String())
	}
}

// saKubeconfig is a kubeconfig of a ServiceAccount that may read the remediator's ConfigMap and
// nothing else: every other read the plugin makes is forbidden.
func saKubeconfig(t *testing.T, dir string) string {
	t.Helper()
	ctx := context.Background()
	c, err := cp.Client()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := cp.ServiceAccountConfig(ctx, "nodevigil-system", "no-nodes", controlplane.TokenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: "nodevigil-system", Name: "read-config"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get"}}}}
	if _, err := c.RbacV1().Roles("nodevigil-system").Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "nodevigil-system", Name: "read-config"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "read-config"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "nodevigil-system", Name: "no-nodes"}}}
	if _, err := c.RbacV1().RoleBindings("nodevigil-system").Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return writeKubeconfig(t, dir, "no-nodes", cfg.Host, cfg.BearerToken, cfg.CAData)
}

func writeKubeconfig(t *testing.T, dir, name, server, token string, ca []byte) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca, InsecureSkipTLSVerify: ca == nil}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	path := filepath.Join(dir, name+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestNodesOutsideTheScopeAreNotJudged: with a remediator scoped to the kafka pool (its
// ConfigMap in a namespace of its own), status shows only kafka nodes and says how many it
// left out, and explain of a general node says the remediator does not look after it instead
// of judging it under the built-in policy.
func TestNodesOutsideTheScopeAreNotJudged(t *testing.T) {
	setup(t)
	c, err := cp.Client()
	if err != nil {
		t.Fatal(err)
	}
	const ns = "scoped"
	if _, err := c.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "nodevigil-remediator", Namespace: ns}, Data: map[string]string{
		"remediator.yaml": "apiVersion: nodevigil.io/v1alpha1\nkind: RemediatorConfig\nagentNamespace: nodevigil-system\nnodeSelector: karpenter.sh/nodepool=kafka\n",
	}}
	if _, err := c.CoreV1().ConfigMaps(ns).Create(t.Context(), cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}

	r := runPlugin(t, cp.KubeconfigPath(), "-n", ns, "status", "-o", "json")
	if r.code != 0 {
		t.Fatalf("status exit %d: %s", r.code, r.stderr)
	}
	var shown []string
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	for dec.More() {
		var row struct {
			Name string `json:"name"`
			Pool string `json:"pool"`
		}
		if err := dec.Decode(&row); err != nil {
			t.Fatalf("decode status -o json: %v\n%s", err, r.stdout)
		}
		shown = append(shown, row.Name)
		if !strings.HasPrefix(row.Name, "kafka-") {
			t.Errorf("status shows %s (pool %s), outside the scope karpenter.sh/nodepool=kafka", row.Name, row.Pool)
		}
	}
	if len(shown) == 0 {
		t.Errorf("status shows no node; the kafka nodes are in scope:\n%s", r.stdout)
	}
	if !strings.Contains(r.stderr, "outside the remediator's nodeSelector (karpenter.sh/nodepool=kafka) are not shown") {
		t.Errorf("status does not say that it left nodes out; stderr:\n%s", r.stderr)
	}

	r = runPlugin(t, cp.KubeconfigPath(), "-n", ns, "explain", "general-a-2")
	if r.code != 0 {
		t.Fatalf("explain exit %d: %s", r.code, r.stderr)
	}
	if want := "Node general-a-2 is outside the remediator's nodeSelector (karpenter.sh/nodepool=kafka)"; !strings.Contains(r.stdout, want) {
		t.Errorf("explain of a node outside the scope: want %q, got:\n%s", want, r.stdout)
	}
}
