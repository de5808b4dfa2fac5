// Command nodevigil-remediator is the central nodevigil controller: it watches every agent and
// kubelet heartbeat, decides which nodes are really dead and takes them away per pool policy
// (cordon, drain, terminate the EC2 instance). Run it as a Deployment of two or more replicas;
// one holds the leader Lease and acts.
//
// The binary only wires flags, the config file, the API client, the EC2 client and the HTTP
// endpoints to remediation.Controller. Exit codes: 0 after SIGTERM/SIGINT, 1 on a runtime
// failure (including leadership lost, so the pod restarts clean), 2 on bad flags or config.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/time/rate"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/nodevigil/nodevigil/remediation"
	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/ec2"
	"github.com/nodevigil/nodevigil/remediation/metricsauth"

	// Mozilla's CA roots, used only when the system has none (the scratch image has none),
	// so the EC2 client verifies the AWS endpoint's certificate.
	buildinfo "github.com/nodevigil/nodevigil/version"

	_ "golang.org/x/crypto/x509roots/fallback"
)

// version and commit are set at build time: -ldflags "-X main.version=... -X main.commit=...".
var (
	version = "dev"
	commit  = ""
)

// versionLine is what --version prints: version, commit and Go version.
func versionLine() string { return buildinfo.Line("nodevigil-remediator", version, commit) }

// Events get their own client and rate limit (see remediation.Config.EventClient).
const (
	eventQPS   = 10
	eventBurst = 50
)

// watchListEnv turns on client-go's streaming initial list, so the informers decode Nodes one
// at a time instead of as one 10,000-item response: at 10,000 nodes it cut the start-up peak
// RSS by a third (docs/benchmarks.md). An operator may still set it to false.
const watchListEnv = "KUBE_FEATURE_WatchListClient"

// startupGCPercent is GOGC while the informers list and sync (remediation.Config
// StartupGCPercent), unless the operator set GOGC: the initial lists' garbage, not what the
// caches keep, made the start-up peak RSS at 10,000 nodes (docs/benchmarks.md).
const startupGCPercent = 25

// steadyGCPercent is GOGC for the rest of the process's life, unless the operator set GOGC.
// What the remediator keeps is its caches (about 50 MB live at 10,000 nodes); at Go's default
// of 100 the heap grows to twice that between two collections, and at 10,000 nodes the steady
// RSS sat just under 150 MiB (docs/benchmarks.md). 50 holds the heap to one and a half times
// the live data for a collection twice as often; the allocation between collections is mostly
// decoded Lease renewals, so the cost is a few mCPU.
const steadyGCPercent = 50

func main() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(steadyGCPercent) // Config.StartupGCPercent restores it after the sync
	}
	if _, set := os.LookupEnv(watchListEnv); !set {
		_ = os.Setenv(watchListEnv, "true") // read by client-go when the first informer starts
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	if len(os.Args) == 2 && (os.Args[1] == "--version" || os.Args[1] == "-version" || os.Args[1] == "version") {
		fmt.Println(versionLine())
		os.Exit(0)
	}
	code := run(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

// run is main without os.Exit, returning the exit code.
func run(ctx context.Context, args []string, stderr io.Writer) int {
	o, err := parseOptions(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "nodevigil-remediator: %v\n", err)
		return 2
	}
	rc, err := config.Load(o.configPath)
	if err != nil {
		fmt.Fprintf(stderr, "nodevigil-remediator: %v\n", err)
		return 2
	}
	if o.dryRun.set {
		rc.DryRun = o.dryRun.value
	}
	if !rc.DryRun && o.clusterTagKey == "" {
		fmt.Fprintln(stderr, "nodevigil-remediator: --cluster-tag-key: required when not in dry-run, so that only this cluster's instances are ever terminated (e.g. kubernetes.io/cluster/<name>)")
		return 2
	}
	log := o.logger(stderr)
	slog.SetDefault(log)
	// client-go's own lines (leader election, reflector warnings, API deprecation notices) go
	// through the same handler, so one process speaks in one format and obeys --log-level.
	klog.SetSlogLogger(log)
	if err := serve(ctx, o, rc, log); err != nil {
		log.Error("remediator stopped", "err", err)
		return 1
	}
	return 0
}

func serve(ctx context.Context, o *options, rc *config.Config, log *slog.Logger) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	restCfg, err := restConfig(o)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("build API client: %w", err)
	}
	eventCfg := rest.CopyConfig(restCfg)
	eventCfg.QPS, eventCfg.Burst = eventQPS, eventBurst
	eventClient, err := kubernetes.NewForConfig(eventCfg)
	if err != nil {
		return fmt.Errorf("build event client: %w", err)
	}

	var cloud remediation.Cloud
	var events remediation.ScheduledEventSource
	if !rc.DryRun || o.clusterTagKey != "" {
		// Dry-run describes instances (read-only) to record "would be Blocked" for instances
		// that are not the cluster's; it needs --cluster-tag-key for that, and without it
		// shadow mode needs no AWS access at all.
		c, err := ec2.New(ctx, ec2.Config{
			Region:        o.awsRegion,
			Endpoint:      o.ec2Endpoint,
			ClusterTagKey: o.clusterTagKey,
			// nil keeps ec2.DefaultClusterTagValues.
			ClusterTagValues: o.clusterTagVals,
			Registerer:       reg,
			Logger:           log.With("component", "ec2"),
		})
		if err != nil {
			return fmt.Errorf("build EC2 client: %w", err)
		}
		b, err := ec2.NewBatcher(c, ec2.BatcherConfig{GroupCommit: true})
		if err != nil {
			return fmt.Errorf("build EC2 batcher: %w", err)
		}
		db, err := ec2.NewDescribeBatcher(c)
		if err != nil {
			return fmt.Errorf("build EC2 describe batcher: %w", err)
		}
		cloud = ec2Cloud{describer: db, batcher: b}
		if o.eventsInterval > 0 && !rc.DryRun {
			events = ec2Events{client: c, limiter: rate.NewLimiter(scheduledEventsQPS, scheduledEventsBurst)}
		}
	}
	if rc.DryRun {
		// Dry-run never terminates; the wrapper makes sure of it.
		cloud = remediation.DescribeOnly(cloud)
	}

	startupGC := startupGCPercent
	if _, set := os.LookupEnv("GOGC"); set {
		startupGC = 0
	}
	ctrl, err := remediation.New(remediation.Config{
		Client:                  client,
		EventClient:             eventClient,
		Cloud:                   cloud,
		Remediator:              rc,
		Namespace:               o.namespace,
		KubeletLeaseNamespace:   o.kubeletLeaseNS,
		ResyncPeriod:            o.resyncPeriod,
		Workers:                 o.workers,
		FirstReadyRate:          o.firstReadyRate,
		FirstReadyBurst:         o.firstReadyBurst,
		TerminationConfirmDelay: o.confirmDelay,
		Registry:                reg,
		Logger:                  log,
		ScheduledEvents:         events,
		ScheduledEventsInterval: o.eventsInterval,
		StartupGCPercent:        startupGC,
		LeaderElection: remediation.LeaderElectionConfig{
			Enabled:       o.leaderElect,
			LeaseDuration: o.leaseDuration,
			RenewDeadline: o.renewDeadline,
			RetryPeriod:   o.retryPeriod,
		},
	})
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", o.listenAddress)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", o.listenAddress, err)
	}
	srv := &http.Server{Handler: ctrl.Handler(), ReadHeaderTimeout: 5 * time.Second}
	if o.metricsSecure {
		host, _ := os.Hostname()
		tlsCfg, err := metricsauth.TLSConfig(o.metricsTLSCert, o.metricsTLSKey, []string{host, "localhost"}, time.Now())
		if err != nil {
			_ = ln.Close()
			return err
		}
		srv.Handler = metricsauth.Handler(client, log.With("component", "metrics"), srv.Handler)
		ln = tls.NewListener(ln, tlsCfg)
	}
	srvErr := make(chan error, 1)
	go func() { srvErr <- srv.Serve(ln) }()
	defer func() {
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()

	if o.pprofAddress != "" {
		psrv, addr, err := servePprof(o.pprofAddress)
		if err != nil {
			return err
		}
		defer func() { _ = psrv.Close() }()
		log.Info("serving profiles", "address", addr.String())
	}

	policies := make([]string, 0, len(rc.Policies))
	for _, p := range rc.Policies {
		policies = append(policies, p.Name+"="+string(p.Action))
	}
	log.Info("starting", "identity", ctrl.Identity(), "dry_run", rc.DryRun, "policies", policies,
		"cluster_tag_key", o.clusterTagKey, "cluster_tag_values", o.clusterTagVals, "leader_elect", o.leaderElect, "listen_address", o.listenAddress, "metrics_secure", o.metricsSecure, "agent_namespace", rc.AgentNamespace, "node_selector", rc.NodeSelector)

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- ctrl.Run(runCtx) }()
	select {
	case err := <-runErr:
		return err
	case err := <-srvErr:
		cancel()
		<-runErr
		return fmt.Errorf("serve %s: %w", o.listenAddress, err)
	}
}

// restConfig builds the API client configuration: --kubeconfig, else in-cluster, else
// $KUBECONFIG and ~/.kube/config.
func restConfig(o *options) (*rest.Config, error) {
	var (
		rc  *rest.Config
		err error
	)
	if o.kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", o.kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("load kubeconfig %s: %w", o.kubeconfig, err)
		}
	} else {
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
	rc.QPS = float32(o.kubeAPIQPS)
	rc.Burst = o.kubeAPIBurst
	rc.UserAgent = remediation.Component
	// Protobuf halves decode cost and memory of 10,000 Nodes and 20,000 Leases at start.
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	return rc, nil
}

// ec2Cloud adapts the ec2 package to remediation.Cloud. Terminations go through a Batcher and
// describes through a DescribeBatcher, so the steps of many workers at once (a dead zone) share
// TerminateInstances and DescribeInstances calls.
type ec2Cloud struct {
	describer *ec2.DescribeBatcher
	batcher   *ec2.Batcher
}

func (e ec2Cloud) Terminate(ctx context.Context, id string) (remediation.TerminateOutcome, error) {
	o, err := e.batcher.Terminate(ctx, id)
	if o.Result == "" {
		// No outcome at all: the call failed as a whole (or ctx ended).
		return remediation.TerminateOutcome{}, classify(err)
	}
	out := remediation.TerminateOutcome{
		Result:        remediation.TerminateResult(o.Result),
		PreviousState: o.PreviousState,
		CurrentState:  o.CurrentState,
		Err:           o.Err,
	}
	if o.Result == ec2.ResultFailed {
		out.Err = classify(o.Err)
	}
	return out, nil
}

func (e ec2Cloud) Describe(ctx context.Context, id string) (remediation.Instance, bool, error) {
	inst, ok, err := e.describer.Describe(ctx, id)
	if err != nil {
		return remediation.Instance{}, false, classify(err)
	}
	if !ok {
		return remediation.Instance{}, false, nil
	}
	return remediation.Instance{ID: inst.ID, State: inst.State, Zone: inst.Zone, Owned: inst.Owned,
		Lifecycle: inst.Lifecycle, AutoScalingGroup: inst.Tags[ec2.TagAutoScalingGroup]}, true, nil
}

// The scheduled events poll's pace: 5 DescribeInstanceStatus calls a second, bursts of 10, so
// a poll of 10,000 instances (100 calls) takes about 20 s and leaves EC2's request budget to
// the rest of the account.
const (
	scheduledEventsQPS   = 5
	scheduledEventsBurst = 10
)

// ec2Events adapts ec2.Client.ScheduledEvents to remediation.ScheduledEventSource, paced by
// its own limiter.
type ec2Events struct {
	client  *ec2.Client
	limiter *rate.Limiter
}

func (e ec2Events) ScheduledEvents(ctx context.Context, ids []string) (map[string][]ec2.ScheduledEvent, error) {
	m, err := e.client.ScheduledEvents(ctx, ids, e.limiter)
	return m, classify(err)
}

// classify wraps an ec2 error in a remediation.CloudError, so the pipeline tells a refusal
// (Unauthorized) from a transient failure without knowing the AWS SDK.
func classify(err error) error {
	if err == nil {
		return nil
	}
	return &remediation.CloudError{Kind: ec2.ErrorKind(err), Err: err}
}
