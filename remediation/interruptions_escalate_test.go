package remediation

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRebalanceThenSpotNoticeEscalates: through the controller, a rebalance recommendation
// alone does what its policy says (Notify: nothing; CordonOnly: a cordon, no eviction); a spot
// notice that follows escalates to the spot notice's Drain: the pods are evicted and the mark
// names the spot notice.
func TestRebalanceThenSpotNoticeEscalates(t *testing.T) {
	for _, tc := range []struct {
		name, policy string
		cordonFirst  bool
	}{
		{"notify", "", false},
		{"cordon only", "  interruptions: {rebalanceRecommendation: CordonOnly}\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, liveConfig(t, "policies:\n- name: general\n  nodeSelector: karpenter.sh/nodepool=general\n"+tc.policy))
			h.healthy(newNode("s", inPool("general"),
				withCondition(ConditionNoRebalanceRecommendation, corev1.ConditionFalse, "RebalanceRecommended", "EC2 recommends rebalancing")))
			h.spot("s")
			h.add(newPod("app", "web-1", "s"))
			syncN(h, "s", 2)
			if got := len(cordoned(h, "s")) == 1; got != tc.cordonFirst {
				t.Fatalf("after the rebalance recommendation: cordoned %v, want %v", got, tc.cordonFirst)
			}
			if slices.Contains(h.Steps(), "evict app/web-1") {
				t.Fatal("evicted on a rebalance recommendation alone")
			}
			n := h.node("s")
			spotNotice()(n)
			n.ResourceVersion = ""
			if _, err := h.client.CoreV1().Nodes().UpdateStatus(h.ctx, n, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			syncN(h, "s", 3)
			if n := h.node("s"); n.Annotations[AnnotationInterruption] != "spotInterruption/Drain" || len(cordoned(h, "s")) != 1 {
				t.Errorf("after the spot notice: mark %q, cordoned %v; want spotInterruption/Drain", n.Annotations[AnnotationInterruption], cordoned(h, "s"))
			}
			if !slices.Contains(h.Steps(), "evict app/web-1") {
				t.Errorf("not drained after the spot notice: %q", h.Steps())
			}
		})
	}
}
