package config

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// InterruptionAction is what a pool does about one kind of AWS-initiated event (a spot
// notice, a rebalance recommendation, a scheduled reboot or retirement, an ASG termination).
// AWS has already decided these; the pool decides only how its node is taken away.
type InterruptionAction string

const (
	// InterruptionDrain cordons, then evicts through the same bounded, PDB- and
	// do-not-disrupt-aware drain as remediation. For scheduled events it starts at NotBefore
	// minus leadTime and aims to finish by the deadline minus margin.
	InterruptionDrain InterruptionAction = "Drain"
	// InterruptionReplace (scheduledRetirement only) drains and terminates early, on the
	// pool's own caps, so the autoscaler replaces the node before AWS stops it.
	InterruptionReplace InterruptionAction = "Replace"
	// InterruptionCordonOnly cordons (and taints) the node and stops there.
	InterruptionCordonOnly InterruptionAction = "CordonOnly"
	// InterruptionNotify records the condition, an Event and a metric; nothing else.
	InterruptionNotify InterruptionAction = "Notify"
	// InterruptionIgnore does nothing beyond the agent's own condition.
	InterruptionIgnore InterruptionAction = "Ignore"
)

// DoNotDisruptPods says what an interruption drain does with pods annotated
// karpenter.sh/do-not-disrupt=true. An interruption is AWS's decision, not a judgement: the
// pods lose their node whatever nodevigil does, so the question is only whether they get a
// graceful eviction (last, once every other pod has left) or are left to the interruption.
type DoNotDisruptPods string

const (
	// DoNotDisruptEvictLast evicts them after every other pod of the node has gone — or, at the
	// latest, their termination grace period before the drain's deadline, so they still end
	// before AWS acts.
	DoNotDisruptEvictLast DoNotDisruptPods = "EvictLast"
	// DoNotDisruptKeep never evicts them: they run until AWS interrupts the instance, and an
	// Event at the deadline says so.
	DoNotDisruptKeep DoNotDisruptPods = "Keep"
	// DefaultDoNotDisruptPods: the pods are going anyway, and a graceful end beats a power-off.
	// This is independent of drain.honorDoNotDisrupt, which governs remediation's own drains
	// (a judgement, which such a pod may veto).
	DefaultDoNotDisruptPods = DoNotDisruptEvictLast
)

// Defaults of the interruptions block: the choices of a careful operator. A spot notice gives
// two minutes, so draining at once is the only useful answer; a rebalance recommendation is
// only a risk; a reboot keeps the node, so cordoning ahead of it is enough; a retirement or
// stop loses the instance, so its pods move before it.
const (
	DefaultSpotInterruption        = InterruptionDrain
	DefaultRebalanceRecommendation = InterruptionNotify
	DefaultScheduledReboot         = InterruptionCordonOnly
	DefaultScheduledRetirement     = InterruptionDrain
	DefaultASGTermination          = InterruptionDrain
	// DefaultInterruptionLeadTime is how long before a scheduled event's NotBefore its action
	// starts (not at sight: an instance-stop eleven days out must not drain a node today).
	DefaultInterruptionLeadTime = time.Hour
	// DefaultInterruptionMargin is how long before the deadline a scheduled drain must finish.
	DefaultInterruptionMargin = 10 * time.Minute
)

// DefaultMaxImmediate is how many of a pool's nodes (count, or percent rounded up, never less
// than one node) may be drained at once, outside maxInFlight, for spot notices and ASG
// terminations. AWS reclaiming more than half of one pool in one go is rare, while an agent
// release that reports a notice on every node looks exactly like that; past the bound the
// drains still happen, maxInFlight at a time.
var DefaultMaxImmediate = intstr.FromString("50%")

// InterruptionsSpec is a policy's `interruptions` block as written.
type InterruptionsSpec struct {
	// SpotInterruption: a spot interruption notice (two minutes). Default Drain.
	SpotInterruption InterruptionAction `json:"spotInterruption,omitempty"`
	// RebalanceRecommendation: EC2's early warning for a spot instance. Default Notify.
	RebalanceRecommendation InterruptionAction `json:"rebalanceRecommendation,omitempty"`
	// ScheduledReboot: instance-reboot, system-reboot, system-maintenance. Default CordonOnly.
	ScheduledReboot InterruptionAction `json:"scheduledReboot,omitempty"`
	// ScheduledRetirement: instance-retirement, instance-stop. Default Drain.
	ScheduledRetirement InterruptionAction `json:"scheduledRetirement,omitempty"`
	// ASGTermination: the ASG's target lifecycle state is Terminated. Default Drain.
	ASGTermination InterruptionAction `json:"asgTermination,omitempty"`
	// LeadTime: a scheduled event's action starts at NotBefore minus this. Default 1h.
	LeadTime *metav1.Duration `json:"leadTime,omitempty"`
	// Margin: a scheduled drain should be done this long before the deadline. Default 10m.
	Margin *metav1.Duration `json:"margin,omitempty"`
	// MaxImmediate: how many of the pool's nodes (count or percentage) may have spot notices
	// or ASG terminations acted on at once, outside maxInFlight; past it they take
	// maxInFlight slots, loudly. Default 50%.
	MaxImmediate *intstr.IntOrString `json:"maxImmediate,omitempty"`
	// DoNotDisruptPods: EvictLast or Keep, for pods annotated karpenter.sh/do-not-disrupt=true
	// on a node drained for an interruption. Default EvictLast.
	DoNotDisruptPods DoNotDisruptPods `json:"doNotDisruptPods,omitempty"`
}

// Interruptions is the resolved block: every kind has an action.
type Interruptions struct {
	SpotInterruption        InterruptionAction
	RebalanceRecommendation InterruptionAction
	ScheduledReboot         InterruptionAction
	ScheduledRetirement     InterruptionAction
	ASGTermination          InterruptionAction
	LeadTime                time.Duration
	Margin                  time.Duration
	MaxImmediate            intstr.IntOrString
	DoNotDisruptPods        DoNotDisruptPods
}

// ImmediateAllowed returns how many of a pool of total nodes may have spot notices or ASG
// terminations acted on at once, outside maxInFlight: MaxImmediate, rounded up, at least one.
func (in Interruptions) ImmediateAllowed(total int) int {
	return max(1, scaled(in.MaxImmediate, total))
}

// DefaultInterruptions returns the defaults of the block.
func DefaultInterruptions() Interruptions {
	return Interruptions{
		SpotInterruption: DefaultSpotInterruption, RebalanceRecommendation: DefaultRebalanceRecommendation,
		ScheduledReboot: DefaultScheduledReboot, ScheduledRetirement: DefaultScheduledRetirement,
		ASGTermination: DefaultASGTermination, LeadTime: DefaultInterruptionLeadTime, Margin: DefaultInterruptionMargin,
		MaxImmediate: DefaultMaxImmediate, DoNotDisruptPods: DefaultDoNotDisruptPods,
	}
}

func resolveInterruptions(path string, s *InterruptionsSpec, fail func(path, format string, args ...any)) Interruptions {
	out := DefaultInterruptions()
	if s == nil {
		return out
	}
	set := func(field string, v InterruptionAction, dst *InterruptionAction, replaceOK bool) {
		switch v {
		case "":
			return
		case InterruptionDrain, InterruptionCordonOnly, InterruptionNotify, InterruptionIgnore:
		case InterruptionReplace:
			if !replaceOK {
				fail(path+"."+field, "Replace applies to scheduledRetirement only (an instance AWS will stop); use Drain, CordonOnly, Notify or Ignore")
				return
			}
		default:
			choices := "Drain, CordonOnly, Notify or Ignore"
			if replaceOK {
				choices = "Drain, Replace, CordonOnly, Notify or Ignore"
			}
			fail(path+"."+field, "%q is not a choice; use %s", v, choices)
			return
		}
		*dst = v
	}
	set("spotInterruption", s.SpotInterruption, &out.SpotInterruption, false)
	set("rebalanceRecommendation", s.RebalanceRecommendation, &out.RebalanceRecommendation, false)
	set("scheduledReboot", s.ScheduledReboot, &out.ScheduledReboot, false)
	set("scheduledRetirement", s.ScheduledRetirement, &out.ScheduledRetirement, true)
	set("asgTermination", s.ASGTermination, &out.ASGTermination, false)
	if s.LeadTime != nil {
		out.LeadTime = nonNegative(path+".leadTime", s.LeadTime, fail)
	}
	if s.Margin != nil {
		out.Margin = nonNegative(path+".margin", s.Margin, fail)
	}
	if s.MaxImmediate != nil {
		checkCap(path+".maxImmediate", *s.MaxImmediate, "every spot notice would wait for a maxInFlight slot; write 1 for that", fail)
		out.MaxImmediate = *s.MaxImmediate
	}
	switch s.DoNotDisruptPods {
	case "":
	case DoNotDisruptEvictLast, DoNotDisruptKeep:
		out.DoNotDisruptPods = s.DoNotDisruptPods
	default:
		fail(path+".doNotDisruptPods", "%q is not a choice; use EvictLast (evict them after every other pod) or Keep (never evict them; AWS interrupts them)", s.DoNotDisruptPods)
	}
	return out
}
