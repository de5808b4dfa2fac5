package remediation

// This file is the leader's DescribeInstanceStatus poll: the scheduled events of the instances
// behind the nodes, so a node without an agent (or whose agent cannot read the metadata
// service) still gets its interruption decisions. The events are merged with the agents'
// reports by event ID (MergeInterruptions): one event, one decision.
//
// Cost: one call per 100 instances (EC2's limit for DescribeInstanceStatus with IDs), paged,
// paced by the source's rate limiter: at 10,000 instances and the default 1m interval, 100
// calls a minute (about 1.7 a second, well inside EC2's non-mutating request budget). A failed
// poll keeps the previous view, is logged and counted
// (nodevigil_remediator_scheduled_event_polls_total{result="error"}) and is retried at the next
// tick; the SDK's own retryer backs off on throttling within a poll.

import (
	"context"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/nodevigil/nodevigil/remediation/ec2"
)

// DefaultScheduledEventsInterval is how often the leader polls DescribeInstanceStatus.
// Scheduled events come days ahead and act at NotBefore minus the lead time (1h by default),
// so a minute is early enough for them, and soon enough to undo a cordon after a cancel.
const DefaultScheduledEventsInterval = time.Minute

// ScheduledEventSource lists the active scheduled events of instances: every instance it
// described is present (with no events when none is active); instances it does not know are
// absent. The binary adapts ec2.Client.ScheduledEvents with a rate limiter.
type ScheduledEventSource interface {
	ScheduledEvents(ctx context.Context, ids []string) (map[string][]ec2.ScheduledEvent, error)
}

// runEventPoll polls until ctx ends, at once and then every ScheduledEventsInterval.
func (c *Controller) runEventPoll(ctx context.Context) {
	t := c.clock.NewTicker(c.cfg.ScheduledEventsInterval)
	defer t.Stop()
	for {
		c.pollScheduledEvents(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

// pollScheduledEvents takes one DescribeInstanceStatus view of the nodes' instances and
// requeues the nodes whose active events changed.
func (c *Controller) pollScheduledEvents(ctx context.Context) {
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		c.log.Error("list nodes from cache", "err", err)
		return
	}
	byInstance := make(map[string][]string, len(nodes))
	ids := make([]string, 0, len(nodes))
	for _, n := range nodes {
		if id := instanceIDOf(n); id != "" {
			if _, ok := byInstance[id]; !ok {
				ids = append(ids, id)
			}
			byInstance[id] = append(byInstance[id], n.Name)
		}
	}
	got, err := c.cfg.ScheduledEvents.ScheduledEvents(ctx, ids)
	if err != nil {
		if ctx.Err() == nil {
			c.intr.polls.WithLabelValues("error").Inc()
			c.countCloudError("DescribeInstanceStatus", err)
			c.log.Warn("scheduled events poll failed; keeping the previous view until the next poll", "err", err, "instances", len(ids))
		}
		return
	}
	c.intr.polls.WithLabelValues("ok").Inc()
	byKind := map[InterruptionKind]int{}
	c.intr.mu.Lock()
	var changed []string
	withEvents := 0
	for id, evs := range got {
		if len(evs) > 0 {
			withEvents++
		}
		for _, e := range evs {
			if k, ok := KindForCode(e.Code); ok {
				byKind[k]++
			}
		}
		if old, ok := c.intr.ec2[id]; !ok || !sameEvents(old, evs) {
			changed = append(changed, id)
		}
	}
	for id := range c.intr.ec2 {
		if _, ok := got[id]; !ok {
			changed = append(changed, id)
		}
	}
	c.intr.ec2, c.intr.withEvents = got, withEvents
	c.intr.mu.Unlock()
	for _, k := range []InterruptionKind{KindScheduledReboot, KindScheduledRetirement} {
		c.intr.pending.WithLabelValues(string(k)).Set(float64(byKind[k]))
	}
	for _, id := range changed {
		for _, name := range byInstance[id] {
			c.queue.Add(name)
		}
	}
	c.log.Debug("scheduled events polled", "instances", len(ids), "described", len(got), "changed", len(changed))
}

// sameEvents reports whether two views list the same events with the same times.
func sameEvents(a, b []ec2.ScheduledEvent) bool {
	return slices.EqualFunc(a, b, func(x, y ec2.ScheduledEvent) bool {
		return x.ID == y.ID && x.Code == y.Code && x.NotBefore.Equal(y.NotBefore) && x.NotAfter.Equal(y.NotAfter)
	})
}
