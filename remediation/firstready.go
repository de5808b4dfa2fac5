package remediation

// This file keeps the first-ready record (issue 10 item 3: the startup deadline applies only to
// nodes that never became ready) without a patch storm. A leader remembers, in memory, when it
// first saw each node ready, and decide treats that memory as the record. The annotation
// nodevigil.io/first-ready-at, which outlives the leader, is written
//
//   - at once, when a node this leader saw ready stops looking ready (its startup taint back,
//     Ready not True, the kubelet silent): the moment the record starts to matter, so a new
//     leader can never mistake that node for one that never became ready;
//   - otherwise in the background, paced by its own token bucket (DefaultFirstReadyRate), so a
//     new leader of 10,000 unrecorded nodes (a first install) does not send 10,000 PATCHes in
//     its first minutes, competing with remediation patches for the client's rate limit.
//
// What a change of leader can lose is a node the old leader saw ready, whose record was still
// queued, and that stopped looking ready before the new leader saw it ready itself: the new
// leader then judges it as never ready. Once the background writer has caught up (every node
// ready for longer than the queue takes to drain), nothing is lost.

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/nodevigil/nodevigil/remediation/decide"
)

// Pacing of the background first-ready writer.
const (
	// DefaultFirstReadyRate is how many first-ready annotations per second the background
	// writer sends: 10,000 unrecorded nodes take 83 minutes, 4 % of the default client rate.
	DefaultFirstReadyRate = 2.0
	// DefaultFirstReadyBurst lets a handful of nodes joining together be recorded at once.
	DefaultFirstReadyBurst = 10
	// firstReadyRetry is when a failed background write is tried again.
	firstReadyRetry = 10 * time.Second
)

// readyMemory is when this replica first saw each node ready.
type readyMemory struct {
	mu sync.RWMutex
	at map[string]time.Time
	// queued are the nodes remembered whose record the background writer has not finished
	// with; its size is the first_ready_queued gauge.
	queued map[string]struct{}
	gauge  prometheus.Gauge
}

// done notes that the background writer is finished with name.
func (m *readyMemory) done(name string) {
	m.mu.Lock()
	delete(m.queued, name)
	m.gauge.Set(float64(len(m.queued)))
	m.mu.Unlock()
}

func (m *readyMemory) seen(name string) time.Time {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.at[name]
}

// remember records name as seen ready at t unless it was already; it reports whether it was
// new.
func (m *readyMemory) remember(name string, t time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.at[name]; ok {
		return false
	}
	m.at[name] = t
	m.queued[name] = struct{}{}
	m.gauge.Set(float64(len(m.queued)))
	return true
}

func (m *readyMemory) forget(name string) {
	m.mu.Lock()
	delete(m.at, name)
	delete(m.queued, name)
	m.gauge.Set(float64(len(m.queued)))
	m.mu.Unlock()
}

// noteFirstReady handles the first-ready part of a decision: remember a node seen ready (and
// queue its record), or write the record at once when it starts to matter.
func (c *Controller) noteFirstReady(ctx context.Context, node *corev1.Node, d decide.Decision, now time.Time) error {
	if !c.leading.Load() {
		return nil
	}
	if d.RecordFirstReady && c.readyMem.remember(node.Name, now) {
		c.firstReadyQueue.Add(node.Name)
	}
	if d.PersistFirstReady {
		if at := c.readyMem.seen(node.Name); !at.IsZero() {
			return c.recordFirstReady(ctx, node, at)
		}
	}
	return nil
}

// runFirstReadyWriter writes queued first-ready records, paced, until ctx ends.
func (c *Controller) runFirstReadyWriter(ctx context.Context) {
	for {
		name, shutdown := c.firstReadyQueue.Get()
		if shutdown {
			return
		}
		c.writeQueuedFirstReady(ctx, name)
		c.firstReadyQueue.Done(name)
	}
}

// writeQueuedFirstReady waits for a token of the writer's bucket (on the controller's clock)
// and writes name's record if it is still missing.
func (c *Controller) writeQueuedFirstReady(ctx context.Context, name string) {
	r := c.firstReadyLimiter.ReserveN(c.clock.Now(), 1)
	if !c.waitFor(ctx, r) {
		r.CancelAt(c.clock.Now())
		return
	}
	node, err := c.nodes.Get(name)
	at := c.readyMem.seen(name)
	if err != nil || decide.FirstReady(node) || at.IsZero() || !c.leading.Load() {
		c.readyMem.done(name)
		return
	}
	if err := c.recordFirstReady(ctx, node, at); err != nil && ctx.Err() == nil {
		c.log.Warn("record first ready failed; retrying", "node", name, "err", err)
		c.firstReadyQueue.AddAfter(name, firstReadyRetry)
		return
	}
	c.readyMem.done(name)
}

// waitFor waits on the controller's clock until the reservation's token is due; false if ctx
// ended first. A timer is armed for a delay computed from a reading of the clock; if the clock
// moved between that reading and the arming, the timer would fire that much late (with a fake
// clock, never, if the test steps only once), so the delay is computed again when the clock
// moved more than armSlack meanwhile.
//
// Only a move beyond armSlack counts: a real clock always moves a little between two readings,
// and re-arming on any move (session 6) spun this loop — a timer and a channel per turn — until
// the token was due: at 2,000 nodes the first-ready writer took three quarters of the
// remediator's CPU while nodes were being terminated (docs/benchmarks.md, session 7).
func (c *Controller) waitFor(ctx context.Context, r *rate.Reservation) bool {
	for {
		now := c.clock.Now()
		d := r.DelayFrom(now)
		if d <= 0 {
			return true
		}
		t := c.clock.NewTimer(d)
		if c.clock.Since(now) > armSlack {
			t.Stop()
			continue
		}
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C():
		}
	}
}

// armSlack is how far the clock may move while waitFor arms its timer before the delay is
// computed again: the timer then fires at most this late.
const armSlack = 10 * time.Millisecond

// recordFirstReady writes the first-ready annotation, with the time this leader first saw the
// node ready. It is bookkeeping, not remediation (dry-run records it too, so that going live
// later does not treat every node as never ready), and written once: a node that carries it is
// never patched again. The patch carries no resourceVersion: only this annotation changes.
func (c *Controller) recordFirstReady(ctx context.Context, node *corev1.Node, at time.Time) error {
	if decide.FirstReady(node) {
		return nil
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		decide.AnnotationFirstReady: at.UTC().Format(time.RFC3339),
	}}})
	if err != nil {
		return fmt.Errorf("encode first-ready patch: %w", err)
	}
	if _, err := c.client.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, body, metav1.PatchOptions{FieldManager: Component}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("record first ready on node %s: %w", node.Name, err)
	}
	c.log.Debug("node first ready recorded", "node", node.Name)
	return nil
}
