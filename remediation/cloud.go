package remediation

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Cloud is the part of EC2 the pipeline needs, one instance at a time. It is declared here, where
// it is consumed, so the controller is tested over a fake and does not depend on the AWS SDK;
// the binary adapts the real client (remediation/ec2) to it, batching concurrent terminations.
type Cloud interface {
	// Terminate requests the termination of one instance. It must be idempotent: the pipeline
	// calls it again when it resumes a termination another leader started. The error reports
	// a call that failed as a whole (network, throttling after retries); a refusal for this
	// instance is reported in the outcome's Result.
	Terminate(ctx context.Context, instanceID string) (TerminateOutcome, error)
	// Describe reports what EC2 says about one instance; found is false when EC2 does not know
	// it (which, right after a termination, is not proof that it is gone).
	Describe(ctx context.Context, instanceID string) (inst Instance, found bool, err error)
}

// TerminateResult classifies one termination request. The values are those of the ec2
// package, and label nodevigil_remediator_terminations_total.
type TerminateResult string

const (
	// ResultTerminating: EC2 accepted the request; the instance is shutting down.
	ResultTerminating TerminateResult = "Terminating"
	// ResultAlreadyTerminated: the instance was already shutting down or terminated.
	ResultAlreadyTerminated TerminateResult = "AlreadyTerminated"
	// ResultNotOwned: the instance lacks the cluster ownership tag; it is never terminated.
	ResultNotOwned TerminateResult = "NotOwned"
	// ResultNotFound: EC2 does not know the instance (possibly eventual consistency).
	ResultNotFound TerminateResult = "NotFound"
	// ResultUnauthorized: the IAM policy does not allow the call.
	ResultUnauthorized TerminateResult = "Unauthorized"
	// ResultFailed: any other failure; retried with backoff.
	ResultFailed TerminateResult = "Failed"
	// ResultDryRun is not an EC2 result: it counts terminations dry-run mode would have made.
	ResultDryRun TerminateResult = "DryRun"
)

// TerminateOutcome is what happened to one termination request.
type TerminateOutcome struct {
	Result                      TerminateResult
	PreviousState, CurrentState string
	// Err explains every result but Terminating and AlreadyTerminated.
	Err error
}

// Instance is what EC2 says about one instance.
type Instance struct {
	ID string
	// State is the EC2 state name: pending, running, shutting-down, terminated, stopping,
	// stopped.
	State string
	Zone  string
	// Owned reports whether the instance carries the cluster ownership tag.
	Owned bool
	// Lifecycle is EC2's instanceLifecycle: "spot" for a spot instance, empty for on-demand.
	// A spot interruption notice on an instance that is not spot is not believed.
	Lifecycle string
	// AutoScalingGroup is the instance's aws:autoscaling:groupName tag, empty when no Auto
	// Scaling group launched it. An ASG termination of such an instance is not believed.
	AutoScalingGroup string
}

// Kinds of failed cloud calls. They label nodevigil_remediator_cloud_errors_total and decide
// what the pipeline does next: Unauthorized cannot be fixed by retrying (the node is Blocked
// until its recheck); every other kind is retried with exponential backoff and jitter.
const (
	CloudErrorThrottled    = "Throttled"    // RequestLimitExceeded after the SDK's own retries
	CloudErrorServer       = "ServerError"  // a 5xx from EC2
	CloudErrorTimeout      = "Timeout"      // the call or its connection timed out
	CloudErrorUnauthorized = "Unauthorized" // UnauthorizedOperation: the IAM policy refuses
	CloudErrorOther        = "Other"        // anything else (network, unexpected responses)
)

var cloudErrorKinds = []string{CloudErrorThrottled, CloudErrorServer, CloudErrorTimeout, CloudErrorUnauthorized, CloudErrorOther}

// CloudError classifies a failed cloud call. A Cloud implementation returns it (wrapped or
// not) so that the pipeline, which knows nothing of the AWS SDK, can tell a refusal from a
// transient failure.
type CloudError struct {
	// Kind is one of the CloudError* constants.
	Kind string
	// Err is the underlying error.
	Err error
}

func (e *CloudError) Error() string { return e.Kind + ": " + e.Err.Error() }

func (e *CloudError) Unwrap() error { return e.Err }

// cloudErrorKind classifies err: the Kind of a CloudError in its chain, else Timeout for
// deadlines and network timeouts, else Other.
func cloudErrorKind(err error) string {
	var ce *CloudError
	if errors.As(err, &ce) && ce.Kind != "" {
		return ce.Kind
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return CloudErrorTimeout
	}
	return CloudErrorOther
}

// instanceGone reports whether an EC2 state proves the instance is going or gone.
func instanceGone(state string) bool {
	return state == "shutting-down" || state == "terminated"
}

// retryLater counts a transient cloud failure and returns when to try again: exponential
// backoff per node (DefaultCloudBackoffBase doubling up to DefaultCloudBackoffMax) with ±20%
// jitter, so that many nodes failing together (a throttling storm) do not retry in lockstep.
func (c *Controller) retryLater(node *corev1.Node, op string, err error) time.Duration {
	kind := c.countCloudError(op, err)
	c.mu.Lock()
	m := c.memoryLocked(node.Name)
	n := m.cloudFailures
	m.cloudFailures++
	c.mu.Unlock()
	delay := DefaultCloudBackoffMax
	if n < 16 {
		delay = min(DefaultCloudBackoffBase<<n, DefaultCloudBackoffMax)
	}
	delay = time.Duration(float64(delay) * (0.8 + 0.4*rand.Float64()))
	c.log.Warn("cloud call failed; retrying with backoff", "node", node.Name, "operation", op, "reason", kind, "err", err, "retry_in", delay.Round(time.Millisecond))
	return delay
}

// countCloudError counts a failed cloud call and returns its kind.
func (c *Controller) countCloudError(op string, err error) string {
	kind := cloudErrorKind(err)
	c.metrics.cloudErrors.WithLabelValues(op, kind).Inc()
	return kind
}

// cloudSucceeded resets the node's backoff and NotFound confirmation.
func (c *Controller) cloudSucceeded(name string) {
	c.mu.Lock()
	if m, ok := c.memory[name]; ok {
		m.cloudFailures = 0
		m.notFoundSince = time.Time{}
	}
	c.mu.Unlock()
}

// notFoundSince returns since when the node's instance has been seen NotFound, starting now.
func (c *Controller) notFoundSince(name string, now time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.memoryLocked(name)
	if m.notFoundSince.IsZero() {
		m.notFoundSince = now
	}
	return m.notFoundSince
}

func (c *Controller) clearNotFound(name string) {
	c.mu.Lock()
	if m, ok := c.memory[name]; ok {
		m.notFoundSince = time.Time{}
	}
	c.mu.Unlock()
}
