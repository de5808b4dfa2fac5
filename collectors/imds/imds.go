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
// A Watcher polls the spot paths every few seconds (a spot notice gives two minutes) and the
// others about once a minute, each group on its own schedule, and signals Changed whenever a
// verdict changes so the agent publishes it at once rather than at its next check cycle. A 404
// is "no event". A metadata service that cannot be used (not on EC2, hop limit 1 seen from a
// pod network, endpoint disabled, an IMDSv1-only proxy) makes every kind Unknown with the
// cause and the fix in the message; the group is retried with exponential backoff.
package imds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/nodevigil/nodevigil/collectors"
)

// Metadata paths, under /latest/meta-data/.
const (
	PathSpot       = "spot/instance-action"
	PathRebalance  = "events/recommendations/rebalance"
	PathScheduled  = "events/maintenance/scheduled"
	PathLifecycle  = "autoscaling/target-lifecycle-state"
	scheduledState = "active"
	// TimeLayout is the metadata service's time format in events/maintenance/scheduled.
	TimeLayout = "2 Jan 2006 15:04:05 GMT"
)

// Reasons of the results. Event results use the event's own code in CamelCase (see
// ReasonForCode); these are the others. They are stable: they become condition reasons.
const (
	// ReasonNoEvent: the path answered 404 or listed no active event.
	ReasonNoEvent = "NoEvent"
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
	// DefaultSpotInterval is the 5 s AWS recommends for polling spot notices: a notice gives two
	// minutes, and 2 s cost the agent 0.4 mCPU more for nothing (docs/benchmarks.md).
	DefaultSpotInterval  = 5 * time.Second
	DefaultEventInterval = time.Minute
	DefaultTimeout       = 2 * time.Second
	DefaultMaxBackoff    = 5 * time.Minute
)

// Config configures a Watcher. Zero values select the defaults.
type Config struct {
	// Endpoint is the metadata service's base URL. Empty means the SDK's: the
	// AWS_EC2_METADATA_SERVICE_ENDPOINT environment variable, else http://169.254.169.254.
	Endpoint string
	// SpotInterval is how often spot/instance-action and events/recommendations/rebalance are
	// read (default 2s: a spot notice gives two minutes).
	SpotInterval time.Duration
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
	}{{"spotInterval", c.SpotInterval}, {"eventInterval", c.EventInterval}, {"timeout", c.Timeout}, {"maxBackoff", c.MaxBackoff}} {
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
}

// Watcher polls the metadata service and keeps the latest result per kind.
type Watcher struct {
	cfg     Config
	log     *slog.Logger
	changed chan struct{}

	mu      sync.Mutex
	client  *imds.Client
	latest  map[collectors.CheckName]collectors.Result
	running bool

	requests *prometheus.CounterVec
	failures *prometheus.CounterVec
	pending  *prometheus.GaugeVec
}

var kindPaths = map[collectors.CheckName]string{
	collectors.CheckSpotInterruption:        PathSpot,
	collectors.CheckRebalanceRecommendation: PathRebalance,
	collectors.CheckScheduledEvents:         PathScheduled,
	collectors.CheckASGLifecycle:            PathLifecycle,
}

// New validates cfg and returns a Watcher. It does no I/O.
func New(cfg Config) (*Watcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.SpotInterval == 0 {
		cfg.SpotInterval = DefaultSpotInterval
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
		latest: map[collectors.CheckName]collectors.Result{},
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
	}
	w.client = w.newClient()
	for k, p := range kindPaths {
		w.pending.WithLabelValues(string(k))
		for _, r := range []string{"ok", "not_found", "error"} {
			w.requests.WithLabelValues(p, r)
		}
	}
	return w, nil
}

func (w *Watcher) newClient() *imds.Client {
	return imds.New(imds.Options{
		Endpoint:       w.cfg.Endpoint,
		EnableFallback: aws.FalseTernary, // IMDSv2 only: never read without a session token
		// One attempt per poll: the Watcher has its own schedule and backoff, and a hop-limit
		// drop would otherwise hold a poll for three response timeouts.
		Retryer: aws.NopRetryer{},
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
	w.mu.Lock()
	r, ok := w.latest[c.kind]
	w.mu.Unlock()
	if w.cfg.OneShot {
		return w.read(ctx, c.kind)
	}
	if ok {
		return r
	}
	// Run has not read this kind yet. No I/O here: a read can take the whole request timeout
	// (a hop-limit drop), longer than the agent gives a check; Changed wakes the agent once
	// the first read is in.
	return collectors.Result{Check: c.kind, Status: collectors.StatusUnknown, Reason: ReasonNotYetRead,
		Message: "the metadata service has not been read yet", Time: w.cfg.Clock.Now()}
}

// Run polls until ctx is done: the spot group every SpotInterval, the others every
// EventInterval, each group backing off exponentially (up to MaxBackoff) while the service
// cannot be used.
func (w *Watcher) Run(ctx context.Context) {
	w.mu.Lock()
	w.running = true
	w.mu.Unlock()
	now := w.cfg.Clock.Now()
	groups := []*group{
		{kinds: []collectors.CheckName{collectors.CheckSpotInterruption, collectors.CheckRebalanceRecommendation}, interval: w.cfg.SpotInterval, next: now},
		{kinds: []collectors.CheckName{collectors.CheckScheduledEvents, collectors.CheckASGLifecycle}, interval: w.cfg.EventInterval, next: now},
	}
	for {
		now = w.cfg.Clock.Now()
		next := time.Time{}
		for _, g := range groups {
			if !now.Before(g.next) {
				w.pollGroup(ctx, g)
				if ctx.Err() != nil {
					return
				}
			}
			if next.IsZero() || g.next.Before(next) {
				next = g.next
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-w.cfg.Clock.After(next.Sub(w.cfg.Clock.Now())):
		}
	}
}

func (w *Watcher) pollGroup(ctx context.Context, g *group) {
	failed := false
	for _, k := range g.kinds {
		r := w.read(ctx, k)
		if ctx.Err() != nil {
			return
		}
		if r.Status == collectors.StatusUnknown {
			failed = true
		}
		w.store(r)
	}
	delay := g.interval
	if failed {
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
	w.pending.WithLabelValues(string(r.Check)).Set(v)
	if seen && prev.Status == r.Status && prev.Reason == r.Reason && prev.Message == r.Message {
		return
	}
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// read fetches one kind's path and turns the answer into a result.
func (w *Watcher) read(ctx context.Context, kind collectors.CheckName) collectors.Result {
	path := kindPaths[kind]
	now := w.cfg.Clock.Now()
	res := collectors.Result{Check: kind, Time: now, Inputs: []collectors.Input{{Name: "path", Source: "imds", Value: path}}}
	cctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	w.mu.Lock()
	c := w.client
	w.mu.Unlock()
	body, status, err := get(cctx, c, path)
	switch {
	case err == nil:
		w.requests.WithLabelValues(path, "ok").Inc()
	case status == http.StatusNotFound:
		w.requests.WithLabelValues(path, "not_found").Inc()
		res.Status, res.Reason = collectors.StatusHealthy, ReasonNoEvent
		res.Message = noEventMessage(kind)
		return res
	default:
		w.requests.WithLabelValues(path, "error").Inc()
		if status == http.StatusUnauthorized {
			// The service no longer knows the session token (it restarted); the SDK would
			// keep it until its TTL, so start over with a new client and a new token.
			w.mu.Lock()
			w.client = w.newClient()
			w.mu.Unlock()
		}
		res.Status = collectors.StatusUnknown
		res.Reason, res.Message = classify(err, status, w.cfg.Endpoint)
		res.Err = err
		w.failures.WithLabelValues(res.Reason).Inc()
		w.log.Debug("imds read failed", "check", kind, "reason", res.Reason, "err", err)
		return res
	}
	r, perr := interpret(kind, body)
	if perr != nil {
		w.failures.WithLabelValues(ReasonIMDSError).Inc()
		res.Status, res.Reason, res.Err = collectors.StatusUnknown, ReasonIMDSError, perr
		res.Message = fmt.Sprintf("the metadata service answered %s with something nodevigil cannot read: %v", path, perr)
		return res
	}
	r.Check, r.Time = kind, now
	r.Inputs = append(res.Inputs, collectors.Input{Name: "answer", Source: "imds", Value: oneLine(body)})
	if w.cfg.OneShot && r.Status == collectors.StatusUnhealthy {
		r.Status = collectors.StatusWarning
	}
	return r
}

// get reads one metadata path; status is the HTTP status of a failed read (0 when there was
// no answer or the token request failed).
func get(ctx context.Context, c *imds.Client, path string) (string, int, error) {
	out, err := c.GetMetadata(ctx, &imds.GetMetadataInput{Path: path})
	if err != nil {
		if _, _, tokenFailed := tokenFailure(err); !tokenFailed {
			var re *smithyhttp.ResponseError
			if errors.As(err, &re) {
				return "", re.HTTPStatusCode(), err
			}
		}
		return "", 0, err
	}
	defer func() { _ = out.Content.Close() }()
	b, err := io.ReadAll(io.LimitReader(out.Content, 64<<10))
	if err != nil {
		return "", 0, fmt.Errorf("read %s: %w", path, err)
	}
	return string(b), http.StatusOK, nil
}

// tokenFailure returns the text of the SDK's failed token request and its HTTP status (0 when
// there was no answer), or ok=false when the token was not what failed. The SDK wraps that
// error in a type without Unwrap, so its text is all there is to go on.
func tokenFailure(err error) (text string, status int, ok bool) {
	msg := err.Error()
	_, after, found := strings.Cut(msg, "failed to get API token")
	if !found {
		return "", 0, false
	}
	if m := statusPattern.FindStringSubmatch(after); m != nil {
		status, _ = strconv.Atoi(m[1])
	}
	return strings.TrimLeft(after, ", "), status, true
}

var statusPattern = regexp.MustCompile(`StatusCode: (\d{3})`)

const fixNetwork = "run the agent with hostNetwork: true (the chart's default) or raise the instance's " +
	"response hop limit to 2 (aws ec2 modify-instance-metadata-options --instance-id <id> --http-put-response-hop-limit 2, " +
	"or MetadataOptions.HttpPutResponseHopLimit in the launch template / EC2NodeClass)"

// classify names the cause of a failed read and its fix.
func classify(err error, status int, endpoint string) (reason, msg string) {
	if endpoint == "" {
		endpoint = "169.254.169.254"
	}
	if strings.Contains(err.Error(), "access disabled to EC2 IMDS") {
		return ReasonIMDSDisabled, "the metadata client is disabled by AWS_EC2_METADATA_DISABLED=true in the agent's environment; unset it to see AWS events"
	}
	if text, code, ok := tokenFailure(err); ok {
		switch {
		case code == http.StatusForbidden:
			return ReasonIMDSDisabled, fmt.Sprintf("the metadata service at %s refused a session token (403): the instance's metadata endpoint is disabled; "+
				"enable it (aws ec2 modify-instance-metadata-options --instance-id <id> --http-endpoint enabled, or MetadataOptions.HttpEndpoint in the launch template / EC2NodeClass)", endpoint)
		case code == http.StatusNotFound || code == http.StatusMethodNotAllowed:
			return ReasonIMDSv1Only, fmt.Sprintf("the metadata service at %s has no IMDSv2 token endpoint (%d): something in front of it speaks IMDSv1 only; "+
				"nodevigil reads IMDSv2 only: remove the proxy or let the agent reach 169.254.169.254 directly (hostNetwork: true), with HttpTokens required or optional", endpoint, code)
		case code != 0:
			return ReasonIMDSError, fmt.Sprintf("the metadata service at %s answered the session token request with %d; retrying with backoff", endpoint, code)
		case strings.Contains(text, "awaiting response headers") || (strings.Contains(text, "deadline exceeded") && !strings.Contains(text, "dial")):
			// Connected and sent, no answer: the reply was dropped on the way back.
			return ReasonIMDSHopLimit, fmt.Sprintf("the metadata service at %s took the session token request but its answer never arrived: "+
				"the response hop limit (HttpPutResponseHopLimit=1) is too low for a pod in its own network namespace; %s", endpoint, fixNetwork)
		}
		return ReasonIMDSUnreachable, fmt.Sprintf("the metadata service at %s could not be reached (%s): not on EC2, or blocked by a network policy or iptables rule; "+
			"on EC2, %s; off EC2 AWS events are simply not observed", endpoint, lastPart(text), fixNetwork)
	}
	if status == http.StatusUnauthorized {
		return ReasonIMDSError, "the metadata service rejected the session token (401); a new token is fetched on the next poll"
	}
	if status != 0 {
		return ReasonIMDSError, fmt.Sprintf("the metadata service at %s answered %d; retrying with backoff", endpoint, status)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ReasonIMDSUnreachable, fmt.Sprintf("the metadata service at %s did not answer in time (%s); retrying with backoff", endpoint, rootCause(err))
	}
	return ReasonIMDSUnreachable, fmt.Sprintf("the metadata service at %s could not be read (%s); retrying with backoff", endpoint, rootCause(err))
}

// lastPart is the end of an SDK error text, after its operation prefixes.
func lastPart(s string) string {
	if i := strings.LastIndex(s, ": "); i >= 0 && i+2 < len(s) {
		return s[i+2:]
	}
	return s
}

// rootCause is the innermost error's text, without the SDK's operation prefixes.
func rootCause(err error) string {
	for {
		u := errors.Unwrap(err)
		if u == nil {
			return err.Error()
		}
		err = u
	}
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
