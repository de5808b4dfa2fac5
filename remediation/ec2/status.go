package ec2

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"golang.org/x/time/rate"
)

// MaxStatusIDs is the most instance IDs EC2 accepts in one DescribeInstanceStatus call.
const MaxStatusIDs = 100

// ScheduledEvent is one active scheduled event of an instance (a reboot, a retirement, a
// stop), as DescribeInstanceStatus lists it. The same event seen by the node's agent in its
// metadata carries the same ID, so the remediator merges the two views by ID: one event, one
// decision.
type ScheduledEvent struct {
	// InstanceID is the instance the event is for.
	InstanceID string
	// ID is the event ID (instance-event-…).
	ID string
	// Code is EC2's code: instance-reboot, system-reboot, system-maintenance,
	// instance-retirement, instance-stop.
	Code string
	// Description is EC2's text.
	Description string
	// NotBefore is the earliest start; NotAfter the latest end (zero when EC2 gives none);
	// NotBeforeDeadline the latest the event can be rescheduled to (zero when it cannot).
	NotBefore, NotAfter, NotBeforeDeadline time.Time
}

// IsFinished reports whether an event description is one EC2 keeps listing after the event
// is over: "[Completed] …" or "[Canceled] …" (for days after, in DescribeInstanceStatus).
func IsFinished(description string) bool {
	return strings.HasPrefix(description, "[Completed]") || strings.HasPrefix(description, "[Canceled]")
}

// ScheduledEvents returns the active scheduled events of ids, keyed by instance ID and
// earliest first. Every instance EC2 described is present, with an empty slice when it has no
// active event, so a caller can tell "EC2 says nothing is scheduled" (positive knowledge: a
// canceled event is really gone) from "EC2 does not know this instance" (absent). It sends one DescribeInstanceStatus call
// per MaxStatusIDs instances (never one per node), following NextToken, each after waiting on
// lim (nil means unlimited), and includes stopped instances. Finished events ([Completed],
// [Canceled]) are dropped. IDs EC2 does not know are skipped as Describe does; malformed IDs
// are never sent.
func (c *Client) ScheduledEvents(ctx context.Context, ids []string, lim *rate.Limiter) (map[string][]ScheduledEvent, error) {
	valid, _ := splitValid(unique(ids))
	out := map[string][]ScheduledEvent{}
	for start := 0; start < len(valid); start += MaxStatusIDs {
		end := min(start+MaxStatusIDs, len(valid))
		if err := c.statusChunk(ctx, valid[start:end], lim, out); err != nil {
			return nil, err
		}
	}
	for _, evs := range out {
		sort.Slice(evs, func(i, j int) bool { return evs[i].NotBefore.Before(evs[j].NotBefore) })
	}
	return out, nil
}

func (c *Client) statusChunk(ctx context.Context, ids []string, lim *rate.Limiter, out map[string][]ScheduledEvent) error {
	for len(ids) > 0 {
		err := c.statusOnce(ctx, ids, lim, out)
		if err == nil {
			return nil
		}
		code := apiCode(err)
		if code != codeNotFound && code != codeMalformed {
			if code == codeUnauthorized {
				return fmt.Errorf("ec2: describe instance status: %w: %w", ErrUnauthorized, err)
			}
			return fmt.Errorf("ec2: describe instance status: %w", err)
		}
		bad := namedIDs(ids, err)
		if len(bad) == 0 {
			if len(ids) == 1 {
				return nil
			}
			half := len(ids) / 2
			if err := c.statusChunk(ctx, ids[:half], lim, out); err != nil {
				return err
			}
			return c.statusChunk(ctx, ids[half:], lim, out)
		}
		ids = without(ids, bad)
	}
	return nil
}

// statusOnce runs one DescribeInstanceStatus operation, following NextToken.
func (c *Client) statusOnce(ctx context.Context, ids []string, lim *rate.Limiter, out map[string][]ScheduledEvent) error {
	in := &ec2.DescribeInstanceStatusInput{InstanceIds: ids, IncludeAllInstances: aws.Bool(true)}
	found := map[string][]ScheduledEvent{}
	for {
		if lim != nil {
			if err := lim.Wait(ctx); err != nil {
				return fmt.Errorf("ec2: describe instance status: rate limit: %w", err)
			}
		}
		start := time.Now()
		page, err := c.api.DescribeInstanceStatus(ctx, in)
		c.metrics.observe("DescribeInstanceStatus", start, err)
		if err != nil {
			return err
		}
		for _, st := range page.InstanceStatuses {
			id := aws.ToString(st.InstanceId)
			if _, ok := found[id]; !ok {
				found[id] = []ScheduledEvent{}
			}
			for _, e := range st.Events {
				desc := aws.ToString(e.Description)
				if IsFinished(desc) {
					continue
				}
				found[id] = append(found[id], ScheduledEvent{
					InstanceID: id, ID: aws.ToString(e.InstanceEventId), Code: string(e.Code), Description: desc,
					NotBefore: aws.ToTime(e.NotBefore), NotAfter: aws.ToTime(e.NotAfter), NotBeforeDeadline: aws.ToTime(e.NotBeforeDeadline),
				})
			}
		}
		if aws.ToString(page.NextToken) == "" {
			break
		}
		in.NextToken = page.NextToken
	}
	for id, evs := range found {
		out[id] = append(out[id], evs...)
	}
	return nil
}
