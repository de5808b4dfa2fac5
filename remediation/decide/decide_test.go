package decide

import (
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nodevigil/nodevigil/remediation/config"
)

// now is the fixed decision time of every case.
var now = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return now.Add(d) }

type nodeOpt func(*corev1.Node)

func created(d time.Duration) nodeOpt {
	return func(n *corev1.Node) { n.CreationTimestamp = metav1.NewTime(at(d)) }
}

func cond(t corev1.NodeConditionType, s corev1.ConditionStatus, since time.Duration) nodeOpt {
	return func(n *corev1.Node) {
		c := corev1.NodeCondition{Type: t, Status: s, Reason: "Test", Message: "test"}
		if since != 0 {
			c.LastTransitionTime = metav1.NewTime(at(since))
		}
		n.Status.Conditions = append(n.Status.Conditions, c)
	}
}

func annotate(k, v string) nodeOpt {
	return func(n *corev1.Node) {
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[k] = v
	}
}

func taint(k string) nodeOpt {
	return func(n *corev1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: k, Effect: corev1.TaintEffectNoSchedule})
	}
}

func state(p Phase) nodeOpt { return annotate(AnnotationState, string(p)) }

// wasReady records the node first ready two hours before now.
var wasReady = annotate(AnnotationFirstReady, "2025-03-01T10:00:00Z")

// seen is an observation time relative to now, for the test table.
func seen(d time.Duration) *time.Duration { return &d }

// node builds a node created a day ago (well past any startup window), Ready=True and recorded
// first ready two hours ago.
func node(opts ...nodeOpt) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "ip-10-0-0-1", CreationTimestamp: metav1.NewTime(at(-24 * time.Hour))}}
	wasReady(n)
	hasReady := false
	for _, o := range opts {
		o(n)
	}
	for _, c := range n.Status.Conditions {
		hasReady = hasReady || c.Type == corev1.NodeReady
	}
	if !hasReady {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(at(-23 * time.Hour))})
	}
	return n
}

// neverUpdated is the Ready condition kube-controller-manager sets on a node whose kubelet
// never posted status.
func neverUpdated(n *corev1.Node) {
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionUnknown,
		Reason: "NodeStatusNeverUpdated", Message: "Kubelet never posted node status.", LastTransitionTime: metav1.NewTime(at(-23 * time.Hour))})
}

// notRecorded removes the first-ready record node() gives every node by default.
func notRecorded(n *corev1.Node) { delete(n.Annotations, AnnotationFirstReady) }

// singleSignal switches a policy to liveness SingleSignal.
func singleSignal(p *config.Policy) { p.Liveness = config.LivenessSingleSignal }

// bare builds a node without the default Ready condition.
func bare(opts ...nodeOpt) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "ip-10-0-0-1", CreationTimestamp: metav1.NewTime(at(-24 * time.Hour))}}
	for _, o := range opts {
		o(n)
	}
	return n
}

// lease renewed at now+renewed with a 40 s duration. Unless a case says otherwise, the
// remediator observed the renewal at that moment too (no clock skew); StaleAfter(40s) is 50s.
func lease(renewed time.Duration) *coordinationv1.Lease {
	return &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{
		RenewTime:            &metav1.MicroTime{Time: at(renewed)},
		LeaseDurationSeconds: ptr.To[int32](40),
	}}
}

var (
	freshAgent   = lease(-10 * time.Second)  // expires now+30s
	freshKubelet = lease(-5 * time.Second)   // expires now+35s
	staleAgent   = lease(-120 * time.Second) // expired now-80s
)

type policyOpt func(*config.Policy)

func policy(opts ...policyOpt) *config.Policy {
	p := config.Default().Policies[0]
	p.Tolerations.Conditions = map[string]time.Duration{
		"NetworkingReady": 10 * time.Minute,
		"MemoryHealthy":   15 * time.Minute,
	}
	for _, o := range opts {
		o(&p)
	}
	return &p
}

func TestDecide(t *testing.T) {
	tests := []struct {
		name      string
		node      *corev1.Node
		kubelet   *coordinationv1.Lease
		agent     *coordinationv1.Lease
		policy    *config.Policy
		observing time.Duration // leader since now+observing; default long ago
		agentDur  time.Duration
		// kubeletSeen and agentSeen override when the remediator observed the Lease change
		// (default: at its renewTime); noAgents says no agent Lease exists anywhere.
		kubeletSeen, agentSeen *time.Duration
		noAgents               bool
		record                 bool // want RecordFirstReady
		// seenReady is when the leader's memory saw the node ready (relative to now; nil:
		// never); persist wants PersistFirstReady.
		seenReady *time.Duration
		persist   bool
		presumed  bool // want PresumedReady

		action     Action
		reason     string
		requeue    time.Duration // checked when not -1
		since      time.Duration // checked when want.checkSince
		checkSince bool
		eligible   time.Duration
		checkElig  bool
		unhealthy  bool
		silent     bool
		msg        string // substring of the message
	}{
		// Row 1: both heartbeats fresh. A Lease is stale 50 s (40 s + grace 10 s) after the
		// remediator last saw it change.
		{name: "healthy", node: node(), kubelet: freshKubelet, agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second},
		{name: "healthy requeues at the earlier staleness", node: node(), kubelet: lease(-20 * time.Second), agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 30 * time.Second},
		{name: "healthy with kubelet lease fresh and Ready Unknown (lease wins)", node: node(cond(corev1.NodeReady, corev1.ConditionUnknown, -time.Minute)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second},

		// Time is the observer's: renewTime is the node's clock and never compared with now.
		{name: "node clock 10 min ahead, leases seen renewing: fresh", node: node(), kubelet: lease(10 * time.Minute), kubeletSeen: seen(-5 * time.Second), agent: lease(10 * time.Minute), agentSeen: seen(-10 * time.Second),
			action: ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second},
		{name: "node clock 10 min behind, leases seen renewing: fresh", node: node(), kubelet: lease(-10 * time.Minute), kubeletSeen: seen(-5 * time.Second), agent: lease(-10 * time.Minute), agentSeen: seen(-10 * time.Second),
			action: ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second},
		{name: "renewTime claims now but nothing seen changing for 60 s: silent", node: node(), kubelet: lease(0), kubeletSeen: seen(-60 * time.Second), agent: lease(0), agentSeen: seen(-60 * time.Second),
			action: ActionWait, reason: ReasonNodeSilent, since: -10 * time.Second, checkSince: true, requeue: 3*time.Minute - 10*time.Second, unhealthy: true, silent: true, msg: "renewTime claims 2025-03-01T12:00:00Z"},
		{name: "renewTime 10 min ahead but nothing seen changing: silent", node: node(), kubelet: lease(10 * time.Minute), kubeletSeen: seen(-10 * time.Minute), agent: lease(10 * time.Minute), agentSeen: seen(-10 * time.Minute),
			action: ActionRemediate, reason: ReasonNodeSilent, requeue: 0, unhealthy: true, silent: true},
		{name: "stale exactly StaleAfter after the last change", node: node(), kubelet: freshKubelet, agent: lease(0), agentSeen: seen(-50 * time.Second),
			action: ActionNone, reason: ReasonAgentSilent, since: 0, checkSince: true, requeue: 45 * time.Second, silent: true},
		{name: "fresh one nanosecond before StaleAfter", node: node(), kubelet: freshKubelet, agent: lease(0), agentSeen: seen(-50*time.Second + time.Nanosecond),
			action: ActionNone, reason: ReasonHealthy, requeue: time.Nanosecond},
		{name: "a new leader judges Leases from its own start", node: node(), kubelet: lease(-10 * time.Minute), agent: lease(-10 * time.Minute), observing: -10 * time.Second,
			action: ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second},
		{name: "a new leader judges a Lease stale one duration and grace after its start", node: node(), kubelet: lease(-10 * time.Minute), agent: lease(-10 * time.Minute), observing: -50 * time.Second,
			action: ActionWait, reason: ReasonNodeSilent, since: 0, checkSince: true, requeue: 3 * time.Minute, unhealthy: true, silent: true},

		// First ready is recorded once, when the node is seen ready.
		{name: "ready node without a first-ready record: record it", node: node(notRecorded), kubelet: freshKubelet, agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second, record: true},
		{name: "no record while the startup taint is on", node: node(notRecorded, created(-5*time.Minute), taint(config.DefaultStartupTaint)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second},
		{name: "no record while Ready is not True", node: node(notRecorded, created(-5*time.Minute), cond(corev1.NodeReady, corev1.ConditionFalse, -time.Minute)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second},
		{name: "no record while the kubelet is stale", node: node(notRecorded), kubelet: lease(-60 * time.Second), agent: freshAgent,
			presumed: true,
			action:   ActionWait, reason: ReasonKubeletUnhealthy, requeue: 40 * time.Second, unhealthy: true, silent: true},

		// The first-ready record is lazy: the leader remembers a node it saw ready
		// (SeenReadyAt) and judges it as recorded; the annotation is asked for only when the
		// node stops looking ready, which is when it matters.
		{name: "seen ready by this leader, still ready: nothing to record or persist", node: node(notRecorded), kubelet: freshKubelet, agent: freshAgent, seenReady: seen(-time.Hour),
			action: ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second},
		{name: "seen ready, startup taint back on a day-old node: no startup deadline, persist the record", node: node(notRecorded, taint(config.DefaultStartupTaint)), kubelet: freshKubelet, agent: freshAgent, seenReady: seen(-time.Hour),
			action: ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second, persist: true, msg: "first ready at 2025-03-01T11:00:00Z"},
		{name: "seen ready, Ready=False: kubelet toleration as after the record, persist it", node: node(notRecorded, cond(corev1.NodeReady, corev1.ConditionFalse, -2*time.Minute)), kubelet: freshKubelet, agent: freshAgent, seenReady: seen(-time.Hour),
			action: ActionWait, reason: ReasonKubeletUnhealthy, since: -2 * time.Minute, checkSince: true, unhealthy: true, requeue: 40 * time.Second, persist: true},
		{name: "seen ready, kubelet stale: persist the record", node: node(notRecorded), kubelet: lease(-60 * time.Second), agent: freshAgent, seenReady: seen(-time.Hour),
			action: ActionWait, reason: ReasonKubeletUnhealthy, requeue: 40 * time.Second, unhealthy: true, silent: true, persist: true},
		{name: "seen ready, both silent: persist the record", node: node(notRecorded), kubelet: lease(-60 * time.Second), agent: lease(-60 * time.Second), seenReady: seen(-time.Hour),
			action: ActionWait, reason: ReasonNodeSilent, requeue: -1, unhealthy: true, silent: true, persist: true},
		{name: "recorded on the node: never persisted again", node: node(taint(config.DefaultStartupTaint)), kubelet: freshKubelet, agent: freshAgent, seenReady: seen(-time.Hour),
			action: ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second},
		{name: "agent never seen, seen ready, Ready=False: one signal, persist the record", node: node(notRecorded, cond(corev1.NodeReady, corev1.ConditionFalse, -2*time.Minute)), kubelet: freshKubelet, seenReady: seen(-time.Hour),
			action: ActionNone, reason: ReasonAgentNeverSeen, requeue: -1, persist: true, msg: "first ready at 2025-03-01T11:00:00Z (seen by this leader)"},

		// Row 2: agent fresh, kubelet down (its Lease stale, or Ready=False once ready).
		{name: "kubelet lease just stale, agent fresh: wait for kubeletUnhealthy toleration", node: node(), kubelet: lease(-60 * time.Second), agent: freshAgent,
			action: ActionWait, reason: ReasonKubeletUnhealthy, requeue: 40 * time.Second, since: -10 * time.Second, checkSince: true,
			eligible: -10*time.Second + 5*time.Minute, checkElig: true, unhealthy: true, silent: true, msg: "kubelet lease stale since"},
		{name: "kubelet lease stale beyond toleration: remediate", node: node(), kubelet: lease(-6 * time.Minute), agent: freshAgent,
			action: ActionRemediate, reason: ReasonKubeletUnhealthy, requeue: 0, eligible: -10 * time.Second, checkElig: true, unhealthy: true, silent: true},
		{name: "agent reports KubeletHealthy=False, kubelet lease fresh and Ready: healthy (one signal)", node: node(cond(ConditionKubeletHealthy, corev1.ConditionFalse, -2*time.Minute)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second},
		{name: "agent reports KubeletHealthy=False for hours, kubelet fresh and Ready: still healthy", node: node(cond(ConditionKubeletHealthy, corev1.ConditionFalse, -6*time.Hour)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second},
		{name: "KubeletHealthy=False explains a stale kubelet but does not move its start", node: node(cond(ConditionKubeletHealthy, corev1.ConditionFalse, -3*time.Minute)), kubelet: lease(-100 * time.Second), agent: freshAgent,
			action: ActionWait, reason: ReasonKubeletUnhealthy, since: -50 * time.Second, checkSince: true, eligible: 4*time.Minute + 10*time.Second, checkElig: true, unhealthy: true, silent: true, requeue: 40 * time.Second, msg: "KubeletHealthy=False"},
		{name: "Ready=False after first ready, kubelet lease fresh: kubelet toleration from the transition", node: node(cond(corev1.NodeReady, corev1.ConditionFalse, -2*time.Minute)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionWait, reason: ReasonKubeletUnhealthy, since: -2 * time.Minute, checkSince: true, eligible: 3 * time.Minute, checkElig: true, unhealthy: true, requeue: 40 * time.Second, msg: "Ready=False"},
		{name: "Ready=False after first ready beyond toleration: remediate", node: node(cond(corev1.NodeReady, corev1.ConditionFalse, -6*time.Minute)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionRemediate, reason: ReasonKubeletUnhealthy, unhealthy: true, requeue: 0},
		{name: "Ready=False before first ready is the startup deadline's business", node: node(notRecorded, created(-10*time.Minute), cond(corev1.NodeReady, corev1.ConditionFalse, -6*time.Minute)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second},
		{name: "Ready=False on a day-old node without record, not watched since creation: presumed ready, kubelet toleration", node: node(notRecorded, cond(corev1.NodeReady, corev1.ConditionFalse, -6*time.Minute)), kubelet: freshKubelet, agent: freshAgent,
			presumed: true,
			action:   ActionRemediate, reason: ReasonKubeletUnhealthy, unhealthy: true, requeue: 0, msg: "presumed ready: no first-ready record"},
		{name: "KubeletHealthy named in tolerations.conditions: its own toleration", node: node(cond(ConditionKubeletHealthy, corev1.ConditionFalse, -21*time.Minute)), kubelet: freshKubelet, agent: freshAgent,
			policy: policy(func(p *config.Policy) { p.Tolerations.Conditions["KubeletHealthy"] = 20 * time.Minute }),
			action: ActionRemediate, reason: ReasonConditionUnhealthy, unhealthy: true, requeue: 0, msg: "KubeletHealthy=False"},
		{name: "KubeletHealthy=Unknown is no evidence", node: node(cond(ConditionKubeletHealthy, corev1.ConditionUnknown, -time.Hour)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second},
		{name: "no kubelet lease, Ready=Unknown, agent fresh", node: node(cond(corev1.NodeReady, corev1.ConditionUnknown, -6*time.Minute)), agent: freshAgent,
			action: ActionRemediate, reason: ReasonKubeletUnhealthy, unhealthy: true, silent: true, requeue: 0},

		// Row 3: only the agent is silent: never remediate.
		{name: "agent silent, kubelet fresh: never", node: node(), kubelet: freshKubelet, agent: staleAgent,
			action: ActionNone, reason: ReasonAgentSilent, requeue: 45 * time.Second, since: -70 * time.Second, checkSince: true, silent: true, msg: "only the agent is broken"},
		{name: "agent silent for days with stale bad conditions, kubelet fresh: never", node: node(cond(ConditionNetworkingReady, corev1.ConditionFalse, -48*time.Hour), cond(ConditionKubeletHealthy, corev1.ConditionFalse, -48*time.Hour)),
			kubelet: freshKubelet, agent: lease(-47 * time.Hour), action: ActionNone, reason: ReasonAgentSilent, silent: true, requeue: -1},
		{name: "agent silent, no kubelet lease but Ready=True", node: node(), agent: staleAgent,
			action: ActionNone, reason: ReasonAgentSilent, requeue: 0, silent: true},
		{name: "agent silent, no kubelet lease and no Ready: no evidence the machine is dead", node: bare(), agent: staleAgent,
			action: ActionNone, reason: ReasonAgentSilent, requeue: 0, silent: true},

		// Row 4: both silent.
		{name: "both silent, toleration runs from the later staleness (kubelet)", node: node(), kubelet: lease(-60 * time.Second), agent: staleAgent,
			action: ActionWait, reason: ReasonNodeSilent, requeue: 3*time.Minute - 10*time.Second, since: -10 * time.Second, checkSince: true,
			eligible: 3*time.Minute - 10*time.Second, checkElig: true, unhealthy: true, silent: true},
		{name: "both silent, toleration runs from the later staleness (agent)", node: node(), kubelet: lease(-140 * time.Second), agent: lease(-60 * time.Second),
			action: ActionWait, reason: ReasonNodeSilent, since: -10 * time.Second, checkSince: true, requeue: 3*time.Minute - 10*time.Second, unhealthy: true, silent: true},
		{name: "both silent beyond toleration: remediate", node: node(), kubelet: lease(-5 * time.Minute), agent: lease(-10 * time.Minute),
			action: ActionRemediate, reason: ReasonNodeSilent, requeue: 0, since: -250 * time.Second, checkSince: true, unhealthy: true, silent: true, msg: "both heartbeats silent"},
		{name: "both silent exactly at the toleration end: remediate", node: node(), kubelet: lease(-230 * time.Second), agent: lease(-230 * time.Second),
			action: ActionRemediate, reason: ReasonNodeSilent, requeue: 0, eligible: 0, checkElig: true, unhealthy: true, silent: true},
		{name: "both silent one nanosecond before the toleration end: wait exactly that long", node: node(), kubelet: lease(-230*time.Second + time.Nanosecond), agent: lease(-230 * time.Second),
			action: ActionWait, reason: ReasonNodeSilent, requeue: time.Nanosecond, unhealthy: true, silent: true},
		{name: "both silent, no kubelet lease, Ready=Unknown", node: node(cond(corev1.NodeReady, corev1.ConditionUnknown, -5*time.Minute)), agent: lease(-290 * time.Second),
			action: ActionRemediate, reason: ReasonNodeSilent, since: -4 * time.Minute, checkSince: true, unhealthy: true, silent: true, requeue: 0},

		// Row 5: agent never seen, node never recorded ready: only the startup deadline.
		{name: "never seen, young: startup grace", node: node(notRecorded, created(-5*time.Minute)), kubelet: freshKubelet,
			action: ActionWait, reason: ReasonStartupGrace, requeue: 5 * time.Minute, record: true},
		{name: "never seen, past grace: wait for the deadline", node: node(notRecorded, created(-15*time.Minute)), kubelet: freshKubelet,
			action: ActionWait, reason: ReasonAgentNotSeen, requeue: 5 * time.Minute, record: true},
		{name: "never seen, past grace, kubelet silent too: still only the deadline", node: node(notRecorded, created(-15*time.Minute)), kubelet: lease(-10 * time.Minute),
			action: ActionWait, reason: ReasonAgentNotSeen, requeue: 5 * time.Minute, silent: true},
		{name: "never seen past the deadline, never Ready: remediate", node: node(notRecorded, created(-25*time.Minute), cond(corev1.NodeReady, corev1.ConditionFalse, -24*time.Minute)), kubelet: freshKubelet,
			action: ActionRemediate, reason: ReasonStartupDeadlineExceeded, since: -24 * time.Minute, checkSince: true, eligible: -5 * time.Minute, checkElig: true, unhealthy: true, requeue: 0},
		{name: "never seen past the deadline, no Ready, no lease: remediate", node: bare(created(-25 * time.Minute)),
			action: ActionRemediate, reason: ReasonStartupDeadlineExceeded, unhealthy: true, requeue: 0, msg: "has no Ready condition"},
		{name: "never seen past the deadline but serving: only the agent is missing", node: node(notRecorded, created(-25*time.Minute)), kubelet: freshKubelet,
			action: ActionNone, reason: ReasonAgentNeverSeen, requeue: 45 * time.Second, record: true},
		{name: "never seen, old node predating nodevigil, serving: never", node: node(notRecorded), kubelet: freshKubelet,
			action: ActionNone, reason: ReasonAgentNeverSeen, requeue: 45 * time.Second, record: true},
		{name: "never seen past the deadline, Ready but stuck startup taint: remediate", node: node(notRecorded, created(-25*time.Minute), taint(config.DefaultStartupTaint)), kubelet: freshKubelet,
			action: ActionRemediate, reason: ReasonStartupDeadlineExceeded, unhealthy: true, requeue: 0, msg: "still carries startup taint"},
		{name: "never seen, never ready since this leader watched its creation, kubelet silent long: startup deadline", node: node(notRecorded, created(-25*time.Minute)), kubelet: lease(-10 * time.Minute),
			action: ActionRemediate, reason: ReasonStartupDeadlineExceeded, unhealthy: true, silent: true, requeue: 0, msg: "watched by this leader since its creation"},
		{name: "never seen, no record on a day-old node the leader did not watch, kubelet silent: presumed ready, one signal", node: node(notRecorded), kubelet: lease(-10 * time.Minute),
			presumed: true,
			action:   ActionNone, reason: ReasonAgentNeverSeen, silent: true, requeue: 0, msg: "presumed ready"},
		{name: "never seen, Ready=Unknown NodeStatusNeverUpdated on a day-old node: never ready whoever leads", node: node(notRecorded, neverUpdated), observing: -10 * time.Minute,
			action: ActionRemediate, reason: ReasonStartupDeadlineExceeded, unhealthy: true, silent: true, requeue: 0, msg: "NodeStatusNeverUpdated"},

		// Agent never seen on a node that was ready: one signal. Never, unless SingleSignal.
		{name: "never seen, was ready, serving: never", node: node(), kubelet: freshKubelet,
			action: ActionNone, reason: ReasonAgentNeverSeen, requeue: 45 * time.Second},
		{name: "never seen, was ready, went NotReady: one signal, never under TwoSignal", node: node(cond(corev1.NodeReady, corev1.ConditionFalse, -2*time.Hour)), kubelet: freshKubelet,
			action: ActionNone, reason: ReasonAgentNeverSeen, requeue: 45 * time.Second, msg: "one signal only"},
		{name: "never seen, was ready, kubelet silent long: never under TwoSignal", node: node(), kubelet: lease(-10 * time.Hour),
			action: ActionNone, reason: ReasonAgentNeverSeen, requeue: 0, silent: true, msg: "liveness TwoSignal"},
		{name: "never seen, was ready, stuck startup taint back, serving: never", node: node(taint(config.DefaultStartupTaint)), kubelet: freshKubelet,
			action: ActionNone, reason: ReasonAgentNeverSeen, requeue: 45 * time.Second},
		{name: "SingleSignal: kubelet silent on a node without agent, within the 30m toleration", node: node(), kubelet: lease(-10 * time.Minute), policy: policy(singleSignal),
			action: ActionWait, reason: ReasonKubeletUnhealthy, since: -(9*time.Minute + 10*time.Second), checkSince: true, eligible: 20*time.Minute + 50*time.Second, checkElig: true,
			requeue: 20*time.Minute + 50*time.Second, unhealthy: true, silent: true, msg: "liveness SingleSignal"},
		{name: "SingleSignal: kubelet silent beyond the toleration: remediate", node: node(), kubelet: lease(-40 * time.Minute), policy: policy(singleSignal),
			action: ActionRemediate, reason: ReasonKubeletUnhealthy, requeue: 0, unhealthy: true, silent: true},

		// No agent Lease anywhere: a misconfiguration; nothing is remediated on one signal.
		{name: "no agent leases anywhere: a stuck startup taint past the deadline is not remediated", node: node(notRecorded, created(-25*time.Minute), taint(config.DefaultStartupTaint)), kubelet: freshKubelet, noAgents: true,
			action: ActionNone, reason: ReasonNoAgentLeases, requeue: 45 * time.Second, msg: "no nodevigil agent Lease exists for any node"},
		{name: "no agent leases anywhere: a dead kubelet is not remediated", node: node(notRecorded), kubelet: lease(-time.Hour), noAgents: true,
			presumed: true,
			action:   ActionNone, reason: ReasonNoAgentLeases, requeue: 0, silent: true},
		{name: "no agent leases anywhere, ready node: recorded ready all the same", node: node(notRecorded), kubelet: freshKubelet, noAgents: true,
			action: ActionNone, reason: ReasonNoAgentLeases, requeue: 45 * time.Second, record: true},
		{name: "no agent leases anywhere under SingleSignal: judged on the kubelet", node: node(notRecorded, created(-25*time.Minute), taint(config.DefaultStartupTaint)), kubelet: freshKubelet, noAgents: true, policy: policy(singleSignal),
			action: ActionRemediate, reason: ReasonStartupDeadlineExceeded, unhealthy: true, requeue: 0},

		// Agent alive, but the node never shed its startup taint.
		{name: "agent fresh, startup taint kept, booting: nothing yet, requeue at the deadline", node: node(notRecorded, created(-(20*time.Minute - 10*time.Second)), taint(config.DefaultStartupTaint)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 10 * time.Second},
		{name: "agent fresh, startup taint kept past the deadline: remediate", node: node(notRecorded, created(-25*time.Minute), taint(config.DefaultStartupTaint)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionRemediate, reason: ReasonStartupDeadlineExceeded, since: -25 * time.Minute, checkSince: true, eligible: -5 * time.Minute, checkElig: true, unhealthy: true, requeue: 0, msg: "never ready: watched by this leader since its creation 2025-03-01T11:35:00Z"},
		{name: "startup taint back on a day-old node first ready: no startup deadline", node: node(taint(config.DefaultStartupTaint)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second, msg: "is on a node past startup (first ready at 2025-03-01T10:00:00Z (recorded on the node))"},
		// A change of leader loses the memory of nodes whose record was still queued: no
		// record, and the new leader never saw the node ready. Unknown is never "never ready".
		{name: "leader change lost the queued record, startup taint back on a day-old node: presumed ready", node: node(notRecorded, taint(config.DefaultStartupTaint)), kubelet: freshKubelet, agent: freshAgent, observing: -10 * time.Minute,
			presumed: true,
			action:   ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second, msg: "presumed ready: no first-ready record, not watched by this leader since its creation 2025-02-28T12:00:00Z (observing since 2025-03-01T11:50:00Z)"},
		{name: "leader change, startup taint on a node the leader did not watch, before its deadline: nothing yet", node: node(notRecorded, created(-15*time.Minute), taint(config.DefaultStartupTaint)), kubelet: freshKubelet, agent: freshAgent, observing: -10 * time.Minute,
			action: ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second},
		{name: "node created in the second the leader began observing: a doubt, presumed ready", node: node(notRecorded, created(-25*time.Minute+500*time.Millisecond), taint(config.DefaultStartupTaint)), kubelet: freshKubelet, agent: freshAgent, observing: -25 * time.Minute,
			presumed: true,
			action:   ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second, msg: "presumed ready"},
		{name: "node created the second after the leader began observing: watched, never ready", node: node(notRecorded, created(-25*time.Minute+time.Second), taint(config.DefaultStartupTaint)), kubelet: freshKubelet, agent: freshAgent, observing: -25 * time.Minute,
			action: ActionRemediate, reason: ReasonStartupDeadlineExceeded, unhealthy: true, requeue: 0, msg: "watched by this leader since its creation"},
		{name: "startup taint kept, Ready=Unknown NodeStatusNeverUpdated, new leader: never ready", node: node(notRecorded, neverUpdated, taint(config.DefaultStartupTaint)), kubelet: freshKubelet, agent: freshAgent, observing: -10 * time.Minute,
			action: ActionRemediate, reason: ReasonStartupDeadlineExceeded, unhealthy: true, requeue: 0, msg: "never ready: Ready=Unknown (NodeStatusNeverUpdated)"},
		{name: "startup taint back with its check's condition False: that condition's toleration", node: node(taint(config.DefaultStartupTaint), cond(ConditionNetworkingReady, corev1.ConditionFalse, -11*time.Minute)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionRemediate, reason: ReasonConditionUnhealthy, unhealthy: true, requeue: 0, msg: "NetworkingReady=False"},
		{name: "agent silent, kubelet fresh, startup taint kept: still never", node: node(notRecorded, created(-25*time.Minute), taint(config.DefaultStartupTaint)), kubelet: freshKubelet, agent: staleAgent,
			action: ActionNone, reason: ReasonAgentSilent, silent: true, requeue: -1},
		{name: "foreign taint is no startup taint", node: node(taint("dedicated")), kubelet: freshKubelet, agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second},

		// Agent-reported conditions.
		{name: "NetworkingReady=False within toleration", node: node(cond(ConditionNetworkingReady, corev1.ConditionFalse, -5*time.Minute)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionWait, reason: ReasonConditionUnhealthy, requeue: 40 * time.Second, eligible: 5 * time.Minute, checkElig: true, unhealthy: true, msg: "NetworkingReady=False"},
		{name: "NetworkingReady=False beyond toleration", node: node(cond(ConditionNetworkingReady, corev1.ConditionFalse, -11*time.Minute)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionRemediate, reason: ReasonConditionUnhealthy, requeue: 0, since: -11 * time.Minute, checkSince: true, unhealthy: true},
		{name: "condition not in the policy is ignored", node: node(cond("DiskHealthy", corev1.ConditionFalse, -time.Hour)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second},
		{name: "condition Unknown is no evidence", node: node(cond(ConditionNetworkingReady, corev1.ConditionUnknown, -time.Hour)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second},
		{name: "condition without LastTransitionTime cannot be measured", node: node(cond(ConditionNetworkingReady, corev1.ConditionFalse, 0)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second},
		{name: "the condition whose toleration ends first wins", node: node(cond(ConditionNetworkingReady, corev1.ConditionFalse, -11*time.Minute), cond(ConditionMemoryHealthy, corev1.ConditionFalse, -20*time.Minute)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionRemediate, reason: ReasonConditionUnhealthy, eligible: -5 * time.Minute, checkElig: true, unhealthy: true, msg: "MemoryHealthy=False", requeue: 0},

		// Operator and policy gates.
		{name: "do-not-remediate: never", node: node(annotate(AnnotationDoNotRemediate, "true")), kubelet: lease(-10 * time.Minute), agent: lease(-10 * time.Minute),
			action: ActionNone, reason: ReasonDoNotRemediate, unhealthy: true, silent: true, requeue: -1, msg: "NodeSilent"},
		{name: "do-not-remediate=false is no gate", node: node(annotate(AnnotationDoNotRemediate, "false")), kubelet: lease(-10 * time.Minute), agent: lease(-10 * time.Minute),
			action: ActionRemediate, reason: ReasonNodeSilent, unhealthy: true, silent: true, requeue: 0},
		{name: "do-not-remediate on a cordoned node releases it", node: node(annotate(AnnotationDoNotRemediate, ""), state(PhaseCordoned)), kubelet: lease(-10 * time.Minute), agent: lease(-10 * time.Minute),
			action: ActionRelease, reason: ReasonDoNotRemediate, unhealthy: true, silent: true, requeue: -1},
		{name: "policy action None reports only", node: node(), kubelet: lease(-10 * time.Minute), agent: lease(-10 * time.Minute), policy: policy(func(p *config.Policy) { p.Action = config.ActionNone; p.Name = "db" }),
			action: ActionNone, reason: ReasonRemediationDisabled, unhealthy: true, silent: true, requeue: -1, msg: "policy db has action None"},
		{name: "policy action None on a healthy node is healthy", node: node(), kubelet: freshKubelet, agent: freshAgent, policy: policy(func(p *config.Policy) { p.Action = config.ActionNone }),
			action: ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second},
		{name: "policy action None releases a draining node", node: node(state(PhaseDraining)), kubelet: lease(-10 * time.Minute), agent: lease(-10 * time.Minute), policy: policy(func(p *config.Policy) { p.Action = config.ActionNone }),
			action: ActionRelease, reason: ReasonRemediationDisabled, unhealthy: true, silent: true, requeue: -1},
		{name: "startup grace holds a young node's remediation", node: node(created(-5 * time.Minute)), kubelet: lease(-4 * time.Minute), agent: lease(-4 * time.Minute),
			action: ActionWait, reason: ReasonStartupGrace, requeue: 5 * time.Minute, unhealthy: true, silent: true, msg: "then NodeSilent"},
		{name: "startup grace holds when the leader has observed long enough", node: node(created(-5 * time.Minute)), kubelet: lease(-10 * time.Minute), agent: lease(-10 * time.Minute), observing: -5 * time.Minute,
			action: ActionWait, reason: ReasonStartupGrace, requeue: 5 * time.Minute, unhealthy: true, silent: true},
		{name: "leader observing does not hide a healthy node", node: node(), kubelet: freshKubelet, agent: freshAgent, observing: -10 * time.Second,
			action: ActionNone, reason: ReasonHealthy, requeue: 40 * time.Second},
		{name: "the observation period applies to the startup deadline too", node: bare(created(-25 * time.Minute)), observing: -30 * time.Second,
			action: ActionWait, reason: ReasonLeaderObserving, requeue: 10 * time.Second, unhealthy: true},

		// Pipeline states.
		{name: "marked node that recovered is released", node: node(state(PhaseMarked)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionRelease, reason: ReasonHealthy, requeue: 40 * time.Second, msg: "releasing node (state Marked)"},
		{name: "draining node still dead continues", node: node(state(PhaseDraining)), kubelet: lease(-10 * time.Minute), agent: lease(-10 * time.Minute),
			action: ActionRemediate, reason: ReasonNodeSilent, unhealthy: true, silent: true, requeue: 0},
		{name: "cordoned node with only the agent silent is released", node: node(state(PhaseCordoned)), kubelet: freshKubelet, agent: staleAgent,
			action: ActionRelease, reason: ReasonAgentSilent, silent: true, requeue: -1},
		{name: "cordoned node still unhealthy within toleration is held, not released", node: node(state(PhaseCordoned)), kubelet: lease(-60 * time.Second), agent: freshAgent,
			action: ActionWait, reason: ReasonKubeletUnhealthy, unhealthy: true, silent: true, requeue: -1, msg: "holding node (state Cordoned) within its toleration"},
		{name: "cordoned silent node under a new leader past its observe period is held within the toleration, not released", node: node(state(PhaseCordoned)), kubelet: lease(-10 * time.Minute), agent: lease(-10 * time.Minute), observing: -55 * time.Second,
			action: ActionWait, reason: ReasonNodeSilent, unhealthy: true, silent: true, requeue: -1, msg: "holding node (state Cordoned) within its toleration"},
		{name: "cordoned node under a new leader is kept, not released on unwatched Leases", node: node(state(PhaseCordoned)), kubelet: lease(-10 * time.Minute), agent: lease(-10 * time.Minute), observing: -time.Second,
			action: ActionWait, reason: ReasonLeaderObserving, requeue: 49 * time.Second, msg: "has not been watched for its duration yet"},
		{name: "cordoned node whose Leases changed under the new leader is released", node: node(state(PhaseCordoned)), kubelet: freshKubelet, agent: freshAgent, observing: -20 * time.Second,
			action: ActionRelease, reason: ReasonHealthy, requeue: -1},
		{name: "terminating node that looks healthy is finished anyway", node: node(state(PhaseTerminating), annotate(AnnotationReason, ReasonNodeSilent)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionRemediate, reason: ReasonTerminationInProgress, unhealthy: true, requeue: 0, msg: "started for NodeSilent"},
		{name: "terminated node with do-not-remediate is finished anyway", node: node(state(PhaseTerminated), annotate(AnnotationDoNotRemediate, "true")), kubelet: freshKubelet, agent: freshAgent,
			action: ActionRemediate, reason: ReasonTerminationInProgress, unhealthy: true, requeue: 0},
		{name: "unknown state value is treated as Marked", node: node(state("Exploded")), kubelet: freshKubelet, agent: freshAgent,
			action: ActionRelease, reason: ReasonHealthy, requeue: -1},

		// Lease field fallbacks.
		{name: "agent lease without duration uses AgentLeaseDuration", node: node(), kubelet: lease(-10 * time.Minute), agentDur: 20 * time.Second,
			agent:  &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: at(-25 * time.Second)}}},
			action: ActionWait, reason: ReasonNodeSilent, since: 0, checkSince: true, unhealthy: true, silent: true, requeue: -1},
		{name: "lease without renewTime is judged by observation alone", node: node(), kubelet: freshKubelet,
			agent: &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To[int32](40)}}, agentSeen: seen(-60 * time.Second),
			action: ActionNone, reason: ReasonAgentSilent, since: -10 * time.Second, checkSince: true, silent: true, requeue: -1, msg: "renewTime claims none"},
		{name: "nil policy means the default policy", node: node(), kubelet: lease(-5 * time.Minute), agent: lease(-5 * time.Minute), policy: nil,
			action: ActionRemediate, reason: ReasonNodeSilent, unhealthy: true, silent: true, requeue: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.policy
			if p == nil && !strings.HasPrefix(tt.name, "nil policy") {
				p = policy()
			}
			observing := at(-time.Hour)
			if tt.observing != 0 {
				observing = at(tt.observing)
			}
			in := Input{
				Node: tt.node, KubeletLease: tt.kubelet, AgentLease: tt.agent, Policy: p, Now: now,
				ObservingSince: observing, ObservePeriod: 40 * time.Second, AgentLeaseDuration: tt.agentDur,
				KubeletObserved: observedAt(tt.kubelet, tt.kubeletSeen), AgentObserved: observedAt(tt.agent, tt.agentSeen),
				NoAgents: tt.noAgents,
			}
			if tt.seenReady != nil {
				in.SeenReadyAt = at(*tt.seenReady)
			}
			d := Decide(in)
			if d.Action != tt.action || d.Reason != tt.reason {
				t.Fatalf("Decide = %s/%s (%s), want %s/%s", d.Action, d.Reason, d.Message, tt.action, tt.reason)
			}
			if tt.requeue >= 0 && d.RequeueAfter != tt.requeue {
				t.Errorf("RequeueAfter = %s, want %s", d.RequeueAfter, tt.requeue)
			}
			if tt.checkSince && !d.Since.Equal(at(tt.since)) {
				t.Errorf("Since = %s, want %s", d.Since, at(tt.since))
			}
			if tt.checkElig && !d.EligibleAt.Equal(at(tt.eligible)) {
				t.Errorf("EligibleAt = %s, want %s", d.EligibleAt, at(tt.eligible))
			}
			if d.Unhealthy != tt.unhealthy || d.Silent != tt.silent {
				t.Errorf("Unhealthy/Silent = %v/%v, want %v/%v", d.Unhealthy, d.Silent, tt.unhealthy, tt.silent)
			}
			if d.RecordFirstReady != tt.record {
				t.Errorf("RecordFirstReady = %v, want %v", d.RecordFirstReady, tt.record)
			}
			if d.PersistFirstReady != tt.persist {
				t.Errorf("PersistFirstReady = %v, want %v", d.PersistFirstReady, tt.persist)
			}
			if d.PresumedReady != tt.presumed {
				t.Errorf("PresumedReady = %v, want %v", d.PresumedReady, tt.presumed)
			}
			if !strings.Contains(d.Message, tt.msg) {
				t.Errorf("Message %q does not contain %q", d.Message, tt.msg)
			}
			if d.Message == "" {
				t.Error("empty Message")
			}
			// Purity: the same input gives the same decision.
			if again := Decide(in); again != d {
				t.Errorf("Decide is not deterministic: %+v then %+v", d, again)
			}
			// NoMessage (the census) changes nothing but the message.
			brief := in
			brief.NoMessage = true
			bd := Decide(brief)
			bd.Message, d.Message = "", ""
			if bd != d {
				t.Errorf("with NoMessage: %+v, want %+v", bd, d)
			}
		})
	}
}

// observedAt is when a test case's remediator saw the Lease change: the override, else the
// renewTime (or acquireTime) the Lease claims.
func observedAt(l *coordinationv1.Lease, override *time.Duration) time.Time {
	switch {
	case override != nil:
		return at(*override)
	case l == nil:
		return time.Time{}
	case l.Spec.RenewTime != nil:
		return l.Spec.RenewTime.Time
	case l.Spec.AcquireTime != nil:
		return l.Spec.AcquireTime.Time
	}
	return time.Time{}
}

func TestDecideNilNode(t *testing.T) {
	d := Decide(Input{Now: now})
	if d.Action != ActionNone || d.Reason != ReasonNodeGone {
		t.Errorf("Decide(nil node) = %s/%s, want None/NodeGone", d.Action, d.Reason)
	}
}

// TestAgentSilentNeverRemediates sweeps time: whatever the age of the agent's silence, while
// the kubelet is fresh the decision is never Remediate, under every policy action.
func TestAgentSilentNeverRemediates(t *testing.T) {
	for _, action := range []config.Action{config.ActionTerminate, config.ActionCordonOnly, config.ActionNone} {
		for silence := time.Duration(0); silence <= 72*time.Hour; silence += 7 * time.Minute {
			n := node(cond(ConditionNetworkingReady, corev1.ConditionFalse, -silence-time.Hour), cond(ConditionKubeletHealthy, corev1.ConditionFalse, -silence-time.Hour))
			d := Decide(Input{
				Node: n, KubeletLease: freshKubelet, AgentLease: lease(-silence - 50*time.Second),
				KubeletObserved: at(-5 * time.Second), AgentObserved: at(-silence - 50*time.Second),
				Policy: policy(func(p *config.Policy) { p.Action = action }), Now: now, ObservingSince: at(-100 * time.Hour), ObservePeriod: 40 * time.Second,
			})
			if d.Action == ActionRemediate {
				t.Fatalf("action %s, agent silent %s, kubelet fresh: Decide = Remediate (%s)", action, silence, d.Message)
			}
		}
	}
}

// TestAgentConditionAloneNeverRemediates sweeps time: a kubelet the agent restarted keeps its
// KubeletHealthy=False for as long as it likes; while the kubelet Lease is seen renewing and
// Ready is True, no toleration starts and nothing is ever remediated, whatever the node's clock
// writes into the Leases.
func TestAgentConditionAloneNeverRemediates(t *testing.T) {
	for _, skew := range []time.Duration{-10 * time.Minute, 0, 10 * time.Minute} {
		for age := time.Duration(0); age <= 72*time.Hour; age += 7 * time.Minute {
			n := node(cond(ConditionKubeletHealthy, corev1.ConditionFalse, -age))
			d := Decide(Input{
				Node: n, KubeletLease: lease(skew), AgentLease: lease(skew - 5*time.Second),
				KubeletObserved: at(-5 * time.Second), AgentObserved: at(-10 * time.Second),
				Policy: policy(), Now: now, ObservingSince: at(-100 * time.Hour), ObservePeriod: 40 * time.Second,
			})
			if d.Action != ActionNone || d.Reason != ReasonHealthy || d.Unhealthy {
				t.Fatalf("KubeletHealthy=False for %s, clock skew %s, kubelet fresh and Ready: Decide = %s/%s unhealthy=%v (%s)", age, skew, d.Action, d.Reason, d.Unhealthy, d.Message)
			}
		}
	}
}

// TestSkewedClocksNeverMatter: a node whose clock is off by any amount, in either direction,
// is judged the same as one with a perfect clock, because renewTime is never compared with
// the remediator's time.
func TestSkewedClocksNeverMatter(t *testing.T) {
	for _, silentFor := range []time.Duration{0, 30 * time.Second, 51 * time.Second, 10 * time.Minute} {
		var want Decision
		for i, skew := range []time.Duration{0, -10 * time.Minute, 10 * time.Minute, -30 * 24 * time.Hour, 365 * 24 * time.Hour} {
			d := Decide(Input{
				Node: node(), KubeletLease: lease(skew - silentFor), AgentLease: lease(skew - silentFor),
				KubeletObserved: at(-silentFor), AgentObserved: at(-silentFor),
				Policy: policy(), Now: now, ObservingSince: at(-time.Hour), ObservePeriod: 50 * time.Second,
			})
			if i == 0 {
				want = d
				continue
			}
			if d.Action != want.Action || d.Reason != want.Reason || d.RequeueAfter != want.RequeueAfter || !d.Since.Equal(want.Since) {
				t.Errorf("silent %s, skew %s: %s/%s requeue %s since %s; without skew %s/%s requeue %s since %s",
					silentFor, skew, d.Action, d.Reason, d.RequeueAfter, d.Since, want.Action, want.Reason, want.RequeueAfter, want.Since)
			}
		}
	}
}

func TestPhase(t *testing.T) {
	tests := []struct {
		phase       Phase
		releasable  bool
		noReturn    bool
		annotations map[string]string
	}{
		{PhaseNone, false, false, nil},
		{PhaseMarked, true, false, map[string]string{AnnotationState: "Marked"}},
		{PhaseCordoned, true, false, map[string]string{AnnotationState: "Cordoned"}},
		{PhaseDraining, true, false, map[string]string{AnnotationState: "Draining"}},
		{PhaseTerminating, false, true, map[string]string{AnnotationState: "Terminating"}},
		{PhaseTerminated, false, true, map[string]string{AnnotationState: "Terminated"}},
	}
	for _, tt := range tests {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Annotations: tt.annotations}}
		if got := PhaseOf(n); got != tt.phase {
			t.Errorf("PhaseOf(%v) = %q, want %q", tt.annotations, got, tt.phase)
		}
		if tt.phase.Releasable() != tt.releasable || tt.phase.PastPointOfNoReturn() != tt.noReturn {
			t.Errorf("%q: Releasable %v PastPointOfNoReturn %v", tt.phase, tt.phase.Releasable(), tt.phase.PastPointOfNoReturn())
		}
	}
}
