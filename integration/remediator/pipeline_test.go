package remediator_test

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

// defaultCapsPolicy keeps the shipped caps (maxUnhealthy 20%, maxInFlight 1) with short
// tolerations.
const defaultCapsPolicy = `action: Terminate
startupGrace: 1s
tolerations:
  silentNode: 3s
drain:
  timeout: 10s`

// TestForeignInstanceIsBlockedAndDoesNotHoldThePool: the emulator holds an instance without
// the cluster tag; its node is Blocked without being cordoned, and a second dead node of the
// same pool is terminated under the default maxInFlight of 1.
func TestForeignInstanceIsBlockedAndDoesNotHoldThePool(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var nodes []*simNode
	for range 5 {
		nodes = append(nodes, e.addNode("us-east-1a"))
	}
	foreign, second := nodes[0], nodes[1]
	// Re-seed the foreign node's instance without the ownership tag.
	if err := e.emu.AddInstance(ec2emu.Instance{ID: foreign.instanceID, Zone: "us-east-1a", Tags: map[string]string{"kubernetes.io/cluster/other": "owned"}}); err != nil {
		t.Fatal(err)
	}
	r := e.startReplica("replica-a", e.config(false, defaultCapsPolicy))
	e.waitReady(r)
	time.Sleep(2 * leaseSeconds * time.Second)

	foreign.set(false, false)
	e.eventually("the foreign node Blocked", 60*time.Second, func(ctx context.Context) (bool, error) {
		obj, err := e.node(foreign.name)
		return err == nil && obj.Annotations["nodevigil.io/remediation-blocked"] == "InstanceNotOwned", nil
	})
	obj, err := e.node(foreign.name)
	if err != nil {
		t.Fatal(err)
	}
	if obj.Spec.Unschedulable || obj.Annotations[stateKey] != "" {
		t.Errorf("Blocked node still in the pipeline: unschedulable %v, state %q", obj.Spec.Unschedulable, obj.Annotations[stateKey])
	}
	e.expectEvent(foreign.name, "InstanceNotOwned")

	second.set(false, false)
	e.eventually("the second dead node terminated", 60*time.Second, func(context.Context) (bool, error) {
		return e.terminations(second.instanceID) == 1, nil
	})
	e.eventually("the second Node deleted", 60*time.Second, func(ctx context.Context) (bool, error) {
		_, err := e.client.CoreV1().Nodes().Get(ctx, second.name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if n := e.terminations(foreign.instanceID); n != 0 {
		t.Errorf("foreign instance terminated %d times", n)
	}
}

// TestDryRunRecordsWouldBeBlocked: shipped manifests start in dry-run, so dry-run must show
// what live mode would refuse. It describes the instance (read-only) and records "would be
// Blocked: InstanceNotOwned" for a node whose instance lacks the cluster tag, "would
// terminate" for a dead node whose instance is the cluster's, and never calls
// TerminateInstances.
func TestDryRunRecordsWouldBeBlocked(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var nodes []*simNode
	for range 4 {
		nodes = append(nodes, e.addNode("us-east-1a"))
	}
	foreign, dead := nodes[0], nodes[1]
	if err := e.emu.AddInstance(ec2emu.Instance{ID: foreign.instanceID, Zone: "us-east-1a", Tags: map[string]string{"kubernetes.io/cluster/other": "owned"}}); err != nil {
		t.Fatal(err)
	}
	// Two dead nodes of four: faultPolicy's caps do not bind, so the records are judgement's.
	r := e.startReplica("replica-a", e.config(true, faultPolicy))
	e.waitReady(r)
	e.waitFirstReady(nodes...)

	foreign.set(false, false)
	dead.set(false, false)
	record := func(n *simNode) string {
		obj, err := e.node(n.name)
		if err != nil {
			return ""
		}
		return obj.Annotations["nodevigil.io/dry-run-decision"]
	}
	// The Events follow the annotations through the recorder's queue: wait for both.
	e.eventually("the dry-run records and their Events", 60*time.Second, func(context.Context) (bool, error) {
		return strings.HasPrefix(record(foreign), "Blocked InstanceNotOwned ") && strings.HasPrefix(record(dead), "Terminate NodeSilent ") &&
			e.hasEvent(foreign.name, "InstanceNotOwned") && e.hasEvent(dead.name, "WouldTerminate"), nil
	})
	if !e.hasEvent(foreign.name, "InstanceNotOwned") || e.hasEvent(foreign.name, "WouldTerminate") {
		t.Errorf("foreign node: want an InstanceNotOwned event and no WouldTerminate; events %v", e.eventReasons(foreign.name))
	}
	if !e.hasEvent(dead.name, "WouldTerminate") {
		t.Errorf("dead node: no WouldTerminate event; events %v", e.eventReasons(dead.name))
	}
	if n := e.emu.Calls("DescribeInstances"); n == 0 {
		t.Error("dry-run never described an instance")
	}
	if n := e.emu.Calls("TerminateInstances"); n != 0 {
		t.Errorf("dry-run called TerminateInstances %d times", n)
	}
	for _, n := range nodes {
		obj, err := e.node(n.name)
		if err != nil {
			t.Fatal(err)
		}
		if obj.Spec.Unschedulable || obj.Annotations[stateKey] != "" || obj.Annotations[blockedKey] != "" {
			t.Errorf("dry-run changed %s: unschedulable %v, state %q, blocked %q", n.name, obj.Spec.Unschedulable, obj.Annotations[stateKey], obj.Annotations[blockedKey])
		}
	}
	if v := metricSum(e.metrics(r), "nodevigil_remediator_blocked_total", `reason="InstanceNotOwned"`); v != 1 {
		t.Errorf("blocked_total{reason=InstanceNotOwned} = %v, want 1", v)
	}
}

// TestBlockedNodeRecheckedWhenAnnotationRemoved: the documented way to force a Blocked node's
// recheck. The instance lacks the cluster tag → the node is Blocked (InstanceNotOwned) and
// left alone for the recheck interval (5 minutes); the operator fixes the tag and removes the
// nodevigil.io/remediation-blocked annotation → the node is verified again at once and
// terminated exactly once.
func TestBlockedNodeRecheckedWhenAnnotationRemoved(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var nodes []*simNode
	for range 4 {
		nodes = append(nodes, e.addNode("us-east-1a"))
	}
	n := nodes[0]
	untagged := ec2emu.Instance{ID: n.instanceID, Zone: "us-east-1a", Tags: map[string]string{"team": "data"}}
	if err := e.emu.AddInstance(untagged); err != nil {
		t.Fatal(err)
	}
	r := e.startReplica("replica-a", e.config(false, defaultCapsPolicy))
	e.waitReady(r)
	e.waitFirstReady(nodes...)
	n.set(false, false)
	e.eventually("the node Blocked", 60*time.Second, func(ctx context.Context) (bool, error) {
		obj, err := e.node(n.name)
		return err == nil && obj.Annotations[blockedKey] == "InstanceNotOwned", nil
	})
	// Blocked holds: well past the toleration, nothing happens (the recheck is 5 minutes away).
	e.never("remediation of the Blocked node", 2*(staleAfter+silentNodeT), func(context.Context) bool {
		obj, err := e.node(n.name)
		return err != nil || obj.Annotations[stateKey] != "" || e.terminations(n.instanceID) > 0
	})

	untagged.Tags = map[string]string{clusterTag: "owned"}
	if err := e.emu.AddInstance(untagged); err != nil {
		t.Fatal(err)
	}
	patch := []byte(`{"metadata":{"annotations":{"` + blockedKey + `":null}}}`)
	if _, err := e.client.CoreV1().Nodes().Patch(t.Context(), n.name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("remove the Blocked annotation: %v", err)
	}
	e.terminatedOnce(n, 60*time.Second)
	for _, o := range nodes[1:] {
		if why := e.touched(o); why != "" {
			t.Errorf("healthy node %s: %s", o.name, why)
		}
	}
}
