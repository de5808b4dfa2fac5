package decide

import (
	"fmt"
	"regexp"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// ConditionNoScheduledEvent is the agent's condition for the EC2 scheduled events of its
// instance (agent/conditions; repeated because the remediator does not import the agent). While
// events are pending it is False and its message lists each one as
// "<code> <event ID>: <description>; not before <RFC 3339>[, not after <RFC 3339>]".
const ConditionNoScheduledEvent = "NoScheduledEvent"

// ScheduledEvent is one EC2 scheduled event of a node's instance, as the agent's
// NoScheduledEvent condition reports it or DescribeInstanceStatus lists it.
type ScheduledEvent struct {
	// Code is EC2's code: instance-reboot, system-reboot, system-maintenance,
	// instance-retirement, instance-stop.
	Code string
	// ID is EC2's event ID (instance-event-…).
	ID string
	// NotBefore is the earliest start; NotAfter the latest end, zero when none is given.
	NotBefore, NotAfter time.Time
}

var scheduledPattern = regexp.MustCompile(`([a-z-]+) (instance-event-[0-9a-f]+): [^;]*; not before (\S+?)(?:, not after (\S+?))?(?:;|$)`)

// ParseScheduledEvents reads the events listed in a NoScheduledEvent condition's message;
// times that do not parse are left zero.
func ParseScheduledEvents(message string) []ScheduledEvent {
	var out []ScheduledEvent
	for _, m := range scheduledPattern.FindAllStringSubmatch(message, -1) {
		e := ScheduledEvent{Code: m[1], ID: m[2]}
		e.NotBefore, _ = time.Parse(time.RFC3339, m[3])
		if m[4] != "" {
			e.NotAfter, _ = time.Parse(time.RFC3339, m[4])
		}
		out = append(out, e)
	}
	return out
}

// rebootWindowSlack covers the lag between AWS starting a reboot and a Lease being judged
// stale, and clock differences between AWS's window and this remediator.
const rebootWindowSlack = 5 * time.Minute

// openRebootWindow bounds a reboot event EC2 gives no NotAfter for.
const openRebootWindow = 2 * time.Hour

// ExpectsReboot reports whether an EC2 scheduled event code takes the instance down briefly
// and brings it back (retirements and stops do not bring it back): a silence that begins in
// such an event's window is tolerated tolerations.scheduledReboot. kubectl-nodevigil explain
// uses it to say so.
func ExpectsReboot(code string) bool {
	switch code {
	case "instance-reboot", "system-reboot", "system-maintenance":
		return true
	}
	return false
}

// rebootWindow finds a scheduled reboot of the node's instance whose window holds since, the
// moment the node was judged silent: from the agent's NoScheduledEvent condition (as it was
// written before the reboot silenced the agent) and from Input.ScheduledEvents.
func rebootWindow(in Input, since time.Time) (ScheduledEvent, bool) {
	events := in.ScheduledEvents
	if c := condition(in.Node, ConditionNoScheduledEvent); c != nil && c.Status == corev1.ConditionFalse {
		events = append(ParseScheduledEvents(c.Message), events...)
	}
	for _, e := range events {
		if !ExpectsReboot(e.Code) || e.NotBefore.IsZero() {
			continue
		}
		end := e.NotAfter
		if end.IsZero() {
			end = e.NotBefore.Add(openRebootWindow)
		}
		if !since.Before(e.NotBefore.Add(-rebootWindowSlack)) && !since.After(end.Add(rebootWindowSlack)) {
			return e, true
		}
	}
	return ScheduledEvent{}, false
}

// tolerateReboot extends a silence verdict's toleration to the policy's
// tolerations.scheduledReboot (default 20m) when the silence began inside the window of one of
// the instance's scheduled reboots (instance-reboot, system-reboot, system-maintenance), and
// says so in its message. AWS reboots the instance then: its kubelet and agent stop for a few
// minutes and come back, and the silentNode toleration (3 minutes by default) would otherwise
// terminate a healthy instance in the middle of its maintenance. A node that does not come
// back is still remediated, this much later. in.Policy must be set.
func tolerateReboot(in Input, d Decision) Decision {
	e, ok := rebootWindow(in, d.Since)
	if !ok {
		return d
	}
	tol := in.Policy.Tolerations.ScheduledReboot
	if until := d.Since.Add(tol); until.After(d.EligibleAt) {
		d.EligibleAt = until
		d.Message += fmt.Sprintf("; silent inside the window of scheduled %s %s (not before %s): AWS is rebooting the instance, so tolerated %s from %s (scheduledReboot)",
			e.Code, e.ID, ts(e.NotBefore), tol, ts(d.Since))
	}
	return d
}
