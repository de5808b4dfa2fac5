// Package config turns the agent's command line and optional config file into one validated
// Config. The file is a small versioned document (apiVersion nodevigil.io/v1alpha1, kind
// AgentConfig) so a DaemonSet can mount the same settings on every node through a ConfigMap;
// flags exist for per-node values (node name, pod name) and for quick overrides. An explicit
// flag always wins over the file, and the file wins over the built-in defaults.
//
// Decoding is strict: a misspelt field in the file is an error naming that field, not a setting
// silently ignored on thousands of nodes. Validation errors name the field and say how to fix it.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/nodevigil/nodevigil/agent/taints"
	"github.com/nodevigil/nodevigil/collectors"
	"github.com/nodevigil/nodevigil/collectors/cni"
	"github.com/nodevigil/nodevigil/collectors/imds"
	"github.com/nodevigil/nodevigil/collectors/memory"
)

// APIVersion and Kind identify the config file format. They are checked so that a file written
// for another program (or a future incompatible version) is rejected instead of half-applied.
const (
	APIVersion = "nodevigil.io/v1alpha1"
	Kind       = "AgentConfig"
)

// KnownChecks lists every check name in a stable order (the order `check` prints them in);
// gating checks must be among them. The names are collectors.CheckName constants.
var KnownChecks = collectors.Checks()

// Defaults. They follow the kubelet's own Lease timing (40 s duration, 10 s renewal) so the
// agent's heartbeat and the kubelet's can be compared one to one by the remediator.
const (
	DefaultNamespace     = "nodevigil-system"
	DefaultHostRoot      = "/"
	DefaultListenAddress = ":9736"
	DefaultCheckInterval = 10 * time.Second
	// DefaultCheckTimeout applies unless checkInterval is shorter; then checkTimeout defaults
	// to checkInterval.
	DefaultCheckTimeout       = 5 * time.Second
	DefaultLeaseDuration      = 40 * time.Second
	DefaultLeaseRenewInterval = 10 * time.Second
	// DefaultLeaseRenewTimeout applies unless half the renew interval is shorter; then
	// leaseRenewTimeout defaults to half the renew interval.
	DefaultLeaseRenewTimeout  = 5 * time.Second
	DefaultConditionHeartbeat = 5 * time.Minute
	// DefaultTaintStabilityWindow is three default check intervals. EKS bootstrap restarts the
	// kubelet at least once (AL2's bootstrap.sh and AL2023's nodeadm write the config and
	// (re)start the unit; systemd's RestartSec=5 adds a 5 s gap when it exits early), and each
	// restart takes the kubelet 5-15 s to answer /healthz again. 30 s covers one such
	// restart-and-recover plus one more check, so a kubelet still settling is caught before
	// the node is released; it delays scheduling by at most that long (docs/agent-verdicts.md).
	DefaultTaintStabilityWindow = 30 * time.Second
	// DefaultKubeletHealthzFailureThreshold is how many consecutive /healthz failures make the
	// kubelet unhealthy: one slow answer during a GC pause or a garbage collection of images
	// is not an outage.
	DefaultKubeletHealthzFailureThreshold = 3
	// DefaultOwnedTaint is the agent's own startup taint, defined once in package taints.
	DefaultOwnedTaint  = taints.DefaultOwnedKey
	DefaultKubeletUnit = "kubelet.service"
	// DefaultCNIPreset detects the CNI from the default network's plugin types and probes
	// its agent's own health endpoint (collectors/cni).
	DefaultCNIPreset         = cni.PresetAuto
	DefaultKubeletHealthzURL = "http://127.0.0.1:10248/healthz"
	DefaultCNIConfDir        = "/etc/cni/net.d"
	DefaultCNIBinDir         = "/opt/cni/bin"
	DefaultKubeAPIQPS        = 5
	DefaultKubeAPIBurst      = 10
	DefaultLogLevel          = "info"
	DefaultLogFormat         = "json"

	// MaxKubeAPIQPS caps the per-node client rate: one agent per node times 5,000 nodes must
	// stay a small share of the API server's capacity.
	MaxKubeAPIQPS = 5
)

// DefaultGatingChecks are the checks that must be healthy before startup taints are removed:
// a node can run pods once its kubelet is up and its CNI is ready; memory is not a startup gate.
var DefaultGatingChecks = taints.DefaultGatingChecks

// Mode selects which flags a command accepts and which fields are validated: `check` runs
// without a cluster, so it neither needs nor accepts the Kubernetes-side settings.
type Mode int

const (
	// ModeRun is the long-running agent.
	ModeRun Mode = iota
	// ModeCheck is the one-shot local check.
	ModeCheck
)

// Output formats of the check command.
const (
	OutputText = "text"
	OutputJSON = "json"
)

// Config is the agent's effective configuration and, for the fields with a JSON name, the
// schema of the config file. Durations are metav1.Duration so the file reads like any other
// Kubernetes component config ("10s", "5m").
type Config struct {
	// APIVersion must be nodevigil.io/v1alpha1 in a config file.
	APIVersion string `json:"apiVersion"`
	// Kind must be AgentConfig in a config file.
	Kind string `json:"kind"`

	// NodeName is the Node this agent reports for (flag or NODE_NAME; never from the shared file).
	NodeName string `json:"-"`
	// PodName identifies this agent instance as the Lease holder (flag, POD_NAME or hostname).
	PodName string `json:"-"`
	// Kubeconfig is a kubeconfig path; empty means in-cluster, then the KUBECONFIG variable.
	Kubeconfig string `json:"-"`
	// ConfigFile is the path of the optional config file.
	ConfigFile string `json:"-"`
	// Output is the check command's output format (text or json).
	Output string `json:"-"`
	// Strict makes the check command treat Unknown results as failures.
	Strict bool `json:"-"`
	// OneShot is true for the check command: checks judge a single reading (no hysteresis,
	// no debouncing), because there is no second one.
	OneShot bool `json:"-"`
	// Explain makes the check command print every input it read and the threshold it was
	// compared with.
	Explain bool `json:"-"`

	// Namespace holds the agent's heartbeat Leases.
	Namespace string `json:"namespace,omitempty"`
	// HostRoot is where the host's filesystem is mounted in the agent's container.
	HostRoot string `json:"hostRoot,omitempty"`
	// ListenAddress serves /metrics, /healthz and /readyz.
	ListenAddress string `json:"listenAddress,omitempty"`
	// CheckInterval is how often every check runs.
	CheckInterval metav1.Duration `json:"checkInterval,omitempty"`
	// CheckTimeout bounds one run of one check. Zero means min(5s, CheckInterval).
	CheckTimeout metav1.Duration `json:"checkTimeout,omitempty"`
	// LeaseDuration is written into the heartbeat Lease; readers treat it as the staleness bound.
	LeaseDuration metav1.Duration `json:"leaseDuration,omitempty"`
	// LeaseRenewInterval is how often the heartbeat Lease is renewed.
	LeaseRenewInterval metav1.Duration `json:"leaseRenewInterval,omitempty"`
	// LeaseRenewTimeout bounds one renewal so a slow API server cannot stall the heartbeat.
	// Zero means min(5s, LeaseRenewInterval/2).
	LeaseRenewTimeout metav1.Duration `json:"leaseRenewTimeout,omitempty"`
	// ConditionHeartbeat is how often unchanged conditions are re-written.
	ConditionHeartbeat metav1.Duration `json:"conditionHeartbeat,omitempty"`
	// OwnedTaints are the taint keys the agent removes once the node is ready.
	OwnedTaints []string `json:"ownedTaints,omitempty"`
	// GatingChecks must be healthy for TaintStabilityWindow before owned taints are removed.
	GatingChecks []collectors.CheckName `json:"gatingChecks,omitempty"`
	// TaintStabilityWindow is how long gating checks must stay healthy without interruption.
	TaintStabilityWindow metav1.Duration `json:"taintStabilityWindow,omitempty"`
	// ReaddTaintOnFailure re-adds an owned NoSchedule taint when a gating check fails later.
	ReaddTaintOnFailure bool `json:"readdTaintOnFailure,omitempty"`
	// KubeletRepair enables restarting a failed kubelet unit locally.
	KubeletRepair bool `json:"kubeletRepair,omitempty"`
	// KubeletUnit is the systemd unit of the kubelet.
	KubeletUnit string `json:"kubeletUnit,omitempty"`
	// KubeletHealthzURL is the kubelet's local health endpoint.
	KubeletHealthzURL string `json:"kubeletHealthzURL,omitempty"`
	// MissingOwnedTaintIsUnhealthy makes the kubelet-config check report an owned startup
	// taint the kubelet does not register as Unhealthy (exit 1 in `check`) instead of a
	// Warning. Set it when something outside the node requires the taint, e.g. a Karpenter
	// NodePool listing it in startupTaints (which kills nodes that lack it).
	MissingOwnedTaintIsUnhealthy bool `json:"missingOwnedTaintIsUnhealthy,omitempty"`
	// KubeletHealthzFailureThreshold is how many consecutive /healthz failures (while systemd
	// shows the unit running) make the kubelet check Unhealthy. `check` always uses 1.
	KubeletHealthzFailureThreshold int `json:"kubeletHealthzFailureThreshold,omitempty"`
	// Memory holds the memory check's thresholds; zero fields keep the defaults documented in
	// docs/agent-verdicts.md.
	Memory MemoryConfig `json:"memory,omitempty"`
	// IMDS configures the AWS event checks (instance metadata service, IMDSv2).
	IMDS IMDSConfig `json:"imds,omitempty"`
	// CNIConfDir is the CNI configuration directory as seen on the host.
	CNIConfDir string `json:"cniConfDir,omitempty"`
	// CNIBinDir is the CNI plugin directory as seen on the host.
	CNIBinDir string `json:"cniBinDir,omitempty"`
	// CNIHealthURL is the CNI agent's optional health endpoint. When set it replaces the
	// preset's probe.
	CNIHealthURL string `json:"cniHealthURL,omitempty"`
	// CNIPreset selects the CNI agent's own health probe: auto (detected from the default
	// network's plugin types), none (files only), aws-vpc-cni, cilium or calico.
	CNIPreset string `json:"cniPreset,omitempty"`
	// KubeAPIQPS is the client's sustained request rate.
	KubeAPIQPS float32 `json:"kubeAPIQPS,omitempty"`
	// KubeAPIBurst is the client's burst.
	KubeAPIBurst int `json:"kubeAPIBurst,omitempty"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `json:"logLevel,omitempty"`
	// LogFormat is json or text.
	LogFormat string `json:"logFormat,omitempty"`
}

// IMDSConfig is the AWS event watcher's part of the config file (see collectors/imds.Config):
// which metadata service to read and how often.
type IMDSConfig struct {
	// Disabled turns the AWS event checks off (their conditions are then not written).
	Disabled bool `json:"disabled,omitempty"`
	// Endpoint overrides the metadata service's URL (default the SDK's:
	// $AWS_EC2_METADATA_SERVICE_ENDPOINT, else http://169.254.169.254). Flag --imds-endpoint.
	Endpoint string `json:"endpoint,omitempty"`
	// SpotInterval is how often spot/instance-action is read on a spot instance (default 2s,
	// so a notice reaches the Node within 3s); other instances never read it.
	SpotInterval metav1.Duration `json:"spotInterval,omitempty"`
	// RebalanceInterval is how often the rebalance recommendation is read on a spot instance
	// (default 10s: an early warning, not a two-minute notice; never more often than
	// spotInterval); other instances never read it.
	RebalanceInterval metav1.Duration `json:"rebalanceInterval,omitempty"`
	// EventInterval is how often scheduled events and the ASG lifecycle state are read
	// (default 1m).
	EventInterval metav1.Duration `json:"eventInterval,omitempty"`
	// Timeout bounds one read, session token included (default 2s, imds.DefaultTimeout: the
	// service answers on the instance itself, so a slower read is a failure worth retrying).
	Timeout metav1.Duration `json:"timeout,omitempty"`
	// MaxBackoff caps the retry delay while the service cannot be read (default 5m).
	MaxBackoff metav1.Duration `json:"maxBackoff,omitempty"`
}

// WatcherConfig is the collectors/imds configuration this section describes.
func (c IMDSConfig) WatcherConfig() imds.Config {
	return imds.Config{Endpoint: c.Endpoint, SpotInterval: c.SpotInterval.Duration, RebalanceInterval: c.RebalanceInterval.Duration,
		EventInterval: c.EventInterval.Duration, Timeout: c.Timeout.Duration, MaxBackoff: c.MaxBackoff.Duration}
}

// MemoryConfig is the memory check's part of the config file (see collectors/memory.Config).
type MemoryConfig struct {
	// PSIFullEnterPercent is the PSI "full" level at or above which stalls count (default 25).
	PSIFullEnterPercent float64 `json:"psiFullEnterPercent,omitempty"`
	// PSIFullExitPercent is the PSI "full" level below which stalls are over (default 10).
	PSIFullExitPercent float64 `json:"psiFullExitPercent,omitempty"`
	// AvailableLowPercent and AvailableLowMiB: PSI counts only while MemAvailable is below the
	// smaller of the two (defaults 10 % and 2048 MiB).
	AvailableLowPercent float64 `json:"availableLowPercent,omitempty"`
	AvailableLowMiB     uint64  `json:"availableLowMiB,omitempty"`
	// AvailableCriticalPercent and AvailableCriticalMiB: MemAvailable below the smaller of the
	// two is pressure whatever PSI says (defaults 5 % and 1024 MiB).
	AvailableCriticalPercent float64 `json:"availableCriticalPercent,omitempty"`
	AvailableCriticalMiB     uint64  `json:"availableCriticalMiB,omitempty"`
	// AvailableClearPercent and AvailableClearMiB: the critical shortage is over at or above
	// the smaller of the two (defaults 10 % and 2048 MiB).
	AvailableClearPercent float64 `json:"availableClearPercent,omitempty"`
	AvailableClearMiB     uint64  `json:"availableClearMiB,omitempty"`
	// EnterAfter and ExitAfter are the hysteresis durations (defaults 30s and 2m).
	EnterAfter metav1.Duration `json:"enterAfter,omitempty"`
	ExitAfter  metav1.Duration `json:"exitAfter,omitempty"`
}

// CheckUsageHeader is the head of `nodevigil-agent check -h`: what the command prints and its
// exit codes, before the flags.
const CheckUsageHeader = `Usage: nodevigil-agent check [flags]

Runs every check once against the host mounted at --host-root, without a cluster, prints
one verdict per check and exits. Nothing is written anywhere; logs go to stderr only and
are quiet (--log-level=error) unless asked for.

Statuses:
  Healthy    observed and fine
  Warning    observed and working, with a configuration advisory (e.g. the agent's own
             startup taint is not registered although nothing requires it)
  Unhealthy  observed and not fine (the node needs attention)
  Unknown    could not be observed; the message says what was missing and which mount
             or flag provides it

Output (--output):
  text  a table: CHECK STATUS REASON MESSAGE
  json  an array of {"check","status","reason","message"} objects, plus "inputs" with
        --explain

--explain adds, under each check, every input read (value and source) and the threshold
it was compared with.

Exit codes:
  0  no check is Unhealthy (Healthy, Warning and Unknown results; Unknown ones are also
     named on stderr)
  1  at least one check is Unhealthy, or Unknown with --strict
  2  usage or configuration error (reported once on stderr)

AWS events (spot-interruption, rebalance-recommendation, scheduled-events, asg-lifecycle),
read from the instance metadata service (IMDSv2 only; --imds-endpoint or
$AWS_EC2_METADATA_SERVICE_ENDPOINT to point elsewhere):
  a pending event (spot notice, rebalance recommendation, active scheduled reboot,
  retirement or stop, ASG termination) is a Warning: exit 0. AWS is taking the instance
  away; the node itself is not unhealthy, and what the event means is decided by the
  pool's interruptions policy, not by this command.
  a metadata service that cannot be read (off EC2, hop limit 1 without hostNetwork,
  endpoint disabled, IMDSv1-only proxy) is Unknown with the cause and fix, and never
  changes the exit code, even with --strict: it follows the other checks' verdicts.

Flags:
`

// Default returns the built-in configuration, before environment, file and flags.
func Default() *Config {
	return &Config{
		Namespace:                      DefaultNamespace,
		HostRoot:                       DefaultHostRoot,
		ListenAddress:                  DefaultListenAddress,
		CheckInterval:                  metav1.Duration{Duration: DefaultCheckInterval},
		LeaseDuration:                  metav1.Duration{Duration: DefaultLeaseDuration},
		LeaseRenewInterval:             metav1.Duration{Duration: DefaultLeaseRenewInterval},
		ConditionHeartbeat:             metav1.Duration{Duration: DefaultConditionHeartbeat},
		OwnedTaints:                    []string{DefaultOwnedTaint},
		GatingChecks:                   append([]collectors.CheckName(nil), DefaultGatingChecks...),
		TaintStabilityWindow:           metav1.Duration{Duration: DefaultTaintStabilityWindow},
		KubeletUnit:                    DefaultKubeletUnit,
		KubeletHealthzURL:              DefaultKubeletHealthzURL,
		KubeletHealthzFailureThreshold: DefaultKubeletHealthzFailureThreshold,
		CNIConfDir:                     DefaultCNIConfDir,
		CNIBinDir:                      DefaultCNIBinDir,
		CNIPreset:                      DefaultCNIPreset,
		KubeAPIQPS:                     DefaultKubeAPIQPS,
		KubeAPIBurst:                   DefaultKubeAPIBurst,
		LogLevel:                       DefaultLogLevel,
		LogFormat:                      DefaultLogFormat,
		Output:                         OutputText,
	}
}

// Source is where Load reads from. Zero fields fall back to the process's own (os.Getenv,
// os.Hostname, os.ReadFile, os.Stderr), so tests can inject an environment.
type Source struct {
	// Args are the command's arguments, without the program and subcommand names.
	Args []string
	// Getenv reads an environment variable.
	Getenv func(string) string
	// Hostname returns the host name (the pod name when POD_NAME is unset).
	Hostname func() (string, error)
	// ReadFile reads the config file.
	ReadFile func(string) ([]byte, error)
	// Output receives usage text on -h or a flag error.
	Output io.Writer
}

func (s *Source) fill() {
	if s.Getenv == nil {
		s.Getenv = os.Getenv
	}
	if s.Hostname == nil {
		s.Hostname = os.Hostname
	}
	if s.ReadFile == nil {
		s.ReadFile = os.ReadFile
	}
	if s.Output == nil {
		s.Output = os.Stderr
	}
}

// Load builds the effective configuration for mode: defaults, then environment (NODE_NAME,
// POD_NAMESPACE, POD_NAME), then the config file named by --config, then the flags that were
// set explicitly on the command line. It validates the result. It returns flag.ErrHelp when
// help was requested.
func Load(mode Mode, src Source) (*Config, error) {
	src.fill()

	// Pass 1: learn the config file path (and report flag syntax errors with usage).
	// The flag package prints a parse error and the whole usage itself; the caller reports the
	// error once instead, so the flag set is silent except for the usage asked for with -h.
	probe := base(src, mode)
	fs := newFlagSet(mode, probe)
	fs.SetOutput(io.Discard)
	if err := fs.Parse(src.Args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(src.Output)
			fs.Usage()
			return nil, err
		}
		return nil, fmt.Errorf("%w (run with -h for the flags)", err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q; all options are flags (see -h)", fs.Arg(0))
	}

	cfg := base(src, mode)
	if probe.ConfigFile != "" {
		data, err := src.ReadFile(probe.ConfigFile)
		if err != nil {
			return nil, fmt.Errorf("read config file: %w", err)
		}
		if err := decodeFile(data, cfg); err != nil {
			return nil, fmt.Errorf("config file %s: %w", probe.ConfigFile, err)
		}
	}

	// Pass 2: apply only the flags present on the command line over file and defaults.
	fs = newFlagSet(mode, cfg)
	fs.SetOutput(io.Discard)
	if err := fs.Parse(src.Args); err != nil {
		return nil, err
	}
	if err := cfg.Validate(mode); err != nil {
		return nil, err
	}
	return cfg, nil
}

// deriveDefaults fills the timeouts left unset from the intervals they must stay below, so
// shortening an interval alone (as tests and small clusters do) never trips validation.
func (c *Config) deriveDefaults() {
	if c.CheckTimeout.Duration == 0 && c.CheckInterval.Duration > 0 {
		c.CheckTimeout.Duration = min(DefaultCheckTimeout, c.CheckInterval.Duration)
	}
	if c.LeaseRenewTimeout.Duration == 0 && c.LeaseRenewInterval.Duration > 0 {
		c.LeaseRenewTimeout.Duration = min(DefaultLeaseRenewTimeout, c.LeaseRenewInterval.Duration/2)
	}
}

// base is the defaults plus the environment. The one-shot check talks to a person, so its
// logs default to text.
func base(src Source, mode Mode) *Config {
	cfg := Default()
	if mode == ModeCheck {
		// Quiet by default: the verdicts are the output; logs (stderr only) would repeat them.
		cfg.LogFormat, cfg.LogLevel = "text", "error"
		cfg.OneShot = true
	}
	cfg.NodeName = src.Getenv("NODE_NAME")
	if ns := src.Getenv("POD_NAMESPACE"); ns != "" {
		cfg.Namespace = ns
	}
	cfg.PodName = src.Getenv("POD_NAME")
	if cfg.PodName == "" {
		if h, err := src.Hostname(); err == nil {
			cfg.PodName = h
		}
	}
	return cfg
}

// DecodeFile strictly decodes a config file over cfg: fields absent from the file keep the
// values already in cfg, an unknown or duplicated field is an error naming it, and apiVersion
// and kind must match.
func DecodeFile(data []byte, cfg *Config) error { return decodeFile(data, cfg) }

func decodeFile(data []byte, cfg *Config) error {
	cfg.APIVersion, cfg.Kind = "", ""
	if err := yaml.UnmarshalStrict(data, cfg); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	if cfg.APIVersion != APIVersion {
		return fmt.Errorf("apiVersion %q is not supported; set apiVersion: %s", cfg.APIVersion, APIVersion)
	}
	if cfg.Kind != Kind {
		return fmt.Errorf("kind %q is not supported; set kind: %s", cfg.Kind, Kind)
	}
	return nil
}

func newFlagSet(mode Mode, c *Config) *flag.FlagSet {
	name := "run"
	if mode == ModeCheck {
		name = "check"
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: nodevigil-agent %s [flags]\n\nFlags:\n", name)
		fs.PrintDefaults()
	}
	fs.StringVar(&c.ConfigFile, "config", c.ConfigFile, "path of an AgentConfig file (apiVersion "+APIVersion+"); explicit flags override it")
	fs.StringVar(&c.HostRoot, "host-root", c.HostRoot, "where the host's root filesystem is mounted")
	fs.StringVar(&c.KubeletUnit, "kubelet-unit", c.KubeletUnit, "systemd unit of the kubelet")
	fs.StringVar(&c.KubeletHealthzURL, "kubelet-healthz-url", c.KubeletHealthzURL, "kubelet health endpoint")
	fs.StringVar(&c.CNIConfDir, "cni-conf-dir", c.CNIConfDir, "CNI configuration directory on the host (under --host-root)")
	fs.StringVar(&c.CNIBinDir, "cni-bin-dir", c.CNIBinDir, "CNI plugin directory on the host (under --host-root)")
	fs.StringVar(&c.CNIHealthURL, "cni-health-url", c.CNIHealthURL, "optional health endpoint of the CNI agent (replaces the preset's probe)")
	fs.StringVar(&c.CNIPreset, "cni-preset", c.CNIPreset, "CNI agent health probe: "+strings.Join(cni.PresetNames(), ", ")+" (auto detects it from the conflist)")
	fs.BoolVar(&c.MissingOwnedTaintIsUnhealthy, "missing-owned-taint-is-unhealthy", c.MissingOwnedTaintIsUnhealthy, "report an owned startup taint the kubelet does not register as Unhealthy instead of a Warning (set it when a Karpenter NodePool requires the taint)")
	fs.Var((*listValue)(&c.OwnedTaints), "owned-taints", "comma-separated startup taint keys the agent owns and removes once ready")
	fs.StringVar(&c.IMDS.Endpoint, "imds-endpoint", c.IMDS.Endpoint, "instance metadata service URL for the AWS event checks (default $AWS_EC2_METADATA_SERVICE_ENDPOINT, else http://169.254.169.254)")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "log level: debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "log format: json or text")
	if mode == ModeCheck {
		fs.StringVar(&c.Output, "output", c.Output, "output format: text or json")
		fs.BoolVar(&c.Strict, "strict", c.Strict, "treat Unknown results (could not observe) as failures: exit 1")
		fs.BoolVar(&c.Explain, "explain", c.Explain, "also print every input each check read and the threshold it was compared with")
		fs.Usage = func() {
			fmt.Fprint(fs.Output(), CheckUsageHeader)
			fs.PrintDefaults()
		}
		return fs
	}
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "name of this Node (taken from $NODE_NAME); required")
	fs.StringVar(&c.Namespace, "namespace", c.Namespace, "namespace of the heartbeat Lease (taken from $POD_NAMESPACE when set)")
	fs.StringVar(&c.PodName, "pod-name", c.PodName, "Lease holder identity, the agent pod's name (taken from $POD_NAME, else the hostname)")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "kubeconfig path (default in-cluster, else $KUBECONFIG)")
	fs.StringVar(&c.ListenAddress, "listen-address", c.ListenAddress, "address serving /metrics, /healthz and /readyz")
	fs.DurationVar(&c.CheckInterval.Duration, "check-interval", c.CheckInterval.Duration, "how often every check runs")
	fs.DurationVar(&c.CheckTimeout.Duration, "check-timeout", c.CheckTimeout.Duration, "time limit of one check run (default min(5s, --check-interval))")
	fs.DurationVar(&c.LeaseDuration.Duration, "lease-duration", c.LeaseDuration.Duration, "duration written into the heartbeat Lease")
	fs.DurationVar(&c.LeaseRenewInterval.Duration, "lease-renew-interval", c.LeaseRenewInterval.Duration, "how often the heartbeat Lease is renewed")
	fs.DurationVar(&c.LeaseRenewTimeout.Duration, "lease-renew-timeout", c.LeaseRenewTimeout.Duration, "time limit of one Lease renewal (default min(5s, --lease-renew-interval/2))")
	fs.DurationVar(&c.ConditionHeartbeat.Duration, "condition-heartbeat", c.ConditionHeartbeat.Duration, "how often unchanged Node conditions are refreshed")
	fs.Var((*checkListValue)(&c.GatingChecks), "gating-checks", "comma-separated checks that must be healthy before owned taints are removed")
	fs.DurationVar(&c.TaintStabilityWindow.Duration, "taint-stability-window", c.TaintStabilityWindow.Duration, "how long gating checks must stay healthy before owned taints are removed")
	fs.BoolVar(&c.ReaddTaintOnFailure, "readd-taint-on-failure", c.ReaddTaintOnFailure, "re-add an owned NoSchedule taint when a gating check later turns unhealthy")
	fs.BoolVar(&c.KubeletRepair, "kubelet-repair", c.KubeletRepair, "restart a failed kubelet unit locally, with backoff")
	fs.Var((*float32Value)(&c.KubeAPIQPS), "kube-api-qps", fmt.Sprintf("API client sustained queries per second (at most %d)", MaxKubeAPIQPS))
	fs.IntVar(&c.KubeAPIBurst, "kube-api-burst", c.KubeAPIBurst, "API client burst")
	return fs
}

// Validate first fills the timeouts left at zero from their intervals, then checks every field
// that mode uses and returns all problems at once, each naming the field and the fix.
func (c *Config) Validate(mode Mode) error {
	c.deriveDefaults()
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }

	if c.HostRoot == "" {
		add("hostRoot is empty; set --host-root to where the host filesystem is mounted (/ when running on the host)")
	}
	for _, u := range []struct{ field, flag, value string }{
		{"kubeletHealthzURL", "--kubelet-healthz-url", c.KubeletHealthzURL},
		{"cniHealthURL", "--cni-health-url", c.CNIHealthURL},
	} {
		if u.value == "" && u.field == "cniHealthURL" {
			continue
		}
		if err := checkURL(u.value); err != nil {
			add("%s (%q) %v; set %s to an http(s) URL such as http://127.0.0.1:10248/healthz", u.field, u.value, err, u.flag)
		}
	}
	if msg := checkUnitName(c.KubeletUnit); msg != "" {
		add("kubeletUnit %q %s; set --kubelet-unit to the kubelet's systemd service unit (usually %s)", c.KubeletUnit, msg, DefaultKubeletUnit)
	}
	if !slices.Contains(cni.PresetNames(), c.CNIPreset) {
		add("cniPreset %q is not a CNI preset; set --cni-preset to one of %s", c.CNIPreset, strings.Join(cni.PresetNames(), ", "))
	}
	errs = append(errs, c.Memory.validate()...)
	if err := c.IMDS.WatcherConfig().Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%w (config file section imds; the endpoint also by --imds-endpoint)", err))
	}
	if c.CNIConfDir == "" {
		add("cniConfDir is empty; set --cni-conf-dir (usually %s)", DefaultCNIConfDir)
	}
	if c.CNIBinDir == "" {
		add("cniBinDir is empty; set --cni-bin-dir (usually %s)", DefaultCNIBinDir)
	}
	for _, k := range c.OwnedTaints {
		if strings.ContainsAny(k, "=:") {
			key, _, _ := strings.Cut(strings.SplitN(k, ":", 2)[0], "=")
			add("ownedTaints entry %q is not a taint key; owned taints are keys only, drop the value and effect (use %q)", k, key)
			continue
		}
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			add("ownedTaints entry %q is not a valid taint key: %s; set --owned-taints to keys like %s", k, strings.Join(msgs, "; "), DefaultOwnedTaint)
		}
	}
	if _, err := ParseLogLevel(c.LogLevel); err != nil {
		add("logLevel %q is not supported; set --log-level to debug, info, warn or error", c.LogLevel)
	}
	if c.LogFormat != "json" && c.LogFormat != "text" {
		add("logFormat %q is not supported; set --log-format to json or text", c.LogFormat)
	}

	if c.KubeletHealthzFailureThreshold < 0 {
		add("kubeletHealthzFailureThreshold (%d) must not be negative; leave it unset for %d", c.KubeletHealthzFailureThreshold, DefaultKubeletHealthzFailureThreshold)
	}
	if mode == ModeCheck {
		if c.Output != OutputText && c.Output != OutputJSON {
			add("output %q is not supported; set --output to text or json", c.Output)
		}
		return errors.Join(errs...)
	}

	if c.NodeName == "" {
		add("nodeName is empty; set --node-name or the NODE_NAME environment variable (from the downward API: spec.nodeName)")
	}
	if c.Namespace == "" {
		add("namespace is empty; set --namespace or POD_NAMESPACE")
	} else if msgs := validation.IsDNS1123Label(c.Namespace); len(msgs) > 0 {
		add("namespace %q is invalid: %s; set --namespace to an existing namespace", c.Namespace, strings.Join(msgs, "; "))
	}
	if c.PodName == "" {
		add("podName is empty; set --pod-name or POD_NAME (from the downward API: metadata.name)")
	}
	if _, _, err := net.SplitHostPort(c.ListenAddress); err != nil {
		add("listenAddress %q is not host:port (%v); set --listen-address like %s", c.ListenAddress, err, DefaultListenAddress)
	}
	positive := []struct {
		field, flag string
		d           time.Duration
	}{
		{"checkInterval", "--check-interval", c.CheckInterval.Duration},
		{"checkTimeout", "--check-timeout", c.CheckTimeout.Duration},
		{"leaseDuration", "--lease-duration", c.LeaseDuration.Duration},
		{"leaseRenewInterval", "--lease-renew-interval", c.LeaseRenewInterval.Duration},
		{"leaseRenewTimeout", "--lease-renew-timeout", c.LeaseRenewTimeout.Duration},
		{"conditionHeartbeat", "--condition-heartbeat", c.ConditionHeartbeat.Duration},
	}
	ok := true
	for _, p := range positive {
		if p.d <= 0 {
			add("%s (%s) must be positive; set %s", p.field, p.d, p.flag)
			ok = false
		}
	}
	if c.TaintStabilityWindow.Duration < 0 {
		add("taintStabilityWindow (%s) must not be negative; set --taint-stability-window to 0 or more", c.TaintStabilityWindow.Duration)
	}
	if ok {
		if c.LeaseDuration.Duration%time.Second != 0 {
			add("leaseDuration (%s) must be whole seconds (Lease stores seconds); set --lease-duration like 40s", c.LeaseDuration.Duration)
		}
		if c.LeaseRenewInterval.Duration >= c.LeaseDuration.Duration {
			add("leaseRenewInterval (%s) must be shorter than leaseDuration (%s); set --lease-renew-interval below %s",
				c.LeaseRenewInterval.Duration, c.LeaseDuration.Duration, c.LeaseDuration.Duration)
		}
		if c.LeaseRenewTimeout.Duration >= c.LeaseRenewInterval.Duration {
			add("leaseRenewTimeout (%s) must be shorter than leaseRenewInterval (%s); set --lease-renew-timeout below %s",
				c.LeaseRenewTimeout.Duration, c.LeaseRenewInterval.Duration, c.LeaseRenewInterval.Duration)
		}
		if c.CheckTimeout.Duration > c.CheckInterval.Duration {
			add("checkTimeout (%s) must not exceed checkInterval (%s); set --check-timeout to %s or less",
				c.CheckTimeout.Duration, c.CheckInterval.Duration, c.CheckInterval.Duration)
		}
		if c.ConditionHeartbeat.Duration < c.CheckInterval.Duration {
			add("conditionHeartbeat (%s) must not be shorter than checkInterval (%s); set --condition-heartbeat to %s or more",
				c.ConditionHeartbeat.Duration, c.CheckInterval.Duration, c.CheckInterval.Duration)
		}
	}
	for _, g := range c.GatingChecks {
		if !known(g) {
			add("gatingChecks entry %q is not a check; set --gating-checks to names among %s", g, joinChecks(KnownChecks))
		}
	}
	if c.ReaddTaintOnFailure && len(c.OwnedTaints) == 0 {
		add("readdTaintOnFailure needs an owned taint to re-add; set --owned-taints or drop --readd-taint-on-failure")
	}
	if c.KubeAPIQPS <= 0 || c.KubeAPIQPS > MaxKubeAPIQPS {
		add("kubeAPIQPS (%g) must be above 0 and at most %d; set --kube-api-qps between 0 and %d", c.KubeAPIQPS, MaxKubeAPIQPS, MaxKubeAPIQPS)
	}
	if c.KubeAPIBurst < 1 {
		add("kubeAPIBurst (%d) must be at least 1; set --kube-api-burst to 1 or more", c.KubeAPIBurst)
	}
	return errors.Join(errs...)
}

// checkUnitName returns what is wrong with a systemd service unit name, or "". The unit is
// looked up over D-Bus (GetUnit needs the full name) and as a file name under the unit
// search path, so it must be a plain "<name>.service".
func checkUnitName(u string) string {
	switch {
	case u == "":
		return "is empty"
	case !strings.HasSuffix(u, ".service") || u == ".service":
		return `is not a service unit name (it must end in ".service")`
	case strings.ContainsAny(u, "/\x00 \t\n"):
		return "contains a slash, a blank or a NUL"
	}
	return ""
}

// validate checks the memory section against the rules of collectors/memory, with zero
// fields taking the collector's defaults, and names each field by its path in the config
// file (memory.<field>), since that is where an operator has to fix it.
func (m MemoryConfig) validate() []error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	or := func(v, def float64) float64 {
		if v == 0 {
			return def
		}
		return v
	}
	orMiB := func(v uint64, def uint64) uint64 {
		if v == 0 {
			return def >> 20
		}
		return v
	}
	psiOn, memOn := m.PSIFullEnterPercent >= 0, m.AvailableCriticalPercent >= 0
	if !psiOn && !memOn {
		add("memory.psiFullEnterPercent and memory.availableCriticalPercent are both negative, which disables both pressure rules; leave one unset (defaults %g and %g)",
			memory.DefaultPSIFullEnterPercent, memory.DefaultAvailableEnterPercent)
	}
	enter := or(m.PSIFullEnterPercent, memory.DefaultPSIFullEnterPercent)
	if !psiOn {
		enter = memory.DefaultPSIFullEnterPercent
	}
	if math.IsNaN(enter) || enter > 100 {
		add("memory.psiFullEnterPercent (%g) must be between 0 and 100 (negative disables the PSI rule); leave it unset for %g", m.PSIFullEnterPercent, memory.DefaultPSIFullEnterPercent)
	} else if exit := or(m.PSIFullExitPercent, memory.DefaultPSIFullExitPercent); math.IsNaN(exit) || exit < 0 || exit > enter {
		add("memory.psiFullExitPercent (%g) must be between 0 and memory.psiFullEnterPercent (%g); leave it unset for %g", exit, enter, memory.DefaultPSIFullExitPercent)
	}
	if low := or(m.AvailableLowPercent, memory.DefaultAvailableLowPercent); math.IsNaN(low) || low < 0 || low > 100 {
		add("memory.availableLowPercent (%g) must be between 0 and 100; leave it unset for %g", low, memory.DefaultAvailableLowPercent)
	}
	crit := or(m.AvailableCriticalPercent, memory.DefaultAvailableEnterPercent)
	if !memOn {
		crit = memory.DefaultAvailableEnterPercent
	}
	if math.IsNaN(crit) || crit > 100 {
		add("memory.availableCriticalPercent (%g) must be between 0 and 100 (negative disables the rule); leave it unset for %g", m.AvailableCriticalPercent, memory.DefaultAvailableEnterPercent)
	} else if clear := or(m.AvailableClearPercent, memory.DefaultAvailableExitPercent); math.IsNaN(clear) || clear < crit || clear > 100 {
		add("memory.availableClearPercent (%g) must be between memory.availableCriticalPercent (%g) and 100; leave it unset for %g", clear, crit, memory.DefaultAvailableExitPercent)
	}
	critMiB, clearMiB := orMiB(m.AvailableCriticalMiB, memory.DefaultAvailableEnterBytes), orMiB(m.AvailableClearMiB, memory.DefaultAvailableExitBytes)
	if clearMiB < critMiB {
		add("memory.availableClearMiB (%d) must be at least memory.availableCriticalMiB (%d)", clearMiB, critMiB)
	}
	const maxMiB = math.MaxUint64 >> 20
	for _, f := range []struct {
		name string
		v    uint64
	}{{"availableLowMiB", m.AvailableLowMiB}, {"availableCriticalMiB", m.AvailableCriticalMiB}, {"availableClearMiB", m.AvailableClearMiB}} {
		if f.v > maxMiB {
			add("memory.%s (%d) is too large; give it in MiB (at most %d)", f.name, f.v, uint64(maxMiB))
		}
	}
	if m.EnterAfter.Duration < 0 {
		add("memory.enterAfter (%s) must not be negative; leave it unset for %s", m.EnterAfter.Duration, memory.DefaultEnterAfter)
	}
	if m.ExitAfter.Duration < 0 {
		add("memory.exitAfter (%s) must not be negative; leave it unset for %s", m.ExitAfter.Duration, memory.DefaultExitAfter)
	}
	return errs
}

func known(check collectors.CheckName) bool { return slices.Contains(KnownChecks, check) }

func joinChecks(cs []collectors.CheckName) string {
	s := make([]string, len(cs))
	for i, c := range cs {
		s[i] = string(c)
	}
	return strings.Join(s, ", ")
}

func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("is not a URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return errors.New("is not an http(s) URL")
	}
	if u.Host == "" {
		return errors.New("has no host")
	}
	return nil
}

// ParseLogLevel maps the --log-level names onto slog levels.
func ParseLogLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info", "":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("unknown log level %q", s)
}

// NewLogger builds the process logger the configuration asks for, writing to w.
func (c *Config) NewLogger(w io.Writer) *slog.Logger {
	level, _ := ParseLogLevel(c.LogLevel)
	opts := &slog.HandlerOptions{Level: level}
	if c.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// RESTConfig builds the API client configuration: the --kubeconfig file when given, else the
// in-cluster service account, else $KUBECONFIG (and ~/.kube/config). The rate limits come from
// the configuration and the user agent identifies the agent and its version in audit logs.
func (c *Config) RESTConfig(userAgent string) (*rest.Config, error) {
	var (
		rc  *rest.Config
		err error
	)
	switch {
	case c.Kubeconfig != "":
		rc, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("load kubeconfig %s: %w", c.Kubeconfig, err)
		}
	default:
		rc, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{})
			rc, err = loader.ClientConfig()
			if err != nil {
				return nil, fmt.Errorf("not in a cluster and no usable kubeconfig (set --kubeconfig or KUBECONFIG): %w", err)
			}
		} else if err != nil {
			return nil, fmt.Errorf("load in-cluster config: %w", err)
		}
	}
	rc.QPS = c.KubeAPIQPS
	rc.Burst = c.KubeAPIBurst
	rc.UserAgent = userAgent
	// Protobuf is cheaper to encode and decode than JSON on a node with a 20 MiB budget;
	// patches are still sent as JSON by client-go.
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	return rc, nil
}

// listValue is a comma-separated list flag. Setting it replaces the list (it does not append),
// so `--owned-taints=` clears the default.
type listValue []string

func (l *listValue) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(*l, ",")
}

func (l *listValue) Set(s string) error {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if p := strings.TrimSpace(part); p != "" {
			out = append(out, p)
		}
	}
	*l = out
	return nil
}

// checkListValue is a comma-separated list of check names, replaced (not appended to) when set.
type checkListValue []collectors.CheckName

func (l *checkListValue) String() string {
	if l == nil {
		return ""
	}
	return joinChecks(*l)
}

func (l *checkListValue) Set(s string) error {
	var names []string
	if err := (*listValue)(&names).Set(s); err != nil {
		return err
	}
	out := make([]collectors.CheckName, len(names))
	for i, n := range names {
		out[i] = collectors.CheckName(n)
	}
	*l = out
	return nil
}

// float32Value is a float32 flag (rest.Config.QPS is float32).
type float32Value float32

func (f *float32Value) String() string {
	if f == nil {
		return "0"
	}
	return fmt.Sprintf("%g", float32(*f))
}

func (f *float32Value) Set(s string) error {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 32)
	if err != nil {
		return fmt.Errorf("not a number: %q", s)
	}
	*f = float32Value(v)
	return nil
}
