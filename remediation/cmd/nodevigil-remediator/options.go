package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nodevigil/nodevigil/remediation"
	"github.com/nodevigil/nodevigil/remediation/ec2"
)

// options are the command line, validated.
type options struct {
	kubeconfig      string
	namespace       string
	configPath      string
	dryRun          optionalBool
	listenAddress   string
	metricsSecure   bool
	metricsTLSCert  string
	metricsTLSKey   string
	leaderElect     bool
	leaseDuration   time.Duration
	renewDeadline   time.Duration
	retryPeriod     time.Duration
	ec2Endpoint     string
	awsRegion       string
	clusterTagKey   string
	clusterTagVals  []string
	kubeAPIQPS      float64
	kubeAPIBurst    int
	resyncPeriod    time.Duration
	workers         int
	firstReadyRate  float64
	firstReadyBurst int
	logLevel        string
	logFormat       string
	slogLevel       slog.Level
	confirmDelay    time.Duration
	kubeletLeaseNS  string
	pprofAddress    string
	eventsInterval  time.Duration
}

// maxFirstReadyRate bounds --first-ready-rate: the records are bookkeeping and share the
// client's rate limit (--kube-api-qps, default 50/s) with remediation.
const maxFirstReadyRate = 50

// parseOptions parses args. Every error names the flag and says what is wanted.
func parseOptions(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" {
		ns = remediation.DefaultNamespace
	}
	fs := flag.NewFlagSet("nodevigil-remediator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "path to a kubeconfig; empty means in-cluster, then $KUBECONFIG")
	fs.StringVar(&o.namespace, "namespace", ns, "namespace of the leader election Lease (default $POD_NAMESPACE or "+remediation.DefaultNamespace+")")
	fs.StringVar(&o.configPath, "config", "", "path to a RemediatorConfig file; empty means the built-in defaults (dry-run)")
	fs.Var(&o.dryRun, "dry-run", "decide and report but change nothing; when set, overrides dryRun in the config file")
	fs.StringVar(&o.listenAddress, "listen-address", ":9737", "address serving /healthz, /readyz and /metrics")
	fs.BoolVar(&o.metricsSecure, "metrics-secure", true, "serve over TLS and require scrapers of /metrics to authenticate (TokenReview) and be authorised to get /metrics (SubjectAccessReview); /healthz and /readyz stay open")
	fs.StringVar(&o.metricsTLSCert, "metrics-tls-cert-file", "", "serving certificate (PEM) for --metrics-secure; empty means a self-signed one made at start")
	fs.StringVar(&o.metricsTLSKey, "metrics-tls-key-file", "", "private key (PEM) of --metrics-tls-cert-file")
	fs.BoolVar(&o.leaderElect, "leader-elect", true, "hold a leader Lease so that only one replica acts")
	fs.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", remediation.DefaultLeaseDuration, "how long a leader Lease is valid without renewal")
	fs.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", remediation.DefaultRenewDeadline, "how long the leader keeps trying to renew before it stops acting")
	fs.DurationVar(&o.retryPeriod, "leader-elect-retry-period", remediation.DefaultRetryPeriod, "how often leader election is retried")
	fs.StringVar(&o.ec2Endpoint, "ec2-endpoint", "", "EC2 endpoint URL override (an emulator, a VPC endpoint)")
	fs.StringVar(&o.awsRegion, "aws-region", "", "AWS region; empty means the SDK's default chain (AWS_REGION)")
	fs.Func("cluster-tag-values", "comma-separated values of --cluster-tag-key that mark an instance as this cluster's to terminate (default "+strings.Join(ec2.DefaultClusterTagValues, ",")+"); e.g. true for an opt-in tag such as nodevigil.io/remediate=true", func(s string) error {
		o.clusterTagVals = nil
		for _, v := range strings.Split(s, ",") {
			if v = strings.TrimSpace(v); v != "" {
				o.clusterTagVals = append(o.clusterTagVals, v)
			}
		}
		if len(o.clusterTagVals) == 0 {
			return fmt.Errorf("%q lists no value; leave the flag out for the defaults (%s)", s, strings.Join(ec2.DefaultClusterTagValues, ","))
		}
		return nil
	})
	fs.StringVar(&o.clusterTagKey, "cluster-tag-key", "", "EC2 tag key marking the cluster's instances, e.g. kubernetes.io/cluster/<name>; required unless dry-run, where it makes dry-run describe instances (read-only) to report those it would leave Blocked")
	fs.Float64Var(&o.kubeAPIQPS, "kube-api-qps", 50, "API server request rate limit (Node patches, drains; Events have their own limit)")
	fs.IntVar(&o.kubeAPIBurst, "kube-api-burst", 200, "API server request burst: a zone failing at once needs ~3 patches per node at the same moment")
	fs.DurationVar(&o.resyncPeriod, "resync-period", remediation.DefaultResyncPeriod, "every node is reconsidered at least this often")
	fs.IntVar(&o.workers, "workers", remediation.DefaultWorkers, "nodes reconciled concurrently")
	fs.Float64Var(&o.firstReadyRate, "first-ready-rate", remediation.DefaultFirstReadyRate, "first-ready annotations (nodevigil.io/first-ready-at) written per second in the background; a node that stops looking ready is recorded at once whatever the rate (remediation/README.md)")
	fs.IntVar(&o.firstReadyBurst, "first-ready-burst", remediation.DefaultFirstReadyBurst, "first-ready annotations the background writer may send at once, for nodes joining together")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "json", "json or text")
	fs.DurationVar(&o.confirmDelay, "termination-confirm-delay", remediation.DefaultTerminationConfirmDelay, "how long after a termination request EC2's NotFound counts as proof the instance is gone")
	fs.StringVar(&o.kubeletLeaseNS, "kubelet-lease-namespace", remediation.DefaultKubeletLeaseNamespace, "namespace of the kubelets' Leases")
	fs.StringVar(&o.pprofAddress, "pprof-address", "", "loopback address (e.g. 127.0.0.1:6060) serving Go's /debug/pprof/ profiles over plain HTTP; empty (the default) serves none. Loopback only: reach it with kubectl port-forward")
	fs.DurationVar(&o.eventsInterval, "scheduled-events-interval", remediation.DefaultScheduledEventsInterval, "how often the leader lists the scheduled events of the nodes' instances (DescribeInstanceStatus, one call per 100 instances), so nodes without an agent get interruption decisions too; 0 turns the poll off (agents' reports only); dry-run never polls")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q: every setting is a flag", fs.Arg(0))
	}
	return o, o.validate()
}

func (o *options) validate() error {
	var errs []error
	fail := func(flagName, format string, args ...any) {
		errs = append(errs, fmt.Errorf("--%s: %s", flagName, fmt.Sprintf(format, args...)))
	}
	if o.namespace == "" {
		fail("namespace", "must not be empty")
	}
	if o.listenAddress == "" {
		fail("listen-address", "must not be empty; the probes and metrics are served there (e.g. :9737)")
	}
	if o.pprofAddress != "" {
		if err := loopbackAddress(o.pprofAddress); err != nil {
			fail("pprof-address", "%v; profiles show the remediator's internals, so they are served on loopback only (e.g. 127.0.0.1:6060, reached with kubectl port-forward), or leave the flag out", err)
		}
	}
	if (o.metricsTLSCert == "") != (o.metricsTLSKey == "") {
		fail("metrics-tls-cert-file", "--metrics-tls-cert-file and --metrics-tls-key-file must be set together")
	}
	if !o.metricsSecure && o.metricsTLSCert != "" {
		fail("metrics-tls-cert-file", "is used only with --metrics-secure=true")
	}
	if o.leaderElect {
		if o.retryPeriod <= 0 {
			fail("leader-elect-retry-period", "%s must be above 0", o.retryPeriod)
		}
		if float64(o.renewDeadline) <= 1.2*float64(o.retryPeriod) {
			fail("leader-elect-renew-deadline", "%s must be longer than 1.2 × --leader-elect-retry-period (%s)", o.renewDeadline, o.retryPeriod)
		}
		if o.leaseDuration <= o.renewDeadline {
			fail("leader-elect-lease-duration", "%s must be longer than --leader-elect-renew-deadline (%s)", o.leaseDuration, o.renewDeadline)
		}
	}
	if o.ec2Endpoint != "" {
		if u, err := url.Parse(o.ec2Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			fail("ec2-endpoint", "%q is not an http(s) URL, e.g. https://ec2.us-east-1.amazonaws.com", o.ec2Endpoint)
		}
	}
	if o.kubeAPIQPS <= 0 {
		fail("kube-api-qps", "%v must be above 0", o.kubeAPIQPS)
	}
	if o.kubeAPIBurst < 1 {
		fail("kube-api-burst", "%d must be at least 1", o.kubeAPIBurst)
	}
	if o.resyncPeriod < 10*time.Second {
		fail("resync-period", "%s is too short; at least 10s (default %s)", o.resyncPeriod, remediation.DefaultResyncPeriod)
	}
	if o.workers < 1 {
		fail("workers", "%d must be at least 1", o.workers)
	}
	// NaN compares false with everything, so it is refused by the negated test.
	if !(o.firstReadyRate > 0 && o.firstReadyRate <= maxFirstReadyRate) {
		fail("first-ready-rate", "%v must be above 0 and at most %v per second (default %v)", o.firstReadyRate, maxFirstReadyRate, remediation.DefaultFirstReadyRate)
	}
	if o.firstReadyBurst < 1 {
		fail("first-ready-burst", "%d must be at least 1 (default %d)", o.firstReadyBurst, remediation.DefaultFirstReadyBurst)
	}
	if o.confirmDelay <= 0 {
		fail("termination-confirm-delay", "%s must be above 0", o.confirmDelay)
	}
	if o.eventsInterval != 0 && o.eventsInterval < 10*time.Second {
		fail("scheduled-events-interval", "%s is too short; at least 10s (default %s), or 0 to turn the poll off", o.eventsInterval, remediation.DefaultScheduledEventsInterval)
	}
	if o.kubeletLeaseNS == "" {
		fail("kubelet-lease-namespace", "must not be empty")
	}
	switch strings.ToLower(o.logLevel) {
	case "debug":
		o.slogLevel = slog.LevelDebug
	case "info":
		o.slogLevel = slog.LevelInfo
	case "warn", "warning":
		o.slogLevel = slog.LevelWarn
	case "error":
		o.slogLevel = slog.LevelError
	default:
		fail("log-level", "%q is not a level; use debug, info, warn or error", o.logLevel)
	}
	if o.logFormat != "json" && o.logFormat != "text" {
		fail("log-format", "%q is not a format; use json or text", o.logFormat)
	}
	return errors.Join(errs...)
}

// logger builds the process logger.
func (o *options) logger(w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: o.slogLevel}
	if o.logFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// optionalBool is a boolean flag that remembers whether it was set, so --dry-run=false can
// override a file that says dryRun: true, and leaving it out changes nothing.
type optionalBool struct {
	set   bool
	value bool
}

func (b *optionalBool) String() string {
	if b == nil || !b.set {
		return ""
	}
	return strconv.FormatBool(b.value)
}

func (b *optionalBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("%q is not a boolean", s)
	}
	b.set, b.value = true, v
	return nil
}

// IsBoolFlag lets --dry-run be given without a value.
func (b *optionalBool) IsBoolFlag() bool { return true }

// loopbackAddress checks that addr is host:port with a loopback host (an IP or localhost).
func loopbackAddress(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%q is not a loopback address", addr)
}
