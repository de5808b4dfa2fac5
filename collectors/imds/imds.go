// Package imds watches the EC2 instance metadata service (IMDSv2 only) for AWS-initiated
// events: spot interruption notices, rebalance recommendations, scheduled events (reboots,
// retirement, stop) and the Auto Scaling target lifecycle state. It is a collector: it knows
// nothing of Kubernetes and reports one collectors.Result per kind of event, which the agent
// publishes as a Node condition.
//
// The metadata service is read through aws-sdk-go-v2's feature/ec2/imds client with the IMDSv1
// fallback disabled: the client fetches a session token (PUT /latest/api/token), reuses it for
// every read and fetches a new one when it expires. Its endpoint is the SDK's (169.254.169.254,
// or AWS_EC2_METADATA_SERVICE_ENDPOINT), overridable with Config.Endpoint.
//
// A Watcher reads instance-life-cycle once (and again after any failed read): spot interruption
// notices and rebalance recommendations exist only for spot instances, so on any other instance
// the spot paths are never polled and those kinds are Healthy "not a spot instance". On a spot
// instance it polls spot/instance-action every SpotInterval (2 s: a notice must reach the Node
// within 3 s) and the rebalance recommendation every RebalanceInterval (10 s, on the same
// wake-ups), and the others about once a minute, each group on its own schedule, and signals
// Changed whenever a verdict changes so the agent publishes it at once rather than at its next
// check cycle. A 404 is "no event". A metadata service that cannot be used (not on EC2, hop
// limit 1 seen from a pod network, endpoint disabled, an IMDSv1-only proxy) makes every kind
// Unknown with the cause and the fix in the message, the cause told from the SDK's typed errors
// (HTTP status, network error, whether a connection was made), never from their text; the group
// is retried with exponential backoff.
package imds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/smithy-go/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/nodevigil/nodevigil/collectors"
	"github.com/nodevigil/nodevigil/collectors/wakeup"
)

// Metadata paths, under /latest/meta-data/.
const (
	PathSpot      = "spot/instance-action"
	PathRebalance = "events/recommendations/rebalance"
	PathScheduled = "events/maintenance/scheduled"
	PathLifecycle = "autoscaling/target-lifecycle-state"
	// PathInstanceLifeCycle is the instance's purchasing option: spot, on-demand or scheduled.
	PathInstanceLifeCycle = "instance-life-cycle"
	// LifeCycleSpot is PathInstanceLifeCycle's answer on a spot instance.
	LifeCycleSpot  = "spot"
	scheduledState = "active"
	// TimeLayout is the metadata service's time format in events/maintenance/scheduled.
	TimeLayout = "2 Jan 2006 15:04:05 GMT"
)

// Reasons of the results. Event results use the event's own code in CamelCase (see
// ReasonForCode); these are the others. They are stable: they become condition reasons.
const (
	// ReasonNoEvent: the path answered 404 or listed no active event.
	ReasonNoEvent = "NoEvent"
	// ReasonNotSpot: the spot kinds on an instance whose instance-life-cycle is not spot
	// (on-demand, scheduled): AWS never sends it a spot notice or rebalance recommendation.
	ReasonNotSpot = "NotSpotInstance"
	// ReasonRebalanceRecommendation: EC2 recommends rebalancing this spot instance.
	ReasonRebalanceRecommendation = "RebalanceRecommendation"
	// ReasonIMDSUnreachable: no answer from the endpoint (not on EC2, a network policy).
	ReasonIMDSUnreachable = "IMDSUnreachable"
	// ReasonIMDSHopLimit: the token request was sent but never answered: the response hop
	// limit (HttpPutResponseHopLimit) is too low for a pod in its own network namespace.
	ReasonIMDSHopLimit = "IMDSHopLimitExceeded"
	// ReasonIMDSDisabled: the endpoint answered 403 (HttpEndpoint=disabled) or the SDK is
	// disabled by AWS_EC2_METADATA_DISABLED.
	ReasonIMDSDisabled = "IMDSDisabled"
	// ReasonIMDSv1Only: the token endpoint does not exist (404/405): an IMDSv1-only proxy.
	ReasonIMDSv1Only = "IMDSv1Only"
	// ReasonNotYetRead: the agent started and the Watcher has not read the kind yet.
	ReasonNotYetRead = "NotYetRead"
	// ReasonIMDSError: any other failure (a 5xx, a malformed answer).
	ReasonIMDSError = "IMDSError"
)

// Defaults for Config.
const (
	// DefaultSpotInterval is 2 s on spot instances (others never poll the spot paths): issue
	// 14's target, spot notice in IMDS → node cordoned within 3 s at p99, cannot be met with
	// the 5 s AWS suggests. Its cost is in docs/benchmarks.md ("Agent steady state").
	DefaultSpotInterval = 2 * time.Second
	// DefaultRebalanceInterval is 10 s. A rebalance recommendation is not a two-minute notice:
	// it is an early warning that comes before the notice when EC2 can give one, its default
	// action is Notify, and a spot notice that follows it is read on the spot path's own 2 s
	// schedule (the escalation does not wait for it). Reading it on every fifth spot poll
	// takes a third of the metadata reads off a spot instance (docs/benchmarks.md).
	DefaultRebalanceInterval = 10 * time.Second
	DefaultEventInterval     = time.Minute
	DefaultTimeout           = 2 * time.Second
	DefaultMaxBackoff        = 5 * time.Minute
)

// Config configures a Watcher. Zero values select the defaults.
type Config struct {
	// Endpoint is the metadata service's base URL. Empty means the SDK's: the
	// AWS_EC2_METADATA_SERVICE_ENDPOINT environment variable, else http://169.254.169.254.
	Endpoint string
	// SpotInterval is how often spot/instance-action is read on a spot instance (default 2s;
	// never on other instances).
	SpotInterval time.Duration
	// RebalanceInterval is how often events/recommendations/rebalance is read on a spot
	// instance (default 10s; never on other instances). It is read on the spot path's
	// wake-ups, so never more often than SpotInterval.
	RebalanceInterval time.Duration
	// EventInterval is how often events/maintenance/scheduled and
	// autoscaling/target-lifecycle-state are read (default 1m: scheduled events come days
	// ahead).
	EventInterval time.Duration
	// Timeout bounds one poll of a group, token included (default 2s).
	Timeout time.Duration
	// MaxBackoff caps the retry delay after failures (default 5m; never below the interval).
	MaxBackoff time.Duration
	// OneShot is the `check` command: every Check reads the service itself, and a pending
	// event is a Warning instead of Unhealthy (see the check command's help).
	OneShot bool
	// Grid, when on, puts every poll that succeeded on the process's shared schedule
	// (package wakeup): the next poll of a group is at the grid's next point of its interval,
	// not the interval after this one ended, so the spot polls carry the agent's other periodic
	// work (check cycle, Lease renewal) on their wake-ups. Retries after a failure keep their
	// own backoff. Off (the zero Grid), each group's next poll is its interval after the last.
	Grid wakeup.Grid
	// Clock is the time source (default the real clock).
	Clock clock.Clock
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// Validate names the field at fault and the fix; Config field names are those of the
// agent's config file section imds.
func (c Config) Validate() error {
	var errs []error
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"spotInterval", c.SpotInterval}, {"rebalanceInterval", c.RebalanceInterval}, {"eventInterval", c.EventInterval}, {"timeout", c.Timeout}, {"maxBackoff", c.MaxBackoff}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("imds.%s (%s) must not be negative; leave it unset for the default", d.name, d.v))
		}
	}
	if c.SpotInterval > 0 && c.SpotInterval < 500*time.Millisecond {
		errs = append(errs, fmt.Errorf("imds.spotInterval (%s) is below 500ms; the metadata service throttles callers, use 1s to 10s", c.SpotInterval))
	}
	if c.SpotInterval > 30*time.Second {
		errs = append(errs, fmt.Errorf("imds.spotInterval (%s) is above 30s; a spot notice gives two minutes, use 1s to 10s", c.SpotInterval))
	}
	if c.RebalanceInterval > 0 && c.RebalanceInterval < time.Second {
		errs = append(errs, fmt.Errorf("imds.rebalanceInterval (%s) is below 1s; use 5s to 1m", c.RebalanceInterval))
	}
	if c.RebalanceInterval > 5*time.Minute {
		errs = append(errs, fmt.Errorf("imds.rebalanceInterval (%s) is above 5m; a rebalance recommendation is an early warning, use 5s to 1m", c.RebalanceInterval))
	}
	if c.EventInterval > 0 && c.EventInterval < time.Second {
		errs = append(errs, fmt.Errorf("imds.eventInterval (%s) is below 1s; use about 1m", c.EventInterval))
	}
	if c.EventInterval > time.Hour {
		errs = append(errs, fmt.Errorf("imds.eventInterval (%s) is above 1h; scheduled events must be seen well before they start, use about 1m", c.EventInterval))
	}
	if c.Endpoint != "" && !strings.HasPrefix(c.Endpoint, "http://") && !strings.HasPrefix(c.Endpoint, "https://") {
		errs = append(errs, fmt.Errorf("imds.endpoint %q is not an http(s) URL; leave it unset for http://169.254.169.254", c.Endpoint))
	}
	return errors.Join(errs...)
}

// group is a set of paths polled together on one schedule.
type group struct {
	kinds    []collectors.CheckName
	interval time.Duration
	next     time.Time
	failures int
	// spot marks the spot group: it reads instance-life-cycle first while that is not known,
	// and sleeps (dormant) on an instance that is not spot.
	spot    bool
	dormant bool
}

// Watcher polls the metadata service and keeps the latest result per kind.
type Watcher struct {
	cfg     Config
	log     *slog.Logger
	changed chan struct{}
	// envDisabled: AWS_EC2_METADATA_DISABLED=true, read as the SDK reads it when the client
	// is built, so the refusal it causes is recognised without its text.
	envDisabled bool

	mu      sync.Mutex
	client  *imds.Client
	latest  map[collectors.CheckName]collectors.Result
	running bool
	// lifeCycle is instance-life-cycle as last read; empty while unknown (not read yet, or
	// a read failed since).
	lifeCycle string
	// rebalanceNext is when the spot group reads the rebalance path again (zero: at its next
	// poll). Only Run's goroutine touches it.
	rebalanceNext time.Time

	requests *prometheus.CounterVec
	failures *prometheus.CounterVec
	pending  *prometheus.GaugeVec
	// counters are requests' children per path and result, looked up once: a poll then
	// touches no label map.
	counters map[string]*[3]prometheus.Counter
}

var kindPaths = map[collectors.CheckName]string{
	collectors.CheckSpotInterruption:        PathSpot,
	collectors.CheckRebalanceRecommendation: PathRebalance,
	collectors.CheckScheduledEvents:         PathScheduled,
	collectors.CheckASGLifecycle:            PathLifecycle,
}

// Indexes of a path's request counters, by result.
const (
	resultOK = iota
	resultNotFound
	resultError
)

// New validates cfg and returns a Watcher. It does no I/O.
func New(cfg Config) (*Watcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.SpotInterval == 0 {
		cfg.SpotInterval = DefaultSpotInterval
	}
	if cfg.RebalanceInterval == 0 {
		cfg.RebalanceInterval = DefaultRebalanceInterval
	}
	if cfg.EventInterval == 0 {
		cfg.EventInterval = DefaultEventInterval
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	w := &Watcher{
		cfg: cfg, log: cfg.Logger, changed: make(chan struct{}, 1),
		envDisabled: strings.EqualFold(os.Getenv(envMetadataDisabled), "true"),
		latest:      map[collectors.CheckName]collectors.Result{},
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodevigil_agent_imds_requests_total",
			Help: "Metadata reads by path and result (ok, not_found, error).",
		}, []string{"path", "result"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodevigil_agent_imds_failures_total",
			Help: "Metadata reads that failed, by cause (the Unknown reason: IMDSUnreachable, IMDSHopLimitExceeded, IMDSDisabled, IMDSv1Only, IMDSError).",
		}, []string{"reason"}),
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nodevigil_agent_aws_event_pending",
			Help: "1 while an AWS event of the kind is pending on this instance (spot-interruption, rebalance-recommendation, scheduled-events, asg-lifecycle), else 0.",
		}, []string{"kind"}),
		counters: map[string]*[3]prometheus.Counter{},
	}
	w.client = w.newClient()
	for _, p := range []string{PathSpot, PathRebalance, PathScheduled, PathLifecycle, PathInstanceLifeCycle} {
		c := &[3]prometheus.Counter{}
		for i, r := range []string{"ok", "not_found", "error"} {
			c[i] = w.requests.WithLabelValues(p, r)
		}
		w.counters[p] = c
	}
	for k := range kindPaths {
		w.pending.WithLabelValues(string(k))
	}
	return w, nil
}

// envMetadataDisabled is the SDK's switch that turns its metadata client off.
const envMetadataDisabled = "AWS_EC2_METADATA_DISABLED"

// SetGrid puts the Watcher's polls on the process's shared schedule (Config.Grid). Call it
// before Run: the binary builds the Watcher with the other checks, before the schedule the
// agent shares with it exists.
func (w *Watcher) SetGrid(g wakeup.Grid) { w.cfg.Grid = g }

func (w *Watcher) newClient() *imds.Client {
	return imds.New(imds.Options{
		Endpoint:       w.cfg.Endpoint,
		EnableFallback: aws.FalseTernary, // IMDSv2 only: never read without a session token
		// One attempt per poll: the Watcher has its own schedule and backoff, and a hop-limit
		// drop would otherwise hold a poll for three response timeouts.
		Retryer: aws.NopRetryer{},
		// Set once here, run by the SDK on every operation it builds (see customize).
		APIOptions: []func(*middleware.Stack) error{customize},
	})
}

// Describe implements prometheus.Collector.
func (w *Watcher) Describe(ch chan<- *prometheus.Desc) {
	w.requests.Describe(ch)
	w.failures.Describe(ch)
	w.pending.Describe(ch)
}

// Collect implements prometheus.Collector.
func (w *Watcher) Collect(ch chan<- prometheus.Metric) {
	w.requests.Collect(ch)
	w.failures.Collect(ch)
	w.pending.Collect(ch)
}

// Changed receives (capacity one, never blocking the Watcher) whenever a kind's status or
// reason changed, so the agent can publish it without waiting for its next cycle.
func (w *Watcher) Changed() <-chan struct{} { return w.changed }

// Checks returns one check per kind of event, in collectors.AWSEventChecks order. In OneShot
// mode Check reads the service itself; otherwise it returns what Run read last (Unknown
// NotYetRead before the first read).
func (w *Watcher) Checks() []Check {
	out := make([]Check, 0, 4)
	for _, k := range collectors.AWSEventChecks() {
		out = append(out, Check{w: w, kind: k})
	}
	return out
}

// Check reports one kind of event; it satisfies the agent's Checker interface.
type Check struct {
	w    *Watcher
	kind collectors.CheckName
}

// Watcher is the Watcher behind the check, for the binary to Run it and wait on Changed.
func (c Check) Watcher() *Watcher { return c.w }

// Name implements the agent's Checker.
func (c Check) Name() collectors.CheckName { return c.kind }

// Check returns the latest polled result of the kind, or reads it now when none was polled
// yet or the Watcher is one-shot.
func (c Check) Check(ctx context.Context) collectors.Result {
	w := c.w
	if w.cfg.OneShot {
		return w.oneShot(ctx, c.kind)
	}
	w.mu.Lock()
	r, ok := w.latest[c.kind]
	w.mu.Unlock()
	if ok {
		return r
	}
	// Run has not read this kind yet. No I/O here: a read can take the whole request timeout
	// (a hop-limit drop), longer than the agent gives a check; Changed wakes the agent once
	// the first read is in.
	return collectors.Result{Check: c.kind, Status: collectors.StatusUnknown, Reason: ReasonNotYetRead,
		Message: "the metadata service has not been read yet", Time: w.cfg.Clock.Now()}
}

// oneShot is `check`: it reads the kind's path now. A spot kind also reads
// instance-life-cycle (once per Watcher) to say "not a spot instance" where no notice is
// posted; the path itself is still read, as one read costs nothing in a one-off command and a
// posted notice is shown whatever the life cycle says.
func (w *Watcher) oneShot(ctx context.Context, kind collectors.CheckName) collectors.Result {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	var tr tracker
	ctx = tr.attach(ctx)
	r := w.read(ctx, &tr, kind)
	if !isSpotKind(kind) || r.Status != collectors.StatusHealthy {
		return r
	}
	w.mu.Lock()
	lc := w.lifeCycle
	w.mu.Unlock()
	if lc == "" {
		var lr collectors.Result
		if lc, lr = w.readLifeCycle(ctx, &tr); lc == "" {
			r.Inputs = append(r.Inputs, lr.Inputs...)
			return r
		}
	}
	if lc != LifeCycleSpot {
		return notSpotResult(kind, lc, r.Time)
	}
	r.Inputs = append(r.Inputs, lifeCycleInput(lc))
	return r
}

func isSpotKind(k collectors.CheckName) bool {
	return k == collectors.CheckSpotInterruption || k == collectors.CheckRebalanceRecommendation
}

func lifeCycleInput(lc string) collectors.Input {
	return collectors.Input{Name: PathInstanceLifeCycle, Source: "imds", Value: lc}
}

// notSpotResult is a spot kind on an instance that is not spot.
func notSpotResult(kind collectors.CheckName, lc string, now time.Time) collectors.Result {
	what := "spot interruption notice"
	if kind == collectors.CheckRebalanceRecommendation {
		what = "rebalance recommendation"
	}
	return collectors.Result{Check: kind, Status: collectors.StatusHealthy, Reason: ReasonNotSpot, Time: now,
		Message: fmt.Sprintf("not a spot instance (instance-life-cycle %s): AWS sends no %s to it, so it is not polled", lc, what),
		Inputs:  []collectors.Input{lifeCycleInput(lc)}}
}

// Run polls until ctx is done: on a spot instance the spot group every SpotInterval (the
// rebalance path on the first of its polls due after RebalanceInterval), the others every
// EventInterval, each group backing off exponentially (up to MaxBackoff) while
// the service cannot be used. One timer serves every wake-up.
func (w *Watcher) Run(ctx context.Context) {
	w.mu.Lock()
	w.running = true
	w.mu.Unlock()
	now := w.cfg.Clock.Now()
	spot := &group{kinds: []collectors.CheckName{collectors.CheckSpotInterruption, collectors.CheckRebalanceRecommendation},
		interval: w.cfg.SpotInterval, next: now, spot: true}
	events := &group{kinds: []collectors.CheckName{collectors.CheckScheduledEvents, collectors.CheckASGLifecycle},
		interval: w.cfg.EventInterval, next: now}
	groups := [...]*group{spot, events}
	var timer clock.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		now = w.cfg.Clock.Now()
		next := time.Time{}
		for _, g := range groups {
			if !g.dormant && !now.Before(g.next) {
				w.pollGroup(ctx, g)
				if ctx.Err() != nil {
					return
				}
				if !g.spot && g.failures > 0 && spot.dormant {
					// The service failed: the life cycle is read again (with the spot group,
					// when this group retries), in case this is another instance's service.
					spot.dormant, spot.next = false, g.next
				}
			}
			if !g.dormant && (next.IsZero() || g.next.Before(next)) {
				next = g.next
			}
		}
		d := next.Sub(w.cfg.Clock.Now())
		if timer == nil {
			timer = w.cfg.Clock.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			return
		case <-timer.C():
		}
	}
}

// pollGroup reads a group's paths in one wake-up, under one deadline.
func (w *Watcher) pollGroup(ctx context.Context, g *group) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	var tr tracker
	ctx = tr.attach(ctx)
	failed := false
	if g.spot {
		w.mu.Lock()
		lc := w.lifeCycle
		w.mu.Unlock()
		if lc == "" {
			var lr collectors.Result
			lc, lr = w.readLifeCycle(ctx, &tr)
			if ctx.Err() != nil && lc == "" && errors.Is(context.Cause(ctx), context.Canceled) {
				return
			}
			if lc == "" {
				for _, k := range g.kinds {
					r := lr
					r.Check = k
					w.store(r)
				}
				failed = true
			}
		}
		if lc != "" && lc != LifeCycleSpot {
			for _, k := range g.kinds {
				w.store(notSpotResult(k, lc, w.cfg.Clock.Now()))
			}
			g.dormant, g.failures = true, 0
			return
		}
	}
	if !failed {
		start := w.cfg.Clock.Now()
		for _, k := range g.kinds {
			rebalance := k == collectors.CheckRebalanceRecommendation
			if rebalance && start.Before(w.rebalanceNext) {
				continue
			}
			r := w.read(ctx, &tr, k)
			if ctx.Err() != nil && errors.Is(context.Cause(ctx), context.Canceled) {
				return
			}
			if r.Status == collectors.StatusUnknown {
				failed = true
			} else if rebalance {
				// Half a spot interval early, so it falls on the spot poll due then and
				// not on the one after.
				w.rebalanceNext = start.Add(w.cfg.RebalanceInterval - g.interval/2)
			}
			w.store(r)
		}
	}
	delay := g.interval
	if !failed && w.cfg.Grid.On() {
		g.failures = 0
		g.next = w.cfg.Grid.Next(w.cfg.Clock.Now(), g.interval)
		return
	}
	if failed {
		w.mu.Lock()
		w.lifeCycle = "" // read it again once the service answers
		w.mu.Unlock()
		w.rebalanceNext = time.Time{} // and every path with it
		g.failures++
		for i := 1; i < g.failures && delay < w.cfg.MaxBackoff; i++ {
			delay *= 2
		}
		delay = min(delay, max(w.cfg.MaxBackoff, g.interval))
	} else {
		g.failures = 0
	}
	g.next = w.cfg.Clock.Now().Add(delay)
}

// readLifeCycle reads instance-life-cycle and remembers it. On failure it returns "" and the
// Unknown result the spot kinds take. An answer that is not a known life cycle is taken as
// spot, so spot notices are never missed for a value AWS adds later.
func (w *Watcher) readLifeCycle(ctx context.Context, tr *tracker) (string, collectors.Result) {
	body, res := w.get(ctx, tr, collectors.CheckSpotInterruption, PathInstanceLifeCycle)
	if res.Status == collectors.StatusUnknown {
		return "", res
	}
	lc := strings.TrimSpace(body)
	if res.Reason == ReasonNoEvent { // 404: no life cycle published; assume spot, the safe side
		lc = "unknown"
	}
	if lc != LifeCycleSpot && lc != "on-demand" && lc != "scheduled" && lc != "capacity-block" {
		w.log.Warn("unexpected instance life cycle; polling the spot paths", "reason", lc)
		lc = LifeCycleSpot
	}
	w.mu.Lock()
	w.lifeCycle = lc
	w.mu.Unlock()
	return lc, res
}

// store keeps r as its kind's latest result and signals a change of status or reason.
func (w *Watcher) store(r collectors.Result) {
	w.mu.Lock()
	prev, seen := w.latest[r.Check]
	w.latest[r.Check] = r
	w.mu.Unlock()
	v := 0.0
	if r.Status == collectors.StatusUnhealthy || r.Status == collectors.StatusWarning && r.Reason != ReasonNoEvent {
		v = 1
	}
	if !seen || prev.Status != r.Status || prev.Reason != r.Reason {
		w.pending.WithLabelValues(string(r.Check)).Set(v)
	}
	if seen && prev.Status == r.Status && prev.Reason == r.Reason && prev.Message == r.Message {
		return
	}
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// read fetches one kind's path and turns the answer into a result.
func (w *Watcher) read(ctx context.Context, tr *tracker, kind collectors.CheckName) collectors.Result {
	path := kindPaths[kind]
	body, res := w.get(ctx, tr, kind, path)
	if res.Status != "" {
		if res.Reason == ReasonNoEvent {
			res.Message = noEventMessage(kind)
		}
		return res
	}
	r, perr := interpret(kind, body)
	if perr != nil {
		w.failures.WithLabelValues(ReasonIMDSError).Inc()
		res.Status, res.Reason, res.Err = collectors.StatusUnknown, ReasonIMDSError, perr
		res.Message = fmt.Sprintf("the metadata service answered %s with something nodevigil cannot read: %v", path, perr)
		return res
	}
	r.Check, r.Time = kind, res.Time
	r.Inputs = append(res.Inputs, collectors.Input{Name: "answer", Source: "imds", Value: oneLine(body)})
	if w.cfg.OneShot && r.Status == collectors.StatusUnhealthy {
		r.Status = collectors.StatusWarning
	}
	return r
}

// get reads one metadata path for kind. On a 200 it returns the body and a result with no
// Status; on a 404 a Healthy NoEvent result; on a failure an Unknown result naming the cause.
func (w *Watcher) get(ctx context.Context, tr *tracker, kind collectors.CheckName, path string) (string, collectors.Result) {
	res := collectors.Result{Check: kind, Time: w.cfg.Clock.Now(), Inputs: []collectors.Input{{Name: "path", Source: "imds", Value: path}}}
	counters := w.counters[path]
	w.mu.Lock()
	c := w.client
	w.mu.Unlock()
	tr.reset()
	out, err := c.GetMetadata(ctx, &imds.GetMetadataInput{Path: path})
	if err == nil {
		defer func() { _ = out.Content.Close() }()
		b, rerr := io.ReadAll(io.LimitReader(out.Content, 64<<10))
		if rerr == nil {
			counters[resultOK].Inc()
			return string(b), res
		}
		err = fmt.Errorf("read %s: %w", path, rerr)
	}
	f := w.classify(err, tr)
	if f.status == http.StatusNotFound && tr.tokenErr == nil {
		counters[resultNotFound].Inc()
		res.Status, res.Reason = collectors.StatusHealthy, ReasonNoEvent
		return "", res
	}
	counters[resultError].Inc()
	if f.status == http.StatusUnauthorized {
		// The service no longer knows the session token (it restarted); the SDK would
		// keep it until its TTL, so start over with a new client and a new token.
		w.mu.Lock()
		w.client = w.newClient()
		w.mu.Unlock()
	}
	res.Status, res.Reason, res.Message, res.Err = collectors.StatusUnknown, f.reason, f.message, err
	w.failures.WithLabelValues(res.Reason).Inc()
	w.log.Debug("imds read failed", "check", kind, "reason", res.Reason, "err", err)
	return "", res
}

func noEventMessage(kind collectors.CheckName) string {
	switch kind {
	case collectors.CheckSpotInterruption:
		return "no spot interruption notice"
	case collectors.CheckRebalanceRecommendation:
		return "no rebalance recommendation"
	case collectors.CheckScheduledEvents:
		return "no active scheduled event"
	default:
		return "the instance is not in an Auto Scaling group"
	}
}

// ScheduledEvent is one element of events/maintenance/scheduled, as the service writes it.
type ScheduledEvent struct {
	NotBefore   string `json:"NotBefore"`
	NotAfter    string `json:"NotAfter"`
	Code        string `json:"Code"`
	Description string `json:"Description"`
	EventID     string `json:"EventId"`
	State       string `json:"State"`
}

// ReasonForCode turns an EC2 event code (instance-reboot) into a condition reason
// (InstanceReboot).
func ReasonForCode(code string) string {
	var b strings.Builder
	up := true
	for _, r := range code {
		switch {
		case r == '-' || r == '_' || r == ':' || r == ' ':
			up = true
		case up && r >= 'a' && r <= 'z':
			b.WriteRune(r - 'a' + 'A')
			up = false
		default:
			b.WriteRune(r)
			up = false
		}
	}
	return b.String()
}

// interpret turns a 200 answer into a result (Status, Reason, Message).
func interpret(kind collectors.CheckName, body string) (collectors.Result, error) {
	var r collectors.Result
	switch kind {
	case collectors.CheckSpotInterruption:
		var v struct {
			Action string `json:"action"`
			Time   string `json:"time"`
		}
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			return r, fmt.Errorf("spot/instance-action: %w", err)
		}
		at, err := time.Parse(time.RFC3339, v.Time)
		if err != nil || v.Action == "" {
			return r, fmt.Errorf("spot/instance-action %q: want {\"action\":...,\"time\":RFC 3339}", body)
		}
		r.Status, r.Reason = collectors.StatusUnhealthy, "Spot"+ReasonForCode(v.Action)
		r.Message = fmt.Sprintf("spot interruption notice: AWS will %s this instance at %s; deadline %s",
			v.Action, at.UTC().Format(time.RFC3339), at.UTC().Format(time.RFC3339))
	case collectors.CheckRebalanceRecommendation:
		var v struct {
			NoticeTime string `json:"noticeTime"`
		}
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			return r, fmt.Errorf("events/recommendations/rebalance: %w", err)
		}
		at, err := time.Parse(time.RFC3339, v.NoticeTime)
		if err != nil {
			return r, fmt.Errorf("events/recommendations/rebalance %q: noticeTime is not RFC 3339", body)
		}
		r.Status, r.Reason = collectors.StatusUnhealthy, ReasonRebalanceRecommendation
		r.Message = fmt.Sprintf("rebalance recommendation since %s: this spot instance is at elevated risk of interruption; no deadline yet",
			at.UTC().Format(time.RFC3339))
	case collectors.CheckScheduledEvents:
		var evs []ScheduledEvent
		if err := json.Unmarshal([]byte(body), &evs); err != nil {
			return r, fmt.Errorf("events/maintenance/scheduled: %w", err)
		}
		active, err := ActiveEvents(evs)
		if err != nil {
			return r, err
		}
		if len(active) == 0 {
			r.Status, r.Reason, r.Message = collectors.StatusHealthy, ReasonNoEvent, noEventMessage(kind)
			return r, nil
		}
		parts := make([]string, len(active))
		for i, e := range active {
			parts[i] = describeEvent(e)
		}
		r.Status, r.Reason = collectors.StatusUnhealthy, ReasonForCode(active[0].Code)
		r.Message = strings.Join(parts, "; ")
	case collectors.CheckASGLifecycle:
		state := strings.TrimSpace(body)
		r.Reason = ReasonForCode(state)
		switch state {
		case "Terminated", "Warmed:Terminated":
			r.Status = collectors.StatusUnhealthy
			r.Message = fmt.Sprintf("the Auto Scaling group is terminating this instance (target lifecycle state %s)", state)
		default:
			r.Status = collectors.StatusHealthy
			r.Message = fmt.Sprintf("Auto Scaling target lifecycle state %s", state)
		}
	}
	return r, nil
}

// Event is one active scheduled event, parsed.
type Event struct {
	ID, Code, Description string
	NotBefore, NotAfter   time.Time
}

// ActiveEvents parses the active events of events/maintenance/scheduled (completed and
// canceled ones are dropped), earliest first.
func ActiveEvents(evs []ScheduledEvent) ([]Event, error) {
	var out []Event
	for _, e := range evs {
		if e.State != "" && !strings.EqualFold(e.State, scheduledState) {
			continue
		}
		if strings.HasPrefix(e.Description, "[Completed]") || strings.HasPrefix(e.Description, "[Canceled]") {
			continue
		}
		nb, err := time.Parse(TimeLayout, e.NotBefore)
		if err != nil {
			return nil, fmt.Errorf("event %s: NotBefore %q is not like %q", e.EventID, e.NotBefore, TimeLayout)
		}
		ev := Event{ID: e.EventID, Code: e.Code, Description: e.Description, NotBefore: nb.UTC()}
		if e.NotAfter != "" {
			na, err := time.Parse(TimeLayout, e.NotAfter)
			if err != nil {
				return nil, fmt.Errorf("event %s: NotAfter %q is not like %q", e.EventID, e.NotAfter, TimeLayout)
			}
			ev.NotAfter = na.UTC()
		}
		out = append(out, ev)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].NotBefore.Before(out[j].NotBefore) })
	return out, nil
}

// describeEvent is "code id: description; not before …, not after …". The event ID and RFC
// 3339 times let the remediator match it with DescribeInstanceStatus. It holds nothing that
// changes with the clock, so an unchanged event is never rewritten.
func describeEvent(e Event) string {
	s := fmt.Sprintf("%s %s: %s; not before %s", e.Code, e.ID, e.Description, e.NotBefore.Format(time.RFC3339))
	if !e.NotAfter.IsZero() {
		s += ", not after " + e.NotAfter.Format(time.RFC3339)
	}
	return s
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 256 {
		s = s[:256] + "…"
	}
	return s
}
