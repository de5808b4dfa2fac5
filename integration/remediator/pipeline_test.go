package remediator_test

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	if !e.hasEvent(foreign.name, "InstanceNotOwned") {
		t.Errorf("no InstanceNotOwned event; events %v", e.eventReasons(foreign.name))
	}

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
