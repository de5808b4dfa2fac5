package ec2

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// DefaultBatchWindow is how long a Batcher waits for more IDs after the first one of a batch.
// It is small next to the 1 s budget between a termination decision and the EC2 call, and
// long enough to gather the decisions a reconcile pass takes at once.
const DefaultBatchWindow = 50 * time.Millisecond

// Terminator terminates a set of instances with one outcome per ID; *Client is one. It is
// what a Batcher needs, declared here so the Batcher can be tested over a fake.
type Terminator interface {
	Terminate(ctx context.Context, ids []string) (map[string]Outcome, error)
}

// BatcherConfig configures a Batcher.
type BatcherConfig struct {
	// Window is how long to wait after the first ID of a batch before sending it. Default
	// DefaultBatchWindow.
	Window time.Duration
	// MaxBatch sends a batch as soon as it holds this many distinct IDs. Default and maximum
	// MaxBatch (1000, EC2's limit per TerminateInstances call).
	MaxBatch int
	// Clock times the window. Default: the real clock.
	Clock clock.WithDelayedExecution
}

// Batcher coalesces concurrent single-instance terminations into few TerminateInstances calls.
// The remediator decides node by node, often for many nodes at once (a dead zone, a bad
// rollout); one call per node would spend EC2's request budget and invite throttling. A batch
// is sent Window after its first ID or as soon as it is full, whichever is first.
type Batcher struct {
	t        Terminator
	window   time.Duration
	maxBatch int
	clock    clock.WithDelayedExecution

	mu      sync.Mutex
	order   []string             // distinct IDs of the open batch, in arrival order
	pending map[string][]*waiter // ID → callers waiting for it
	timer   clock.Timer
	gen     uint64 // identifies the open batch, so a late timer cannot flush the next one
}

type waiter struct {
	ctx     context.Context
	done    chan struct{}
	outcome Outcome
	err     error
}

// NewBatcher returns a Batcher that sends its batches through t.
func NewBatcher(t Terminator, cfg BatcherConfig) (*Batcher, error) {
	if t == nil {
		return nil, fmt.Errorf("ec2: NewBatcher needs a Terminator, e.g. the *Client from New")
	}
	if cfg.Window < 0 || cfg.MaxBatch < 0 || cfg.MaxBatch > MaxBatch {
		return nil, fmt.Errorf("ec2: BatcherConfig.Window (%v) must not be negative and MaxBatch (%d) must be within 0..%d", cfg.Window, cfg.MaxBatch, MaxBatch)
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultBatchWindow
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = MaxBatch
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &Batcher{t: t, window: cfg.Window, maxBatch: cfg.MaxBatch, clock: cfg.Clock, pending: map[string][]*waiter{}}, nil
}

// Terminate queues id for the next batch and waits for its outcome. The error is the
// outcome's Err (nil for ResultTerminating and ResultAlreadyTerminated), so errors.Is works
// with ErrUnauthorized, ErrNotOwned and ErrNotFound.
//
// Concurrent calls for the same ID share one request and one outcome. If ctx is done before
// the batch is sent, id is withdrawn and nothing is sent for it; once the batch is in flight
// the call returns ctx.Err() at once but the termination may still be carried out (the batch
// is abandoned only when every caller in it has given up).
func (b *Batcher) Terminate(ctx context.Context, id string) (Outcome, error) {
	if err := ctx.Err(); err != nil {
		return Outcome{}, err
	}
	w := &waiter{ctx: ctx, done: make(chan struct{})}

	b.mu.Lock()
	if _, ok := b.pending[id]; !ok {
		b.order = append(b.order, id)
	}
	b.pending[id] = append(b.pending[id], w)
	var full *batch
	if len(b.order) >= b.maxBatch {
		full = b.takeLocked()
	} else if b.timer == nil {
		gen := b.gen
		// The fake clock runs this callback while holding its own lock; hand the flush to a
		// goroutine so it never takes b.mu under the clock's lock.
		b.timer = b.clock.AfterFunc(b.window, func() { go b.flush(gen) })
	}
	b.mu.Unlock()
	if full != nil {
		go b.send(full)
	}

	select {
	case <-w.done:
		return w.outcome, w.err
	case <-ctx.Done():
		b.mu.Lock()
		b.withdrawLocked(id, w)
		b.mu.Unlock()
		return Outcome{}, ctx.Err()
	}
}

// batch is a closed batch on its way to EC2.
type batch struct {
	ids     []string
	waiters map[string][]*waiter
}

// takeLocked closes the open batch and opens a new, empty one.
func (b *Batcher) takeLocked() *batch {
	out := &batch{ids: b.order, waiters: b.pending}
	b.order = nil
	b.pending = map[string][]*waiter{}
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	b.gen++
	return out
}

// flush sends the open batch when its window has passed, unless it was sent already.
func (b *Batcher) flush(gen uint64) {
	b.mu.Lock()
	if gen != b.gen || len(b.order) == 0 {
		b.mu.Unlock()
		return
	}
	full := b.takeLocked()
	b.mu.Unlock()
	b.send(full)
}

// withdrawLocked removes a waiter that gave up before its batch was sent.
func (b *Batcher) withdrawLocked(id string, w *waiter) {
	ws := b.pending[id]
	for i, x := range ws {
		if x != w {
			continue
		}
		ws = append(ws[:i:i], ws[i+1:]...)
		if len(ws) > 0 {
			b.pending[id] = ws
			return
		}
		delete(b.pending, id)
		for j, o := range b.order {
			if o == id {
				b.order = append(b.order[:j:j], b.order[j+1:]...)
				break
			}
		}
		if len(b.order) == 0 && b.timer != nil {
			b.timer.Stop()
			b.timer = nil
			b.gen++
		}
		return
	}
}

// send calls the Terminator and hands each waiter its outcome. The call's context is cancelled
// only when every waiter of the batch has given up.
func (b *Batcher) send(bt *batch) {
	var ctxs []context.Context
	for _, ws := range bt.waiters {
		for _, w := range ws {
			ctxs = append(ctxs, w.ctx)
		}
	}
	ctx, release := whileAnyWaits(ctxs)
	outcomes, err := b.t.Terminate(ctx, bt.ids)
	release()
	for id, ws := range bt.waiters {
		o, ok := outcomes[id]
		if !ok {
			if err == nil {
				err = fmt.Errorf("ec2: no outcome for instance %s", id)
			}
			o = Outcome{Result: ResultFailed, Err: err}
		}
		for _, w := range ws {
			w.outcome, w.err = o, o.Err
			close(w.done)
		}
	}
}

// pendingIDs returns how many distinct IDs wait in the open batch; tests use it to know when
// every caller has queued before they move the fake clock.
func (b *Batcher) pendingIDs() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.order)
}

// whileAnyWaits returns the context of one call made for several waiters: it is cancelled once
// every waiter's context is done — one caller giving up must not cancel the call the others
// still wait for — or by release, which the caller calls when the call returned.
func whileAnyWaits(ctxs []context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var left atomic.Int64
	left.Add(int64(len(ctxs)))
	stops := make([]func() bool, 0, len(ctxs))
	for _, c := range ctxs {
		stops = append(stops, context.AfterFunc(c, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		}))
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}
