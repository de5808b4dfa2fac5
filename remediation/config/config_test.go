package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestDefault(t *testing.T) {
	c := Default()
	if c == nil {
		t.Fatal("Default() = nil: the built-in defaults do not validate")
	}
	if !c.DryRun {
		t.Error("DryRun = false, want true: acting must be chosen explicitly")
	}
	if c.AgentNamespace != DefaultAgentNamespace || c.AgentLeaseDuration != DefaultAgentLeaseDuration {
		t.Errorf("agent = %s/%s, want %s/%s", c.AgentNamespace, c.AgentLeaseDuration, DefaultAgentNamespace, DefaultAgentLeaseDuration)
	}
	if len(c.Policies) != 1 || c.Policies[0].Name != DefaultPolicyName {
		t.Fatalf("policies = %+v, want only the default", c.Policies)
	}
	p := c.Policies[0]
	want := Policy{
		Action:          ActionTerminate,
		StartupGrace:    10 * time.Minute,
		StartupDeadline: 20 * time.Minute,
		MaxInFlight:     1,
		Drain:           Drain{Enabled: true, Timeout: 10 * time.Minute, HonorDoNotDisrupt: true, OnTimeout: OnTimeoutProceed},
	}
	if p.Action != want.Action || p.StartupGrace != want.StartupGrace || p.StartupDeadline != want.StartupDeadline ||
		p.MaxInFlight != want.MaxInFlight || p.Drain != want.Drain {
		t.Errorf("default policy = %+v, want %+v", p, want)
	}
	if p.Liveness != LivenessTwoSignal {
		t.Errorf("default liveness = %q, want TwoSignal: single-signal remediation must be chosen", p.Liveness)
	}
	if p.Tolerations.SilentNode != 3*time.Minute || p.Tolerations.KubeletUnhealthy != 5*time.Minute || p.Tolerations.SingleSignal != 30*time.Minute || p.Tolerations.ScheduledReboot != 20*time.Minute || len(p.Tolerations.Conditions) != 0 {
		t.Errorf("default tolerations = %+v", p.Tolerations)
	}
	if p.MaxUnhealthy.String() != "20%" {
		t.Errorf("default maxUnhealthy = %s, want 20%%", p.MaxUnhealthy.String())
	}
	if c.NodeSelector != "" || !c.Scope.Empty() {
		t.Errorf("default scope = %q (%v), want every node", c.NodeSelector, c.Scope)
	}
	if got := c.PolicyFor(map[string]string{"anything": "x"}); got.Name != DefaultPolicyName {
		t.Errorf("PolicyFor = %s, want default", got.Name)
	}
}

func TestLoadFull(t *testing.T) {
	c, err := Load(filepath.Join("testdata", "full.yaml"))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if c.DryRun || c.AgentNamespace != "nodevigil" || c.AgentLeaseDuration != 30*time.Second {
		t.Errorf("globals = %v %s %s", c.DryRun, c.AgentNamespace, c.AgentLeaseDuration)
	}
	if c.TerminationRateLimit != (RateLimit{PerMinute: 12, Burst: 4}) {
		t.Errorf("rate limit = %+v", c.TerminationRateLimit)
	}
	if c.ZonePauseThreshold.String() != "40%" || c.ClusterPauseThreshold != intstr.FromInt32(5) {
		t.Errorf("thresholds = %s %s", c.ZonePauseThreshold.String(), c.ClusterPauseThreshold.String())
	}
	if c.PoolLabel != "eks.amazonaws.com/nodegroup" {
		t.Errorf("poolLabel = %q", c.PoolLabel)
	}
	if c.NodeSelector != "eks.amazonaws.com/compute-type!=fargate" {
		t.Errorf("nodeSelector = %q", c.NodeSelector)
	}
	if c.Scope.Matches(labels.Set{"eks.amazonaws.com/compute-type": "fargate"}) || !c.Scope.Matches(labels.Set{}) {
		t.Errorf("scope %s: a Fargate node must be out of it and an EC2 node in it", c.Scope)
	}
	if got := c.PoolOf(&c.Policies[1], map[string]string{"eks.amazonaws.com/nodegroup": "spot"}); got != "general/spot" {
		t.Errorf("PoolOf with the label = %q, want general/spot", got)
	}
	if got := c.PoolOf(&c.Policies[1], nil); got != "general" {
		t.Errorf("PoolOf without the label = %q, want the policy name", got)
	}
	if len(c.Policies) != 4 {
		t.Fatalf("got %d policies, want 3 + default", len(c.Policies))
	}
	g := c.Policies[1]
	if g.Name != "general" || g.Action != ActionTerminate || g.Tolerations.SilentNode != 2*time.Minute ||
		g.Tolerations.KubeletUnhealthy != 4*time.Minute || g.Tolerations.ScheduledReboot != 30*time.Minute || g.Tolerations.Conditions["NetworkingReady"] != 10*time.Minute ||
		g.Tolerations.Conditions["MemoryHealthy"] != 15*time.Minute || g.StartupGrace != 5*time.Minute ||
		g.StartupDeadline != 15*time.Minute || g.MaxInFlight != 3 || g.MaxUnhealthy.String() != "25%" ||
		g.Drain != (Drain{Enabled: true, Timeout: 7 * time.Minute, HonorDoNotDisrupt: false, OnTimeout: OnTimeoutWait}) ||
		len(g.StartupTaints) != 1 || g.StartupTaints[0] != "node.cilium.io/agent-not-ready" {
		t.Errorf("general policy = %+v", g)
	}
	k := c.Policies[0]
	if k.Action != ActionCordonOnly || k.MaxUnhealthy != intstr.FromInt32(1) || k.StartupTaints[0] != DefaultStartupTaint {
		t.Errorf("kafka policy = %+v", k)
	}

	tests := []struct {
		labels map[string]string
		want   string
	}{
		{map[string]string{"karpenter.sh/nodepool": "kafka"}, "kafka"},
		{map[string]string{"karpenter.sh/nodepool": "spot"}, "general"},
		{map[string]string{"karpenter.sh/nodepool": "spot", "gpu": "true"}, "rest"},
		{nil, "rest"},
	}
	for _, tt := range tests {
		if got := c.PolicyFor(tt.labels).Name; got != tt.want {
			t.Errorf("PolicyFor(%v) = %s, want %s", tt.labels, got, tt.want)
		}
	}
}

func TestLivenessSingleSignal(t *testing.T) {
	const head = "apiVersion: nodevigil.io/v1alpha1\nkind: RemediatorConfig\npolicies:\n- name: a\n  nodeSelector: x=y\n  liveness: SingleSignal\n"
	tests := []struct {
		name, extra string
		want        time.Duration
	}{
		{"default toleration", "", DefaultSingleSignal},
		{"explicit toleration", "  tolerations: {singleSignal: 45m}\n", 45 * time.Minute},
		{"the minimum", "  tolerations: {singleSignal: 10m}\n", MinSingleSignal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(head + tt.extra))
			if err != nil {
				t.Fatal(err)
			}
			p := c.Policies[0]
			if p.Liveness != LivenessSingleSignal || p.Tolerations.SingleSignal != tt.want {
				t.Errorf("liveness %q singleSignal %s, want SingleSignal %s", p.Liveness, p.Tolerations.SingleSignal, tt.want)
			}
		})
	}
	// An agent condition may have its own toleration: it is the agent's word alone, chosen.
	c, err := Parse([]byte("apiVersion: nodevigil.io/v1alpha1\nkind: RemediatorConfig\npolicies:\n- name: a\n  nodeSelector: x=y\n  tolerations: {conditions: {KubeletHealthy: 20m}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Policies[0].Tolerations.Conditions["KubeletHealthy"] != 20*time.Minute {
		t.Errorf("KubeletHealthy toleration = %v", c.Policies[0].Tolerations.Conditions)
	}
}

func TestLoadMinimalAndMissing(t *testing.T) {
	c, err := Load(filepath.Join("testdata", "minimal.yaml"))
	if err != nil {
		t.Fatalf("Load minimal: %v", err)
	}
	if !c.DryRun || len(c.Policies) != 1 {
		t.Errorf("minimal = dryRun %v, %d policies; want defaults", c.DryRun, len(c.Policies))
	}
	if c, err := Load(""); err != nil || c == nil || !c.DryRun {
		t.Errorf("Load(\"\") = %v, %v; want defaults", c, err)
	}
	if _, err := Load(filepath.Join("testdata", "does-not-exist.yaml")); err == nil {
		t.Error("Load of a missing file succeeded; a typo in --config must not fall back to defaults")
	}
}

func TestLoadBadFileNamesPath(t *testing.T) {
	_, err := Load(filepath.Join("testdata", "bad.yaml"))
	if err == nil {
		t.Fatal("Load(bad.yaml) succeeded")
	}
	want := `policies[1].maxUnhealthy: "120%" is above 100%`
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not contain %q", err, want)
	}
}

func TestParseErrors(t *testing.T) {
	const head = "apiVersion: nodevigil.io/v1alpha1\nkind: RemediatorConfig\n"
	tests := []struct {
		name string
		doc  string
		want []string // every string must appear in the error
	}{
		{"wrong apiVersion", "apiVersion: v1\nkind: RemediatorConfig\n", []string{`apiVersion: "v1" is not supported; set apiVersion: nodevigil.io/v1alpha1`}},
		{"wrong kind", "apiVersion: nodevigil.io/v1alpha1\nkind: AgentConfig\n", []string{`kind: "AgentConfig" is not supported`}},
		{"empty", "", []string{"empty document"}},
		{"not yaml", "a: [", []string{"not valid YAML"}},
		{"duplicate key", head + "dryRun: true\ndryRun: false\n", []string{"not valid YAML", "dryRun"}},
		{"bad node selector", head + "nodeSelector: \"pool in (a\"\n", []string{`nodeSelector: "pool in (a" is not a label selector`, "compute-type!=fargate"}},
		{"bad pool label", head + "poolLabel: \"not a/label/key\"\n", []string{`poolLabel: "not a/label/key" is not a label key`}},
		{"unknown top-level field", head + "dryrun: false\n", []string{"dryrun: unknown field; known fields here are", "dryRun"}},
		{"unknown nested field", head + "policies:\n- name: a\n  nodeSelector: x=y\n  tolerations:\n    silentnode: 1m\n", []string{"policies[0].tolerations.silentnode: unknown field"}},
		{"unknown drain field", head + "policies:\n- name: a\n  nodeSelector: x=y\n  drain: {timout: 1m}\n", []string{"policies[0].drain.timout: unknown field"}},
		{"bad duration", head + "policies:\n- name: a\n  nodeSelector: x=y\n  startupGrace: 10x\n", []string{`policies[0].startupGrace: "10x" is not a duration`}},
		{"number as duration", head + "agentLeaseDuration: 40\n", []string{"agentLeaseDuration: 40 is not a duration"}},
		{"bad condition duration", head + "policies:\n- name: a\n  nodeSelector: x=y\n  tolerations: {conditions: {NetworkingReady: soon}}\n", []string{`policies[0].tolerations.conditions.NetworkingReady: "soon" is not a duration`}},
		{"bool as string", head + "dryRun: \"yes please\"\n", []string{"dryRun: \"yes please\" is not a boolean"}},
		{"string list expected", head + "policies: {name: a}\n", []string{"policies: a mapping is not a list"}},
		{"percent above 100", head + "policies:\n- name: a\n  nodeSelector: x=y\n- name: b\n  nodeSelector: x=z\n  maxUnhealthy: 120%\n", []string{`policies[1].maxUnhealthy: "120%" is above 100%`}},
		{"zero max unhealthy", head + "policies:\n- name: a\n  nodeSelector: x=y\n  maxUnhealthy: 0\n", []string{"policies[0].maxUnhealthy: 0 must be at least 1"}},
		{"zero percent", head + "policies:\n- name: a\n  nodeSelector: x=y\n  maxUnhealthy: 0%\n", []string{`policies[0].maxUnhealthy: "0%" must be at least 1%`}},
		{"word as cap", head + "policies:\n- name: a\n  nodeSelector: x=y\n  maxUnhealthy: many\n", []string{`policies[0].maxUnhealthy: "many" is neither a count nor a percentage`}},
		{"fraction as cap", head + "zonePauseThreshold: 1.5\n", []string{"zonePauseThreshold: 1.5 is not a whole number"}},
		{"zone threshold above 100", head + "zonePauseThreshold: 101%\n", []string{`zonePauseThreshold: "101%" is above 100%`}},
		{"cluster threshold zero", head + "clusterPauseThreshold: 0\n", []string{"clusterPauseThreshold: 0 must be at least 1"}},
		{"bad action", head + "policies:\n- name: a\n  nodeSelector: x=y\n  action: Delete\n", []string{`policies[0].action: "Delete" is not an action; use Terminate, CordonOnly or None`}},
		{"bad onTimeout", head + "policies:\n- name: a\n  nodeSelector: x=y\n  drain: {onTimeout: Abort}\n", []string{`policies[0].drain.onTimeout: "Abort" is not a choice; use Proceed or Wait`}},
		{"zero drain timeout", head + "policies:\n- name: a\n  nodeSelector: x=y\n  drain: {timeout: 0s}\n", []string{"policies[0].drain.timeout: 0s must be above 0"}},
		{"bad selector", head + "policies:\n- name: a\n  nodeSelector: \"pool in (a\"\n", []string{`policies[0].nodeSelector: "pool in (a" is not a label selector`}},
		{"missing name", head + "policies:\n- nodeSelector: x=y\n", []string{"policies[0].name: missing"}},
		{"bad name", head + "policies:\n- name: Kafka_Pool\n  nodeSelector: x=y\n", []string{`policies[0].name: "Kafka_Pool" is not a valid name`}},
		{"reserved name", head + "policies:\n- name: default\n  nodeSelector: x=y\n", []string{`policies[0].name: "default" is reserved`}},
		{"duplicate name", head + "policies:\n- name: a\n  nodeSelector: x=y\n- name: a\n  nodeSelector: x=z\n", []string{`policies[1].name: "a" is already the name of policies[0]`}},
		{"negative toleration", head + "policies:\n- name: a\n  nodeSelector: x=y\n  tolerations: {silentNode: -1m}\n", []string{"policies[0].tolerations.silentNode: -1m0s is negative"}},
		{"scheduled reboot shorter than silentNode", head + "policies:\n- name: a\n  nodeSelector: x=y\n  tolerations: {silentNode: 5m, scheduledReboot: 4m}\n", []string{"policies[0].tolerations.scheduledReboot: 4m0s is shorter than tolerations.silentNode 5m0s", "use at least 5m0s"}},
		{"scheduled reboot below the default silentNode", head + "policies:\n- name: a\n  nodeSelector: x=y\n  tolerations: {scheduledReboot: 1m}\n", []string{"policies[0].tolerations.scheduledReboot: 1m0s is shorter than tolerations.silentNode 3m0s"}},
		{"negative scheduled reboot", head + "policies:\n- name: a\n  nodeSelector: x=y\n  tolerations: {scheduledReboot: -1m}\n", []string{"policies[0].tolerations.scheduledReboot: -1m0s is shorter than tolerations.silentNode"}},
		{"negative polarity condition", head + "policies:\n- name: a\n  nodeSelector: x=y\n  tolerations: {conditions: {MemoryPressure: 1m}}\n", []string{"policies[0].tolerations.conditions.MemoryPressure: MemoryPressure has negative polarity"}},
		{"bad liveness", head + "policies:\n- name: a\n  nodeSelector: x=y\n  liveness: Kubelet\n", []string{`policies[0].liveness: "Kubelet" is not a liveness mode; use TwoSignal`}},
		{"single-signal toleration without single-signal liveness", head + "policies:\n- name: a\n  nodeSelector: x=y\n  tolerations: {singleSignal: 30m}\n", []string{"policies[0].tolerations.singleSignal: is only used with liveness: SingleSignal"}},
		{"single-signal toleration too short", head + "policies:\n- name: a\n  nodeSelector: x=y\n  liveness: SingleSignal\n  tolerations: {singleSignal: 5m}\n", []string{"policies[0].tolerations.singleSignal: 5m0s is too short", "at least 10m0s"}},
		{"deadline before grace", head + "policies:\n- name: a\n  nodeSelector: x=y\n  startupGrace: 30m\n", []string{"policies[0].startupDeadline: 20m0s is shorter than startupGrace 30m0s"}},
		{"bad startup taint", head + "policies:\n- name: a\n  nodeSelector: x=y\n  startupTaints: [\"a:NoSchedule\"]\n", []string{`policies[0].startupTaints[0]: "a:NoSchedule" is not a taint key`}},
		{"zero in flight", head + "policies:\n- name: a\n  nodeSelector: x=y\n  maxInFlight: 0\n", []string{"policies[0].maxInFlight: 0 must be at least 1"}},
		{"zero rate", head + "terminationRateLimit: {perMinute: 0}\n", []string{"terminationRateLimit.perMinute: 0 must be above 0"}},
		{"zero burst", head + "terminationRateLimit: {burst: 0}\n", []string{"terminationRateLimit.burst: 0 must be at least 1"}},
		{"short lease", head + "agentLeaseDuration: 100ms\n", []string{"agentLeaseDuration: 100ms is too short"}},
		{"bad namespace", head + "agentNamespace: Not_A_Namespace\n", []string{`agentNamespace: "Not_A_Namespace" is not a namespace name`}},
		{"several errors at once", head + "dryRun: 3\npolicies:\n- name: a\n  nodeSelector: x=y\n  maxInFlight: x\n", []string{"dryRun: 3 is not a boolean", `policies[0].maxInFlight: "x" is not a number`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.doc))
			if err == nil {
				t.Fatalf("Parse succeeded with %+v, want an error containing %q", c, tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error\n%v\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

func TestAllowedUnhealthyRoundsUp(t *testing.T) {
	tests := []struct {
		cap   intstr.IntOrString
		total int
		want  int
	}{
		{intstr.FromString("20%"), 3, 1}, // 0.6 rounds up: one dead node in a tiny pool is still remediated
		{intstr.FromString("20%"), 10, 2},
		{intstr.FromString("20%"), 11, 3},
		{intstr.FromString("20%"), 0, 0},
		{intstr.FromString("100%"), 7, 7},
		{intstr.FromInt32(2), 100, 2},
	}
	for _, tt := range tests {
		p := Policy{MaxUnhealthy: tt.cap}
		if got := p.AllowedUnhealthy(tt.total); got != tt.want {
			t.Errorf("AllowedUnhealthy(%s of %d) = %d, want %d", tt.cap.String(), tt.total, got, tt.want)
		}
		if got := PauseAllowed(tt.cap, tt.total); got != tt.want {
			t.Errorf("PauseAllowed(%s of %d) = %d, want %d", tt.cap.String(), tt.total, got, tt.want)
		}
	}
}

// TestExampleInPackageDocParses keeps the example in the package comment honest.
func TestExampleInPackageDocParses(t *testing.T) {
	src, err := os.ReadFile("config.go")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	in := false
	for _, l := range strings.Split(string(src), "\n") {
		switch {
		case strings.HasPrefix(l, "//\tapiVersion:"):
			in = true
		case in && !strings.HasPrefix(l, "//\t"):
			in = false
		}
		if in {
			lines = append(lines, strings.TrimPrefix(l, "//\t"))
		}
	}
	if len(lines) == 0 {
		t.Fatal("no example found in the package comment")
	}
	c, err := Parse([]byte(strings.Join(lines, "\n")))
	if err != nil {
		t.Fatalf("package doc example does not parse: %v", err)
	}
	if len(c.Policies) != 3 {
		t.Errorf("example has %d policies, want 2 + default", len(c.Policies))
	}
}
