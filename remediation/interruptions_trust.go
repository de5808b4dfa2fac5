package remediation

// This file decides how far an interruption is trusted before nodevigil acts on it, and how
// many nodes of a pool it may take at once.
//
// A spot notice or an ASG termination is acted on at once, outside maxInFlight and the storm
// pauses, because AWS has decided and two minutes wait for no slot. That makes the agent's
// word the only thing between a buggy agent release and a drained cluster, so before such an
// immediate drain:
//
//  1. The notice is cross-checked with EC2 (DescribeInstances, once per instance: the answer
//     never changes for an instance's life): a spot notice on an instance whose
//     instanceLifecycle is not "spot", or an ASG termination of an instance without the
//     aws:autoscaling:groupName tag, cannot be AWS's and is not acted on (a Warning Event
//     InterruptionNotCorroborated, a metric, the agent's condition stays). When EC2 cannot be
//     asked (throttled, unreachable, the instance not found yet) the drain falls back to a
//     maxInFlight slot: it still happens, one slot at a time.
//  2. A sanity valve per pool: when more of a pool's nodes report immediate interruptions at
//     once than its interruptions.maxImmediate allows (default 50%, at least one node), they
//     are all drained maxInFlight at a time instead, with a Warning Event InterruptionCapped
//     on each, the gauge nodevigil_remediator_interruption_valve_tripped{policy} and an error
//     log line.
//
// Scheduled events (and rebalance recommendations) always take a slot: a node nodevigil holds
// cordoned for an interruption counts against the pool's maxInFlight, together with the nodes
// remediation has in its pipeline — one count, which remediation's own maxInFlight check uses
// too (safety.go) — so a maintenance wave never empties a pool, and a dead node waits while
// the pool's slots are taken by interruption drains.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/decide"
	"github.com/nodevigil/nodevigil/remediation/ec2"
	"github.com/nodevigil/nodevigil/remediation/providerid"
)

// Event reasons of the trust checks and the slots.
const (
	EventInterruptionNotCorroborated = "InterruptionNotCorroborated"
	EventInterruptionCapped          = "InterruptionCapped"
	EventInterruptionWaiting         = "InterruptionWaitingForSlot"
)

// Results of a cross-check, labelling nodevigil_remediator_interruption_checks_total.
const (
	checkCorroborated = "corroborated"
	checkRefuted      = "refuted"
	checkUnavailable  = "unavailable"
)

// interruptionCensusMaxAge bounds how stale the per-pool interruption counts may be; like the
// remediation census, a pass over every cached Node, taken only while an interruption acts.
const interruptionCensusMaxAge = time.Second

// interruptionState is the interruption handling's own state, under its own lock so it never
// waits on the remediation census.
type interruptionState struct {
	mu sync.Mutex
	// ec2 is the last DescribeInstanceStatus view: instance ID → its active events. An
	// instance EC2 described without events has an empty entry; one never described is absent.
	ec2 map[string][]ec2.ScheduledEvent
	// withEvents counts the instances of ec2 that have at least one event, so that a census
	// of a fleet with none skips looking them up.
	withEvents int
	// facts caches what corroborates a notice, per instance (it never changes for an instance).
	facts map[string]Instance
	// census counts the pools; reserved holds slots taken until the cache shows the mark.
	census   *interruptionCensus
	reserved map[string]slotReservation
	// noted is the last loud note per node, so an Event is recorded once per change.
	noted map[string]string
	// tripped is the valve's state per pool, for logging transitions once.
	tripped map[string]bool

	checks  *prometheus.CounterVec
	capped  *prometheus.CounterVec
	valve   *prometheus.GaugeVec
	polls   *prometheus.CounterVec
	pending *prometheus.GaugeVec
}

// slotReservation counts a node about to be cordoned for an interruption until the cache shows
// its mark, so two workers cannot both squeeze under a bound in the instant before the
// informer catches up.
type slotReservation struct {
	pool      string
	immediate bool
	at        time.Time
}

type interruptionCensus struct {
	at     time.Time
	pools  map[string]*interruptionPool
	marked map[string]bool
}

// interruptionPool counts one pool for the valve: its nodes, those reporting an immediate
// interruption its policy acts on, and those nodevigil holds cordoned for one. (maxInFlight
// slots are counted by the remediation census, which both sides share: safety.go.)
type interruptionPool struct {
	policy                            *config.Policy
	total, immediate, immediateMarked int
}

func newInterruptionState(reg prometheus.Registerer) (*interruptionState, error) {
	s := &interruptionState{
		ec2: map[string][]ec2.ScheduledEvent{}, facts: map[string]Instance{}, reserved: map[string]slotReservation{},
		noted: map[string]string{}, tripped: map[string]bool{},
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nodevigil_remediator_interruption_checks_total",
			Help: "Cross-checks of spot notices and ASG terminations with EC2 before an immediate drain, by kind and result (corroborated, refuted: not acted on, unavailable: drained maxInFlight at a time); refuted and unavailable count once per node and event."}, []string{"kind", "result"}),
		capped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nodevigil_remediator_interruption_capped_total",
			Help: "Immediate interruptions (spot, ASG) drained maxInFlight at a time instead, once per node and event, by reason (valve: more than maxImmediate of the pool at once; unverified: EC2 could not be asked)."}, []string{"reason"}),
		valve: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nodevigil_remediator_interruption_valve_tripped",
			Help: "1 while a pool of the policy reports immediate interruptions on more nodes than interruptions.maxImmediate allows."}, []string{"policy"}),
		polls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nodevigil_remediator_scheduled_event_polls_total",
			Help: "DescribeInstanceStatus polls of the instances behind the nodes, by result (ok, error)."}, []string{"result"}),
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nodevigil_remediator_scheduled_events",
			Help: "Active scheduled events EC2 lists for the instances behind the nodes, as of the last poll, by kind."}, []string{"kind"}),
	}
	for _, c := range []prometheus.Collector{s.checks, s.capped, s.valve, s.polls, s.pending} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register interruption metrics: %w", err)
		}
	}
	return s, nil
}

// instanceIDOf returns the node's EC2 instance ID, or "".
func instanceIDOf(node *corev1.Node) string {
	_, id, err := providerid.Parse(node.Spec.ProviderID)
	if err != nil {
		return ""
	}
	return id
}

// eventsOf returns EC2's active events for the instance and whether EC2 described it.
func (s *interruptionState) eventsOf(id string) ([]ec2.ScheduledEvent, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	evs, ok := s.ec2[id]
	return evs, ok
}

// scheduledEvents returns the active scheduled events EC2 lists for node's instance, as
// decide reads them (a silence inside a scheduled reboot is tolerated longer). It costs one
// lock and no parsing while EC2 lists no event at all, as on almost every census pass.
func (s *interruptionState) scheduledEvents(node *corev1.Node) []decide.ScheduledEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.withEvents == 0 {
		return nil
	}
	var out []decide.ScheduledEvent
	for _, e := range s.ec2[instanceIDOf(node)] {
		if !ec2.IsFinished(e.Description) {
			out = append(out, decide.ScheduledEvent{Code: e.Code, ID: e.ID, NotBefore: e.NotBefore, NotAfter: e.NotAfter})
		}
	}
	return out
}

// note records a loud note for node; it reports whether it differs from the last one.
func (s *interruptionState) note(node, what string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.noted[node] == what {
		return false
	}
	s.noted[node] = what
	return true
}

func (s *interruptionState) forget(node string) {
	s.mu.Lock()
	delete(s.noted, node)
	delete(s.reserved, node)
	s.mu.Unlock()
}

// immediateVerdict is what the trust checks make of an immediate interruption.
type immediateVerdict int

const (
	verdictImmediate immediateVerdict = iota // corroborated, within the valve: act at once
	verdictCapped                            // act, but one maxInFlight slot at a time
	verdictRefuted                           // EC2 contradicts it: do not act
)

// admitImmediate cross-checks an immediate interruption (spot notice, ASG termination) with
// EC2 and applies the pool's sanity valve.
func (c *Controller) admitImmediate(ctx context.Context, node *corev1.Node, p *config.Policy, gov InterruptionPlan, now time.Time) immediateVerdict {
	kind := string(gov.Interruption.Kind)
	facts, err := c.instanceFacts(ctx, node)
	switch {
	case err != nil:
		if c.intr.note(node.Name, "unverified/"+gov.Interruption.ID) {
			c.intr.checks.WithLabelValues(kind, checkUnavailable).Inc()
			c.intr.capped.WithLabelValues("unverified").Inc()
			c.recorder.Eventf(node, corev1.EventTypeWarning, EventInterruptionCapped,
				"%s could not be checked with EC2 (%v); draining it maxInFlight (%d) at a time instead of at once", gov.Interruption.Code, err, p.MaxInFlight)
			c.log.Warn("interruption not verified; capped", "node", node.Name, "reason", gov.Interruption.Code, "err", err)
		}
		return verdictCapped
	case gov.Interruption.Kind == KindSpotInterruption && facts.Lifecycle != "spot",
		gov.Interruption.Kind == KindASGTermination && facts.AutoScalingGroup == "":
		if c.intr.note(node.Name, "refuted/"+gov.Interruption.ID) {
			c.intr.checks.WithLabelValues(kind, checkRefuted).Inc()
			why := fmt.Sprintf("EC2 says instance %s is not a spot instance (instanceLifecycle %q)", facts.ID, facts.Lifecycle)
			if gov.Interruption.Kind == KindASGTermination {
				why = fmt.Sprintf("EC2 says instance %s was not launched by an Auto Scaling group (no %s tag)", facts.ID, ec2.TagAutoScalingGroup)
			}
			c.recorder.Eventf(node, corev1.EventTypeWarning, EventInterruptionNotCorroborated,
				"the agent reports %s but %s: not acted on; suspect the agent (its condition stays as written)", gov.Interruption.Code, why)
			c.log.Error("interruption contradicted by EC2; not acted on", "node", node.Name, "instance_id", facts.ID, "reason", gov.Interruption.Code)
		}
		return verdictRefuted
	}
	c.intr.checks.WithLabelValues(kind, checkCorroborated).Inc()

	// The valve: more reports than the pool allows at once, or as many immediate drains
	// already running as it allows (reports that arrive over a few seconds cannot slip past
	// the bound before the counts catch up).
	key := c.poolKey(node, p)
	c.intr.mu.Lock()
	cs := c.interruptionCensusLocked(now)
	pc := cs.pools[key]
	if pc == nil {
		pc = &interruptionPool{policy: p, total: 1, immediate: 1}
	}
	allowed := p.Interruptions.ImmediateAllowed(pc.total)
	running := pc.immediateMarked
	for name, r := range c.intr.reserved {
		if r.pool == key && r.immediate && !cs.marked[name] && name != node.Name {
			running++
		}
	}
	over := pc.immediate > allowed || running >= allowed
	if !over {
		c.intr.reserved[node.Name] = slotReservation{pool: key, immediate: true, at: now}
	}
	c.intr.mu.Unlock()
	if !over {
		// An immediate drain does not wait for a slot, but it holds one while it runs: reserve
		// it in the shared count until the cache shows the mark.
		c.gateMu.Lock()
		c.reserveLocked(node.Name, key, now)
		c.gateMu.Unlock()
	}
	if over {
		if c.intr.note(node.Name, "valve/"+gov.Interruption.ID) {
			c.intr.capped.WithLabelValues("valve").Inc()
			c.recorder.Eventf(node, corev1.EventTypeWarning, EventInterruptionCapped,
				"%d of %d nodes of pool %s report spot notices or ASG terminations at once (%d being drained), more than interruptions.maxImmediate %s (%d nodes): draining the rest maxInFlight (%d) at a time; if AWS is not really reclaiming them, suspect the agent",
				pc.immediate, pc.total, key, running, p.Interruptions.MaxImmediate.String(), allowed, p.MaxInFlight)
		}
		return verdictCapped
	}
	return verdictImmediate
}

// instanceFacts returns what EC2 says about the node's instance, cached per instance.
func (c *Controller) instanceFacts(ctx context.Context, node *corev1.Node) (Instance, error) {
	id := instanceIDOf(node)
	if id == "" {
		return Instance{}, fmt.Errorf("node %s has no EC2 provider ID (%q)", node.Name, node.Spec.ProviderID)
	}
	c.intr.mu.Lock()
	f, ok := c.intr.facts[id]
	c.intr.mu.Unlock()
	if ok {
		return f, nil
	}
	if c.cloud == nil {
		return Instance{}, fmt.Errorf("no EC2 client")
	}
	inst, found, err := c.cloud.Describe(ctx, id)
	if err != nil {
		c.countCloudError("DescribeInstances", err)
		return Instance{}, fmt.Errorf("describe instance %s: %w", id, err)
	}
	if !found {
		return Instance{}, fmt.Errorf("EC2 does not know instance %s (yet)", id)
	}
	c.intr.mu.Lock()
	c.intr.facts[id] = inst
	c.intr.mu.Unlock()
	return inst, nil
}

// takeInterruptionSlot reserves one of the pool's maxInFlight slots for node; false when the
// pool has none free. It counts exactly as remediation's marking does (inFlightLocked, under
// gateMu): the nodes in the remediation pipeline, those nodevigil holds cordoned for an
// interruption, and those either side reserved since the census. The reservation is
// remediation's own, so a node about to be marked for remediation and one about to be
// cordoned for an event cannot both squeeze into the last slot.
func (c *Controller) takeInterruptionSlot(node *corev1.Node, p *config.Policy, now time.Time) (bool, int) {
	c.gateMu.Lock()
	defer c.gateMu.Unlock()
	cs := c.currentCensus(now)
	key := c.poolKey(node, p)
	inFlight := c.inFlightLocked(cs, key, node.Name)
	if inFlight >= p.MaxInFlight {
		return false, inFlight
	}
	c.reserveLocked(node.Name, key, now)
	return true, inFlight
}

// interruptionCensusLocked returns per-pool counts no older than interruptionCensusMaxAge.
// intr.mu must be held.
func (c *Controller) interruptionCensusLocked(now time.Time) *interruptionCensus {
	if cs := c.intr.census; cs != nil && now.Sub(cs.at) < interruptionCensusMaxAge && cs.at.Sub(now) < interruptionCensusMaxAge {
		return cs
	}
	cs := &interruptionCensus{at: now, pools: map[string]*interruptionPool{}, marked: map[string]bool{}}
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		c.log.Error("list nodes from cache", "err", err)
	}
	for _, n := range nodes {
		p := c.rc.PolicyFor(n.Labels)
		key := c.poolKey(n, p)
		pc := cs.pools[key]
		if pc == nil {
			pc = &interruptionPool{policy: p}
			cs.pools[key] = pc
		}
		pc.total++
		_, marked := n.Annotations[AnnotationInterruption]
		if marked {
			cs.marked[n.Name] = true
		}
		if marked && immediateMark(n.Annotations[AnnotationInterruption]) {
			pc.immediateMarked++
		}
		if reportsImmediate(n, p) && !c.refutedLocked(n) {
			pc.immediate++
		}
	}
	for name, r := range c.intr.reserved {
		if cs.marked[name] || now.Sub(r.at) > reservationTTL {
			delete(c.intr.reserved, name)
		}
	}
	byPolicy := map[string]bool{}
	for key, pc := range cs.pools {
		tripped := pc.immediate > pc.policy.Interruptions.ImmediateAllowed(pc.total)
		byPolicy[pc.policy.Name] = byPolicy[pc.policy.Name] || tripped
		if tripped != c.intr.tripped[key] {
			c.intr.tripped[key] = tripped
			if tripped {
				c.log.Error("interruption valve tripped: immediate drains capped to maxInFlight", "pool", key, "reason", EventInterruptionCapped,
					"reporting", pc.immediate, "nodes", pc.total, "max_immediate", pc.policy.Interruptions.MaxImmediate.String())
			} else {
				c.log.Info("interruption valve closed", "pool", key)
			}
		}
	}
	for name, tripped := range byPolicy {
		v := 0.0
		if tripped {
			v = 1
		}
		c.intr.valve.WithLabelValues(name).Set(v)
	}
	c.intr.census = cs
	return cs
}

// refutedLocked reports whether EC2 already contradicted n's immediate reports (its instance
// is neither spot nor in an ASG): those are not acted on, so they do not count towards the
// valve either. intr.mu must be held.
func (c *Controller) refutedLocked(n *corev1.Node) bool {
	f, ok := c.intr.facts[instanceIDOf(n)]
	return ok && f.Lifecycle != "spot" && f.AutoScalingGroup == ""
}

// reportsImmediate reports whether the agent reports a spot notice or an ASG termination on n
// that its policy acts on.
func reportsImmediate(n *corev1.Node, p *config.Policy) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Status != corev1.ConditionFalse {
			continue
		}
		switch {
		case cond.Type == ConditionNoSpotInterruption && acting(p.Interruptions.SpotInterruption),
			cond.Type == ConditionNoASGTermination && acting(p.Interruptions.ASGTermination):
			return true
		}
	}
	return false
}

// immediateMark reports whether a mark ("<event ID>/<action>") is for an immediate
// interruption.
func immediateMark(mark string) bool {
	id, _, _ := strings.Cut(mark, "/")
	return id == string(KindSpotInterruption) || id == string(KindASGTermination)
}

// acting reports whether an action touches the node.
func acting(a config.InterruptionAction) bool {
	return a == config.InterruptionCordonOnly || a == config.InterruptionDrain || a == config.InterruptionReplace
}
