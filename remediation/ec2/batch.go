package ec2

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// coalescer gathers concurrent single-ID requests into few multi-ID calls, each caller getting
// the answer for its own ID; V is what a call answers per ID (an Outcome for TerminateInstances,
// an Instance for DescribeInstances). Batcher and DescribeBatcher are two policies over it and
// differ only in when a batch is sent:
//
//   - window == 0 ("group commit"): a request goes at once when no call is in flight, and the IDs
//     asked for while one is in flight go together as soon as it returns. At most one call is in
//     flight.
//   - window > 0: a batch is sent window after its first ID or as soon as it holds maxBatch
//     distinct IDs, whichever is first. Batches may be in flight side by side.
//
// Concurrent requests for one ID share one slot in the call and one answer. A caller whose
// context ends before its ID is sent is withdrawn (an ID nobody waits for any more is not sent);
// once sent, the caller returns at once, and the call's context is cancelled only when every
// caller in it has given up.
type coalescer[V any] struct {
	call     func(ctx context.Context, ids []string) (map[string]V, error)
	window   time.Duration              // 0: group commit
	maxBatch int                        // window > 0 only
	clock    clock.WithDelayedExecution // window > 0 only

	mu       sync.Mutex
	order    []string                // distinct IDs waiting for the next call, in arrival order
	pending  map[string][]*waiter[V] // ID → callers waiting for it
	inFlight bool                    // group commit: a call is out
	timer    clock.Timer             // window: armed while a batch is open
	gen      uint64                  // identifies the open batch, so a late timer cannot flush the next one
}

// answer is what one call said about one ID: its value, whether the call answered for the ID
// at all, and the call's error.
type answer[V any] struct {
	val V
	ok  bool
	err error
}

// waiter is one caller; done is closed once ans is set.
type waiter[V any] struct {
	ctx  context.Context
	done chan struct{}
	ans  answer[V]
}

// batch is a closed set of IDs on its way to EC2.
type batch[V any] struct {
	ids     []string
	waiters map[string][]*waiter[V]
}

func newCoalescer[V any](call func(context.Context, []string) (map[string]V, error), window time.Duration, maxBatch int, clk clock.WithDelayedExecution) coalescer[V] {
	return coalescer[V]{call: call, window: window, maxBatch: maxBatch, clock: clk, pending: map[string][]*waiter[V]{}}
}

// do queues id and waits for the answer of the call it is sent in. It returns ctx.Err() as
// soon as ctx is done.
func (b *coalescer[V]) do(ctx context.Context, id string) (answer[V], error) {
	if err := ctx.Err(); err != nil {
		return answer[V]{}, err
	}
	w := &waiter[V]{ctx: ctx, done: make(chan struct{})}

	b.mu.Lock()
	if _, ok := b.pending[id]; !ok {
		b.order = append(b.order, id)
	}
	b.pending[id] = append(b.pending[id], w)
	var now *batch[V]
	switch {
	case b.window == 0:
		if !b.inFlight {
			b.inFlight = true
			now = b.takeLocked()
		}
	case len(b.order) >= b.maxBatch:
		now = b.takeLocked()
	case b.timer == nil:
		gen := b.gen
		// The fake clock runs this callback while holding its own lock; hand the flush to a
		// goroutine so it never takes b.mu under the clock's lock.
		b.timer = b.clock.AfterFunc(b.window, func() { go b.flush(gen) })
	}
	b.mu.Unlock()
	if now != nil {
		if b.window == 0 {
			go b.run(now)
		} else {
			go b.send(now)
		}
	}

	select {
	case <-w.done:
		return w.ans, nil
	case <-ctx.Done():
		b.mu.Lock()
		b.withdrawLocked(id, w)
		b.mu.Unlock()
		return answer[V]{}, ctx.Err()
	}
}

// takeLocked closes the waiting IDs into a batch and opens a new, empty one. b.mu must be held.
func (b *coalescer[V]) takeLocked() *batch[V] {
	out := &batch[V]{ids: b.order, waiters: b.pending}
	b.order = nil
	b.pending = map[string][]*waiter[V]{}
	b.stopTimerLocked()
	return out
}

// stopTimerLocked disarms the window of the open batch, if any. b.mu must be held.
func (b *coalescer[V]) stopTimerLocked() {
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	b.gen++
}

// flush sends the open batch when its window has passed, unless it was sent already.
func (b *coalescer[V]) flush(gen uint64) {
	b.mu.Lock()
	if gen != b.gen || len(b.order) == 0 {
		b.mu.Unlock()
		return
	}
	bt := b.takeLocked()
	b.mu.Unlock()
	b.send(bt)
}

// run (group commit) sends bt, then every batch that gathered meanwhile, until none is waiting.
func (b *coalescer[V]) run(bt *batch[V]) {
	for bt != nil {
		if len(bt.ids) > 0 {
			b.send(bt)
		}
		b.mu.Lock()
		if len(b.order) == 0 {
			b.inFlight = false
			bt = nil
		} else {
			bt = b.takeLocked()
		}
		b.mu.Unlock()
	}
}

// withdrawLocked removes a waiter that gave up before its ID was sent; an ID nobody waits for
// any more leaves the batch, and an emptied batch disarms its window. b.mu must be held.
func (b *coalescer[V]) withdrawLocked(id string, w *waiter[V]) {
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
			b.stopTimerLocked()
		}
		return
	}
}

// send makes the call for bt and hands each waiter its answer. The call's context is cancelled
// only when every waiter of the batch has given up.
func (b *coalescer[V]) send(bt *batch[V]) {
	var ctxs []context.Context
	for _, ws := range bt.waiters {
		for _, w := range ws {
			ctxs = append(ctxs, w.ctx)
		}
	}
	ctx, release := whileAnyWaits(ctxs)
	vals, err := b.call(ctx, bt.ids)
	release()
	for id, ws := range bt.waiters {
		v, ok := vals[id]
		for _, w := range ws {
			w.ans = answer[V]{val: v, ok: ok, err: err}
			close(w.done)
		}
	}
}

// waiting returns how many distinct IDs wait for the next call; tests use it to know when
// every caller has queued.
func (b *coalescer[V]) waiting() int {
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
