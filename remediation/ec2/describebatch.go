package ec2

import (
	"context"
	"errors"
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
	coalescer[Instance]
}

// NewDescribeBatcher returns a DescribeBatcher that sends its calls through d.
func NewDescribeBatcher(d Describer) (*DescribeBatcher, error) {
	if d == nil {
		return nil, errors.New("ec2: NewDescribeBatcher needs a Describer, e.g. the *Client from New")
	}
	return &DescribeBatcher{newCoalescer(d.Describe, 0, 0, nil)}, nil
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
	a, err := b.do(ctx, id)
	if err != nil {
		return Instance{}, false, err
	}
	return a.val, a.ok && a.err == nil, a.err
}

// waitingIDs returns how many distinct IDs wait for the next call; tests use it to know when
// every caller has queued.
func (b *DescribeBatcher) waitingIDs() int { return b.waiting() }
