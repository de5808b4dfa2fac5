package config

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nodevigil/nodevigil/collectors"
)

// src builds a Source with a fixed environment and hostname, reading files from testdata.
func src(env map[string]string, args ...string) Source {
	return Source{
		Args:     args,
		Getenv:   func(k string) string { return env[k] },
		Hostname: func() (string, error) { return "host-pod", nil },
		ReadFile: func(name string) ([]byte, error) { return os.ReadFile(filepath.Join("testdata", name)) },
		Output:   io.Discard,
	}
}

var nodeEnv = map[string]string{"NODE_NAME": "ip-10-0-1-2.ec2.internal"}

func TestDefaultsAndEnvironment(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		env                  map[string]string
		wantNS, wantPod, nde string
	}{
		{"env set", map[string]string{"NODE_NAME": "n1", "POD_NAMESPACE": "ops", "POD_NAME": "agent-abc"}, "ops", "agent-abc", "n1"},
		{"fallbacks", map[string]string{"NODE_NAME": "n1"}, DefaultNamespace, "host-pod", "n1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Load(ModeRun, src(tc.env))
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if cfg.Namespace != tc.wantNS || cfg.PodName != tc.wantPod || cfg.NodeName != tc.nde {
				t.Errorf("namespace %q pod %q node %q, want %q %q %q", cfg.Namespace, cfg.PodName, cfg.NodeName, tc.wantNS, tc.wantPod, tc.nde)
			}
			if cfg.CheckInterval.Duration != 10*time.Second || cfg.CheckTimeout.Duration != 5*time.Second || cfg.LeaseRenewTimeout.Duration != 5*time.Second || cfg.LeaseDuration.Duration != 40*time.Second ||
				cfg.LeaseRenewInterval.Duration != 10*time.Second || cfg.ConditionHeartbeat.Duration != 5*time.Minute ||
				cfg.TaintStabilityWindow.Duration != 30*time.Second || cfg.ListenAddress != ":9736" ||
				cfg.KubeAPIQPS != 5 || cfg.KubeAPIBurst != 10 || cfg.HostRoot != "/" || cfg.LogFormat != "json" {
				t.Errorf("unexpected defaults: %+v", cfg)
			}
			if !reflect.DeepEqual(cfg.OwnedTaints, []string{"readiness.k8s.io/nodevigil-agent-not-ready"}) ||
				!reflect.DeepEqual(cfg.GatingChecks, []collectors.CheckName{"kubelet", "cni"}) {
				t.Errorf("owned %v gating %v", cfg.OwnedTaints, cfg.GatingChecks)
			}
		})
	}
}

func TestFileIsAppliedCompletely(t *testing.T) {
	cfg, err := Load(ModeRun, src(nodeEnv, "--config", "full.yaml"))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := Default()
	want.APIVersion, want.Kind = APIVersion, Kind
	want.NodeName, want.PodName, want.ConfigFile = nodeEnv["NODE_NAME"], "host-pod", "full.yaml"
	want.Namespace, want.HostRoot, want.ListenAddress = "node-health", "/host", ":9999"
	want.CheckInterval.Duration, want.CheckTimeout.Duration = 20*time.Second, 4*time.Second
	want.LeaseDuration.Duration, want.LeaseRenewInterval.Duration, want.LeaseRenewTimeout.Duration = time.Minute, 15*time.Second, 3*time.Second
	want.ConditionHeartbeat.Duration, want.TaintStabilityWindow.Duration = 10*time.Minute, 30*time.Second
	want.OwnedTaints = []string{"readiness.k8s.io/nodevigil-agent-not-ready", "node.cilium.io/agent-not-ready"}
	want.GatingChecks = []collectors.CheckName{"kubelet", "cni", "memory"}
	want.ReaddTaintOnFailure, want.KubeletRepair = true, true
	want.KubeletUnit, want.CNIHealthURL = "kubelet-eks.service", "http://127.0.0.1:9879/healthz"
	want.CNIPreset, want.MissingOwnedTaintIsUnhealthy = "cilium", true
	want.KubeAPIQPS, want.KubeAPIBurst = 2.5, 4
	want.LogLevel, want.LogFormat = "debug", "text"
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("config from file:\n got %+v\nwant %+v", cfg, want)
	}
}

func TestFlagsOverrideFileOnlyWhenSet(t *testing.T) {
	cfg, err := Load(ModeRun, src(map[string]string{"NODE_NAME": "from-env", "POD_NAMESPACE": "env-ns"},
		"--check-interval=30s", "--config=full.yaml", "--node-name", "from-flag", "--owned-taints", "a.example/x, b.example/y", "--kube-api-qps=1"))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	for _, tc := range []struct {
		field     string
		got, want any
	}{
		{"checkInterval (flag over file)", cfg.CheckInterval.Duration, 30 * time.Second},
		{"leaseDuration (file over default)", cfg.LeaseDuration.Duration, time.Minute},
		{"checkTimeout (file, flag not set)", cfg.CheckTimeout.Duration, 4 * time.Second},
		{"nodeName (flag over env)", cfg.NodeName, "from-flag"},
		{"namespace (file over env)", cfg.Namespace, "node-health"},
		{"ownedTaints (flag replaces file list)", cfg.OwnedTaints, []string{"a.example/x", "b.example/y"}},
		{"gatingChecks (file)", cfg.GatingChecks, []collectors.CheckName{"kubelet", "cni", "memory"}},
		{"kubeAPIQPS (flag)", cfg.KubeAPIQPS, float32(1)},
		{"kubeAPIBurst (file)", cfg.KubeAPIBurst, 4},
		{"readdTaintOnFailure (file)", cfg.ReaddTaintOnFailure, true},
	} {
		if !reflect.DeepEqual(tc.got, tc.want) {
			t.Errorf("%s = %v, want %v", tc.field, tc.got, tc.want)
		}
	}

	// An explicit false flag overrides a true in the file.
	cfg, err = Load(ModeRun, src(nodeEnv, "--config=full.yaml", "--kubelet-repair=false"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.KubeletRepair {
		t.Error("--kubelet-repair=false did not override the file")
	}
	// An empty list flag clears the default.
	cfg, err = Load(ModeRun, src(nodeEnv, "--owned-taints="))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.OwnedTaints) != 0 {
		t.Errorf("--owned-taints= left %v", cfg.OwnedTaints)
	}
}

func TestTimeoutsFollowShortIntervals(t *testing.T) {
	cfg, err := Load(ModeRun, src(nodeEnv, "--check-interval=1s", "--lease-duration=6s", "--lease-renew-interval=1s"))
	if err != nil {
		t.Fatalf("Load with short intervals: %v", err)
	}
	if cfg.CheckTimeout.Duration != time.Second || cfg.LeaseRenewTimeout.Duration != 500*time.Millisecond {
		t.Errorf("derived timeouts check %s lease %s, want 1s and 500ms", cfg.CheckTimeout.Duration, cfg.LeaseRenewTimeout.Duration)
	}
	// An explicit timeout is kept, and validated.
	cfg, err = Load(ModeRun, src(nodeEnv, "--check-interval=1s", "--check-timeout=300ms"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.CheckTimeout.Duration != 300*time.Millisecond {
		t.Errorf("explicit check timeout = %s", cfg.CheckTimeout.Duration)
	}
}

func TestFileErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		file string
		want []string
	}{
		{"unknown-field.yaml", []string{"unknown-field.yaml", `unknown field "checkIntervall"`}},
		{"duplicate-field.yaml", []string{`"checkInterval"`}},
		{"wrong-kind.yaml", []string{`kind "RemediatorConfig"`, "set kind: AgentConfig"}},
		{"no-version.yaml", []string{`apiVersion ""`, "set apiVersion: nodevigil.io/v1alpha1"}},
		{"wrong-type.yaml", []string{"kubeAPIBurst"}},
		{"missing.yaml", []string{"read config file"}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			_, err := Load(ModeRun, src(nodeEnv, "--config", tc.file))
			if err == nil {
				t.Fatal("Load accepted it")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestValidationNamesFieldAndFix(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode Mode
		env  map[string]string
		args []string
		want string
	}{
		{"lease renew vs duration from file", ModeRun, nodeEnv, []string{"--config", "bad-lease.yaml"},
			"leaseRenewInterval (50s) must be shorter than leaseDuration (40s); set --lease-renew-interval below 40s"},
		{"lease renew vs duration from flag", ModeRun, nodeEnv, []string{"--lease-renew-interval=40s"},
			"leaseRenewInterval (40s) must be shorter than leaseDuration (40s)"},
		{"renew timeout", ModeRun, nodeEnv, []string{"--lease-renew-timeout=10s"},
			"leaseRenewTimeout (10s) must be shorter than leaseRenewInterval (10s); set --lease-renew-timeout below 10s"},
		{"fractional lease", ModeRun, nodeEnv, []string{"--lease-duration=40500ms"}, "leaseDuration (40.5s) must be whole seconds"},
		{"no node name", ModeRun, nil, nil, "nodeName is empty; set --node-name or the NODE_NAME environment variable"},
		{"qps above cap", ModeRun, nodeEnv, []string{"--kube-api-qps=6"}, "kubeAPIQPS (6) must be above 0 and at most 5"},
		{"qps zero", ModeRun, nodeEnv, []string{"--kube-api-qps=0"}, "kubeAPIQPS (0)"},
		{"burst zero", ModeRun, nodeEnv, []string{"--kube-api-burst=0"}, "kubeAPIBurst (0) must be at least 1"},
		{"unknown gating check", ModeRun, nodeEnv, []string{"--gating-checks=kubelet,disk"}, `gatingChecks entry "disk" is not a check`},
		{"owned taint with effect", ModeRun, nodeEnv, []string{"--owned-taints=node.cilium.io/agent-not-ready=true:NoExecute"},
			`owned taints are keys only, drop the value and effect (use "node.cilium.io/agent-not-ready")`},
		{"owned taint invalid key", ModeRun, nodeEnv, []string{"--owned-taints=bad key"}, `ownedTaints entry "bad key" is not a valid taint key`},
		{"check timeout above interval", ModeRun, nodeEnv, []string{"--check-timeout=11s"}, "checkTimeout (11s) must not exceed checkInterval (10s)"},
		{"negative interval", ModeRun, nodeEnv, []string{"--check-interval=-1s"}, "checkInterval (-1s) must be positive; set --check-interval"},
		{"log format", ModeRun, nodeEnv, []string{"--log-format=xml"}, `logFormat "xml" is not supported; set --log-format to json or text`},
		{"log level", ModeRun, nodeEnv, []string{"--log-level=loud"}, `logLevel "loud" is not supported`},
		{"listen address", ModeRun, nodeEnv, []string{"--listen-address=9736"}, `listenAddress "9736" is not host:port`},
		{"healthz url", ModeRun, nodeEnv, []string{"--kubelet-healthz-url=127.0.0.1:10248"}, `kubeletHealthzURL ("127.0.0.1:10248")`},
		{"readd without taints", ModeRun, nodeEnv, []string{"--owned-taints=", "--readd-taint-on-failure"}, "readdTaintOnFailure needs an owned taint"},
		{"check output", ModeCheck, nil, []string{"--output=yaml"}, `output "yaml" is not supported; set --output to text or json`},
		{"unknown cni preset", ModeRun, nodeEnv, []string{"--cni-preset=weave"},
			`cniPreset "weave" is not a CNI preset; set --cni-preset to one of auto, none, aws-vpc-cni, cilium, calico`},
		{"unknown cni preset in check", ModeCheck, nil, []string{"--cni-preset=Cilium"}, `cniPreset "Cilium" is not a CNI preset`},
		{"unknown cni preset from file", ModeRun, nodeEnv, []string{"--config", "bad-preset.yaml"}, `cniPreset "vpc-cni" is not a CNI preset`},
		{"kubelet unit without suffix", ModeCheck, nil, []string{"--kubelet-unit=kubelet"},
			`kubeletUnit "kubelet" is not a service unit name (it must end in ".service"); set --kubelet-unit`},
		{"kubelet unit path", ModeRun, nodeEnv, []string{"--kubelet-unit=/etc/systemd/system/kubelet.service"}, `kubeletUnit "/etc/systemd/system/kubelet.service" contains a slash`},
		{"kubelet unit empty", ModeRun, nodeEnv, []string{"--kubelet-unit="}, `kubeletUnit "" is empty`},
		{"memory psi exit above enter", ModeCheck, nil, []string{"--config", "bad-memory.yaml"},
			"memory.psiFullExitPercent (30) must be between 0 and memory.psiFullEnterPercent (25)"},
		{"memory clear below critical", ModeRun, nodeEnv, []string{"--config", "bad-memory.yaml"},
			"memory.availableClearPercent (3) must be between memory.availableCriticalPercent (5) and 100"},
		{"memory clear MiB below critical", ModeRun, nodeEnv, []string{"--config", "bad-memory.yaml"},
			"memory.availableClearMiB (512) must be at least memory.availableCriticalMiB (1024)"},
		{"memory negative duration", ModeRun, nodeEnv, []string{"--config", "bad-memory.yaml"}, "memory.exitAfter (-1m0s) must not be negative"},
		{"memory both rules off", ModeRun, nodeEnv, []string{"--config", "memory-off.yaml"},
			"memory.psiFullEnterPercent and memory.availableCriticalPercent are both negative"},
		{"imds endpoint not a URL", ModeRun, nodeEnv, []string{"--config", "bad-imds.yaml"}, `imds.endpoint "169.254.169.254" is not an http(s) URL`},
		{"imds spot interval too long", ModeCheck, nil, []string{"--config", "bad-imds.yaml"}, "imds.spotInterval (2m0s) is above 30s"},
		{"imds event interval too long", ModeRun, nodeEnv, []string{"--config", "bad-imds.yaml"}, "imds.eventInterval (2h0m0s) is above 1h"},
		{"imds rebalance interval too long", ModeRun, nodeEnv, []string{"--config", "bad-imds.yaml"}, "imds.rebalanceInterval (10m0s) is above 5m"},
		{"imds endpoint flag", ModeCheck, nil, []string{"--imds-endpoint=localhost:1338"}, `imds.endpoint "localhost:1338" is not an http(s) URL`},
		{"memory percent above 100", ModeRun, nodeEnv, []string{"--config", "memory-high.yaml"}, "memory.psiFullEnterPercent (150) must be between 0 and 100"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.mode, src(tc.env, tc.args...))
			if err == nil {
				t.Fatal("Load accepted it")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error:\n%v\nwant it to contain:\n%s", err, tc.want)
			}
		})
	}
}

func TestAllErrorsReportedAtOnce(t *testing.T) {
	_, err := Load(ModeRun, src(nil, "--kube-api-qps=50", "--log-format=xml"))
	if err == nil {
		t.Fatal("Load accepted it")
	}
	for _, w := range []string{"nodeName", "kubeAPIQPS", "logFormat"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %s", err, w)
		}
	}
}

func TestCheckModeNeedsNoCluster(t *testing.T) {
	cfg, err := Load(ModeCheck, src(nil, "--host-root", "/host", "--output", "json", "--strict"))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if cfg.HostRoot != "/host" || cfg.Output != OutputJSON || !cfg.Strict || cfg.LogFormat != "text" {
		t.Errorf("check config = %+v", cfg)
	}
	if _, err := Load(ModeCheck, src(nil, "--node-name", "n1")); err == nil {
		t.Error("check accepted --node-name, a run-only flag")
	}
	if _, err := Load(ModeRun, src(nodeEnv, "--output", "json")); err == nil {
		t.Error("run accepted --output, a check-only flag")
	}
}

func TestUsageErrors(t *testing.T) {
	if _, err := Load(ModeRun, src(nodeEnv, "-h")); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h = %v, want flag.ErrHelp", err)
	}
	if _, err := Load(ModeRun, src(nodeEnv, "extra")); err == nil || !strings.Contains(err.Error(), `unexpected argument "extra"`) {
		t.Errorf("positional argument = %v", err)
	}
	if _, err := Load(ModeRun, src(nodeEnv, "--kube-api-qps=fast")); err == nil {
		t.Error("non-numeric qps accepted")
	}
}

func TestParseLogLevel(t *testing.T) {
	for in, ok := range map[string]bool{"debug": true, "INFO": true, "warn": true, "error": true, "trace": false} {
		if _, err := ParseLogLevel(in); (err == nil) != ok {
			t.Errorf("ParseLogLevel(%q) err = %v, want ok=%v", in, err, ok)
		}
	}
}

func TestRESTConfigFromKubeconfig(t *testing.T) {
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://10.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Default()
	cfg.Kubeconfig = kc
	cfg.KubeAPIQPS, cfg.KubeAPIBurst = 3, 6
	rc, err := cfg.RESTConfig("nodevigil-agent/v1.2.3")
	if err != nil {
		t.Fatalf("RESTConfig: %v", err)
	}
	if rc.Host != "https://10.0.0.1:6443" || rc.QPS != 3 || rc.Burst != 6 || rc.UserAgent != "nodevigil-agent/v1.2.3" {
		t.Errorf("rest config host %s qps %v burst %d ua %q", rc.Host, rc.QPS, rc.Burst, rc.UserAgent)
	}
	cfg.Kubeconfig = filepath.Join(dir, "missing")
	if _, err := cfg.RESTConfig("x"); err == nil {
		t.Error("missing kubeconfig accepted")
	}
}

// TestBadFlagReportedOnce: the flag package must not print its own error and usage; Load
// returns one error that the command prints once.
func TestBadFlagReportedOnce(t *testing.T) {
	var out strings.Builder
	s := src(nodeEnv)
	s.Args = []string{"--no-such-flag"}
	s.Output = &out
	_, err := Load(ModeCheck, s)
	if err == nil || !strings.Contains(err.Error(), "no-such-flag") || !strings.Contains(err.Error(), "-h") {
		t.Fatalf("err = %v, want one naming the flag and pointing at -h", err)
	}
	if out.Len() != 0 {
		t.Errorf("flag parsing wrote %q itself; the error must be reported once, by the caller", out.String())
	}
	out.Reset()
	s.Args = []string{"-h"}
	if _, err := Load(ModeCheck, s); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: err = %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{"Exit codes:", "0  no check is Unhealthy", "Warning", "--explain", "json"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("check -h lacks %q:\n%s", want, out.String())
		}
	}
}

func TestCheckIsQuietByDefault(t *testing.T) {
	cfg, err := Load(ModeCheck, src(nodeEnv))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.LogLevel != "error" {
		t.Errorf("check log level %q, want error", cfg.LogLevel)
	}
}
