package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
)

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

var nodeRef = &v1.ObjectReference{Kind: "Node", Name: "node-a", UID: "node-a"}

// call is one request the fake sink received.
type call struct {
	verb  string // create or patch
	name  string
	event *v1.Event // create
	patch map[string]any
}

// fakeSink stores Events like an API server and fails the next calls with errs.
type fakeSink struct {
	mu     sync.Mutex
	calls  []call
	stored map[string]*v1.Event
	errs   []error
	rv     int
}

func newFakeSink() *fakeSink { return &fakeSink{stored: map[string]*v1.Event{}} }

func (f *fakeSink) nextErr() error {
	if len(f.errs) == 0 {
		return nil
	}
	err := f.errs[0]
	f.errs = f.errs[1:]
	return err
}

func (f *fakeSink) Create(_ context.Context, ev *v1.Event, _ metav1.CreateOptions) (*v1.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call{verb: "create", name: ev.Name, event: ev.DeepCopy()})
	if err := f.nextErr(); err != nil {
		return nil, err
	}
	f.rv++
	out := ev.DeepCopy()
	out.ResourceVersion = fmt.Sprint(f.rv)
	f.stored[out.Name] = out
	return out.DeepCopy(), nil
}

func (f *fakeSink) Patch(_ context.Context, name string, pt types.PatchType, data []byte, _ metav1.PatchOptions, _ ...string) (*v1.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var p map[string]any
	if pt != types.StrategicMergePatchType || json.Unmarshal(data, &p) != nil {
		return nil, fmt.Errorf("bad patch %s %s", pt, data)
	}
	f.calls = append(f.calls, call{verb: "patch", name: name, patch: p})
	if err := f.nextErr(); err != nil {
		return nil, err
	}
	ev, ok := f.stored[name]
	if !ok {
		return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "events"}, name)
	}
	ev.Count = int32(p["count"].(float64))
	if m, ok := p["message"].(string); ok {
		ev.Message = m
	}
	f.rv++
	ev.ResourceVersion = fmt.Sprint(f.rv)
	return ev.DeepCopy(), nil
}

func (f *fakeSink) getCalls() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]call(nil), f.calls...)
}

type harness struct {
	sink  *fakeSink
	clock *clocktesting.FakeClock
	rec   *Recorder
}

func newHarness(t *testing.T, mut func(*Config)) *harness {
	t.Helper()
	h := &harness{sink: newFakeSink(), clock: clocktesting.NewFakeClock(t0)}
	cfg := Config{
		Sink:   h.sink,
		Source: v1.EventSource{Component: "nodevigil-agent", Host: "node-a"},
		Clock:  h.clock,
		Rand:   func() float64 { return 0.5 },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if mut != nil {
		mut(&cfg)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.rec = r
	return h
}

// drain writes every queued Event synchronously (the work Run does), without retries.
func (h *harness) drain() {
	for {
		select {
		case ev := <-h.rec.queue:
			h.rec.record(context.Background(), ev, 1)
		default:
			return
		}
	}
}

func TestEventIsWrittenLikeClientGo(t *testing.T) {
	h := newHarness(t, nil)
	h.rec.Eventf(nodeRef, v1.EventTypeNormal, "StartupTaintsRemoved", "Removed %s", "taint-a")
	h.drain()
	calls := h.sink.getCalls()
	if len(calls) != 1 || calls[0].verb != "create" {
		t.Fatalf("calls = %+v, want one create", calls)
	}
	ev := calls[0].event
	wantName := fmt.Sprintf("node-a.%x", t0.UnixNano())
	if ev.Name != wantName || ev.Namespace != metav1.NamespaceDefault {
		t.Errorf("event %s/%s, want default/%s", ev.Namespace, ev.Name, wantName)
	}
	if ev.InvolvedObject != *nodeRef || ev.Reason != "StartupTaintsRemoved" || ev.Message != "Removed taint-a" ||
		ev.Type != v1.EventTypeNormal || ev.Count != 1 {
		t.Errorf("event = %+v", ev)
	}
	if ev.Source.Component != "nodevigil-agent" || ev.Source.Host != "node-a" ||
		ev.ReportingController != "nodevigil-agent" || ev.ReportingInstance != "node-a" {
		t.Errorf("source = %+v, reporting %s/%s", ev.Source, ev.ReportingController, ev.ReportingInstance)
	}
	if !ev.FirstTimestamp.Time.Equal(t0) || !ev.LastTimestamp.Time.Equal(t0) {
		t.Errorf("timestamps %v %v, want %v", ev.FirstTimestamp, ev.LastTimestamp, t0)
	}
}

func TestRepeatPatchesTheExistingEvent(t *testing.T) {
	h := newHarness(t, nil)
	for i := range 3 {
		h.clock.SetTime(t0.Add(time.Duration(i) * time.Minute))
		h.rec.Event(nodeRef, v1.EventTypeWarning, "KubeletRestartFailed", "restart failed")
		h.drain()
	}
	calls := h.sink.getCalls()
	if len(calls) != 3 || calls[0].verb != "create" || calls[1].verb != "patch" || calls[2].verb != "patch" {
		t.Fatalf("calls = %+v, want create, patch, patch", calls)
	}
	for i, c := range calls[1:] {
		if c.name != calls[0].name {
			t.Errorf("patch %d of %s, want the first event %s", i, c.name, calls[0].name)
		}
		want := map[string]any{"count": float64(i + 2), "message": "restart failed",
			"lastTimestamp": t0.Add(time.Duration(i+1) * time.Minute).Format(time.RFC3339)}
		if fmt.Sprint(c.patch) != fmt.Sprint(want) {
			t.Errorf("patch %d = %v, want %v", i, c.patch, want)
		}
	}
	// A different message is a different Event.
	h.rec.Event(nodeRef, v1.EventTypeWarning, "KubeletRestartFailed", "other message")
	h.drain()
	if c := h.sink.getCalls(); c[len(c)-1].verb != "create" {
		t.Errorf("new message sent as %s, want create", c[len(c)-1].verb)
	}
}

func TestRepeatOfDeletedEventIsCreatedAgain(t *testing.T) {
	h := newHarness(t, nil)
	h.rec.Event(nodeRef, v1.EventTypeWarning, "R", "m")
	h.drain()
	delete(h.sink.stored, h.sink.getCalls()[0].name)
	h.rec.Event(nodeRef, v1.EventTypeWarning, "R", "m")
	h.drain()
	calls := h.sink.getCalls()
	if len(calls) != 3 || calls[1].verb != "patch" || calls[2].verb != "create" {
		t.Fatalf("calls = %+v, want create, patch (not found), create", calls)
	}
	if ev := calls[2].event; ev.Count != 2 || ev.ResourceVersion != "" {
		t.Errorf("re-created event count %d resourceVersion %q, want 2 and empty", ev.Count, ev.ResourceVersion)
	}
}

func TestSimilarEventsAreCombined(t *testing.T) {
	h := newHarness(t, nil)
	for i := range DefaultAggregateMax {
		h.rec.Eventf(nodeRef, v1.EventTypeWarning, "KubeletRestartFailed", "attempt %d failed", i)
	}
	h.drain()
	calls := h.sink.getCalls()
	if len(calls) != DefaultAggregateMax {
		t.Fatalf("%d calls, want %d", len(calls), DefaultAggregateMax)
	}
	for i, c := range calls[:DefaultAggregateMax-1] {
		if strings.HasPrefix(c.event.Message, combinedPrefix) {
			t.Errorf("event %d combined too early: %q", i, c.event.Message)
		}
	}
	last := calls[DefaultAggregateMax-1]
	if want := combinedPrefix + fmt.Sprintf("attempt %d failed", DefaultAggregateMax-1); last.verb != "create" || last.event.Message != want {
		t.Errorf("last call %s %q, want create %q", last.verb, last.event.Message, want)
	}
	// Another similar one updates the combined Event.
	h.rec.Event(nodeRef, v1.EventTypeWarning, "KubeletRestartFailed", "yet another")
	h.drain()
	calls = h.sink.getCalls()
	if c := calls[len(calls)-1]; c.verb != "patch" || c.name != last.name || c.patch["count"] != float64(2) {
		t.Errorf("next similar event = %+v, want a patch of %s to count 2", c, last.name)
	}
	// After the window, messages count afresh.
	h.clock.Step(DefaultAggregateWindow + time.Second)
	h.rec.Event(nodeRef, v1.EventTypeWarning, "KubeletRestartFailed", "fresh")
	h.drain()
	calls = h.sink.getCalls()
	if c := calls[len(calls)-1]; c.verb != "create" || c.event.Message != "fresh" {
		t.Errorf("event after the window = %+v, want a plain create", c)
	}
}

func TestSpamFilterLimitsEventsPerObjectAndType(t *testing.T) {
	h := newHarness(t, nil)
	send := func(n int, typ string) {
		for i := range n {
			// Distinct reasons, so neither aggregation nor de-duplication applies.
			h.rec.Event(nodeRef, typ, fmt.Sprintf("Reason%d", i), "m")
			h.drain()
		}
	}
	send(DefaultSpamBurst+5, v1.EventTypeWarning)
	if got := len(h.sink.getCalls()); got != DefaultSpamBurst {
		t.Fatalf("%d writes, want the burst of %d", got, DefaultSpamBurst)
	}
	// The other type has its own bucket.
	send(1, v1.EventTypeNormal)
	if got := len(h.sink.getCalls()); got != DefaultSpamBurst+1 {
		t.Fatalf("Normal event after Warning burst: %d writes, want %d", got, DefaultSpamBurst+1)
	}
	h.clock.Step(DefaultSpamRefill)
	send(3, v1.EventTypeWarning)
	if got := len(h.sink.getCalls()); got != DefaultSpamBurst+2 {
		t.Errorf("after one refill: %d writes, want %d", got, DefaultSpamBurst+2)
	}
}

func TestWriteRetries(t *testing.T) {
	transport := errors.New("connection refused")
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "events"}, "x", errors.New("no"))
	exists := apierrors.NewAlreadyExists(schema.GroupResource{Resource: "events"}, "x")
	for _, tc := range []struct {
		name      string
		errs      []error
		maxTries  int
		wantCalls int
		wantWaits []time.Duration
	}{
		{"transport error retried", []error{transport, transport}, 12, 3, []time.Duration{5 * time.Second, 10 * time.Second}},
		{"forbidden dropped", []error{forbidden}, 12, 1, nil},
		{"already exists dropped", []error{exists}, 12, 1, nil},
		{"retry limit", []error{transport, transport, transport, transport}, 3, 3, []time.Duration{5 * time.Second, 10 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.MaxTries = tc.maxTries })
			h.sink.errs = tc.errs
			h.rec.Event(nodeRef, v1.EventTypeNormal, "R", "m")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan struct{})
			go func() { h.rec.record(ctx, <-h.rec.queue, h.rec.cfg.MaxTries); close(done) }()
			for _, w := range tc.wantWaits {
				waitFor(t, h.clock.HasWaiters)
				h.clock.Step(w - time.Nanosecond)
				if h.clock.HasWaiters() == false {
					t.Fatalf("retried before %s", w)
				}
				h.clock.Step(time.Nanosecond)
			}
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("record did not return")
			}
			if got := len(h.sink.getCalls()); got != tc.wantCalls {
				t.Errorf("%d calls, want %d", got, tc.wantCalls)
			}
		})
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestDroppedEvents(t *testing.T) {
	for _, tc := range []struct {
		name   string
		record func(r *Recorder)
	}{
		{"unsupported type", func(r *Recorder) { r.Event(nodeRef, "Critical", "R", "m") }},
		{"not a reference", func(r *Recorder) { r.Event(&v1.Node{}, v1.EventTypeNormal, "R", "m") }},
		{"nil reference", func(r *Recorder) { r.Event((*v1.ObjectReference)(nil), v1.EventTypeNormal, "R", "m") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			tc.record(h.rec)
			h.drain()
			if calls := h.sink.getCalls(); len(calls) != 0 {
				t.Errorf("calls = %+v, want none", calls)
			}
		})
	}
}

func TestQueueFullDropsWithoutBlocking(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.QueueLength = 2 })
	for i := range 5 {
		h.rec.Event(nodeRef, v1.EventTypeNormal, fmt.Sprintf("R%d", i), "m")
	}
	h.drain()
	if got := len(h.sink.getCalls()); got != 2 {
		t.Errorf("%d writes, want the 2 that fit the queue", got)
	}
}

func TestRunWritesAndFlushesOnStop(t *testing.T) {
	h := newHarness(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.rec.Run(ctx); close(done) }()
	h.rec.Event(nodeRef, v1.EventTypeNormal, "First", "m")
	waitFor(t, func() bool { return len(h.sink.getCalls()) == 1 })
	cancel()
	<-done
	// Queued after Run stopped: nobody writes it until a flush.
	h.rec.Event(nodeRef, v1.EventTypeNormal, "Second", "m")
	cancelled, stop := context.WithCancel(context.Background())
	stop()
	h.rec.Run(cancelled) // returns at once, after one attempt at the queued Event
	calls := h.sink.getCalls()
	if len(calls) != 2 || calls[1].event.Reason != "Second" {
		t.Errorf("calls = %+v, want First then the flushed Second", calls)
	}
}

func TestEventNameIsAlwaysValid(t *testing.T) {
	for _, object := range []string{"node-a", strings.Repeat("n", 250)} {
		name := eventName(object, t0)
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			t.Errorf("eventName(%d chars) = %q: %v", len(object), name, errs)
		}
		if len(object) < 200 && !strings.HasPrefix(name, object+".") {
			t.Errorf("eventName(%s) = %s, want it prefixed by the object", object, name)
		}
	}
}

func TestNewRequiresSinkAndComponent(t *testing.T) {
	if _, err := New(Config{Source: v1.EventSource{Component: "c"}}); err == nil {
		t.Error("New without Sink succeeded")
	}
	if _, err := New(Config{Sink: newFakeSink()}); err == nil {
		t.Error("New without Source.Component succeeded")
	}
}

// The typed client-go Events client is a Sink, and a repeat goes through as a real strategic
// merge patch.
func TestTypedClientIsASink(t *testing.T) {
	client := fake.NewClientset()
	r, err := New(Config{Sink: client.CoreV1().Events(metav1.NamespaceDefault), Source: v1.EventSource{Component: "nodevigil-agent", Host: "node-a"},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		r.Event(nodeRef, v1.EventTypeNormal, "StartupTaintsRemoved", "removed")
		r.record(context.Background(), <-r.queue, 1)
	}
	evs, err := client.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Items) != 1 || evs.Items[0].Count != 2 || evs.Items[0].Reason != "StartupTaintsRemoved" {
		t.Errorf("events = %+v, want one with count 2", evs.Items)
	}
}
