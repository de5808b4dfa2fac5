package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/nodevigil/nodevigil/remediation/config"
	"github.com/nodevigil/nodevigil/remediation/decide"
)

// maxEvents is how many of a node's most recent Events explain tells.
const maxEvents = 12

// runExplain tells the story of one node.
func runExplain(ctx context.Context, c kubernetes.Interface, opts options, name string, stdout, stderr io.Writer) error {
	node, err := getNode(ctx, c, name)
	if err != nil {
		return err
	}
	// The whole fleet is read because caps and pauses depend on the other nodes.
	s, err := gather(ctx, c, opts, stderr, "")
	if err != nil {
		return err
	}
	evs, err := nodeEvents(ctx, c, name)
	if err != nil {
		fmt.Fprintf(stderr, "note: %s\n", oneLine(err))
	}
	views := s.views()
	for _, v := range views {
		if v.Name == name {
			explain(stdout, s, views, v, evs)
			return nil
		}
	}
	if !s.cfg.Scope.Matches(labels.Set(node.Labels)) {
		fmt.Fprintf(stdout, "Node %s is outside the remediator's nodeSelector (%s), from %s: nodevigil does not watch, judge or remediate it.\n", name, s.cfg.NodeSelector, s.cfgSource)
		return nil
	}
	return fmt.Errorf("get node %s: not found", name)
}

// explain writes the story: who the node is, what its heartbeats say, what the remediator
// recorded and did, what its rules say now, and what holds it back.
func explain(w io.Writer, s *snapshot, views []*nodeView, v *nodeView, evs []corev1.Event) {
	now := s.now
	p := v.policy
	fmt.Fprintf(w, "Node %s, created %s ago, is in pool %s under policy %s (action %s, liveness %s)", v.Name, short(time.Duration(v.Age*float64(time.Second))), v.Pool, p.Name, p.Action, p.Liveness)
	if v.Zone != "" {
		fmt.Fprintf(w, ", zone %s", v.Zone)
	}
	fmt.Fprintf(w, ".\nPolicies come from %s.\n", s.cfgSource)

	fmt.Fprintf(w, "\nHeartbeats\n")
	fmt.Fprintf(w, "  %s\n", leaseSentence("The nodevigil agent", v.AgentLease, now))
	fmt.Fprintf(w, "  %s\n", leaseSentence("The kubelet", v.KubeletLease, now))
	if v.ReadySince.IsZero() {
		fmt.Fprintf(w, "  Ready is %s.\n", v.Ready)
	} else {
		fmt.Fprintf(w, "  Ready has been %s since %s (%s).\n", v.Ready, stamp(v.ReadySince), relative(v.ReadySince, now))
	}
	if len(s.agent) == 0 {
		fmt.Fprintf(w, "  No agent Lease exists for any node in namespace %s: the remediator reports NoAgentLeases and remediates nothing under TwoSignal.\n", s.cfg.AgentNamespace)
	}

	fmt.Fprintf(w, "\nConditions and taints\n")
	if len(v.Conditions) == 0 {
		fmt.Fprintf(w, "  The node has no agent conditions.\n")
	}
	for _, c := range v.Conditions {
		tol, counted := p.Tolerations.Conditions[c.Type]
		fmt.Fprintf(w, "  %s is %s since %s (%s)", c.Type, c.Status, stamp(c.Since), relative(c.Since, now))
		if c.Reason != "" {
			fmt.Fprintf(w, ", reason %s", c.Reason)
		}
		if c.Message != "" {
			fmt.Fprintf(w, ": %s", strings.TrimSuffix(c.Message, "."))
		}
		_, _, aws := awsEventPolicy(c.Type, p.Interruptions)
		switch {
		case counted:
			fmt.Fprintf(w, ". Policy %s tolerates it False for %s.\n", p.Name, tol)
		case aws:
			fmt.Fprintf(w, ". %s.", awsEventSentence(p.Name, c.Type, p.Interruptions))
			if s := rebootSentence(p, c.Type, c.Status, c.Message); s != "" {
				fmt.Fprintf(w, " %s.", s)
			}
			fmt.Fprintln(w)
		default:
			fmt.Fprintf(w, ". Policy %s does not list it, so on its own it never leads to remediation.\n", p.Name)
		}
	}
	if len(v.StartupTaints) > 0 {
		fmt.Fprintf(w, "  Startup taints still present: %s.", strings.Join(v.StartupTaints, ", "))
		if v.Record.FirstReadyAt.IsZero() {
			fmt.Fprintf(w, " The node was never recorded ready, so the startup deadline of %s applies (until %s).\n",
				p.StartupDeadline, stamp(v.node.CreationTimestamp.Add(p.StartupDeadline)))
		} else {
			fmt.Fprintf(w, " The node was first ready at %s, so no startup deadline applies; ordinary tolerations do.\n", stamp(v.Record.FirstReadyAt))
		}
	} else {
		fmt.Fprintf(w, "  No startup taint of policy %s is present.\n", p.Name)
	}
	switch {
	case v.Unschedulable && v.Record.Interruption != "":
		fmt.Fprintf(w, "  %s\n", interruptionSentence(v.Record.Interruption, v.Record.InterruptionWasUnschedulable))
	case v.Unschedulable:
		who := "by nodevigil"
		if v.Record.Phase == "" || v.Record.WasUnschedulable {
			who = "by someone else (nodevigil will not uncordon it)"
		}
		fmt.Fprintf(w, "  The node is cordoned %s.\n", who)
	}

	fmt.Fprintf(w, "\nWhat the remediator recorded\n")
	r := v.Record
	switch {
	case r.Phase != "":
		fmt.Fprintf(w, "  Remediation is in phase %s for %s under policy %s, started %s (%s).\n", r.Phase, orUnknown(r.Reason), orUnknown(r.Policy), stamp(r.StartedAt), relative(r.StartedAt, now))
		if !r.DrainStartedAt.IsZero() {
			end := r.DrainStartedAt.Add(p.Drain.Timeout)
			fmt.Fprintf(w, "  The drain started %s; its timeout of %s ends %s, then onTimeout %s.\n", relative(r.DrainStartedAt, now), p.Drain.Timeout, relative(end, now), p.Drain.OnTimeout)
		}
		if !r.TerminationAt.IsZero() {
			fmt.Fprintf(w, "  Termination of the instance was requested %s: past the point of no return.\n", relative(r.TerminationAt, now))
		}
	case r.Blocked != "":
		fmt.Fprintf(w, "  Remediation is Blocked (%s) since %s (%s): retrying cannot fix this, so the node holds no slot. The remediator rechecks it periodically, and at once if its providerID changes.\n",
			r.Blocked, stamp(r.BlockedAt), relative(r.BlockedAt, now))
	default:
		fmt.Fprintf(w, "  No remediation is recorded on the node.\n")
	}
	if r.DryRunDecision != "" {
		fmt.Fprintf(w, "  Dry run: %s.\n", strings.TrimSuffix(r.DryRunDecision, "."))
	}
	if r.FirstReadyAt.IsZero() {
		fmt.Fprintf(w, "  The remediator has not recorded the node ready yet (%s).\n", decide.AnnotationFirstReady)
	} else {
		fmt.Fprintf(w, "  First seen ready at %s.\n", stamp(r.FirstReadyAt))
	}

	fmt.Fprintf(w, "\nWhat its rules say now (estimated from renewTime)\n")
	d := v.decision
	fmt.Fprintf(w, "  %s: %s.\n", d.Reason, strings.TrimSuffix(d.Message, "."))
	switch {
	case d.Action == decide.ActionRemediate && !d.EligibleAt.IsZero():
		fmt.Fprintf(w, "  The toleration ended %s: the node is due for %s.\n", relative(d.EligibleAt, now), p.Action)
	case !d.EligibleAt.IsZero():
		fmt.Fprintf(w, "  The toleration ends %s (%s) unless the node recovers.\n", stamp(d.EligibleAt), relative(d.EligibleAt, now))
	}
	for _, h := range holds(s, views, v) {
		fmt.Fprintf(w, "  Held back: %s.\n", h)
	}

	fmt.Fprintf(w, "\nRecent events\n")
	if len(evs) == 0 {
		fmt.Fprintf(w, "  none\n")
	}
	if len(evs) > maxEvents {
		evs = evs[len(evs)-maxEvents:]
	}
	for _, e := range evs {
		src := e.Source.Component
		if src == "" {
			src = e.ReportingController
		}
		fmt.Fprintf(w, "  %s  %s %s (%s): %s\n", relative(eventTime(e), now), e.Type, e.Reason, dash(src), strings.Join(strings.Fields(e.Message), " "))
	}
}

// holds lists what keeps the remediator from acting on v now: the operator's hold, the policy,
// a Blocked record, the pool's caps and the storm valves.
func holds(s *snapshot, views []*nodeView, v *nodeView) []string {
	var out []string
	p := v.policy
	if v.Record.DoNotRemediate != "" && v.Record.DoNotRemediate != "false" {
		out = append(out, fmt.Sprintf("an operator set %s=%q (kubectl nodevigil release %s clears it)", decide.AnnotationDoNotRemediate, v.Record.DoNotRemediate, v.Name))
	}
	if p.Action == config.ActionNone {
		out = append(out, fmt.Sprintf("policy %s has action None: decisions are only reported", p.Name))
	}
	if v.Record.Phase == "" && v.Record.Blocked != "" {
		out = append(out, "the node is Blocked ("+v.Record.Blocked+")")
	}
	if !v.decision.Unhealthy && !v.decision.Silent {
		return out
	}
	for _, pv := range pools(views) {
		if pv.Pool != v.Pool {
			continue
		}
		if pv.Unhealthy > pv.MaxUnhealthy {
			out = append(out, fmt.Sprintf("pool %s has %d of %d nodes unhealthy, more than maxUnhealthy %s (%d): the pool is paused", pv.Pool, pv.Unhealthy, pv.Nodes, p.MaxUnhealthy.String(), pv.MaxUnhealthy))
		}
		if v.Record.Phase == "" && pv.InFlight >= pv.MaxInFlight {
			var busy []string
			for _, o := range views {
				if o.Pool == pv.Pool && decide.Phase(o.Record.Phase).HoldsSlot(o.policy.Action) {
					busy = append(busy, o.Name)
				}
			}
			out = append(out, fmt.Sprintf("pool %s has %d of maxInFlight %d in the pipeline (%s)", pv.Pool, pv.InFlight, pv.MaxInFlight, strings.Join(busy, ", ")))
		}
	}
	if v.Record.Phase == "" || decide.Phase(v.Record.Phase).Releasable() {
		st := pauses(s.cfg, views)
		if st.Cluster != "" {
			out = append(out, st.Cluster)
		}
		if msg := st.Zones[v.Zone]; msg != "" {
			out = append(out, msg)
		}
	}
	return out
}

// leaseSentence describes one heartbeat.
func leaseSentence(who string, l *leaseView, now time.Time) string {
	if l == nil {
		return who + " has no Lease."
	}
	if l.RenewTime.IsZero() {
		return who + "'s Lease was never renewed."
	}
	dur := time.Duration(l.DurationSeconds * float64(time.Second))
	s := fmt.Sprintf("%s's Lease was renewed %s (duration %s, stale %s without a renewal)", who, relative(l.RenewTime, now), short(dur), short(decide.StaleAfter(dur)))
	if l.Stale {
		return s + ": stale."
	}
	return s + ": fresh."
}

func pauseText(impaired, total int, where, field, threshold string, allowed int) string {
	return fmt.Sprintf("%d of %d nodes in %s are silent or unhealthy, more than %s %s (%d nodes): remediation there is paused", impaired, total, where, field, threshold, allowed)
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "an unknown time"
	}
	return t.UTC().Format(time.RFC3339)
}

func orUnknown(s string) string {
	if s == "" {
		return "an unrecorded reason"
	}
	return s
}
