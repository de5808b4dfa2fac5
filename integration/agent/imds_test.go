package agent_test

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

// TestAWSEventsEndToEnd runs the real agent against an emulated instance's metadata service
// (IMDSv2 over HTTP) on the real control plane: no event → a spot notice (condition False
// with the event code, a Warning Event, within a few seconds) → withdrawn (True again) → the
// hop limit drops the token answer (Unknown, with the fix in the message).
func TestAWSEventsEndToEnd(t *testing.T) {
	const id = "i-0123456789abcdef0"
	emu := ec2emu.New(ec2emu.Config{})
	if err := emu.AddInstance(ec2emu.Instance{ID: id, Zone: "us-east-1a", Lifecycle: ec2emu.LifecycleSpot}); err != nil {
		t.Fatal(err)
	}
	url, err := emu.StartIMDS(id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emu.Close() })

	n := newNode(t, true)
	n.extraArgs = []string{"--imds-endpoint", url, "--config", writeIMDSConfig(t)}
	n.start()
	n.waitFor("NoSpotInterruption=True", 30*time.Second, hasStatus("NoSpotInterruption", corev1.ConditionTrue))
	n.waitFor("NoScheduledEvent=True", 30*time.Second, hasStatus("NoScheduledEvent", corev1.ConditionTrue))

	start := time.Now()
	emu.SetSpotInstanceAction(id, "terminate", time.Now().Add(2*time.Minute))
	obj := n.waitFor("NoSpotInterruption=False", 20*time.Second, hasStatus("NoSpotInterruption", corev1.ConditionFalse))
	latency := time.Since(start)
	c := condition(obj, "NoSpotInterruption")
	if c.Reason != "SpotTerminate" || !strings.Contains(c.Message, "deadline") {
		t.Errorf("spot condition: %+v", c)
	}
	t.Logf("spot notice in IMDS → NoSpotInterruption=False on the Node: %s", latency)
	if latency > 5*time.Second {
		t.Errorf("spot notice took %s to reach the Node; the agent polls every 500ms here", latency)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		evs, err := n.client.CoreV1().Events(metav1.NamespaceDefault).List(t.Context(), metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("involvedObject.name", n.name).String()})
		if err == nil && func() bool {
			for _, e := range evs.Items {
				if e.Reason == "SpotTerminate" && e.Type == corev1.EventTypeWarning {
					return true
				}
			}
			return false
		}() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no SpotTerminate Event on the node")
		}
		time.Sleep(100 * time.Millisecond)
	}

	emu.SetSpotInstanceAction(id, "", time.Time{})
	n.waitFor("NoSpotInterruption=True after withdrawal", 20*time.Second, hasStatus("NoSpotInterruption", corev1.ConditionTrue))

	emu.SetIMDSMode(id, ec2emu.IMDSHopLimitExceeded)
	// The SDK keeps its session token until it expires; a restart of the agent (a new
	// token request) meets the hop limit, as a pod without hostNetwork would from the start.
	if err := n.agent.Stop(10 * time.Second); err != nil {
		t.Logf("stop agent: %v", err)
	}
	n.start()
	obj = n.waitFor("NoSpotInterruption=Unknown/IMDSHopLimitExceeded", 30*time.Second, func(o *corev1.Node) bool {
		c := condition(o, "NoSpotInterruption")
		return c != nil && c.Status == corev1.ConditionUnknown && c.Reason == "IMDSHopLimitExceeded"
	})
	if c := condition(obj, "NoSpotInterruption"); !strings.Contains(c.Message, "hostNetwork: true") {
		t.Errorf("hop-limit condition: %+v", c)
	}
}

// writeIMDSConfig writes an agent config polling the spot paths every 500ms.
func writeIMDSConfig(t *testing.T) string {
	t.Helper()
	p := t.TempDir() + "/agent.yaml"
	writeFile(t, p, "apiVersion: nodevigil.io/v1alpha1\nkind: AgentConfig\nimds:\n  spotInterval: 500ms\n  eventInterval: 5s\n  timeout: 1s\n", 0o644)
	return p
}
