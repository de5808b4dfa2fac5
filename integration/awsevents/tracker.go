package awsevents

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// Seen is when a Tracker first saw each step of one spot notice on a node, by the arrival of
// the Node update on its watch (the same moment for every step, one clock: this process's).
type Seen struct {
	// SpotFalse: the agent's NoSpotInterruption=False reached the API server.
	SpotFalse time.Time
	// Cordoned: the remediator's cordon and taint reached the API server.
	Cordoned time.Time
	// Released: after Cordoned, the node is schedulable again (the remediator undid it).
	Released time.Time
}

// Tracker watches a World's Nodes and notes, per node since its last Reset, when the spot
// condition went False, when the node was cordoned for an interruption and when it was
// released. Watching, not polling, so the times are those of the API server's updates, not of
// a poll period.
type Tracker struct {
	mu   sync.Mutex
	seen map[string]*Seen
	cond *sync.Cond
}

// Track watches the World's Nodes until ctx ends.
func (w *World) Track(ctx context.Context) *Tracker {
	t := &Tracker{seen: map[string]*Seen{}}
	t.cond = sync.NewCond(&t.mu)
	go func() {
		for ctx.Err() == nil {
			wi, err := w.cl.Client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{LabelSelector: WorldLabel + "=" + w.NS})
			if err != nil {
				select {
				case <-ctx.Done():
				case <-time.After(200 * time.Millisecond):
				}
				continue
			}
			for ev := range wi.ResultChan() {
				if ev.Type != watch.Added && ev.Type != watch.Modified {
					continue
				}
				if obj, ok := ev.Object.(*corev1.Node); ok {
					t.observe(obj, time.Now())
				}
			}
			wi.Stop()
		}
		t.mu.Lock()
		t.cond.Broadcast()
		t.mu.Unlock()
	}()
	context.AfterFunc(ctx, func() {
		t.mu.Lock()
		t.cond.Broadcast()
		t.mu.Unlock()
	})
	return t
}

func (t *Tracker) observe(obj *corev1.Node, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.seen[obj.Name]
	if s == nil {
		s = &Seen{}
		t.seen[obj.Name] = s
	}
	if c := Condition(obj, SpotCondition); c != nil && c.Status == corev1.ConditionFalse && s.SpotFalse.IsZero() {
		s.SpotFalse = now
	}
	cordoned := CordonedForInterruption(obj)
	if cordoned && s.Cordoned.IsZero() {
		s.Cordoned = now
	}
	if !cordoned && !s.Cordoned.IsZero() && s.Released.IsZero() {
		s.Released = now
	}
	t.cond.Broadcast()
}

// Reset forgets what was seen of node, before its next notice.
func (t *Tracker) Reset(node string) {
	t.mu.Lock()
	t.seen[node] = &Seen{}
	t.mu.Unlock()
}

// Get returns what was seen of node since its last Reset.
func (t *Tracker) Get(node string) Seen {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.seen[node]; s != nil {
		return *s
	}
	return Seen{}
}

// Wait blocks until done(seen of node) holds or ctx ends; it returns the last Seen and
// whether done held.
func (t *Tracker) Wait(ctx context.Context, node string, done func(Seen) bool) (Seen, bool) {
	stop := context.AfterFunc(ctx, func() {
		t.mu.Lock()
		t.cond.Broadcast()
		t.mu.Unlock()
	})
	defer stop()
	t.mu.Lock()
	defer t.mu.Unlock()
	for {
		var s Seen
		if p := t.seen[node]; p != nil {
			s = *p
		}
		if done(s) {
			return s, true
		}
		if ctx.Err() != nil {
			return s, false
		}
		t.cond.Wait()
	}
}
