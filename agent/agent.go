// Package agent is the Kubernetes side of nodevigil-agent, the per-node DaemonSet.
//
// An Agent runs every check each CheckInterval, concurrently and each under its own timeout,
// and feeds the results to three consumers: the Node conditions (package conditions), the
// startup taints (package taints) and, when enabled, the local kubelet repairer. Independently
// of the checks it renews its heartbeat Lease (package heartbeat), so a slow check or a slow
// API server never delays the liveness signal. It serves /metrics, /healthz and /readyz.
//
// The agent depends on the checks only through the small interfaces below; the concrete
// collectors are wired in by the binary, so this package stays testable with fakes and free of
// host access.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promcollectors "github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/nodevigil/nodevigil/agent/conditions"
	"github.com/nodevigil/nodevigil/agent/events"
	"github.com/nodevigil/nodevigil/agent/heartbeat"
	"github.com/nodevigil/nodevigil/agent/nodepatch"
	"github.com/nodevigil/nodevigil/agent/taints"
	"github.com/nodevigil/nodevigil/collectors"
	"github.com/nodevigil/nodevigil/collectors/wakeup"
)

// Component is the Event source and the first half of the user agent.
const Component = "nodevigil-agent"

// Checker is one node-local health check. The collectors under collectors/ implement it.
// Check must honour ctx; the agent nevertheless bounds it and reports a check that overruns
// as Unknown/CheckTimeout.
type Checker interface {
	Name() collectors.CheckName
	Check(ctx context.Context) collectors.Result
}

// Seeder is implemented by checks that keep state between runs (hysteresis, debouncing). The
// agent calls Seed once, before the check's first run when the Node can be read, with what the
// previous agent last reported (the check's condition on the Node), so a restart (or an OOM
// kill of the agent itself) during an incident keeps the verdict and its transition time
// instead of starting from "healthy" (design §8: a restart forgets nothing that matters).
type Seeder interface {
	Seed(prior collectors.Prior)
}

// Repairer restarts a failed kubelet locally. It is given the latest kubelet result each
// cycle and applies its own backoff and hourly cap; the agent records what it did.
type Repairer interface {
	Repair(ctx context.Context, kubelet collectors.Result) (RepairOutcome, error)
}

// RepairOutcome is what a Repairer did in one cycle. Reason is a CamelCase word (Restarted,
// BackoffActive, HourlyCapReached, NotNeeded, RestartFailed).
type RepairOutcome struct {
	Attempted   bool
	Reason      string
	Attempt     int
	NextAllowed time.Time
}

// Repair outcome reasons the agent reacts to.
const (
	RepairRestarted        = "Restarted"
	RepairRestartFailed    = "RestartFailed"
	RepairBackoffActive    = "BackoffActive"
	RepairHourlyCapReached = "HourlyCapReached"
	RepairNotNeeded        = "NotNeeded"
	// RepairOperatorStopped: the unit was stopped on purpose; it is reported, never restarted.
	RepairOperatorStopped = "OperatorStopped"
)

// Event reasons recorded on the Node by the agent itself (the taints package records its own).
const (
	// ReasonKubeletRestarted: the repairer restarted the kubelet unit (Normal).
	ReasonKubeletRestarted = "KubeletRestarted"
	// ReasonKubeletRestartFailed: a restart was attempted and failed (Warning).
	ReasonKubeletRestartFailed = "KubeletRestartFailed"
	// ReasonKubeletRepairCapReached: the hourly restart cap stops local repair (Warning).
	ReasonKubeletRepairCapReached = "KubeletRepairCapReached"
	// ReasonKubeletStoppedByOperator: the kubelet unit was stopped on purpose and local repair
	// leaves it stopped (Warning, once per episode).
	ReasonKubeletStoppedByOperator = "KubeletStoppedByOperator"
)

// Defaults.
const (
	DefaultCheckInterval   = 10 * time.Second
	DefaultCheckTimeout    = 5 * time.Second
	DefaultListenAddress   = ":9736"
	DefaultAPITimeout      = 5 * time.Second
	DefaultShutdownTimeout = 3 * time.Second
	repairCheck            = collectors.CheckKubelet
)

// Config configures an Agent. Zero values are replaced by defaults; Nodes, Leases, Events (or
// Recorder), NodeName, Namespace and PodName are required. The clients' rate limits are the
// caller's (the binary sets them from --kube-api-qps/--kube-api-burst).
type Config struct {
	// Nodes reads and patches this node. Required.
	Nodes nodepatch.NodeClient
	// Leases reads and writes the heartbeat Lease; it must act on Namespace. Required.
	Leases heartbeat.LeaseClient
	// Events stores the Events recorded on the Node (in the default namespace), through an
	// events.Recorder that aggregates repeats and rate-limits as client-go's broadcaster does.
	// Required unless Recorder is set.
	Events events.Sink
	// NodeName is this node.
	NodeName string
	// Namespace holds the heartbeat Lease.
	Namespace string
	// PodName is the Lease holder identity.
	PodName string
	// Version is reported in nodevigil_build_info.
	Version string

	// Checks run every CheckInterval, each within CheckTimeout.
	Checks        []Checker
	CheckInterval time.Duration
	CheckTimeout  time.Duration

	// ConditionHeartbeat is how often unchanged conditions are rewritten (default 5m).
	ConditionHeartbeat time.Duration

	// OwnedTaints, GatingChecks, TaintStabilityWindow and ReaddTaintOnFailure configure the
	// startup taint manager (see package taints for defaults). Every gating check must be
	// among Checks. A zero TaintStabilityWindow means the taints' default (10s); a negative
	// one releases on the first healthy cycle.
	OwnedTaints          []string
	GatingChecks         []collectors.CheckName
	TaintStabilityWindow time.Duration
	ReaddTaintOnFailure  bool

	// LeaseDuration, LeaseRenewInterval and LeaseRenewTimeout configure the heartbeat Lease
	// (defaults 40s, 10s, 5s).
	LeaseDuration      time.Duration
	LeaseRenewInterval time.Duration
	LeaseRenewTimeout  time.Duration

	// Repairer, when set, is given the kubelet result every cycle (local kubelet repair).
	Repairer Repairer

	// Wake, when set, runs a cycle as soon as it receives, between the CheckInterval ticks:
	// the IMDS watcher signals a changed AWS event on it, so a spot notice reaches the Node
	// within the watcher's poll interval instead of the agent's check interval.
	Wake <-chan struct{}
	// Collectors are further metrics registered on Registry (the IMDS watcher's).
	Collectors []prometheus.Collector
	// Started, when set, is called once from the check loop after the first cycle whose
	// conditions reached the Node: start-up is over. The agent's command releases the memory
	// only start-up needed there (package residency).
	Started func()

	// ListenAddress serves /metrics, /healthz, /readyz (default :9736).
	ListenAddress string
	// APITimeout bounds each API call of the condition and taint managers (default 5s).
	APITimeout time.Duration
	// ShutdownTimeout bounds the HTTP server's graceful shutdown (default 3s).
	ShutdownTimeout time.Duration

	// Registry holds the agent's metrics (default a new private registry). The Go and
	// process collectors and nodevigil_build_info are registered on it.
	Registry *prometheus.Registry
	// Recorder records Events on the Node (default: an events.Recorder writing to Events).
	Recorder taints.EventRecorder
	// Grid, when on, is the process's shared schedule (package wakeup): check cycles and Lease
	// renewals fall on its points (Origin + k·interval) instead of their own offsets, so they
	// share wake-ups with each other and with the AWS event watcher's polls (the binary gives
	// the watcher the same Grid). A Lease renewal on the Grid has no jitter: the Grid's random
	// Origin spreads the agents of a cluster instead. Off (the zero Grid), the check loop ticks
	// from its start and renewals are jittered.
	Grid wakeup.Grid
	// Clock is the time source (default the real clock).
	Clock clock.WithTicker
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// Agent is the running per-node agent.
type Agent struct {
	cfg        Config
	events     *events.Recorder // nil when Config.Recorder is set
	recorder   taints.EventRecorder
	nodeRef    *v1.ObjectReference
	conditions *conditions.Manager
	taints     *taints.Manager
	lease      *heartbeat.Renewer
	handler    http.Handler
	running    map[collectors.CheckName]*atomic.Bool
	workers    map[collectors.CheckName]*checkWorker

	checkStatus   *prometheus.GaugeVec
	checkDuration *prometheus.HistogramVec
	checkErrors   *prometheus.CounterVec
	repairs       *prometheus.CounterVec

	// last is the last result per check, for logging transitions; only the loop touches it.
	last       map[collectors.CheckName]collectors.Result
	lastRepair string
	// started is true once Config.Started was called; only the loop touches it.
	started bool
	// seeded is true once the checks were seeded from the Node (or seeding was given up
	// because the conditions were already reported); only the loop touches it.
	seeded bool
	// repairCh hands the latest kubelet result to the repair worker (capacity one: a newer
	// result replaces one not yet taken).
	repairCh chan collectors.Result
}

// New validates cfg, fills defaults and builds the agent's parts. It does no I/O.
func New(cfg Config) (*Agent, error) {
	switch {
	case cfg.Nodes == nil:
		return nil, errors.New("agent: Nodes is required")
	case cfg.Leases == nil:
		return nil, errors.New("agent: Leases is required")
	case cfg.Events == nil && cfg.Recorder == nil:
		return nil, errors.New("agent: Events or Recorder is required")
	case cfg.NodeName == "":
		return nil, errors.New("agent: NodeName is required; set --node-name or NODE_NAME")
	case cfg.Namespace == "":
		return nil, errors.New("agent: Namespace is required")
	case cfg.PodName == "":
		return nil, errors.New("agent: PodName is required")
	}
	if cfg.CheckInterval <= 0 {
		cfg.CheckInterval = DefaultCheckInterval
	}
	if cfg.CheckTimeout <= 0 {
		cfg.CheckTimeout = min(DefaultCheckTimeout, cfg.CheckInterval)
	}
	if cfg.ListenAddress == "" {
		cfg.ListenAddress = DefaultListenAddress
	}
	if cfg.APITimeout <= 0 {
		cfg.APITimeout = DefaultAPITimeout
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Version == "" {
		cfg.Version = "unknown"
	}
	if len(cfg.GatingChecks) == 0 {
		cfg.GatingChecks = taints.DefaultGatingChecks
	}

	a := &Agent{
		cfg:      cfg,
		nodeRef:  &v1.ObjectReference{Kind: "Node", Name: cfg.NodeName, UID: types.UID(cfg.NodeName)},
		running:  map[collectors.CheckName]*atomic.Bool{},
		workers:  map[collectors.CheckName]*checkWorker{},
		last:     map[collectors.CheckName]collectors.Result{},
		repairCh: make(chan collectors.Result, 1),
	}
	for _, c := range cfg.Checks {
		name := c.Name()
		if _, dup := a.running[name]; dup {
			return nil, fmt.Errorf("agent: two checks named %q", name)
		}
		a.running[name] = &atomic.Bool{}
		a.workers[name] = &checkWorker{check: c, now: cfg.Clock.Now, log: cfg.Logger}
	}
	for _, g := range cfg.GatingChecks {
		if _, ok := a.running[g]; !ok {
			return nil, fmt.Errorf("agent: gating check %q is not among the configured checks; remove it from --gating-checks or enable the check", g)
		}
	}

	a.recorder = cfg.Recorder
	if a.recorder == nil {
		rec, err := events.New(events.Config{
			Sink: cfg.Events, Source: v1.EventSource{Component: Component, Host: cfg.NodeName},
			FlushTimeout: cfg.ShutdownTimeout, Clock: cfg.Clock, Logger: cfg.Logger,
		})
		if err != nil {
			return nil, fmt.Errorf("agent: %w", err)
		}
		a.events, a.recorder = rec, rec
	}

	if err := a.registerMetrics(); err != nil {
		return nil, err
	}

	var err error
	a.conditions, err = conditions.New(conditions.Config{
		Client: cfg.Nodes, NodeName: cfg.NodeName, HeartbeatPeriod: cfg.ConditionHeartbeat, Timeout: cfg.APITimeout,
		Clock: cfg.Clock, Logger: cfg.Logger, Registerer: cfg.Registry,
	})
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	a.taints, err = taints.New(taints.Config{
		Client: cfg.Nodes, NodeName: cfg.NodeName, OwnedKeys: cfg.OwnedTaints, GatingChecks: cfg.GatingChecks,
		StabilityWindow: cfg.TaintStabilityWindow, ReaddOnFailure: cfg.ReaddTaintOnFailure, Timeout: cfg.APITimeout,
		StartTime: cfg.Clock.Now(), Recorder: a.recorder, Clock: cfg.Clock, Logger: cfg.Logger, Registerer: cfg.Registry,
	})
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	a.lease, err = heartbeat.New(heartbeat.Config{
		Leases: cfg.Leases, Nodes: cfg.Nodes, NodeName: cfg.NodeName, Namespace: cfg.Namespace, HolderIdentity: cfg.PodName,
		LeaseDuration: cfg.LeaseDuration, RenewInterval: cfg.LeaseRenewInterval, RenewTimeout: cfg.LeaseRenewTimeout,
		Grid: cfg.Grid, Clock: cfg.Clock, Logger: cfg.Logger, Registerer: cfg.Registry,
	})
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	a.handler = a.newHandler()
	return a, nil
}

func (a *Agent) registerMetrics() error {
	a.checkStatus = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nodevigil_agent_check_status",
		Help: "Latest verdict of each check: 1 for the current status, 0 for the others.",
	}, []string{"check", "status"})
	a.checkDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "nodevigil_agent_check_duration_seconds",
		Help:    "Time one run of a check took.",
		Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"check"})
	a.checkErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodevigil_agent_check_errors_total",
		Help: "Check runs that failed to observe (Result.Err set), excluding sources not supported on this host.",
	}, []string{"check"})
	a.repairs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodevigil_agent_kubelet_repair_attempts_total",
		Help: "Local kubelet repair decisions other than NotNeeded, by result (Restarted, RestartFailed, BackoffActive, HourlyCapReached, OperatorStopped, Other, error).",
	}, []string{"result"})
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nodevigil_build_info",
		Help: "Build of the running binary; always 1.",
	}, []string{"version", "goversion"})
	buildInfo.WithLabelValues(a.cfg.Version, runtime.Version()).Set(1)

	for _, c := range []prometheus.Collector{
		a.checkStatus, a.checkDuration, a.checkErrors, a.repairs, buildInfo,
		promcollectors.NewGoCollector(),
		promcollectors.NewProcessCollector(promcollectors.ProcessCollectorOpts{}),
	} {
		if err := a.cfg.Registry.Register(c); err != nil {
			return fmt.Errorf("agent: register metrics: %w", err)
		}
	}
	for name := range a.running {
		a.checkErrors.WithLabelValues(string(name))
	}
	for _, c := range a.cfg.Collectors {
		if err := a.cfg.Registry.Register(c); err != nil {
			return fmt.Errorf("agent: register metrics: %w", err)
		}
	}
	// Checks may export their own metrics (the memory check's kernel OOM-kill counter).
	for _, c := range a.cfg.Checks {
		if pc, ok := c.(prometheus.Collector); ok {
			if err := a.cfg.Registry.Register(pc); err != nil {
				return fmt.Errorf("agent: register metrics of check %s: %w", c.Name(), err)
			}
		}
	}
	return nil
}

// Handler serves /metrics, /healthz and /readyz. /healthz answers 200 while the process can
// serve HTTP: it must not depend on the API server, or an API outage would make the kubelet
// restart every agent in the cluster at once. /readyz answers 200 once the agent has reported
// (a condition patch succeeded, or the Node already carried its current results).
func (a *Agent) Handler() http.Handler { return a.handler }

func (a *Agent) newHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(a.cfg.Registry, promhttp.HandlerOpts{
		Registry:          a.cfg.Registry,
		Timeout:           10 * time.Second,
		EnableOpenMetrics: false,
	}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !a.conditions.Reported() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready: node conditions not reported yet\n"))
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

// Run serves HTTP, renews the Lease and runs the check loop until ctx is done, then shuts
// everything down within ShutdownTimeout plus the longest in-flight API call. It returns an
// error only when it cannot start (the listen address is taken).
func (a *Agent) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", a.cfg.ListenAddress)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", a.cfg.ListenAddress, err)
	}
	return a.serve(ctx, ln)
}

func (a *Agent) serve(ctx context.Context, ln net.Listener) error {
	log := a.cfg.Logger.With("node", a.cfg.NodeName)

	srv := &http.Server{
		Handler:           a.handler,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(a.cfg.Logger.Handler(), slog.LevelWarn),
	}
	var wg sync.WaitGroup
	if a.events != nil {
		wg.Go(func() { a.events.Run(ctx) })
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server stopped", "err", err)
		}
	}()
	go func() {
		defer wg.Done()
		a.lease.Run(ctx)
	}()
	if a.cfg.Repairer != nil {
		wg.Go(func() { a.repairLoop(ctx) })
	}
	log.Info("agent started", "listen_address", ln.Addr().String(), "checks", len(a.cfg.Checks),
		"kubelet_repair", a.cfg.Repairer != nil)

	a.loop(ctx)

	log.Info("agent stopping")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("http server shutdown incomplete", "err", err)
	}
	wg.Wait()
	log.Info("agent stopped")
	return nil
}

// loop runs a cycle now, then every CheckInterval (on the Grid's points when it is on) and
// whenever Wake receives, until ctx is done.
func (a *Agent) loop(ctx context.Context) {
	if !a.cfg.Grid.On() {
		ticker := a.cfg.Clock.NewTicker(a.cfg.CheckInterval)
		defer ticker.Stop()
		for {
			a.cycle(ctx)
			select {
			case <-ctx.Done():
				return
			case <-ticker.C():
			case <-a.cfg.Wake: // nil when unset: never ready
			}
		}
	}
	var timer clock.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	next := a.cfg.Clock.Now()
	for {
		a.cycle(ctx)
		if now := a.cfg.Clock.Now(); !now.Before(next) {
			next = a.cfg.Grid.Next(now, a.cfg.CheckInterval)
		} // else a cycle woken early (Wake): the scheduled one stays in place
		d := next.Sub(a.cfg.Clock.Now())
		if timer == nil {
			timer = a.cfg.Clock.NewTimer(d)
		} else {
			timer.Stop()
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			return
		case <-timer.C():
		case <-a.cfg.Wake:
		}
	}
}

// seed reads the Node once and hands each Seeder its check's condition, before the checks'
// first run. When the Node cannot be read it is tried again before the next cycles, until the
// conditions were reported (from then on the checks' own state is newer than the Node's).
func (a *Agent) seed(ctx context.Context) {
	if a.seeded {
		return
	}
	if a.conditions.Reported() {
		a.seeded = true
		return
	}
	cctx, cancel := context.WithTimeout(ctx, a.cfg.APITimeout)
	defer cancel()
	node, err := a.cfg.Nodes.Get(cctx, a.cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		a.cfg.Logger.Warn("read node to seed checks failed; checks start from healthy", "node", a.cfg.NodeName, "err", err)
		return
	}
	a.seeded = true
	for _, c := range a.cfg.Checks {
		s, ok := c.(Seeder)
		if !ok {
			continue
		}
		t, ok := conditions.TypeForCheck(c.Name())
		if !ok {
			continue
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type != t {
				continue
			}
			prior := collectors.Prior{Status: conditions.CheckStatusFor(cond.Status), Reason: cond.Reason, Since: cond.LastTransitionTime.Time}
			s.Seed(prior)
			a.cfg.Logger.Debug("check seeded from node condition", "node", a.cfg.NodeName, "check", c.Name(),
				"status", string(prior.Status), "reason", prior.Reason)
		}
	}
}

// cycle runs every check once and hands the results to the consumers.
func (a *Agent) cycle(ctx context.Context) {
	a.seed(ctx)
	results := a.RunChecks(ctx)
	if ctx.Err() != nil {
		return
	}
	a.observe(results)
	if err := a.conditions.Sync(ctx, results); err != nil {
		a.cfg.Logger.Debug("condition sync failed", "node", a.cfg.NodeName, "err", err)
	}
	if err := a.taints.Reconcile(ctx, results); err != nil {
		a.cfg.Logger.Debug("taint reconcile failed", "node", a.cfg.NodeName, "err", err)
	}
	if a.cfg.Started != nil && !a.started && a.conditions.Reported() {
		a.started = true
		a.cfg.Started()
	}
	if a.cfg.Repairer != nil {
		for _, r := range results {
			if r.Check == repairCheck {
				a.queueRepair(r)
			}
		}
	}
}

// queueRepair hands r to the repair worker without waiting: a restart can take minutes
// (systemd's start timeout), and the check loop, the conditions and the taints must not stall
// behind it. A result the worker has not taken yet is replaced by the newer one.
func (a *Agent) queueRepair(r collectors.Result) {
	for {
		select {
		case a.repairCh <- r:
			return
		default:
		}
		select {
		case <-a.repairCh:
		default:
		}
	}
}

// repairLoop runs the repairer on the latest kubelet result until ctx is done.
func (a *Agent) repairLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-a.repairCh:
			a.repair(ctx, r)
		}
	}
}

// RunChecks runs every check concurrently, each under CheckTimeout, and returns their results
// in the order of Config.Checks. A check still running from a previous cycle is not started
// again (it is reported Unknown/CheckStillRunning), so a stuck check cannot pile up goroutines.
func (a *Agent) RunChecks(ctx context.Context) []collectors.Result {
	results := make([]collectors.Result, len(a.cfg.Checks))
	var wg sync.WaitGroup
	for i, c := range a.cfg.Checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = a.runCheck(ctx, c)
		}()
	}
	wg.Wait()
	return results
}

func (a *Agent) runCheck(ctx context.Context, c Checker) collectors.Result {
	name := c.Name()
	busy := a.running[name]
	if !busy.CompareAndSwap(false, true) {
		return collectors.Result{Check: name, Status: collectors.StatusUnknown, Reason: "CheckStillRunning",
			Message: "the previous run of this check has not returned yet", Time: a.cfg.Clock.Now(),
			Err: errors.New("previous run still in progress")}
	}
	start := a.cfg.Clock.Now()
	w := a.workers[name]
	r := runGuarded(ctx, name, a.cfg.CheckTimeout, a.cfg.Clock.Now, func(ctx context.Context, out chan<- collectors.Result) {
		w.submit(checkJob{ctx: ctx, out: out, done: func() { busy.Store(false) }})
	})
	a.checkDuration.WithLabelValues(string(name)).Observe(a.cfg.Clock.Since(start).Seconds())
	return r
}

// checkWorker runs one check's Check calls, one at a time, on a goroutine that lives as long
// as the agent. A fresh goroutine per check per cycle starts every 10 s on a small stack and
// grows it by copying (the checks' parsers and D-Bus calls take it to tens of KiB), each copy
// walking every frame with cold caches: in a CPU profile of the idle agent, runtime.morestack
// was 7 % of the samples, and 4 % with the workers (docs/benchmarks.md, session 14). A
// long-lived goroutine keeps its grown stack between cycles (the garbage collector halves it
// at most once per GC cycle).
//
// The worker is started on the first job. At most one job is ever pending: the agent's
// running flag for the check is set before a job is submitted and cleared by the worker only
// after the job's result is sent, so submit never blocks.
type checkWorker struct {
	check Checker
	now   func() time.Time
	log   *slog.Logger

	once sync.Once
	jobs chan checkJob
}

// checkJob is one run of a check: its result goes to out (capacity one, so the worker never
// waits for a caller that gave up), then done is called.
type checkJob struct {
	ctx  context.Context
	out  chan<- collectors.Result
	done func()
}

func (w *checkWorker) submit(j checkJob) {
	w.once.Do(func() {
		w.jobs = make(chan checkJob, 1)
		go func() {
			for j := range w.jobs {
				j.out <- safeCheck(j.ctx, w.check, w.now, w.log)
				j.done()
			}
		}()
	})
	w.jobs <- j
}

// RunOnce runs every check once, concurrently, each under timeout and guarded like the
// agent's own loop (a hung check becomes CheckTimeout, a panicking one CheckPanicked), and
// returns the results in the checks' order. It is the one-shot `check` command's runner.
func RunOnce(ctx context.Context, checks []Checker, timeout time.Duration, log *slog.Logger) []collectors.Result {
	results := make([]collectors.Result, len(checks))
	var wg sync.WaitGroup
	for i, c := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = runGuarded(ctx, c.Name(), timeout, time.Now, func(ctx context.Context, out chan<- collectors.Result) {
				go func() { out <- safeCheck(ctx, c, time.Now, log) }()
			})
		}()
	}
	wg.Wait()
	return results
}

// runGuarded runs one check under timeout: start must run it in the background with the
// given context and send its result to out. A timeout becomes an Unknown result, and what the
// check returned is normalised. The check may still be running when runGuarded returns.
func runGuarded(ctx context.Context, name collectors.CheckName, timeout time.Duration, now func() time.Time, start func(context.Context, chan<- collectors.Result)) collectors.Result {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ch := make(chan collectors.Result, 1)
	start(cctx, ch)
	var r collectors.Result
	select {
	case r = <-ch:
	case <-cctx.Done():
		r = collectors.Result{Check: name, Status: collectors.StatusUnknown, Reason: "CheckTimeout",
			Message: fmt.Sprintf("check did not return within %s", timeout), Time: now(), Err: cctx.Err()}
	}
	if r.Check == "" {
		r.Check = name
	}
	if r.Time.IsZero() {
		r.Time = now()
	}
	switch r.Status {
	case collectors.StatusHealthy, collectors.StatusWarning, collectors.StatusUnhealthy, collectors.StatusUnknown:
	default:
		r.Status = collectors.StatusUnknown
	}
	return r
}

// safeCheck runs c.Check, turning a panic into an Unknown result, so a bug in one check
// cannot take the agent (or a check worker) down.
func safeCheck(ctx context.Context, c Checker, now func() time.Time, log *slog.Logger) (r collectors.Result) {
	defer func() {
		if p := recover(); p != nil {
			name := c.Name()
			log.Error("check panicked", "check", name, "err", fmt.Sprint(p), "stack", string(debug.Stack()))
			r = collectors.Result{Check: name, Status: collectors.StatusUnknown, Reason: "CheckPanicked",
				Message: fmt.Sprintf("check panicked: %v", p), Time: now(), Err: fmt.Errorf("panic: %v", p)}
		}
	}()
	return c.Check(ctx)
}

// observe updates the check metrics and logs status changes and observation errors once per
// change, not every cycle.
func (a *Agent) observe(results []collectors.Result) {
	for _, r := range results {
		for _, s := range []collectors.Status{collectors.StatusHealthy, collectors.StatusWarning, collectors.StatusUnhealthy, collectors.StatusUnknown} {
			v := 0.0
			if r.Status == s {
				v = 1
			}
			a.checkStatus.WithLabelValues(string(r.Check), string(s)).Set(v)
		}
		notSupported := errors.Is(r.Err, collectors.ErrNotSupported)
		if r.Err != nil && !notSupported {
			a.checkErrors.WithLabelValues(string(r.Check)).Inc()
		}
		prev, seen := a.last[r.Check]
		a.last[r.Check] = r
		if seen && prev.Status == r.Status && prev.Reason == r.Reason {
			continue
		}
		level := slog.LevelInfo
		if !r.Status.IsHealthy() {
			level = slog.LevelWarn
		}
		if notSupported {
			level = slog.LevelInfo
		}
		args := []any{"node", a.cfg.NodeName, "check", r.Check, "status", string(r.Status), "reason", r.Reason, "message", r.Message}
		if r.Err != nil {
			args = append(args, "err", r.Err.Error())
		}
		a.cfg.Logger.Log(context.Background(), level, "check status changed", args...)
		if collectors.IsAWSEvent(r.Check) {
			a.recordAWSEvent(prev, seen, r)
		}
	}
}

// Event reasons of the AWS event checks: the result's own reason (the event code in
// CamelCase, e.g. SpotTerminate, InstanceReboot) when an event appears, and these.
const (
	// ReasonAWSEventCleared: a pending AWS event is gone (withdrawn, canceled, completed).
	ReasonAWSEventCleared = "AWSEventCleared"
	// ReasonIMDSUnavailable: the metadata service cannot be read; AWS events are not seen.
	ReasonIMDSUnavailable = "IMDSUnavailable"
)

// recordAWSEvent records an Event on the Node when an AWS event check changes: Warning with
// the event code as reason when an event is pending, Normal when it cleared, Warning once
// when the metadata service became unreadable (its conditions say Unknown with the cause and
// the fix). A healthy first result records nothing.
func (a *Agent) recordAWSEvent(prev collectors.Result, seen bool, r collectors.Result) {
	switch {
	case r.Status == collectors.StatusUnhealthy:
		a.recorder.Eventf(a.nodeRef, v1.EventTypeWarning, r.Reason, "%s: %s", r.Check, r.Message)
	case r.Status == collectors.StatusUnknown:
		// Every kind reads the same service: one Event (on the spot kind) says it all.
		// NotYetRead (collectors/imds) is the agent's own start-up, not an unreadable service.
		if r.Check == collectors.CheckSpotInterruption && r.Reason != "NotYetRead" && (!seen || prev.Status != collectors.StatusUnknown || prev.Reason == "NotYetRead") {
			a.recorder.Eventf(a.nodeRef, v1.EventTypeWarning, ReasonIMDSUnavailable, "%s: %s", r.Check, r.Message)
		}
	case seen && prev.Status == collectors.StatusUnhealthy:
		a.recorder.Eventf(a.nodeRef, v1.EventTypeNormal, ReasonAWSEventCleared, "%s: %s (was %s: %s)", r.Check, r.Message, prev.Reason, prev.Message)
	}
}

// repair hands the kubelet result to the repairer and records what it did.
func (a *Agent) repair(ctx context.Context, kubelet collectors.Result) {
	out, err := a.cfg.Repairer.Repair(ctx, kubelet)
	log := a.cfg.Logger.With("node", a.cfg.NodeName, "check", repairCheck)
	prev := a.lastRepair
	a.lastRepair = out.Reason
	if err != nil {
		a.repairs.WithLabelValues("error").Inc()
		log.Warn("kubelet repair failed", "reason", out.Reason, "attempt", out.Attempt, "err", err)
		if out.Attempted || prev != "error" {
			a.recorder.Eventf(a.nodeRef, v1.EventTypeWarning, ReasonKubeletRestartFailed,
				"Local kubelet repair failed (attempt %d): %v", out.Attempt, err)
		}
		a.lastRepair = "error"
		return
	}
	switch out.Reason {
	case RepairNotNeeded, "":
		return
	case RepairRestarted, RepairRestartFailed, RepairBackoffActive, RepairHourlyCapReached, RepairOperatorStopped:
		a.repairs.WithLabelValues(out.Reason).Inc()
	default:
		a.repairs.WithLabelValues("Other").Inc()
	}
	next := ""
	if !out.NextAllowed.IsZero() {
		next = out.NextAllowed.UTC().Format(time.RFC3339)
	}
	switch {
	case out.Attempted && out.Reason == RepairRestarted:
		log.Warn("kubelet restarted", "reason", kubelet.Reason, "attempt", out.Attempt)
		a.recorder.Eventf(a.nodeRef, v1.EventTypeNormal, ReasonKubeletRestarted,
			"Restarted the kubelet unit (attempt %d) because %s: %s", out.Attempt, kubelet.Reason, kubelet.Message)
	case out.Attempted:
		log.Warn("kubelet restart failed", "reason", out.Reason, "attempt", out.Attempt)
		a.recorder.Eventf(a.nodeRef, v1.EventTypeWarning, ReasonKubeletRestartFailed,
			"Restarting the kubelet unit failed (attempt %d, %s); next attempt allowed at %s", out.Attempt, out.Reason, next)
	case out.Reason == RepairOperatorStopped && prev != RepairOperatorStopped:
		log.Warn("kubelet unit stopped by an operator; not restarting it", "reason", kubelet.Reason)
		a.recorder.Eventf(a.nodeRef, v1.EventTypeWarning, ReasonKubeletStoppedByOperator,
			"The kubelet unit was stopped on purpose (inactive with a clean result); local repair leaves it stopped: %s", kubelet.Message)
	case out.Reason == RepairHourlyCapReached && prev != RepairHourlyCapReached:
		log.Warn("kubelet repair cap reached", "attempt", out.Attempt)
		a.recorder.Eventf(a.nodeRef, v1.EventTypeWarning, ReasonKubeletRepairCapReached,
			"Kubelet still unhealthy (%s) but the hourly restart cap is reached; next attempt allowed at %s", kubelet.Reason, next)
	}
}
