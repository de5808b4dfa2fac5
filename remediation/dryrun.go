package remediation

// This file is the act step of dry-run mode: decide and record "would terminate", change
// nothing else.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/decide"
	"github.com/nodevigil/nodevigil/remediation/providerid"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// dryRun decides as the real pipeline would and records "would terminate" once per decision:
// an Event, the terminations_total{result="DryRun"} counter, a log line and the
// nodevigil.io/dry-run-decision annotation. Nothing else changes.
//
// For a Terminate policy it also asks EC2 what the live pipeline asks before marking: the
// read-only DescribeInstances (when the binary was given a Cloud, i.e. --cluster-tag-key is
// set). So an instance that is not the cluster's, that EC2 does not know, or that the IAM
// policy does not let the remediator describe, is recorded "would be Blocked: <reason>" (an
// Event with the Block reason, blocked_total{reason}, the annotation "Blocked <reason> …")
// instead of "would terminate" — shipped manifests start in dry-run, and this is what an
// operator reads first. Dry-run never calls TerminateInstances, so an IAM policy that
// refuses the termination of some instances only shows once live. A transient Describe failure
// is retried with backoff and nothing is recorded meanwhile, as the live pipeline would.
func (c *Controller) dryRun(ctx context.Context, node *corev1.Node, p *config.Policy, d decide.Decision, now time.Time) (time.Duration, error) {
	if decide.PhaseOf(node) != decide.PhaseNone {
		c.log.Debug("dry-run: not advancing a remediation recorded on the node", "node", node.Name, "reason", d.Reason)
		return 0, nil
	}
	verb, event := "Terminate", EventWouldTerminate
	if p.Action == config.ActionCordonOnly {
		verb, event = "Cordon", EventWouldCordon
	}
	id := ""
	if p.Action == config.ActionTerminate {
		_, pid, err := providerid.Parse(node.Spec.ProviderID)
		if err != nil {
			c.blocked(node, BlockInvalidProviderID, fmt.Sprintf("dry-run: would not remediate: %v", err))
			return c.cfg.BlockedRequeue, nil
		}
		id = pid
	}
	c.gateMu.Lock()
	reason, msg := c.checkRails(node, p, stepDryRun, now)
	c.gateMu.Unlock()
	if reason != "" {
		c.blocked(node, reason, "dry-run: "+msg)
		return c.cfg.BlockedRequeue, nil
	}
	if id != "" && c.cloud != nil {
		if wait, held := c.dryRunBlockedHold(node, now); held {
			return wait, nil
		}
		reason, msg, requeue := c.dryRunVerify(ctx, node, id, now)
		switch {
		case reason != "":
			return c.dryRunBlocked(ctx, node, reason, msg, now)
		case requeue > 0:
			return requeue, nil
		}
	}
	c.unblocked(node.Name)
	prefix := verb + " " + d.Reason + " "
	if strings.HasPrefix(node.Annotations[decide.AnnotationDryRunDecision], prefix) {
		return 0, nil
	}
	if _, err := c.patchNode(ctx, node, nodePatch{annotations: map[string]*string{decide.AnnotationDryRunDecision: ptr.To(prefix + ts(now))}}); err != nil {
		return 0, err
	}
	if verb == "Terminate" {
		c.metrics.terminations.WithLabelValues(string(ResultDryRun)).Inc()
	}
	c.recorder.Eventf(node, corev1.EventTypeWarning, event, "dry-run: would %s under policy %s: %s", strings.ToLower(verb), p.Name, d.Message)
	c.log.Warn("dry-run: would remediate", "node", node.Name, "reason", d.Reason, "policy", p.Name, "action", verb)
	return 0, nil
}

// dryRunVerify describes the instance as verify does before marking, and returns the Block
// reason and message live mode would record, or when to look again (a transient failure, or a
// NotFound not yet confirmed), or nothing when the instance may be terminated.
func (c *Controller) dryRunVerify(ctx context.Context, node *corev1.Node, id string, now time.Time) (string, string, time.Duration) {
	inst, found, err := c.cloud.Describe(ctx, id)
	switch {
	case err != nil && cloudErrorKind(err) == CloudErrorUnauthorized:
		c.countCloudError("Describe", err)
		return BlockUnauthorized, fmt.Sprintf("not allowed to describe instance %s (check the IAM policy: ec2:DescribeInstances): %v", id, err), 0
	case err != nil:
		return "", "", c.retryLater(node, "Describe", err)
	case !found:
		first := c.notFoundSince(node.Name, now)
		if wait := first.Add(c.cfg.TerminationConfirmDelay).Sub(now); wait > 0 {
			return "", "", wait
		}
		return BlockNotFound, fmt.Sprintf("instance %s does not exist in EC2 (not found since %s); nothing to terminate", id, ts(first)), 0
	case !inst.Owned:
		return BlockNotOwned, fmt.Sprintf("instance %s lacks the cluster ownership tag; it is never terminated", id), 0
	}
	c.cloudSucceeded(node.Name)
	return "", "", 0
}

// dryRunBlocked records "would be Blocked": an Event with the Block reason, blocked_total and
// the dry-run annotation (once per reason). It writes none of the Blocked annotations live
// mode writes, so going live later starts from a clean slate. Looked at again after
// BlockedRecheck, as live mode would.
func (c *Controller) dryRunBlocked(ctx context.Context, node *corev1.Node, reason, msg string, now time.Time) (time.Duration, error) {
	c.clearNotFound(node.Name)
	c.blocked(node, reason, "dry-run: would be Blocked: "+msg)
	prefix := "Blocked " + reason + " "
	if !strings.HasPrefix(node.Annotations[decide.AnnotationDryRunDecision], prefix) {
		if _, err := c.patchNode(ctx, node, nodePatch{annotations: map[string]*string{decide.AnnotationDryRunDecision: ptr.To(prefix + ts(now))}}); err != nil {
			return 0, err
		}
	}
	return c.cfg.BlockedRecheck, nil
}

// dryRunBlockedHold reports whether the node's dry-run record says "would be Blocked" younger
// than BlockedRecheck: like a Blocked node in live mode, it is not described again before.
func (c *Controller) dryRunBlockedHold(node *corev1.Node, now time.Time) (time.Duration, bool) {
	fields := strings.Fields(node.Annotations[decide.AnnotationDryRunDecision])
	if len(fields) != 3 || fields[0] != "Blocked" {
		return 0, false
	}
	at, ok := parseTS(fields[2])
	if !ok {
		return 0, false
	}
	wait := at.Add(c.cfg.BlockedRecheck).Sub(now)
	if wait <= 0 {
		return 0, false
	}
	c.blocked(node, fields[1], fmt.Sprintf("dry-run: would be Blocked since %s (%s); looked at again in %s", fields[2], fields[1], wait.Round(time.Second)))
	return wait, true
}

// DescribeOnly wraps cloud for dry-run: Describe passes through, Terminate is refused without
// reaching EC2. Dry-run never asks for a termination; this makes sure no bug can. A nil cloud
// stays nil.
func DescribeOnly(cloud Cloud) Cloud {
	if cloud == nil {
		return nil
	}
	return describeOnly{cloud}
}

type describeOnly struct{ Cloud }

func (describeOnly) Terminate(context.Context, string) (TerminateOutcome, error) {
	return TerminateOutcome{Result: ResultFailed, Err: errDryRunTerminate}, errDryRunTerminate
}

var errDryRunTerminate = errors.New("dry-run: TerminateInstances is never called")

// clearDryRun removes a stale dry-run record from a node that no longer needs remediation.
func (c *Controller) clearDryRun(ctx context.Context, node *corev1.Node) error {
	if _, ok := node.Annotations[decide.AnnotationDryRunDecision]; !ok {
		return nil
	}
	_, err := c.patchNode(ctx, node, nodePatch{annotations: map[string]*string{decide.AnnotationDryRunDecision: nil}})
	return err
}
