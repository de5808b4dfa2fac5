package ec2

import (
	"context"
	"errors"
	"sync"
)

// Describer describes a set of instances; *Client is one. It is what a DescribeBatcher needs,
// declared here so the DescribeBatcher can be tested over a fake.
type Describer interface {
	Describe(ctx context.Context, ids []string) (map[string]Instance, error)
}

// DescribeBatcher coalesces concurrent single-instance describes into few DescribeInstances
// calls. The remediator verifies each node's instance before it cordons it, one node at a time
// per worker; when a zone fails, every worker describes at the same moment, and one call per
// node spends EC2's request budget (DescribeInstances shares the non-mutating bucket with every
// other describe of the account) for answers one call can give.
//
// Unlike Batcher, it adds no wait: a call is sent at once when none is in flight, and the IDs
// asked for while one is in flight are sent together as soon as it returns ("group commit").
// A lone describe costs one round trip, as before; many at once cost about two.
type DescribeBatcher struct {
	d Describer

	mu       sync.Mutex
	order    []string              // distinct IDs waiting for the next call, in arrival order
	pending  map[string][]*dwaiter // ID → callers waiting for it
	inFlight bool
}

type dwaiter struct {
	ctx   context.Context
	done  chan struct{}
	inst  Instance
	found bool
	err   error
}

// NewDescribeBatcher returns a DescribeBatcher that sends its calls through d.
func NewDescribeBatcher(d Describer) (*DescribeBatcher, error) {
	if d == nil {
		return nil, errors.New("ec2: NewDescribeBatcher needs a Describer, e.g. the *Client from New")
	}
	return &DescribeBatcher{d: d, pending: map[string][]*dwaiter{}}, nil
}

// Describe reports what EC2 says about one instance: found is false when EC2 does not know it
// (not proof that it is gone, see Client.Describe). The error is that of the call the ID was
// sent in; it wraps ErrUnauthorized when the IAM policy refuses DescribeInstances (a refusal
// that holds for every instance: the action has no resource-level permissions).
//
// Concurrent calls for the same ID share one answer. If ctx is done before the ID is sent, it
// is withdrawn; once sent, the call returns ctx.Err() at once and the request is cancelled only
// when every caller in it has given up.
func (b *DescribeBatcher) Describe(ctx context.Context, id string) (Instance, bool, error) {
	if err := ctx.Err(); err != nil {
		return Instance{}, false, err
	}
	w := &dwaiter{ctx: ctx, done: make(chan struct{})}
	b.mu.Lock()
	if _, ok := b.pending[id]; !ok {
		b.order = append(b.order, id)
	}
	b.pending[id] = append(b.pending[id], w)
	var first *dbatch
	if !b.inFlight {
		b.inFlight = true
		first = b.takeLocked()
	}
	b.mu.Unlock()
	if first != nil {
		go b.run(first)
	}
	select {
	case <-w.done:
		return w.inst, w.found, w.err
	case <-ctx.Done():
		b.mu.Lock()
		b.withdrawLocked(id, w)
		b.mu.Unlock()
		return Instance{}, false, ctx.Err()
	}
}

// dbatch is a closed set of IDs on its way to EC2.
type dbatch struct {
	ids     []string
	waiters map[string][]*dwaiter
}

// takeLocked closes the waiting IDs into a batch. b.mu must be held.
func (b *DescribeBatcher) takeLocked() *dbatch {
	out := &dbatch{ids: b.order, waiters: b.pending}
	b.order = nil
	b.pending = map[string][]*dwaiter{}
	return out
}

// run sends bt, then every batch that gathered meanwhile, until none is waiting.
func (b *DescribeBatcher) run(bt *dbatch) {
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

// withdrawLocked removes a waiter that gave up before its ID was sent. b.mu must be held.
func (b *DescribeBatcher) withdrawLocked(id string, w *dwaiter) {
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
		return
	}
}

// send describes the IDs of bt and hands each waiter its answer. The call's context is
// cancelled only when every waiter of the batch has given up.
func (b *DescribeBatcher) send(bt *dbatch) {
	var ctxs []context.Context
	for _, ws := range bt.waiters {
		for _, w := range ws {
			ctxs = append(ctxs, w.ctx)
		}
	}
	ctx, release := whileAnyWaits(ctxs)
	found, err := b.d.Describe(ctx, bt.ids)
	release()
	for id, ws := range bt.waiters {
		inst, ok := found[id]
		for _, w := range ws {
			w.inst, w.found, w.err = inst, ok && err == nil, err
			close(w.done)
		}
	}
}

// waitingIDs returns how many distinct IDs wait for the next call; tests use it to know when
// every caller has queued.
func (b *DescribeBatcher) waitingIDs() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.order)
}
