package remediation

// This file is the act step of dry-run mode: decide and record "would terminate", change
// nothing else.

import (
	"context"
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
func (c *Controller) dryRun(ctx context.Context, node *corev1.Node, p *config.Policy, d decide.Decision, now time.Time) (time.Duration, error) {
	if decide.PhaseOf(node) != decide.PhaseNone {
		c.log.Debug("dry-run: not advancing a remediation recorded on the node", "node", node.Name, "reason", d.Reason)
		return 0, nil
	}
	verb, event := "Terminate", EventWouldTerminate
	if p.Action == config.ActionCordonOnly {
		verb, event = "Cordon", EventWouldCordon
	}
	if p.Action == config.ActionTerminate {
		if _, _, err := providerid.Parse(node.Spec.ProviderID); err != nil {
			c.blocked(node, BlockInvalidProviderID, fmt.Sprintf("dry-run: would not remediate: %v", err))
			return c.cfg.BlockedRequeue, nil
		}
	}
	c.gateMu.Lock()
	reason, msg := c.checkRails(node, p, stepDryRun, now)
	c.gateMu.Unlock()
	if reason != "" {
		c.blocked(node, reason, "dry-run: "+msg)
		return c.cfg.BlockedRequeue, nil
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

// clearDryRun removes a stale dry-run record from a node that no longer needs remediation.
func (c *Controller) clearDryRun(ctx context.Context, node *corev1.Node) error {
	if _, ok := node.Annotations[decide.AnnotationDryRunDecision]; !ok {
		return nil
	}
	_, err := c.patchNode(ctx, node, nodePatch{annotations: map[string]*string{decide.AnnotationDryRunDecision: nil}})
	return err
}
