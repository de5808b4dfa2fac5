package install_test

import (
	"bytes"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/nodevigil/nodevigil/integration/tools"
)

const chartRelPath = "../../manifests/charts/nodevigil"

// helmBinary returns the pinned helm (integration/tools: $HELM, else the project's cache,
// else `go install`ed into it once).
func helmBinary(t *testing.T) string {
	t.Helper()
	p, err := tools.Helm.Path(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// helm runs helm with a private configuration (no repositories, no registry logins) and
// returns its combined output.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin := helmBinary(t)
	home := t.TempDir()
	cmd := exec.CommandContext(t.Context(), bin, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
		"HELM_REGISTRY_CONFIG="+filepath.Join(home, "registry.json"),
	)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// template renders the chart with --set values, as render.sh does.
func template(t *testing.T, sets ...string) (string, error) {
	args := []string{"template", "nodevigil", chartRelPath, "--namespace", namespace, "--kube-version", "1.31.0"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	return helm(t, args...)
}

// TestChartRefusesBadValues renders the chart with values a user could get wrong and checks
// that rendering fails with a message naming the value, and that the corrected values render.
func TestChartRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		sets []string
		want string // "" means rendering must succeed
	}{
		{"defaults", nil, ""},
		{"typo at top level", []string{"agent.tolerationz[0].operator=Exists"}, "at '/agent': additional properties 'tolerationz' not allowed"},
		{"typo nested", []string{"remediator.podDisruptionBudget.minAvaliable=1"}, "at '/remediator/podDisruptionBudget': additional properties 'minAvaliable' not allowed"},
		{"wrong type", []string{"remediator.replicas=two"}, "at '/remediator/replicas': got string, want integer"},
		{"live without cluster name", []string{"remediator.dryRun=false"}, "remediator.clusterName is empty but remediator.dryRun is false"},
		{"live with cluster name", []string{"remediator.dryRun=false", "remediator.clusterName=prod"}, ""},
		{"live with an opt-in tag instead of a cluster name", []string{"remediator.dryRun=false", "remediator.ownershipTag.key=nodevigil.io/remediate"}, ""},
		{"ownership tag key with a space", []string{"remediator.ownershipTag.key=my tag"}, "at '/remediator/ownershipTag/key'"},
		{"agent bound to loopback", []string{"agent.listenHost=127.0.0.1"}, "at '/agent/listenHost': value must be one of"},
		{"agent bound to the node's IP", []string{"agent.listenHost=hostIP"}, ""},
		{"node.kubernetes.io taint", []string{"agent.ownedTaints[0]=node.kubernetes.io/not-ready"}, `"node.kubernetes.io/not-ready" is a Kubernetes system taint`},
		{"cloud provider taint", []string{"agent.ownedTaints[0]=node.cloudprovider.kubernetes.io/uninitialized"}, "is a Kubernetes system taint"},
		{"node-role taint", []string{"agent.ownedTaints[0]=node-role.kubernetes.io/control-plane"}, "is a Kubernetes system taint"},
		{"karpenter taint", []string{"agent.ownedTaints[0]=karpenter.sh/disrupted"}, "belongs to another component"},
		{"remediator taint", []string{"agent.ownedTaints[0]=nodevigil.io/remediating"}, "belongs to another component"},
		{"own readiness taint", []string{"agent.ownedTaints[0]=readiness.k8s.io/example"}, ""},
		{"own domain taint", []string{"agent.ownedTaints[0]=example.com/not-ready"}, ""},
		{"Ready condition", []string{"agent.conditionTypes[0]=Ready"}, `"Ready" is a built-in Node condition`},
		{"MemoryPressure condition", []string{"agent.conditionTypes={KubeletHealthy,MemoryPressure}"}, `"MemoryPressure" is a built-in Node condition`},
		{"both PDB fields", []string{"remediator.podDisruptionBudget.minAvailable=1"}, "set maxUnavailable or minAvailable, not both"},
		{"PDB minAvailable alone", []string{"remediator.podDisruptionBudget.minAvailable=1", "remediator.podDisruptionBudget.maxUnavailable=null"}, ""},
		{"memory limit GOMEMLIMIT cannot parse", []string{"remediator.resources.limits.memory=0.5Gi"}, "remediator.resources.limits.memory \"0.5Gi\""},
		{"bad digest", []string{"agent.image.digest=sha256:abc"}, "at '/agent/image/digest'"},
		{"unknown CNI preset", []string{"agent.cniPreset=weave"}, "at '/agent/cniPreset'"},
		{"CNI preset", []string{"agent.cniPreset=cilium"}, ""},
		{"CNI preset in agent.config", []string{"agent.config.cniPreset=cilium"}, "agent.config.cniPreset is set by the chart"},
		{"kubelet unit without .service", []string{"agent.kubeletUnit=kubelet"}, "at '/agent/kubeletUnit'"},
		{"missing taint unhealthy", []string{"agent.missingOwnedTaintIsUnhealthy=true"}, ""},
		{"host path created on the host", []string{"agent.hostPaths[0].path=/etc/eks", "agent.hostPaths[0].type=DirectoryOrCreate"}, "at '/agent/hostPaths/0/type'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := template(t, tc.sets...)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("helm template %v: %v\n%s", tc.sets, err, out)
				}
				return
			}
			if err == nil {
				t.Fatalf("helm template %v rendered; want a failure saying %q", tc.sets, tc.want)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("helm template %v failed, but without %q:\n%s", tc.sets, tc.want, out)
			}
		})
	}
}

// TestChartGOMEMLIMIT checks the soft memory limit is 90 % of each container's memory limit.
func TestChartGOMEMLIMIT(t *testing.T) {
	out, err := template(t, "agent.resources.limits.memory=100Mi", "agent.resources.requests.memory=100Mi", "remediator.resources.limits.memory=1Gi")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	// The agent must stay Guaranteed QoS: a limit without the same request is refused.
	if bad, err := template(t, "agent.resources.limits.memory=100Mi"); err == nil || !strings.Contains(bad, "Guaranteed QoS") {
		t.Errorf("agent limit without an equal request should fail naming Guaranteed QoS; err=%v\n%s", err, bad)
	}
	for _, want := range []string{
		"name: GOMEMLIMIT\n              value: \"94371840\"",  // 90 % of 100Mi
		"name: GOMEMLIMIT\n              value: \"966367641\"", // 90 % of 1Gi
	} {
		if !strings.Contains(out, want) {
			t.Errorf("rendered chart lacks %q", want)
		}
	}
}

// TestChartFromOCIRegistry packages the chart as `make chart` does, pushes it to an OCI
// registry (go-containerregistry's, in process, plain HTTP) with helm, and installs it from
// there with a server-side dry run against the real API server: every object passes the API
// server's validation and admission. Images are pinned by digest for one component and follow
// appVersion for the other; NOTES warn loudly when the admission policy is turned off.
func TestChartFromOCIRegistry(t *testing.T) {
	ctx := t.Context()
	const appVersion = "v9.8.7-charttest"
	pkgDir := t.TempDir()
	pkg := exec.CommandContext(ctx, "bash", "../../manifests/package.sh", appVersion, "0.1.0-test", pkgDir)
	pkg.Env = append(os.Environ(), "HELM="+helmBinary(t))
	if out, err := pkg.CombinedOutput(); err != nil {
		t.Fatalf("package.sh: %v\n%s", err, out)
	}
	tgz := filepath.Join(pkgDir, "nodevigil-0.1.0-test.tgz")
	if _, err := os.Stat(tgz); err != nil {
		t.Fatalf("package.sh did not write %s: %v", tgz, err)
	}

	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	repo := "oci://" + strings.TrimPrefix(srv.URL, "http://") + "/charts"
	if out, err := helm(t, "push", tgz, repo, "--plain-http"); err != nil {
		t.Fatalf("helm push: %v\n%s", err, out)
	}

	ns, err := cp.Namespace(ctx, "helm")
	if err != nil {
		t.Fatal(err)
	}
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	install := func(sets ...string) string {
		t.Helper()
		args := []string{"install", "nv", repo + "/nodevigil", "--version", "0.1.0-test", "--plain-http",
			"--namespace", ns, "--kubeconfig", cp.KubeconfigPath(), "--dry-run=server"}
		for _, s := range sets {
			args = append(args, "--set", s)
		}
		out, err := helm(t, args...)
		if err != nil {
			t.Fatalf("helm install from %s: %v\n%s", repo, err, out)
		}
		return out
	}

	out := install("agent.image.digest=" + digest)
	for _, want := range []string{
		"helm.sh/chart: nodevigil-0.1.0-test", `app.kubernetes.io/version: "` + appVersion + `"`,
		`image: "ghcr.io/nodevigil/nodevigil-agent@` + digest + `"`,
		`image: "ghcr.io/nodevigil/nodevigil-remediator:` + appVersion + `"`,
		"kind: DaemonSet", "kind: ValidatingAdmissionPolicy",
		"DRY-RUN mode",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("helm install output lacks %q", want)
		}
	}
	if strings.Contains(out, "WARNING: admissionPolicy.enabled=false") {
		t.Error("NOTES warn about a disabled admission policy although it is enabled")
	}

	out = install("admissionPolicy.enabled=false")
	if !strings.Contains(out, "WARNING: admissionPolicy.enabled=false") || !strings.Contains(out, "patch EVERY Node") {
		t.Errorf("NOTES do not warn when the admission policy is off:\n%s", out)
	}
	if strings.Contains(out, "kind: ValidatingAdmissionPolicy") {
		t.Error("admissionPolicy.enabled=false still renders a ValidatingAdmissionPolicy")
	}
}

// TestAgentListenHost checks agent.listenHost: by default the agent binds every address of the
// node; hostIP binds the node's primary IP, which the kubelet substitutes from the downward
// API (status.hostIP) into --listen-address.
func TestAgentListenHost(t *testing.T) {
	tests := []struct {
		sets     []string
		wantArg  string
		wantHost bool
	}{
		{nil, "--listen-address=:9736", false},
		{[]string{"agent.listenHost=hostIP"}, "--listen-address=$(HOST_IP):9736", true},
		{[]string{"agent.listenHost=0.0.0.0", "agent.listenPort=9100"}, "--listen-address=0.0.0.0:9100", false},
	}
	for _, tt := range tests {
		ds := findObject(t, renderedObjects(t, tt.sets...), "DaemonSet")
		containers, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
		c := containers[0].(map[string]any)
		args, _, _ := unstructured.NestedStringSlice(c, "args")
		if !slices.Contains(args, tt.wantArg) {
			t.Errorf("%v: agent args %v lack %s", tt.sets, args, tt.wantArg)
		}
		env, _, _ := unstructured.NestedSlice(c, "env")
		hostIP := false
		for _, e := range env {
			if e.(map[string]any)["name"] == "HOST_IP" {
				path, _, _ := unstructured.NestedString(e.(map[string]any), "valueFrom", "fieldRef", "fieldPath")
				hostIP = path == "status.hostIP"
			}
		}
		if hostIP != tt.wantHost {
			t.Errorf("%v: HOST_IP from status.hostIP in env = %v, want %v", tt.sets, hostIP, tt.wantHost)
		}
	}
}

// TestOwnershipTag checks how remediator.clusterName and remediator.ownershipTag become the
// remediator's --cluster-tag-key and --cluster-tag-values.
func TestOwnershipTag(t *testing.T) {
	tests := []struct {
		sets []string
		want []string
		not  []string
	}{
		{[]string{"remediator.clusterName=prod"}, []string{"--cluster-tag-key=kubernetes.io/cluster/prod"}, []string{"--cluster-tag-values"}},
		{[]string{"remediator.clusterName=prod", "remediator.ownershipTag.key=nodevigil.io/remediate", "remediator.ownershipTag.values={yes,on}"},
			[]string{"--cluster-tag-key=nodevigil.io/remediate", "--cluster-tag-values=yes,on"}, nil},
		{nil, nil, []string{"--cluster-tag-key", "--cluster-tag-values"}},
	}
	for _, tt := range tests {
		d := findObject(t, renderedObjects(t, tt.sets...), "Deployment")
		containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
		args, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
		for _, w := range tt.want {
			if !slices.Contains(args, w) {
				t.Errorf("%v: remediator args %v lack %s", tt.sets, args, w)
			}
		}
		for _, n := range tt.not {
			for _, a := range args {
				if strings.HasPrefix(a, n) {
					t.Errorf("%v: remediator args have %s", tt.sets, a)
				}
			}
		}
	}
}
