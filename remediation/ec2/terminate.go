package ec2

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
)

// Result is the outcome of a termination request for one instance.
type Result string

const (
	// ResultTerminating means EC2 accepted the termination of a running (or pending, stopping,
	// stopped) instance in this call.
	ResultTerminating Result = "Terminating"
	// ResultAlreadyTerminated means the instance was already shutting-down or terminated:
	// success, nothing left to do. Termination is idempotent, so a retry after a crash lands
	// here.
	ResultAlreadyTerminated Result = "AlreadyTerminated"
	// ResultNotOwned means the instance lacks the cluster's ownership tag; it was not touched.
	ResultNotOwned Result = "NotOwned"
	// ResultNotFound means EC2 did not know the instance. This is NOT proof of termination: EC2
	// is eventually consistent, and an instance terminated moments ago (or launched moments
	// ago) can be reported unknown for a while. The caller confirms later with Describe, which
	// may then show it shutting-down or terminated, or still not at all.
	ResultNotFound Result = "NotFound"
	// ResultUnauthorized means EC2 answered UnauthorizedOperation. Retrying cannot help; the
	// caller logs loudly and stops remediating that node until the IAM policy is fixed.
	ResultUnauthorized Result = "Unauthorized"
	// ResultFailed means the call failed for another reason (throttling beyond the retry
	// budget, a network error, a malformed ID); Outcome.Err says which. Retrying later is safe.
	ResultFailed Result = "Failed"
)

// maxUnauthorizedSplit is the largest batch that is split in halves when EC2 refuses it with
// UnauthorizedOperation, to find the instances the IAM policy refuses. Batches are small in
// practice (the termination rate limit's burst bounds them).
const maxUnauthorizedSplit = 16

// Succeeded reports whether r means the instance is on its way out.
func (r Result) Succeeded() bool {
	return r == ResultTerminating || r == ResultAlreadyTerminated
}

// Outcome is what happened to one instance in Terminate.
type Outcome struct {
	// Result classifies the outcome.
	Result Result
	// PreviousState and CurrentState are the EC2 states before and after the call, when known.
	PreviousState, CurrentState string
	// Err explains every Result but Terminating and AlreadyTerminated. It wraps ErrNotOwned,
	// ErrNotFound, ErrUnauthorized or ErrInvalidInstanceID where they apply.
	Err error
}

// Terminate terminates the instances among ids that belong to the cluster and returns an
// outcome for every distinct ID.
//
// It first describes the instances: unknown IDs get ResultNotFound, instances without the
// ownership tag ResultNotOwned, and instances already shutting-down or terminated
// ResultAlreadyTerminated — none of them is sent to TerminateInstances. The rest are terminated
// in batches of at most MaxBatch IDs. When EC2 rejects a batch because some IDs vanished
// between the describe and the terminate, those IDs get ResultNotFound and the batch is sent
// again without them.
//
// The error is non-nil when a call to EC2 failed (outcomes then say which IDs were affected);
// it wraps ErrUnauthorized on UnauthorizedOperation, and the SDK's smithy.APIError carrying the
// EC2 code (e.g. RequestLimitExceeded once the retryer gave up). Per-ID refusals (not owned,
// not found, malformed) are reported in the outcomes only.
func (c *Client) Terminate(ctx context.Context, ids []string) (map[string]Outcome, error) {
	ids = unique(ids)
	outcomes := make(map[string]Outcome, len(ids))
	valid, malformed := splitValid(ids)
	for _, id := range malformed {
		outcomes[id] = Outcome{Result: ResultFailed, Err: fmt.Errorf("%w: %q (want \"i-\" and 8 or 17 lower-case hex digits)", ErrInvalidInstanceID, id)}
	}
	if len(valid) == 0 {
		return outcomes, nil
	}

	described, err := c.Describe(ctx, valid)
	if err != nil {
		result := ResultFailed
		if errors.Is(err, ErrUnauthorized) {
			result = ResultUnauthorized
			c.log.Error("ec2 refused to describe instances, not terminating", "err", err)
		}
		for _, id := range valid {
			outcomes[id] = Outcome{Result: result, Err: err}
		}
		return outcomes, err
	}

	toTerminate := make([]string, 0, len(valid))
	for _, id := range valid {
		inst, ok := described[id]
		switch {
		case !ok:
			outcomes[id] = Outcome{Result: ResultNotFound, Err: fmt.Errorf("%w: %s (describe)", ErrNotFound, id)}
		case !inst.Owned:
			// Checked before the state: an instance that is not the cluster's is refused
			// whatever it is doing, so a wrong providerID shows up as such.
			outcomes[id] = Outcome{Result: ResultNotOwned, PreviousState: inst.State, CurrentState: inst.State,
				Err: fmt.Errorf("%w: %s has %s", ErrNotOwned, id, c.ownershipTag(inst))}
			c.log.Warn("refusing to terminate an instance the cluster does not own", "instance_id", id, "reason", c.ownershipTag(inst))
		case inst.State == "shutting-down" || inst.State == "terminated":
			outcomes[id] = Outcome{Result: ResultAlreadyTerminated, PreviousState: inst.State, CurrentState: inst.State}
		default:
			toTerminate = append(toTerminate, id)
		}
	}

	var errs []error
	for start := 0; start < len(toTerminate); start += MaxBatch {
		end := min(start+MaxBatch, len(toTerminate))
		if err := c.terminateBatch(ctx, toTerminate[start:end], outcomes); err != nil {
			errs = append(errs, err)
			if errors.Is(err, ErrUnauthorized) {
				// The next batch would fail the same way; say so for every ID not yet sent.
				for _, id := range toTerminate[end:] {
					outcomes[id] = Outcome{Result: ResultUnauthorized, Err: err}
				}
				break
			}
		}
	}
	return outcomes, errors.Join(errs...)
}

// ownershipTag describes the ownership tag of inst for messages.
func (c *Client) ownershipTag(inst Instance) string {
	v, ok := inst.Tags[c.tagKey]
	if !ok {
		return "no tag " + c.tagKey
	}
	return fmt.Sprintf("tag %s=%q, accepted values %s", c.tagKey, v, strings.Join(sortedKeys(c.tagValues), ","))
}

// terminateBatch sends one batch, dropping IDs EC2 reports unknown and sending the rest again.
func (c *Client) terminateBatch(ctx context.Context, ids []string, outcomes map[string]Outcome) error {
	for len(ids) > 0 {
		start := time.Now()
		out, err := c.api.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: ids})
		c.metrics.observe("TerminateInstances", start, err)
		if err == nil {
			c.recordChanges(ids, out, outcomes)
			return nil
		}
		switch code := apiCode(err); code {
		case codeUnauthorized:
			if len(ids) > 1 && len(ids) <= maxUnauthorizedSplit {
				// An IAM policy with a resource condition (a tag, say) refuses the whole call
				// for one instance it does not allow; isolate it so the others are not
				// refused with it. Large batches are not split: an account-wide refusal
				// would cost two calls per ID.
				half := len(ids) / 2
				return errors.Join(c.terminateBatch(ctx, ids[:half], outcomes), c.terminateBatch(ctx, ids[half:], outcomes))
			}
			err = fmt.Errorf("ec2: terminate instances: %w: %w", ErrUnauthorized, err)
			c.log.Error("ec2 refused to terminate instances", "err", err, "instance_id", strings.Join(ids, ","))
			for _, id := range ids {
				outcomes[id] = Outcome{Result: ResultUnauthorized, Err: err}
			}
			return err
		case codeNotFound, codeMalformed:
			bad := namedIDs(ids, err)
			if len(bad) == 0 {
				if len(ids) == 1 {
					bad = map[string]bool{ids[0]: true}
				} else {
					half := len(ids) / 2
					return errors.Join(c.terminateBatch(ctx, ids[:half], outcomes), c.terminateBatch(ctx, ids[half:], outcomes))
				}
			}
			for id := range bad {
				if code == codeNotFound {
					outcomes[id] = Outcome{Result: ResultNotFound, Err: fmt.Errorf("%w: %s (terminate): %w", ErrNotFound, id, err)}
				} else {
					outcomes[id] = Outcome{Result: ResultFailed, Err: fmt.Errorf("%w: %s: %w", ErrInvalidInstanceID, id, err)}
				}
			}
			c.log.Info("ec2 does not know instances it described, terminating the rest", "instance_id", strings.Join(sortedKeys(bad), ","), "reason", code)
			ids = without(ids, bad)
		default:
			err = fmt.Errorf("ec2: terminate instances: %w", err)
			for _, id := range ids {
				outcomes[id] = Outcome{Result: ResultFailed, Err: err}
			}
			return err
		}
	}
	return nil
}

func (c *Client) recordChanges(ids []string, out *ec2.TerminateInstancesOutput, outcomes map[string]Outcome) {
	seen := make(map[string]bool, len(ids))
	for _, ch := range out.TerminatingInstances {
		id := aws.ToString(ch.InstanceId)
		var prev, cur string
		if ch.PreviousState != nil {
			prev = string(ch.PreviousState.Name)
		}
		if ch.CurrentState != nil {
			cur = string(ch.CurrentState.Name)
		}
		result := ResultTerminating
		if prev == "shutting-down" || prev == "terminated" {
			result = ResultAlreadyTerminated
		}
		outcomes[id] = Outcome{Result: result, PreviousState: prev, CurrentState: cur}
		seen[id] = true
		c.log.Info("terminating instance", "instance_id", id, "reason", string(result))
	}
	for _, id := range ids {
		if !seen[id] {
			outcomes[id] = Outcome{Result: ResultFailed, Err: fmt.Errorf("ec2: instance %s is missing from the TerminateInstances response", id)}
		}
	}
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
