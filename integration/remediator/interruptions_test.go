package remediator_test

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const interruptionTaint = "nodevigil.io/interruption"

func cordonedForInterruption(n *corev1.Node) bool {
	return n.Spec.Unschedulable && slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == interruptionTaint })
}

// TestSpotNoticeDrainsThenUndoes: the real remediator process, on the real control plane, sees
// a spot notice (the agent's NoSpotInterruption=False, written here as the agent writes it) on
// a node of a pool with the default interruptions policy: the node is cordoned, tainted and
// drained at once; when the notice goes, it is uncordoned and untainted.
func TestSpotNoticeDrainsThenUndoes(t *testing.T) {
	e := newEnv(t)
	a := e.addNode("us-east-1a")
	e.addNode("us-east-1a")
	pod := e.podOn(a.name, false)
	r := e.startReplica("replica-a", e.config(false, "action: None\n"))
	e.waitReady(r)

	e.setCondition(a, "NoSpotInterruption", "False", "SpotTerminate")
	e.eventually("node cordoned for the spot notice", 30*time.Second, func(ctx context.Context) (bool, error) {
		n, err := e.node(a.name)
		return err == nil && cordonedForInterruption(n), nil
	})
	e.eventually("pod evicted", 30*time.Second, func(ctx context.Context) (bool, error) {
		p, err := e.client.CoreV1().Pods(e.ns).Get(ctx, pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil), nil
	})
	if !e.hasEvent(a.name, "InterruptionCordoned") {
		t.Errorf("no InterruptionCordoned event; events %v", e.eventReasons(a.name))
	}

	e.setCondition(a, "NoSpotInterruption", "True", "NoEvent")
	e.eventually("node uncordoned once the notice is gone", 30*time.Second, func(ctx context.Context) (bool, error) {
		n, err := e.node(a.name)
		return err == nil && !n.Spec.Unschedulable && !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == interruptionTaint }), nil
	})
	if e.terminations(a.instanceID) != 0 {
		t.Error("an interruption terminated the instance")
	}
}

// TestSpotNoticeNotifyNeverCordons: a kafka-style pool (Notify for every kind) and a node whose
// agent cannot read IMDS (Unknown) are never cordoned.
func TestSpotNoticeNotifyNeverCordons(t *testing.T) {
	e := newEnv(t)
	a := e.addNode("us-east-1a")
	b := e.addNode("us-east-1a")
	r := e.startReplica("replica-a", e.config(false, `action: None
interruptions: {spotInterruption: Notify, rebalanceRecommendation: Notify, scheduledReboot: Notify, scheduledRetirement: Notify, asgTermination: Notify}
`))
	e.waitReady(r)
	e.setCondition(a, "NoSpotInterruption", "False", "SpotTerminate")
	e.setCondition(b, "NoSpotInterruption", "Unknown", "IMDSHopLimitExceeded")
	e.never("a cordon", 10*time.Second, func(context.Context) bool {
		for _, n := range []string{a.name, b.name} {
			if obj, err := e.node(n); err == nil && obj.Spec.Unschedulable {
				return true
			}
		}
		return false
	})
}
