// Package remediation is the central nodevigil remediator: a leader-elected controller that
// watches every agent heartbeat Lease, every kubelet Lease and every Node, decides with
// remediation/decide which nodes are really dead, and takes them away per pool policy —
// cordon, drain through the Eviction API, terminate the EC2 instance, delete the Node.
//
// The controller is level-based. A workqueue of node names is fed by informer events and by a
// timed requeue at exactly the moment a node's decision can change (a Lease expiring, a
// toleration ending); each reconcile recomputes the decision from the current cached state. No
// decision depends on having seen an event.
//
// Every pipeline step is recorded on the Node (annotations, see decide.Annotation*) before it is
// taken, in a patch guarded by the Node's resourceVersion, so a new leader resumes exactly
// where the old one stopped and nothing is done twice; the one exception is Terminating, the
// point of no return, recorded once EC2 accepted (an intent annotation before the call makes
// a replay safe). The instance's ownership is verified before the first disruptive step;
// outcomes retrying cannot fix leave the node Blocked and handed back (see blockAndRelease).
//
// Safety rails (design brief §4), applied before every step up to the point of no return: the
// pool's maxUnhealthy, the pool's maxInFlight (at marking), zone and cluster pauses when too
// many nodes are impaired, and a global token bucket on terminations.
// Lease staleness is judged from when this replica saw each Lease change, by its own clock, never
// from the renewTime a node's clock wrote (observe.go); a new leader starts observing from zero
// and judges nothing stale before one agent Lease duration plus grace; so does a leader after a
// time it could not observe (no Lease changing for a whole duration: the API server unreachable). Dry-run
// decides, counts and records "would terminate" (an Event, a metric, a log line and the
// nodevigil.io/dry-run-decision annotation) and changes nothing else.
//
// New builds a Controller from a Config and Run runs it until its context ends or it loses
// leadership, so tests and the binary run exactly the same code.
//
// The files follow the steps a node goes through:
//
//   - controller.go: Config, New, Run, leader election, the workers (the frame).
//   - observe.go: observe — the informers, the Lease observers (by this replica's clock), the
//     agents-missing check.
//   - decide.go: decide — the caches turned into a decide.Input, the decision reported and
//     handed to the act step (the judgement itself is the pure package remediation/decide).
//   - safety.go: the rails every step checks (pauses, per-pool caps, in-flight, rate limit).
//   - pipeline.go: act — the state machine and the guarded Node patch; its steps are in
//     cordon.go (mark, verify, cordon), drain.go, terminate.go (intent, TerminateInstances,
//     confirm, delete the Node), release.go (release, Blocked) and dryrun.go.
//   - cloud.go: the Cloud seam, error kinds and the per-node backoff of cloud calls.
package remediation

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/decide"
)

// Component is the Event source and the leader Lease's default name.
const Component = "nodevigil-remediator"

// Defaults of Config.
const (
	DefaultNamespace             = "nodevigil-system"
	DefaultKubeletLeaseNamespace = "kube-node-lease"
	DefaultResyncPeriod          = 5 * time.Minute
	// DefaultWorkers is 16: a worker holds a due node for about six round trips (its ownership
	// Describe, the marking patch, the drain's pod list, the intent, TerminateInstances,
	// Terminating; four without a drain, whose marking patch records the intent), so when a
	// zone fails at once the last node waits for (nodes / workers) of those sequences. More
	// workers do not shorten that wait: at 2,000 nodes 64 workers sent all 50 marking patches
	// at once and the API server took as long to answer them (docs/benchmarks.md, session 9).
	// With 4, 50 nodes due together reached TerminateInstances after 2.9 s (p99) at 2,000
	// nodes; the API requests of 50 such nodes fit the client's default burst of 200
	// (docs/benchmarks.md, session 7). The work is I/O, not CPU.
	DefaultWorkers                 = 16
	DefaultLeaseDuration           = 15 * time.Second
	DefaultRenewDeadline           = 10 * time.Second
	DefaultRetryPeriod             = 2 * time.Second
	DefaultTerminationConfirmDelay = 2 * time.Minute
	DefaultConfirmPollInterval     = 5 * time.Second
	DefaultBlockedRequeue          = 30 * time.Second
	DefaultDrainRetryInterval      = 5 * time.Second
	DefaultCensusMaxAge            = time.Second
	DefaultCensusInterval          = 10 * time.Second
	// DefaultBlockedRecheck is how long a node recorded Blocked (not owned, unauthorized,
	// invalid providerID, instance not found) is left alone before it is verified again: one
	// DescribeInstances per blocked node every 5 minutes costs nothing next to EC2's limits,
	// and a tag added or an IAM policy fixed is picked up within minutes. A changed providerID
	// is rechecked at once.
	DefaultBlockedRecheck = 5 * time.Minute
	// DefaultCloudBackoffBase and DefaultCloudBackoffMax bound the per-node backoff after a
	// transient cloud failure (throttling, 5xx, timeouts): 2s doubling up to 5m, ±20% jitter.
	DefaultCloudBackoffBase = 2 * time.Second
	DefaultCloudBackoffMax  = 5 * time.Minute
)

// LabelAgentNode is the label every agent Lease carries; the agent informer selects on it.
const LabelAgentNode = "nodevigil.io/node"

// ErrLostLeadership is returned by Run when this replica stopped being the leader. The process
// should exit and restart clean rather than try to lead again with state from its first term.
var ErrLostLeadership = errors.New("remediation: lost leadership")

// Config configures a Controller. Only Client is required; every other zero value takes the
// default named on the field.
type Config struct {
	// Client talks to the API server.
	Client kubernetes.Interface
	// Cloud terminates and describes instances. Required unless Remediator.DryRun.
	Cloud Cloud
	// Remediator is the validated policy configuration. Default config.Default() (dry-run).
	Remediator *config.Config
	// Namespace holds the leader Lease. Default DefaultNamespace.
	Namespace string
	// KubeletLeaseNamespace holds the kubelets' Leases. Default kube-node-lease.
	KubeletLeaseNamespace string
	// LeaderElection configures leader election; disabled in the zero value (tests, a single
	// replica). The binary enables it.
	LeaderElection LeaderElectionConfig
	// ResyncPeriod is the informers' resync: every node is reconsidered at least this often.
	// Default 5m.
	ResyncPeriod time.Duration
	// Workers is how many nodes are reconciled concurrently. Default DefaultWorkers (16).
	Workers int
	// FirstReadyRate is how many first-ready annotations per second the background writer
	// sends (firstready.go). Default DefaultFirstReadyRate.
	FirstReadyRate float64
	// FirstReadyBurst is how many first-ready annotations the background writer may send at
	// once (nodes joining together). Default DefaultFirstReadyBurst.
	FirstReadyBurst int
	// ObservePeriod is how long a new leader watches before judging anything stale. Default
	// the agent Lease duration plus its grace (decide.StaleAfter): the moment a Lease this
	// leader saw at its start and never again would go stale.
	ObservePeriod time.Duration
	// TerminationConfirmDelay is how long after a termination request EC2's NotFound is taken
	// as proof the instance is gone (NotFound earlier may be eventual consistency). Default 2m.
	TerminationConfirmDelay time.Duration
	// ConfirmPollInterval is how often a requested termination is re-described until
	// confirmed. Default 5s.
	ConfirmPollInterval time.Duration
	// BlockedRequeue is when a node blocked by a safety rail is looked at again. Default 30s.
	BlockedRequeue time.Duration
	// DrainRetryInterval is how soon refused evictions are retried. Default 5s.
	DrainRetryInterval time.Duration
	// BlockedRecheck is how long a node recorded Blocked is left alone before it is verified
	// again. Default DefaultBlockedRecheck (5m).
	BlockedRecheck time.Duration
	// Clock is the time source of decisions, requeues and the rate limiter. Default real.
	Clock clock.WithTicker
	// Registry receives the metrics and is served on /metrics. Default a new private registry.
	Registry *prometheus.Registry
	// Recorder records Events. Default: a broadcaster writing to the API server through
	// EventClient.
	Recorder record.EventRecorder
	// EventClient carries the default recorder's Events. It is separate from Client so that
	// Events, which are many and lossy, never eat the rate limit of the pipeline's Node patches
	// when many nodes fail at once. Default Client.
	EventClient kubernetes.Interface
	// Logger receives structured logs. Default slog.Default().
	Logger *slog.Logger
	// ScheduledEvents lists the active scheduled events of instances (DescribeInstanceStatus),
	// so nodes without an agent get interruption decisions too (interruptions_poll.go). Nil
	// disables the poll: only events the agents report are acted on.
	ScheduledEvents ScheduledEventSource
	// ScheduledEventsInterval is how often the leader polls ScheduledEvents. Default
	// DefaultScheduledEventsInterval (1m).
	ScheduledEventsInterval time.Duration
	// StartupGCPercent, when above 0, is the garbage collector's GOGC while the informers list
	// and sync; the previous setting is restored once they have synced. The initial lists
	// decode every Node and Lease in full before the transforms strip them: at 10,000 nodes
	// hundreds of megabytes of garbage in seconds, which set the process's peak RSS. Zero
	// leaves the collector alone (tests; an operator who set GOGC).
	StartupGCPercent int
}

// LeaderElectionConfig configures leader election through a coordination Lease.
type LeaderElectionConfig struct {
	// Enabled turns leader election on: only the holder of the Lease acts.
	Enabled bool
	// LeaseName is the Lease's name in Config.Namespace. Default "nodevigil-remediator".
	LeaseName string
	// Identity names this replica in the Lease. Default: $POD_NAME (or the host name) and a
	// random suffix, so a restarted pod never inherits its predecessor's term.
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod are client-go's. Defaults 15s, 10s, 2s.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// Controller is the remediator. Build it with New, run it with Run.
type Controller struct {
	cfg      Config
	rc       *config.Config
	client   kubernetes.Interface
	cloud    Cloud
	clock    clock.WithTicker
	log      *slog.Logger
	recorder record.EventRecorder
	bcast    record.EventBroadcaster
	registry *prometheus.Registry
	metrics  *metrics
	limiter  *rate.Limiter
	observe  time.Duration

	factories     []informers.SharedInformerFactory
	nodes         corelisters.NodeLister
	kubeletLeases coordinationlisters.LeaseNamespaceLister
	agentLeases   coordinationlisters.LeaseNamespaceLister
	synced        []cache.InformerSynced
	queue         workqueue.TypedRateLimitingInterface[string]
	leHealth      *leaderelection.HealthzAdaptor

	ran            atomic.Bool
	leading        atomic.Bool
	observingSince atomic.Int64 // UnixNano; 0 before leading

	// kubeletObs and agentObs keep when each Lease was last seen changing (observe.go).
	kubeletObs, agentObs *leaseObserver
	syncedAt             atomic.Int64 // UnixNano when the informers synced; 0 before
	agentsMissingLogged  atomic.Bool
	blindLogged          atomic.Bool
	verifications        *prometheus.CounterVec

	mu     sync.Mutex
	memory map[string]*nodeMemory
	// deleted remembers the UIDs of the Nodes this replica deleted, until deletedTTL has
	// passed (terminate.go, deleteNode). c.mu guards it.
	deleted map[types.UID]time.Time

	// readyMem, firstReadyQueue and firstReadyLimiter keep the first-ready record
	// (firstready.go).
	readyMem          readyMemory
	firstReadyQueue   workqueue.TypedDelayingInterface[string]
	firstReadyLimiter *rate.Limiter
	// intr is the interruption handling's own state (interruptions_trust.go).
	intr *interruptionState

	gateMu       sync.Mutex
	census       *census
	reservations map[string]reservation
	// pauseEnded is when each storm pause last ended ("" for the cluster-wide one, else the
	// zone), by the census's clock: steps stay held until every healed node could be seen
	// renewing (safety.go, settling).
	pauseEnded map[string]time.Time
}

// New builds a Controller. It validates cfg, registers metrics and informers, and does not talk
// to the API server until Run.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil {
		return nil, errors.New("remediation: Config.Client is required")
	}
	if cfg.Remediator == nil {
		cfg.Remediator = config.Default()
	}
	if cfg.Cloud == nil && !cfg.Remediator.DryRun {
		return nil, errors.New("remediation: Config.Cloud is required unless the configuration is in dry-run mode")
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if cfg.KubeletLeaseNamespace == "" {
		cfg.KubeletLeaseNamespace = DefaultKubeletLeaseNamespace
	}
	le := &cfg.LeaderElection
	if le.LeaseName == "" {
		le.LeaseName = Component
	}
	if le.Identity == "" {
		id, err := DefaultIdentity()
		if err != nil {
			return nil, err
		}
		le.Identity = id
	}
	setDefault(&le.LeaseDuration, DefaultLeaseDuration)
	setDefault(&le.RenewDeadline, DefaultRenewDeadline)
	setDefault(&le.RetryPeriod, DefaultRetryPeriod)
	if le.Enabled && le.LeaseDuration <= le.RenewDeadline {
		return nil, fmt.Errorf("remediation: leader election lease duration %s must be longer than the renew deadline %s", le.LeaseDuration, le.RenewDeadline)
	}
	setDefault(&cfg.ResyncPeriod, DefaultResyncPeriod)
	setDefault(&cfg.ObservePeriod, decide.StaleAfter(cfg.Remediator.AgentLeaseDuration))
	setDefault(&cfg.TerminationConfirmDelay, DefaultTerminationConfirmDelay)
	setDefault(&cfg.ConfirmPollInterval, DefaultConfirmPollInterval)
	setDefault(&cfg.BlockedRequeue, DefaultBlockedRequeue)
	setDefault(&cfg.DrainRetryInterval, DefaultDrainRetryInterval)
	setDefault(&cfg.BlockedRecheck, DefaultBlockedRecheck)
	if cfg.FirstReadyRate <= 0 {
		cfg.FirstReadyRate = DefaultFirstReadyRate
	}
	if cfg.FirstReadyBurst <= 0 {
		cfg.FirstReadyBurst = DefaultFirstReadyBurst
	}
	setDefault(&cfg.ScheduledEventsInterval, DefaultScheduledEventsInterval)
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}

	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	c := &Controller{
		cfg:          cfg,
		rc:           cfg.Remediator,
		client:       cfg.Client,
		cloud:        cfg.Cloud,
		clock:        cfg.Clock,
		log:          cfg.Logger,
		registry:     cfg.Registry,
		metrics:      m,
		observe:      cfg.ObservePeriod,
		limiter:      rate.NewLimiter(rate.Limit(cfg.Remediator.TerminationRateLimit.PerMinute/60), cfg.Remediator.TerminationRateLimit.Burst),
		memory:       map[string]*nodeMemory{},
		deleted:      map[types.UID]time.Time{},
		reservations: map[string]reservation{},
		pauseEnded:   map[string]time.Time{},
		leHealth:     leaderelection.NewLeaderHealthzAdaptor(20 * time.Second),
		kubeletObs:   newLeaseObserver(decide.DefaultKubeletLeaseDuration),
		agentObs:     newLeaseObserver(cfg.Remediator.AgentLeaseDuration),
	}
	if err := c.registerObserveMetrics(); err != nil {
		return nil, err
	}
	if c.intr, err = newInterruptionState(cfg.Registry); err != nil {
		return nil, err
	}
	c.recorder = cfg.Recorder
	if c.recorder == nil {
		c.bcast = record.NewBroadcaster()
		c.recorder = c.bcast.NewRecorder(scheme.Scheme, corev1.EventSource{Component: Component})
	}
	c.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Clock: cfg.Clock},
	)
	c.readyMem.at, c.readyMem.queued, c.readyMem.gauge = map[string]time.Time{}, map[string]struct{}{}, m.firstReadyQueued
	c.firstReadyQueue = workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[string]{Clock: cfg.Clock})
	c.firstReadyLimiter = rate.NewLimiter(rate.Limit(cfg.FirstReadyRate), cfg.FirstReadyBurst)

	if err := c.setupInformers(); err != nil {
		return nil, err
	}
	return c, nil
}

func setDefault(d *time.Duration, def time.Duration) {
	if *d <= 0 {
		*d = def
	}
}

// DefaultIdentity returns the leader election identity of this replica: $POD_NAME (or the host
// name) and a random suffix.
func DefaultIdentity() (string, error) {
	name := os.Getenv("POD_NAME")
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return "", fmt.Errorf("remediation: leader identity: %w", err)
		}
		name = h
	}
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("remediation: leader identity: %w", err)
	}
	return name + "_" + hex.EncodeToString(b[:]), nil
}

// Registry returns the registry the metrics are registered on.
func (c *Controller) Registry() *prometheus.Registry { return c.registry }

// Identity returns this replica's leader election identity.
func (c *Controller) Identity() string { return c.cfg.LeaderElection.Identity }

// IsLeader reports whether this replica currently acts.
func (c *Controller) IsLeader() bool { return c.leading.Load() }

// Ready reports whether the informers have synced.
func (c *Controller) Ready() bool {
	for _, s := range c.synced {
		if !s() {
			return false
		}
	}
	return true
}

// Handler serves /healthz (the process is alive and, when leading, renewing its Lease),
// /readyz (informers synced) and /metrics. /readyz stays 200 when no agent Lease exists for any
// node (restarting or unlisting the remediator would not fix that) but adds a warning line to
// its body, as the nodevigil_remediator_agents_missing gauge and an error log do.
func (c *Controller) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := c.leHealth.Check(r); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !c.Ready() {
			http.Error(w, "informers not synced", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
		for _, l := range c.readyzDetail() {
			fmt.Fprintln(w, l)
		}
	})
	mux.Handle("/metrics", promhttp.HandlerFor(c.registry, promhttp.HandlerOpts{Registry: c.registry}))
	return mux
}

// Run starts the informers, waits for them to sync, then acts — at once without leader
// election, or while holding the leader Lease. It returns nil when ctx ends and
// ErrLostLeadership when leadership is lost. Run may be called once.
func (c *Controller) Run(ctx context.Context) error {
	if !c.ran.CompareAndSwap(false, true) {
		return errors.New("remediation: Run called twice")
	}
	defer c.queue.ShutDown()
	if c.bcast != nil {
		events := c.cfg.EventClient
		if events == nil {
			events = c.client
		}
		c.bcast.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: events.CoreV1().Events("")})
		defer c.bcast.Shutdown()
	}
	// The informers stop with this context, which ends when Run returns for any reason (the
	// parent ending or leadership lost).
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		for _, f := range c.factories {
			f.Shutdown()
		}
	}()
	restoreGC := func() {}
	if pct := c.cfg.StartupGCPercent; pct > 0 {
		// Collect eagerly while the initial lists stream in: their garbage, not what is kept,
		// made the start-up peak (docs/benchmarks.md). Restored once synced, or on return.
		prev := debug.SetGCPercent(pct)
		done := false
		restoreGC = func() {
			if !done {
				done = true
				debug.SetGCPercent(prev)
			}
		}
		defer restoreGC()
	}
	c.log.Info("waiting for informers to sync")
	// One informer after the other, Nodes first: the initial lists are the largest allocation
	// of the process's life (every object decoded, then stripped by the transform), and
	// streaming the three at once made their garbage coincide (docs/benchmarks.md).
	for i, f := range c.factories {
		f.Start(ctx.Done())
		if !cache.WaitForCacheSync(ctx.Done(), c.synced[i]) {
			if ctx.Err() != nil {
				return nil
			}
			return errors.New("remediation: informers did not sync")
		}
	}
	restoreGC()
	c.syncedAt.Store(c.clock.Now().UnixNano())
	c.log.Info("informers synced", "dry_run", c.rc.DryRun, "policies", len(c.rc.Policies), "agent_leases", c.agentObs.size(), "kubelet_leases", c.kubeletObs.size())
	if c.scopeEmpty() {
		c.log.Warn("no node matches the node selector", "node_selector", c.rc.NodeSelector,
			"message", "the remediator watches no node; check the nodeSelector of its config against the Nodes' labels")
	}
	if c.agentObs.size() == 0 {
		c.log.Warn("no agent leases seen yet", "agent_namespace", c.rc.AgentNamespace, "label", LabelAgentNode,
			"message", "no node is remediated on the kubelet alone unless its policy says liveness: SingleSignal; if this lasts past the startup grace, check the agent DaemonSet and agentNamespace")
	}
	// A quiet cluster is verified against the API server (observe.go), leading or not, so
	// that observation_blind tells the truth on every replica.
	var verifier sync.WaitGroup
	verifier.Add(1)
	go func() {
		defer verifier.Done()
		c.runObservationVerifier(ctx)
	}()
	defer func() {
		cancel()
		verifier.Wait()
	}()
	// The initial lists are the largest allocation of the process's life (every Node decoded
	// before the transform strips it); hand that memory back now rather than minutes later.
	debug.FreeOSMemory()

	if !c.cfg.LeaderElection.Enabled {
		c.lead(ctx)
		return nil
	}
	return c.runElected(ctx)
}

func (c *Controller) runElected(ctx context.Context) error {
	le := c.cfg.LeaderElection
	// started and done let Run wait for the leading goroutine client-go starts, so that nothing
	// acts any more once Run has returned.
	started, done := make(chan struct{}), make(chan struct{})
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Name: le.LeaseName, Namespace: c.cfg.Namespace},
			Client:     c.client.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: le.Identity},
		},
		LeaseDuration:   le.LeaseDuration,
		RenewDeadline:   le.RenewDeadline,
		RetryPeriod:     le.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            Component,
		WatchDog:        c.leHealth,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				close(started)
				defer close(done)
				c.lead(lctx)
			},
			OnStoppedLeading: func() {
				c.leading.Store(false)
				c.metrics.isLeader.Set(0)
			},
			OnNewLeader: func(id string) {
				c.log.Info("leader elected", "lease", le.LeaseName, "leader", id, "self", id == le.Identity)
			},
		},
	})
	if err != nil {
		return fmt.Errorf("remediation: leader election: %w", err)
	}
	c.log.Info("waiting for leadership", "lease", le.LeaseName, "identity", le.Identity)
	elector.Run(ctx)
	// The leading context is cancelled when Run returns; wait until nothing acts any more.
	select {
	case <-started:
		<-done
	default:
	}
	if ctx.Err() != nil {
		return nil
	}
	return ErrLostLeadership
}

// lead acts until ctx ends: the workers reconcile nodes and the census refreshes the gauges.
func (c *Controller) lead(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	now := c.clock.Now()
	c.observingSince.Store(now.UnixNano())
	c.leading.Store(true)
	c.metrics.isLeader.Set(1)
	c.log.Info("leading: observing before judging anything stale", "duration", c.observe)
	defer func() {
		c.leading.Store(false)
		c.metrics.isLeader.Set(0)
	}()

	if nodes, err := c.nodes.List(labels.Everything()); err == nil {
		for _, n := range nodes {
			c.queue.Add(n.Name)
		}
	}
	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c.processNext(ctx) {
			}
		}()
	}
	if c.cfg.ScheduledEvents != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.runEventPoll(ctx)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := c.clock.NewTicker(DefaultCensusInterval)
		defer t.Stop()
		for {
			c.refreshCensus(c.clock.Now())
			c.checkAgents(c.clock.Now())
			select {
			case <-ctx.Done():
				return
			case <-t.C():
			}
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.runFirstReadyWriter(ctx)
	}()
	<-ctx.Done()
	c.queue.ShutDown()
	c.firstReadyQueue.ShutDown()
	wg.Wait()
	c.log.Info("stopped acting")
}

func (c *Controller) processNext(ctx context.Context) bool {
	name, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(name)
	if ctx.Err() != nil {
		return false
	}
	requeue, err := c.syncNode(ctx, name)
	switch {
	case err != nil:
		if ctx.Err() == nil {
			c.log.Warn("reconcile failed", "node", name, "err", err)
		}
		c.queue.AddRateLimited(name)
	default:
		c.queue.Forget(name)
		if requeue > 0 {
			c.queue.AddAfter(name, min(requeue, c.cfg.ResyncPeriod))
		}
	}
	return true
}
