package remediation

// This file reads AWS-initiated interruptions (spot notices, rebalance recommendations,
// scheduled events, ASG terminations) from the two places they show up — the agent's Node
// conditions and EC2's DescribeInstanceStatus — merges them by event ID, and plans what a
// pool's interruptions policy makes of each: which action, from when, until when, and whether
// it is held by the pool's maxInFlight and by storm pauses. Planning is pure; nothing here
// touches the cluster.

import (
	"regexp"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/decide"
	"github.com/nodevigil/nodevigil/remediation/ec2"
)

// InterruptionKind is the kind of an AWS-initiated event, as the interruptions policy names it.
type InterruptionKind string

// The kinds, named like the fields of the interruptions block.
const (
	KindSpotInterruption        InterruptionKind = "spotInterruption"
	KindRebalanceRecommendation InterruptionKind = "rebalanceRecommendation"
	KindScheduledReboot         InterruptionKind = "scheduledReboot"
	KindScheduledRetirement     InterruptionKind = "scheduledRetirement"
	KindASGTermination          InterruptionKind = "asgTermination"
)

// The agent's condition types for AWS events (agent/conditions; repeated here because the
// remediator does not import the agent).
const (
	ConditionNoSpotInterruption        corev1.NodeConditionType = "NoSpotInterruption"
	ConditionNoRebalanceRecommendation corev1.NodeConditionType = "NoRebalanceRecommendation"
	ConditionNoScheduledEvent          corev1.NodeConditionType = decide.ConditionNoScheduledEvent
	ConditionNoASGTermination          corev1.NodeConditionType = "NoASGTermination"
)

// Sources of an interruption.
const (
	SourceAgent = "agent"
	SourceEC2   = "ec2"
)

// Interruption is one pending AWS-initiated event of a node.
type Interruption struct {
	Kind InterruptionKind
	// ID identifies the event: EC2's event ID for scheduled events (the same in the metadata
	// and in DescribeInstanceStatus), else the kind.
	ID string
	// Code is EC2's code (instance-reboot, …) or the agent's condition reason.
	Code string
	// NotBefore is when AWS may act (the spot action time for a notice); zero when unknown.
	NotBefore time.Time
	// NotAfter is the latest end of a scheduled event; zero when none.
	NotAfter time.Time
	// Sources says who reported it: agent, ec2 or both.
	Sources []string
	// Message is the reporter's text.
	Message string
}

// KindForCode maps an EC2 scheduled event code onto its kind; ok is false for a code nodevigil
// does not know (it is then only reported).
func KindForCode(code string) (InterruptionKind, bool) {
	switch code {
	case "instance-reboot", "system-reboot", "system-maintenance":
		return KindScheduledReboot, true
	case "instance-retirement", "instance-stop":
		return KindScheduledRetirement, true
	}
	return "", false
}

var spotAtPattern = regexp.MustCompile(`at (\d{4}-\d\d-\d\dT\S+?Z)`)

// InterruptionsFromNode reads the pending interruptions the agent reported as False
// conditions. Unknown conditions (metadata service unreadable) report nothing: an agent that
// cannot see AWS events never causes an action.
func InterruptionsFromNode(node *corev1.Node) []Interruption {
	var out []Interruption
	for _, c := range node.Status.Conditions {
		if c.Status != corev1.ConditionFalse {
			continue
		}
		switch c.Type {
		case ConditionNoSpotInterruption:
			in := Interruption{Kind: KindSpotInterruption, ID: string(KindSpotInterruption), Code: c.Reason, Sources: []string{SourceAgent}, Message: c.Message}
			if m := spotAtPattern.FindStringSubmatch(c.Message); m != nil {
				in.NotBefore, _ = time.Parse(time.RFC3339, m[1])
			}
			if in.NotBefore.IsZero() {
				in.NotBefore = c.LastTransitionTime.Add(2 * time.Minute) // a notice gives two minutes
			}
			out = append(out, in)
		case ConditionNoRebalanceRecommendation:
			out = append(out, Interruption{Kind: KindRebalanceRecommendation, ID: string(KindRebalanceRecommendation), Code: c.Reason, Sources: []string{SourceAgent}, Message: c.Message})
		case ConditionNoASGTermination:
			out = append(out, Interruption{Kind: KindASGTermination, ID: string(KindASGTermination), Code: c.Reason, Sources: []string{SourceAgent}, Message: c.Message})
		case ConditionNoScheduledEvent:
			for _, e := range decide.ParseScheduledEvents(c.Message) {
				kind, ok := KindForCode(e.Code)
				if !ok {
					continue
				}
				out = append(out, Interruption{Kind: kind, ID: e.ID, Code: e.Code, NotBefore: e.NotBefore, NotAfter: e.NotAfter,
					Sources: []string{SourceAgent}, Message: c.Message})
			}
		}
	}
	return out
}

// MergeInterruptions merges what the agent reported with the active scheduled events EC2
// lists for the node's instance: one entry per event ID, so one event is one decision. EC2's
// times win (the agent's are parsed from a message); the sources of both are kept. The result
// is ordered by NotBefore, unknown times last.
func MergeInterruptions(fromNode []Interruption, fromEC2 []ec2.ScheduledEvent) []Interruption {
	byID := map[string]*Interruption{}
	var order []string
	add := func(in Interruption) {
		if cur, ok := byID[in.ID]; ok {
			for _, s := range in.Sources {
				if !contains(cur.Sources, s) {
					cur.Sources = append(cur.Sources, s)
				}
			}
			if contains(in.Sources, SourceEC2) {
				cur.NotBefore, cur.NotAfter, cur.Code = in.NotBefore, in.NotAfter, in.Code
			}
			return
		}
		c := in
		byID[in.ID] = &c
		order = append(order, in.ID)
	}
	for _, in := range fromNode {
		add(in)
	}
	for _, e := range fromEC2 {
		if ec2.IsFinished(e.Description) {
			continue
		}
		kind, ok := KindForCode(e.Code)
		if !ok {
			continue
		}
		add(Interruption{Kind: kind, ID: e.ID, Code: e.Code, NotBefore: e.NotBefore, NotAfter: e.NotAfter,
			Sources: []string{SourceEC2}, Message: e.Description})
	}
	out := make([]Interruption, 0, len(order))
	for _, id := range order {
		out = append(out, *byID[id])
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i].NotBefore, out[j].NotBefore
		if a.IsZero() != b.IsZero() {
			return !a.IsZero()
		}
		return a.Before(b)
	})
	return out
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// InterruptionPlan is what a policy makes of one interruption.
type InterruptionPlan struct {
	Interruption Interruption
	Action       config.InterruptionAction
	// StartAt is when the action may start: at sight for spot notices, rebalance
	// recommendations and ASG terminations; NotBefore minus the lead time for scheduled events
	// (never at sight: an instance-stop eleven days out must not drain a node today).
	StartAt time.Time
	// FinishBy is when a drain should be done: the spot action time, or a scheduled event's
	// NotBefore minus the margin. Zero when there is no deadline.
	FinishBy time.Time
	// HoldsSlot reports whether the action takes one of the pool's maxInFlight slots (scheduled
	// events, which come days ahead, one node at a time) or starts at once regardless (a spot
	// notice or an ASG termination: AWS has decided, and two minutes wait for no slot).
	HoldsSlot bool
	// Pausable reports whether storm pauses hold it. They hold remediation, which is a
	// judgement; AWS-mandated drains are not judgements, so only a rebalance recommendation
	// (a risk, not a decision) is held.
	Pausable bool
}

// Due reports whether the plan's action may start at now.
func (p InterruptionPlan) Due(now time.Time) bool { return !now.Before(p.StartAt) }

// PlanInterruption applies a pool's interruptions policy to one interruption.
func PlanInterruption(pol config.Interruptions, in Interruption, now time.Time) InterruptionPlan {
	p := InterruptionPlan{Interruption: in, StartAt: now}
	switch in.Kind {
	case KindSpotInterruption:
		p.Action, p.FinishBy = pol.SpotInterruption, in.NotBefore
	case KindRebalanceRecommendation:
		p.Action, p.HoldsSlot, p.Pausable = pol.RebalanceRecommendation, true, true
	case KindASGTermination:
		p.Action = pol.ASGTermination
	case KindScheduledReboot, KindScheduledRetirement:
		p.Action = pol.ScheduledReboot
		if in.Kind == KindScheduledRetirement {
			p.Action = pol.ScheduledRetirement
		}
		p.HoldsSlot = true
		if !in.NotBefore.IsZero() {
			p.StartAt = in.NotBefore.Add(-pol.LeadTime)
			p.FinishBy = in.NotBefore.Add(-pol.Margin)
		}
	default:
		p.Action = config.InterruptionNotify
	}
	return p
}

// actionRank orders actions by how much they do, for picking the governing plan.
var actionRank = map[config.InterruptionAction]int{
	config.InterruptionIgnore: 0, config.InterruptionNotify: 1, config.InterruptionCordonOnly: 2,
	config.InterruptionDrain: 3, config.InterruptionReplace: 4,
}

// GoverningPlan picks, among a node's plans, the one that decides what happens now: of the
// plans that are due, the one doing the most (a spot notice following a rebalance
// recommendation escalates from Notify to Drain), then the earliest deadline. ok is false
// when none is due.
func GoverningPlan(plans []InterruptionPlan, now time.Time) (InterruptionPlan, bool) {
	var best InterruptionPlan
	found := false
	for _, p := range plans {
		if !p.Due(now) {
			continue
		}
		if !found || actionRank[p.Action] > actionRank[best.Action] ||
			actionRank[p.Action] == actionRank[best.Action] && !p.FinishBy.IsZero() && (best.FinishBy.IsZero() || p.FinishBy.Before(best.FinishBy)) {
			best, found = p, true
		}
	}
	return best, found
}

// ReasonList is the plans' event codes, for Events and logs.
func ReasonList(plans []InterruptionPlan) string {
	codes := make([]string, len(plans))
	for i, p := range plans {
		codes[i] = p.Interruption.Code
	}
	return strings.Join(codes, ",")
}
