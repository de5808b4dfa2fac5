package main

import (
	"sort"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/decide"
)

// States shown for a node with no remediation record: what the remediator's rules say now.
const (
	stateHealthy    = "Healthy"
	stateTolerating = "Tolerating" // unhealthy, toleration (or a gate) still running
	stateDue        = "Due"        // the rules call for remediation now
	stateHeld       = "Held"       // nodevigil.io/do-not-remediate
	stateBlocked    = "Blocked"
	stateWaiting    = "Waiting" // not unhealthy, but something is unknown (agent not seen yet, ...)
)

// builtinConditions are the kubelet's own; every other condition on a Node is an agent's (or
// another node problem detector's) and is shown as such.
var builtinConditions = map[corev1.NodeConditionType]bool{
	corev1.NodeReady: true, corev1.NodeMemoryPressure: true, corev1.NodeDiskPressure: true,
	corev1.NodePIDPressure: true, corev1.NodeNetworkUnavailable: true,
}

// leaseView is one heartbeat as this command sees it.
type leaseView struct {
	Holder    string    `json:"holder,omitempty"`
	RenewTime time.Time `json:"renewTime"`
	// AgeSeconds is now − renewTime by this machine's clock; a node clock that is off shifts it.
	AgeSeconds float64 `json:"ageSeconds"`
	// DurationSeconds is the Lease's duration; stale after it plus a quarter.
	DurationSeconds float64 `json:"durationSeconds"`
	// Stale is judged from renewTime, the only time a snapshot has.
	Stale bool `json:"stale"`
}

// conditionView is one non-built-in condition.
type conditionView struct {
	Type    string    `json:"type"`
	Status  string    `json:"status"`
	Reason  string    `json:"reason,omitempty"`
	Message string    `json:"message,omitempty"`
	Since   time.Time `json:"since"`
}

// verdictView is what remediation/decide says about the node now, estimated from renewTimes.
type verdictView struct {
	Action     string    `json:"action"`
	Reason     string    `json:"reason"`
	Message    string    `json:"message"`
	EligibleAt time.Time `json:"eligibleAt,omitzero"`
	Unhealthy  bool      `json:"unhealthy"`
	Silent     bool      `json:"silent"`
}

// recordView is the remediation record the remediator wrote on the node.
type recordView struct {
	Phase            string    `json:"phase,omitempty"`
	Reason           string    `json:"reason,omitempty"`
	Policy           string    `json:"policy,omitempty"`
	StartedAt        time.Time `json:"startedAt,omitzero"`
	DrainStartedAt   time.Time `json:"drainStartedAt,omitzero"`
	TerminationAt    time.Time `json:"terminationRequestedAt,omitzero"`
	Blocked          string    `json:"blocked,omitempty"`
	BlockedAt        time.Time `json:"blockedAt,omitzero"`
	DryRunDecision   string    `json:"dryRunDecision,omitempty"`
	FirstReadyAt     time.Time `json:"firstReadyAt,omitzero"`
	DoNotRemediate   string    `json:"doNotRemediate,omitempty"`
	WasUnschedulable bool      `json:"wasUnschedulable,omitempty"`
	// Interruption is "<event ID>/<action>" while nodevigil holds the node cordoned for an
	// AWS event.
	Interruption                 string `json:"interruption,omitempty"`
	InterruptionWasUnschedulable bool   `json:"interruptionWasUnschedulable,omitempty"`
}

// nodeView is one row of status and the facts of explain; -o json prints it.
type nodeView struct {
	Name          string          `json:"name"`
	Pool          string          `json:"pool"`
	Policy        string          `json:"policy"`
	Zone          string          `json:"zone,omitempty"`
	Age           float64         `json:"ageSeconds"`
	AgentLease    *leaseView      `json:"agentLease"`
	KubeletLease  *leaseView      `json:"kubeletLease"`
	Ready         string          `json:"ready"`
	ReadySince    time.Time       `json:"readySince,omitzero"`
	Conditions    []conditionView `json:"conditions"`
	StartupTaints []string        `json:"startupTaints"`
	Unschedulable bool            `json:"unschedulable"`
	// State is the remediation phase when one is recorded, else Blocked, Held or the verdict's
	// reading (Healthy, Tolerating, Due, Waiting).
	State   string      `json:"state"`
	Reason  string      `json:"reason"`
	Record  recordView  `json:"record"`
	Verdict verdictView `json:"verdict"`

	decision decide.Decision
	policy   *config.Policy
	node     *corev1.Node
}

// views judges every node of the snapshot.
func (s *snapshot) views() []*nodeView {
	noAgents := len(s.agent) == 0
	out := make([]*nodeView, 0, len(s.nodes))
	for i := range s.nodes {
		out = append(out, s.view(&s.nodes[i], noAgents))
	}
	return out
}

// view judges one node with decide.Decide, feeding it the renewTimes as observation times: the
// remediator's observation times live only in its memory.
func (s *snapshot) view(n *corev1.Node, noAgents bool) *nodeView {
	p := s.cfg.PolicyFor(n.Labels)
	in := decide.Input{
		Node: n, Policy: p, Now: s.now, NoAgents: noAgents,
		AgentLeaseDuration: s.cfg.AgentLeaseDuration,
	}
	if l := s.kubelet[n.Name]; l != nil {
		in.KubeletLease, in.KubeletObserved = l, renewed(l, s.now)
	}
	if l := s.agent[n.Name]; l != nil {
		in.AgentLease, in.AgentObserved = l, renewed(l, s.now)
	}
	d := decide.Decide(in)
	v := &nodeView{
		Name:          n.Name,
		Pool:          s.cfg.PoolOf(p, n.Labels),
		Policy:        p.Name,
		Zone:          zoneOf(n),
		Age:           s.now.Sub(n.CreationTimestamp.Time).Seconds(),
		AgentLease:    s.lease(in.AgentLease, s.cfg.AgentLeaseDuration),
		KubeletLease:  s.lease(in.KubeletLease, decide.DefaultKubeletLeaseDuration),
		Ready:         "Unknown",
		Conditions:    []conditionView{},
		StartupTaints: []string{},
		Unschedulable: n.Spec.Unschedulable,
		decision:      d,
		policy:        p,
		node:          n,
		Verdict: verdictView{
			Action: string(d.Action), Reason: d.Reason, Message: d.Message,
			EligibleAt: d.EligibleAt, Unhealthy: d.Unhealthy, Silent: d.Silent,
		},
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			v.Ready, v.ReadySince = string(c.Status), c.LastTransitionTime.Time
			continue
		}
		if builtinConditions[c.Type] {
			continue
		}
		v.Conditions = append(v.Conditions, conditionView{
			Type: string(c.Type), Status: string(c.Status), Reason: c.Reason, Message: c.Message, Since: c.LastTransitionTime.Time,
		})
	}
	sort.Slice(v.Conditions, func(i, j int) bool { return v.Conditions[i].Type < v.Conditions[j].Type })
	for _, t := range n.Spec.Taints {
		for _, k := range p.StartupTaints {
			if t.Key == k {
				v.StartupTaints = append(v.StartupTaints, k)
			}
		}
	}
	a := n.Annotations
	v.Record = recordView{
		Phase:            string(decide.PhaseOf(n)),
		Reason:           a[decide.AnnotationReason],
		Policy:           a[decide.AnnotationPolicy],
		StartedAt:        parseTime(a[decide.AnnotationStartedAt]),
		DrainStartedAt:   parseTime(a[decide.AnnotationDrainStartedAt]),
		TerminationAt:    parseTime(a[decide.AnnotationTerminationRequestedAt]),
		Blocked:          a[decide.AnnotationBlocked],
		BlockedAt:        parseTime(a[decide.AnnotationBlockedAt]),
		DryRunDecision:   a[decide.AnnotationDryRunDecision],
		FirstReadyAt:     parseTime(a[decide.AnnotationFirstReady]),
		DoNotRemediate:   a[decide.AnnotationDoNotRemediate],
		WasUnschedulable: a[decide.AnnotationWasUnschedulable] != "",

		Interruption:                 a[annotationInterruption],
		InterruptionWasUnschedulable: a[annotationInterruptionWasUnschedulable] == "true",
	}
	v.State, v.Reason = state(v, d)
	return v
}

// state reads the node's state and its reason: a recorded phase wins, then a Blocked record,
// then a cordon for an AWS event, then an operator's hold, then the verdict.
func state(v *nodeView, d decide.Decision) (string, string) {
	r := v.Record
	switch {
	case r.Phase != "":
		return r.Phase, r.Reason
	case r.Blocked != "":
		return stateBlocked, r.Blocked
	case r.Interruption != "":
		id, action, _ := strings.Cut(r.Interruption, "/")
		return stateInterruption, action + " " + id
	case decide.DoNotRemediate(v.node):
		return stateHeld, d.Reason
	}
	switch {
	case d.Action == decide.ActionRemediate:
		return stateDue, d.Reason
	case d.Unhealthy || d.Silent:
		return stateTolerating, d.Reason
	case d.Reason == decide.ReasonHealthy:
		return stateHealthy, d.Reason
	}
	return stateWaiting, d.Reason
}

// renewed is a Lease's renewTime as an observation time, never in the future: a node clock
// ahead of ours must not make a Lease look fresher than now.
func renewed(l *coordinationv1.Lease, now time.Time) time.Time {
	if l.Spec.RenewTime == nil {
		if l.Spec.AcquireTime != nil {
			return minTime(l.Spec.AcquireTime.Time, now)
		}
		return time.Time{}
	}
	return minTime(l.Spec.RenewTime.Time, now)
}

func (s *snapshot) lease(l *coordinationv1.Lease, fallback time.Duration) *leaseView {
	if l == nil {
		return nil
	}
	dur := fallback
	if l.Spec.LeaseDurationSeconds != nil && *l.Spec.LeaseDurationSeconds > 0 {
		dur = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	lv := &leaseView{DurationSeconds: dur.Seconds()}
	if l.Spec.HolderIdentity != nil {
		lv.Holder = *l.Spec.HolderIdentity
	}
	if r := renewed(l, s.now); !r.IsZero() {
		lv.RenewTime = r
		lv.AgeSeconds = s.now.Sub(r).Seconds()
		lv.Stale = s.now.Sub(r) > decide.StaleAfter(dur)
	} else {
		lv.Stale = true
	}
	return lv
}

// poolView sums a pool's caps as the remediator counts them (remediation/safety.go census).
type poolView struct {
	Pool, Policy     string
	Action           config.Action
	Nodes, Unhealthy int
	MaxUnhealthy     int
	InFlight         int
	MaxInFlight      int
}

// storm is the zone and cluster pause thresholds applied to the snapshot's verdicts.
type storm struct {
	// Cluster is why remediation is paused cluster-wide, or "".
	Cluster string
	// Zones maps each paused zone to why.
	Zones map[string]string
}

// pools counts caps per pool, in name order.
func pools(views []*nodeView) []*poolView {
	byKey := map[string]*poolView{}
	for _, v := range views {
		pv := byKey[v.Pool]
		if pv == nil {
			pv = &poolView{Pool: v.Pool, Policy: v.Policy, Action: v.policy.Action, MaxInFlight: v.policy.MaxInFlight}
			byKey[v.Pool] = pv
		}
		pv.Nodes++
		// A Blocked node is not counted against maxUnhealthy (it will not be remediated).
		if v.decision.Unhealthy && !(v.Record.Phase == "" && v.Record.Blocked != "") {
			pv.Unhealthy++
		}
		if decide.Phase(v.Record.Phase).HoldsSlot(v.policy.Action) {
			pv.InFlight++
		}
	}
	out := make([]*poolView, 0, len(byKey))
	for _, pv := range byKey {
		out = append(out, pv)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pool < out[j].Pool })
	for _, pv := range out {
		for _, v := range views {
			if v.Pool == pv.Pool {
				pv.MaxUnhealthy = v.policy.AllowedUnhealthy(pv.Nodes)
				break
			}
		}
	}
	return out
}

// pauses applies the storm valves: more impaired (silent or unhealthy) nodes than the threshold
// allows, in a zone or the cluster.
func pauses(cfg *config.Config, views []*nodeView) storm {
	type count struct{ total, impaired int }
	var cluster count
	zones := map[string]*count{}
	for _, v := range views {
		impaired := v.decision.Silent || v.decision.Unhealthy
		cluster.total++
		if impaired {
			cluster.impaired++
		}
		if v.Zone == "" {
			continue
		}
		z := zones[v.Zone]
		if z == nil {
			z = &count{}
			zones[v.Zone] = z
		}
		z.total++
		if impaired {
			z.impaired++
		}
	}
	st := storm{Zones: map[string]string{}}
	over := func(th intstr.IntOrString, c count) (int, bool) {
		allowed := config.PauseAllowed(th, c.total)
		return allowed, c.impaired > allowed
	}
	if allowed, paused := over(cfg.ClusterPauseThreshold, cluster); paused {
		st.Cluster = pauseText(cluster.impaired, cluster.total, "the cluster", "clusterPauseThreshold", cfg.ClusterPauseThreshold.String(), allowed)
	}
	for name, z := range zones {
		if allowed, paused := over(cfg.ZonePauseThreshold, *z); paused {
			st.Zones[name] = pauseText(z.impaired, z.total, "zone "+name, "zonePauseThreshold", cfg.ZonePauseThreshold.String(), allowed)
		}
	}
	return st
}

func zoneOf(n *corev1.Node) string {
	if z := n.Labels[corev1.LabelTopologyZone]; z != "" {
		return z
	}
	return n.Labels[corev1.LabelFailureDomainBetaZone]
}

func parseTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}
	}
	return t
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
