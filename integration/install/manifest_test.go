package install_test

import (
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nodevigil/nodevigil/agent/conditions"
	agentconfig "github.com/nodevigil/nodevigil/agent/config"
)

// find converts the manifest's only object of kind and name into out.
func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string, out any) {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, out, true); err != nil {
				t.Fatalf("%s %s does not decode strictly: %v", kind, name, err)
			}
			return
		}
	}
	t.Fatalf("install.yaml has no %s %s", kind, name)
}

func argValue(args []string, flag string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v, true
		}
	}
	return "", false
}

func policyVariable(t *testing.T, p *admissionv1.ValidatingAdmissionPolicy, name string) []string {
	t.Helper()
	for _, v := range p.Spec.Variables {
		if v.Name == name {
			var out []string
			if err := json.Unmarshal([]byte(v.Expression), &out); err != nil {
				t.Fatalf("policy %s variable %s = %q is not a list of strings: %v", p.Name, name, v.Expression, err)
			}
			return out
		}
	}
	t.Fatalf("policy %s has no variable %s", p.Name, name)
	return nil
}

// TestAgentDaemonSetShape checks the promises of the agent's pod spec that no API server
// enforces: it runs everywhere, mounts only what the checks read and only read-only, holds no
// capability, and its flags agree with the admission policy and the agent binary.
func TestAgentDaemonSetShape(t *testing.T) {
	objs := manifestObjects(t)
	var ds appsv1.DaemonSet
	find(t, objs, "DaemonSet", "nodevigil-agent", &ds)
	spec := ds.Spec.Template.Spec

	if !slices.ContainsFunc(spec.Tolerations, func(tol corev1.Toleration) bool {
		return tol.Key == "" && tol.Operator == corev1.TolerationOpExists && tol.Effect == ""
	}) {
		t.Errorf("agent does not tolerate every taint (want operator Exists without key and effect): %+v", spec.Tolerations)
	}
	if spec.NodeSelector["kubernetes.io/os"] != "linux" {
		t.Errorf("nodeSelector = %v, want kubernetes.io/os=linux", spec.NodeSelector)
	}
	if !skipsFargate(spec.Affinity) {
		t.Errorf("affinity = %+v, want a required node affinity eks.amazonaws.com/compute-type NotIn [fargate]", spec.Affinity)
	}
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName = %q, want system-node-critical", spec.PriorityClassName)
	}
	if !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("hostNetwork=%v dnsPolicy=%q, want true and ClusterFirstWithHostNet", spec.HostNetwork, spec.DNSPolicy)
	}
	if spec.HostPID || spec.HostIPC {
		t.Errorf("agent shares the host's PID or IPC namespace; it needs neither")
	}
	if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru == nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.String() != "10%" {
		t.Errorf("rollingUpdate = %+v, want maxUnavailable 10%%", ds.Spec.UpdateStrategy.RollingUpdate)
	}
	if sc := spec.SecurityContext; sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod seccompProfile is not RuntimeDefault: %+v", spec.SecurityContext)
	}

	hostPaths := map[string]string{} // volume name → host path
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	var paths []string
	for _, p := range hostPaths {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	wantPaths := []string{"/etc/cni/net.d", "/etc/eks/kubelet", "/etc/kubernetes/kubelet", "/etc/os-release", "/etc/systemd/system",
		"/opt/cni/bin", "/proc", "/run/dbus", "/sys/fs/cgroup", "/usr/lib/systemd/system", "/var/run/aws-node"}
	if !slices.Equal(paths, wantPaths) {
		t.Errorf("host paths = %v, want exactly %v", paths, wantPaths)
	}

	// Read-only host paths must not be created on the host by the kubelet: no ...OrCreate
	// type except the CNI directories, which the agent must see appear at boot.
	for _, v := range spec.Volumes {
		if v.HostPath == nil || v.HostPath.Type == nil {
			continue
		}
		switch ty := *v.HostPath.Type; ty {
		case corev1.HostPathDirectoryOrCreate, corev1.HostPathFileOrCreate:
			if v.HostPath.Path != "/etc/cni/net.d" && v.HostPath.Path != "/opt/cni/bin" && v.HostPath.Path != "/run/dbus" {
				t.Errorf("host path %s has type %s: a read-only mount must not create it on the host", v.HostPath.Path, ty)
			}
		}
	}

	if len(spec.Containers) != 1 {
		t.Fatalf("agent pod has %d containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	for _, m := range c.VolumeMounts {
		host, ok := hostPaths[m.Name]
		if !ok {
			continue
		}
		if !m.ReadOnly {
			t.Errorf("host path %s is mounted writable at %s", host, m.MountPath)
		}
		if m.MountPath != "/host"+host {
			t.Errorf("host path %s is mounted at %s, want /host%s (the agent runs with --host-root=/host)", host, m.MountPath, host)
		}
	}
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Fatal("agent container has no securityContext")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("agent root filesystem is writable")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("agent may escalate privileges")
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		t.Errorf("agent capabilities = %+v, want drop ALL and add none", sc.Capabilities)
	case sc.Privileged != nil && *sc.Privileged:
		t.Error("agent is privileged")
	case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0:
		t.Errorf("agent runs as root by default (runAsNonRoot=%v runAsUser=%v); only kubeletRepair needs uid 0", sc.RunAsNonRoot, sc.RunAsUser)
	}

	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	for name, field := range map[string]string{"NODE_NAME": "spec.nodeName", "POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"} {
		if env[name] != field {
			t.Errorf("env %s comes from %q, want the downward API field %s", name, env[name], field)
		}
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("liveness probe = %+v, want GET /healthz", c.LivenessProbe)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe = %+v, want GET /readyz", c.ReadinessProbe)
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "metrics" && p.ContainerPort == 9736 }) {
		t.Errorf("ports = %+v, want metrics on 9736", c.Ports)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources = %+v, want cpu and memory requests and a memory limit", c.Resources)
	}
	if c.Args[0] != "run" {
		t.Errorf("first argument %q, want the run subcommand", c.Args[0])
	}
	if v, _ := argValue(c.Args, "--host-root"); v != "/host" {
		t.Errorf("--host-root = %q, want /host", v)
	}

	// One source for the owned taints: the flag, the policy and the agent's default agree.
	owned, ok := argValue(c.Args, "--owned-taints")
	if !ok {
		t.Fatal("agent has no --owned-taints flag")
	}
	var policy admissionv1.ValidatingAdmissionPolicy
	find(t, objs, "ValidatingAdmissionPolicy", nodePolicy, &policy)
	if got := policyVariable(t, &policy, "ownedTaints"); strings.Join(got, ",") != owned {
		t.Errorf("policy ownedTaints %v disagree with the agent's --owned-taints=%s", got, owned)
	}
	if owned != agentconfig.DefaultOwnedTaint {
		t.Errorf("--owned-taints=%s, want the agent's default %s", owned, agentconfig.DefaultOwnedTaint)
	}
	var types []string
	for _, ty := range conditions.OwnedTypes() {
		types = append(types, string(ty))
	}
	got := policyVariable(t, &policy, "ownedConditions")
	sort.Strings(got)
	if !slices.Equal(got, types) {
		t.Errorf("policy ownedConditions %v, but the agent writes %v", got, types)
	}
}

// TestRemediatorShape checks the remediator's Deployment, PodDisruptionBudget and
// configuration.
func TestRemediatorShape(t *testing.T) {
	objs := manifestObjects(t)
	var d appsv1.Deployment
	find(t, objs, "Deployment", "nodevigil-remediator", &d)
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas = %v, want 2", d.Spec.Replicas)
	}
	spec := d.Spec.Template.Spec
	if psc := spec.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Error("remediator does not set runAsNonRoot")
	}
	c := spec.Containers[0]
	if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("remediator container securityContext = %+v, want read-only root, no escalation, drop ALL", sc)
	}
	if v, _ := argValue(c.Args, "--dry-run"); v != "true" {
		t.Errorf("--dry-run=%q, want true in the shipped manifest", v)
	}
	if v, _ := argValue(c.Args, "--leader-elect"); v != "true" {
		t.Errorf("--leader-elect=%q, want true with 2 replicas", v)
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("probes = %+v / %+v, want /healthz and /readyz", c.LivenessProbe, c.ReadinessProbe)
	}
	var keys []string
	for _, tsc := range spec.TopologySpreadConstraints {
		keys = append(keys, tsc.TopologyKey)
	}
	if !slices.Contains(keys, "topology.kubernetes.io/zone") || !slices.Contains(keys, "kubernetes.io/hostname") {
		t.Errorf("topology spread keys = %v, want zone and hostname", keys)
	}

	if spec.PriorityClassName != "system-cluster-critical" {
		t.Errorf("priorityClassName = %q, want system-cluster-critical", spec.PriorityClassName)
	}
	for _, key := range []string{"node.kubernetes.io/memory-pressure", "node.kubernetes.io/disk-pressure", "node.kubernetes.io/pid-pressure", "nodevigil.io/remediating"} {
		if !slices.ContainsFunc(spec.Tolerations, func(tol corev1.Toleration) bool {
			return tol.Key == key && tol.Operator == corev1.TolerationOpExists && tol.Effect == corev1.TaintEffectNoSchedule
		}) {
			t.Errorf("remediator does not tolerate %s:NoSchedule: %+v", key, spec.Tolerations)
		}
	}
	if spec.NodeSelector["kubernetes.io/os"] != "linux" {
		t.Errorf("nodeSelector = %v, want kubernetes.io/os=linux", spec.NodeSelector)
	}
	if got := envValue(c.Env, "GOMEMLIMIT"); got != "483183820" { // 90 % of 512Mi
		t.Errorf("GOMEMLIMIT = %q, want 483183820 (90 %% of the 512Mi limit)", got)
	}

	var pdb policyv1.PodDisruptionBudget
	find(t, objs, "PodDisruptionBudget", "nodevigil-remediator", &pdb)
	// minAvailable 1 would block the drain of the node of the only ready replica.
	if pdb.Spec.MinAvailable != nil || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PDB minAvailable = %v maxUnavailable = %v, want only maxUnavailable 1", pdb.Spec.MinAvailable, pdb.Spec.MaxUnavailable)
	}
	if p := pdb.Spec.UnhealthyPodEvictionPolicy; p == nil || *p != policyv1.AlwaysAllow {
		t.Errorf("PDB unhealthyPodEvictionPolicy = %v, want AlwaysAllow", p)
	}
	for k, v := range pdb.Spec.Selector.MatchLabels {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("PDB selector %s=%s does not select the remediator pods", k, v)
		}
	}

	var cm corev1.ConfigMap
	find(t, objs, "ConfigMap", "nodevigil-remediator", &cm)
	file := cm.Data["remediator.yaml"]
	for _, want := range []string{"apiVersion: nodevigil.io/v1alpha1", "kind: RemediatorConfig", "agentNamespace: " + namespace} {
		if !strings.Contains(file, want) {
			t.Errorf("remediator config lacks %q:\n%s", want, file)
		}
	}
	if strings.Contains(file, "dryRun") {
		t.Errorf("remediator config sets dryRun; --dry-run is meant to be the one switch:\n%s", file)
	}
}

// TestRBACHasNoWildcardsOrSecrets checks every rule in the manifest.
func TestRBACHasNoWildcardsOrSecrets(t *testing.T) {
	objs := manifestObjects(t)
	n := 0
	for _, o := range objs {
		var rules []rbacv1.PolicyRule
		switch o.GetKind() {
		case "ClusterRole":
			var r rbacv1.ClusterRole
			find(t, []*unstructured.Unstructured{o}, o.GetKind(), o.GetName(), &r)
			rules = r.Rules
		case "Role":
			var r rbacv1.Role
			find(t, []*unstructured.Unstructured{o}, o.GetKind(), o.GetName(), &r)
			rules = r.Rules
		default:
			continue
		}
		for _, r := range rules {
			n++
			for _, field := range [][]string{r.Verbs, r.Resources, r.APIGroups, r.ResourceNames} {
				if slices.Contains(field, "*") {
					t.Errorf("%s has a wildcard rule: %+v", describe(o), r)
				}
			}
			if slices.Contains(r.Resources, "secrets") || slices.Contains(r.Verbs, "escalate") ||
				slices.Contains(r.Verbs, "bind") || slices.Contains(r.Verbs, "impersonate") {
				t.Errorf("%s grants %+v", describe(o), r)
			}
			// The one non-resource rule: the metrics-reader ClusterRole, bound to nobody by the
			// chart, lets a scraper get the remediator's /metrics (remediation/metricsauth).
			readsMetrics := o.GetKind() == "ClusterRole" && o.GetName() == "nodevigil-metrics-reader" &&
				slices.Equal(r.NonResourceURLs, []string{"/metrics"}) && slices.Equal(r.Verbs, []string{"get"})
			if len(r.NonResourceURLs) > 0 && !readsMetrics {
				t.Errorf("%s grants non-resource URLs %v", describe(o), r.NonResourceURLs)
			}
		}
	}
	if n == 0 {
		t.Fatal("no RBAC rules found in install.yaml")
	}
}

func envValue(env []corev1.EnvVar, name string) string {
	for _, e := range env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// skipsFargate reports whether aff requires eks.amazonaws.com/compute-type NotIn [fargate] in
// every node selector term.
func skipsFargate(aff *corev1.Affinity) bool {
	if aff == nil || aff.NodeAffinity == nil || aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return false
	}
	terms := aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) == 0 {
		return false
	}
	for _, term := range terms {
		if !slices.ContainsFunc(term.MatchExpressions, func(r corev1.NodeSelectorRequirement) bool {
			return r.Key == "eks.amazonaws.com/compute-type" && r.Operator == corev1.NodeSelectorOpNotIn && slices.Equal(r.Values, []string{"fargate"})
		}) {
			return false
		}
	}
	return true
}

// TestAdmissionPoliciesComeFirst checks install.yaml's order: `kubectl apply -f` creates objects
// in file order, and the agent must never run before the policies that confine it exist.
func TestAdmissionPoliciesComeFirst(t *testing.T) {
	objs := manifestObjects(t)
	lastPolicy, firstWorkload, policies := -1, len(objs), 0
	for i, o := range objs {
		switch o.GetKind() {
		case "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			lastPolicy = i
			policies++
		case "DaemonSet", "Deployment", "ServiceAccount", "ClusterRoleBinding", "RoleBinding":
			firstWorkload = min(firstWorkload, i)
		}
	}
	if policies == 0 {
		t.Fatal("install.yaml has no admission policies")
	}
	if lastPolicy > firstWorkload {
		t.Errorf("install.yaml applies %s (document %d) before the last admission policy (document %d); render.sh must put the policies first",
			describe(objs[firstWorkload]), firstWorkload+1, lastPolicy+1)
	}
}
