package fleet

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Event reasons the fleet records on its Nodes, so that a run's story (integration/timeline)
// holds the fault and the replacement next to what the agents and the remediator did.
const (
	// EventFaultInjected is recorded on a node when a fault is injected into it.
	EventFaultInjected = "FaultInjected"
	// EventReplacementJoined is recorded on a replacement node when it joins.
	EventReplacementJoined = "ReplacementJoined"
	// EventInstanceReclaimed is recorded on a node when AWS (the emulator) takes its instance
	// back at a spot notice's deadline: the termination no one in the cluster asked for.
	EventInstanceReclaimed = "InstanceReclaimed"
	// ReplacesAnnotation on a replacement node names the node it replaces.
	ReplacesAnnotation = "dev.nodevigil.io/replaces"
	// EventComponent is the source component of the fleet's Events.
	EventComponent = "fleet"
)

// record writes an Event on node n, as a kubelet or controller would (namespace default).
// Failures are logged only: the Events are for the story, not for the fleet's working.
func (f *Fleet) record(ctx context.Context, n *Node, reason, message string) {
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: n.Name + ".", Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: n.Name, UID: n.uid},
		Reason:         reason, Message: message, Type: corev1.EventTypeNormal,
		Source:         corev1.EventSource{Component: EventComponent},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if _, err := f.cfg.Client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil && ctx.Err() == nil {
		f.cfg.Logger.Warn("record fleet event", "node", n.Name, "reason", reason, "err", fmt.Errorf("create event: %w", err))
	}
}
