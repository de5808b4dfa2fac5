package ec2

import (
	"context"
	"fmt"
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
	// GroupCommit sends without waiting, as a DescribeBatcher does: a call goes at once when
	// none is in flight, and the IDs asked for while one is in flight go together as soon as
	// it returns (Window and MaxBatch are not used; at most one call is in flight, so the
	// callers, e.g. the remediator's workers, bound a call's size). The remediator uses it: a
	// worker holds each node due for termination until EC2 has answered, and when 50 nodes
	// are due at once behind 16 workers every millisecond a worker waits for a window is
	// waited again by the nodes queued behind it (docs/benchmarks.md, session 9), while the
	// calls in flight gather the concurrent terminations into batches anyway.
	GroupCommit bool
}

// Batcher coalesces concurrent single-instance terminations into few TerminateInstances calls.
// The remediator decides node by node, often for many nodes at once (a dead zone, a bad
// rollout); one call per node would spend EC2's request budget and invite throttling. A batch
// is sent Window after its first ID or as soon as it is full, whichever is first.
type Batcher struct {
	coalescer[Outcome]
}

// NewBatcher returns a Batcher that sends its batches through t.
func NewBatcher(t Terminator, cfg BatcherConfig) (*Batcher, error) {
	if t == nil {
		return nil, fmt.Errorf("ec2: NewBatcher needs a Terminator, e.g. the *Client from New")
	}
	if cfg.GroupCommit {
		return &Batcher{newCoalescer(t.Terminate, 0, 0, nil)}, nil
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
	return &Batcher{newCoalescer(t.Terminate, cfg.Window, cfg.MaxBatch, cfg.Clock)}, nil
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
	a, err := b.do(ctx, id)
	if err != nil {
		return Outcome{}, err
	}
	if !a.ok {
		err := a.err
		if err == nil {
			err = fmt.Errorf("ec2: no outcome for instance %s", id)
		}
		return Outcome{Result: ResultFailed, Err: err}, err
	}
	return a.val, a.val.Err
}

// pendingIDs returns how many distinct IDs wait in the open batch; tests use it to know when
// every caller has queued before they move the fake clock.
func (b *Batcher) pendingIDs() int { return b.waiting() }
