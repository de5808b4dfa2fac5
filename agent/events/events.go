// Package events records core/v1 Events about the node, as client-go's event broadcaster
// (k8s.io/client-go/tools/record) does, without linking it.
//
// The broadcaster pulls strategic-merge-patch and OpenAPI machinery into the binary (about 35
// packages and 1 MB) to compute one trivial patch, which on a per-node DaemonSet is resident
// memory paid on every node for a handful of Events. This Recorder writes the same Events the
// same way: named <object>.<unix-nanos-hex>, in the default namespace, with the source
// component and host, FirstTimestamp/LastTimestamp/Count, asynchronously through a bounded
// queue. It keeps the broadcaster's client-side correlation with the same limits: a repeat of
// an identical Event patches the existing one's count, lastTimestamp and message; more than 10
// distinct messages for the same object, type and reason within 10 minutes are combined into
// one "(combined from similar events)" Event; each object and type gets a burst of 25 Events,
// refilled by one every 5 minutes; a write that fails in transit is retried up to 12 times,
// 10 s apart; one the API server rejects is dropped.
//
// It is meant for Events about cluster-scoped objects (the Node), which live in the default
// namespace; the Sink must write there.
package events

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mathrand "math/rand/v2"
	"net/http"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/clock"
	"k8s.io/utils/lru"
)

// Sink writes Events in the default namespace. client-go's typed
// clientset.CoreV1().Events(metav1.NamespaceDefault) satisfies it, as does the agent's
// kubeclient.
type Sink interface {
	Create(ctx context.Context, event *v1.Event, opts metav1.CreateOptions) (*v1.Event, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*v1.Event, error)
}

// Defaults, the values client-go's event broadcaster uses (except CacheSize, which bounds
// memory for an agent that records a few kinds of Events about one object).
const (
	DefaultQueueLength     = 1000
	DefaultMaxTries        = 12
	DefaultRetryInterval   = 10 * time.Second
	DefaultSpamBurst       = 25
	DefaultSpamRefill      = 5 * time.Minute
	DefaultAggregateMax    = 10
	DefaultAggregateWindow = 10 * time.Minute
	DefaultCacheSize       = 256
	DefaultWriteTimeout    = 15 * time.Second
	DefaultFlushTimeout    = 2 * time.Second
)

// errQueueFull is logged when an Event is dropped because the queue is full.
var errQueueFull = errors.New("too many queued events")

// combinedPrefix marks an Event that stands for several similar ones, as client-go writes it.
const combinedPrefix = "(combined from similar events): "

// Config configures a Recorder. Zero values are replaced by defaults.
type Config struct {
	// Sink writes the Events. Required.
	Sink Sink
	// Source names the component and host recording the Events; Component is required.
	Source v1.EventSource
	// QueueLength bounds the Events waiting to be written; more are dropped (default 1000).
	QueueLength int
	// MaxTries and RetryInterval bound the attempts to write one Event when the API server
	// cannot be reached (defaults 12 and 10s; the first wait is randomised).
	MaxTries      int
	RetryInterval time.Duration
	// SpamBurst and SpamRefill rate-limit Events per object and type (defaults 25 and 5m).
	SpamBurst  int
	SpamRefill time.Duration
	// AggregateMax distinct messages for the same object, type and reason within
	// AggregateWindow are combined into one Event (defaults 10 and 10m).
	AggregateMax    int
	AggregateWindow time.Duration
	// CacheSize bounds each correlation cache (default 256 keys, least recently used evicted).
	CacheSize int
	// WriteTimeout bounds one API call (default 15s).
	WriteTimeout time.Duration
	// FlushTimeout bounds the single attempt to write still-queued Events when Run stops
	// (default 2s).
	FlushTimeout time.Duration
	// Clock is the time source (default the real clock).
	Clock clock.Clock
	// Rand returns a number in [0,1) to randomise the first retry (default math/rand/v2).
	Rand func() float64
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// Recorder records Events. Event and Eventf never block; Run writes the queued Events.
type Recorder struct {
	cfg   Config
	queue chan *v1.Event

	// The correlation state below is touched only by Run's goroutine.
	aggregates *lru.Cache // aggregate key -> *aggregateRecord
	logs       *lru.Cache // event key -> eventLog
	spam       *lru.Cache // spam key -> *bucket
}

type aggregateRecord struct {
	messages map[string]struct{}
	last     time.Time
}

type eventLog struct {
	count           int32
	firstTimestamp  metav1.Time
	name            string
	resourceVersion string
}

// bucket is a token bucket that starts full.
type bucket struct {
	tokens float64
	last   time.Time
}

// New validates cfg and fills defaults. It does no I/O.
func New(cfg Config) (*Recorder, error) {
	switch {
	case cfg.Sink == nil:
		return nil, errors.New("events: Sink is required")
	case cfg.Source.Component == "":
		return nil, errors.New("events: Source.Component is required")
	}
	if cfg.QueueLength <= 0 {
		cfg.QueueLength = DefaultQueueLength
	}
	if cfg.MaxTries <= 0 {
		cfg.MaxTries = DefaultMaxTries
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = DefaultRetryInterval
	}
	if cfg.SpamBurst <= 0 {
		cfg.SpamBurst = DefaultSpamBurst
	}
	if cfg.SpamRefill <= 0 {
		cfg.SpamRefill = DefaultSpamRefill
	}
	if cfg.AggregateMax <= 0 {
		cfg.AggregateMax = DefaultAggregateMax
	}
	if cfg.AggregateWindow <= 0 {
		cfg.AggregateWindow = DefaultAggregateWindow
	}
	if cfg.CacheSize <= 0 {
		cfg.CacheSize = DefaultCacheSize
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.FlushTimeout <= 0 {
		cfg.FlushTimeout = DefaultFlushTimeout
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Rand == nil {
		cfg.Rand = mathrand.Float64
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Recorder{
		cfg:        cfg,
		queue:      make(chan *v1.Event, cfg.QueueLength),
		aggregates: lru.New(cfg.CacheSize),
		logs:       lru.New(cfg.CacheSize),
		spam:       lru.New(cfg.CacheSize),
	}, nil
}

// Event queues an Event about object, which must be a *v1.ObjectReference (the agent refers
// to its Node by reference). eventtype is v1.EventTypeNormal or v1.EventTypeWarning; anything
// else is dropped and logged, as client-go does.
func (r *Recorder) Event(object runtime.Object, eventtype, reason, message string) {
	ref, ok := object.(*v1.ObjectReference)
	if !ok || ref == nil {
		r.cfg.Logger.Error("record event failed", "reason", reason, "err", fmt.Errorf("object %T is not an object reference", object))
		return
	}
	if eventtype != v1.EventTypeNormal && eventtype != v1.EventTypeWarning {
		r.cfg.Logger.Error("record event failed", "reason", reason, "err", fmt.Errorf("unsupported event type %q", eventtype))
		return
	}
	now := metav1.NewTime(r.cfg.Clock.Now())
	ev := &v1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      eventName(ref.Name, now.Time),
			Namespace: metav1.NamespaceDefault,
		},
		InvolvedObject:      *ref,
		Reason:              reason,
		Message:             message,
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
		Type:                eventtype,
		Source:              r.cfg.Source,
		ReportingController: r.cfg.Source.Component,
		ReportingInstance:   r.cfg.Source.Host,
	}
	select {
	case r.queue <- ev:
	default:
		r.cfg.Logger.Error("record event failed", "reason", reason, "err", errQueueFull)
	}
}

// Eventf is Event with a fmt.Sprintf message.
func (r *Recorder) Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any) {
	r.Event(object, eventtype, reason, fmt.Sprintf(messageFmt, args...))
}

// Run writes queued Events until ctx is done, then tries once to write what is still queued,
// within FlushTimeout.
func (r *Recorder) Run(ctx context.Context) {
	for {
		select {
		case ev := <-r.queue:
			r.record(ctx, ev, r.cfg.MaxTries)
		case <-ctx.Done():
			r.flush(context.WithoutCancel(ctx))
			return
		}
	}
}

func (r *Recorder) flush(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.FlushTimeout)
	defer cancel()
	for ctx.Err() == nil {
		select {
		case ev := <-r.queue:
			r.record(ctx, ev, 1)
		default:
			return
		}
	}
}

// record correlates ev and writes it, trying up to tries times.
func (r *Recorder) record(ctx context.Context, ev *v1.Event, tries int) {
	ev, patch, skip := r.correlate(ev)
	if skip {
		r.cfg.Logger.Debug("event suppressed by the spam filter", "reason", ev.Reason)
		return
	}
	for try := 1; ; try++ {
		if r.write(ctx, ev, patch) {
			return
		}
		if try >= tries {
			r.cfg.Logger.Error("write event failed: retry limit exceeded", "reason", ev.Reason, "attempt", try)
			return
		}
		wait := r.cfg.RetryInterval
		if try == 1 {
			// Spread the agents of a cluster that all lost the API server at once.
			wait = time.Duration(float64(wait) * r.cfg.Rand())
		}
		select {
		case <-ctx.Done():
			r.cfg.Logger.Error("write event failed: recorder stopped", "reason", ev.Reason, "attempt", try)
			return
		case <-r.cfg.Clock.After(wait):
		}
	}
}

// correlate applies aggregation, de-duplication and the spam filter, in client-go's order. It
// returns the Event to write, the patch for an existing Event (nil to create one), and
// whether to drop it.
func (r *Recorder) correlate(ev *v1.Event) (*v1.Event, []byte, bool) {
	now := r.cfg.Clock.Now()
	ev, key := r.aggregate(ev, now)

	// A repeat of an Event already written updates it instead of adding one.
	var patch []byte
	if v, ok := r.logs.Get(key); ok {
		last := v.(eventLog)
		ev.Name = last.name
		ev.ResourceVersion = last.resourceVersion
		ev.FirstTimestamp = last.firstTimestamp
		ev.Count = last.count + 1
		patch = repeatPatch(ev)
	}
	r.logs.Add(key, eventLog{count: ev.Count, firstTimestamp: ev.FirstTimestamp, name: ev.Name, resourceVersion: ev.ResourceVersion})

	spamKey := join(ev.Source.Component, ev.Source.Host, ev.InvolvedObject.Kind, ev.InvolvedObject.Namespace,
		ev.InvolvedObject.Name, string(ev.InvolvedObject.UID), ev.InvolvedObject.APIVersion, ev.Type)
	b := &bucket{}
	if v, ok := r.spam.Get(spamKey); ok {
		b = v.(*bucket)
	}
	r.spam.Add(spamKey, b)
	return ev, patch, !b.take(now, float64(r.cfg.SpamBurst), r.cfg.SpamRefill)
}

// aggregate returns ev and its cache key, or, once AggregateMax distinct messages for the
// same object, type and reason arrived within AggregateWindow, a combined Event keyed by what
// they share.
func (r *Recorder) aggregate(ev *v1.Event, now time.Time) (*v1.Event, string) {
	aggKey := join(ev.Source.Component, ev.Source.Host, ev.InvolvedObject.Kind, ev.InvolvedObject.Namespace,
		ev.InvolvedObject.Name, string(ev.InvolvedObject.UID), ev.InvolvedObject.APIVersion, ev.Type, ev.Reason,
		ev.ReportingController, ev.ReportingInstance)
	rec := &aggregateRecord{}
	if v, ok := r.aggregates.Get(aggKey); ok {
		rec = v.(*aggregateRecord)
	}
	if now.Sub(rec.last) > r.cfg.AggregateWindow {
		rec = &aggregateRecord{messages: map[string]struct{}{}}
	}
	rec.messages[ev.Message] = struct{}{}
	rec.last = now
	r.aggregates.Add(aggKey, rec)
	if len(rec.messages) < r.cfg.AggregateMax {
		return ev, eventKey(ev)
	}
	for m := range rec.messages { // keep the set at its bound
		delete(rec.messages, m)
		break
	}
	t := metav1.NewTime(now)
	return &v1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", ev.InvolvedObject.Name, now.UnixNano()), Namespace: ev.Namespace},
		Count:          1,
		FirstTimestamp: t,
		InvolvedObject: ev.InvolvedObject,
		LastTimestamp:  t,
		Message:        combinedPrefix + ev.Message,
		Type:           ev.Type,
		Reason:         ev.Reason,
		Source:         ev.Source,
	}, aggKey
}

// write creates ev, or patches the existing Event when patch is set (creating it again if it
// was deleted). It reports whether the Event is done with: written, or rejected for good.
func (r *Recorder) write(ctx context.Context, ev *v1.Event, patch []byte) bool {
	cctx, cancel := context.WithTimeout(ctx, r.cfg.WriteTimeout)
	defer cancel()
	var (
		stored *v1.Event
		err    error
	)
	if patch != nil {
		stored, err = r.cfg.Sink.Patch(cctx, ev.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	}
	if patch == nil || isNotFound(err) {
		ev.ResourceVersion = ""
		stored, err = r.cfg.Sink.Create(cctx, ev, metav1.CreateOptions{})
	}
	if err == nil {
		r.logs.Add(eventKey(stored), eventLog{count: stored.Count, firstTimestamp: stored.FirstTimestamp,
			name: stored.Name, resourceVersion: stored.ResourceVersion})
		r.cfg.Logger.Debug("event recorded", "reason", ev.Reason)
		return true
	}
	// The API server answered: the Event is malformed or not allowed, and sending it again
	// would not change that. Anything else (transport errors) is worth another try.
	var status *apierrors.StatusError
	if errors.As(err, &status) {
		level := slog.LevelError
		if apierrors.IsAlreadyExists(err) || apierrors.HasStatusCause(err, v1.NamespaceTerminatingCause) {
			level = slog.LevelDebug
		}
		r.cfg.Logger.Log(ctx, level, "api server rejected event, not retrying", "reason", ev.Reason, "err", err)
		return true
	}
	r.cfg.Logger.Warn("write event failed, will retry", "reason", ev.Reason, "err", err)
	return false
}

func isNotFound(err error) bool {
	var status *apierrors.StatusError
	return errors.As(err, &status) && status.Status().Code == http.StatusNotFound
}

// repeatPatch is the strategic-merge patch client-go sends for a repeated Event.
func repeatPatch(ev *v1.Event) []byte {
	p := map[string]any{"count": ev.Count, "lastTimestamp": ev.LastTimestamp}
	if ev.Message != "" {
		p["message"] = ev.Message
	}
	b, _ := json.Marshal(p) // a map of an int32, a metav1.Time and a string always encodes
	return b
}

// eventKey identifies identical Events: same source, object, type, reason and message.
func eventKey(ev *v1.Event) string {
	o := ev.InvolvedObject
	return join(ev.Source.Component, ev.Source.Host, o.Kind, o.Namespace, o.Name, o.FieldPath, string(o.UID),
		o.APIVersion, ev.Type, ev.Reason, ev.Message)
}

func join(parts ...string) string { return strings.Join(parts, "") }

// eventName is <object>.<unix-nanos-hex>, or a random name when that is not a valid object
// name (an object name near the 253-character limit).
func eventName(object string, t time.Time) string {
	name := fmt.Sprintf("%s.%x", object, t.UnixNano())
	if len(validation.IsDNS1123Subdomain(name)) == 0 {
		return name
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}

// take refills the bucket for the time since its last use and takes one token if there is one.
func (b *bucket) take(now time.Time, burst float64, refill time.Duration) bool {
	if b.last.IsZero() {
		b.tokens = burst
	} else if elapsed := now.Sub(b.last); elapsed > 0 {
		b.tokens = min(burst, b.tokens+float64(elapsed)/float64(refill))
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
