package remediation

// This file is the decide step on the controller's side: input gathers what
// remediation/decide (the pure judgement) needs from the caches, syncNode decides and hands the
// node to the act step (pipeline.go), and report turns changes of decision into Events,
// counters and log lines. nodeMemory is what is remembered between reconciles, only to report
// changes once; decisions never depend on it.

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/decide"
)

// nodeMemory is what the controller remembers about a node between reconciles, only to report
// changes once (Events, counters); decisions never depend on it.
type nodeMemory struct {
	action    decide.Action
	reason    string
	block     string
	detected  map[string]bool
	unhealthy bool
	// presumed: the FirstReadyPresumed Event was emitted for this node.
	presumed bool
	// cloudFailures counts consecutive transient cloud failures, for the backoff.
	cloudFailures int
	// notFoundSince is when the instance was first seen NotFound while verifying it.
	notFoundSince time.Time
}

// memoryLocked returns the node's memory, creating it. c.mu must be held.
func (c *Controller) memoryLocked(name string) *nodeMemory {
	m, ok := c.memory[name]
	if !ok {
		m = &nodeMemory{detected: map[string]bool{}}
		c.memory[name] = m
	}
	return m
}

// watched reports whether the node's last decision was anything but plain healthy.
func (c *Controller) watched(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, ok := c.memory[name]
	return !ok || m.reason != decide.ReasonHealthy
}

func (c *Controller) forget(name string) {
	c.mu.Lock()
	delete(c.memory, name)
	c.mu.Unlock()
	c.readyMem.forget(name)
	c.gateMu.Lock()
	delete(c.reservations, name)
	c.gateMu.Unlock()
	c.intr.forget(name)
}

// input gathers everything Decide needs about one node from the caches.
func (c *Controller) input(node *corev1.Node, p *config.Policy, now time.Time) decide.Input {
	in := decide.Input{
		Node:               node,
		Policy:             p,
		Now:                now,
		ObservingSince:     c.observedFrom(now),
		ObservePeriod:      c.observe,
		AgentLeaseDuration: c.rc.AgentLeaseDuration,
		NoAgents:           c.agentObs.size() == 0,
		SeenReadyAt:        c.readyMem.seen(node.Name),
		ScheduledEvents:    c.intr.scheduledEvents(node),
	}
	if l, err := c.kubeletLeases.Get(node.Name); err == nil {
		in.KubeletLease = l
		in.KubeletObserved = c.kubeletObs.lastChange(node.Name)
	}
	if l, err := c.agentLeases.Get(node.Name); err == nil {
		in.AgentLease = l
		in.AgentObserved = c.agentObs.lastChange(node.Name)
	}
	return in
}

// syncNode reconciles one node and returns when to look at it again.
func (c *Controller) syncNode(ctx context.Context, name string) (time.Duration, error) {
	node, err := c.nodes.Get(name)
	if apierrors.IsNotFound(err) {
		c.forget(name)
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("get node from cache: %w", err)
	}
	now := c.clock.Now()
	p := c.rc.PolicyFor(node.Labels)
	d := decide.Decide(c.input(node, p, now))
	c.report(node, p, d, now)
	if err := c.noteFirstReady(ctx, node, d, now); err != nil {
		return 0, err
	}

	switch d.Action {
	case decide.ActionRemediate:
		if c.rc.DryRun {
			return c.dryRun(ctx, node, p, d, now)
		}
		return c.remediate(ctx, node, p, d, now)
	case decide.ActionRelease:
		return c.release(ctx, node, d)
	}
	if !d.Unhealthy && d.Action == decide.ActionNone {
		if err := c.clearDryRun(ctx, node); err != nil {
			return 0, err
		}
	}
	if d.Action == decide.ActionNone && decide.PhaseOf(node) == decide.PhaseNone {
		// Healthy again, or an operator said do-not-remediate: the Blocked record is moot.
		if err := c.clearBlocked(ctx, node); err != nil {
			return 0, err
		}
		// AWS-initiated events (interruptions_act.go), for nodes remediation leaves alone.
		r, err := c.syncInterruptions(ctx, node, p, now)
		if err != nil {
			return 0, err
		}
		return interruptionRequeue(d.RequeueAfter, r), nil
	}
	return d.RequeueAfter, nil
}

// EventFirstReadyPresumed is the Event reason on a node that does not look ready, carries no
// first-ready record and that this leader has not watched since its creation, past its
// startup deadline: it is presumed to have been ready (an earlier leader may have seen it so,
// its record still queued) and judged by its heartbeats and conditions, not by the startup
// deadline. Emitted once per node and leader.
const EventFirstReadyPresumed = "FirstReadyPresumed"

// report turns a change of decision into an Event, a counter increment and a log line, and
// observes detection latency once per episode.
func (c *Controller) report(node *corev1.Node, p *config.Policy, d decide.Decision, now time.Time) {
	c.mu.Lock()
	m, ok := c.memory[node.Name]
	if !ok {
		m = &nodeMemory{detected: map[string]bool{}}
		c.memory[node.Name] = m
	}
	changed := m.action != d.Action || m.reason != d.Reason
	first := !ok
	wasUnhealthy := m.unhealthy
	m.action, m.reason, m.unhealthy = d.Action, d.Reason, d.Unhealthy
	presumed := d.PresumedReady && !m.presumed
	m.presumed = m.presumed || d.PresumedReady
	newDetection := false
	for _, r := range detectionReasons {
		if d.Reason == r && !m.detected[r] {
			m.detected[r], newDetection = true, true
		}
	}
	if d.Reason == decide.ReasonHealthy {
		clear(m.detected)
		m.block = ""
	}
	c.mu.Unlock()

	if presumed {
		c.recorder.Event(node, corev1.EventTypeNormal, EventFirstReadyPresumed, d.Message)
		c.log.Info("first ready presumed", "node", node.Name, "reason", d.Reason, "message", d.Message)
	}
	if newDetection && !d.Since.IsZero() && c.leading.Load() && d.Since.After(c.observingSinceTime()) {
		c.metrics.detection.WithLabelValues(d.Reason).Observe(now.Sub(d.Since).Seconds())
	}
	if !changed || (first && d.Reason == decide.ReasonHealthy) {
		return
	}
	c.metrics.decisions.WithLabelValues(d.Reason).Inc()
	log := c.log.With("node", node.Name, "reason", d.Reason, "policy", p.Name, "action", string(d.Action))
	switch {
	case d.Reason == decide.ReasonHealthy && wasUnhealthy:
		c.recorder.Event(node, corev1.EventTypeNormal, d.Reason, d.Message)
		log.Info("node healthy again")
	case eventful(d.Reason) && (d.Reason != decide.ReasonDoNotRemediate || d.Unhealthy || d.Silent):
		c.recorder.Event(node, corev1.EventTypeWarning, d.Reason, d.Message)
		log.Warn("decision changed", "message", d.Message)
	default:
		log.Debug("decision changed", "message", d.Message)
	}
}

// eventful reasons are worth an Event on the Node when a node enters them; the others are
// transient (startup, observation) or the steady state.
func eventful(reason string) bool {
	switch reason {
	case decide.ReasonKubeletUnhealthy, decide.ReasonNodeSilent, decide.ReasonConditionUnhealthy,
		decide.ReasonStartupDeadlineExceeded, decide.ReasonAgentSilent, decide.ReasonAgentNeverSeen,
		decide.ReasonRemediationDisabled, decide.ReasonDoNotRemediate:
		return true
	}
	return false
}

// blocked reports a step not taken, once per change of block reason for the node.
func (c *Controller) blocked(node *corev1.Node, reason, message string) {
	c.mu.Lock()
	m := c.memoryLocked(node.Name)
	changed := m.block != reason
	m.block = reason
	c.mu.Unlock()
	if !changed {
		return
	}
	c.metrics.blocked.WithLabelValues(reason).Inc()
	c.recorder.Event(node, corev1.EventTypeWarning, reason, message)
	c.log.Warn("remediation blocked", "node", node.Name, "reason", reason, "message", message)
}

// unblocked clears the node's block reason after a step succeeded.
func (c *Controller) unblocked(name string) {
	c.mu.Lock()
	if m, ok := c.memory[name]; ok {
		m.block = ""
	}
	c.mu.Unlock()
}
