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

// node builds a node created a day ago (well past any startup window), Ready=True.
func node(opts ...nodeOpt) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "ip-10-0-0-1", CreationTimestamp: metav1.NewTime(at(-24 * time.Hour))}}
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

// bare builds a node without the default Ready condition.
func bare(opts ...nodeOpt) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "ip-10-0-0-1", CreationTimestamp: metav1.NewTime(at(-24 * time.Hour))}}
	for _, o := range opts {
		o(n)
	}
	return n
}

// lease renewed at now+renewed with a 40 s duration.
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
		// Row 1: both heartbeats fresh.
		{name: "healthy", node: node(), kubelet: freshKubelet, agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 30 * time.Second},
		{name: "healthy requeues at the earlier expiry", node: node(), kubelet: lease(-20 * time.Second), agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 20 * time.Second},
		{name: "healthy with kubelet lease fresh and Ready Unknown (lease wins)", node: node(cond(corev1.NodeReady, corev1.ConditionUnknown, -time.Minute)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 30 * time.Second},
		{name: "lease renewed in the future (clock skew) is fresh", node: node(), kubelet: lease(10 * time.Second), agent: lease(5 * time.Second),
			action: ActionNone, reason: ReasonHealthy, requeue: 45 * time.Second},

		// Row 2: agent fresh, kubelet down.
		{name: "kubelet lease just expired, agent fresh: wait for kubeletUnhealthy toleration", node: node(), kubelet: lease(-60 * time.Second), agent: freshAgent,
			action: ActionWait, reason: ReasonKubeletUnhealthy, requeue: 30 * time.Second, since: -20 * time.Second, checkSince: true,
			eligible: -20*time.Second + 5*time.Minute, checkElig: true, unhealthy: true, silent: true, msg: "kubelet lease expired"},
		{name: "kubelet lease expired beyond toleration: remediate", node: node(), kubelet: lease(-6 * time.Minute), agent: freshAgent,
			action: ActionRemediate, reason: ReasonKubeletUnhealthy, requeue: 0, eligible: -20 * time.Second, checkElig: true, unhealthy: true, silent: true},
		{name: "agent reports KubeletHealthy=False, kubelet lease fresh: wait", node: node(cond(ConditionKubeletHealthy, corev1.ConditionFalse, -2*time.Minute)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionWait, reason: ReasonKubeletUnhealthy, requeue: 30 * time.Second, since: -2 * time.Minute, checkSince: true,
			eligible: 3 * time.Minute, checkElig: true, unhealthy: true, silent: false, msg: "KubeletHealthy=False"},
		{name: "agent reports KubeletHealthy=False beyond toleration: remediate", node: node(cond(ConditionKubeletHealthy, corev1.ConditionFalse, -6*time.Minute)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionRemediate, reason: ReasonKubeletUnhealthy, requeue: 0, unhealthy: true},
		{name: "kubelet evidence measured from the earliest signal", node: node(cond(ConditionKubeletHealthy, corev1.ConditionFalse, -3*time.Minute)), kubelet: lease(-100 * time.Second), agent: freshAgent,
			action: ActionWait, reason: ReasonKubeletUnhealthy, since: -3 * time.Minute, checkSince: true, eligible: 2 * time.Minute, checkElig: true, unhealthy: true, silent: true, requeue: -1},
		{name: "KubeletHealthy=Unknown is no evidence", node: node(cond(ConditionKubeletHealthy, corev1.ConditionUnknown, -time.Hour)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 30 * time.Second},
		{name: "no kubelet lease, Ready=Unknown, agent fresh", node: node(cond(corev1.NodeReady, corev1.ConditionUnknown, -6*time.Minute)), agent: freshAgent,
			action: ActionRemediate, reason: ReasonKubeletUnhealthy, unhealthy: true, silent: true, requeue: 0},

		// Row 3: only the agent is silent: never remediate.
		{name: "agent silent, kubelet fresh: never", node: node(), kubelet: freshKubelet, agent: staleAgent,
			action: ActionNone, reason: ReasonAgentSilent, requeue: 35 * time.Second, since: -80 * time.Second, checkSince: true, silent: true, msg: "only the agent is broken"},
		{name: "agent silent for days with stale bad conditions, kubelet fresh: never", node: node(cond(ConditionNetworkingReady, corev1.ConditionFalse, -48*time.Hour), cond(ConditionKubeletHealthy, corev1.ConditionFalse, -48*time.Hour)),
			kubelet: freshKubelet, agent: lease(-47 * time.Hour), action: ActionNone, reason: ReasonAgentSilent, silent: true, requeue: -1},
		{name: "agent silent, no kubelet lease but Ready=True", node: node(), agent: staleAgent,
			action: ActionNone, reason: ReasonAgentSilent, requeue: 0, silent: true},
		{name: "agent silent, no kubelet lease and no Ready: no evidence the machine is dead", node: bare(), agent: staleAgent,
			action: ActionNone, reason: ReasonAgentSilent, requeue: 0, silent: true},

		// Row 4: both silent.
		{name: "both silent, toleration runs from the later expiry (kubelet)", node: node(), kubelet: lease(-60 * time.Second), agent: staleAgent,
			action: ActionWait, reason: ReasonNodeSilent, requeue: 3*time.Minute - 20*time.Second, since: -20 * time.Second, checkSince: true,
			eligible: 3*time.Minute - 20*time.Second, checkElig: true, unhealthy: true, silent: true},
		{name: "both silent, toleration runs from the later expiry (agent)", node: node(), kubelet: lease(-140 * time.Second), agent: lease(-60 * time.Second),
			action: ActionWait, reason: ReasonNodeSilent, since: -20 * time.Second, checkSince: true, requeue: 3*time.Minute - 20*time.Second, unhealthy: true, silent: true},
		{name: "both silent beyond toleration: remediate", node: node(), kubelet: lease(-5 * time.Minute), agent: lease(-10 * time.Minute),
			action: ActionRemediate, reason: ReasonNodeSilent, requeue: 0, since: -260 * time.Second, checkSince: true, unhealthy: true, silent: true, msg: "both heartbeats silent"},
		{name: "both silent exactly at the toleration end: remediate", node: node(), kubelet: lease(-220 * time.Second), agent: lease(-220 * time.Second),
			action: ActionRemediate, reason: ReasonNodeSilent, requeue: 0, eligible: 0, checkElig: true, unhealthy: true, silent: true},
		{name: "both silent one nanosecond before the toleration end: wait exactly that long", node: node(), kubelet: lease(-220*time.Second + time.Nanosecond), agent: lease(-220 * time.Second),
			action: ActionWait, reason: ReasonNodeSilent, requeue: time.Nanosecond, unhealthy: true, silent: true},
		{name: "both silent, no kubelet lease, Ready=Unknown", node: node(cond(corev1.NodeReady, corev1.ConditionUnknown, -5*time.Minute)), agent: lease(-280 * time.Second),
			action: ActionRemediate, reason: ReasonNodeSilent, since: -4 * time.Minute, checkSince: true, unhealthy: true, silent: true, requeue: 0},

		// Row 5: agent never seen.
		{name: "never seen, young: startup grace", node: node(created(-5 * time.Minute)), kubelet: freshKubelet,
			action: ActionWait, reason: ReasonStartupGrace, requeue: 5 * time.Minute},
		{name: "never seen, past grace: wait for the deadline", node: node(created(-15 * time.Minute)), kubelet: freshKubelet,
			action: ActionWait, reason: ReasonAgentNotSeen, requeue: 5 * time.Minute},
		{name: "never seen, past grace, kubelet silent too: still only the deadline", node: node(created(-15 * time.Minute)), kubelet: lease(-10 * time.Minute),
			action: ActionWait, reason: ReasonAgentNotSeen, requeue: 5 * time.Minute, silent: true},
		{name: "never seen past the deadline, never Ready: remediate", node: node(created(-25*time.Minute), cond(corev1.NodeReady, corev1.ConditionFalse, -24*time.Minute)), kubelet: freshKubelet,
			action: ActionRemediate, reason: ReasonStartupDeadlineExceeded, since: -24 * time.Minute, checkSince: true, eligible: -5 * time.Minute, checkElig: true, unhealthy: true, requeue: 0},
		{name: "never seen past the deadline, no Ready, no lease: remediate", node: bare(created(-25 * time.Minute)),
			action: ActionRemediate, reason: ReasonStartupDeadlineExceeded, unhealthy: true, requeue: 0, msg: "has no Ready condition"},
		{name: "never seen past the deadline but serving: only the agent is missing", node: node(created(-25 * time.Minute)), kubelet: freshKubelet,
			action: ActionNone, reason: ReasonAgentNeverSeen, requeue: 35 * time.Second},
		{name: "never seen, old node predating nodevigil, serving: never", node: node(), kubelet: freshKubelet,
			action: ActionNone, reason: ReasonAgentNeverSeen, requeue: 35 * time.Second},
		{name: "never seen past the deadline, Ready but stuck startup taint: remediate", node: node(created(-25*time.Minute), taint(config.DefaultStartupTaint)), kubelet: freshKubelet,
			action: ActionRemediate, reason: ReasonStartupDeadlineExceeded, unhealthy: true, requeue: 0, msg: "still carries startup taint"},
		{name: "never seen, old node just went NotReady: kubelet toleration applies", node: node(cond(corev1.NodeReady, corev1.ConditionFalse, -2*time.Minute)), kubelet: freshKubelet,
			action: ActionWait, reason: ReasonStartupDeadlineExceeded, requeue: 3 * time.Minute, eligible: 3 * time.Minute, checkElig: true, unhealthy: true},
		{name: "never seen, old node, kubelet silent long: remediate", node: node(), kubelet: lease(-10 * time.Minute),
			action: ActionRemediate, reason: ReasonStartupDeadlineExceeded, unhealthy: true, silent: true, requeue: 0},

		// Agent alive, but the node never shed its startup taint.
		{name: "agent fresh, startup taint kept, booting: nothing yet, requeue at the deadline", node: node(created(-(20*time.Minute - 10*time.Second)), taint(config.DefaultStartupTaint)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 10 * time.Second},
		{name: "agent fresh, startup taint kept past the deadline: remediate", node: node(created(-25*time.Minute), taint(config.DefaultStartupTaint)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionRemediate, reason: ReasonStartupDeadlineExceeded, since: -25 * time.Minute, checkSince: true, eligible: -5 * time.Minute, checkElig: true, unhealthy: true, requeue: 0, msg: "never became ready"},
		{name: "agent silent, kubelet fresh, startup taint kept: still never", node: node(created(-25*time.Minute), taint(config.DefaultStartupTaint)), kubelet: freshKubelet, agent: staleAgent,
			action: ActionNone, reason: ReasonAgentSilent, silent: true, requeue: -1},
		{name: "foreign taint is no startup taint", node: node(taint("dedicated")), kubelet: freshKubelet, agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 30 * time.Second},

		// Agent-reported conditions.
		{name: "NetworkingReady=False within toleration", node: node(cond(ConditionNetworkingReady, corev1.ConditionFalse, -5*time.Minute)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionWait, reason: ReasonConditionUnhealthy, requeue: 30 * time.Second, eligible: 5 * time.Minute, checkElig: true, unhealthy: true, msg: "NetworkingReady=False"},
		{name: "NetworkingReady=False beyond toleration", node: node(cond(ConditionNetworkingReady, corev1.ConditionFalse, -11*time.Minute)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionRemediate, reason: ReasonConditionUnhealthy, requeue: 0, since: -11 * time.Minute, checkSince: true, unhealthy: true},
		{name: "condition not in the policy is ignored", node: node(cond("DiskHealthy", corev1.ConditionFalse, -time.Hour)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 30 * time.Second},
		{name: "condition Unknown is no evidence", node: node(cond(ConditionNetworkingReady, corev1.ConditionUnknown, -time.Hour)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 30 * time.Second},
		{name: "condition without LastTransitionTime cannot be measured", node: node(cond(ConditionNetworkingReady, corev1.ConditionFalse, 0)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionNone, reason: ReasonHealthy, requeue: 30 * time.Second},
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
			action: ActionNone, reason: ReasonHealthy, requeue: 30 * time.Second},
		{name: "policy action None releases a draining node", node: node(state(PhaseDraining)), kubelet: lease(-10 * time.Minute), agent: lease(-10 * time.Minute), policy: policy(func(p *config.Policy) { p.Action = config.ActionNone }),
			action: ActionRelease, reason: ReasonRemediationDisabled, unhealthy: true, silent: true, requeue: -1},
		{name: "startup grace holds a young node's remediation", node: node(created(-5 * time.Minute)), kubelet: lease(-4 * time.Minute), agent: lease(-4 * time.Minute),
			action: ActionWait, reason: ReasonStartupGrace, requeue: 5 * time.Minute, unhealthy: true, silent: true, msg: "then NodeSilent"},
		{name: "leader observing holds judgement", node: node(), kubelet: lease(-10 * time.Minute), agent: lease(-10 * time.Minute), observing: -10 * time.Second,
			action: ActionWait, reason: ReasonLeaderObserving, requeue: 30 * time.Second, unhealthy: true, silent: true},
		{name: "leader observing does not hide a healthy node", node: node(), kubelet: freshKubelet, agent: freshAgent, observing: -10 * time.Second,
			action: ActionNone, reason: ReasonHealthy, requeue: 30 * time.Second},
		{name: "the later of grace and observation is reported", node: node(created(-5 * time.Minute)), kubelet: lease(-4 * time.Minute), agent: lease(-4 * time.Minute), observing: -10 * time.Second,
			action: ActionWait, reason: ReasonStartupGrace, requeue: 5 * time.Minute, unhealthy: true, silent: true},
		{name: "the observation period applies to the startup deadline too", node: bare(created(-25 * time.Minute)), observing: -30 * time.Second,
			action: ActionWait, reason: ReasonLeaderObserving, requeue: 10 * time.Second, unhealthy: true},

		// Pipeline states.
		{name: "marked node that recovered is released", node: node(state(PhaseMarked)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionRelease, reason: ReasonHealthy, requeue: 30 * time.Second, msg: "releasing node (state Marked)"},
		{name: "draining node still dead continues", node: node(state(PhaseDraining)), kubelet: lease(-10 * time.Minute), agent: lease(-10 * time.Minute),
			action: ActionRemediate, reason: ReasonNodeSilent, unhealthy: true, silent: true, requeue: 0},
		{name: "cordoned node with only the agent silent is released", node: node(state(PhaseCordoned)), kubelet: freshKubelet, agent: staleAgent,
			action: ActionRelease, reason: ReasonAgentSilent, silent: true, requeue: -1},
		{name: "cordoned node back within toleration is released", node: node(state(PhaseCordoned)), kubelet: lease(-60 * time.Second), agent: freshAgent,
			action: ActionRelease, reason: ReasonKubeletUnhealthy, unhealthy: true, silent: true, requeue: -1},
		{name: "cordoned node under observation is kept, not released", node: node(state(PhaseCordoned)), kubelet: lease(-10 * time.Minute), agent: lease(-10 * time.Minute), observing: -time.Second,
			action: ActionWait, reason: ReasonLeaderObserving, unhealthy: true, silent: true, requeue: 39 * time.Second},
		{name: "terminating node that looks healthy is finished anyway", node: node(state(PhaseTerminating), annotate(AnnotationReason, ReasonNodeSilent)), kubelet: freshKubelet, agent: freshAgent,
			action: ActionRemediate, reason: ReasonTerminationInProgress, unhealthy: true, requeue: 0, msg: "started for NodeSilent"},
		{name: "terminated node with do-not-remediate is finished anyway", node: node(state(PhaseTerminated), annotate(AnnotationDoNotRemediate, "true")), kubelet: freshKubelet, agent: freshAgent,
			action: ActionRemediate, reason: ReasonTerminationInProgress, unhealthy: true, requeue: 0},
		{name: "unknown state value is treated as Marked", node: node(state("Exploded")), kubelet: freshKubelet, agent: freshAgent,
			action: ActionRelease, reason: ReasonHealthy, requeue: -1},

		// Lease field fallbacks.
		{name: "agent lease without duration uses AgentLeaseDuration", node: node(), kubelet: lease(-10 * time.Minute), agentDur: 20 * time.Second,
			agent:  &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: at(-25 * time.Second)}}},
			action: ActionWait, reason: ReasonNodeSilent, since: -5 * time.Second, checkSince: true, unhealthy: true, silent: true, requeue: -1},
		{name: "lease without renewTime uses acquireTime", node: node(), kubelet: freshKubelet,
			agent:  &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{AcquireTime: &metav1.MicroTime{Time: at(-50 * time.Second)}, LeaseDurationSeconds: ptr.To[int32](40)}},
			action: ActionNone, reason: ReasonAgentSilent, since: -10 * time.Second, checkSince: true, silent: true, requeue: -1},
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
		})
	}
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
				Node: n, KubeletLease: freshKubelet, AgentLease: lease(-silence - 40*time.Second),
				Policy: policy(func(p *config.Policy) { p.Action = action }), Now: now, ObservingSince: at(-100 * time.Hour), ObservePeriod: 40 * time.Second,
			})
			if d.Action == ActionRemediate {
				t.Fatalf("action %s, agent silent %s, kubelet fresh: Decide = Remediate (%s)", action, silence, d.Message)
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
